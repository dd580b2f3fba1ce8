//! `lattice` with models named by hub id, against a fake hub on loopback (HF_ENDPOINT) with
//! a temporary HF_HOME: `lattice embed --model ORG/NAME` downloads then reuses the cache with
//! the server stopped; `lattice download`; offline mode and a missing repo fail clearly.

#[path = "../../hub/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{FakeHub, COMMIT, REPO};

fn lattice(args: &[&str], endpoint: &str, hf_home: &Path, offline: bool) -> Output {
    lattice_with_token(args, endpoint, hf_home, offline, None)
}

fn lattice_with_token(
    args: &[&str],
    endpoint: &str,
    hf_home: &Path,
    offline: bool,
    token: Option<&str>,
) -> Output {
    let mut cmd = hub_command(env!("CARGO_BIN_EXE_lattice"), args, endpoint, hf_home);
    if let Some(t) = token {
        cmd.env("HF_TOKEN", t);
    }
    if offline {
        cmd.env("HF_HUB_OFFLINE", "1");
    } else {
        cmd.env_remove("HF_HUB_OFFLINE");
    }
    cmd.output().expect("the lattice binary runs")
}

/// `program args` with the hub at `endpoint`, the cache under `hf_home`, no token, online.
fn hub_command<S: AsRef<std::ffi::OsStr>>(
    program: &str,
    args: &[S],
    endpoint: &str,
    hf_home: &Path,
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", hf_home)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE");
    cmd
}

fn ok_stdout(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "lattice failed: {err}");
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn embedding(stdout: &str) -> Vec<f64> {
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    v["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn embed_by_hub_id_downloads_once_then_works_offline() {
    let home = tempfile::tempdir().unwrap();
    let mut hub = FakeHub::start();
    let args = ["embed", "--model", REPO, "a hub model, fetched once"];

    let first = ok_stdout(&lattice(&args, &hub.endpoint, home.path(), false));
    let v = embedding(&first);
    assert_eq!(v.len(), 384);
    let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    // The same vector as from the local folder.
    let local = common::minilm_dir();
    let direct = ok_stdout(&lattice(
        &[
            "embed",
            "--model",
            local.to_str().unwrap(),
            "a hub model, fetched once",
        ],
        &hub.endpoint,
        home.path(),
        false,
    ));
    assert_eq!(first, direct);
    let snap = home
        .path()
        .join("hub/models--sentence-transformers--all-MiniLM-L6-v2/snapshots")
        .join(COMMIT);
    assert!(snap.join("model.safetensors").is_file());

    // Second time: no server, then offline mode too.
    hub.stop();
    let again = ok_stdout(&lattice(&args, &hub.endpoint, home.path(), false));
    assert_eq!(again, first);
    let offline = ok_stdout(&lattice(&args, &hub.endpoint, home.path(), true));
    assert_eq!(offline, first);
}

#[test]
fn download_command_and_clear_failures() {
    let home = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();

    // Offline with an empty cache: a clear error, no request.
    let o = lattice(
        &["embed", "--model", REPO, "x"],
        &hub.endpoint,
        home.path(),
        true,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("HF_HUB_OFFLINE") && err.contains(REPO),
        "{err}"
    );
    assert!(hub.seen().is_empty());

    // A repo the hub does not have.
    let o = lattice(
        &["embed", "--model", "nobody/nothing", "x"],
        &hub.endpoint,
        home.path(),
        false,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("nobody/nothing") && err.contains("not found"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // `lattice download --include` prints the snapshot folder.
    let out = ok_stdout(&lattice(
        &[
            "download",
            REPO,
            "--include",
            "*.json",
            "--revision",
            "main",
        ],
        &hub.endpoint,
        home.path(),
        false,
    ));
    let dir = Path::new(out.trim());
    assert!(dir.ends_with(COMMIT), "{out}");
    assert!(dir.join("config.json").is_file() && dir.join("1_Pooling/config.json").is_file());
    assert!(!dir.join("model.safetensors").exists());
    let err = lattice(
        &["download", "not a valid id"],
        &hub.endpoint,
        home.path(),
        false,
    );
    assert!(!err.status.success());

    // A gated repo: 401 without HF_TOKEN, fetched with it.
    hub.rules.lock().unwrap().token = Some("hf_test_token".into());
    let home2 = tempfile::tempdir().unwrap();
    let args = ["download", REPO, "--include", "config.json"];
    let o = lattice(&args, &hub.endpoint, home2.path(), false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("401") && err.contains("HF_TOKEN"),
        "{err}"
    );
    let o = lattice_with_token(
        &args,
        &hub.endpoint,
        home2.path(),
        false,
        Some("hf_test_token"),
    );
    let out = ok_stdout(&o);
    assert!(Path::new(out.trim()).join("config.json").is_file(), "{out}");
}

/// Faults while downloading (issue 19): a `lattice download` killed with SIGKILL in the middle
/// of the weights, and one whose disk fills up (a file-size limit: writes fail with EFBIG),
/// leave only an `.incomplete` transfer — never a finished blob, never a file in the snapshot —
/// and the next run resumes from it and verifies the whole file.
#[test]
fn kill_9_and_a_full_disk_leave_no_corrupt_file_and_resume() {
    let home = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let weights = common::minilm_files()
        .iter()
        .find(|f| f.name == "model.safetensors")
        .unwrap();
    let at = 8 << 20;
    hub.rules.lock().unwrap().stall = Some(("model.safetensors".into(), at));
    let lattice_bin = env!("CARGO_BIN_EXE_lattice");
    let mut child = hub_command(lattice_bin, &["download", REPO], &hub.endpoint, home.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !common::blob_state(&home.path().join("hub")).0.contains(&at) {
        assert!(
            t0.elapsed().as_secs() < 30,
            "the transfer never reached {at} bytes: {:?}",
            common::blob_state(&home.path().join("hub"))
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    hub.rules.lock().unwrap().stall = None;
    let (partial, done) = common::blob_state(&home.path().join("hub"));
    assert_eq!(partial, vec![at], "after kill -9");
    assert!(
        !done.contains(&weights.etag),
        "a finished blob after kill -9: {done:?}"
    );

    // The disk fills up: a 12 MiB file-size limit (SIGXFSZ ignored, so writes fail with EFBIG).
    let limited = "trap '' XFSZ; ulimit -f 12288; exec \"$0\" download \"$1\"";
    let o = hub_command(
        "bash",
        &["-c", limited, lattice_bin, REPO],
        &hub.endpoint,
        home.path(),
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the download succeeded past the limit");
    eprintln!("full disk: {}", err.trim());
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("model.safetensors") || err.contains("incomplete"),
        "the error does not name the file: {err}"
    );
    let (partial, done) = common::blob_state(&home.path().join("hub"));
    assert!(
        !done.contains(&weights.etag),
        "a finished blob after a full disk: {done:?}"
    );
    assert!(
        partial.iter().all(|&n| n <= 12 << 20),
        "partial {partial:?}"
    );

    // The next run resumes where the transfer stopped and checks the hash.
    let out = ok_stdout(&lattice(
        &["download", REPO],
        &hub.endpoint,
        home.path(),
        false,
    ));
    let snapshot = Path::new(out.trim());
    let got = std::fs::read(snapshot.join("model.safetensors")).unwrap();
    assert_eq!(got, std::fs::read(&weights.disk).unwrap());
    let resumed = hub
        .seen()
        .iter()
        .any(|s| s.path.ends_with("model.safetensors") && s.range.is_some());
    assert!(resumed, "no ranged request: the transfer restarted from 0");
    let (partial, _) = common::blob_state(&home.path().join("hub"));
    assert!(
        partial.is_empty(),
        "leftover partial transfers: {partial:?}"
    );
}
