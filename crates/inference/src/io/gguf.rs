//! GGUF reading (placeholder).
