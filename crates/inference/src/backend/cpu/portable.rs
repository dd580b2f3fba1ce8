//! A [`Simd`] implementation in plain Rust over `[f32; 8]`, which the compiler maps onto
//! whatever vector unit the build target guarantees (SSE2 on x86-64, NEON on aarch64).
//!
//! It gives the portable table a blocked GEMM that is far faster than the reference triple
//! loop. It needs no runtime detection, so its token is freely constructible. The elementwise
//! kernels of the portable table stay the `scalar` references.

use super::simd::Simd;

/// Number of lanes of the portable vector.
const L: usize = 8;

/// Token of the portable vector unit (always available).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Portable;

#[inline(always)]
fn map(a: [f32; L], f: impl Fn(f32) -> f32) -> [f32; L] {
    a.map(f)
}

#[inline(always)]
fn zip(a: [f32; L], b: [f32; L], f: impl Fn(f32, f32) -> f32) -> [f32; L] {
    std::array::from_fn(|i| f(a[i], b[i]))
}

impl Simd for Portable {
    const LANES: usize = L;
    type V = [f32; L];
    type M = [bool; L];

    #[inline(always)]
    fn splat(self, x: f32) -> Self::V {
        [x; L]
    }
    #[inline(always)]
    unsafe fn load_ptr(self, p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees L readable floats at p (alignment 4 is enough).
        unsafe { std::ptr::read_unaligned(p as *const [f32; L]) }
    }
    #[inline(always)]
    unsafe fn load_i32_ptr(self, p: *const i32) -> Self::V {
        // SAFETY: the caller guarantees L readable i32 at p.
        unsafe { std::ptr::read_unaligned(p as *const [i32; L]) }.map(|v| v as f32)
    }
    #[inline(always)]
    unsafe fn load_bf16_ptr(self, p: *const u16) -> Self::V {
        // SAFETY: the caller guarantees L readable bf16 values at p.
        let bits = unsafe { std::ptr::read_unaligned(p as *const [u16; L]) };
        bits.map(|b| f32::from_bits((b as u32) << 16))
    }
    #[inline(always)]
    unsafe fn store_ptr(self, p: *mut f32, v: Self::V) {
        // SAFETY: the caller guarantees L writable floats at p.
        unsafe { std::ptr::write_unaligned(p as *mut [f32; L], v) }
    }
    #[inline(always)]
    unsafe fn load_part_ptr(self, p: *const f32, n: usize, fill: f32) -> Self::V {
        let mut v = [fill; L];
        for (i, slot) in v.iter_mut().enumerate().take(n.min(L)) {
            // SAFETY: i < n, and the caller guarantees n readable floats at p.
            *slot = unsafe { *p.add(i) };
        }
        v
    }
    #[inline(always)]
    unsafe fn store_part_ptr(self, p: *mut f32, n: usize, v: Self::V) {
        for (i, &x) in v.iter().enumerate().take(n.min(L)) {
            // SAFETY: i < n, and the caller guarantees n writable floats at p.
            unsafe { *p.add(i) = x };
        }
    }
    #[inline(always)]
    fn add(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x + y)
    }
    #[inline(always)]
    fn sub(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x - y)
    }
    #[inline(always)]
    fn mul(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn div(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| x / y)
    }
    #[inline(always)]
    fn recip_approx(self, a: Self::V) -> Self::V {
        map(a, |x| 1.0 / x)
    }
    /// Unfused on targets without FMA (`a * b + c`, two roundings): the compiler can vectorize
    /// it, where `f32::mul_add` would call into libm per lane.
    #[inline(always)]
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    fn neg_mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| c[i] - a[i] * b[i])
    }
    #[inline(always)]
    fn max(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    fn min(self, a: Self::V, b: Self::V) -> Self::V {
        zip(a, b, |x, y| if x < y { x } else { y })
    }
    #[inline(always)]
    fn abs(self, a: Self::V) -> Self::V {
        map(a, f32::abs)
    }
    #[inline(always)]
    fn copysign(self, mag: Self::V, sign: Self::V) -> Self::V {
        zip(mag, sign, f32::copysign)
    }
    #[inline(always)]
    fn round(self, a: Self::V) -> Self::V {
        map(a, f32::round_ties_even)
    }
    #[inline(always)]
    fn ldexp(self, a: Self::V, n: Self::V) -> Self::V {
        zip(a, n, |x, e| {
            let e = e.clamp(-252.0, 254.0) as i32;
            let (e1, e2) = (e >> 1, e - (e >> 1));
            let p = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
            x * p(e1) * p(e2)
        })
    }
    #[inline(always)]
    fn lt(self, a: Self::V, b: Self::V) -> Self::M {
        std::array::from_fn(|i| a[i] < b[i])
    }
    #[inline(always)]
    fn select(self, m: Self::M, t: Self::V, f: Self::V) -> Self::V {
        std::array::from_fn(|i| if m[i] { t[i] } else { f[i] })
    }
    #[inline(always)]
    fn transpose(self, rows: &mut [Self::V]) {
        let r: &mut [[f32; L]; L] = rows.try_into().expect("transpose takes LANES rows");
        let orig = *r;
        for (j, row) in r.iter_mut().enumerate() {
            for (v, src) in row.iter_mut().zip(&orig) {
                *v = src[j];
            }
        }
    }
    #[inline(always)]
    fn reduce_add(self, v: Self::V) -> f32 {
        let h: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
        (h[0] + h[2]) + (h[1] + h[3])
    }
    #[inline(always)]
    fn reduce_max(self, v: Self::V) -> f32 {
        v.into_iter().fold(f32::NEG_INFINITY, f32::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldexp_reaches_subnormals_and_overflow() {
        let s = Portable;
        assert_eq!(s.ldexp([1.0; L], [-149.0; L])[0], f32::from_bits(1));
        assert_eq!(s.ldexp([1.0; L], [128.0; L])[0], f32::INFINITY);
        assert_eq!(s.ldexp([1.5; L], [3.0; L])[0], 12.0);
    }
}
