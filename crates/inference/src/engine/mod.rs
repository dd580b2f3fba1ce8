//! Text generation over a loaded model: [`TextModel`] bundles a decoder with its tokenizer,
//! chat template and stop tokens (from a model folder or a GGUF file), and [`generate`] runs
//! one request: prefill the prompt as one batched pass, then one-token decode steps through the
//! sampler, detokenizing incrementally and watching stop tokens and stop strings.
//! [`Sequence`] is one request's decode-side state; [`BatchEngine`] runs many sequences with
//! continuous batching: every step is one forward pass over the prefill chunks of new requests
//! and the next token of every running one.

mod batch;
mod generate;
mod sequence;
mod text_model;

pub use batch::{BatchEngine, StepUpdate};
pub use generate::{
    generate, generate_in, FinishReason, GenerateRequest, Generation, Session, TokenLogprob,
};
pub use sequence::Sequence;
pub use text_model::TextModel;
