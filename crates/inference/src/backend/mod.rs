//! Compute backends behind one seam. [`Device`] says where a model's weights, activations and
//! KV pages live; [`Op`] is the capability query. `cpu` is the scalar oracle plus the
//! runtime-dispatched SIMD kernels; `cuda` (feature `cuda`) launches NVRTC-compiled kernels and
//! cuBLAS. These are the only modules with intrinsics, device calls and `unsafe` kernel code;
//! ops, attention and state call them, models never do.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod mirror;

pub use device::{Device, Op};
pub use mirror::Mirror;
