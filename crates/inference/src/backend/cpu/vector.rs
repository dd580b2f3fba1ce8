//! Generic slice kernels (norms, activations, softmax, reductions, embedding math), written
//! once over [`Simd`] and instantiated per instruction set by the `x86` modules.
//!
//! Every function here is `#[inline(always)]` so that it is compiled inside its
//! `#[target_feature]` entry point. Reductions keep several independent accumulators, which
//! both hides FMA latency and makes the f32 sums more accurate than a sequential loop.

use super::simd::{map_in_place, zip_in_place, Accumulate, Binary, Simd, Unary};
use super::vmath;

/// `a + b`.
#[derive(Clone, Copy)]
struct Add;
impl<S: Simd> Binary<S> for Add {
    #[inline(always)]
    fn apply(self, s: S, a: S::V, b: S::V) -> S::V {
        s.add(a, b)
    }
}

/// `v * c`.
#[derive(Clone, Copy)]
struct Scale(f32);
impl<S: Simd> Unary<S> for Scale {
    #[inline(always)]
    fn apply(self, s: S, v: S::V) -> S::V {
        s.mul(v, s.splat(self.0))
    }
}

/// `a + b·c`.
#[derive(Clone, Copy)]
struct AddScaled(f32);
impl<S: Simd> Binary<S> for AddScaled {
    #[inline(always)]
    fn apply(self, s: S, a: S::V, b: S::V) -> S::V {
        s.mul_add(b, s.splat(self.0), a)
    }
}

/// Declares a unit struct applying one `vmath` function.
macro_rules! vmath_op {
    ($name:ident, $f:path) => {
        #[derive(Clone, Copy)]
        struct $name;
        impl<S: Simd> Unary<S> for $name {
            #[inline(always)]
            fn apply(self, s: S, v: S::V) -> S::V {
                $f(s, v)
            }
        }
    };
}
vmath_op!(Gelu, vmath::gelu);
vmath_op!(GeluRational, vmath::gelu_rational);
vmath_op!(Erf, vmath::erf);
vmath_op!(Exp, vmath::exp);
vmath_op!(Tanh, vmath::tanh);

/// SiLU, `v / (1 + exp(−v))`: [`vmath::exp`], the sum and the division each rounded once.
#[derive(Clone, Copy)]
struct Silu;
impl<S: Simd> Unary<S> for Silu {
    #[inline(always)]
    fn apply(self, s: S, v: S::V) -> S::V {
        s.div(v, silu_denominator(s, v))
    }
}

/// SwiGLU's `silu(g) · u`, the product rounded after the SiLU.
#[derive(Clone, Copy)]
struct SiluMul;
impl<S: Simd> Binary<S> for SiluMul {
    #[inline(always)]
    fn apply(self, s: S, g: S::V, u: S::V) -> S::V {
        s.mul(s.div(g, silu_denominator(s, g)), u)
    }
}

/// `1 + exp(−v)`.
#[inline(always)]
fn silu_denominator<S: Simd>(s: S, v: S::V) -> S::V {
    s.add(s.splat(1.0), vmath::exp(s, s.sub(s.zero(), v)))
}

/// `acc + a·b`.
#[derive(Clone, Copy)]
struct MulAcc;
impl<S: Simd> Accumulate<S> for MulAcc {
    #[inline(always)]
    fn apply(self, s: S, a: S::V, b: S::V, acc: S::V) -> S::V {
        s.mul_add(a, b, acc)
    }
}

/// `acc + a` (ignores `b`).
#[derive(Clone, Copy)]
struct SumAcc;
impl<S: Simd> Accumulate<S> for SumAcc {
    #[inline(always)]
    fn apply(self, s: S, a: S::V, _b: S::V, acc: S::V) -> S::V {
        s.add(a, acc)
    }
}

/// `acc + (a - c)²` (ignores `b`).
#[derive(Clone, Copy)]
struct SqDevAcc(f32);
impl<S: Simd> Accumulate<S> for SqDevAcc {
    #[inline(always)]
    fn apply(self, s: S, a: S::V, _b: S::V, acc: S::V) -> S::V {
        let d = s.sub(a, s.splat(self.0));
        s.mul_add(d, d, acc)
    }
}

/// `x[i] += y[i]`.
#[inline(always)]
pub(crate) fn add_assign<S: Simd>(s: S, x: &mut [f32], y: &[f32]) {
    zip_in_place(s, x, y, Add);
}

/// `x[i] += a[i] · b[i]`, the product rounded before the sum (no fused multiply-add).
#[inline(always)]
pub(crate) fn add_product<S: Simd>(s: S, x: &mut [f32], a: &[f32], b: &[f32]) {
    let (a, b) = (&a[..x.len()], &b[..x.len()]);
    let mut xc = x.chunks_exact_mut(S::LANES);
    let (mut ac, mut bc) = (a.chunks_exact(S::LANES), b.chunks_exact(S::LANES));
    for ((x, a), b) in (&mut xc).zip(&mut ac).zip(&mut bc) {
        let v = s.add(s.load(x), s.mul(s.load(a), s.load(b)));
        s.store(x, v);
    }
    let xt = xc.into_remainder();
    if !xt.is_empty() {
        let p = s.mul(
            s.load_part(ac.remainder(), 0.0),
            s.load_part(bc.remainder(), 0.0),
        );
        let v = s.add(s.load_part(xt, 0.0), p);
        s.store_part(xt, v);
    }
}

/// `x[i] += c · y[i]`.
#[inline(always)]
pub(crate) fn axpy<S: Simd>(s: S, x: &mut [f32], c: f32, y: &[f32]) {
    zip_in_place(s, x, y, AddScaled(c));
}

/// `x[i] += bias[i % bias.len()]`, row by row.
#[inline(always)]
pub(crate) fn add_bias<S: Simd>(s: S, x: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    for row in x.chunks_exact_mut(bias.len()) {
        zip_in_place(s, row, bias, Add);
    }
}

/// `x[i] *= c`.
#[inline(always)]
pub(crate) fn scale<S: Simd>(s: S, x: &mut [f32], c: f32) {
    map_in_place(s, x, Scale(c));
}

/// In-place exact GELU.
#[inline(always)]
pub(crate) fn gelu_erf<S: Simd>(s: S, x: &mut [f32]) {
    map_in_place(s, x, Gelu);
}

/// In-place GELU with the rational `erf` (see [`super::gelu_rational`]).
#[inline(always)]
pub(crate) fn gelu_rational<S: Simd>(s: S, x: &mut [f32]) {
    map_in_place(s, x, GeluRational);
}

/// The finish of a tile of an int8 product (see [`super::dequant_i32`]).
#[inline(always)]
pub(crate) fn dequant_i32<S: Simd>(
    s: S,
    y: &mut [&mut [f32]],
    sums: &[i32],
    lds: usize,
    deq: &super::Dequant<'_>,
) {
    let n = y.first().map_or(0, |r| r.len());
    let rows = y.len();
    assert!(
        y.iter().all(|r| r.len() == n)
            && lds >= n
            && (rows == 0 || sums.len() >= (rows - 1) * lds + n)
            && deq.x_steps.len() >= rows
            && deq.w_steps.len() >= n
            && deq.bias.is_none_or(|b| b.len() >= n),
        "dequant_i32: lengths differ"
    );
    for (r, row) in y.iter_mut().enumerate() {
        let d = DequantLanes {
            xs: s.splat(deq.x_steps[r]),
            w_steps: deq.w_steps.as_ptr(),
            bias: deq.bias.map(<[f32]>::as_ptr),
            y: row.as_mut_ptr(),
            flags: (deq.accumulate, deq.gelu),
        };
        let sums = &sums[r * lds..r * lds + n];
        let mut i = 0;
        // (Loops and `inline(always)` functions, not closures: a closure would not inherit the
        // target features.)
        while i + S::LANES <= n {
            // SAFETY: i + LANES ≤ n ≤ every slice's length (checked above).
            unsafe { dequant_lanes(s, &d, s.load_i32_ptr(sums.as_ptr().add(i)), i, S::LANES) };
            i += S::LANES;
        }
        if i < n {
            let mut tail = [0i32; 16];
            debug_assert!(S::LANES <= tail.len());
            tail[..n - i].copy_from_slice(&sums[i..]);
            // SAFETY: `tail` holds 16 ≥ LANES values; n - i < LANES lanes from i < n.
            unsafe { dequant_lanes(s, &d, s.load_i32_ptr(tail.as_ptr()), i, n - i) };
        }
    }
}

/// The operands of [`dequant_lanes`] (raw pointers: [`dequant_i32`] checks the lengths).
struct DequantLanes<S: Simd> {
    xs: S::V,
    w_steps: *const f32,
    bias: Option<*const f32>,
    y: *mut f32,
    flags: (bool, bool),
}

/// `len` lanes of [`dequant_i32`] from element `i`, the sums already loaded.
///
/// # Safety
/// Elements `i..i + len` (`len ≤ LANES`) of `d`'s slices are in bounds.
#[inline(always)]
unsafe fn dequant_lanes<S: Simd>(s: S, d: &DequantLanes<S>, sums: S::V, i: usize, len: usize) {
    let (accumulate, gelu) = d.flags;
    // SAFETY: in bounds (contract); partial loads and stores touch `len` lanes only.
    unsafe {
        let ws = s.load_part_ptr(d.w_steps.add(i), len, 0.0);
        let mut v = s.mul(s.mul(sums, d.xs), ws);
        if let Some(b) = d.bias {
            v = s.add(v, s.load_part_ptr(b.add(i), len, 0.0));
        }
        if accumulate {
            v = s.add(s.load_part_ptr(d.y.add(i), len, 0.0), v);
        }
        if gelu {
            v = GeluRational.apply(s, v);
        }
        s.store_part_ptr(d.y.add(i), len, v);
    }
}

/// In-place `erf`.
#[inline(always)]
pub(crate) fn erf<S: Simd>(s: S, x: &mut [f32]) {
    map_in_place(s, x, Erf);
}

/// In-place `exp`.
#[inline(always)]
pub(crate) fn exp<S: Simd>(s: S, x: &mut [f32]) {
    map_in_place(s, x, Exp);
}

/// In-place SiLU.
#[inline(always)]
pub(crate) fn silu<S: Simd>(s: S, x: &mut [f32]) {
    map_in_place(s, x, Silu);
}

/// `g[i] = silu(g[i]) · u[i]` (SwiGLU, the gate replaced by the output).
#[inline(always)]
pub(crate) fn silu_mul<S: Simd>(s: S, g: &mut [f32], u: &[f32]) {
    zip_in_place(s, g, u, SiluMul);
}

/// In-place `tanh`.
#[inline(always)]
pub(crate) fn tanh<S: Simd>(s: S, x: &mut [f32]) {
    map_in_place(s, x, Tanh);
}

/// Sum of `f(a_i, b_i)` vectors over `a` and the same-length prefix of `b`, with four
/// accumulators; the result is still a vector. The padding lanes of a partial tail read
/// `fill` from `a` and 0 from `b`: `f` must add nothing for them.
#[inline(always)]
fn sum_zip<S: Simd>(s: S, a: &[f32], b: &[f32], fill: f32, f: impl Accumulate<S>) -> S::V {
    let b = &b[..a.len()];
    let w = 4 * S::LANES;
    let mut acc = [s.zero(); 4];
    let mut ac = a.chunks_exact(w);
    let mut bc = b.chunks_exact(w);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for (u, av) in acc.iter_mut().enumerate() {
            let o = u * S::LANES;
            *av = f.apply(s, s.load(&x[o..]), s.load(&y[o..]), *av);
        }
    }
    let (ar, br) = (ac.remainder(), bc.remainder());
    let mut ai = ar.chunks_exact(S::LANES);
    let mut bi = br.chunks_exact(S::LANES);
    for (x, y) in (&mut ai).zip(&mut bi) {
        acc[0] = f.apply(s, s.load(x), s.load(y), acc[0]);
    }
    if !ai.remainder().is_empty() {
        let x = s.load_part(ai.remainder(), fill);
        let y = s.load_part(bi.remainder(), 0.0);
        acc[1] = f.apply(s, x, y, acc[1]);
    }
    s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]))
}

/// f32 lanes widened from `S::LANES` bf16 values (their bits; exact).
#[inline(always)]
fn load_bf16<S: Simd>(s: S, a: &[u16]) -> S::V {
    let mut buf = [0.0f32; 16];
    for (v, &b) in buf.iter_mut().zip(&a[..S::LANES]) {
        *v = f32::from_bits((b as u32) << 16);
    }
    s.load(&buf[..S::LANES])
}

/// [`load_bf16`] of the first `a.len() < S::LANES` values, the rest 0.
#[inline(always)]
fn load_part_bf16<S: Simd>(s: S, a: &[u16]) -> S::V {
    let mut buf = [0u16; 16];
    buf[..a.len()].copy_from_slice(a);
    load_bf16(s, &buf)
}

/// `Σ a_i x_i` with `a` bf16 (bits), widened in registers; the same sums in the same order as
/// [`dot`] over the widened values. `x` must be at least as long as `a`.
#[inline(always)]
pub(crate) fn dot_bf16<S: Simd>(s: S, a: &[u16], x: &[f32]) -> f32 {
    let x = &x[..a.len()];
    let w = 4 * S::LANES;
    let mut acc = [s.zero(); 4];
    let mut ac = a.chunks_exact(w);
    let mut xc = x.chunks_exact(w);
    for (p, q) in (&mut ac).zip(&mut xc) {
        for (u, av) in acc.iter_mut().enumerate() {
            let o = u * S::LANES;
            *av = s.mul_add(load_bf16(s, &p[o..]), s.load(&q[o..]), *av);
        }
    }
    let (ar, xr) = (ac.remainder(), xc.remainder());
    let mut ai = ar.chunks_exact(S::LANES);
    let mut xi = xr.chunks_exact(S::LANES);
    for (p, q) in (&mut ai).zip(&mut xi) {
        acc[0] = s.mul_add(load_bf16(s, p), s.load(q), acc[0]);
    }
    if !ai.remainder().is_empty() {
        let p = load_part_bf16(s, ai.remainder());
        let q = s.load_part(xi.remainder(), 0.0);
        acc[1] = s.mul_add(p, q, acc[1]);
    }
    s.reduce_add(s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3])))
}

/// `x[i] += c · b[i]` with `b` bf16 (bits), widened in registers (as [`axpy`] over the widened
/// values).
#[inline(always)]
pub(crate) fn axpy_bf16<S: Simd>(s: S, x: &mut [f32], c: f32, b: &[u16]) {
    let b = &b[..x.len()];
    let cv = s.splat(c);
    let mut xc = x.chunks_exact_mut(S::LANES);
    let mut bc = b.chunks_exact(S::LANES);
    for (p, q) in (&mut xc).zip(&mut bc) {
        let v = s.mul_add(load_bf16(s, q), cv, s.load(p));
        s.store(p, v);
    }
    let xt = xc.into_remainder();
    if !xt.is_empty() {
        let v = s.mul_add(load_part_bf16(s, bc.remainder()), cv, s.load_part(xt, 0.0));
        s.store_part(xt, v);
    }
}

/// `Σ a_i b_i`; `b` must be at least as long as `a`.
#[inline(always)]
pub(crate) fn dot<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    s.reduce_add(sum_zip(s, a, b, 0.0, MulAcc))
}

/// `Σ (x_i - c)²`.
#[inline(always)]
fn sum_sq_dev<S: Simd>(s: S, x: &[f32], c: f32) -> f32 {
    s.reduce_add(sum_zip(s, x, x, c, SqDevAcc(c)))
}

/// `Σ x_i`.
#[inline(always)]
fn sum<S: Simd>(s: S, x: &[f32]) -> f32 {
    s.reduce_add(sum_zip(s, x, x, 0.0, SumAcc))
}

/// In-place layer norm over rows of `dim` elements (two-pass mean and biased variance in f32).
#[inline(always)]
pub(crate) fn layer_norm<S: Simd>(
    s: S,
    x: &mut [f32],
    dim: usize,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) {
    if dim == 0 {
        return;
    }
    let (gamma, beta) = (&gamma[..dim], &beta[..dim]);
    for row in x.chunks_exact_mut(dim) {
        let mean = sum(s, row) / dim as f32;
        let var = sum_sq_dev(s, row, mean) as f64 / dim as f64;
        let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
        let (mv, iv) = (s.splat(mean), s.splat(inv));
        let mut rc = row.chunks_exact_mut(S::LANES);
        let mut gc = gamma.chunks_exact(S::LANES);
        let mut bc = beta.chunks_exact(S::LANES);
        for ((r, g), b) in (&mut rc).zip(&mut gc).zip(&mut bc) {
            let xhat = s.mul(s.sub(s.load(r), mv), iv);
            s.store(r, s.mul_add(xhat, s.load(g), s.load(b)));
        }
        let rt = rc.into_remainder();
        if !rt.is_empty() {
            let g = s.load_part(gc.remainder(), 0.0);
            let b = s.load_part(bc.remainder(), 0.0);
            let xhat = s.mul(s.sub(s.load_part(rt, 0.0), mv), iv);
            s.store_part(rt, s.mul_add(xhat, g, b));
        }
    }
}

/// In-place softmax of one row: max subtraction, vector `exp`, one division.
#[inline(always)]
pub(crate) fn softmax<S: Simd>(s: S, x: &mut [f32]) {
    let ninf = f32::NEG_INFINITY;
    let mut mx = s.splat(ninf);
    let mut chunks = x.chunks_exact(S::LANES);
    for c in &mut chunks {
        mx = s.max(mx, s.load(c));
    }
    mx = s.max(mx, s.load_part(chunks.remainder(), ninf));
    let mv = s.splat(s.reduce_max(mx));
    let mut acc = s.zero();
    let mut chunks = x.chunks_exact_mut(S::LANES);
    for c in &mut chunks {
        let e = vmath::exp(s, s.sub(s.load(c), mv));
        s.store(c, e);
        acc = s.add(acc, e);
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        // Padding lanes load as -inf, so they add exp(-inf) = 0 to the sum.
        let e = vmath::exp(s, s.sub(s.load_part(tail, ninf), mv));
        s.store_part(tail, e);
        acc = s.add(acc, e);
    }
    scale(s, x, 1.0 / s.reduce_add(acc));
}

/// `x /= max(‖x‖₂, 1e-12)`, as `torch.nn.functional.normalize`.
#[inline(always)]
pub(crate) fn l2_normalize<S: Simd>(s: S, x: &mut [f32]) {
    let norm = (dot(s, x, x) as f64).sqrt().max(1e-12);
    scale(s, x, (1.0 / norm) as f32);
}

/// Cosine similarity `a·b / (‖a‖ ‖b‖)`, 0 when either vector is zero.
#[inline(always)]
pub(crate) fn cosine<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    let b = &b[..a.len()];
    let mut ab = [s.zero(); 2];
    let mut aa = [s.zero(); 2];
    let mut bb = [s.zero(); 2];
    let w = 2 * S::LANES;
    let mut ac = a.chunks_exact(w);
    let mut bc = b.chunks_exact(w);
    for (x, y) in (&mut ac).zip(&mut bc) {
        for u in 0..2 {
            let o = u * S::LANES;
            let (xv, yv) = (s.load(&x[o..]), s.load(&y[o..]));
            ab[u] = s.mul_add(xv, yv, ab[u]);
            aa[u] = s.mul_add(xv, xv, aa[u]);
            bb[u] = s.mul_add(yv, yv, bb[u]);
        }
    }
    for (u, (x, y)) in ac
        .remainder()
        .chunks(S::LANES)
        .zip(bc.remainder().chunks(S::LANES))
        .enumerate()
    {
        let (xv, yv) = (s.load_part(x, 0.0), s.load_part(y, 0.0));
        ab[u] = s.mul_add(xv, yv, ab[u]);
        aa[u] = s.mul_add(xv, xv, aa[u]);
        bb[u] = s.mul_add(yv, yv, bb[u]);
    }
    let ab = s.reduce_add(s.add(ab[0], ab[1])) as f64;
    let aa = s.reduce_add(s.add(aa[0], aa[1])) as f64;
    let bb = s.reduce_add(s.add(bb[0], bb[1])) as f64;
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (ab / (aa * bb).sqrt()) as f32
}
