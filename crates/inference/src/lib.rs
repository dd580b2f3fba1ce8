//! lattice-inference: the Lattice engine.
//!
//! Module map, from files on disk to outputs:
//! - [`io`]: safetensors through mmap (no copy for f32), sharded checkpoints, `WeightStore` with
//!   scoped prefixes; GGUF metadata.
//! - [`tokenizer`]: `tokenizer.json` / `vocab.txt` → normalize → pre-tokenize → WordPiece →
//!   post-process (special tokens, pairs, truncation, offsets).
//! - [`sentencepiece`]: SentencePiece `.model` files: protobuf, charsmap normalizer, Unigram.
//! - [`backend`]: the device seam ([`backend::Device`]): CPU kernels behind runtime SIMD dispatch,
//!   and (feature `cuda`) NVRTC-compiled CUDA kernels and cuBLAS; the only place with intrinsics.
//! - [`tensor`]: activations on a device ([`tensor::Tensor`]); ops dispatch on where they live.
//! - [`ops`]: shape-checked safe ops over the kernels (linear, norms, activations).
//! - [`attention`]: packed variable-length scaled dot-product attention.
//! - [`model`]: one file per architecture (BERT, MPNet) written as calls to ops, plus heads
//!   (pooling, sequence-classification score).
//! - [`vision`]: images for vision-language models: decoding, the reference processor's resize,
//!   normalization and patches.
//! - [`metrics`]: per-layer statistics of forward passes (`--metrics layers`, ShortGPT's block
//!   influence), off by default.
//! - [`perplexity`]: a decoder's perplexity over a text, as llama.cpp's `llama-perplexity`.
//! - [`prune`]: ShortGPT layer pruning by block influence, written as GGUF.
//! - [`quantize`]: re-quantizing a GGUF decoder: plain block types and QuaRot (rotated residual
//!   stream, 4-bit weights, int8 activations).
//! - [`fuzz`]: the entry points of the fuzz targets (`fuzz/`) over every parser of untrusted
//!   bytes.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod attention;
pub mod backend;
pub mod chat;
pub mod engine;
pub mod error;
pub mod fuzz;
pub mod grammar;
pub mod io;
pub mod lora;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod perplexity;
pub mod prune;
pub mod quant;
pub mod quantize;
pub mod sample;
pub mod sentencepiece;
pub mod state;
pub mod tensor;
pub mod tokenizer;
pub mod vision;

pub use error::{Error, Result};
