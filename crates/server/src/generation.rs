//! The generation scheduler: one thread owns the [`TextModel`] and a [`BatchEngine`]
//! (continuous batching). Handlers submit requests through a [`Generator`] and read a stream of
//! [`GenEvent`]s; a request whose event receiver is dropped (the client went away) is cancelled
//! and its state freed before the next step. Admission is bounded: at most `max_running`
//! sequences run and `max_queue` more wait; beyond that [`Generator::submit`] refuses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use lattice_inference::engine::{
    default_budget, BatchEngine, EngineConfig, GenerateRequest, Generation, MemoryConfig,
    TextModel, TokenLogprob,
};
use lattice_inference::state::{KvDtype, MemoryLayout};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::ServeOptions;

/// What a request's receiver gets, per choice (`index`).
#[derive(Debug)]
pub enum GenEvent {
    /// New text and the log-probabilities of the tokens behind it (one event per sampled token;
    /// `text` may be empty while a stop string might still match).
    Delta {
        /// The choice.
        index: usize,
        /// Text new since the last event.
        text: String,
        /// Log-probabilities of the new tokens, when asked for.
        logprobs: Vec<TokenLogprob>,
    },
    /// The choice ended; its full result.
    Done {
        /// The choice.
        index: usize,
        /// The result (text, tokens, finish reason).
        generation: Generation,
    },
    /// The engine failed; the request cannot go on.
    Failed(String),
}

struct Submit {
    requests: Vec<GenerateRequest>,
    events: UnboundedSender<GenEvent>,
}

/// A handle to the scheduler thread, shared by the handlers.
pub struct Generator {
    /// The model (tokenizer, chat template, configuration) for building requests.
    pub model: Arc<TextModel>,
    submit: mpsc::Sender<Submit>,
    /// Requests submitted and not yet ended.
    in_flight: Arc<AtomicUsize>,
    capacity: usize,
    kv: KvLimit,
}

/// What a sequence may take of the KV memory: requests that could never fit alone are refused.
#[derive(Debug, Clone)]
struct KvLimit {
    budget: usize,
    layout: MemoryLayout,
    page_rows: usize,
    dtype: KvDtype,
}

impl KvLimit {
    /// Bytes a sequence of `prompt` tokens generating up to `max_tokens` may need.
    fn need(&self, prompt: usize, max_tokens: usize) -> usize {
        let len = prompt
            .saturating_add(max_tokens.max(1))
            .min(self.layout.max_positions);
        self.layout.sequence_bytes(len, self.page_rows, self.dtype)
    }
}

impl Generator {
    /// Starts the scheduler thread for `model` with the limits of `options` (sequences,
    /// queue, KV memory budget, prefix caching).
    pub fn start(model: TextModel, options: &ServeOptions, metrics: Arc<Metrics>) -> Generator {
        let (max_running, max_queue) = (options.max_running, options.max_queue);
        let layout = model.memory_layout();
        let budget = options.kv_cache_memory.unwrap_or_else(|| {
            default_budget(
                &layout,
                model.kv_dtype,
                max_running,
                &model.decoder.info().device,
            )
        });
        let config = EngineConfig {
            max_running,
            memory: MemoryConfig {
                budget: Some(budget),
                prefix_cache: options.prefix_cache,
                ..MemoryConfig::default()
            },
            ..EngineConfig::default()
        };
        eprintln!(
            "generation: KV memory budget {:.1} MiB, prefix cache {}",
            budget as f64 / (1 << 20) as f64,
            if options.prefix_cache { "on" } else { "off" }
        );
        let kv = KvLimit {
            budget,
            layout,
            page_rows: config.memory.page_rows,
            dtype: model.kv_dtype,
        };
        let model = Arc::new(model);
        let (tx, rx) = mpsc::channel::<Submit>();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let worker_model = Arc::clone(&model);
        let worker_in_flight = Arc::clone(&in_flight);
        std::thread::Builder::new()
            .name("lattice-generation".into())
            .spawn(move || run(&worker_model, config, rx, &worker_in_flight, &metrics))
            .expect("cannot start the generation thread");
        Generator {
            model,
            submit: tx,
            in_flight,
            capacity: max_running.max(1) + max_queue,
            kv,
        }
    }

    /// Queues `requests` (the choices of one HTTP request; validated by the caller) and returns
    /// the receiver of their events. Refuses with 429 when the queue is full, and with 400 a
    /// request larger than the whole capacity or a sequence that could never fit in the KV
    /// memory budget.
    pub fn submit(
        &self,
        requests: Vec<GenerateRequest>,
    ) -> Result<UnboundedReceiver<GenEvent>, ApiError> {
        let n = requests.len();
        if n > self.capacity {
            return Err(ApiError::invalid_param(
                "n",
                format!(
                    "the request asks for {n} sequences (prompts x n); this server runs at most {} at once",
                    self.capacity
                ),
            ));
        }
        if let Some(r) = requests
            .iter()
            .find(|r| self.kv.need(r.prompt_ids.len(), r.max_tokens) > self.kv.budget)
        {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "a sequence of {} prompt tokens and up to {} generated ones needs {} bytes of KV memory; this server's budget (--kv-cache-memory) is {} bytes",
                    r.prompt_ids.len(),
                    r.max_tokens,
                    self.kv.need(r.prompt_ids.len(), r.max_tokens),
                    self.kv.budget
                ),
            ));
        }
        let before = self.in_flight.fetch_add(n, Ordering::SeqCst);
        if before + n > self.capacity {
            self.in_flight.fetch_sub(n, Ordering::SeqCst);
            return Err(ApiError::overloaded(self.capacity));
        }
        let (events, rx) = unbounded_channel();
        if self.submit.send(Submit { requests, events }).is_err() {
            self.in_flight.fetch_sub(n, Ordering::SeqCst);
            return Err(ApiError::unavailable("the generation engine has stopped"));
        }
        Ok(rx)
    }
}

/// Who gets a running request's events.
struct Owner {
    events: UnboundedSender<GenEvent>,
    index: usize,
}

/// The scheduler loop: admit submissions, drop abandoned requests, step, send events.
fn run(
    model: &TextModel,
    config: EngineConfig,
    rx: mpsc::Receiver<Submit>,
    in_flight: &AtomicUsize,
    metrics: &Metrics,
) {
    let mut engine = BatchEngine::with_config(model, config);
    let mut owners: HashMap<u64, Owner> = HashMap::new();
    let admit = |s: Submit, engine: &mut BatchEngine<'_>, owners: &mut HashMap<u64, Owner>| {
        let n = s.requests.len();
        let mut ids = Vec::with_capacity(n);
        for (index, req) in s.requests.into_iter().enumerate() {
            metrics.prompt_tokens(req.prompt_ids.len());
            match engine.submit(req) {
                Ok(id) => ids.push((id, index)),
                Err(e) => {
                    // Validated by the handler, so this is unexpected: fail the whole request.
                    for (id, _) in ids.drain(..) {
                        engine.cancel(id);
                    }
                    let _ = s.events.send(GenEvent::Failed(e.to_string()));
                    in_flight.fetch_sub(n, Ordering::SeqCst);
                    return;
                }
            }
        }
        for (id, index) in ids {
            owners.insert(
                id,
                Owner {
                    events: s.events.clone(),
                    index,
                },
            );
        }
    };
    loop {
        if engine.pending() == 0 {
            metrics.scheduler(0, 0);
            metrics.memory(&engine.memory_stats());
            match rx.recv() {
                Ok(s) => admit(s, &mut engine, &mut owners),
                Err(_) => return, // every handle dropped: the server is shutting down
            }
        }
        while let Ok(s) = rx.try_recv() {
            admit(s, &mut engine, &mut owners);
        }
        let gone: Vec<u64> = owners
            .iter()
            .filter(|(_, o)| o.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            owners.remove(&id);
            if let Some(g) = engine.cancel(id) {
                metrics.generation_tokens(g.token_ids.len());
            }
            in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        if engine.pending() == 0 {
            continue;
        }
        let mut stepped = 0usize;
        let result = engine.step_with(&mut |u| {
            stepped += 1;
            let Some(o) = owners.get(&u.id) else {
                return false;
            };
            o.events
                .send(GenEvent::Delta {
                    index: o.index,
                    text: u.text.to_string(),
                    logprobs: u.logprobs.to_vec(),
                })
                .is_ok()
        });
        if stepped > 0 {
            metrics.batch_size(stepped);
        }
        metrics.scheduler(engine.waiting(), engine.running());
        metrics.memory(&engine.memory_stats());
        match result {
            Ok(finished) => {
                for (id, generation) in finished {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    metrics.generation_tokens(generation.token_ids.len());
                    metrics.drafts(generation.drafted_tokens, generation.accepted_tokens);
                    if let Some(o) = owners.remove(&id) {
                        let event = match &generation.error {
                            // A failed constraint: the text is not a complete output.
                            Some(e) => GenEvent::Failed(format!("output constraint failed: {e}")),
                            None => GenEvent::Done {
                                index: o.index,
                                generation,
                            },
                        };
                        let _ = o.events.send(event);
                    }
                }
            }
            Err(e) => {
                // A failed forward pass leaves the batch's states unknown: end every request.
                let message = format!("generation failed: {e}");
                for (id, o) in owners.drain() {
                    engine.cancel(id);
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    let _ = o.events.send(GenEvent::Failed(message.clone()));
                }
            }
        }
    }
}
