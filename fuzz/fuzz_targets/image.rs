#![no_main]
//! `lattice_inference::fuzz::image` on each input.
libfuzzer_sys::fuzz_target!(|data: &[u8]| lattice_inference::fuzz::image(data));
