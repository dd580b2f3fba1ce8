//! Reading model files: safetensors through mmap (no copy for f32), sharded checkpoints, the
//! [`store::WeightStore`] that maps tensor names to typed views with scoped prefixes, and GGUF
//! metadata. Every offset read from a file is bounds-checked before use.

pub mod gguf;
pub mod mmap;
pub mod safetensors;
pub mod store;
