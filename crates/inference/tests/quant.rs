//! GGUF quantized formats (`lattice_inference::quant`) and the CPU quantized matrix
//! (`backend::cpu::QuantMatrix`):
//! - `dequantize_row` bit-exact against the `gguf` Python package on real rows of the two GGUF
//!   models and synthetic rows (fixture from `scripts/gen_quant_reference.py`), also through
//!   `QuantMatrix` (repack + unrepack); `quantize_row` byte-exact for Q4_0 / Q8_0;
//! - every instruction set's `matmul` bit-identical to the portable kernels (which share the
//!   integer block sums and the float operation order), and within float rounding of the scalar
//!   ggml-style reference, on awkward sizes;
//! - `matmul` against `dequantize()` and an f64 dot: the error stays within the bound of Q8
//!   activation quantization (see `activation_bound`);
//! - shape errors.

use std::io::Read;

use lattice_inference::backend::cpu::{Isa, QuantMatrix};
use lattice_inference::quant::act::{quantize_act, ActFormat};
use lattice_inference::quant::{dequantize_row, quantize_row, reference, QuantType};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/quant/reference.bin.gz"
);

struct Record {
    kind: u32,
    t: QuantType,
    rows: usize,
    k: usize,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

fn records() -> Vec<Record> {
    let f = std::fs::File::open(FIXTURE).expect("fixture (run scripts/gen_quant_reference.py)");
    let mut buf = Vec::new();
    flate2::read::GzDecoder::new(f)
        .read_to_end(&mut buf)
        .unwrap();
    let mut out = Vec::new();
    let mut p = 0;
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    while p < buf.len() {
        let (kind, gt, rows, k, nb) = (
            u32_at(&buf, p),
            u32_at(&buf, p + 4),
            u32_at(&buf, p + 8) as usize,
            u32_at(&buf, p + 12) as usize,
            u32_at(&buf, p + 16) as usize,
        );
        p += 20;
        let nv = rows * k * 4;
        let (bytes, vals) = if kind == 0 {
            (&buf[p..p + nb], &buf[p + nb..p + nb + nv])
        } else {
            (&buf[p + nv..p + nv + nb], &buf[p..p + nv])
        };
        p += nb + nv;
        out.push(Record {
            kind,
            t: QuantType::from_ggml(gt).expect("known type"),
            rows,
            k,
            bytes: bytes.to_vec(),
            values: vals
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        });
    }
    out
}

#[test]
fn dequantize_matches_gguf_python_bit_exact() {
    let recs = records();
    let mut seen = std::collections::HashSet::new();
    for r in recs.iter().filter(|r| r.kind == 0) {
        seen.insert(r.t);
        let rb = r.t.row_bytes(r.k).unwrap();
        assert_eq!(r.bytes.len(), rb * r.rows, "{:?}", r.t);
        for i in 0..r.rows {
            let mut y = vec![0f32; r.k];
            dequantize_row(r.t, &r.bytes[i * rb..(i + 1) * rb], &mut y).unwrap();
            let want = &r.values[i * r.k..(i + 1) * r.k];
            for (j, (a, b)) in y.iter().zip(want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{:?} row {i} value {j}: {a} vs {b}",
                    r.t
                );
            }
        }
        // The same through QuantMatrix (repacked for the kernels, then unpacked per row).
        let qm = QuantMatrix::new(r.t, r.rows, r.k, &r.bytes).unwrap();
        let all = qm.dequantize();
        assert!(
            all.iter()
                .zip(&r.values)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{:?}: QuantMatrix::dequantize differs",
            r.t
        );
    }
    for t in QuantType::ALL {
        assert!(seen.contains(&t), "no dequantization fixture for {t:?}");
    }
}

#[test]
fn quantize_row_matches_gguf_python() {
    let mut n = 0;
    for r in records().into_iter().filter(|r| r.kind == 1) {
        let mut out = vec![0u8; r.bytes.len()];
        quantize_row(r.t, &r.values, &mut out).unwrap();
        assert_eq!(out, r.bytes, "{:?}", r.t);
        n += 1;
    }
    assert_eq!(n, 2);
    let mut short = vec![0u8; 10];
    assert!(quantize_row(QuantType::Q8_0, &[0.0; 32], &mut short).is_err());
    assert!(quantize_row(QuantType::Q6_K, &[0.0; 256], &mut vec![0u8; 210]).is_err());
}

/// Deterministic pseudo-random generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn f16_le(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Random raw GGUF rows of `t`: random code bytes, finite f16 scales of both signs.
fn random_weights(t: QuantType, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w: Vec<u8> = (0..n * t.row_bytes(k).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    let scales: &[usize] = match t {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => &[0],
        QuantType::Q4_1 | QuantType::Q4_K => &[0, 2],
        QuantType::Q6_K => &[208],
        _ => &[],
    };
    for blk in w.chunks_exact_mut(t.block_bytes()) {
        for &o in scales {
            let v = rng.f32() * 0.02;
            blk[o..o + 2].copy_from_slice(&f16_le(v));
        }
    }
    w
}

fn random_acts(m: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..m * k).map(|_| rng.f32() * 3.0).collect();
    // A zero block and an outlier, as real activations have.
    for v in x.iter_mut().take(32.min(k)) {
        *v = 0.0;
    }
    if m * k > 40 {
        x[m * k - 7] = 40.0;
    }
    x
}

/// Asserts `got` (`m × n`, from `qm` made of raw rows `w`) is within f32 rounding of the scalar
/// reference: `|got − ref| ≤ 1e-5 · Σ_e |w_e · x̂_e|` per output, `x̂` the Q8-quantized
/// activations (the scale of the terms, not of the result: Q4_K subtracts a large min term).
fn assert_close_to_reference(
    t: QuantType,
    qm: &QuantMatrix,
    w: &[u8],
    x: &[f32],
    m: usize,
    got: &[f32],
    what: &str,
) {
    let (n, k) = (qm.n_rows(), qm.k());
    let want = reference::matmul(t, w, n, k, x, m);
    let wd = qm.dequantize();
    let f = ActFormat::for_weights(t).unwrap();
    let bl = f.block_len();
    for i in 0..m {
        let a = quantize_act(f, &x[i * k..(i + 1) * k]);
        for j in 0..n {
            let mag: f64 = (0..k)
                .map(|e| (wd[j * k + e] as f64 * a.qs[e] as f64 * a.d[e / bl] as f64).abs())
                .sum();
            let (g, e) = (got[i * n + j], want[i * n + j]);
            let tol = 1e-5 * mag + 1e-30;
            assert!(
                ((g - e) as f64).abs() <= tol,
                "{t:?} {what} k={k} m={m} n={n} ({i},{j}): {g} vs reference {e} (tol {tol})"
            );
        }
    }
}

const QTYPES: [QuantType; 6] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q8_0,
    QuantType::Q4_K,
    QuantType::Q6_K,
];

#[test]
fn every_isa_matches_portable_and_reference() {
    let isas: Vec<Isa> = Isa::ALL
        .into_iter()
        .filter(|&i| {
            let w = QuantMatrix::new(QuantType::Q8_0, 1, 32, &[0; 34]).unwrap();
            w.matmul_with(i, &[0.0; 32], 1, &mut [0.0]).is_ok()
        })
        .collect();
    assert!(isas.contains(&Isa::Scalar));
    eprintln!("quantized kernels available: {isas:?}");
    let q8 = lattice_inference::backend::cpu::qdot::q8_0_kernel_name();
    if q8 == "amx-int8" {
        eprintln!("Q8_0 tiles of 8+ rows on AMX-INT8 (checked below with the avx512 table)");
    } else {
        eprintln!(
            "Q8_0 AMX-INT8 tile SKIPPED: no AMX-INT8 here (or LATTICE_AMX=0); Q8_0 runs {q8}"
        );
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for t in QTYPES {
        for blocks in [1, 7, 33] {
            let k = blocks * t.block_len();
            // 12 and 40 rows: AMX-INT8 Q8_0 tiles of 12 and 16 + 16 + 8 rows where it runs.
            for m in [1, 7, 12, 33, 40] {
                for n in [1, 7, 33, 100] {
                    let w = random_weights(t, n, k, &mut rng);
                    let x = random_acts(m, k, &mut rng);
                    let qm = QuantMatrix::new(t, n, k, &w).unwrap();
                    let mut port = vec![f32::NAN; m * n];
                    qm.matmul_with(Isa::Scalar, &x, m, &mut port).unwrap();
                    for &isa in &isas {
                        let mut y = vec![f32::NAN; m * n];
                        qm.matmul_with(isa, &x, m, &mut y).unwrap();
                        for (i, (a, b)) in y.iter().zip(&port).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{t:?} {isa:?} k={k} m={m} n={n} at {i}: {a} vs portable {b}"
                            );
                        }
                    }
                    assert_close_to_reference(t, &qm, &w, &x, m, &port, "");
                }
            }
        }
    }
}

/// The kernels on the real GGUF rows of the fixture (real scale and min distributions).
#[test]
fn kernels_on_real_rows() {
    let mut rng = Rng(2026);
    let mut n_types = 0;
    for r in records().iter().filter(|r| r.kind == 0 && !r.t.is_float()) {
        let qm = QuantMatrix::new(r.t, r.rows, r.k, &r.bytes).unwrap();
        let m = 5;
        let x = random_acts(m, r.k, &mut rng);
        let mut port = vec![0f32; m * r.rows];
        qm.matmul_with(Isa::Scalar, &x, m, &mut port).unwrap();
        let mut best = vec![0f32; m * r.rows];
        qm.matmul(&x, m, &mut best);
        assert!(
            best.iter()
                .zip(&port)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{:?}",
            r.t
        );
        assert_close_to_reference(r.t, &qm, &r.bytes, &x, m, &port, "real rows");
        n_types += 1;
    }
    assert!(n_types >= 6);
}

/// Many activation rows with a deep `k`: the driver takes the rows in several blocks (about
/// 512 KiB of codes each) and several workers; every instruction set must still match the
/// portable kernels bit for bit, and the reference within rounding.
#[test]
fn row_blocked_products_match() {
    let mut rng = Rng(4242);
    let (m, n, k) = (130, 37, 33 * 256);
    for t in [
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q6_K,
    ] {
        let w = random_weights(t, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let qm = QuantMatrix::new(t, n, k, &w).unwrap();
        let mut port = vec![0f32; m * n];
        qm.matmul_with(Isa::Scalar, &x, m, &mut port).unwrap();
        let mut best = vec![0f32; m * n];
        qm.matmul(&x, m, &mut best);
        assert!(
            best.iter()
                .zip(&port)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{t:?}"
        );
        assert_close_to_reference(t, &qm, &w, &x, m, &port, "row-blocked");
    }
}

/// The error bound of quantizing activations to Q8: each value moves by at most `0.5 · d`
/// (rounding) plus `127 · |d − f16(d)| ≤ 127 · 2⁻¹¹ · d` (the f16 scale of Q8_0 / Q8_1), with
/// `d = amax(block) / 127`; so `|y − y_exact| ≤ Σ_i |w_i| · 0.5625 · d_block(i)`, plus f32
/// accumulation slack `1e-5 · Σ |w_i x_i|`.
#[test]
fn matmul_error_within_activation_quantization_bound() {
    let mut rng = Rng(12345);
    let (m, n) = (5, 40);
    for t in QTYPES {
        let k = 4 * 256;
        let w = random_weights(t, n, k, &mut rng);
        let x = random_acts(m, k, &mut rng);
        let qm = QuantMatrix::new(t, n, k, &w).unwrap();
        let wd = qm.dequantize();
        let mut y = vec![0f32; m * n];
        qm.matmul(&x, m, &mut y);
        let bl = ActFormat::for_weights(t).unwrap().block_len();
        let mut rel = Vec::new();
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let dblk: Vec<f64> = xr
                .chunks(bl)
                .map(|b| b.iter().fold(0f64, |a, v| a.max(v.abs() as f64)) / 127.0)
                .collect();
            for j in 0..n {
                let wr = &wd[j * k..(j + 1) * k];
                let exact: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                let mag: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let bound: f64 = wr
                    .iter()
                    .enumerate()
                    .map(|(e, a)| (*a as f64).abs() * 0.5625 * dblk[e / bl])
                    .sum::<f64>()
                    + 1e-5 * mag;
                let err = (y[i * n + j] as f64 - exact).abs();
                assert!(err <= bound, "{t:?} ({i},{j}): err {err} > bound {bound}");
                rel.push(err / mag.max(1e-30));
            }
        }
        rel.sort_by(f64::total_cmp);
        let med = rel[rel.len() / 2];
        eprintln!("{t:?}: median |err| / Σ|w·x| = {med:.2e}");
        assert!(med < 5e-3, "{t:?}: median relative error {med}");
    }
}

/// `matmul_strided` writes exactly the `m × n` block at row stride `ldy`, adding with
/// `accumulate`, and equals `matmul` there.
#[test]
fn strided_and_accumulating_products() {
    let mut rng = Rng(99);
    let (m, n, k, ldy) = (9, 21, 256, 30);
    for t in [QuantType::Q4_0, QuantType::Q6_K, QuantType::F16] {
        let w = if t == QuantType::F16 {
            let v: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
            let mut raw = vec![0u8; t.row_bytes(n * k).unwrap()];
            quantize_row(t, &v, &mut raw).unwrap();
            raw
        } else {
            random_weights(t, n, k, &mut rng)
        };
        let x = random_acts(m, k, &mut rng);
        let qm = QuantMatrix::new(t, n, k, &w).unwrap();
        let mut plain = vec![0f32; m * n];
        qm.matmul(&x, m, &mut plain);
        for accumulate in [false, true] {
            let mut y = vec![1.5f32; (m - 1) * ldy + n + 4];
            qm.matmul_strided(&x, m, &mut y, ldy, accumulate);
            for (p, v) in y.iter().enumerate() {
                let (i, j) = (p / ldy, p % ldy);
                let want = if i < m && j < n {
                    plain[i * n + j] + if accumulate { 1.5 } else { 0.0 }
                } else {
                    1.5
                };
                assert!(
                    (v - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{t:?} {accumulate} at {p}: {v} vs {want}"
                );
            }
        }
    }
}

#[test]
fn float_matrices_match_f64() {
    let mut rng = Rng(777);
    let (m, n, k) = (3, 20, 70);
    let vals: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
    let x: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
    for t in [QuantType::F32, QuantType::F16, QuantType::BF16] {
        let mut raw = vec![0u8; t.row_bytes(n * k).unwrap()];
        quantize_row(t, &vals, &mut raw).unwrap();
        let qm = QuantMatrix::new(t, n, k, &raw).unwrap();
        let wd = qm.dequantize();
        let mut row = vec![0f32; k];
        qm.dequantize_row_into(3, &mut row);
        assert_eq!(row, wd[3 * k..4 * k]);
        let mut y = vec![0f32; m * n];
        qm.matmul(&x, m, &mut y);
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|e| wd[j * k + e] as f64 * x[i * k + e] as f64)
                    .sum();
                let err = (y[i * n + j] as f64 - exact).abs();
                assert!(
                    err < 1e-5 * k as f64,
                    "{t:?} ({i},{j}): {} vs {exact}",
                    y[i * n + j]
                );
            }
        }
    }
}

#[test]
fn new_rejects_bad_shapes() {
    for t in QuantType::ALL {
        let k = 2 * t.block_len().max(32);
        let rb = t.row_bytes(k).unwrap();
        assert!(
            QuantMatrix::new(t, 3, k, &vec![0u8; 3 * rb]).is_ok(),
            "{t:?}"
        );
        assert!(
            QuantMatrix::new(t, 3, k, &vec![0u8; 3 * rb - 1]).is_err(),
            "{t:?}"
        );
        assert!(
            QuantMatrix::new(t, 3, k, &vec![0u8; 3 * rb + 1]).is_err(),
            "{t:?}"
        );
        assert!(
            QuantMatrix::new(t, 2, k, &vec![0u8; 3 * rb]).is_err(),
            "{t:?}"
        );
        if t.block_len() > 1 {
            assert_eq!(t.row_bytes(k + 1), None);
            assert!(
                QuantMatrix::new(t, 1, k + 1, &vec![0u8; rb]).is_err(),
                "{t:?}"
            );
            let mut dst = vec![0f32; k + 1];
            assert!(dequantize_row(t, &vec![0u8; rb], &mut dst).is_err());
        }
        assert!(QuantMatrix::new(t, usize::MAX / 2, k, &[]).is_err());
    }
}

#[test]
fn type_table_matches_ggml() {
    let ids = [
        (0, 1, 4),
        (1, 1, 2),
        (30, 1, 2),
        (2, 32, 18),
        (3, 32, 20),
        (6, 32, 22),
    ];
    let ids2 = [(8, 32, 34), (12, 256, 144), (14, 256, 210)];
    for (id, bl, bb) in ids.into_iter().chain(ids2) {
        let t = QuantType::from_ggml(id).unwrap();
        assert_eq!(
            (t.block_len(), t.block_bytes(), t.ggml_type()),
            (bl, bb, id)
        );
    }
    for id in [7, 9, 10, 11, 13, 15, 16, 29, 31, 1000] {
        assert_eq!(QuantType::from_ggml(id), None, "{id}");
    }
    assert_eq!(QuantType::Q4_K.name(), "q4_K");
    fn send_sync<T: Send + Sync>() {}
    send_sync::<QuantMatrix>();
    assert_eq!(QuantType::Q4_0.row_bytes(4096), Some(128 * 18));
}
