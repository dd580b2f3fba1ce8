//! The embedding batcher: one thread owns the [`Embedder`]; handlers send tokenized texts and
//! wait for their vectors. Requests that arrive while a batch runs are merged into the next
//! one, up to a token budget (as text-embeddings-inference does), and run as one packed
//! variable-length forward pass. A request whose client went away is skipped.

use std::sync::mpsc;
use std::sync::Arc;

use lattice_embed::Embedder;
use tokio::sync::oneshot;

use crate::error::ApiError;
use crate::metrics::Metrics;

struct Job {
    ids: Vec<Vec<u32>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
}

/// A handle to the batching thread.
pub struct EmbedService {
    /// The model (tokenizer, limits) for building requests.
    pub embedder: Arc<Embedder>,
    jobs: mpsc::Sender<Job>,
}

impl EmbedService {
    /// Starts the batching thread; a batch holds at most `max_batch_tokens` tokens (one
    /// request larger than that still runs, split by the embedder).
    pub fn start(embedder: Embedder, max_batch_tokens: usize, metrics: Arc<Metrics>) -> Self {
        let embedder = Arc::new(embedder);
        let (tx, rx) = mpsc::channel::<Job>();
        let worker = Arc::clone(&embedder);
        std::thread::Builder::new()
            .name("lattice-embedding".into())
            .spawn(move || run(&worker, max_batch_tokens.max(1), rx, &metrics))
            .expect("cannot start the embedding thread");
        Self { embedder, jobs: tx }
    }

    /// Embeds already tokenized texts (each within the model's limit).
    pub async fn embed(&self, ids: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Job { ids, reply })
            .map_err(|_| ApiError::unavailable("the embedding engine has stopped"))?;
        rx.await
            .map_err(|_| ApiError::unavailable("the embedding engine has stopped"))?
    }
}

fn run(embedder: &Embedder, budget: usize, rx: mpsc::Receiver<Job>, metrics: &Metrics) {
    let mut pending: Option<Job> = None;
    loop {
        let first = match pending.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
        };
        let mut tokens: usize = first.ids.iter().map(Vec::len).sum();
        let mut jobs = vec![first];
        while tokens < budget {
            match rx.try_recv() {
                Ok(j) => {
                    let n: usize = j.ids.iter().map(Vec::len).sum();
                    if tokens + n > budget {
                        pending = Some(j);
                        break;
                    }
                    tokens += n;
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        jobs.retain(|j| !j.reply.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let all: Vec<Vec<u32>> = jobs.iter().flat_map(|j| j.ids.iter().cloned()).collect();
        metrics.embed_batch_size(all.len());
        metrics.embedding_tokens(all.iter().map(Vec::len).sum());
        match embedder.embed_ids(&all) {
            Ok(vectors) => {
                let mut vectors = vectors.into_iter();
                for j in jobs {
                    let mine: Vec<Vec<f32>> = vectors.by_ref().take(j.ids.len()).collect();
                    let _ = j.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                let e = ApiError::from(e);
                for j in jobs {
                    let _ = j.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
