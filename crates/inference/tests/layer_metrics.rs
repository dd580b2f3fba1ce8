//! Layer metrics (lattice_inference::metrics) and ShortGPT pruning (lattice_inference::prune):
//! - off by default, nothing reported; on, one record per layer and pass, the statistics of the
//!   rows going in and out (checked against the hidden states themselves), the attention
//!   entropy of attention layers only, and logits bit-equal to a pass without metrics;
//! - block influence over a text, the least influential layers, and a pruned GGUF of a real
//!   model: layers dropped and renumbered, everything else byte-equal, loadable.
//!
//! One test per concern that uses the process-wide sink, so they run in one thread each (the
//! sink sees every pass of the process; this binary's tests take turns through `LOCK`).

mod common;

use std::sync::{Arc, Mutex};

use common::{fixture, real_gguf};
use lattice_inference::engine::TextModel;
use lattice_inference::io::gguf::GgufFile;
use lattice_inference::io::gguf_tensors::GgufTensors;
use lattice_inference::metrics::{install, uninstall, LayerSink, LayerStats};
use lattice_inference::model::decoder::{load_decoder, Outputs};
use lattice_inference::model::source::WeightMode;
use lattice_inference::prune::{block_influence, least_influential, prune_gguf};

static LOCK: Mutex<()> = Mutex::new(());

#[derive(Default)]
struct Collect(Mutex<Vec<LayerStats>>);

impl LayerSink for Collect {
    fn record(&self, s: &LayerStats) {
        self.0.lock().unwrap().push(s.clone());
    }
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 5 + (i * 37) % 300).collect()
}

#[test]
fn layers_are_observed_only_when_asked_and_without_changing_results() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for (dir, attention_layers) in [("tiny-llama", None), ("tiny-qwen35", Some(()))] {
        let dec = load_decoder(&fixture(dir), WeightMode::F32).unwrap();
        let n_layers = dec.info().config.n_layers;
        let prompt = ids(7);
        let run = || {
            let mut st = dec.new_cache(16);
            let mut out = dec
                .forward(&prompt, &[7], &mut [&mut st], Outputs::AllHidden)
                .unwrap();
            // One decode step after the prompt.
            out.extend(
                dec.forward(&[9], &[1], &mut [&mut st], Outputs::LastLogits)
                    .unwrap(),
            );
            out
        };
        let sink = Arc::new(Collect::default());
        let plain = run();
        install(Arc::clone(&sink) as _);
        let observed = run();
        uninstall();
        let after = run();
        assert_eq!(plain, observed, "{dir}: observing changed the outputs");
        assert_eq!(plain, after);
        let got = sink.0.lock().unwrap().clone();
        assert_eq!(
            got.len(),
            2 * n_layers,
            "{dir}: one record per layer and pass"
        );
        for (i, s) in got.iter().enumerate() {
            let (pass, layer) = (i / n_layers, i % n_layers);
            assert_eq!(s.layer, layer);
            assert_eq!(s.rows, if pass == 0 { 7 } else { 1 });
            assert!(s.input_norm > 0.0 && s.output_norm > 0.0 && s.seconds >= 0.0);
            assert!((0.0..=2.0).contains(&s.influence), "{s:?}");
            assert!(s.update_ratio >= 0.0);
            if layer + 1 < n_layers {
                // The residual stream leaving a layer enters the next one.
                let next = &got[i + 1];
                assert!((next.input_norm - s.output_norm).abs() <= 1e-9 * s.output_norm);
            }
            // Entropy: attention layers only, between 0 and ln(keys seen).
            let keys = if pass == 0 { 7.0f64 } else { 8.0 };
            match (s.attention_entropy, attention_layers) {
                (Some(e), _) => assert!(e >= 0.0 && e <= keys.ln() + 1e-9, "{dir} {s:?}"),
                (None, None) => panic!("{dir}: layer {layer} attends but reported no entropy"),
                (None, Some(())) => {}
            }
        }
        if attention_layers.is_some() {
            let with = got.iter().filter(|s| s.attention_entropy.is_some()).count();
            assert!(
                with > 0 && with < got.len(),
                "{dir}: {with} of {}",
                got.len()
            );
        }
        // The block influence over two chunks is the row-weighted mean of those records.
        let tokens = ids(16);
        let infl =
            block_influence(dec.as_ref(), |n| dec.new_cache(n), &tokens, 8, |_, _| {}).unwrap();
        assert_eq!(infl.len(), n_layers);
        assert!(infl.iter().all(|b| (0.0..=2.0).contains(b)));
        assert_eq!(least_influential(&infl, n_layers).len(), n_layers);
        let short = block_influence(
            dec.as_ref(),
            |n| dec.new_cache(n),
            &tokens[..5],
            8,
            |_, _| {},
        );
        assert!(short.unwrap_err().to_string().contains("5 tokens"));
    }
}

#[test]
fn pruned_gguf_drops_and_renumbers_layers() {
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let src = real_gguf("SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = std::env::temp_dir().join(format!("lattice-prune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let orig = GgufTensors::open(&src).unwrap();
    let n = 30usize;
    // Nothing removed: the same metadata and tensors, byte for byte.
    let same = dir.join("same.gguf");
    prune_gguf(&src, &same, &[]).unwrap();
    let copy = GgufTensors::open(&same).unwrap();
    let a: Vec<_> = orig.header().metadata_entries().collect();
    let b: Vec<_> = copy.header().metadata_entries().collect();
    assert_eq!(a, b);
    assert_eq!(orig.header().tensors().len(), copy.header().tensors().len());
    for t in orig.header().tensors() {
        assert_eq!(
            orig.raw(&t.name).unwrap().bytes,
            copy.raw(&t.name).unwrap().bytes
        );
    }
    // Layers 3 and 7 removed: 28 layers, blk.3 is the old blk.4, blk.6 the old blk.8.
    let out = dir.join("pruned.gguf");
    let report = prune_gguf(&src, &out, &[3, 7]).unwrap();
    assert_eq!((report.layers_before, report.layers_after), (n, 28));
    assert!(report.bytes_after < report.bytes_before);
    let p = GgufTensors::open(&out).unwrap();
    let h: &GgufFile = p.header();
    assert_eq!(h.metadata("llama.block_count").unwrap().as_u64(), Some(28));
    let per_layer = orig
        .header()
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("blk.0."))
        .count();
    assert_eq!(
        h.tensors().len(),
        orig.header().tensors().len() - 2 * per_layer
    );
    for (new, old) in [(3, 4), (6, 8), (2, 2), (27, 29)] {
        for t in h
            .tensors()
            .iter()
            .filter(|t| t.name.starts_with(&format!("blk.{new}.")))
        {
            let rest = &t.name[format!("blk.{new}.").len()..];
            let o = orig.raw(&format!("blk.{old}.{rest}")).unwrap();
            assert_eq!(p.raw(&t.name).unwrap().bytes, o.bytes, "{}", t.name);
        }
    }
    assert!(h.tensor("blk.28.attn_q.weight").is_none());
    // Loadable, and it generates.
    let model = TextModel::load(&out, WeightMode::Quantized).unwrap();
    assert_eq!(model.decoder.info().config.n_layers, 28);
    let ids = model.encode_prompt("Call me Ishmael.", true).unwrap();
    let mut st = model.new_cache(32);
    let logits = model
        .decoder
        .forward(&ids, &[ids.len()], &mut [&mut st], Outputs::LastLogits)
        .unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
    // Bad requests name what is wrong.
    let msg = prune_gguf(&src, &dir.join("x.gguf"), &[30])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("layer 30 does not exist"), "{msg}");
    let all: Vec<usize> = (0..n).collect();
    let msg = prune_gguf(&src, &dir.join("x.gguf"), &all)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("every layer"), "{msg}");
    let hybrid = fixture("tiny-qwen35").join("tiny-qwen35.bf16.gguf");
    let msg = prune_gguf(&hybrid, &dir.join("x.gguf"), &[0])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("interval"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}
