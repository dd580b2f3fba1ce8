//! Reading model files: safetensors through mmap (no copy for f32), sharded checkpoints, the
//! [`store::WeightStore`] that maps tensor names to typed views with scoped prefixes, and GGUF
//! files (header and metadata in [`gguf`], tensor data in [`gguf_tensors`]). Every offset read from a file is bounds-checked before use.

pub mod gguf;
pub mod gguf_tensors;
pub mod gguf_write;
pub mod mmap;
pub mod safetensors;
pub mod store;
