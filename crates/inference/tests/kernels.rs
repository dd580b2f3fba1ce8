//! Parity tests of every CPU kernel table available on this machine against the scalar
//! reference (`backend::cpu::scalar`), on fixed-seed random inputs of awkward sizes, plus
//! dense sweeps measuring the ulp error of the vectorized `erf`, `exp`, `tanh` and GELU, and
//! the paged decode-attention kernels against the portable one.

use half::f16;
use lattice_inference::backend::cpu::attn::{DecodeGroup, DecodeKernels, KvRows, KvView};
use lattice_inference::backend::cpu::{self, kernels_for, scalar, Isa, Kernels};

/// SplitMix64: a small fixed-seed generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(lo, hi)).collect()
    }
}

/// Every kernel table this CPU supports.
fn tables() -> Vec<&'static Kernels> {
    Isa::ALL.into_iter().filter_map(kernels_for).collect()
}

/// Size of one ulp at `x` (as f32), subnormals included.
fn ulp(x: f64) -> f64 {
    let a = (x as f32).abs();
    if a < f32::MIN_POSITIVE {
        return f32::from_bits(1) as f64;
    }
    let e = (a.to_bits() >> 23) as i32 - 127;
    2f64.powi(e - 23)
}

/// Largest error of `f` against `oracle` in ulps of the oracle, over `xs`.
fn max_ulp(xs: &[f32], got: &[f32], oracle: impl Fn(f64) -> f64) -> (f64, f32) {
    let mut worst = (0.0, 0.0);
    for (&x, &g) in xs.iter().zip(got) {
        let r = oracle(x as f64);
        let e = if g == r as f32 || (g.is_nan() && r.is_nan()) {
            0.0
        } else {
            (g as f64 - r).abs() / ulp(r)
        };
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

/// A dense sweep of `[lo, hi]` with `n` points.
fn sweep(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    (0..=n)
        .map(|i| lo + (hi - lo) * (i as f64 / n as f64) as f32)
        .collect()
}

#[test]
fn dispatch_reports_a_supported_isa() {
    assert!(tables().iter().any(|t| t.isa().name() == cpu::isa()));
    assert!(kernels_for(Isa::Scalar).is_some());
    for t in tables() {
        assert!(t.isa().is_supported());
    }
}

/// Reference `c (+)= a·op(b)` in f64, and the bound `Σ|a||b|` per element.
#[allow(clippy::too_many_arguments)]
fn gemm_ref(
    trans: bool,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let bv = if trans {
                    b[j * ldb + p]
                } else {
                    b[p * ldb + j]
                } as f64;
                let av = a[i * lda + p] as f64;
                c[i * n + j] += av * bv;
                mag[i * n + j] += (av * bv).abs();
            }
        }
    }
    (c, mag)
}

/// Runs one GEMM shape through every table (and the scalar reference) and checks the result.
#[allow(clippy::too_many_arguments)]
fn check_gemm(rng: &mut Rng, trans: bool, m: usize, n: usize, k: usize, pad: usize, acc: bool) {
    let lda = k + pad;
    let ldb = if trans { k + pad } else { n + pad };
    let ldc = n + pad;
    let a = rng.vec(m * lda, -1.0, 1.0);
    let b_rows = if trans { n } else { k };
    let b = rng.vec(b_rows * ldb, -1.0, 1.0);
    let c0 = rng.vec(m * ldc, -1.0, 1.0);
    let (want, mag) = gemm_ref(trans, m, n, k, &a, lda, &b, ldb);
    let mut runs: Vec<(String, Vec<f32>)> = Vec::new();
    let mut c = c0.clone();
    if trans {
        scalar::gemm_bt(m, n, k, &a, lda, &b, ldb, &mut c, ldc, acc);
    } else {
        scalar::gemm_nn(m, n, k, &a, lda, &b, ldb, &mut c, ldc, acc);
    }
    runs.push(("reference".into(), c));
    for t in tables() {
        let mut c = c0.clone();
        if trans {
            t.gemm_bt(m, n, k, &a, lda, &b, ldb, &mut c, ldc, acc);
        } else {
            t.gemm_nn(m, n, k, &a, lda, &b, ldb, &mut c, ldc, acc);
        }
        runs.push((t.isa().name().into(), c));
        if trans {
            let w = t.pack_weights(n, k, &b, ldb);
            let mut c = c0.clone();
            t.gemm_bt_packed(m, &a, lda, &w, &mut c, ldc, acc, None, false);
            runs.push((format!("{} packed", t.isa()), c));
        }
    }
    for (name, c) in runs {
        for i in 0..m {
            for j in 0..ldc {
                let (got, old) = (c[i * ldc + j], c0[i * ldc + j]);
                if j >= n {
                    assert_eq!(got, old, "{name}: padding column {j} written");
                    continue;
                }
                let base = if acc { old as f64 } else { 0.0 };
                let r = base + want[i * n + j];
                let tol = 1e-5 * (mag[i * n + j] + base.abs()) + 1e-6;
                assert!(
                    (got as f64 - r).abs() <= tol,
                    "{name} trans={trans} m={m} n={n} k={k} pad={pad} acc={acc} at ({i},{j}): {got} vs {r}"
                );
            }
        }
    }
}

#[test]
fn gemm_matches_reference_on_awkward_shapes() {
    let mut rng = Rng(1);
    let dims = [1, 7, 33, 100];
    for trans in [true, false] {
        for &m in &dims {
            for &n in &dims {
                for &k in &dims {
                    check_gemm(&mut rng, trans, m, n, k, 0, false);
                }
            }
        }
    }
}

#[test]
fn gemm_with_strides_accumulate_and_large_dims() {
    let mut rng = Rng(2);
    for trans in [true, false] {
        for (m, n, k) in [
            (257, 33, 100),
            (33, 257, 257),
            (100, 100, 257),
            (257, 257, 7),
        ] {
            check_gemm(&mut rng, trans, m, n, k, 3, true);
            check_gemm(&mut rng, trans, m, n, k, 0, false);
        }
        for (m, n, k) in [
            (1, 1, 1),
            (7, 1, 33),
            (1, 100, 7),
            (3, 257, 33),
            (5, 3, 100),
            (7, 100, 257),
            (32, 33, 300),
        ] {
            check_gemm(&mut rng, trans, m, n, k, 5, true);
        }
    }
}

#[test]
fn gemm_with_k_zero_clears_or_keeps_c() {
    for t in tables() {
        let mut c = vec![3.0; 6];
        t.gemm_bt(2, 3, 0, &[], 0, &[], 0, &mut c, 3, true);
        assert_eq!(c, [3.0; 6]);
        t.gemm_nn(2, 3, 0, &[], 0, &[], 0, &mut c, 3, false);
        assert_eq!(c, [0.0; 6]);
    }
}

#[test]
fn fused_bias_and_gelu_match_separate_kernels() {
    let mut rng = Rng(3);
    for (m, n, k) in [(1, 7, 33), (3, 100, 7), (33, 257, 100), (100, 33, 64)] {
        let a = rng.vec(m * k, -1.0, 1.0);
        let b = rng.vec(n * k, -1.0, 1.0);
        let bias = rng.vec(n, -1.0, 1.0);
        let res = rng.vec(m * n, -1.0, 1.0);
        for t in tables() {
            for (acc, gelu) in [(false, true), (true, false), (false, false)] {
                let mut want = res.clone();
                t.gemm_bt(m, n, k, &a, k, &b, k, &mut want, n, acc);
                t.add_bias(&mut want, &bias);
                if gelu {
                    t.gelu_erf(&mut want);
                }
                let mut got = res.clone();
                t.gemm_bt_bias(m, n, k, &a, k, &b, k, &mut got, n, acc, Some(&bias), gelu);
                let mut got_packed = res.clone();
                let w = t.pack_weights(n, k, &b, k);
                t.gemm_bt_packed(m, &a, k, &w, &mut got_packed, n, acc, Some(&bias), gelu);
                for (g, w) in got.iter().chain(&got_packed).zip(want.iter().cycle()) {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{}: {g} vs {w}",
                        t.isa()
                    );
                }
            }
        }
    }
}

const SIZES: [usize; 4] = [1, 7, 33, 1000];

/// Checks `got` against `want` elementwise within `rel` relative plus `abs` absolute error.
fn close(name: &str, got: &[f32], want: &[f32], rel: f32, abs: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * w.abs() + abs || (g.is_nan() && w.is_nan()),
            "{name}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn elementwise_kernels_match_reference() {
    let mut rng = Rng(4);
    for t in tables() {
        let isa = t.isa().name();
        for n in SIZES {
            let x = rng.vec(n, -8.0, 8.0);
            let y = rng.vec(n, -8.0, 8.0);

            let (mut g, mut w) = (x.clone(), x.clone());
            t.gelu_erf(&mut g);
            scalar::gelu_erf(&mut w);
            close(&format!("{isa} gelu n={n}"), &g, &w, 1e-6, 1e-30);

            let (mut g, mut w) = (x.clone(), x.clone());
            t.tanh(&mut g);
            scalar::tanh(&mut w);
            close(&format!("{isa} tanh n={n}"), &g, &w, 1e-6, 0.0);

            let (mut g, mut w) = (x.clone(), x.clone());
            t.softmax(&mut g);
            scalar::softmax(&mut w);
            close(&format!("{isa} softmax n={n}"), &g, &w, 2e-6, 0.0);

            let (mut g, mut w) = (x.clone(), x.clone());
            t.add_assign(&mut g, &y);
            scalar::add_assign(&mut w, &y);
            close(&format!("{isa} add_assign n={n}"), &g, &w, 0.0, 0.0);

            // SiLU and SwiGLU: the vector exp against the f64 one, then the same arithmetic.
            let (mut g, mut w) = (x.clone(), x.clone());
            t.silu(&mut g);
            scalar::silu(&mut w);
            close(&format!("{isa} silu n={n}"), &g, &w, 1e-6, 1e-30);
            let (mut g, mut w) = (x.clone(), x.clone());
            t.silu_mul(&mut g, &y);
            scalar::silu_mul(&mut w, &y);
            close(&format!("{isa} silu_mul n={n}"), &g, &w, 1e-6, 1e-30);

            // Product rounded, then added: bit-equal to the scalar loop.
            let (mut g, mut w) = (x.clone(), x.clone());
            let z: Vec<f32> = y.iter().map(|v| v * 1.37 - 0.2).collect();
            t.add_product(&mut g, &y, &z);
            scalar::add_product(&mut w, &y, &z);
            assert_eq!(
                g.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{isa} add_product n={n}"
            );

            // Fused or separate multiply-add: one rounding apart.
            let (mut g, mut w) = (x.clone(), x.clone());
            t.axpy(&mut g, -0.37, &y);
            scalar::axpy(&mut w, -0.37, &y);
            close(&format!("{isa} axpy n={n}"), &g, &w, 1e-6, 1e-5);

            let (mut g, mut w) = (x.clone(), x.clone());
            t.scale(&mut g, 0.37);
            scalar::scale(&mut w, 0.37);
            close(&format!("{isa} scale n={n}"), &g, &w, 0.0, 0.0);

            let (mut g, mut w) = (x.clone(), x.clone());
            t.l2_normalize(&mut g);
            scalar::l2_normalize(&mut w);
            close(&format!("{isa} l2_normalize n={n}"), &g, &w, 1e-6, 0.0);

            let bound: f32 = x.iter().zip(&y).map(|(a, b)| (a * b).abs()).sum();
            let d = t.dot(&x, &y);
            let want: f64 = x.iter().zip(&y).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert!(
                (d as f64 - want).abs() <= 1e-6 * bound as f64,
                "{isa} dot n={n}"
            );
            let ss = t.sum_squares(&x);
            let want: f64 = x.iter().map(|&a| a as f64 * a as f64).sum();
            assert!(
                (ss as f64 - want).abs() <= 1e-6 * want,
                "{isa} sum_squares n={n}"
            );
            let cs = t.cosine(&x, &y);
            assert!(
                (cs - scalar::cosine(&x, &y)).abs() <= 1e-6,
                "{isa} cosine n={n}"
            );
        }
    }
}

#[test]
fn bias_and_layer_norm_match_reference() {
    let mut rng = Rng(5);
    for t in tables() {
        let isa = t.isa().name();
        for dim in SIZES {
            let rows = 3;
            let x = rng.vec(rows * dim, -3.0, 5.0);
            let bias = rng.vec(dim, -1.0, 1.0);
            let (mut g, mut w) = (x.clone(), x.clone());
            t.add_bias(&mut g, &bias);
            scalar::add_bias(&mut w, &bias);
            close(&format!("{isa} add_bias dim={dim}"), &g, &w, 0.0, 0.0);

            let gamma = rng.vec(dim, 0.5, 1.5);
            let beta = rng.vec(dim, -1.0, 1.0);
            let (mut g, mut w) = (x.clone(), x.clone());
            t.layer_norm(&mut g, dim, &gamma, &beta, 1e-12);
            scalar::layer_norm(&mut w, dim, &gamma, &beta, 1e-12);
            // Errors scale with the normalized magnitudes (|gamma·x̂| + |beta|), not with the
            // output, which can cancel to near zero.
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                let j = i % dim;
                let scale = (b - beta[j]).abs() + beta[j].abs();
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + scale),
                    "{isa} layer_norm dim={dim} [{i}]: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn softmax_handles_masked_and_extreme_inputs() {
    for t in tables() {
        let mut x = vec![0.0, f32::NEG_INFINITY, -1e30, 1.0, -200.0];
        t.softmax(&mut x);
        let e = (-1.0f32).exp();
        let want = [e / (1.0 + e), 0.0, 0.0, 1.0 / (1.0 + e), 0.0];
        close(
            &format!("{} softmax extremes", t.isa()),
            &x,
            &want,
            2e-7,
            0.0,
        );
        let mut big = vec![1e30, 1e30];
        t.softmax(&mut big);
        assert_eq!(big, [0.5, 0.5]);
    }
}

#[test]
fn erf_is_within_a_few_ulp_on_a_dense_sweep() {
    let xs = sweep(-10.0, 10.0, 400_000);
    for t in tables() {
        let mut got = xs.clone();
        t.erf(&mut got);
        let (e, at) = max_ulp(&xs, &got, scalar::erf_f64);
        println!("{}: erf max error {e:.2} ulp at x = {at}", t.isa());
        assert!(e <= 3.0, "{}: erf error {e} ulp at {at}", t.isa());
    }
}

#[test]
fn gelu_is_within_a_few_ulp_on_a_dense_sweep() {
    let xs = sweep(-12.0, 12.0, 400_000);
    let oracle = |x: f64| 0.5 * x * scalar::erfc_f64(-x * std::f64::consts::FRAC_1_SQRT_2);
    for t in tables() {
        let mut got = xs.clone();
        t.gelu_erf(&mut got);
        let (e, at) = max_ulp(&xs, &got, oracle);
        println!("{}: gelu max error {e:.2} ulp at x = {at}", t.isa());
        assert!(e <= 5.0, "{}: gelu error {e} ulp at {at}", t.isa());
    }
}

/// The int8 finish's GELU (a rational `erf`) against the exact GELU over `[-12, 12]` in steps
/// of 1e-4 (through `dequant_i32` with unit steps, and the slice op `gelu_rational`): within `2.5e-7 · |x|` plus 2 ulp everywhere.
#[test]
fn rational_gelu_is_within_its_bound() {
    let n = 240_001;
    let sums: Vec<i32> = (0..n as i32).map(|i| i - 120_000).collect();
    let w_steps = vec![1e-4f32; n];
    let x: Vec<f32> = sums.iter().map(|&v| v as f32 * 1e-4).collect();
    let mut exact = x.clone();
    scalar::gelu_erf(&mut exact);
    let deq = cpu::Dequant {
        x_steps: &[1.0],
        w_steps: &w_steps,
        bias: None,
        accumulate: false,
        gelu: true,
    };
    for t in tables() {
        let mut got = vec![0.0f32; n];
        t.dequant_i32(&mut [&mut got[..]], &sums, n, &deq);
        let mut worst = (0.0f64, 0.0f32);
        for ((&g, &e), &xi) in got.iter().zip(&exact).zip(&x) {
            let err = (g - e).abs() as f64;
            let tol = 2.5e-7 * xi.abs() as f64 + 2.0 * ulp(e as f64);
            assert!(err <= tol, "{}: gelu({xi}) = {g}, exact {e}", t.isa());
            if err / xi.abs().max(1e-3) as f64 > worst.0 {
                worst = (err / xi.abs().max(1e-3) as f64, xi);
            }
        }
        println!(
            "{}: rational gelu max error {:.2e}·|x| at x = {}",
            t.isa(),
            worst.0,
            worst.1
        );
        // The slice op is the same function.
        let mut slice = x.clone();
        t.gelu_rational(&mut slice);
        assert!(
            slice
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}: gelu_rational differs from the finish's GELU",
            t.isa()
        );
    }
}

/// The int8 products' tile finish: every table against the scalar reference on awkward
/// lengths and row counts, a sums stride wider than the rows, each combination of bias,
/// accumulate and GELU. Without GELU the arithmetic is the same two multiplies and adds
/// (bit-equal); with it, within the rational GELU's bound, `2.5e-7 · |x|` (plus 2 ulp).
#[test]
fn dequant_rows_match_the_scalar_reference() {
    let mut rng = Rng(77);
    for (n, rows) in [
        (1usize, 1usize),
        (7, 3),
        (8, 1),
        (15, 2),
        (16, 5),
        (17, 1),
        (31, 4),
        (32, 32),
        (33, 2),
        (100, 3),
    ] {
        let lds = n + 5;
        let sums: Vec<i32> = (0..rows * lds)
            .map(|_| (rng.next_u64() % 2_000_001) as i32 - 1_000_000)
            .collect();
        let w_steps = rng.vec(n + 3, 1e-4, 1e-2);
        let bias = rng.vec(n + 3, -1.0, 1.0);
        let y0 = rng.vec(rows * n, -2.0, 2.0);
        let x_steps = rng.vec(rows + 1, 1e-3, 1e-1);
        for b in [None, Some(&bias[..])] {
            for flags in [(false, false), (true, false), (false, true), (true, true)] {
                let deq = cpu::Dequant {
                    x_steps: &x_steps,
                    w_steps: &w_steps,
                    bias: b,
                    accumulate: flags.0,
                    gelu: flags.1,
                };
                let mut want = y0.clone();
                scalar::dequant_i32(
                    &mut want.chunks_exact_mut(n).collect::<Vec<_>>(),
                    &sums,
                    lds,
                    &deq,
                );
                // The values GELU is applied to.
                let mut pre = y0.clone();
                let no_gelu = cpu::Dequant { gelu: false, ..deq };
                scalar::dequant_i32(
                    &mut pre.chunks_exact_mut(n).collect::<Vec<_>>(),
                    &sums,
                    lds,
                    &no_gelu,
                );
                for t in tables() {
                    let mut got = y0.clone();
                    t.dequant_i32(
                        &mut got.chunks_exact_mut(n).collect::<Vec<_>>(),
                        &sums,
                        lds,
                        &deq,
                    );
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let what = format!(
                            "{}: n {n} rows {rows} bias {} flags {flags:?} [{}, {}]",
                            t.isa(),
                            b.is_some(),
                            i / n,
                            i % n
                        );
                        if flags.1 {
                            let tol = 2.5e-7 * pre[i].abs() + 2.0 * ulp(*w as f64) as f32;
                            assert!((g - w).abs() <= tol, "{what}: {g} vs {w}");
                        } else {
                            assert_eq!(g.to_bits(), w.to_bits(), "{what}: {g} vs {w}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn exp_and_tanh_are_within_a_few_ulp_on_a_dense_sweep() {
    let xs = sweep(-104.0, 89.0, 400_000);
    let ts = sweep(-10.0, 10.0, 400_000);
    for t in tables() {
        let mut got = xs.clone();
        t.exp(&mut got);
        let (e, at) = max_ulp(&xs, &got, f64::exp);
        println!("{}: exp max error {e:.2} ulp at x = {at}", t.isa());
        assert!(e <= 1.5, "{}: exp error {e} ulp at {at}", t.isa());
        let mut got = ts.clone();
        t.tanh(&mut got);
        let (e, at) = max_ulp(&ts, &got, f64::tanh);
        println!("{}: tanh max error {e:.2} ulp at x = {at}", t.isa());
        assert!(e <= 3.0, "{}: tanh error {e} ulp at {at}", t.isa());
    }
}

#[test]
fn special_values() {
    for t in tables() {
        let mut x = vec![
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            100.0,
            -120.0,
        ];
        t.exp(&mut x);
        assert_eq!(&x[..2], &[0.0, f32::INFINITY]);
        assert!(x[2].is_nan());
        assert_eq!(&x[3..], &[1.0, 1.0, f32::INFINITY, 0.0]);
        let mut x = vec![f32::INFINITY, f32::NEG_INFINITY, 0.0, 30.0, -30.0];
        t.erf(&mut x);
        assert_eq!(x, [1.0, -1.0, 0.0, 1.0, -1.0]);
        let mut x = vec![f32::INFINITY, f32::NEG_INFINITY, 0.0, 30.0, -30.0];
        t.tanh(&mut x);
        assert_eq!(x, [1.0, -1.0, 0.0, 1.0, -1.0]);
        let mut x = vec![0.0, 50.0, -50.0, f32::INFINITY];
        t.gelu_erf(&mut x);
        assert_eq!(x, [0.0, 50.0, 0.0, f32::INFINITY]);
        let mut z = vec![0.0; 9];
        t.l2_normalize(&mut z);
        assert_eq!(z, [0.0; 9]);
        assert_eq!(t.cosine(&z, &[1.0; 9]), 0.0);
    }
}

/// `rows` ([n, ld]) split into pages of `page_rows` rows, each allocated whole as in a page
/// pool (the last one partly filled, its tail garbage).
fn pages_of<T: Copy>(rows: &[T], ld: usize, page_rows: usize, fill: T) -> Vec<Vec<T>> {
    rows.chunks(page_rows * ld)
        .map(|c| {
            let mut p = c.to_vec();
            p.resize(page_rows * ld, fill);
            p
        })
        .collect()
}

/// f32 pages as stored rows.
fn rows_f32(pages: &[Vec<f32>]) -> Vec<KvRows<'_>> {
    pages.iter().map(|p| KvRows::F32(p)).collect()
}

/// f16 pages as stored rows.
fn rows_f16(pages: &[Vec<f16>]) -> Vec<KvRows<'_>> {
    pages.iter().map(|p| KvRows::F16(p)).collect()
}

/// A view of `pages` holding `rows` rows of `ld`.
fn paged_view<'a>(pages: &'a [KvRows<'a>], page_rows: usize, rows: usize, ld: usize) -> KvView<'a> {
    KvView::new(pages.to_vec(), page_rows, rows, ld)
}

/// One decode group through `t`.
fn decode(t: DecodeKernels, sh: &DecodeGroup, q: &[f32], k: &KvView, v: &KvView) -> Vec<f32> {
    let mut out = vec![f32::NAN; sh.g * sh.hd];
    t.run(sh, q, k, v, &mut Vec::new(), &mut out);
    out
}

/// The paged decode kernel of every instruction set this CPU has, f32 and f16 rows, against
/// the portable kernel on the same rows in one contiguous page: pages of 1..64 rows, views
/// crossing pages, window starts mid-page, groups of 1..8 heads, awkward head dims, rows of
/// several key/value heads.
#[test]
fn paged_decode_attention_matches_portable_reference() {
    let mut rng = Rng(6);
    let kernels = DecodeKernels::available();
    let portable = DecodeKernels::portable();
    let mut case = 0usize;
    for hd in [17, 64, 80, 128, 256] {
        for total in [1, 2, 31, 33, 100, 257] {
            // 2 or 3 key/value heads per row, sometimes padded; the group reads one of them.
            let n_kv = 2 + case % 2;
            let ld = n_kv * hd + if case.is_multiple_of(3) { 3 } else { 0 };
            let col = (case % n_kv) * hd;
            case += 1;
            let k = rng.vec(total * ld, -1.0, 1.0);
            let v = rng.vec(total * ld, -1.0, 1.0);
            let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
            let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
            let whole = [
                (
                    KvView::contiguous(KvRows::F32(&k), ld),
                    KvView::contiguous(KvRows::F32(&v), ld),
                ),
                (
                    KvView::contiguous(KvRows::F16(&k16), ld),
                    KvView::contiguous(KvRows::F16(&v16), ld),
                ),
            ];
            for page_rows in [1, 3, 16, 32, 64] {
                let (kp, vp) = (
                    pages_of(&k, ld, page_rows, f32::NAN),
                    pages_of(&v, ld, page_rows, f32::NAN),
                );
                let (kp16, vp16) = (
                    pages_of(&k16, ld, page_rows, f16::NAN),
                    pages_of(&v16, ld, page_rows, f16::NAN),
                );
                let (kr, vr) = (rows_f32(&kp), rows_f32(&vp));
                let (kr16, vr16) = (rows_f16(&kp16), rows_f16(&vp16));
                let paged = [
                    (
                        paged_view(&kr, page_rows, total, ld),
                        paged_view(&vr, page_rows, total, ld),
                    ),
                    (
                        paged_view(&kr16, page_rows, total, ld),
                        paged_view(&vr16, page_rows, total, ld),
                    ),
                ];
                let mut firsts = vec![0, total / 2 + 1, total - 1];
                firsts.retain(|&f| f < total);
                firsts.dedup();
                for first in firsts {
                    for g in 1..=8 {
                        let q = rng.vec(g * hd, -1.0, 1.0);
                        let sh = DecodeGroup {
                            g,
                            hd,
                            first,
                            col,
                            scale: 1.0 / (hd as f32).sqrt(),
                        };
                        for (dtype, ((wk, wv), (pk, pv))) in
                            ["f32", "f16"].into_iter().zip(whole.iter().zip(&paged))
                        {
                            let want = decode(portable, &sh, &q, wk, wv);
                            for &t in &kernels {
                                let got = decode(t, &sh, &q, pk, pv);
                                close(
                                    &format!(
                                        "{t:?} {dtype} hd {hd} total {total} page {page_rows} \
                                         first {first} g {g} ld {ld} col {col}"
                                    ),
                                    &got,
                                    &want,
                                    1e-5,
                                    1e-6,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The same rows in pages of 32 or in one contiguous page give the same attention (the
/// value tiles restart at page boundaries, so sums are regrouped, within rounding).
#[test]
fn multi_page_view_equals_one_page() {
    let mut rng = Rng(7);
    // (g, hd, key/value heads): Qwen2.5-Coder-0.5B, Qwen3.5, a small odd one.
    for (g, hd, n_kv) in [(7, 64, 2), (4, 256, 2), (3, 80, 3)] {
        let ld = n_kv * hd;
        for total in [33, 100, 1000] {
            let k = rng.vec(total * ld, -1.0, 1.0);
            let v = rng.vec(total * ld, -1.0, 1.0);
            let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
            let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
            let (kp, vp) = (pages_of(&k, ld, 32, 0.0), pages_of(&v, ld, 32, 0.0));
            let (kp16, vp16) = (
                pages_of(&k16, ld, 32, f16::ZERO),
                pages_of(&v16, ld, 32, f16::ZERO),
            );
            let (kr, vr) = (rows_f32(&kp), rows_f32(&vp));
            let (kr16, vr16) = (rows_f16(&kp16), rows_f16(&vp16));
            let cases = [
                (
                    "f32",
                    KvView::contiguous(KvRows::F32(&k), ld),
                    KvView::contiguous(KvRows::F32(&v), ld),
                    paged_view(&kr, 32, total, ld),
                    paged_view(&vr, 32, total, ld),
                ),
                (
                    "f16",
                    KvView::contiguous(KvRows::F16(&k16), ld),
                    KvView::contiguous(KvRows::F16(&v16), ld),
                    paged_view(&kr16, 32, total, ld),
                    paged_view(&vr16, 32, total, ld),
                ),
            ];
            for first in [0, 17, total - 1] {
                let q = rng.vec(g * hd, -1.0, 1.0);
                let sh = DecodeGroup {
                    g,
                    hd,
                    first,
                    col: (n_kv - 1) * hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                };
                for (dtype, wk, wv, pk, pv) in &cases {
                    for t in DecodeKernels::available() {
                        let want = decode(t, &sh, &q, wk, wv);
                        let got = decode(t, &sh, &q, pk, pv);
                        close(
                            &format!("{t:?} {dtype} g {g} hd {hd} total {total} first {first}"),
                            &got,
                            &want,
                            1e-6,
                            1e-6,
                        );
                    }
                }
            }
        }
    }
}

/// `v` rounded toward zero to bf16-representable values.
fn to_bf16(v: Vec<f32>) -> Vec<f32> {
    v.into_iter()
        .map(|x| f32::from_bits(x.to_bits() & 0xffff_0000))
        .collect()
}

/// The bf16-weight dot and axpy of every table against the scalar references.
#[test]
fn bf16_dot_and_axpy_match_reference() {
    let mut rng = Rng(12);
    for t in tables() {
        let isa = t.isa().name();
        for n in SIZES {
            let a = to_bf16(rng.vec(n, -4.0, 4.0));
            let bits: Vec<u16> = a.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
            let x = rng.vec(n, -4.0, 4.0);
            // The same sums as the f32 kernel over the widened values.
            assert_eq!(t.dot_bf16(&bits, &x), t.dot(&a, &x), "{isa} dot_bf16 n={n}");
            let bound: f64 = a.iter().zip(&x).map(|(p, q)| (p * q).abs() as f64).sum();
            let d = t.dot_bf16(&bits, &x) as f64 - scalar::dot_bf16(&bits, &x) as f64;
            assert!(d.abs() <= 1e-6 * bound, "{isa} dot_bf16 vs reference n={n}");
            let (mut g, mut w, mut f) = (x.clone(), x.clone(), x.clone());
            t.axpy_bf16(&mut g, 0.3, &bits);
            scalar::axpy_bf16(&mut w, 0.3, &bits);
            t.axpy(&mut f, 0.3, &a);
            assert_eq!(
                g, f,
                "{isa} axpy_bf16 equals axpy on the widened values n={n}"
            );
            close(&format!("{isa} axpy_bf16 n={n}"), &g, &w, 1e-6, 1e-5);
        }
    }
}

/// The per-row low-rank kernel (LoRA's `y += s · B (A x)`) against a plain loop: rows with no,
/// one or several factors (overlapping output columns), awkward ranks and widths, one row (its
/// outputs split over threads) and many.
#[test]
fn low_rank_updates_match_reference() {
    use lattice_inference::backend::cpu::{add_low_rank, Delta, Values};
    let mut rng = Rng(11);
    for (m, in_dim, out_dim) in [(1, 67, 301), (3, 896, 1152), (9, 33, 4864), (1, 4864, 896)] {
        let x = rng.vec(m * in_dim, -1.0, 1.0);
        let y0 = rng.vec(m * out_dim, -1.0, 1.0);
        // (rank, first column, outputs, scale)
        let shapes = [
            (4, 0, out_dim, 1.0),
            (7, out_dim / 3, out_dim / 2, -0.6),
            (16, 5, 1, 2.0),
        ];
        type Factor = (usize, usize, f32, Vec<f32>, Vec<f32>);
        let factors: Vec<Factor> = shapes
            .iter()
            .map(|&(r, col, n, s)| {
                (
                    r,
                    col,
                    s,
                    to_bf16(rng.vec(r * in_dim, -1.0, 1.0)),
                    to_bf16(rng.vec(r * n, -1.0, 1.0)),
                )
            })
            .collect();
        let picks: Vec<Vec<usize>> = (0..m)
            .map(|i| (0..factors.len()).filter(|k| (i + k) % 3 != 2).collect())
            .collect();
        // bf16 bits of the (bf16-representable) factors, for the 16-bit form of the kernel.
        let bits =
            |v: &[f32]| -> Vec<u16> { v.iter().map(|x| (x.to_bits() >> 16) as u16).collect() };
        let halves: Vec<(Vec<u16>, Vec<u16>)> =
            factors.iter().map(|f| (bits(&f.3), bits(&f.4))).collect();
        let deltas = |bf16: bool| -> Vec<Vec<Delta>> {
            picks
                .iter()
                .map(|p| {
                    p.iter()
                        .map(|&k| {
                            let (rank, col, scale, a, bt) = &factors[k];
                            let (a, bt) = if bf16 {
                                (Values::Bf16(&halves[k].0), Values::Bf16(&halves[k].1))
                            } else {
                                (Values::F32(a), Values::F32(bt))
                            };
                            Delta {
                                a,
                                bt,
                                rank: *rank,
                                col: *col,
                                scale: *scale,
                            }
                        })
                        .collect()
                })
                .collect()
        };
        let mut got = y0.clone();
        add_low_rank(&x, in_dim, &mut got, out_dim, &deltas(false));
        let mut got16 = y0.clone();
        add_low_rank(&x, in_dim, &mut got16, out_dim, &deltas(true));
        assert_eq!(got, got16, "bf16 factors widen to the same sums as f32");
        let mut want: Vec<f64> = y0.iter().map(|&v| v as f64).collect();
        for (i, p) in picks.iter().enumerate() {
            for &k in p {
                let (rank, col, scale, a, bt) = &factors[k];
                let n = bt.len() / rank;
                for r in 0..*rank {
                    let t: f64 = (0..in_dim)
                        .map(|j| a[r * in_dim + j] as f64 * x[i * in_dim + j] as f64)
                        .sum();
                    for o in 0..n {
                        want[i * out_dim + col + o] += *scale as f64 * t * bt[r * n + o] as f64;
                    }
                }
            }
        }
        let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        close(
            &format!("low rank m={m} in={in_dim} out={out_dim}"),
            &got,
            &want,
            1e-4,
            1e-3,
        );
    }
}

/// Packed bf16 weights (widened as the microkernel loads them) give exactly the packed f32
/// product over the same (bf16-representable) values, with bias, GELU and accumulation, on
/// every table and awkward shapes (decode rows, tile edges, several depth blocks).
#[test]
fn packed_bf16_products_equal_packed_f32_bit_for_bit() {
    use lattice_inference::backend::cpu::PackedBf16;
    let mut rng = Rng(13);
    for (m, n, k) in [
        (1, 7, 33),
        (1, 1000, 896),
        (3, 100, 7),
        (17, 257, 700),
        (100, 33, 1100),
    ] {
        let a = rng.vec(m * k, -1.0, 1.0);
        let b = to_bf16(rng.vec(n * k, -1.0, 1.0));
        let bias = rng.vec(n, -1.0, 1.0);
        let res = rng.vec(m * n, -1.0, 1.0);
        for t in tables() {
            let w = t.pack_weights(n, k, &b, k);
            let w16 = PackedBf16::from_packed(&w).expect("bf16 values pack in 16 bits");
            for (acc, bias, gelu) in [
                (false, None, false),
                (true, Some(&bias[..]), false),
                (false, Some(&bias[..]), true),
            ] {
                let mut want = res.clone();
                t.gemm_bt_packed(m, &a, k, &w, &mut want, n, acc, bias, gelu);
                let mut got = res.clone();
                t.gemm_bt_packed_bf16(m, &a, k, &w16, &mut got, n, acc, bias, gelu);
                assert!(
                    got == want,
                    "{} m={m} n={n} k={k} acc={acc} gelu={gelu}",
                    t.isa()
                );
            }
        }
    }
    // Values that are not bf16 stay f32.
    let t = tables()[0];
    let w = t.pack_weights(2, 3, &[1.0, 0.1, 2.0, 3.0, 4.0, 5.0], 3);
    assert!(PackedBf16::from_packed(&w).is_none());
}

/// `copy_rows` equals a plain row-by-row copy on awkward shapes and strides (a single row, rows
/// of one value, and copies large enough to be split over the workers), and leaves every
/// value outside the copied columns as it was.
#[test]
fn copy_rows_matches_a_plain_copy() {
    let mut rng = Rng(7);
    for &(rows, width, src_pad, dst_pad) in &[
        (1usize, 1usize, 0usize, 0usize),
        (1, 37, 5, 3),
        (3, 1, 2, 9),
        (700, 130, 17, 0),
        (2048, 33, 0, 31),
    ] {
        let (src_ld, dst_ld) = (width + src_pad, width + dst_pad);
        let src = rng.vec(rows * src_ld, -1.0, 1.0);
        let before = rng.vec(rows * dst_ld, -1.0, 1.0);
        let mut want = before.clone();
        for r in 0..rows {
            want[r * dst_ld..r * dst_ld + width]
                .copy_from_slice(&src[r * src_ld..r * src_ld + width]);
        }
        let mut got = before.clone();
        cpu::copy_rows(&src, src_ld, &mut got, dst_ld, rows, width);
        assert_eq!(
            got, want,
            "{rows} rows of {width}, strides {src_ld} / {dst_ld}"
        );
    }
}
