//! lattice-hub against a fake hub on loopback serving the real all-MiniLM-L6-v2 files:
//! download and cache layout, reuse without network, resume after a cut connection, corrupt
//! files caught by their hash, 404, 401 and the token, offline mode, `--include` patterns.

mod common;

use std::path::{Path, PathBuf};

use common::{minilm_files, FakeHub, COMMIT, REPO};
use lattice_hub::hash::{hash_file, HashKind};
use lattice_hub::{download, resolve_model_with, Error, HubConfig, RepoRef};

fn config(hub: &FakeHub, cache: &Path) -> HubConfig {
    HubConfig {
        endpoint: hub.endpoint.clone(),
        cache_dir: cache.to_path_buf(),
        token: None,
        offline: false,
        progress: false,
    }
}

fn repo_dir(cache: &Path) -> PathBuf {
    cache.join("models--sentence-transformers--all-MiniLM-L6-v2")
}

fn snapshot(cache: &Path) -> PathBuf {
    repo_dir(cache).join("snapshots").join(COMMIT)
}

fn main_ref() -> RepoRef {
    RepoRef::parse(REPO).unwrap()
}

/// Files left in `blobs/` whose name ends with `.incomplete`, with their sizes.
fn incomplete(cache: &Path) -> Vec<u64> {
    common::blob_state(cache).0
}

/// Every file a sentence-transformers model needs is in the snapshot with the source's exact
/// content; the repo's other files are not.
fn assert_complete_snapshot(dir: &Path) {
    let needed = [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "vocab.txt",
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "1_Pooling/config.json",
    ];
    for f in minilm_files() {
        let got = dir.join(&f.name);
        if needed.contains(&f.name.as_str()) {
            let kind = if f.lfs {
                HashKind::Sha256
            } else {
                HashKind::GitSha1
            };
            assert_eq!(hash_file(&got, kind).unwrap(), f.etag, "{}", f.name);
        } else {
            assert!(!got.exists(), "{} should not be fetched", f.name);
        }
    }
}

#[test]
fn downloads_then_reuses_the_cache_without_network() {
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = FakeHub::start();
    let cfg = config(&hub, tmp.path());

    let dir = resolve_model_with(REPO, &cfg).unwrap();
    assert_eq!(dir, snapshot(tmp.path()));
    assert_complete_snapshot(&dir);
    // The layout huggingface_hub writes: refs/main, blobs by hash, relative symlinks.
    let refs = std::fs::read_to_string(repo_dir(tmp.path()).join("refs/main")).unwrap();
    assert_eq!(refs, COMMIT);
    let weights = minilm_files()
        .iter()
        .find(|f| f.name == "model.safetensors")
        .unwrap();
    #[cfg(unix)]
    {
        let target = std::fs::read_link(dir.join("model.safetensors")).unwrap();
        assert_eq!(target, Path::new("../../blobs").join(&weights.etag));
        let pooling = std::fs::read_link(dir.join("1_Pooling/config.json")).unwrap();
        assert!(
            pooling.starts_with("../../../blobs"),
            "{}",
            pooling.display()
        );
    }
    assert!(repo_dir(tmp.path())
        .join("blobs")
        .join(&weights.etag)
        .is_file());
    assert!(incomplete(tmp.path()).is_empty());
    // One transfer of the weights in all.
    let served: u64 = hub
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/cdn/"))
        .map(|s| s.body_bytes)
        .sum();
    assert_eq!(served, weights.size);

    // A complete snapshot is used without asking the hub at all.
    let n_seen = hub.seen().len();
    assert_eq!(resolve_model_with(REPO, &cfg).unwrap(), dir);
    assert_eq!(hub.seen().len(), n_seen);

    // With the server gone, online and offline.
    hub.stop();
    assert_eq!(resolve_model_with(REPO, &cfg).unwrap(), dir);
    let offline = HubConfig {
        offline: true,
        ..cfg.clone()
    };
    assert_eq!(resolve_model_with(REPO, &offline).unwrap(), dir);
    assert_eq!(download(&offline, &main_ref(), &[]).unwrap().dir, dir);
    // An explicit download needs the hub, and says so.
    let err = download(&cfg, &main_ref(), &[]).unwrap_err();
    assert!(matches!(err, Error::Network { .. }), "{err}");
    assert!(err.to_string().contains(REPO), "{err}");
}

#[test]
fn resumes_after_a_cut_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let cfg = config(&hub, tmp.path());
    let weights = minilm_files()
        .iter()
        .find(|f| f.name == "model.safetensors")
        .unwrap();

    // Cut once at 30 MB: the same call resumes from there with a Range request.
    let at = 30_000_000u64;
    hub.rules.lock().unwrap().cut = Some(("model.safetensors".into(), at, 1));
    let snap = download(&cfg, &main_ref(), &[]).unwrap();
    assert_complete_snapshot(&snap.dir);
    let cdn: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.path.starts_with("/cdn/"))
        .collect();
    assert_eq!(cdn.len(), 2, "{cdn:?}");
    assert_eq!(cdn[0].range, None);
    assert_eq!(cdn[0].body_bytes, at);
    assert_eq!(
        cdn[1].range.as_deref(),
        Some(format!("bytes={at}-").as_str())
    );
    assert_eq!(cdn[0].body_bytes + cdn[1].body_bytes, weights.size);
}

#[test]
fn resumes_an_interrupted_download_on_the_next_call() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let cfg = config(&hub, tmp.path());
    let weights = minilm_files()
        .iter()
        .find(|f| f.name == "model.safetensors")
        .unwrap();

    // Every attempt of this call is cut at 20 MB: it fails, keeping the partial blob aside.
    let at = 20_000_000u64;
    hub.rules.lock().unwrap().cut = Some(("model.safetensors".into(), at, 100));
    let err = download(&cfg, &main_ref(), &[]).unwrap_err();
    assert!(matches!(err, Error::Network { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert_eq!(incomplete(tmp.path()), vec![at]);
    assert!(!snapshot(tmp.path()).join("model.safetensors").exists());
    let offline = HubConfig {
        offline: true,
        ..cfg.clone()
    };
    let err = resolve_model_with(REPO, &offline).unwrap_err();
    assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");

    // The next call fetches only the rest.
    hub.rules.lock().unwrap().cut = None;
    let n_before = hub.seen().len();
    let dir = resolve_model_with(REPO, &cfg).unwrap();
    assert_complete_snapshot(&dir);
    let cdn: Vec<_> = hub.seen()[n_before..]
        .iter()
        .filter(|s| s.path.starts_with("/cdn/"))
        .cloned()
        .collect();
    assert_eq!(cdn.len(), 1, "{cdn:?}");
    assert_eq!(
        cdn[0].range.as_deref(),
        Some(format!("bytes={at}-").as_str())
    );
    assert_eq!(cdn[0].body_bytes, weights.size - at);
    assert!(incomplete(tmp.path()).is_empty());
}

#[test]
fn corrupt_files_are_detected_and_never_used() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let cfg = config(&hub, tmp.path());

    // A small git file (sha1 etag).
    hub.rules
        .lock()
        .unwrap()
        .corrupt
        .insert("config.json".into());
    let err = resolve_model_with(REPO, &cfg).unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("config.json") && msg.contains("git-sha1") && msg.contains(REPO),
        "{msg}"
    );
    assert!(!snapshot(tmp.path()).join("config.json").exists());
    assert!(incomplete(tmp.path()).is_empty());

    // An LFS file (sha256 etag).
    {
        let mut r = hub.rules.lock().unwrap();
        r.corrupt.clear();
        r.corrupt.insert("model.safetensors".into());
    }
    let err = resolve_model_with(REPO, &cfg).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("sha256"),
        "{msg}"
    );
    assert!(!snapshot(tmp.path()).join("model.safetensors").exists());
    assert!(incomplete(tmp.path()).is_empty());
    let offline = HubConfig {
        offline: true,
        ..cfg.clone()
    };
    assert!(resolve_model_with(REPO, &offline).is_err());

    // Once the hub serves good bytes, the model completes.
    hub.rules.lock().unwrap().corrupt.clear();
    assert_complete_snapshot(&resolve_model_with(REPO, &cfg).unwrap());
}

#[test]
fn missing_repo_or_file_is_a_clear_404() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let cfg = config(&hub, tmp.path());

    let err = resolve_model_with("someone/no-such-model", &cfg).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("someone/no-such-model"), "{err}");

    let err = download(&cfg, &RepoRef::parse(&format!("{REPO}@v9")).unwrap(), &[]).unwrap_err();
    assert!(err.to_string().contains("revision `v9`"), "{err}");

    hub.rules
        .lock()
        .unwrap()
        .missing
        .insert("tokenizer.json".into());
    let err = resolve_model_with(REPO, &cfg).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(REPO) && msg.contains("`tokenizer.json`") && msg.contains("not found"),
        "{msg}"
    );
}

#[test]
fn token_is_required_and_sent() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    hub.rules.lock().unwrap().token = Some("hf_secret".into());
    let cfg = config(&hub, tmp.path());

    let err = resolve_model_with(REPO, &cfg).unwrap_err();
    assert!(
        matches!(err, Error::Unauthorized { status: 401, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("set HF_TOKEN"), "{err}");

    let wrong = HubConfig {
        token: Some("hf_wrong".into()),
        ..cfg.clone()
    };
    let err = resolve_model_with(REPO, &wrong).unwrap_err();
    assert!(err.to_string().contains("HF_TOKEN is set"), "{err}");

    let good = HubConfig {
        token: Some("hf_secret".into()),
        ..cfg.clone()
    };
    assert_complete_snapshot(&resolve_model_with(REPO, &good).unwrap());
}

#[test]
fn offline_mode_never_touches_the_network() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let cfg = HubConfig {
        offline: true,
        ..config(&hub, tmp.path())
    };
    let err = resolve_model_with(REPO, &cfg).unwrap_err();
    assert!(matches!(err, Error::NotCached { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(REPO) && msg.contains("HF_HUB_OFFLINE"),
        "{msg}"
    );
    let err = download(&cfg, &main_ref(), &[]).unwrap_err();
    assert!(matches!(err, Error::NotCached { .. }), "{err}");
    assert!(hub.seen().is_empty());
}

#[test]
fn include_patterns_pick_files_and_local_paths_win() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let cfg = config(&hub, tmp.path());
    let snap = download(&cfg, &main_ref(), &["*.json".to_string()]).unwrap();
    let jsons: Vec<&str> = minilm_files()
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert_eq!(snap.files, jsons);
    assert!(snap.dir.join("data_config.json").is_file());
    assert!(!snap.dir.join("model.safetensors").exists());
    // Not complete: resolution fetches the rest.
    let dir = resolve_model_with(REPO, &cfg).unwrap();
    assert_eq!(dir, snap.dir);
    assert!(lattice_hub::cache::missing_files(&dir).is_empty());
    assert!(dir.join("model.safetensors").is_file());

    let err = download(&cfg, &main_ref(), &["*.gguf".to_string()]).unwrap_err();
    assert!(err.to_string().contains("*.gguf"), "{err}");

    // A local folder is taken as is, without the hub.
    let local = common::minilm_dir();
    let n = hub.seen().len();
    assert_eq!(
        resolve_model_with(local.to_str().unwrap(), &cfg).unwrap(),
        local
    );
    assert_eq!(hub.seen().len(), n);
    let err = resolve_model_with("./no/such/dir", &cfg).unwrap_err();
    assert!(matches!(err, Error::InvalidModelId(_)), "{err}");
}

#[test]
fn concurrent_downloads_fetch_each_file_once() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = FakeHub::start();
    let cfg = config(&hub, tmp.path());
    let weights = minilm_files()
        .iter()
        .find(|f| f.name == "model.safetensors")
        .unwrap();
    let dirs: Vec<PathBuf> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..2)
            .map(|_| s.spawn(|| download(&cfg, &main_ref(), &[]).map(|snap| snap.dir)))
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap().unwrap())
            .collect()
    });
    assert_eq!(dirs[0], dirs[1]);
    assert_complete_snapshot(&dirs[0]);
    let served: u64 = hub
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/cdn/"))
        .map(|s| s.body_bytes)
        .sum();
    assert_eq!(served, weights.size);
    assert!(incomplete(tmp.path()).is_empty());
}
