//! Compute backends. Only `cpu` exists today; it is the one place in the crate that holds
//! intrinsics and `unsafe` SIMD code. Everything above (ops, attention, models) calls the safe
//! functions exported here and never learns which instruction set ran.

pub mod cpu;
