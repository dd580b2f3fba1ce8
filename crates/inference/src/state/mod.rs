//! Per-sequence memory that outlives one forward pass: the keys and values of the tokens a
//! decoder has already seen ([`KvCache`]). A sequence's state can be extended, truncated back
//! to a shorter prefix, and cloned as a snapshot.

mod kv;

pub use kv::KvCache;
