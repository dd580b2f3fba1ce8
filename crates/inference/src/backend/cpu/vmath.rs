//! Vectorized elementary functions over the [`Simd`] vocabulary: `exp`, `erf`, the normal CDF
//! used by exact GELU, and `tanh`, each accurate to a few ulp in f32.
//!
//! The polynomial coefficients were fitted for this crate (Chebyshev fits in 40-digit
//! arithmetic, rounded to f32) on the intervals named beside them. Errors against the f64
//! references in `scalar` are measured by `tests/kernels.rs`. No slices here, only vectors:
//! the loops live in `vector.rs`.

use super::simd::Simd;

/// `e^r` on `[-ln2/2, ln2/2]`, degree 6, ascending (relative error 2e-8 with f32 coefficients).
const EXP_POLY: [f32; 7] = [
    1.0,
    1.0,
    0.5,
    0.166_664_15,
    0.041_666_35,
    0.008_375_126,
    0.001_394_110_8,
];
/// `ln 2` split so that `n * LN2_HI` is exact for `|n| < 2^9`.
const LN2_HI: f32 = 0.693_145_75;
/// `ln 2 - LN2_HI`.
const LN2_LO: f32 = 1.428_606_8e-6;

/// `2/√π` split into an f32 head and tail, so that `erf(x) ≈ x · 2/√π` near zero keeps full
/// precision.
const TWO_OVER_SQRT_PI_HI: f32 = std::f32::consts::FRAC_2_SQRT_PI;
/// `2/√π - TWO_OVER_SQRT_PI_HI`.
const TWO_OVER_SQRT_PI_LO: f32 = -5.863_538_3e-8;
/// `(erf(x)/x - 2/√π) / x²` as a polynomial in `u = x²` on `[0, 0.25]`, degree 4, ascending
/// (relative error of `erf` 2.3e-9).
const ERF_SMALL: [f32; 5] = [
    -0.376_126_38,
    0.112_837_87,
    -0.026_864_802,
    0.005_208_545,
    -0.000_783_140_1,
];
/// `(Φ(x) - 1/2) / x` as a polynomial in `v = x²` on `[0, 0.5]`, degree 5, ascending (relative
/// error 2.8e-8), for GELU near zero.
const PHI_SMALL: [f32; 6] = [
    0.398_942_3,
    -0.066_490_38,
    0.009_973_542,
    -0.001_187_194_4,
    0.000_114_913_99,
    -8.501_34e-6,
];
/// `p` in `t = 1 / (1 + p·z)`, the variable of [`ERFC_POLY`].
const ERFC_P: f32 = 0.5;
/// `erfc(z) · e^{z²} / t` as a polynomial in `t` for `z` in `[0.5, 10]`, degree 10, ascending
/// (fit error 7e-11).
const ERFC_POLY: [f32; 11] = [
    0.282_096_5,
    0.282_038_54,
    0.247_652_58,
    0.169_320_08,
    0.122_436_2,
    -0.149_797_28,
    0.318_348_77,
    -0.704_448_64,
    0.703_316_33,
    -0.334_936_98,
    0.063_979_22,
];
/// The derivative `d(t · ERFC_POLY(t))/dt` on the same range, degree 4 (relative error 3e-4):
/// only used to correct for the rounding of `t`.
const ERFC_DPOLY: [f32; 5] = [
    0.273_333_2,
    0.686_822,
    0.109_101_16,
    2.178_142_5,
    -0.990_340_65,
];
/// Below this `|z|`, erf uses [`ERF_SMALL`] and GELU [`PHI_SMALL`]; above it, [`ERFC_POLY`].
const ERF_SPLIT: f32 = 0.5;

/// `erf(z)/z ≈ P(u)/Q(u)`, `u = z²`, on `z` in `[0, ERF_RATIONAL_MAX]`: the numerator `P`
/// (degree 5, ascending), fitted with [`ERF_RATIONAL_Q`] by reweighted least squares on the
/// absolute error of `erf` (3.5e-7 evaluated in f32). (Its first coefficient is the fit's, one
/// ulp below 2/√π.)
#[allow(clippy::approx_constant)]
const ERF_RATIONAL_P: [f32; 6] = [
    1.128_379,
    0.192_765_3,
    0.053_060_584,
    0.003_868_364_3,
    0.000_287_477_4,
    2.034_688_4e-6,
];
/// The denominator of [`ERF_RATIONAL_P`] without its constant 1, degree 5, ascending from `u`.
const ERF_RATIONAL_Q: [f32; 5] = [
    0.504_165_5,
    0.115_085_07,
    0.015_172_371,
    0.001_188_118_8,
    3.807_005e-5,
];
/// Where `erf` rounds to 1 in f32 (`1 − erf(3.92) < 2^-25`): the rational form is clamped here.
const ERF_RATIONAL_MAX: f32 = 3.92;

/// `(tanh(x)/x - 1) / x²` as a polynomial in `u = x²` on `[0, 0.625²]`, degree 4, ascending.
const TANH_POLY: [f32; 5] = [
    -0.333_333_28,
    0.133_327_7,
    -0.053_850_908,
    0.020_997_18,
    -0.006_096_714,
];
/// Below this `|x|` tanh uses [`TANH_POLY`], above it `1 - 2/(e^{2|x|} + 1)`.
const TANH_SMALL: f32 = 0.625;

/// Horner evaluation of `c[0] + c[1] x + c[2] x² + ...`.
#[inline(always)]
fn poly<S: Simd, const N: usize>(s: S, x: S::V, c: &[f32; N]) -> S::V {
    let mut acc = s.splat(c[N - 1]);
    for &ci in c[..N - 1].iter().rev() {
        acc = s.mul_add(acc, x, s.splat(ci));
    }
    acc
}

/// `e^x`: 0 below about -104 (through gradual underflow), inf above 88.72, NaN stays NaN.
#[inline(always)]
pub(crate) fn exp<S: Simd>(s: S, x: S::V) -> S::V {
    // min/max return their second operand on NaN, so a NaN input survives the clamp.
    let x = s.max(s.splat(-104.0), s.min(s.splat(89.0), x));
    let n = s.round(s.mul(x, s.splat(std::f32::consts::LOG2_E)));
    let r = s.neg_mul_add(n, s.splat(LN2_HI), x);
    let r = s.neg_mul_add(n, s.splat(LN2_LO), r);
    s.ldexp(poly(s, r, &EXP_POLY), n)
}

/// `erfc(z)` for `z >= 0.5` given as `z = a · (pa / ERFC_P)` (so `p·z = pa·a` is formed with
/// one rounding) and `z² = hi + lo` exactly (`hi` the rounded square).
///
/// Two corrections keep this within about 2 ulp: the error of `t ≈ 1/(1 + p·z)` is measured
/// exactly (FMA residuals) and fed through the derivative polynomial, and splitting the square
/// keeps `e^{-z²}` accurate even where `z²` is large.
#[inline(always)]
fn erfc_big<S: Simd>(s: S, a: S::V, pa: f32, hi: S::V, lo: S::V) -> S::V {
    let one = s.splat(1.0);
    let pv = s.splat(pa);
    let d = s.mul_add(a, pv, one);
    // Rounding error of d (1 - d is exact while d <= 8, i.e. wherever the result is not 0).
    let dl = s.mul_add(a, pv, s.sub(one, d));
    // An estimate of 1/d (relative error ε < 2^-14) is enough: its residual is measured
    // exactly below, and the first-order correction leaves an error of order ε² < 2^-28.
    let t = s.recip_approx(d);
    let e = s.neg_mul_add(t, d, one);
    // The exact t* = 1/(1 + p·z) is t + tl to first order.
    let tl = s.mul(t, s.neg_mul_add(dl, t, e));
    let r = s.mul(t, poly(s, t, &ERFC_POLY));
    let r = s.mul_add(poly(s, t, &ERFC_DPOLY), tl, r);
    // e^{-(hi + lo)} = e^{-hi} (1 - lo) to within lo² (lo is below an ulp of hi).
    let ex = s.mul(exp(s, s.sub(s.zero(), hi)), r);
    s.neg_mul_add(ex, lo, ex)
}

/// `erf(x)`, within a few ulp of the f64 reference for every f32 input.
#[inline(always)]
pub(crate) fn erf<S: Simd>(s: S, x: S::V) -> S::V {
    let ax = s.min(s.splat(10.0), s.abs(x));
    // Near zero: erf(x) = x · (2/√π + u · P(u)), u = x², with no cancellation.
    let u = s.mul(x, x);
    let tail = s.mul_add(u, poly(s, u, &ERF_SMALL), s.splat(TWO_OVER_SQRT_PI_LO));
    let small = s.mul_add(x, s.splat(TWO_OVER_SQRT_PI_HI), s.mul(x, tail));
    // Elsewhere 1 - erfc(|x|), with erfc(|x|) < 0.48 so the subtraction loses little.
    let hi = s.mul(ax, ax);
    let lo = s.mul_add(ax, ax, s.sub(s.zero(), hi));
    let big = s.sub(s.splat(1.0), erfc_big(s, ax, ERFC_P, hi, lo));
    s.select(s.lt(ax, s.splat(ERF_SPLIT)), small, s.copysign(big, x))
}

/// Exact GELU, `x · Φ(x)` with `Φ(x) = erfc(-x/√2) / 2`, accurate in relative terms even in the
/// far negative tail (no `1 + erf` cancellation there).
#[inline(always)]
pub(crate) fn gelu<S: Simd>(s: S, x: S::V) -> S::V {
    // Beyond ±40, Φ is exactly 0 or 1 in f32; the clamp keeps x² finite.
    let xc = s.max(s.splat(-40.0), s.min(s.splat(40.0), x));
    let ax = s.abs(xc);
    let half = s.splat(0.5);
    // |x| < 0.5·√2: Φ = 1/2 + x · G(x²), Φ in [0.26, 0.74].
    let near = s.mul_add(xc, poly(s, s.mul(xc, xc), &PHI_SMALL), half);
    // Elsewhere from erfc(|x|/√2), with z² = x²/2 split exactly into hi + lo.
    let sq = s.mul(xc, xc);
    let sq_lo = s.mul_add(xc, xc, s.sub(s.zero(), sq));
    let pa = ERFC_P * std::f32::consts::FRAC_1_SQRT_2;
    let tail = s.mul(
        half,
        erfc_big(s, ax, pa, s.mul(half, sq), s.mul(half, sq_lo)),
    );
    let far = s.select(s.lt(xc, s.zero()), tail, s.sub(s.splat(1.0), tail));
    let split = ERF_SPLIT * std::f32::consts::SQRT_2;
    let phi = s.select(s.lt(ax, s.splat(split)), near, far);
    s.mul(x, phi)
}

/// GELU `x · (1 + erf(x/√2)) / 2` with `erf` from a rational fit: the absolute error of `erf`
/// is below 4e-7, so the result is within `2.5e-7 · |x|` of the exact GELU (about 40 times the
/// few-ulp [`gelu`]'s error, at a third of its work). For modes whose products already err far
/// more (int8), never for exact f32 math.
#[inline(always)]
pub(crate) fn gelu_rational<S: Simd>(s: S, x: S::V) -> S::V {
    let lim = s.splat(ERF_RATIONAL_MAX);
    let z = s.mul(x, s.splat(std::f32::consts::FRAC_1_SQRT_2));
    let z = s.max(s.sub(s.zero(), lim), s.min(lim, z));
    let u = s.mul(z, z);
    let p = poly(s, u, &ERF_RATIONAL_P);
    let q = s.mul_add(u, poly(s, u, &ERF_RATIONAL_Q), s.splat(1.0));
    let erf = s.div(s.mul(z, p), q);
    let half = s.mul(x, s.splat(0.5));
    s.mul_add(half, erf, half)
}

/// `tanh(x)`, within a few ulp; ±1 for large `|x|`, NaN stays NaN.
#[inline(always)]
pub(crate) fn tanh<S: Simd>(s: S, x: S::V) -> S::V {
    let ax = s.abs(x);
    let u = s.mul(x, x);
    let small = s.mul_add(s.mul(x, u), poly(s, u, &TANH_POLY), x);
    let one = s.splat(1.0);
    let e = exp(s, s.add(ax, ax));
    let big = s.sub(one, s.div(s.splat(2.0), s.add(e, one)));
    s.select(s.lt(ax, s.splat(TANH_SMALL)), small, s.copysign(big, x))
}
