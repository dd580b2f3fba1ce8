//! The vector-unit vocabulary that the generic kernels (`vector.rs`, `vmath.rs`, `microkernel.rs`)
//! are written in, so that each loop exists once and is instantiated per instruction set.
//!
//! An implementor is a zero-sized *token*: holding a value proves that the CPU supports the
//! instruction set (tokens are only created by the x86 modules after runtime detection), which is
//! why the slice-based methods are safe. Every method must be `#[inline(always)]`, and the generic
//! kernels too, so that the whole loop is inlined into one `#[target_feature]` entry point and
//! compiled with those features. This module owns no intrinsics and no dispatch.

/// One SIMD instruction set seen as `LANES` f32 lanes.
///
/// Pointer methods are `unsafe`: the caller guarantees the pointed-to lanes are in bounds.
pub(crate) trait Simd: Copy {
    /// Number of f32 lanes in one vector.
    const LANES: usize;
    /// A vector of `LANES` f32.
    type V: Copy;
    /// The result of a lane-wise comparison.
    type M: Copy;

    /// All lanes set to `x`.
    fn splat(self, x: f32) -> Self::V;
    /// Loads `LANES` elements from `p`.
    ///
    /// # Safety
    /// `p..p + LANES` must be readable.
    unsafe fn load_ptr(self, p: *const f32) -> Self::V;
    /// Asks the cache for the line holding `p` (a hint: it never faults; a no-op by default).
    #[inline(always)]
    fn prefetch<T>(self, p: *const T) {
        let _ = p;
    }
    /// Loads `LANES` bf16 values (their bits) at `p`, widened to f32 (exact).
    ///
    /// # Safety
    /// `p..p + LANES` must be readable.
    unsafe fn load_bf16_ptr(self, p: *const u16) -> Self::V;
    /// Loads `LANES` i32 values at `p`, converted to f32 (rounded to nearest).
    ///
    /// # Safety
    /// `p..p + LANES` must be readable.
    unsafe fn load_i32_ptr(self, p: *const i32) -> Self::V;
    /// Stores `LANES` elements to `p`.
    ///
    /// # Safety
    /// `p..p + LANES` must be writable.
    unsafe fn store_ptr(self, p: *mut f32, v: Self::V);
    /// Loads the first `n` (`n <= LANES`) elements from `p`; the other lanes hold `fill`.
    ///
    /// # Safety
    /// `p..p + n` must be readable; nothing past it is touched.
    unsafe fn load_part_ptr(self, p: *const f32, n: usize, fill: f32) -> Self::V;
    /// Stores the first `n` (`n <= LANES`) lanes of `v` to `p`.
    ///
    /// # Safety
    /// `p..p + n` must be writable; nothing past it is touched.
    unsafe fn store_part_ptr(self, p: *mut f32, n: usize, v: Self::V);

    /// `a + b`.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b`.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a / b` (correctly rounded).
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `1 / a` to a relative error below 2^-14 (a hardware estimate, refined where the
    /// estimate is coarser); callers that need more correct it themselves.
    fn recip_approx(self, a: Self::V) -> Self::V;
    /// `a * b + c` with one rounding.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `c - a * b` with one rounding.
    fn neg_mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Lane-wise maximum; a NaN in `b` is returned as is.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise minimum; a NaN in `b` is returned as is.
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    /// `|a|`.
    fn abs(self, a: Self::V) -> Self::V;
    /// `|mag|` with the sign bit of `sign`.
    fn copysign(self, mag: Self::V, sign: Self::V) -> Self::V;
    /// Round to nearest integer, ties to even.
    fn round(self, a: Self::V) -> Self::V;
    /// `a * 2^n` for integral `n` in `[-300, 300]`, with gradual underflow and overflow to inf.
    fn ldexp(self, a: Self::V, n: Self::V) -> Self::V;
    /// Lane-wise `a < b` (false for NaN).
    fn lt(self, a: Self::V, b: Self::V) -> Self::M;
    /// `m ? t : f` per lane.
    fn select(self, m: Self::M, t: Self::V, f: Self::V) -> Self::V;
    /// Transposes the `LANES × LANES` block held in `rows` (`rows.len() == LANES`, else
    /// panics): afterwards `rows[j]` lane `i` is what `rows[i]` lane `j` was.
    fn transpose(self, rows: &mut [Self::V]);
    /// Sum of all lanes.
    fn reduce_add(self, v: Self::V) -> f32;
    /// Maximum of all lanes.
    fn reduce_max(self, v: Self::V) -> f32;

    /// All lanes zero.
    #[inline(always)]
    fn zero(self) -> Self::V {
        self.splat(0.0)
    }
    /// Loads `s[..LANES]`; panics if `s` is shorter.
    #[inline(always)]
    fn load(self, s: &[f32]) -> Self::V {
        let s = &s[..Self::LANES];
        // SAFETY: `s` holds exactly LANES readable elements (the slice above checked it).
        unsafe { self.load_ptr(s.as_ptr()) }
    }
    /// Stores to `s[..LANES]`; panics if `s` is shorter.
    #[inline(always)]
    fn store(self, s: &mut [f32], v: Self::V) {
        let s = &mut s[..Self::LANES];
        // SAFETY: `s` holds exactly LANES writable elements.
        unsafe { self.store_ptr(s.as_mut_ptr(), v) }
    }
    /// Loads all of `s` (`s.len() <= LANES`, else panics); the remaining lanes hold `fill`.
    #[inline(always)]
    fn load_part(self, s: &[f32], fill: f32) -> Self::V {
        assert!(s.len() <= Self::LANES);
        // SAFETY: exactly `s.len()` elements are read and they are in the slice.
        unsafe { self.load_part_ptr(s.as_ptr(), s.len(), fill) }
    }
    /// Stores the first `s.len()` lanes of `v` to `s` (`s.len() <= LANES`, else panics).
    #[inline(always)]
    fn store_part(self, s: &mut [f32], v: Self::V) {
        assert!(s.len() <= Self::LANES);
        // SAFETY: exactly `s.len()` elements are written and they are in the slice.
        unsafe { self.store_part_ptr(s.as_mut_ptr(), s.len(), v) }
    }
}

/// A lane-wise function of one vector. Kernels take these as types rather than closures:
/// a closure becomes its own function without the caller's `#[target_feature]`s, and the
/// intrinsics inside it then stop inlining.
pub(crate) trait Unary<S: Simd>: Copy {
    /// The function.
    fn apply(self, s: S, v: S::V) -> S::V;
}

/// A lane-wise function of two vectors (see [`Unary`]).
pub(crate) trait Binary<S: Simd>: Copy {
    /// The function.
    fn apply(self, s: S, a: S::V, b: S::V) -> S::V;
}

/// One step of a reduction over two vectors: returns the new accumulator (see [`Unary`]).
pub(crate) trait Accumulate<S: Simd>: Copy {
    /// The step.
    fn apply(self, s: S, a: S::V, b: S::V, acc: S::V) -> S::V;
}

/// Applies `f` to every vector of `x` in place (the tail through a partial load and store).
#[inline(always)]
pub(crate) fn map_in_place<S: Simd>(s: S, x: &mut [f32], f: impl Unary<S>) {
    let mut chunks = x.chunks_exact_mut(S::LANES);
    for c in &mut chunks {
        let v = s.load(c);
        s.store(c, f.apply(s, v));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let v = s.load_part(tail, 0.0);
        s.store_part(tail, f.apply(s, v));
    }
}

/// Applies `f(x, y)` lane-wise, writing into `x`; `y` must be at least as long as `x`.
#[inline(always)]
pub(crate) fn zip_in_place<S: Simd>(s: S, x: &mut [f32], y: &[f32], f: impl Binary<S>) {
    let y = &y[..x.len()];
    let mut xc = x.chunks_exact_mut(S::LANES);
    let mut yc = y.chunks_exact(S::LANES);
    for (a, b) in (&mut xc).zip(&mut yc) {
        let v = f.apply(s, s.load(a), s.load(b));
        s.store(a, v);
    }
    let xt = xc.into_remainder();
    if !xt.is_empty() {
        let v = f.apply(s, s.load_part(xt, 0.0), s.load_part(yc.remainder(), 0.0));
        s.store_part(xt, v);
    }
}
