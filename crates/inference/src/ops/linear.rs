//! `Linear`: `y = x · Wᵀ + b` with `W` in the `nn.Linear` layout `[out_dim, in_dim]`.
//!
//! The weight is repacked once at load into the panel layout the GEMM kernel streams
//! ([`cpu::PackedWeights`]), so no call pays for a transpose; bias, exact GELU and residual adds
//! are fused into the kernel's epilogue while each output tile is still in cache.

use crate::backend::cpu::{self, PackedWeights};
use crate::io::store::{Scope, Weight};
use crate::Result;

/// A dense layer.
#[derive(Debug)]
pub struct Linear {
    weight: PackedWeights,  // f32 [out_dim, in_dim], repacked for the kernel
    bias: Option<Vec<f32>>, // f32 [out_dim]
    in_dim: usize,
    out_dim: usize,
}

impl Linear {
    /// Loads `weight` (and `bias` when `with_bias`) under `scope`.
    pub fn load(scope: &Scope, in_dim: usize, out_dim: usize, with_bias: bool) -> Result<Self> {
        Self::load_fused(std::slice::from_ref(scope), in_dim, &[out_dim], with_bias)
    }

    /// Loads several layers with the same input and stacks them along the output dimension
    /// (e.g. the Q, K and V projections as one product of width `sum(out_dims)`).
    pub fn load_fused(
        scopes: &[Scope],
        in_dim: usize,
        out_dims: &[usize],
        with_bias: bool,
    ) -> Result<Self> {
        let out_dim: usize = out_dims.iter().sum();
        let mut weights: Vec<Weight> = Vec::with_capacity(scopes.len());
        let mut bias = with_bias.then(|| Vec::with_capacity(out_dim));
        for (scope, &n) in scopes.iter().zip(out_dims) {
            weights.push(scope.get("weight", &[n, in_dim])?);
            if let Some(b) = bias.as_mut() {
                b.extend_from_slice(scope.get("bias", &[n])?.as_slice());
            }
        }
        let weight = if let [single] = weights.as_slice() {
            cpu::pack_weights(out_dim, in_dim, single.as_slice(), in_dim)
        } else {
            let stacked: Vec<f32> = weights.iter().flat_map(|w| w.as_slice()).copied().collect();
            cpu::pack_weights(out_dim, in_dim, &stacked, in_dim)
        };
        Ok(Self {
            weight,
            bias,
            in_dim,
            out_dim,
        })
    }

    /// Input features.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    fn rows(&self, x: &[f32]) -> usize {
        debug_assert_eq!(x.len() % self.in_dim, 0);
        x.len() / self.in_dim
    }

    fn run(&self, x: &[f32], y: &mut [f32], accumulate: bool, gelu: bool) {
        let m = self.rows(x);
        debug_assert_eq!(y.len(), m * self.out_dim);
        if m == 0 {
            return;
        }
        cpu::gemm_bt_packed(
            m,
            x,
            self.in_dim,
            &self.weight,
            y,
            self.out_dim,
            accumulate,
            self.bias.as_deref(),
            gelu,
        );
    }

    /// `x` f32 [n, in_dim] → f32 [n, out_dim].
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0f32; self.rows(x) * self.out_dim];
        self.run(x, &mut y, false, false);
        y
    }

    /// `gelu(x · Wᵀ + b)` with the exact (erf) GELU fused into the product.
    pub fn forward_gelu(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0f32; self.rows(x) * self.out_dim];
        self.run(x, &mut y, false, true);
        y
    }

    /// `residual + x · Wᵀ + b` (a residual connection fused into the product); `residual` has
    /// the output's shape f32 [n, out_dim].
    pub fn forward_residual(&self, x: &[f32], residual: &[f32]) -> Vec<f32> {
        let mut y = residual.to_vec();
        self.run(x, &mut y, true, false);
        y
    }
}
