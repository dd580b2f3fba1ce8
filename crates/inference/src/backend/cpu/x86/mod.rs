//! x86-64 instruction sets: the AVX-512F and AVX2+FMA tokens (`Simd` implementations over
//! `core::arch` intrinsics) and the macro that instantiates every generic kernel for a token
//! inside `#[target_feature]` entry points and collects them into that set's `KERNELS` table.
//!
//! Only `dispatch::kernels_for` hands these tables out, after runtime detection.

pub(super) mod amx;
pub(super) mod avx2;
// AVX-512 intrinsics and `target_feature(enable = "avx512f")` are stable since Rust 1.89, the
// workspace's `rust-version`.
pub(super) mod avx512;
pub(super) mod gemm_bf16;
pub(super) mod qdot_avx2;
pub(super) mod qdot_avx512;
pub(super) mod ternary;

/// Defines the `#[target_feature]` entry points of one instruction set and its `KERNELS`
/// table. `$tok` is the token type (with an `unsafe fn new_unchecked()`), `$feat` the
/// features to enable, `$mr`/`$nv` the microkernel tile (`$mr` rows, `$nv` vectors wide) and
/// `$rows` the list `1 ..= $mr`.
macro_rules! kernel_table {
    (
        isa: $isa:expr,
        token: $tok:ty,
        features: $feat:literal,
        tile: ($mr:literal, $nv:literal),
        rows: [$($m:literal)+],
        blocks: (kc: $kc:expr, mc: $mc:expr, nc: $nc:expr),
        a_in_place: $a_in_place:expr $(,)?
    ) => {
        use $crate::backend::cpu::dispatch::{GemmSpec, Kernels};
        use $crate::backend::cpu::{microkernel, pack, vector};

        /// The token of this instruction set.
        ///
        /// # Safety
        /// Only called from the entry points below, which are reachable only through
        /// `KERNELS`, which `dispatch` hands out only after detecting the features.
        #[inline(always)]
        unsafe fn token() -> $tok {
            // SAFETY: see the function's contract.
            unsafe { <$tok>::new_unchecked() }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn gemm_ukr<B: microkernel::PanelValue>(
            kc: usize,
            a: *const f32,
            astep: usize,
            arow: usize,
            b: *const B,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
            mr: usize,
            nr: usize,
            accumulate: bool,
        ) {
            // SAFETY: the caller (the gemm driver) upholds `microkernel::tile`'s pointer
            // contract with M = mr <= $mr; each arm reads `mr` rows of A per step.
            unsafe {
                let s = token();
                match mr {
                    $( $m => microkernel::tile::<$tok, B, $m, $nv>(
                        s, kc, (a, astep, arow), b, ldb, c, ldc, nr, accumulate,
                    ), )+
                    _ => unreachable!("tile rows above MR"),
                }
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn gemm_dot(
            m: usize,
            n: usize,
            k: usize,
            a: *const f32,
            lda: usize,
            b: *const f32,
            ldb: usize,
            c: *mut f32,
            ldc: usize,
            accumulate: bool,
        ) {
            // SAFETY: the caller upholds `microkernel::dot_gemm_bt`'s pointer contract.
            unsafe {
                microkernel::dot_gemm_bt(token(), m, n, k, a, lda, b, ldb, c, ldc, accumulate)
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn pack_rows(
            dst: &mut [f32],
            src: &[f32],
            ld: usize,
            r0: usize,
            rows: usize,
            p0: usize,
            kc: usize,
            w: usize,
        ) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            pack::pack_rows(unsafe { token() }, dst, src, ld, r0, rows, p0, kc, w)
        }

        #[target_feature(enable = $feat)]
        unsafe fn layer_norm(x: &mut [f32], dim: usize, g: &[f32], b: &[f32], eps: f32) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::layer_norm(unsafe { token() }, x, dim, g, b, eps)
        }

        #[target_feature(enable = $feat)]
        unsafe fn gelu_erf(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::gelu_erf(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn gelu_rational(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::gelu_rational(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn dequant_i32(
            y: &mut [&mut [f32]],
            sums: &[i32],
            lds: usize,
            deq: &$crate::backend::cpu::Dequant<'_>,
        ) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::dequant_i32(unsafe { token() }, y, sums, lds, deq)
        }

        #[target_feature(enable = $feat)]
        unsafe fn erf(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::erf(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn exp(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::exp(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn tanh(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::tanh(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn softmax(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::softmax(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn add_bias(x: &mut [f32], bias: &[f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::add_bias(unsafe { token() }, x, bias)
        }

        #[target_feature(enable = $feat)]
        unsafe fn add_assign(x: &mut [f32], y: &[f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::add_assign(unsafe { token() }, x, y)
        }

        #[target_feature(enable = $feat)]
        unsafe fn silu(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::silu(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::silu_mul(unsafe { token() }, g, u)
        }

        #[target_feature(enable = $feat)]
        unsafe fn add_product(x: &mut [f32], a: &[f32], b: &[f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::add_product(unsafe { token() }, x, a, b)
        }

        #[target_feature(enable = $feat)]
        unsafe fn axpy(x: &mut [f32], c: f32, y: &[f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::axpy(unsafe { token() }, x, c, y)
        }

        #[target_feature(enable = $feat)]
        unsafe fn axpy_bf16(x: &mut [f32], c: f32, b: &[u16]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::axpy_bf16(unsafe { token() }, x, c, b)
        }

        #[target_feature(enable = $feat)]
        unsafe fn dot_bf16(a: &[u16], x: &[f32]) -> f32 {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::dot_bf16(unsafe { token() }, a, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn scale(x: &mut [f32], c: f32) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::scale(unsafe { token() }, x, c)
        }

        #[target_feature(enable = $feat)]
        unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::dot(unsafe { token() }, a, b)
        }

        #[target_feature(enable = $feat)]
        unsafe fn l2_normalize(x: &mut [f32]) {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::l2_normalize(unsafe { token() }, x)
        }

        #[target_feature(enable = $feat)]
        unsafe fn cosine(a: &[f32], b: &[f32]) -> f32 {
            // SAFETY: reached only through `KERNELS` (see `token`).
            vector::cosine(unsafe { token() }, a, b)
        }

        /// This instruction set's kernel table (handed out only after detection).
        pub(in $crate::backend::cpu) static KERNELS: Kernels = Kernels {
            isa: $isa,
            gemm: GemmSpec {
                mr: $mr,
                nr: $nv * <$tok as $crate::backend::cpu::simd::Simd>::LANES,
                kc: $kc,
                mc: $mc,
                nc: $nc,
                a_in_place: $a_in_place,
                ukr: gemm_ukr::<f32>,
                ukr_bf16: gemm_ukr::<u16>,
                dot: gemm_dot,
                pack_rows,
            },
            layer_norm,
            gelu_erf,
            gelu_rational,
            dequant_i32,
            erf,
            exp,
            tanh,
            softmax,
            add_bias,
            add_assign,
            add_product,
            silu,
            silu_mul,
            axpy,
            axpy_bf16,
            dot_bf16,
            scale,
            dot,
            l2_normalize,
            cosine,
        };
    };
}
pub(super) use kernel_table;
