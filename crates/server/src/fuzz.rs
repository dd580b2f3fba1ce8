//! Entry point for the request fuzz target (`fuzz/fuzz_targets/openai_request.rs`) and its
//! corpus-replay test: arbitrary bytes sent as the body of one of the routes of a server
//! holding tiny models (the repo's test fixtures), answered to the end. Every request must get
//! an answer that is not a server error; a panic, a hang or a 5xx is a finding.

use std::path::PathBuf;
use std::sync::OnceLock;

use axum::body::Body;
use axum::http::Request;
use lattice_embed::{Embedder, EmbedderOptions, Reranker};
use lattice_inference::engine::TextModel;
use lattice_inference::model::source::WeightMode;
use tower::ServiceExt;

use crate::{Models, ServeOptions};

/// The routes a fuzz input may pick (its first byte, modulo their number).
pub const ROUTES: [&str; 9] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/embed",
    "/rerank",
    "/v1/rerank",
    "/tokenize",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
];

/// The fixtures folder: `LATTICE_FIXTURES`, else the inference crate's `tests/fixtures` as it
/// was when this was built.
fn fixtures() -> PathBuf {
    std::env::var_os("LATTICE_FIXTURES").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../inference/tests/fixtures"
            ))
        },
        PathBuf::from,
    )
}

/// The router over a server state (tiny Qwen3 generating at most 4 tokens, tiny BERT
/// embeddings, tiny cross-encoder) and a runtime, built once per process.
fn server() -> &'static (axum::Router, tokio::runtime::Runtime) {
    static SERVER: OnceLock<(axum::Router, tokio::runtime::Runtime)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = fixtures();
        let load = |what: &str| dir.join(what);
        let models = Models {
            generation: Some((
                vec!["tiny".into()],
                TextModel::load(&load("tiny-qwen3"), WeightMode::F32).expect("tiny-qwen3 loads"),
            )),
            embedding: Some((
                vec!["bert".into()],
                Embedder::load_dir(&load("tiny-bert"), EmbedderOptions::default())
                    .expect("tiny-bert loads"),
            )),
            rerank: Some((
                vec!["cross".into()],
                Reranker::load_dir(&load("tiny-cross-encoder")).expect("the cross-encoder loads"),
            )),
        };
        let options = ServeOptions {
            max_tokens: 4,
            max_running: 4,
            max_queue: 8,
            max_body_bytes: 1 << 16,
            kv_cache_memory: Some(16 << 20),
            lora_dir: Some(load("lora")),
            max_loras: 2,
            ..ServeOptions::default()
        };
        let state = crate::start(models, options).expect("the fuzz server starts");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        (crate::app::router(state), runtime)
    })
}

/// Sends the bytes after the first as the JSON body of `ROUTES[data[0] % 9]` and reads the
/// whole answer (streams included). Panics on a 5xx answer.
pub fn request(data: &[u8]) {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    let (router, runtime) = server();
    let path = ROUTES[route as usize % ROUTES.len()];
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    runtime.block_on(async {
        let response = router
            .clone()
            .oneshot(req)
            .await
            .expect("the router is infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("the answer reads to its end");
        assert!(
            !status.is_server_error(),
            "{path} answered {status}: {}",
            String::from_utf8_lossy(&bytes)
        );
    });
}
