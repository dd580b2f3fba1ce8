//! Decode steps run ahead of their read (`BatchEngine::set_overlap`, on by default on a GPU):
//! step n + 1 is launched before step n's picks are taken, so a request learns of its end one
//! step late. On the CPU a step runs to its end before the next is launched, so these tests
//! check the engine's side: every output, streamed text and finish reason equals what the
//! same requests give with steps read one by one, through joins, cancellations, requests that
//! cannot run ahead (sampling unless asked, log-probabilities), stop strings, length limits and a memory
//! budget that preempts; and steps did run ahead where they could.

mod common;

use common::fixture;
use common::overlap::{assert_same, greedy, run, run_both, sampled, RUNS};
use common::prompts_of;
use lattice_inference::engine::{
    generate, BatchEngine, EngineConfig, FinishReason, GenerateRequest, MemoryConfig, TextModel,
};
use lattice_inference::model::source::WeightMode;
use lattice_inference::sample::SamplingParams;

fn engine(
    m: &TextModel,
    max_running: usize,
    budget: Option<usize>,
    overlap: bool,
) -> BatchEngine<'_> {
    let mut e = BatchEngine::with_config(
        m,
        EngineConfig {
            max_running,
            memory: MemoryConfig {
                budget,
                ..MemoryConfig::default()
            },
            ..EngineConfig::default()
        },
    );
    e.set_overlap(overlap);
    e
}

fn same_as_serial(model: &str) {
    let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
    let reqs = greedy(model);
    assert!(reqs.len() >= 6);
    for (max_running, join_after, cancel_at) in RUNS {
        let what = format!("{model}, {max_running} slots, joins after {join_after} steps");
        let both = run_both(
            &mut engine(&m, max_running, None, false),
            &mut engine(&m, max_running, None, true),
            &reqs,
            join_after,
            cancel_at,
            &what,
        );
        let (ahead, n) = (&both.ahead, both.steps);
        assert_eq!(
            both.serial_ahead, 0,
            "{what}: no step runs ahead with overlap off"
        );
        eprintln!("{what}: {n} steps ran ahead");
        assert!(n > 0, "{what}: no step ran ahead");
        for (g, t) in ahead.iter().zip(&both.texts) {
            assert_eq!(&g.text, t, "{what}: streamed text adds up to the result");
        }
        if cancel_at.0 < reqs.len() {
            assert_eq!(ahead[cancel_at.0].finish_reason, FinishReason::Cancelled);
            assert_eq!(ahead[cancel_at.0].token_ids.len(), cancel_at.1);
        }
    }
}

#[test]
fn steps_run_ahead_give_the_serial_outputs_qwen3() {
    same_as_serial("tiny-qwen3");
}

#[test]
fn steps_run_ahead_give_the_serial_outputs_hybrid_qwen35() {
    same_as_serial("tiny-qwen35");
}

/// Requests that cannot run ahead (a sampled one, one with log-probabilities, stop strings on
/// greedy ones) beside greedy ones, and a memory budget that forces preemptions: the same
/// outputs as steps read one by one.
#[test]
fn mixed_requests_and_preemption_keep_the_outputs() {
    let model = "tiny-qwen3";
    let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
    let mut reqs = greedy(model);
    reqs[1].sampling = SamplingParams {
        temperature: 0.8,
        seed: Some(7),
        ..SamplingParams::default()
    };
    reqs[2].logprobs = Some(2);
    let probe = generate(&m, &reqs[4], &mut |_| true).unwrap().text;
    // A stop string from the middle of what request 4 writes.
    let chars: Vec<char> = probe.chars().collect();
    reqs[4].stop = vec![chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect()];
    let (serial, _, _) = run(&mut engine(&m, 8, None, false), &reqs, 3, (usize::MAX, 0));
    let (ahead, _, n) = run(&mut engine(&m, 8, None, true), &reqs, 3, (usize::MAX, 0));
    assert!(n > 0, "steps ran ahead once the sampled request ended");
    assert_same(&ahead, &serial, "mixed requests");
    assert_eq!(ahead[4].finish_reason, FinishReason::Stop);

    // Long greedy requests under a budget of a few sequences' pages.
    let stats = engine(&m, 8, None, false).memory_stats();
    let long: Vec<GenerateRequest> = prompts_of(model)
        .into_iter()
        .cycle()
        .take(12)
        .enumerate()
        .map(|(i, p)| {
            // Short prompts that grow: admitted while their first page fits, preempted later.
            let mut p = p[..p.len().min(4 + i)].to_vec();
            p[0] = i as u32 % 50; // no two share a prefix
            let mut r = GenerateRequest::new(p, 48, SamplingParams::greedy());
            r.ignore_eos = true;
            r
        })
        .collect();
    // Pages for about two of them at once.
    let rows = MemoryConfig::default().page_rows;
    let longest = long.iter().map(|r| r.prompt_ids.len() + 48).max().unwrap();
    let budget = Some(2 * longest.div_ceil(rows) * stats.page_bytes);
    let mut e = engine(&m, 8, budget, false);
    let (serial, _, _) = run(&mut e, &long, 0, (usize::MAX, 0));
    let mut e = engine(&m, 8, budget, true);
    let (ahead, _, n) = run(&mut e, &long, 0, (usize::MAX, 0));
    assert!(
        e.memory_stats().preemptions > 0,
        "the budget forced preemptions"
    );
    assert!(n > 0);
    assert_same(&ahead, &serial, "under a memory budget");
}

/// Sampled requests (seeded; temperature alone, with top-p and top-k; a greedy one with a
/// logit bias; one whose every logit is biased to -inf) run ahead too when asked
/// (`set_overlap_sampled`) on a model whose state can drop a row (their draws are planned
/// before the pick before them is read), and give the outputs of steps read one by one; on
/// the hybrid Qwen3.5 (a recurrent state cannot drop a row) they do not run ahead. Not asked,
/// they do not run ahead, and the outputs are the same.
#[test]
fn sampled_requests_run_ahead_with_the_serial_outputs() {
    for (model, runs_ahead) in [("tiny-qwen3", true), ("tiny-qwen35", false)] {
        let m = TextModel::load(&fixture(model), WeightMode::F32).unwrap();
        let reqs = sampled(&m, model);
        for (slots, join_after, cancel_at) in RUNS {
            let what = format!("{model}, sampled, {slots} slots, joins after {join_after} steps");
            let mut e = engine(&m, slots, None, true);
            e.set_overlap_sampled(true);
            let serial = &mut engine(&m, slots, None, false);
            let both = run_both(serial, &mut e, &reqs, join_after, cancel_at, &what);
            let n = both.steps;
            assert_eq!(n > 0, runs_ahead, "{what}: {n} steps ran ahead");
            let (off, _, _) = run(
                &mut engine(&m, slots, None, true),
                &reqs,
                join_after,
                cancel_at,
            );
            assert_same(&off, &both.serial, &what);
        }
    }
}
