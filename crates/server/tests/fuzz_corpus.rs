//! Replays the request fuzz corpus (`fuzz/corpus/openai_request`) and past findings
//! (`fuzz/regressions/openai_request`) through `lattice_server::fuzz::request`, on the stable
//! toolchain: every body gets an answer that is not a server error, and nothing panics.

use std::path::Path;

#[test]
fn openai_request_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let n = lattice_inference::fuzz::replay(&dir, "openai_request", lattice_server::fuzz::request);
    eprintln!("openai_request: {n} inputs replayed");
}
