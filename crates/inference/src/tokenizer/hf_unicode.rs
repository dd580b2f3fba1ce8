//! The Unicode version gap of HF's normalizers. HF `tokenizers` normalizes (NFC, NFD, NFKC)
//! with Unicode 9.0 tables, where every code point assigned later is a starter without a
//! decomposition; our `unicode-normalization` tables are newer. [`HF_INERT`] lists the code points
//! the newer tables would reorder or decompose but HF leaves alone, so the normalizers can treat
//! them as inert and match HF exactly. This module holds data only.
//!
//! How the table was made: HF's `NFKD` / `NFD` normalizers were probed on every code point
//! (`scripts/gen_bpe_reference.py --probe-unicode`: a code point is known to HF when NFKD changes
//! it, or when it reorders against U+0334 / U+0301), and the code points that
//! `unicode-normalization` gives a nonzero combining class or a decomposition but HF does not know
//! were collected into ranges.

/// Inclusive code point ranges HF's Unicode 9.0 normalization leaves untouched, sorted.
pub(crate) const HF_INERT: &[(u32, u32)] = &[
    (0x00558, 0x00558),
    (0x0058B, 0x0058C),
    (0x005C8, 0x005C9),
    (0x007FD, 0x007FD),
    (0x00897, 0x0089F),
    (0x008CA, 0x008D3),
    (0x009FE, 0x009FE),
    (0x00C3C, 0x00C3C),
    (0x00D3B, 0x00D3C),
    (0x00EBA, 0x00EBA),
    (0x01715, 0x01715),
    (0x01ABF, 0x01AF0),
    (0x01DF6, 0x01DFA),
    (0x0209D, 0x0209F),
    (0x032FF, 0x032FF),
    (0x0A7F1, 0x0A7F4),
    (0x0A82C, 0x0A82C),
    (0x0AB69, 0x0AB69),
    (0x105C9, 0x105C9),
    (0x105E4, 0x105E4),
    (0x10781, 0x10785),
    (0x10787, 0x107B0),
    (0x107B2, 0x107BF),
    (0x10D24, 0x10D27),
    (0x10D69, 0x10D6D),
    (0x10EAB, 0x10EAC),
    (0x10ECB, 0x10ECF),
    (0x10EF0, 0x10EFB),
    (0x10EFD, 0x10EFF),
    (0x10F46, 0x10F50),
    (0x10F82, 0x10F85),
    (0x11070, 0x11070),
    (0x1133B, 0x1133B),
    (0x11383, 0x11383),
    (0x11385, 0x11385),
    (0x1138E, 0x1138E),
    (0x11391, 0x11391),
    (0x113C5, 0x113C5),
    (0x113C7, 0x113C8),
    (0x113CE, 0x113D0),
    (0x1145E, 0x1145E),
    (0x11839, 0x1183A),
    (0x11938, 0x11938),
    (0x1193D, 0x1193E),
    (0x11943, 0x11943),
    (0x119E0, 0x119E0),
    (0x11A34, 0x11A34),
    (0x11A47, 0x11A47),
    (0x11A99, 0x11A99),
    (0x11D42, 0x11D42),
    (0x11D44, 0x11D45),
    (0x11D97, 0x11D97),
    (0x11F41, 0x11F42),
    (0x16121, 0x16128),
    (0x1612F, 0x1612F),
    (0x16D68, 0x16D6A),
    (0x16FF0, 0x16FF1),
    (0x1B123, 0x1B126),
    (0x1CCD6, 0x1CCF9),
    (0x1D127, 0x1D128),
    (0x1D250, 0x1D252),
    (0x1D25B, 0x1D25C),
    (0x1D25F, 0x1D25F),
    (0x1D280, 0x1D281),
    (0x1D6A6, 0x1D6A6),
    (0x1DF95, 0x1DF95),
    (0x1DFCD, 0x1DFFF),
    (0x1E030, 0x1E06D),
    (0x1E08F, 0x1E08F),
    (0x1E130, 0x1E136),
    (0x1E2AE, 0x1E2AE),
    (0x1E2EC, 0x1E2EF),
    (0x1E4EC, 0x1E4EF),
    (0x1E5EE, 0x1E5EF),
    (0x1E6E3, 0x1E6E3),
    (0x1E6E6, 0x1E6E6),
    (0x1E6EE, 0x1E6EF),
    (0x1E6F5, 0x1E6F5),
    (0x1F16C, 0x1F16C),
    (0x1FBF0, 0x1FBF9),
];

/// Whether HF's normalizers treat `c` as an inert starter (assigned after Unicode 9.0).
pub(crate) fn is_hf_inert(c: char) -> bool {
    let cp = c as u32;
    if cp < HF_INERT[0].0 {
        return false;
    }
    super::unicode::in_ranges(HF_INERT, cp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_probes() {
        assert!(HF_INERT.windows(2).all(|w| w[0].1 < w[1].0));
        assert!(is_hf_inert('\u{1DFA}'));
        assert!(!is_hf_inert('\u{0301}') && !is_hf_inert('a'));
    }
}
