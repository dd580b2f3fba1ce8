//! Shape-checked building blocks over the CPU kernels: linear layers (with fused bias, exact
//! GELU and residual epilogues), layer norm, embedding lookup and activations. Model files call
//! these; they never call `backend` directly for anything these cover.

mod embed;
mod linear;
mod norm;

pub use embed::Embedding;
pub use linear::Linear;
pub use norm::LayerNorm;

use crate::backend::cpu;

/// In-place tanh.
pub fn tanh(x: &mut [f32]) {
    cpu::tanh(x)
}
