#![no_main]
//! `lattice_server::fuzz::request` on each input: a body for one of the server's routes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| lattice_server::fuzz::request(data));
