//! Text generation over a loaded model. [`TextModel`] bundles a decoder with its tokenizer,
//! chat template and stop tokens (from a model folder or a GGUF file). Every request runs
//! through [`BatchEngine`], one loop of steps: the scheduler (`scheduler.rs`) picks who runs
//! how many tokens within the token, sequence and memory budgets; one forward pass runs them;
//! the results are sampled and streamed ([`Sequence`]: one request's sampler, detokenizer and
//! stop matcher). [`KvMemory`] owns the page pool and the prefix cache. [`generate`] and
//! [`generate_in`] (a chat [`Session`]) are a batch of one through the same engine. The
//! request vocabulary ([`GenerateRequest`], [`Generation`], ...) lives in `request.rs`;
//! speculative drafts (prompt lookup in `speculate.rs`, suffix matches in `suffix.rs`,
//! verified in the batch).

mod batch;
mod generate;
mod memory;
mod multimodal;
mod request;
mod scheduler;
mod sequence;
mod speculate;
mod suffix;
mod text_model;

pub use batch::{BatchEngine, EngineConfig, KeptState, StepUpdate};
pub use generate::{generate, generate_in, Session};
pub use memory::{available_memory, default_budget, KvMemory, MemoryConfig, MemoryStats};
pub use multimodal::VisionModel;
pub use request::{FinishReason, GenerateRequest, Generation, TokenLogprob};
pub use sequence::Sequence;
pub use speculate::Drafter;
pub use suffix::{suffix_draft, SuffixCache, SuffixIndex};
pub use text_model::TextModel;
