//! Weight matrices packed once, at load time, into the panel layout of the blocked GEMM.
//!
//! `gemm_bt` has to transpose its `B` (an `nn.Linear` weight, `[n×k]`) into `NR`-wide panels on
//! every call; for a batch of a few dozen tokens that transpose costs as much as the product
//! itself. [`PackedWeights`] does it once: `gemm_bt_packed` then streams the panels directly.
//! The layout belongs to the instruction set that packed it (its `NR` and `KC`), so a packed
//! matrix can only be used with the same kernel table. This module owns the layout; the
//! product itself is `gemm.rs`.

use super::bf16::{bf16_to_f32, exact_bf16};
use super::detect::Isa;
use super::dispatch::Kernels;

/// A weight matrix `w[n×k]` (the `nn.Linear` layout) packed for [`Kernels::gemm_bt_packed`]:
/// f32 ([`PackedWeights`]) or bf16 bits ([`PackedBf16`]).
///
/// Layout: for each `kc`-deep slice of the depth (starting at `p0`), `n_pad / NR` panels of
/// `kc × NR` values (row `p` of a panel holds `w[j][p0 + p]` for its `NR` columns `j`), the
/// slice starting at value `p0 · n_pad`; columns past `n` are zero. It holds about as many
/// values as the original.
#[derive(Clone)]
pub struct Packed<T> {
    isa: Isa,
    n: usize,
    k: usize,
    /// `n` rounded up to the table's `NR`.
    n_pad: usize,
    /// Offset of the first value in `buf`, chosen for 64-byte alignment.
    offset: usize,
    /// `[k][n_pad]` in the panel layout above, after `offset` values of padding.
    buf: Vec<T>,
}

/// f32 weights packed for [`Kernels::gemm_bt_packed`].
pub type PackedWeights = Packed<f32>;

/// [`PackedWeights`] whose values are all exactly bf16 (a bf16 checkpoint), kept as bf16 bits in
/// the same panel layout: [`Kernels::gemm_bt_packed_bf16`] widens them as the microkernel loads
/// them, so its results are bit-identical to `gemm_bt_packed` over the f32 matrix, at half the
/// bytes.
pub type PackedBf16 = Packed<u16>;

impl<T> std::fmt::Debug for Packed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("isa", &self.isa)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("bytes_per_value", &std::mem::size_of::<T>())
            .finish()
    }
}

impl<T> Packed<T> {
    /// Output features (rows of the original matrix).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features (columns of the original matrix).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The instruction set whose kernels packed (and alone can use) this matrix.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The packed values and the padded width (`ldb` for the driver).
    pub(crate) fn panels(&self) -> (&[T], usize) {
        (&self.buf[self.offset..], self.n_pad)
    }
}

/// Rows of the original matrix [`pack_bf16`] packs through its f32 scratch at a time.
const BF16_PACK_ROWS: usize = 256;

/// A matrix [`pack_bf16`] packs into 16 bits, `[n×k]` with rows `ldw` apart.
#[derive(Clone, Copy)]
pub enum Bf16Rows<'a> {
    /// f32 values; packed only when every one is exactly a bf16 value.
    F32(&'a [f32], usize),
    /// bf16 bits, as a bf16 checkpoint stores them (always exact).
    Bits(&'a [u16], usize),
}

/// `src` packed for `kt` in 16 bits, or `None` when some f32 value is not exactly a bf16
/// value: the same panels as [`PackedBf16::from_packed`] over [`pack`]'s, packed through a
/// small f32 scratch (a `kc`-deep slice of 256 rows at a time) instead of a whole f32 copy of
/// the matrix. Panics if the source is too short.
pub(crate) fn pack_bf16(kt: &Kernels, n: usize, k: usize, src: Bf16Rows<'_>) -> Option<PackedBf16> {
    let spec = &kt.gemm;
    if n > 0 && k > 0 {
        let (len, ldw) = match src {
            Bf16Rows::F32(w, ldw) => (w.len(), ldw),
            Bf16Rows::Bits(b, ldw) => (b.len(), ldw),
        };
        assert!(len >= (n - 1) * ldw + k, "pack_bf16: source too short");
        if let Bf16Rows::F32(w, ldw) = src {
            let exact = |row: &[f32]| row.iter().all(|&v| exact_bf16(v).is_some());
            if !(0..n).all(|r| exact(&w[r * ldw..r * ldw + k])) {
                return None;
            }
        }
    }
    let nr = spec.nr;
    let n_pad = n.next_multiple_of(nr);
    let mut buf = vec![0u16; n_pad * k];
    let block = BF16_PACK_ROWS.next_multiple_of(nr);
    let mut scratch = vec![0.0f32; spec.kc.min(k) * block];
    // Bits are widened a block of rows at a time (a `kc`-deep slice of them) for the packer.
    let mut wide = match src {
        Bf16Rows::Bits(..) => vec![0.0f32; spec.kc.min(k) * block.min(n)],
        Bf16Rows::F32(..) => Vec::new(),
    };
    for p0 in (0..k).step_by(spec.kc) {
        let kc = spec.kc.min(k - p0);
        for r0 in (0..n).step_by(block) {
            let rows = block.min(n - r0);
            let len = rows.div_ceil(nr) * kc * nr;
            let part = &mut scratch[..len];
            let (w, ldw, r, p) = match src {
                Bf16Rows::F32(w, ldw) => (w, ldw, r0, p0),
                Bf16Rows::Bits(bits, ldw) => {
                    for (i, dst) in wide.chunks_exact_mut(kc).take(rows).enumerate() {
                        let at = (r0 + i) * ldw + p0;
                        for (d, &b) in dst.iter_mut().zip(&bits[at..at + kc]) {
                            *d = bf16_to_f32(b);
                        }
                    }
                    (&wide[..rows * kc], kc, 0, 0)
                }
            };
            // SAFETY: `kt` was handed out only after its instruction set was detected; the
            // slices are bounds-checked inside the packing kernel.
            unsafe { (spec.pack_rows)(part, w, ldw, r, rows, p, kc, nr) };
            let at = p0 * n_pad + r0 / nr * kc * nr;
            for (d, v) in buf[at..at + len].iter_mut().zip(part.iter()) {
                *d = (v.to_bits() >> 16) as u16; // exact: checked above, or bits
            }
        }
    }
    Some(PackedBf16 {
        isa: kt.isa,
        n,
        k,
        n_pad,
        offset: 0,
        buf,
    })
}

impl PackedBf16 {
    /// `w` in 16 bits, or `None` when some value is not exactly a bf16 value.
    pub fn from_packed(w: &PackedWeights) -> Option<Self> {
        let (panels, n_pad) = w.panels();
        let vals = &panels[..w.k * n_pad];
        let buf = vals
            .iter()
            .map(|&v| exact_bf16(v))
            .collect::<Option<Vec<u16>>>()?;
        Some(Self {
            isa: w.isa,
            n: w.n,
            k: w.k,
            n_pad,
            offset: 0,
            buf,
        })
    }
}

/// Packs `w[n×k]` (rows `ldw` apart) for `kt`. Panics if `w` is too short.
pub(crate) fn pack(kt: &Kernels, n: usize, k: usize, w: &[f32], ldw: usize) -> PackedWeights {
    let spec = &kt.gemm;
    if n > 0 && k > 0 {
        assert!(w.len() >= (n - 1) * ldw + k, "pack_weights: w too short");
    }
    let n_pad = n.next_multiple_of(spec.nr);
    let len = n_pad * k;
    let mut buf = vec![0.0f32; len + 16];
    let misalign = (buf.as_ptr() as usize / std::mem::size_of::<f32>()) % 16;
    let offset = (16 - misalign) % 16;
    if n > 0 {
        let data = &mut buf[offset..offset + len];
        for p0 in (0..k).step_by(spec.kc) {
            let kc = spec.kc.min(k - p0);
            let slice = &mut data[p0 * n_pad..p0 * n_pad + kc * n_pad];
            // SAFETY: `kt` was handed out only after its instruction set was detected; the
            // slices are bounds-checked inside the packing kernel.
            unsafe { (spec.pack_rows)(slice, w, ldw, 0, n, p0, kc, spec.nr) };
        }
    }
    PackedWeights {
        isa: kt.isa,
        n,
        k,
        n_pad,
        offset,
        buf,
    }
}

#[cfg(test)]
mod tests {
    use super::super::dispatch::kernels;

    #[test]
    fn packed_product_matches_plain_product() {
        let kt = kernels();
        let (m, n, k) = (5, 37, 300);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let packed = kt.pack_weights(n, k, &w, k);
        assert_eq!((packed.n(), packed.k(), packed.isa()), (n, k, kt.isa()));
        let mut want = vec![0.0; m * n];
        kt.gemm_bt(m, n, k, &a, k, &w, k, &mut want, n, false);
        let mut got = vec![0.0; m * n];
        kt.gemm_bt_packed(m, &a, k, &packed, &mut got, n, false, None, false);
        assert_eq!(got, want);
    }

    #[test]
    fn bf16_packing_equals_the_f32_panels_in_16_bits() {
        use super::{pack, pack_bf16, Bf16Rows, PackedBf16};
        let kt = kernels();
        let bf16 =
            |i: usize| f32::from_bits(((i as f32 * 0.37).sin() * 3.0).to_bits() & 0xffff_0000);
        // Awkward shapes: widths past the register tile and the block of rows, depths past
        // kc, rows further apart than they are long.
        for (n, k, ldw) in [
            (1, 1, 1),
            (37, 300, 300),
            (300, 513, 520),
            (529, 77, 80),
            (0, 5, 5),
        ] {
            let mut w: Vec<f32> = (0..n.max(1) * ldw).map(bf16).collect();
            let want = PackedBf16::from_packed(&pack(kt, n, k, &w, ldw)).expect("exact");
            let got = pack_bf16(kt, n, k, Bf16Rows::F32(&w, ldw)).expect("exact");
            assert_eq!((got.n, got.k, got.n_pad), (want.n, want.k, want.n_pad));
            assert_eq!(got.panels().0, want.panels().0, "n {n} k {k}");
            // The same matrix as stored bits packs to the same panels.
            let bits: Vec<u16> = w.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            let from_bits = pack_bf16(kt, n, k, Bf16Rows::Bits(&bits, ldw)).expect("bits");
            assert_eq!(from_bits.panels().0, want.panels().0, "bits, n {n} k {k}");
            if n > 0 {
                // A value past the row's end does not count; one inside that is not bf16 does.
                if ldw > k {
                    w[k] = 0.1;
                    assert!(pack_bf16(kt, n, k, Bf16Rows::F32(&w, ldw)).is_some());
                }
                w[(n - 1) * ldw + k - 1] = 0.1;
                assert!(pack_bf16(kt, n, k, Bf16Rows::F32(&w, ldw)).is_none());
            }
        }
    }
}
