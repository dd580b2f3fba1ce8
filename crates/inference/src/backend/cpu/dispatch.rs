//! The kernel table: one [`Kernels`] value per instruction set, holding function pointers, and
//! the selection of the best supported one, made once per process.
//!
//! Soundness rests on one rule: a table whose functions need an instruction set is only ever
//! handed out (by [`kernels`] or [`kernels_for`]) after [`Isa::is_supported`] confirmed it. The
//! tables are private to `backend::cpu`, and every `#[target_feature]` function is reachable
//! only through them. The safe methods of `Kernels` are the API; `mod.rs` forwards to the
//! selected table.

use std::sync::OnceLock;

use super::detect::Isa;
use super::gemm::{self, BLayout, Epilogue};
use super::microkernel;
use super::pack;
use super::packed::{self, PackedBf16, PackedWeights};
use super::portable::Portable;
use super::scalar;

/// Microkernel over a B panel of `P` values: `(kc, a, astep, arow, b, ldb, c, ldc, mr, nr,
/// accumulate)`, see `microkernel::tile`.
pub(super) type UkrOf<P> = unsafe fn(
    usize,
    *const f32,
    usize,
    usize,
    *const P,
    usize,
    *mut f32,
    usize,
    usize,
    usize,
    bool,
);
/// The f32 microkernel.
pub(super) type Ukr = UkrOf<f32>;
/// [`Ukr`] over a B panel of bf16 bits (widened as they load): `microkernel::tile` with `u16`.
pub(super) type UkrBf16 = UkrOf<u16>;
/// Unpacked dot-product GEMM: `(m, n, k, a, lda, b, ldb, c, ldc, accumulate)`, see
/// `microkernel::dot_gemm_bt`.
pub(super) type DotGemm =
    unsafe fn(usize, usize, usize, *const f32, usize, *const f32, usize, *mut f32, usize, bool);

/// Transposing pack: `(dst, src, ld, r0, rows, p0, kc, w)`, see `pack::pack_rows`.
pub(super) type PackRows = unsafe fn(&mut [f32], &[f32], usize, usize, usize, usize, usize, usize);

/// An instruction set's GEMM: microkernel, register tile and cache block sizes.
pub(super) struct GemmSpec {
    /// Rows of the register tile.
    pub(super) mr: usize,
    /// Columns of the register tile.
    pub(super) nr: usize,
    /// Depth of one packed slice (an A sliver of `mr×kc` stays in L1).
    pub(super) kc: usize,
    /// Rows of A packed at once; a multiple of `mr`.
    pub(super) mc: usize,
    /// Columns of B packed at once (the `kc×nc` block stays in L2); a multiple of `nr`.
    pub(super) nc: usize,
    /// Whether the microkernel reads A's rows where they lie (row stride `lda`) instead of
    /// from slivers packed per block: packing A costs a pass over it per column block and
    /// depth slice, which the encoders' short depths do not repay on every CPU.
    pub(super) a_in_place: bool,
    /// The register-blocked microkernel.
    pub(super) ukr: Ukr,
    /// The same over bf16 panels.
    pub(super) ukr_bf16: UkrBf16,
    /// The unpacked kernel for products with a tiny side.
    pub(super) dot: DotGemm,
    /// `pack::pack_rows` for this instruction set.
    pub(super) pack_rows: PackRows,
}

/// The CPU kernels of one instruction set. Obtain one with [`kernels`] (the best for this
/// CPU) or [`kernels_for`] (a specific one, e.g. to test it against the reference); the free
/// functions of `backend::cpu` forward to [`kernels`].
pub struct Kernels {
    pub(super) isa: Isa,
    pub(super) gemm: GemmSpec,
    pub(super) layer_norm: unsafe fn(&mut [f32], usize, &[f32], &[f32], f32),
    pub(super) gelu_erf: unsafe fn(&mut [f32]),
    pub(super) gelu_rational: unsafe fn(&mut [f32]),
    pub(super) dequant_i32: unsafe fn(&mut [&mut [f32]], &[i32], usize, &super::Dequant<'_>),
    pub(super) erf: unsafe fn(&mut [f32]),
    pub(super) exp: unsafe fn(&mut [f32]),
    pub(super) tanh: unsafe fn(&mut [f32]),
    pub(super) softmax: unsafe fn(&mut [f32]),
    pub(super) add_bias: unsafe fn(&mut [f32], &[f32]),
    pub(super) add_assign: unsafe fn(&mut [f32], &[f32]),
    pub(super) add_product: unsafe fn(&mut [f32], &[f32], &[f32]),
    pub(super) silu: unsafe fn(&mut [f32]),
    pub(super) silu_mul: unsafe fn(&mut [f32], &[f32]),
    pub(super) axpy: unsafe fn(&mut [f32], f32, &[f32]),
    pub(super) axpy_bf16: unsafe fn(&mut [f32], f32, &[u16]),
    pub(super) dot_bf16: unsafe fn(&[u16], &[f32]) -> f32,
    pub(super) scale: unsafe fn(&mut [f32], f32),
    pub(super) dot: unsafe fn(&[f32], &[f32]) -> f32,
    pub(super) l2_normalize: unsafe fn(&mut [f32]),
    pub(super) cosine: unsafe fn(&[f32], &[f32]) -> f32,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").field("isa", &self.isa).finish()
    }
}

// SAFETY (every `unsafe` call in this impl): a `&Kernels` only exists through `kernels` or
// `kernels_for`, which check that the CPU supports the table's instruction set; the slice
// arguments are passed on as slices, so bounds stay checked inside the kernels.
impl Kernels {
    /// The instruction set these kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// See [`super::gemm_bt`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bt(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        let epi = Epilogue::default();
        gemm::gemm(
            self,
            BLayout::Trans,
            m,
            n,
            k,
            a,
            lda,
            b,
            ldb,
            c,
            ldc,
            accumulate,
            epi,
        );
    }

    /// See [`super::gemm_bt_bias`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bt_bias(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        bias: Option<&[f32]>,
        gelu: bool,
    ) {
        let epi = Epilogue { bias, gelu };
        gemm::gemm(
            self,
            BLayout::Trans,
            m,
            n,
            k,
            a,
            lda,
            b,
            ldb,
            c,
            ldc,
            accumulate,
            epi,
        );
    }

    /// See [`super::pack_weights`].
    pub fn pack_weights(&self, n: usize, k: usize, w: &[f32], ldw: usize) -> PackedWeights {
        packed::pack(self, n, k, w, ldw)
    }

    /// See [`super::pack_weights_bf16`].
    pub fn pack_weights_bf16(
        &self,
        n: usize,
        k: usize,
        src: packed::Bf16Rows<'_>,
    ) -> Option<PackedBf16> {
        packed::pack_bf16(self, n, k, src)
    }

    /// See [`super::gemm_bt_packed`]. Panics if `w` was packed by another kernel table.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bt_packed(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        w: &PackedWeights,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        bias: Option<&[f32]>,
        gelu: bool,
    ) {
        assert_eq!(
            w.isa(),
            self.isa,
            "gemm_bt_packed: weights packed for another isa"
        );
        let (data, n_pad) = w.panels();
        let (n, k) = (w.n(), w.k());
        let epi = Epilogue { bias, gelu };
        gemm::gemm(
            self,
            BLayout::Packed,
            m,
            n,
            k,
            a,
            lda,
            data,
            n_pad,
            c,
            ldc,
            accumulate,
            epi,
        );
    }

    /// See [`super::gemm_bt_packed_bf16`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bt_packed_bf16(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        w: &PackedBf16,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        bias: Option<&[f32]>,
        gelu: bool,
    ) {
        assert_eq!(
            w.isa(),
            self.isa,
            "gemm_bt_packed_bf16: weights packed for another isa"
        );
        let (data, n_pad) = w.panels();
        let epi = Epilogue { bias, gelu };
        gemm::gemm_packed_bf16(
            self,
            m,
            w.n(),
            w.k(),
            a,
            lda,
            data,
            n_pad,
            c,
            ldc,
            accumulate,
            epi,
        );
    }

    /// See [`super::gemm_nn`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_nn(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        let epi = Epilogue::default();
        gemm::gemm(
            self,
            BLayout::NoTrans,
            m,
            n,
            k,
            a,
            lda,
            b,
            ldb,
            c,
            ldc,
            accumulate,
            epi,
        );
    }

    /// See [`super::layer_norm`].
    pub fn layer_norm(&self, x: &mut [f32], dim: usize, gamma: &[f32], beta: &[f32], eps: f32) {
        assert!(
            dim > 0 && x.len().is_multiple_of(dim),
            "layer_norm: len not a multiple of dim"
        );
        assert!(
            gamma.len() == dim && beta.len() == dim,
            "layer_norm: gamma/beta != dim"
        );
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.layer_norm)(x, dim, gamma, beta, eps) }
    }

    /// See [`super::gelu_erf`].
    pub fn gelu_erf(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.gelu_erf)(x) }
    }

    /// See [`super::gelu_rational`].
    pub fn gelu_rational(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.gelu_rational)(x) }
    }

    /// See [`super::dequant_i32`].
    pub fn dequant_i32(
        &self,
        y: &mut [&mut [f32]],
        sums: &[i32],
        lds: usize,
        deq: &super::Dequant<'_>,
    ) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.dequant_i32)(y, sums, lds, deq) }
    }

    /// See [`super::erf`].
    pub fn erf(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.erf)(x) }
    }

    /// See [`super::exp`].
    pub fn exp(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.exp)(x) }
    }

    /// See [`super::tanh`].
    pub fn tanh(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.tanh)(x) }
    }

    /// See [`super::softmax`].
    pub fn softmax(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.softmax)(x) }
    }

    /// See [`super::add_bias`].
    pub fn add_bias(&self, x: &mut [f32], bias: &[f32]) {
        assert!(
            !bias.is_empty() && x.len().is_multiple_of(bias.len()),
            "add_bias: len not a multiple of bias"
        );
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.add_bias)(x, bias) }
    }

    /// See [`super::add_assign`].
    pub fn add_assign(&self, x: &mut [f32], y: &[f32]) {
        assert_eq!(x.len(), y.len(), "add_assign: length mismatch");
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.add_assign)(x, y) }
    }

    /// See [`super::add_product`].
    pub fn add_product(&self, x: &mut [f32], a: &[f32], b: &[f32]) {
        assert!(
            a.len() == x.len() && b.len() == x.len(),
            "add_product: length mismatch"
        );
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.add_product)(x, a, b) }
    }

    /// See [`super::silu`].
    pub fn silu(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.silu)(x) }
    }

    /// See [`super::silu_mul`].
    pub fn silu_mul(&self, g: &mut [f32], u: &[f32]) {
        assert_eq!(g.len(), u.len(), "silu_mul: length mismatch");
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.silu_mul)(g, u) }
    }

    /// See [`super::scale`].
    pub fn scale(&self, x: &mut [f32], s: f32) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.scale)(x, s) }
    }

    /// See [`super::axpy`].
    pub fn axpy(&self, x: &mut [f32], c: f32, y: &[f32]) {
        assert_eq!(x.len(), y.len(), "axpy: length mismatch");
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.axpy)(x, c, y) }
    }

    /// See [`super::axpy_bf16`].
    pub fn axpy_bf16(&self, x: &mut [f32], c: f32, b: &[u16]) {
        assert_eq!(x.len(), b.len(), "axpy_bf16: length mismatch");
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.axpy_bf16)(x, c, b) }
    }

    /// See [`super::dot_bf16`].
    pub fn dot_bf16(&self, a: &[u16], x: &[f32]) -> f32 {
        assert_eq!(a.len(), x.len(), "dot_bf16: length mismatch");
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.dot_bf16)(a, x) }
    }

    /// See [`super::dot`].
    pub fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot: length mismatch");
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.dot)(a, b) }
    }

    /// See [`super::sum_squares`].
    pub fn sum_squares(&self, a: &[f32]) -> f32 {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.dot)(a, a) }
    }

    /// See [`super::l2_normalize`].
    pub fn l2_normalize(&self, x: &mut [f32]) {
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.l2_normalize)(x) }
    }

    /// See [`super::cosine`].
    pub fn cosine(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "cosine: length mismatch");
        // SAFETY: see the note on this impl (detected ISA; slices stay bounds-checked).
        unsafe { (self.cosine)(a, b) }
    }
}

/// GEMM microkernel of the portable table: 4×16 tiles of the compiler-vectorized [`Portable`].
///
/// # Safety
/// The pointer contract of `microkernel::tile` with `M = mr <= 4`, `NV = 2`.
#[allow(clippy::too_many_arguments)]
unsafe fn portable_ukr<B: microkernel::PanelValue>(
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
    let s = Portable;
    let a = (a, astep, arow);
    // SAFETY: forwarded caller contract; `mr <= 4` selects a tile that reads at most MR rows.
    unsafe {
        let tile = match mr {
            1 => microkernel::tile::<_, B, 1, 2>,
            2 => microkernel::tile::<_, B, 2, 2>,
            3 => microkernel::tile::<_, B, 3, 2>,
            _ => microkernel::tile::<_, B, 4, 2>,
        };
        tile(s, kc, a, b, ldb, c, ldc, nr, accumulate)
    }
}

/// Unpacked dot-product GEMM of the portable table.
///
/// # Safety
/// The pointer contract of `microkernel::dot_gemm_bt`.
#[allow(clippy::too_many_arguments)]
unsafe fn portable_dot(
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
    // SAFETY: forwarded caller contract.
    unsafe { microkernel::dot_gemm_bt(Portable, m, n, k, a, lda, b, ldb, c, ldc, accumulate) }
}

/// Transposing pack of the portable table.
#[allow(clippy::too_many_arguments)]
fn portable_pack_rows(
    dst: &mut [f32],
    src: &[f32],
    ld: usize,
    r0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
    w: usize,
) {
    pack::pack_rows(Portable, dst, src, ld, r0, rows, p0, kc, w)
}

/// The portable table: the `scalar` reference kernels, and the blocked GEMM driver over
/// `Portable` (plain Rust the compiler vectorizes for the baseline target).
static SCALAR: Kernels = Kernels {
    isa: Isa::Scalar,
    gemm: GemmSpec {
        mr: 4,
        nr: 16,
        kc: 256,
        mc: 64,
        nc: 1024,
        a_in_place: false,
        ukr: portable_ukr::<f32>,
        ukr_bf16: portable_ukr::<u16>,
        dot: portable_dot,
        pack_rows: portable_pack_rows,
    },
    layer_norm: scalar::layer_norm,
    gelu_erf: scalar::gelu_erf,
    // (The reference computes GELU exactly, which is within any bound of the rational form.)
    gelu_rational: scalar::gelu_erf,
    dequant_i32: scalar::dequant_i32,
    erf: scalar::erf,
    exp: scalar::exp,
    tanh: scalar::tanh,
    softmax: scalar::softmax,
    add_bias: scalar::add_bias,
    add_assign: scalar::add_assign,
    add_product: scalar::add_product,
    silu: scalar::silu,
    silu_mul: scalar::silu_mul,
    axpy: scalar::axpy,
    axpy_bf16: scalar::axpy_bf16,
    dot_bf16: scalar::dot_bf16,
    scale: scalar::scale,
    dot: scalar::dot,
    l2_normalize: scalar::l2_normalize,
    cosine: scalar::cosine,
};

/// The table of `isa` if this CPU supports it, `None` otherwise.
pub fn kernels_for(isa: Isa) -> Option<&'static Kernels> {
    if !isa.is_supported() {
        return None;
    }
    match isa {
        Isa::Scalar => Some(&SCALAR),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(&super::x86::avx2::KERNELS),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(&super::x86::avx512::KERNELS),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The table of the best instruction set this CPU supports, chosen on first use.
pub fn kernels() -> &'static Kernels {
    static SELECTED: OnceLock<&'static Kernels> = OnceLock::new();
    SELECTED.get_or_init(|| kernels_for(Isa::best()).unwrap_or(&SCALAR))
}
