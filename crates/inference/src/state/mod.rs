//! Per-sequence memory that outlives one forward pass, behind one interface:
//! [`SeqState`] (one sequence: a page table over a [`PagePool`] for the attention layers' keys
//! and values, and the convolution window and recurrent matrices of recurrent layers, Gated
//! DeltaNet), [`KvView`] (what attention kernels read of it), [`PagePool`] (fixed-size,
//! reference-counted pages under one byte budget) and [`PrefixCache`] (pages of earlier
//! sequences keyed by their tokens, reused by new sequences that start with the same tokens).
//! Keys and values are stored as f32 or, to halve their memory and bandwidth, f16 ([`KvDtype`]).

mod pool;
mod prefix;
mod seq;
mod view;

pub use pool::{Charge, Page, PagePool, PageRef, PageShape, DEFAULT_PAGE_ROWS};
pub use prefix::{PrefixCache, PrefixHit, PrefixStats};
pub use seq::{KvDtype, LayerKind, MemoryLayout, RecurrentSnapshot, SeqState};
pub use view::{KvRows, KvView};
