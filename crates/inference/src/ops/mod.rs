//! Shape-checked building blocks over the CPU kernels: linear layers, layer norm, embedding
//! lookup and activations. Model files call these; they never call `backend` directly for
//! anything these cover.

mod embed;
mod linear;
mod norm;

pub use embed::Embedding;
pub use linear::Linear;
pub use norm::LayerNorm;

use crate::backend::cpu;

/// In-place exact GELU (erf form), as `torch.nn.functional.gelu` with the default
/// `approximate='none'`.
pub fn gelu(x: &mut [f32]) {
    cpu::gelu_erf(x)
}

/// In-place tanh.
pub fn tanh(x: &mut [f32]) {
    cpu::tanh(x)
}

/// `x += y` elementwise (residual connection).
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    cpu::add_assign(x, y)
}
