#![no_main]
//! `lattice_inference::fuzz::tokenizer_json` on each input.
libfuzzer_sys::fuzz_target!(|data: &[u8]| lattice_inference::fuzz::tokenizer_json(data));
