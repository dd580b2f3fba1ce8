//! [`GdnLayer`]: the sequence-mixing core of a Gated DeltaNet layer on tensors, on the device
//! its input lives on. From the layer's input projection (conv inputs Q|K|V, then z, b, a per
//! row) it runs the causal depthwise convolution over each sequence's window, SiLU, the L2
//! normalization of queries and keys, the decay and write strength, and the gated delta rule
//! over each sequence's recurrent state; then [`GdnLayer::gated_norm`] applies the output's
//! gated RMSNorm. On the CPU this is [`super::gdn`]'s kernels over the states' host copies
//! (chunked for prompts); on a GPU two kernels per layer update the states' device blocks in
//! place (token by token).

use super::gdn::{delta_rule_heads, log_decay, GdnHeads, GdnInputs};
use crate::backend::Mirror;
use crate::ops::{causal_conv1d, rms_norm_silu_gate, sigmoid, silu, take_columns, RmsNorm};
use crate::state::SeqState;
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};

/// The per-layer weights of a Gated DeltaNet core and its shape.
#[derive(Debug)]
pub struct GdnLayer {
    heads: GdnHeads,
    kernel: usize,
    /// Convolution weight [conv_dim, kernel].
    conv: Vec<f32>,
    /// `exp(A_log)` [n_v_heads].
    a_log_exp: Vec<f32>,
    /// [n_v_heads].
    dt_bias: Vec<f32>,
    /// Device copies of `conv`, `a_log_exp`, `dt_bias`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    mirrors: [Mirror; 3],
}

impl GdnLayer {
    /// A layer of `heads` with a convolution of `kernel` taps (`conv` [conv_dim, kernel]),
    /// `a_log_exp` = `exp(A_log)` and `dt_bias` [n_v_heads].
    pub fn new(
        heads: GdnHeads,
        kernel: usize,
        conv: Vec<f32>,
        a_log_exp: Vec<f32>,
        dt_bias: Vec<f32>,
    ) -> Result<Self> {
        let nv = heads.n_v_heads;
        if conv.len() != (2 * heads.key_dim() + heads.value_dim()) * kernel
            || a_log_exp.len() != nv
            || dt_bias.len() != nv
            || kernel == 0
            || heads.n_k_heads == 0
            || !nv.is_multiple_of(heads.n_k_heads)
        {
            return Err(Error::Shape {
                op: "GdnLayer::new",
                reason: format!(
                    "{} conv values (kernel {kernel}), {} / {} head values for {heads:?}",
                    conv.len(),
                    a_log_exp.len(),
                    dt_bias.len()
                ),
            });
        }
        Ok(Self {
            heads,
            kernel,
            conv,
            a_log_exp,
            dt_bias,
            mirrors: Default::default(),
        })
    }

    /// Channels of the convolution: queries, keys and values side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.heads.key_dim() + self.heads.value_dim()
    }

    /// Width of the projection the layer reads: conv inputs, z, b, a.
    pub fn proj_dim(&self) -> usize {
        self.conv_dim() + self.heads.value_dim() + 2 * self.heads.n_v_heads
    }

    /// The core of recurrent layer `layer` over `proj` [rows, proj_dim] (the packed new
    /// tokens of every sequence, `lens[i]` of them for `states[i]`): returns the delta rule's
    /// outputs [rows, value_dim]; every state advances by its tokens.
    pub fn apply(
        &self,
        layer: usize,
        proj: &Tensor,
        lens: &[usize],
        states: &mut [&mut SeqState],
    ) -> Result<Tensor> {
        let rows = proj.rows();
        if proj.cols() != self.proj_dim()
            || lens.iter().sum::<usize>() != rows
            || lens.len() != states.len()
        {
            return Err(Error::Shape {
                op: "GdnLayer::apply",
                reason: format!(
                    "projection [{rows}, {}] (want {} columns) for sequences of {lens:?} ({} states)",
                    proj.cols(),
                    self.proj_dim(),
                    states.len()
                ),
            });
        }
        match proj.storage() {
            Storage::Cpu(p) => Ok(Tensor::cpu(
                rows,
                self.heads.value_dim(),
                self.apply_host(layer, p, lens, states)?,
            )),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => self.apply_cuda(&s.dev, &s.buf, layer, rows, lens, states),
        }
    }

    /// `norm` per value head of `core` [rows, value_dim] in place, times `silu(z)` (z: the
    /// projection's columns after the conv inputs).
    pub fn gated_norm(&self, core: &mut Tensor, proj: &Tensor, norm: &RmsNorm) -> Result<()> {
        let (rows, vd, dv) = (core.rows(), self.heads.value_dim(), self.heads.v_dim);
        if core.cols() != vd
            || proj.rows() != rows
            || proj.cols() != self.proj_dim()
            || norm.dim() != dv
        {
            return Err(Error::Shape {
                op: "GdnLayer::gated_norm",
                reason: format!(
                    "core [{rows}, {}], projection [{}, {}], norm of {}",
                    core.cols(),
                    proj.rows(),
                    proj.cols(),
                    norm.dim()
                ),
            });
        }
        let z_col = self.conv_dim();
        match (core.storage_mut(), proj.storage()) {
            (Storage::Cpu(c), Storage::Cpu(p)) => {
                let z = p.get(z_col..).unwrap_or_default();
                rms_norm_silu_gate(c, vd, norm, z, self.proj_dim());
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(c), Storage::Cuda(p)) => {
                let w = norm.cuda_weight(&c.dev)?;
                c.dev.rms_norm_silu_gate(
                    &mut c.buf,
                    w,
                    &p.buf,
                    self.proj_dim(),
                    z_col,
                    rows,
                    self.heads.n_v_heads,
                    dv,
                    norm.eps(),
                )
            }
            #[cfg(feature = "cuda")]
            _ => Err(crate::tensor::mixed("GdnLayer::gated_norm")),
        }
    }

    fn apply_host(
        &self,
        layer: usize,
        proj: &[f32],
        lens: &[usize],
        states: &mut [&mut SeqState],
    ) -> Result<Vec<f32>> {
        let heads = &self.heads;
        let (conv_dim, vd, nv) = (self.conv_dim(), heads.value_dim(), heads.n_v_heads);
        let width = self.proj_dim();
        let col = |c0: usize, w: usize| take_columns(proj, width, c0..c0 + w);
        let (mut beta, a) = (col(conv_dim + vd, nv), col(conv_dim + vd + nv, nv));
        sigmoid(&mut beta);
        let decay = log_decay(&a, &self.a_log_exp, &self.dt_bias);

        let mut core = Vec::new();
        let mut row0 = 0;
        for (&n, state) in lens.iter().zip(states.iter_mut()) {
            let rows = row0..row0 + n;
            row0 += n;
            let (conv_state, rec_state) = state.recurrent(layer);
            // Causal depthwise convolution over [window; new inputs (the projection's first
            // conv_dim columns, read in place)], then SiLU.
            let x = &proj[rows.start * width..rows.end * width];
            let mut mixed = causal_conv1d(conv_state, x, width, &self.conv, conv_dim, self.kernel);
            silu(&mut mixed);
            // The next window: the last kernel − 1 rows of [window; new inputs].
            let kept = conv_state.len() / conv_dim.max(1);
            let mut new_conv = Vec::with_capacity(conv_state.len());
            if n < kept {
                new_conv.extend_from_slice(&conv_state[n * conv_dim..]);
            }
            for row in x.chunks_exact(width).skip(n.saturating_sub(kept)) {
                new_conv.extend_from_slice(&row[..conv_dim]);
            }

            let per_head = rows.start * nv..rows.end * nv;
            let mut x = GdnInputs {
                qkv: &mut mixed,
                g: &decay[per_head.clone()],
                beta: &beta[per_head],
            };
            let (o, new_state) = delta_rule_heads(&mut x, heads, rec_state);
            crate::tensor::recycle(mixed);
            state.set_recurrent(layer, new_conv, new_state);
            if lens.len() == 1 {
                core = o;
            } else {
                core.extend(o);
            }
        }
        Ok(core)
    }

    #[cfg(feature = "cuda")]
    fn apply_cuda(
        &self,
        dev: &std::sync::Arc<crate::backend::cuda::CudaDevice>,
        proj: &crate::backend::cuda::Buf,
        layer: usize,
        rows: usize,
        lens: &[usize],
        states: &mut [&mut SeqState],
    ) -> Result<Tensor> {
        let mut blocks = Vec::with_capacity(states.len());
        let mut offsets = None;
        for state in states.iter_mut() {
            let (block, conv_off, rec_off) = state.recurrent_block(layer).ok_or_else(|| {
                Error::Device(format!(
                    "layer {layer}: a Gated DeltaNet layer on the GPU needs sequence states on \
                     the GPU"
                ))
            })?;
            let Storage::Cuda(b) = block.storage() else {
                return Err(crate::tensor::mixed("GdnLayer::apply"));
            };
            blocks.push(dev.ptr(&b.buf));
            if offsets.is_some_and(|o| o != (conv_off, rec_off)) {
                return Err(Error::Shape {
                    op: "GdnLayer::apply",
                    reason: "sequence states of different layouts in one batch".into(),
                });
            }
            offsets = Some((conv_off, rec_off));
        }
        let (conv_off, rec_off) = offsets.unwrap_or((0, 0));
        let mut cu = Vec::with_capacity(lens.len() + 1);
        let mut at = 0i32;
        cu.push(0);
        for &n in lens {
            at += n as i32;
            cu.push(at);
        }
        let [conv_w, a_log_exp, dt_bias] = &self.mirrors;
        let launch = crate::backend::cuda::GdnLaunch {
            proj,
            ld: self.proj_dim(),
            bcol: self.conv_dim() + self.heads.value_dim(),
            conv_w: conv_w.cuda(dev, &self.conv)?,
            kernel: self.kernel,
            a_log_exp: a_log_exp.cuda(dev, &self.a_log_exp)?,
            dt_bias: dt_bias.cuda(dev, &self.dt_bias)?,
            heads: self.heads,
            states: &blocks,
            cu: &cu,
            conv_off,
            rec_off,
        };
        let out = dev.gdn_layer(&launch)?;
        Ok(Tensor::cuda(dev, rows, self.heads.value_dim(), out))
    }
}
