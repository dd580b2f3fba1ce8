//! Helpers shared by the binary's integration tests: running `lattice`, the committed fixtures,
//! the fetched models, and the clean-failure check.
#![allow(dead_code)] // each test file uses its own subset

pub mod server;

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `lattice` binary with `args` and returns its output, whatever the exit status.
pub fn lattice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lattice"))
        .args(args)
        .output()
        .expect("the lattice binary runs")
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A committed fixture folder of crates/inference/tests/fixtures.
pub fn fixture(name: &str) -> PathBuf {
    repo_root()
        .join("crates/inference/tests/fixtures")
        .join(name)
}

/// A model fetched by scripts/fetch_models.sh into .cache/models (`probe`: a file that must be
/// there, relative to the model path; empty for a single-file model).
pub fn fetched_model(name: &str, probe: &str) -> PathBuf {
    let p = repo_root().join(".cache/models").join(name);
    let file = if probe.is_empty() {
        p.clone()
    } else {
        p.join(probe)
    };
    assert!(
        file.is_file(),
        "{} is missing: run scripts/fetch_models.sh",
        p.display()
    );
    p
}

/// Standard output as UTF-8.
pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Standard error, lossily decoded.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a clean failure (non-zero exit, no panic) whose message contains every `needle`.
pub fn assert_fails_with(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert!(
        !err.contains("panicked"),
        "panic instead of an error: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks `{n}`: {err}");
    }
}
