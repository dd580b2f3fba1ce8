//! Text generation over a loaded model: [`TextModel`] bundles a decoder with its tokenizer,
//! chat template and stop tokens (from a model folder or a GGUF file), and [`generate`] runs
//! one request: prefill the prompt as one batched pass, then one-token decode steps through the
//! sampler, detokenizing incrementally and watching stop tokens and stop strings.

mod generate;
mod text_model;

pub use generate::{
    generate, generate_in, FinishReason, GenerateRequest, Generation, Session, TokenLogprob,
};
pub use text_model::TextModel;
