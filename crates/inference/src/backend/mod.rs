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

/// Marks a forward pass on this thread until the guard drops ([`crate::ops::pass`]): backends
/// may keep what every layer of one pass builds alike (a GPU's attention page tables) for the
/// pass's later layers, and only within it.
pub(crate) fn begin_pass() -> PassGuard {
    let outer = PASS.with(|p| p.replace(PASSES.fetch_add(1, Ordering::Relaxed)));
    PassGuard { outer }
}

/// Ends the pass [`begin_pass`] began (back to the enclosing one, or to none).
pub(crate) struct PassGuard {
    outer: u64,
}

impl Drop for PassGuard {
    fn drop(&mut self) {
        PASS.with(|p| p.set(self.outer));
    }
}

/// The forward pass running on this thread (0 outside of one): unique per pass.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn pass_id() -> u64 {
    PASS.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_ids_are_unique_and_end_with_the_pass() {
        assert_eq!(pass_id(), 0);
        let first = {
            let _outer = begin_pass();
            let outer = pass_id();
            assert_ne!(outer, 0);
            {
                let _inner = begin_pass();
                assert_ne!(pass_id(), outer);
            }
            assert_eq!(pass_id(), outer);
            outer
        };
        assert_eq!(pass_id(), 0);
        let _next = begin_pass();
        assert_ne!(pass_id(), first);
    }
}
