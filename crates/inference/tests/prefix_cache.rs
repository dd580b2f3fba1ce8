//! Automatic prefix caching and the KV memory budget: logits after a prefix-cache hit equal a
//! cold run (attention-only Qwen3 and hybrid Qwen3.5 fixtures, whose recurrent state comes
//! from a snapshot at the page boundary); the engine reuses cached prompt pages and its
//! outputs equal a cold engine's; the `n` choices of one prompt share its pages; requests whose
//! memory exceeds the budget are preempted and still give the outputs they give alone, with
//! the pool never above its budget.

mod common;

use common::{fixture, reference_prompt};
use lattice_inference::engine::{
    generate, BatchEngine, EngineConfig, GenerateRequest, Generation, MemoryConfig, TextModel,
};
use lattice_inference::model::decoder::Outputs;
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;
use lattice_inference::state::{
    KvDtype, MemoryLayout, PagePool, PrefixCache, SeqState, DEFAULT_PAGE_ROWS,
};

fn long_prompt(model: &str) -> Vec<u32> {
    reference_prompt(model, "long")
}

fn layout(m: &TextModel) -> MemoryLayout {
    m.memory_layout()
}

/// Largest |a - b| over the largest |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn forward(m: &TextModel, s: &mut SeqState, ids: &[u32]) -> Vec<f32> {
    m.decoder
        .forward(ids, &[ids.len()], &mut [s], Outputs::AllLogits)
        .unwrap()
}

/// A first sequence computes 90 tokens and leaves its pages (and, for the hybrid model, a
/// snapshot at the 64-token page boundary) in the cache; a second prompt sharing them runs
/// only its tail, and its logits equal a cold run of the whole prompt.
fn logits_after_hit_equal_cold(model: &str) {
    let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
    let lay = layout(&m);
    let recurrent = lay.is_recurrent();
    let pool = PagePool::unbounded(lay.page_shape(DEFAULT_PAGE_ROWS, KvDtype::F32));
    let mut cache = PrefixCache::new(DEFAULT_PAGE_ROWS);
    let long = long_prompt(model);
    let boundary = 2 * DEFAULT_PAGE_ROWS;

    let first = &long[..90];
    let mut s = SeqState::in_pool(&pool, &lay, 4096).unwrap();
    forward(&m, &mut s, &first[..boundary]);
    let snap = s.snapshot_recurrent().unwrap();
    forward(&m, &mut s, &first[boundary..]);
    let mut hashes = Vec::new();
    assert_eq!(cache.insert(first, s.pages(), &mut hashes, 0, 0), 2);
    if let Some(snap) = snap {
        assert!(cache.insert_snapshot(&hashes, 2, snap));
    }
    drop(s);

    let second = &long[..200];
    let hit = cache.lookup(second, second.len() - 1, recurrent, 0);
    assert_eq!(
        hit.tokens, boundary,
        "{model}: the two full pages are reused"
    );
    let mut warm = SeqState::in_pool(&pool, &lay, 4096).unwrap();
    warm.adopt_prefix(hit.pages, hit.tokens, hit.snapshot.as_deref())
        .unwrap();
    let got = forward(&m, &mut warm, &second[boundary..]);

    // Cold, split where the engine splits a hybrid prompt (its last page boundary is further
    // on, so the first chunk ends at 64 only for this comparison) and unsplit.
    let mut cold = SeqState::in_pool(&pool, &lay, 4096).unwrap();
    forward(&m, &mut cold, &second[..boundary]);
    let split = forward(&m, &mut cold, &second[boundary..]);
    let e = rel_err(&got, &split);
    assert!(
        e < 1e-5,
        "{model}: logits after a hit differ from cold by {e}"
    );
    let mut whole = SeqState::in_pool(&pool, &lay, 4096).unwrap();
    let all = forward(&m, &mut whole, second);
    let vocab = all.len() / second.len();
    let e = rel_err(&got, &all[boundary * vocab..]);
    assert!(
        e < 1e-5,
        "{model}: logits after a hit differ from one cold pass by {e}"
    );
}

#[test]
fn logits_after_a_hit_equal_a_cold_run_qwen3() {
    logits_after_hit_equal_cold("tiny-qwen3");
}

#[test]
fn logits_after_a_hit_equal_a_cold_run_hybrid_qwen35() {
    logits_after_hit_equal_cold("tiny-qwen35");
}

fn request(ids: &[u32], max_tokens: usize) -> GenerateRequest {
    let mut r = GenerateRequest::new(ids.to_vec(), max_tokens, SamplingParams::greedy());
    r.ignore_eos = true;
    r.logprobs = Some(3);
    r
}

fn engine(m: &TextModel, budget: Option<usize>, prefix_cache: bool) -> BatchEngine<'_> {
    BatchEngine::with_config(
        m,
        EngineConfig {
            max_running: 8,
            memory: MemoryConfig {
                budget,
                prefix_cache,
                ..MemoryConfig::default()
            },
            ..EngineConfig::default()
        },
    )
}

fn run(engine: &mut BatchEngine<'_>, reqs: &[GenerateRequest]) -> Vec<Generation> {
    for r in reqs {
        engine.submit(r.clone()).unwrap();
    }
    engine
        .run_all()
        .unwrap()
        .into_iter()
        .map(|(_, g)| g)
        .collect()
}

fn assert_same(a: &Generation, b: &Generation, what: &str) {
    assert_eq!(a.token_ids, b.token_ids, "{what}: tokens differ");
    assert_eq!(a.text, b.text);
    let mut worst = 0f32;
    for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
        worst = worst.max((x.logprob - y.logprob).abs());
        for (p, q) in x.top.iter().zip(&y.top) {
            assert_eq!(p.0, q.0, "{what}: top tokens differ");
            worst = worst.max((p.1 - q.1).abs());
        }
    }
    assert!(worst < 1e-5, "{what}: logprobs differ by {worst}");
}

/// Turn 2 of a conversation reuses turn 1's pages; the `n` choices of one prompt compute it
/// once; everything equals an engine with the cache off.
fn engine_reuses_prefixes(model: &str) {
    let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
    let long = long_prompt(model);
    let mut warm = engine(&m, None, true);
    let mut cold = engine(&m, None, false);
    let turn1 = [request(&long[..150], 8)];
    let a = run(&mut warm, &turn1);
    assert_eq!(a[0].cached_prompt_tokens, 0);
    assert_same(&a[0], &run(&mut cold, &turn1)[0], model);
    let turn2 = [request(&long[..300], 12)];
    let b = run(&mut warm, &turn2);
    // Turn 1's prompt ends inside its fifth page: four whole pages are reused (for the hybrid
    // model: up to its snapshot at 128 tokens).
    assert_eq!(b[0].cached_prompt_tokens, 128, "{model}");
    assert_same(&b[0], &run(&mut cold, &turn2)[0], model);
    // Three choices of a new prompt: the first computes it, the others reuse its pages
    // (recurrent models resume at multiples of 128 prompt tokens).
    let mut prompt = long[..200].to_vec();
    prompt[0] = prompt[0].wrapping_add(1) % 50;
    let choices = vec![request(&prompt, 6); 3];
    let c = run(&mut warm, &choices);
    assert_eq!(c[0].cached_prompt_tokens, 0);
    assert!(
        c[1].cached_prompt_tokens >= 128 && c[2].cached_prompt_tokens >= 128,
        "{model}"
    );
    let alone = generate(&m, &choices[0], &mut |_| true).unwrap();
    for g in &c {
        assert_same(g, &alone, model);
    }
    let stats = warm.memory_stats();
    assert!(stats.prefix.hit_tokens >= 128 + 2 * 128);
    assert!(stats.cached_pages > 0);
    warm.clear_prefix_cache();
    assert_eq!(warm.memory_stats().used_bytes, 0, "{model}: nothing leaks");
}

#[test]
fn engine_reuses_prefixes_qwen3() {
    engine_reuses_prefixes("tiny-qwen3");
}

#[test]
fn engine_reuses_prefixes_hybrid_qwen35() {
    engine_reuses_prefixes("tiny-qwen35");
}

/// 32 requests whose memory together is several times the budget: they are admitted as
/// memory allows, preempted when the running ones outgrow it, and all finish with the
/// outputs they give alone; the pool never holds more than the budget.
fn preemption_keeps_outputs(model: &str) {
    let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
    let long = long_prompt(model);
    let reqs: Vec<GenerateRequest> = (0..32)
        .map(|i| {
            let mut p = long[i..i + 40 + 3 * i].to_vec();
            p[0] = (i as u32) % 50;
            request(&p, 24 + i % 5)
        })
        .collect();
    let lay = layout(&m);
    let page = lay.page_shape(DEFAULT_PAGE_ROWS, KvDtype::F32).page_bytes();
    // Room for about four sequences' pages at once.
    let budget = 4 * 5 * page + 4 * lay.recurrent_bytes();
    for prefix_cache in [true, false] {
        let mut e = engine(&m, Some(budget), prefix_cache);
        let got = run(&mut e, &reqs);
        let stats = e.memory_stats();
        assert!(
            stats.preemptions > 0,
            "{model}: the budget forced preemptions"
        );
        assert!(
            stats.peak_bytes <= budget,
            "{model}: {} > {budget}",
            stats.peak_bytes
        );
        for (g, r) in got.iter().zip(&reqs) {
            let alone = generate(&m, r, &mut |_| true).unwrap();
            assert_same(g, &alone, model);
        }
    }
    // A request that could never fit alone is refused up front.
    let mut e = engine(&m, Some(page), true);
    let err = e.submit(request(&long[..100], 8)).unwrap_err().to_string();
    assert!(err.contains("budget"), "{err}");
}

#[test]
fn preemption_keeps_outputs_qwen3() {
    preemption_keeps_outputs("tiny-qwen3");
}

#[test]
fn preemption_keeps_outputs_hybrid_qwen35() {
    preemption_keeps_outputs("tiny-qwen35");
}
