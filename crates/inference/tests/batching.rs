//! Continuous batching ([`BatchEngine`]): many requests decoded together, joining between
//! steps, give the same greedy tokens as each request alone (and as transformers), for the
//! attention-only Qwen3 fixture and the hybrid Qwen3.5 one (recurrent state per sequence),
//! including prompts longer than one step's prefill budget.

mod common;

use common::{fixture, read_json, u32s};
use lattice_inference::engine::{generate, BatchEngine, FinishReason, GenerateRequest, TextModel};
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;

fn requests(model: &str) -> Vec<(GenerateRequest, Vec<u32>)> {
    let r = read_json(&fixture(model).join("reference.json"));
    r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut req = GenerateRequest::new(u32s(&p["ids"]), 64, SamplingParams::greedy());
            req.ignore_eos = true;
            req.logprobs = Some(4);
            (req, u32s(&p["greedy_ids"]))
        })
        .collect()
}

fn check(model: &str) {
    let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
    let reqs = requests(model);
    assert!(reqs.len() >= 6);

    // All at once.
    let mut engine = BatchEngine::new(&m, 8);
    for (req, _) in &reqs {
        engine.submit(req.clone()).unwrap();
    }
    let done = engine.run_all().unwrap();
    assert_eq!(done.len(), reqs.len());
    for ((_, g), (req, want)) in done.iter().zip(&reqs) {
        assert_eq!(
            &g.token_ids, want,
            "{model}: batched greedy differs from transformers"
        );
        let alone = generate(&m, req, &mut |_| true).unwrap();
        assert_eq!(g.token_ids, alone.token_ids);
        assert_eq!(g.text, alone.text);
        // Log-softmax of the logits at every step (the chosen token and the top 4): batching
        // must not move them beyond 1e-5.
        assert_eq!(g.logprobs.len(), alone.logprobs.len());
        let mut worst = 0f32;
        for (a, b) in g.logprobs.iter().zip(&alone.logprobs) {
            assert_eq!(a.token, b.token);
            worst = worst.max((a.logprob - b.logprob).abs());
            for (x, y) in a.top.iter().zip(&b.top) {
                assert_eq!(x.0, y.0, "{model}: top tokens differ in a batch");
                worst = worst.max((x.1 - y.1).abs());
            }
        }
        assert!(worst < 1e-5, "{model}: batched logprobs differ by {worst}");
    }

    // Joining while others decode, with fewer slots than requests.
    let mut engine = BatchEngine::new(&m, 3);
    let mut ids = Vec::new();
    for (req, _) in reqs.iter().take(2) {
        ids.push(engine.submit(req.clone()).unwrap());
    }
    let mut done = Vec::new();
    for _ in 0..5 {
        done.extend(engine.step().unwrap());
    }
    for (req, _) in reqs.iter().skip(2) {
        ids.push(engine.submit(req.clone()).unwrap());
    }
    done.extend(engine.run_all().unwrap());
    done.sort_by_key(|(id, _)| *id);
    assert_eq!(done.len(), reqs.len());
    for ((_, g), (_, want)) in done.iter().zip(&reqs) {
        assert_eq!(&g.token_ids, want, "{model}: staggered batch differs");
    }
}

/// Streaming updates add up to the final text; a cancelled request leaves at once and the
/// others finish unchanged.
#[test]
fn updates_stream_the_text_and_cancel_drops_a_request() {
    let m = TextModel::load(&fixture("tiny-qwen3"), WeightMode::F32).unwrap();
    let reqs = requests("tiny-qwen3");
    let mut engine = BatchEngine::new(&m, 4);
    let ids: Vec<u64> = reqs
        .iter()
        .take(4)
        .map(|(r, _)| engine.submit(r.clone()).unwrap())
        .collect();
    let mut streamed = vec![String::new(); 4];
    let mut counts = [0usize; 4];
    let mut done = Vec::new();
    let mut steps = 0;
    while engine.pending() > 0 {
        steps += 1;
        done.extend(
            engine
                .step_with(&mut |u| {
                    let k = ids.iter().position(|&i| i == u.id).unwrap();
                    streamed[k].push_str(u.text);
                    counts[k] += u.logprobs.len();
                    // The caller stops request 1 after its 10th token.
                    !(k == 1 && u.generated >= 10)
                })
                .unwrap(),
        );
        if steps == 3 {
            let g = engine.cancel(ids[3]).expect("request 3 is running");
            assert_eq!(g.finish_reason, FinishReason::Cancelled);
            assert!(engine.cancel(ids[3]).is_none());
        }
    }
    assert_eq!(engine.running(), 0);
    assert_eq!(engine.waiting(), 0);
    done.sort_by_key(|(id, _)| *id);
    assert_eq!(
        done.len(),
        3,
        "the cancelled request is not returned by step"
    );
    for (id, g) in &done {
        let k = ids.iter().position(|i| i == id).unwrap();
        assert_eq!(streamed[k], g.text, "streamed text equals the result");
        assert_eq!(counts[k], g.logprobs.len());
        if k == 1 {
            assert_eq!(g.finish_reason, FinishReason::Cancelled);
            assert_eq!(g.token_ids.len(), 10);
        } else {
            assert_eq!(g.token_ids, reqs[k].1, "others are unaffected");
        }
    }
}

#[test]
fn batched_greedy_equals_single_requests_qwen3() {
    check("tiny-qwen3");
}

#[test]
fn batched_greedy_equals_single_requests_hybrid_qwen35() {
    check("tiny-qwen35");
}

#[test]
fn bad_requests_are_refused_at_submission() {
    let m = TextModel::load(&fixture("tiny-qwen3"), WeightMode::F32).unwrap();
    let mut engine = BatchEngine::new(&m, 2);
    let bad = GenerateRequest::new(vec![100_000], 4, SamplingParams::greedy());
    assert!(engine
        .submit(bad)
        .unwrap_err()
        .to_string()
        .contains("outside the vocabulary"));
    assert!(engine
        .submit(GenerateRequest::new(vec![], 4, SamplingParams::greedy()))
        .is_err());
    let mut p = SamplingParams::greedy();
    p.top_p = 2.0;
    assert!(engine.submit(GenerateRequest::new(vec![1], 4, p)).is_err());
    assert_eq!(engine.pending(), 0);
    // max_tokens 0: ends after its prompt, with no tokens.
    engine
        .submit(GenerateRequest::new(
            vec![1, 2, 3],
            0,
            SamplingParams::greedy(),
        ))
        .unwrap();
    let done = engine.run_all().unwrap();
    assert!(done[0].1.token_ids.is_empty());
}

/// A Gated DeltaNet pass whose batch holds a sequence of no tokens (the engine's passes can)
/// gives every other sequence the rows and states it gets alone, and leaves the empty one's
/// state as it was: prompts (chunked and token by token) and decode steps.
#[test]
fn gated_delta_net_passes_with_empty_sequences() {
    use lattice_inference::attention::gdn::GdnHeads;
    use lattice_inference::attention::GdnLayer;
    use lattice_inference::io::store::Weight;
    use lattice_inference::ops::RmsNorm;
    use lattice_inference::state::{LayerKind, SeqState};
    use lattice_inference::tensor::Tensor;
    let mut rng = common::Rng(0x9e37_79b9_7f4a_7c15);
    let mut vec = |n: usize, scale: f32| rng.vec(n, scale);
    let heads = GdnHeads {
        n_k_heads: 2,
        n_v_heads: 4,
        k_dim: 16,
        v_dim: 24,
        v_tiled: false,
    };
    let kernel = 4;
    let conv_dim = 2 * 2 * 16 + 4 * 24;
    let kinds = [LayerKind::Recurrent {
        conv: (kernel - 1) * conv_dim,
        recurrent: heads.state_len(),
    }];
    let layer = GdnLayer::new(
        heads,
        kernel,
        vec(conv_dim * kernel, 0.6),
        (0..4).map(|i| 0.6 + 0.1 * i as f32).collect(),
        vec(4, 1.0),
    )
    .unwrap();
    let norm = RmsNorm::new(Weight::from_vec(vec(24, 1.0), vec![24]), 1e-6);
    let width = layer.proj_dim();
    let mut batched: Vec<SeqState> = (0..3)
        .map(|_| SeqState::with_layers(&kinds, 8, 4096))
        .collect();
    let mut alone: Vec<SeqState> = (0..3)
        .map(|_| SeqState::with_layers(&kinds, 8, 4096))
        .collect();
    let vd = heads.value_dim();
    for lens in [vec![20, 0, 3], vec![1, 0, 1], vec![0, 5, 0], vec![0, 0, 0]] {
        let rows: usize = lens.iter().sum();
        let proj = vec(rows * width, 2.0);
        let p = Tensor::cpu(rows, width, proj.clone());
        let mut refs: Vec<&mut SeqState> = batched.iter_mut().collect();
        let mut out = layer.apply(0, &p, &lens, &mut refs).unwrap();
        layer.gated_norm(&mut out, &p, &norm).unwrap();
        let got = out.to_host().unwrap();
        assert_eq!(got.len(), rows * vd, "{lens:?}");
        let mut at = 0;
        for (i, &n) in lens.iter().enumerate() {
            let p1 = Tensor::cpu(n, width, proj[at * width..(at + n) * width].to_vec());
            let mut o1 = layer.apply(0, &p1, &[n], &mut [&mut alone[i]]).unwrap();
            layer.gated_norm(&mut o1, &p1, &norm).unwrap();
            assert_eq!(
                &got[at * vd..(at + n) * vd],
                &o1.to_host().unwrap()[..],
                "sequence {i} of {lens:?}"
            );
            at += n;
        }
        // The states after the pass are checked by the next pass's rows, which read them.
        for ((b, a), &n) in batched.iter_mut().zip(alone.iter_mut()).zip(&lens) {
            b.commit(n);
            a.commit(n);
        }
    }
}
