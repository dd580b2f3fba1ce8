//! How one kernel call is spread over rayon's worker threads.
//!
//! The policy is deliberately simple: a call below [`PAR_MIN_FLOPS`] runs on the calling
//! thread (no spawn, no wake-up latency); a larger one splits one index range into aligned,
//! contiguous parts, a few per thread so that a core slowed by other work does not hold the
//! rest back. A kernel called from a task of a parallel map with at least one task per thread
//! (heads, sequences: [`in_task`]) stays on its task's thread, since every thread already has
//! work; elsewhere nested use is fine: rayon runs the parts on whatever workers are free. This
//! module knows nothing about matrices.

use std::cell::Cell;

use rayon::prelude::*;

thread_local! {
    /// Whether this thread is running a task of a map that keeps every thread busy.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as one task of a parallel map; when the map has at least one task per thread
/// (`busy`), the kernels `f` calls run on this thread alone (splitting them would only add
/// wake-ups and stealing).
pub(crate) fn in_task<R>(busy: bool, f: impl FnOnce() -> R) -> R {
    if !busy {
        return f();
    }
    let was = IN_TASK.with(|t| t.replace(true));
    let r = f();
    IN_TASK.with(|t| t.set(was));
    r
}

/// Products smaller than this many floating-point operations stay on the calling thread
/// (about 20 µs of single-core work, several times the cost of waking a worker).
pub(crate) const PAR_MIN_FLOPS: usize = 1 << 22;

/// Parts per worker thread when splitting (load balance against noisy neighbours).
const PARTS_PER_THREAD: usize = 2;

/// Number of worker threads a parallel call may use (one inside [`in_task`]).
pub(crate) fn count() -> usize {
    if IN_TASK.with(Cell::get) {
        1
    } else {
        rayon::current_num_threads().max(1)
    }
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

/// Sets the calling thread's floating-point unit to flush subnormal results to zero and to read
/// subnormal inputs as zero (x86-64: MXCSR's FTZ and DAZ bits; AArch64: FPCR.FZ; elsewhere
/// nothing). Values below 1.2e-38 then become 0, an absolute change no model output can show;
/// in exchange Intel cores skip the microcode assist (~100+ cycles) that every operation on a
/// subnormal costs there. Random-weight Qwen3.5 prefill on a Xeon (Gated DeltaNet decays
/// underflow into subnormals) ran 1.4-2.4x faster with it (docs/benchmarks.md).
pub fn flush_subnormals() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: `stmxcsr` / `ldmxcsr` read and write this thread's MXCSR through a valid,
        // aligned u32 on the stack; FTZ (bit 15) and DAZ (bit 6) exist on every x86-64 CPU
        // and change only how subnormals are produced and read; other bits are kept.
        unsafe {
            core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack));
            csr |= (1 << 15) | (1 << 6);
            core::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly));
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let mut fpcr: u64;
        // SAFETY: reading and writing FPCR only changes this thread's floating-point modes;
        // bit 24 (FZ) flushes subnormals to zero.
        unsafe {
            core::arch::asm!("mrs {}, fpcr", out(reg) fpcr, options(nomem, nostack));
            fpcr |= 1 << 24;
            core::arch::asm!("msr fpcr, {}", in(reg) fpcr, options(nomem, nostack));
        }
    }
}

/// A builder for a worker pool (`threads` workers, default one per core) whose threads
/// [`flush_subnormals`] as they start, unless `LATTICE_SUBNORMALS=keep` (strict IEEE
/// subnormals, slower on Intel). Applications build their pools with it (the `lattice` CLI and
/// server, the Python package); the library itself never changes a thread's modes. Fails as
/// [`flush_wanted`].
pub fn pool_builder(threads: Option<usize>) -> crate::Result<rayon::ThreadPoolBuilder> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(t) = threads {
        b = b.num_threads(t.max(1));
    }
    if flush_wanted()? {
        b = b.start_handler(|_| flush_subnormals());
    }
    Ok(b)
}

/// Whether [`pool_builder`] pools flush subnormals: `LATTICE_SUBNORMALS` unset or `flush`
/// (yes), `keep` (no); any other value fails ([`crate::Error::InvalidInput`], naming it).
pub fn flush_wanted() -> crate::Result<bool> {
    match std::env::var("LATTICE_SUBNORMALS") {
        Err(_) => Ok(true),
        Ok(v) if v == "flush" => Ok(true),
        Ok(v) if v == "keep" => Ok(false),
        Ok(v) => Err(crate::Error::InvalidInput(format!(
            "LATTICE_SUBNORMALS is {v:?}: use `flush` (the default) or `keep` (IEEE subnormals)"
        ))),
    }
}

#[cfg(test)]
mod subnormal_tests {
    use super::*;

    #[test]
    fn a_pool_from_the_builder_flushes_subnormals_and_others_do_not() {
        let tiny = f32::MIN_POSITIVE;
        let half = |x: f32| std::hint::black_box(x) * std::hint::black_box(0.5f32);
        let pool = pool_builder(Some(1)).unwrap().build().unwrap();
        let flushed = pool.install(|| half(tiny));
        let plain = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| half(tiny));
        assert!(plain > 0.0, "a default pool keeps subnormals");
        if flush_wanted().unwrap() && cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert_eq!(flushed, 0.0, "the builder's pool flushes subnormal results");
        }
    }
}
