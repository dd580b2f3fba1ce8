//! Tokenizers (placeholder).
