//! Layer normalization (`torch.nn.LayerNorm` over the last dimension).

use crate::backend::cpu;
use crate::io::store::{Scope, Weight};
use crate::Result;

/// Layer norm with learned scale and shift.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Weight, // f32 [dim]
    bias: Weight,   // f32 [dim]
    eps: f32,
}

impl LayerNorm {
    /// Loads `weight`/`bias` under `scope`, falling back to the `gamma`/`beta` names of older
    /// TensorFlow-converted BERT checkpoints.
    pub fn load(scope: &Scope, dim: usize, eps: f32) -> Result<Self> {
        let (w, b) = if !scope.contains("weight") && scope.contains("gamma") {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok(Self {
            weight: scope.get(w, &[dim])?,
            bias: scope.get(b, &[dim])?,
            eps,
        })
    }

    /// Normalizes each row of `x` f32 [n, dim] in place.
    pub fn forward_inplace(&self, x: &mut [f32]) {
        let dim = self.weight.shape()[0];
        debug_assert_eq!(x.len() % dim, 0);
        cpu::layer_norm(
            x,
            dim,
            self.weight.as_slice(),
            self.bias.as_slice(),
            self.eps,
        );
    }
}

/// RMS norm (`LlamaRMSNorm` / `Qwen3RMSNorm`): `y = w ⊙ (x / sqrt(mean(x²) + eps))`, computed in
/// f32 in that order, as transformers does.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Weight, // f32 [dim]
    eps: f32,
}

impl RmsNorm {
    /// Loads `weight` f32 [dim] under `scope`.
    pub fn load(scope: &Scope, dim: usize, eps: f32) -> Result<Self> {
        Ok(Self::new(scope.get("weight", &[dim])?, eps))
    }

    /// Wraps a loaded weight f32 [dim].
    pub fn new(weight: Weight, eps: f32) -> Self {
        Self { weight, eps }
    }

    /// Width of each normalized row.
    pub fn dim(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Normalizes each row of `x` f32 [n, dim] in place.
    pub fn forward_inplace(&self, x: &mut [f32]) {
        let w = self.weight.as_slice();
        let dim = w.len();
        debug_assert_eq!(x.len() % dim, 0);
        for row in x.chunks_exact_mut(dim) {
            let r = 1.0 / (cpu::sum_squares(row) / dim as f32 + self.eps).sqrt();
            for (v, &g) in row.iter_mut().zip(w) {
                *v = g * (*v * r);
            }
        }
    }
}
