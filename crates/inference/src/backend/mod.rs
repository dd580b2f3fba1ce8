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

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static PASSES: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static PASS: Cell<u64> = const { Cell::new(0) };
}

/// Marks the start of a forward pass on this thread ([`crate::ops::pass`]): backends may keep
/// what every layer of one pass builds alike (a GPU's attention page tables) until the next.
pub(crate) fn begin_pass() {
    PASS.with(|p| p.set(PASSES.fetch_add(1, Ordering::Relaxed)));
}

/// The forward pass running on this thread (0 outside of one): unique per pass.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn pass_id() -> u64 {
    PASS.with(Cell::get)
}
