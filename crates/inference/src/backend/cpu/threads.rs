//! How one kernel call is spread over rayon's worker threads.
//!
//! The policy is deliberately simple: a call below [`PAR_MIN_FLOPS`] runs on the calling
//! thread (no spawn, no wake-up latency); a larger one splits one index range into aligned,
//! contiguous parts, a few per thread so that a core slowed by other work does not hold the
//! rest back. Nested use (a GEMM called from inside a parallel loop over heads) is fine: rayon
//! runs the parts on whatever workers are free. This module knows nothing about matrices.

use rayon::prelude::*;

/// Products smaller than this many floating-point operations stay on the calling thread
/// (about 20 µs of single-core work, several times the cost of waking a worker).
pub(crate) const PAR_MIN_FLOPS: usize = 1 << 22;

/// Parts per worker thread when splitting (load balance against noisy neighbours).
const PARTS_PER_THREAD: usize = 2;

/// Number of worker threads a parallel call may use.
pub(crate) fn count() -> usize {
    rayon::current_num_threads().max(1)
}

/// Runs `f(start, end)` over a partition of `0..len` into contiguous ranges whose boundaries
/// are multiples of `align` (the last one ends at `len`): `threads * PARTS_PER_THREAD` ranges
/// if each still holds `min_len` elements, else one per thread. With one part, `f` runs inline.
pub(crate) fn for_each_range(
    len: usize,
    align: usize,
    min_len: usize,
    threads: usize,
    f: impl Fn(usize, usize) + Sync,
) {
    if len == 0 {
        return;
    }
    let align = align.max(1);
    let units = len.div_ceil(align);
    let min_units = min_len.div_ceil(align).max(1);
    // Several parts per thread when they stay large, otherwise one per thread.
    let parts = if units >= threads * PARTS_PER_THREAD * min_units {
        threads * PARTS_PER_THREAD
    } else {
        threads.min(units)
    };
    if threads <= 1 || parts <= 1 {
        f(0, len);
        return;
    }
    let per = units.div_ceil(parts) * align;
    (0..parts).into_par_iter().for_each(|t| {
        let start = t * per;
        let end = (start + per).min(len);
        if start < end {
            f(start, end);
        }
    });
}

/// Output pointer shared by the workers; each writes a disjoint set of elements.
pub(super) struct OutPtr<T>(pub(super) *mut T);
// (Manual impls: a derive would ask `T: Copy`.)
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}
// SAFETY: the drivers that share one hand each worker a disjoint set of output elements
// (whole tiles or groups), so no element is written twice or read while written.
unsafe impl<T> Send for OutPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// The pointer (a method, so that closures capture the `Send` wrapper, not the field).
    pub(super) fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn ranges_cover_everything_once_and_stay_aligned() {
        for (len, align, min_len) in [(1000, 32, 64), (7, 4, 1), (5, 8, 8), (0, 4, 1)] {
            let seen = Mutex::new(Vec::new());
            for_each_range(len, align, min_len, 2, |s, e| {
                seen.lock().unwrap().push((s, e))
            });
            let mut v = seen.into_inner().unwrap();
            v.sort();
            let mut next = 0;
            for (s, e) in v {
                assert_eq!(s, next);
                assert!(s % align == 0 && e > s);
                next = e;
            }
            assert_eq!(next, len);
        }
    }
}
