//! Per-sequence memory that outlives one forward pass ([`SeqState`]): the keys and values of the
//! tokens an attention layer has seen (a KV cache), and for recurrent layers (Gated DeltaNet)
//! their convolution window and recurrent state. A sequence's state can be extended, cloned as a
//! snapshot and restored; attention-only states can also be truncated back to a prefix. Keys and
//! values are stored as f32 or, to halve their memory and bandwidth, f16 ([`KvDtype`]).

mod seq;
mod view;

pub use seq::{KvDtype, LayerKind, SeqState};
pub use view::{KvRows, KvView};
