//! Shape-checked building blocks over the CPU kernels: linear layers (with fused bias, exact
//! GELU and residual epilogues), layer and RMS norms, rotary embeddings, embedding lookup,
//! column splits of packed rows, activations and gates. Model files call these; they never call
//! `backend` directly for anything these cover.

mod conv;
mod embed;
mod linear;
mod norm;
mod rope;
mod split;

pub use conv::causal_conv1d;
pub use embed::Embedding;
pub use linear::{InputProbe, Linear};
pub use norm::{LayerNorm, RmsNorm};
pub use rope::{Mrope, Rope, RopeConfig, RopeScaling};
pub use split::{put_columns, split_columns, split_query_gate, take_columns};

/// A GGUF / Q8_0 quantized weight matrix in the CPU kernels' layout (what quantized
/// [`Linear`] layers and embedding tables hold).
pub use crate::backend::cpu::QuantMatrix;

use crate::backend::cpu;
use crate::sample::{Pick, Picked};
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};

/// In-place tanh.
pub fn tanh(x: &mut [f32]) {
    cpu::tanh(x)
}

/// `gelu_pytorch_tanh` in place: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, in f32.
pub fn gelu_tanh(x: &mut [f32]) {
    const BETA: f32 = 0.797_884_6; // √2 · (2/√π) · 0.5
    let mut t: Vec<f32> = x
        .iter()
        .map(|&v| BETA * (v + 0.044715 * v * v * v))
        .collect();
    tanh(&mut t);
    for (v, t) in x.iter_mut().zip(&t) {
        *v = 0.5 * *v * (1.0 + t);
    }
}

/// Exact SiLU in place: `x / (1 + exp(-x))`.
pub fn silu(x: &mut [f32]) {
    let parallel = x.len() >= PAR_ELEMENTWISE;
    cpu::par_chunks_mut(x, PAR_ELEMENTWISE / 4, parallel, |_, part| cpu::silu(part));
}

/// A Gated DeltaNet layer's output norm and gate: each `norm.dim()`-wide segment (a head) of
/// the rows of `x` (`width` values each) RMS-normalized, then the row times `silu(z)`, with row
/// `i` of `z` read in place at `z[i * z_ld..][..width]` (e.g. columns of a projection). Blocks
/// of rows on the workers; SiLU as in [`silu`].
pub fn rms_norm_silu_gate(x: &mut [f32], width: usize, norm: &RmsNorm, z: &[f32], z_ld: usize) {
    let rows = x.len() / width.max(1);
    assert!(
        x.len() == rows * width
            && width.is_multiple_of(norm.dim())
            && (rows == 0 || z.len() >= (rows - 1) * z_ld + width),
        "rms_norm_silu_gate: rows of {width} (heads of {}), gate of {} values {z_ld} apart",
        norm.dim(),
        z.len()
    );
    let per_task = (PAR_ELEMENTWISE / 4 / width.max(1)).max(1);
    let parallel = x.len() >= PAR_ELEMENTWISE;
    cpu::par_chunks_mut(x, per_task * width.max(1), parallel, |t, part| {
        let mut g = [0.0f32; PIECE];
        for (r, row) in part.chunks_exact_mut(width).enumerate() {
            for head in row.chunks_exact_mut(norm.dim()) {
                norm.norm_row(head);
            }
            let zr = &z[(t * per_task + r) * z_ld..][..width];
            for (c, zc) in row.chunks_mut(PIECE).zip(zr.chunks(PIECE)) {
                let g = &mut g[..c.len()];
                g.copy_from_slice(zc);
                cpu::silu(g);
                for (v, &g) in c.iter_mut().zip(g.iter()) {
                    *v *= g;
                }
            }
        }
    });
}

/// Values per piece of the gates' stack buffers.
const PIECE: usize = 512;
/// Values from which the elementwise activations are spread over the workers.
const PAR_ELEMENTWISE: usize = 1 << 16;

/// The logistic sigmoid in place: `1 / (1 + exp(-x))`.
pub fn sigmoid(x: &mut [f32]) {
    for v in x {
        *v = 1.0 / (1.0 + (-*v).exp());
    }
}

/// `x ⊙= σ(gate)` elementwise (same shapes), σ as in [`sigmoid`] (a sigmoid output gate), on
/// the tensors' device.
pub fn sigmoid_gate(x: &mut Tensor, gate: &Tensor) -> Result<()> {
    if (x.rows(), x.cols()) != (gate.rows(), gate.cols()) {
        return Err(Error::Shape {
            op: "sigmoid_gate",
            reason: format!(
                "x [{}, {}], gate [{}, {}]",
                x.rows(),
                x.cols(),
                gate.rows(),
                gate.cols()
            ),
        });
    }
    #[cfg(feature = "cuda")]
    let n = x.len();
    match (x.storage_mut(), gate.storage()) {
        (Storage::Cpu(x), Storage::Cpu(gate)) => {
            let parallel = x.len() >= PAR_ELEMENTWISE;
            let chunk = PAR_ELEMENTWISE / 4;
            cpu::par_chunks_mut(x, chunk, parallel, |i, part| {
                // exp(−gate) a piece at a time in a stack buffer (the vector `exp`).
                let mut e = [0.0f32; PIECE];
                for (j, c) in part.chunks_mut(PIECE).enumerate() {
                    let e = &mut e[..c.len()];
                    for (e, &g) in e.iter_mut().zip(&gate[i * chunk + j * PIECE..]) {
                        *e = -g;
                    }
                    cpu::exp(e);
                    for (v, &e) in c.iter_mut().zip(e.iter()) {
                        *v *= 1.0 / (1.0 + e);
                    }
                }
            });
            Ok(())
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(x), Storage::Cuda(g)) => x.dev.sigmoid_gate(&mut x.buf, &g.buf, n),
        #[cfg(feature = "cuda")]
        _ => Err(crate::tensor::mixed("sigmoid_gate")),
    }
}

/// Runs one forward pass `f` on a worker of the CPU thread pool, so the parallel kernels inside
/// split their work without putting threads to sleep between calls (see
/// `backend::cpu::on_pool`).
pub fn pass<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    cpu::on_pool(|| {
        let _pass = crate::backend::begin_pass();
        f()
    })
}

/// [`pass`] for a model on `device`: on a GPU the pass runs on the calling thread, since its
/// host side only queues kernels (or replays a recorded step), and the hop to a pool worker and
/// back cost a 64-row decode step on an H100 about 0.2 ms of its 3.0 (0.07 ms at batch 1).
pub fn device_pass<R: Send>(device: &crate::backend::Device, f: impl FnOnce() -> R + Send) -> R {
    if device.is_cpu() {
        return pass(f);
    }
    let _pass = crate::backend::begin_pass();
    f()
}

/// `f(item)` for every item, in parallel on the CPU thread pool when `parallel` (per-sequence
/// host work of a step, such as output-constraint masks); the results in order.
pub fn par_map_mut<T: Send, R: Send>(
    items: &mut [T],
    parallel: bool,
    f: impl Fn(&mut T) -> R + Sync + Send,
) -> Vec<R> {
    cpu::par_map_mut(items, parallel, f)
}

/// `x *= s` elementwise.
pub fn scale(x: &mut [f32], s: f32) {
    cpu::scale(x, s)
}

/// `x += y` elementwise (same lengths).
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    cpu::add_assign(x, y)
}

/// Dot product of two vectors of the same length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    cpu::dot(a, b)
}

/// Cosine similarity of two vectors of the same length (0 when either is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    cpu::cosine(a, b)
}

/// Scales `x` to unit L2 norm in place (a zero vector stays zero).
pub fn l2_normalize(x: &mut [f32]) {
    cpu::l2_normalize(x)
}

/// `log(1 + exp(x))`, and `x` itself above 20, as `torch.nn.functional.softplus`.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Scales each row of `x` (rows of `dim`) by `1 / sqrt(Σx² + eps)` (the L2 normalization of
/// linear-attention queries and keys).
pub fn l2_normalize_rows(x: &mut [f32], dim: usize, eps: f32) {
    for row in x.chunks_exact_mut(dim) {
        let r = 1.0 / (cpu::sum_squares(row) + eps).sqrt();
        cpu::scale(row, r);
    }
}

/// SwiGLU: `gate_up` f32 [n, 2 * width] holds the gate and up projections side by side per row;
/// returns `silu(gate) ⊙ up` f32 [n, width], with the exact `silu(x) = x / (1 + exp(-x))`.
pub fn silu_mul(gate_up: &[f32], width: usize) -> Vec<f32> {
    debug_assert_eq!(gate_up.len() % (2 * width), 0);
    let n = gate_up.len() / (2 * width);
    let mut out = crate::tensor::host_scratch(n * width);
    let rows_per_task = (PAR_ELEMENTWISE / 4 / width.max(1)).max(1);
    let parallel = n * width >= PAR_ELEMENTWISE;
    cpu::par_chunks_mut(
        &mut out,
        rows_per_task * width.max(1),
        parallel,
        |i, part| {
            let rows = gate_up[i * rows_per_task * 2 * width..].chunks_exact(2 * width);
            for (row, o) in rows.zip(part.chunks_exact_mut(width)) {
                let (gate, up) = row.split_at(width);
                o.copy_from_slice(gate);
                cpu::silu_mul(o, up);
            }
        },
    );
    out
}

/// [`silu_mul`] on a tensor [n, 2 * width] → [n, width], on its device.
pub fn swiglu(gate_up: &Tensor) -> Result<Tensor> {
    if !gate_up.cols().is_multiple_of(2) {
        return Err(Error::Shape {
            op: "swiglu",
            reason: format!(
                "rows of {} values (gate and up side by side)",
                gate_up.cols()
            ),
        });
    }
    let (rows, width) = (gate_up.rows(), gate_up.cols() / 2);
    match gate_up.storage() {
        Storage::Cpu(v) => Ok(Tensor::cpu(rows, width, silu_mul(v, width))),
        #[cfg(feature = "cuda")]
        Storage::Cuda(s) => {
            let mut out = s.dev.alloc_buf(rows * width)?;
            s.dev.silu_mul(&s.buf, &mut out, rows, width)?;
            Ok(Tensor::cuda(&s.dev, rows, width, out))
        }
    }
}

/// Squared-ReLU GLU (BitNet b1.58's `relu2`): `gate_up` [n, 2 * width] → `relu(gate)² ⊙ up`
/// [n, width], in transformers' order of operations (`square(relu(g)) * u`). CPU only: the
/// ternary products it feeds run there.
pub fn relu2_glu(gate_up: &Tensor) -> Result<Tensor> {
    if !gate_up.cols().is_multiple_of(2) {
        return Err(Error::Shape {
            op: "relu2_glu",
            reason: format!(
                "rows of {} values (gate and up side by side)",
                gate_up.cols()
            ),
        });
    }
    let (rows, width) = (gate_up.rows(), gate_up.cols() / 2);
    match gate_up.storage() {
        Storage::Cpu(v) => {
            let mut out = vec![0.0f32; rows * width];
            for (row, o) in v.chunks_exact(2 * width).zip(out.chunks_exact_mut(width)) {
                let (gate, up) = row.split_at(width);
                for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                    let r = g.max(0.0);
                    *o = r * r * u;
                }
            }
            Ok(Tensor::cpu(rows, width, out))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(_) => Err(Error::Device(format!(
            "relu2_glu runs on the CPU, not on {}",
            gate_up.device()
        ))),
    }
}

/// A decode step's picks: known, or (CUDA) still on their way from the device, read by
/// [`read_step`].
#[derive(Debug)]
pub enum StepPicks {
    /// The step ran to its end.
    Ready(Vec<Picked>),
    /// The step was replayed and runs on (see [`launch_step`]).
    #[cfg(feature = "cuda")]
    Ahead(crate::backend::cuda::LaunchedIds),
}

impl StepPicks {
    /// The picks, when the step already ran to its end.
    pub fn ready(&self) -> Option<&[Picked]> {
        match self {
            StepPicks::Ready(p) => Some(p),
            #[cfg(feature = "cuda")]
            StepPicks::Ahead(_) => None,
        }
    }
}

/// Runs `step`, a decode step of model instance `key` on `device` that picks each row's next
/// token by `picks` ([`pick_rows`]), as a recorded graph where the device can (CUDA: after
/// one eager run of that shape), without waiting for a replayed step's picks
/// ([`read_step`]); on the CPU it just runs. With `follows`, the step's token ids are the
/// picks of the step launched before it on `device`, still there (see
/// [`replays`]; the step before had the same rows).
pub fn launch_step(
    device: &crate::backend::Device,
    key: u64,
    picks: &[Pick],
    follows: bool,
    step: impl FnOnce() -> Result<Vec<Picked>>,
) -> Result<StepPicks> {
    match device {
        crate::backend::Device::Cpu => {
            if follows {
                return Err(Error::Device(
                    "a CPU step cannot take its ids from picks it has not read".into(),
                ));
            }
            let _ = (key, picks);
            step().map(StepPicks::Ready)
        }
        #[cfg(feature = "cuda")]
        crate::backend::Device::Cuda(d) => {
            use crate::backend::cuda::Launched;
            d.reserve_picks(picks)?;
            let launched = d.graph_launch(key, picks.len(), follows, || {
                Ok(step()?.into_iter().map(Picked::code).collect())
            })?;
            Ok(match launched {
                Launched::Ready(codes) => {
                    StepPicks::Ready(codes.into_iter().map(Picked::from_code).collect())
                }
                Launched::Ahead(l) => StepPicks::Ahead(l),
            })
        }
    }
}

/// The picks of a step [`launch_step`] launched (waits for the device).
pub fn read_step(device: &crate::backend::Device, picks: StepPicks) -> Result<Vec<Picked>> {
    let _ = device;
    match picks {
        StepPicks::Ready(p) => Ok(p),
        #[cfg(feature = "cuda")]
        StepPicks::Ahead(l) => match device {
            crate::backend::Device::Cuda(d) => Ok(d
                .read_launched(l)?
                .into_iter()
                .map(Picked::from_code)
                .collect()),
            crate::backend::Device::Cpu => Err(Error::Device(
                "a step launched on a GPU was read on the CPU".into(),
            )),
        },
    }
}

/// Whether a decode step of model instance `key` with `rows` rows is replayed on `device`, so
/// that it can take its ids from the picks of the step before it ([`launch_step`]'s
/// `follows`): never on the CPU.
pub fn replays(device: &crate::backend::Device, key: u64, rows: usize) -> bool {
    match device {
        crate::backend::Device::Cpu => {
            let _ = (key, rows);
            false
        }
        #[cfg(feature = "cuda")]
        crate::backend::Device::Cuda(d) => d.replays(key, rows),
    }
}

/// The index of the largest value of each row of `x` (the first on ties, 0 for a row without
/// a number), computed where `x` lives: only the ids come back from a GPU.
pub fn argmax_rows(x: &Tensor) -> Result<Vec<u32>> {
    if x.cols() == 0 {
        return Err(Error::Shape {
            op: "argmax_rows",
            reason: "rows of no values".into(),
        });
    }
    match x.storage() {
        Storage::Cpu(v) => Ok(v
            .chunks_exact(x.cols())
            .map(|row| crate::sample::processors::argmax(row) as u32)
            .collect()),
        #[cfg(feature = "cuda")]
        Storage::Cuda(s) => s.dev.argmax_rows(&s.buf, x.rows(), x.cols()),
    }
}

/// Picks the next token of each row of `x` (logits, f32 [rows, vocab]) by `picks[row]`, where
/// `x` lives: a GPU runs the sampler's steps in a kernel and sends back only the ids, the CPU
/// runs [`Pick::choose`] per row; both pick the same token from the same logits. Rows that all
/// take the plain argmax go through [`argmax_rows`].
pub fn pick_rows(x: &Tensor, picks: &[Pick]) -> Result<Vec<Picked>> {
    if picks.len() != x.rows() {
        return Err(Error::Shape {
            op: "pick_rows",
            reason: format!("{} picks for {} rows", picks.len(), x.rows()),
        });
    }
    if picks.iter().all(Pick::is_argmax) {
        let ids = argmax_rows(x)?;
        return Ok(ids
            .into_iter()
            .map(|token| Picked { token, drew: false })
            .collect());
    }
    match x.storage() {
        Storage::Cpu(v) => {
            let mut rows: Vec<(&[f32], &Pick)> = v.chunks_exact(x.cols()).zip(picks).collect();
            let parallel = rows.len() > 1;
            Ok(par_map_mut(&mut rows, parallel, |(row, p)| p.choose(row)))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(s) => {
            let codes = s.dev.pick_rows(&s.buf, x.rows(), x.cols(), picks)?;
            Ok(codes.into_iter().map(Picked::from_code).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_mul_matches_definition() {
        let width = 33;
        let gate_up: Vec<f32> = (0..2 * 2 * width)
            .map(|i| (i as f32 * 0.37).sin() * 12.0)
            .collect();
        let got = silu_mul(&gate_up, width);
        for (r, row) in gate_up.chunks_exact(2 * width).enumerate() {
            for j in 0..width {
                let g = row[j] as f64;
                let want = g / (1.0 + (-g).exp()) * row[width + j] as f64;
                let d = (got[r * width + j] as f64 - want).abs();
                assert!(d <= 1e-5 * want.abs().max(1.0), "{d}");
            }
        }
    }
    #[test]
    fn gelu_tanh_matches_its_formula() {
        let mut x = vec![-3.0f32, -0.5, 0.0, 0.7, 2.5];
        let want: Vec<f32> = x
            .iter()
            .map(|&v: &f32| {
                let inner = (2.0f64 / std::f64::consts::PI).sqrt()
                    * (v as f64 + 0.044715 * (v as f64).powi(3));
                (0.5 * v as f64 * (1.0 + inner.tanh())) as f32
            })
            .collect();
        gelu_tanh(&mut x);
        for (a, b) in x.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
