//! The figures of `lattice bench grammar`: percentiles, per-engine summaries, the cross-check
//! and shared walk, and the text report.

use serde_json::{json, Value};

use super::engines::{self, Kind, Vocab};
use super::{EngineRun, SchemaRun, Setup, WalkArg};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Count, p50, p99 and mean of mask times (µs).
pub fn stats(mut v: Vec<f64>) -> Value {
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    json!({
        "masks": v.len(),
        "mask_us_p50": pct(&mut v, 0.5),
        "mask_us_p99": pct(&mut v, 0.99),
        "mask_us_mean": mean,
    })
}

/// An engine's figures over the schemas `keep` selects (among those it compiled).
pub fn summary(e: &EngineRun, keep: &dyn Fn(usize) -> bool, walk: WalkArg) -> Value {
    let runs: Vec<&SchemaRun> = (0..e.runs.len())
        .filter(|&i| keep(i) && e.runs[i].compile_ms.is_some())
        .map(|i| &e.runs[i])
        .collect();
    let mut compile: Vec<f64> = runs.iter().filter_map(|r| r.compile_ms).collect();
    let mut out = json!({
        "schemas": runs.len(),
        "compile_ms_p50": pct(&mut compile, 0.5),
        "compile_ms_p99": pct(&mut compile, 0.99),
    });
    if walk != WalkArg::Canonical {
        let mut r = stats(runs.iter().flat_map(|r| r.random.mask_us.clone()).collect());
        r["walks_finished"] = runs.iter().filter(|r| r.random.finished).count().into();
        out["random"] = r;
    }
    if walk != WalkArg::Random {
        let walked: Vec<&&SchemaRun> = runs.iter().filter(|r| r.canonical_walked).collect();
        let mut c = stats(walked.iter().flat_map(|r| r.canonical_us.clone()).collect());
        c["walks"] = walked.len().into();
        c["rejected_tokens"] = walked.iter().map(|r| r.rejected).sum::<usize>().into();
        out["canonical"] = c;
    }
    out
}

/// The cross-check and the shared walk, over the schemas every engine compiled: how many of
/// each engine's finished outputs each other engine accepts, and the masks of every engine
/// along the same tokens (every finished output that all of them accept, re-tokenized; fresh
/// constraints).
pub fn cross(runs: &[EngineRun], vocabs: &[Vocab], s: &Setup) -> anyhow::Result<Value> {
    let n = runs.len();
    let mut logits = vec![0.0f32; s.n_vocab];
    // accepted[a][b]: (outputs of engine a that engine b accepts, outputs of a).
    let mut accepted = vec![vec![[0usize; 2]; n]; n];
    let mut shared: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut texts = 0;
    for i in 0..s.schemas.len() {
        if runs.iter().any(|e| e.runs[i].compile_ms.is_none()) {
            continue;
        }
        let compiled = vocabs
            .iter()
            .map(|v| v.compile(&s.schemas[i]))
            .collect::<lattice_inference::Result<Vec<_>>>()?;
        for (a, run) in runs.iter().enumerate() {
            let Some(text) = &run.runs[i].text else {
                continue;
            };
            let own = &run.runs[i].random.tokens;
            let mut all = true;
            for (b, c) in compiled.iter().enumerate().filter(|(b, _)| *b != a) {
                accepted[a][b][1] += 1;
                if engines::accepts(c, s.tok, own, s.eos, &mut logits) {
                    accepted[a][b][0] += 1;
                } else {
                    all = false;
                }
            }
            let Some(ids) = engines::retokenize(s.tok, text).filter(|_| all) else {
                continue;
            };
            texts += 1;
            for (e, v) in vocabs.iter().enumerate() {
                let mut w = v.compile(&s.schemas[i])?.walker();
                let (us, _) = engines::canonical_walk(&mut w, &ids, s.eos, &mut logits)?;
                shared[e].extend(us);
            }
        }
    }
    let mut out = json!({ "shared_texts": texts });
    for (a, ra) in runs.iter().enumerate() {
        for (b, rb) in runs.iter().enumerate().filter(|(b, _)| *b != a) {
            let key = format!("{}_outputs_{}_accepts", ra.kind.name(), rb.kind.name());
            out[key] = json!(accepted[a][b]);
        }
    }
    for (e, us) in runs.iter().zip(shared) {
        out[format!("shared_{}", e.kind.name())] = stats(us);
    }
    Ok(out)
}

fn row(name: &str, v: &Value) -> String {
    let f = |w: &str, k: &str| v[w][k].as_f64().unwrap_or(0.0);
    let mut s = format!(
        "  {name:<11} {:>4} schemas  compile p50 {:>6.2} ms  p99 {:>7.2} ms",
        v["schemas"],
        v["compile_ms_p50"].as_f64().unwrap_or(0.0),
        v["compile_ms_p99"].as_f64().unwrap_or(0.0)
    );
    for w in ["random", "canonical"] {
        if v.get(w).is_some() {
            s += &format!(
                "\n      {w:<9} {:>6} masks  p50 {:>8.1} us  p99 {:>8.1} us  mean {:>7.1} us",
                v[w]["masks"],
                f(w, "mask_us_p50"),
                f(w, "mask_us_p99"),
                f(w, "mask_us_mean")
            );
            s += &match w {
                "random" => format!("  ({} walks finished)", v[w]["walks_finished"]),
                _ => format!(
                    "  ({} walks, {} tokens rejected)",
                    v[w]["walks"], v[w]["rejected_tokens"]
                ),
            };
        }
    }
    s
}

/// The text report of `out` (what `--json` prints).
pub fn print(out: &Value, runs: &[EngineRun]) {
    println!(
        "{} tokens, {} schemas, up to {} steps each; dfa alone: {} DFA; {}",
        out["vocab"],
        out["schemas"],
        out["steps"],
        out["dfa_backend"].as_str().unwrap_or(""),
        out["cpu"].as_str().unwrap_or("")
    );
    for (e, v) in runs
        .iter()
        .zip(out["engines"].as_array().into_iter().flatten())
    {
        println!(
            "{}: vocabulary built in {:.2} s{}; {} compiled{}, {} refused{}",
            e.kind.name(),
            e.vocab_s,
            match e.llguidance_vocab_s {
                Some(t) => format!(" (+ {t:.2} s for llguidance's, on first use)"),
                None => String::new(),
            },
            v["compiled"],
            match e.kind {
                Kind::Lattice => format!(
                    " ({} by dfa, {} by llguidance)",
                    v["served_by_dfa"], v["served_by_llguidance"]
                ),
                _ => String::new(),
            },
            v["refused"],
            match e.retokenize_mismatch {
                0 => String::new(),
                n => format!("; {n} outputs not re-tokenized exactly (not walked)"),
            }
        );
    }
    for (title, key) in [
        ("all compiled schemas", "all"),
        ("fair subset (schemas every engine compiled)", "fair"),
    ] {
        println!("{title}:");
        for v in out["engines"].as_array().into_iter().flatten() {
            println!("{}", row(v["engine"].as_str().unwrap_or(""), &v[key]));
        }
    }
    if let Some(c) = out["cross_check"].as_object() {
        for (k, v) in c.iter().filter(|(_, v)| v.is_array()) {
            println!("cross-check {k}: {} of {}", v[0], v[1]);
        }
        println!(
            "shared walk (the {} finished outputs every engine accepts, the same tokens for all):",
            c["shared_texts"]
        );
        for (k, v) in c
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("shared_")?, v)))
        {
            if v.is_object() {
                println!(
                    "  {k:<11} {:>6} masks  p50 {:>8.1} us  p99 {:>8.1} us  mean {:>7.1} us",
                    v["masks"],
                    v["mask_us_p50"].as_f64().unwrap_or(0.0),
                    v["mask_us_p99"].as_f64().unwrap_or(0.0),
                    v["mask_us_mean"].as_f64().unwrap_or(0.0)
                );
            }
        }
    }
}
