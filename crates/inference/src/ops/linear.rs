//! `Linear`: `y = x · Wᵀ + b` with `W` in the `nn.Linear` layout `[out_dim, in_dim]`.

use crate::backend::cpu;
use crate::io::store::{Scope, Weight};
use crate::Result;

/// A dense layer.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,       // f32 [out_dim, in_dim]
    bias: Option<Weight>, // f32 [out_dim]
}

impl Linear {
    /// Loads `weight` (and `bias` when `with_bias`) under `scope`.
    pub fn load(scope: &Scope, in_dim: usize, out_dim: usize, with_bias: bool) -> Result<Self> {
        let weight = scope.get("weight", &[out_dim, in_dim])?;
        let bias = if with_bias {
            Some(scope.get("bias", &[out_dim])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    /// Concatenates layers with the same input size along the output dimension (e.g. Q, K and
    /// V projections into one matrix product). Copies the weights once, at load.
    pub fn concat(parts: &[Linear]) -> Linear {
        let in_dim = parts[0].in_dim();
        let out_dim: usize = parts.iter().map(Linear::out_dim).sum();
        let mut w = Vec::with_capacity(out_dim * in_dim);
        for p in parts {
            debug_assert_eq!(p.in_dim(), in_dim);
            w.extend_from_slice(p.weight.as_slice());
        }
        let bias = if parts.iter().all(|p| p.bias.is_some()) {
            let mut b = Vec::with_capacity(out_dim);
            for p in parts {
                b.extend_from_slice(p.bias.as_ref().map(Weight::as_slice).unwrap_or(&[]));
            }
            Some(Weight::from_vec(b, vec![out_dim]))
        } else {
            None
        };
        Linear {
            weight: Weight::from_vec(w, vec![out_dim, in_dim]),
            bias,
        }
    }

    /// Input features.
    pub fn in_dim(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.weight.shape()[0]
    }

    /// `x` f32 [n, in_dim] → f32 [n, out_dim].
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let n = x.len() / self.in_dim();
        let mut y = vec![0.0f32; n * self.out_dim()];
        self.forward_into(x, &mut y);
        y
    }

    /// Like [`Linear::forward`], writing into `y` f32 [n, out_dim].
    pub fn forward_into(&self, x: &[f32], y: &mut [f32]) {
        let (k, n_out) = (self.in_dim(), self.out_dim());
        let m = x.len() / k;
        debug_assert_eq!(x.len(), m * k);
        debug_assert_eq!(y.len(), m * n_out);
        if m == 0 {
            return;
        }
        cpu::gemm_bt(
            m,
            n_out,
            k,
            x,
            k,
            self.weight.as_slice(),
            k,
            y,
            n_out,
            false,
        );
        if let Some(b) = &self.bias {
            cpu::add_bias(y, b.as_slice());
        }
    }
}
