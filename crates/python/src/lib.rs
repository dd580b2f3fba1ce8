//! `lattice._lattice`: the Python extension over the Lattice crates. Each class owns its engine
//! (and, when asked for a thread count, its own worker pool); every call releases the GIL while
//! it computes, and engine errors become Python exceptions carrying the engine's message
//! (`FileNotFoundError` for missing files and models, `ValueError` for bad input, `RuntimeError`
//! otherwise). The Python package (`python/lattice/__init__.py`) wraps these classes into numpy
//! arrays and the sentence-transformers / HF tokenizers shapes.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use lattice_embed::{EmbedderOptions, TextKind};
use lattice_inference::backend::Device;
use lattice_inference::chat::{ChatMessage, RenderOptions};
use lattice_inference::engine::{generate, BatchEngine, GenerateRequest, TextModel};
use lattice_inference::grammar::Spec;
use lattice_inference::model::source::{Placement, WeightMode};
use lattice_inference::sample::SamplingParams;
use lattice_inference::state::KvDtype;
use lattice_inference::tokenizer::Tokenizer as EngineTokenizer;
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// What kind of Python exception an engine error is.
enum Kind {
    Missing,
    Value,
    Runtime,
}

fn py_err(kind: Kind, message: String) -> PyErr {
    match kind {
        Kind::Missing => PyFileNotFoundError::new_err(message),
        Kind::Value => PyValueError::new_err(message),
        Kind::Runtime => PyRuntimeError::new_err(message),
    }
}

/// The exception for an inference-crate error.
fn inference_err(e: lattice_inference::Error) -> PyErr {
    use lattice_inference::Error as E;
    let kind = match &e {
        E::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Kind::Missing,
        E::InvalidInput(_) => Kind::Value,
        _ => Kind::Runtime,
    };
    py_err(kind, e.to_string())
}

/// The exception for an embedding-crate error.
fn embed_err(e: lattice_embed::Error) -> PyErr {
    match e {
        lattice_embed::Error::Inference(e) => inference_err(e),
        lattice_embed::Error::UnknownModel(_) => py_err(Kind::Missing, e.to_string()),
        lattice_embed::Error::InvalidInput(_) => py_err(Kind::Value, e.to_string()),
        other => py_err(Kind::Runtime, other.to_string()),
    }
}

/// The exception for a hub error (a model id that is not cached and cannot be fetched).
fn hub_err(e: lattice_hub::Error) -> PyErr {
    let kind = match &e {
        lattice_hub::Error::InvalidModelId(_) | lattice_hub::Error::NotFound { .. } => {
            Kind::Missing
        }
        _ => Kind::Runtime,
    };
    py_err(kind, e.to_string())
}

/// A model folder or file from a path or a hub id, as the CLI resolves it.
fn resolve(model: &str) -> PyResult<PathBuf> {
    let path = Path::new(model);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    lattice_hub::resolve_model(model).map_err(hub_err)
}

/// An optional worker pool of `threads` threads (`None`: the global pool, all cores); both
/// flush subnormal floats to zero (`lattice_inference::backend::cpu::pool_builder`).
#[derive(Clone)]
struct Pool(Option<Arc<rayon::ThreadPool>>);

impl Pool {
    fn new(threads: Option<usize>) -> PyResult<Self> {
        match threads {
            None => Ok(Self(None)),
            Some(0) => Err(PyValueError::new_err("threads must be at least 1")),
            Some(n) => lattice_inference::backend::cpu::pool_builder(Some(n))
                .map_err(inference_err)?
                .build()
                .map(|p| Self(Some(Arc::new(p))))
                .map_err(|e| PyRuntimeError::new_err(format!("cannot start {n} threads: {e}"))),
        }
    }

    /// Runs `f` on this pool, without the GIL.
    fn run<R: Send>(&self, py: Python<'_>, f: impl FnOnce() -> R + Send) -> R {
        py.detach(|| match &self.0 {
            Some(p) => p.install(f),
            None => f(),
        })
    }
}

fn device(name: &str) -> PyResult<Device> {
    Device::open(name).map_err(inference_err)
}

/// Little-endian f32 bytes of `rows` (each `dim` long), for `numpy.frombuffer`.
fn matrix_bytes<'py>(py: Python<'py>, rows: &[Vec<f32>]) -> Bound<'py, PyBytes> {
    let mut out = Vec::with_capacity(rows.iter().map(|r| r.len() * 4).sum());
    for r in rows {
        for v in r {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    PyBytes::new(py, &out)
}

/// The weight mode of an encoder's `bf16` / `q8` arguments (at most one).
fn encoder_mode(bf16: bool, q8: bool) -> PyResult<lattice_embed::WeightMode> {
    use lattice_embed::WeightMode;
    match (bf16, q8) {
        (true, true) => Err(PyValueError::new_err("give at most one of bf16 and q8")),
        (true, false) => Ok(WeightMode::Bf16),
        (false, true) => Ok(WeightMode::Q8),
        (false, false) => Ok(WeightMode::F32),
    }
}

/// A sentence-embedding model (BERT family, Qwen3-Embedding, ...).
#[pyclass(frozen, module = "lattice._lattice")]
struct Embedder {
    inner: Arc<lattice_embed::Embedder>,
    pool: Pool,
}

#[pymethods]
impl Embedder {
    #[new]
    #[pyo3(signature = (model, *, device="cpu", threads=None, max_batch_tokens=16384,
                        bf16=false, q8=false))]
    fn new(
        py: Python<'_>,
        model: &str,
        device: &str,
        threads: Option<usize>,
        max_batch_tokens: usize,
        bf16: bool,
        q8: bool,
    ) -> PyResult<Self> {
        let pool = Pool::new(threads)?;
        let options = EmbedderOptions {
            max_batch_tokens: max_batch_tokens.max(1),
            dimensions: None,
            device: self::device(device)?,
            mode: encoder_mode(bf16, q8)?,
        };
        let model = model.to_owned();
        let inner = pool
            .run(py, move || {
                let dir = lattice_embed::resolve_model_dir(&model)?;
                lattice_embed::Embedder::load_dir(&dir, options)
            })
            .map_err(embed_err)?;
        Ok(Self {
            inner: Arc::new(inner),
            pool,
        })
    }

    /// Width of the vectors.
    #[getter]
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// Whether the model's own pipeline L2-normalizes its vectors.
    #[getter]
    fn normalizes(&self) -> bool {
        self.inner.normalizes()
    }

    /// Most tokens of one text (longer texts are truncated, as sentence-transformers does).
    #[getter]
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }

    /// `(little-endian f32 bytes, rows, dim)` of the texts' vectors.
    #[pyo3(signature = (texts, kind="plain", batch_size=None, normalize=false, dimensions=None))]
    fn embed_bytes<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        kind: &str,
        batch_size: Option<usize>,
        normalize: bool,
        dimensions: Option<usize>,
    ) -> PyResult<(Bound<'py, PyBytes>, usize, usize)> {
        let kind = match kind {
            "plain" => TextKind::Plain,
            "query" => TextKind::Query,
            "passage" => TextKind::Passage,
            other => {
                return Err(PyValueError::new_err(format!(
                    "kind must be plain, query or passage, not {other:?}"
                )))
            }
        };
        if batch_size == Some(0) {
            return Err(PyValueError::new_err("batch_size must be at least 1"));
        }
        let full = self.inner.dim();
        let dim = match dimensions {
            Some(d) if d == 0 || d > full => {
                return Err(PyValueError::new_err(format!(
                    "dimensions must be in 1..={full} (the model's width), not {d}"
                )))
            }
            Some(d) => d,
            None => full,
        };
        let inner = Arc::clone(&self.inner);
        let vectors = self
            .pool
            .run(py, move || -> lattice_embed::Result<Vec<Vec<f32>>> {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let step = batch_size.unwrap_or(refs.len().max(1));
                let mut out = Vec::with_capacity(refs.len());
                for chunk in refs.chunks(step.max(1)) {
                    out.extend(inner.embed_as(chunk, kind)?);
                }
                // Matryoshka: the first `dim` values, renormalized when the model normalizes.
                for v in &mut out {
                    if dim < v.len() {
                        v.truncate(dim);
                        if inner.normalizes() {
                            lattice_embed::vector::normalize(v);
                        }
                    }
                    if normalize {
                        lattice_embed::vector::normalize(v);
                    }
                }
                Ok(out)
            })
            .map_err(embed_err)?;
        let rows = vectors.len();
        Ok((matrix_bytes(py, &vectors), rows, dim))
    }
}

/// A cross-encoder that scores (query, passage) pairs.
#[pyclass(frozen, module = "lattice._lattice")]
struct Reranker {
    inner: Arc<lattice_embed::Reranker>,
    pool: Pool,
}

#[pymethods]
impl Reranker {
    #[new]
    #[pyo3(signature = (model, *, threads=None, bf16=false, q8=false))]
    fn new(
        py: Python<'_>,
        model: &str,
        threads: Option<usize>,
        bf16: bool,
        q8: bool,
    ) -> PyResult<Self> {
        let pool = Pool::new(threads)?;
        let dir = resolve(model)?;
        let mode = encoder_mode(bf16, q8)?;
        let inner = pool
            .run(py, move || {
                lattice_embed::Reranker::load_dir_with(&dir, mode)
            })
            .map_err(embed_err)?;
        Ok(Self {
            inner: Arc::new(inner),
            pool,
        })
    }

    /// The model's scores of `passages` for `query` (its activation applied), in order.
    fn scores(&self, py: Python<'_>, query: String, passages: Vec<String>) -> PyResult<Vec<f32>> {
        let inner = Arc::clone(&self.inner);
        self.pool
            .run(py, move || {
                let refs: Vec<&str> = passages.iter().map(String::as_str).collect();
                inner.scores(&query, &refs)
            })
            .map_err(embed_err)
    }
}

/// Character offsets of byte offsets into `text` (HF tokenizers reports characters).
fn char_offsets(text: &str, offsets: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut index = vec![0usize; text.len() + 1];
    let mut chars = 0;
    for (b, slot) in index.iter_mut().enumerate() {
        if text.is_char_boundary(b) {
            *slot = chars;
            chars += 1;
        } else {
            *slot = chars - 1;
        }
    }
    offsets
        .iter()
        .map(|&(s, e)| (index[s.min(text.len())], index[e.min(text.len())]))
        .collect()
}

/// A tokenizer (tokenizer.json, SentencePiece, or a BERT vocab.txt folder).
#[pyclass(frozen, module = "lattice._lattice")]
struct Tokenizer {
    inner: Arc<EngineTokenizer>,
}

/// One encoded text: `(ids, tokens, offsets in characters, type_ids, special_tokens_mask)`.
type Encoded = (
    Vec<u32>,
    Vec<String>,
    Vec<(usize, usize)>,
    Vec<u32>,
    Vec<u8>,
);

#[pymethods]
impl Tokenizer {
    /// Loads `tokenizer.json` (or a SentencePiece `.model`) at `path`, or a model folder.
    #[staticmethod]
    fn from_file(path: &str) -> PyResult<Self> {
        let p = Path::new(path);
        if !p.exists() {
            return Err(PyFileNotFoundError::new_err(format!(
                "{path}: no such file"
            )));
        }
        let inner = if p.is_dir() {
            EngineTokenizer::from_dir(p)
        } else {
            EngineTokenizer::from_file(p)
        }
        .map_err(inference_err)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The tokenizer of a model folder or hub id.
    #[staticmethod]
    fn from_pretrained(model: &str) -> PyResult<Self> {
        let dir = resolve(model)?;
        let dir = if dir.is_file() {
            dir.parent().map(Path::to_path_buf).unwrap_or(dir)
        } else {
            dir
        };
        let inner = EngineTokenizer::from_dir(&dir).map_err(inference_err)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Encodes each text.
    #[pyo3(signature = (texts, add_special_tokens=true))]
    fn encode_many(
        &self,
        py: Python<'_>,
        texts: Vec<String>,
        add_special_tokens: bool,
    ) -> Vec<Encoded> {
        let inner = Arc::clone(&self.inner);
        py.detach(move || {
            texts
                .iter()
                .map(|t| {
                    let e = inner.encode(t, add_special_tokens);
                    let offsets = char_offsets(t, &e.offsets);
                    (e.ids, e.tokens, offsets, e.type_ids, e.special_tokens_mask)
                })
                .collect()
        })
    }

    /// The text of `ids`.
    #[pyo3(signature = (ids, skip_special_tokens=true))]
    fn decode(&self, ids: Vec<u32>, skip_special_tokens: bool) -> String {
        self.inner.decode(&ids, skip_special_tokens)
    }

    /// Tokens in the vocabulary (added tokens included).
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// The id of `token`, if it is in the vocabulary.
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of `id`, if any.
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id).map(str::to_owned)
    }
}

/// Sampling and stopping options of one generation call (`lattice._lattice.Sampling`).
#[pyclass(frozen, name = "Sampling", module = "lattice._lattice")]
struct Options {
    max_tokens: usize,
    params: SamplingParams,
    stop: Vec<String>,
    ignore_eos: bool,
    constraint: Option<Spec>,
}

#[pymethods]
impl Options {
    #[new]
    #[pyo3(signature = (max_tokens=256, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                        repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                        seed=None, stop=Vec::new(), ignore_eos=false, json_schema=None,
                        regex=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: usize,
        min_p: f32,
        repetition_penalty: f32,
        presence_penalty: f32,
        frequency_penalty: f32,
        seed: Option<u64>,
        stop: Vec<String>,
        ignore_eos: bool,
        json_schema: Option<String>,
        regex: Option<String>,
    ) -> PyResult<Self> {
        if max_tokens == 0 {
            return Err(PyValueError::new_err("max_tokens must be at least 1"));
        }
        let params = SamplingParams {
            temperature,
            top_p,
            top_k,
            min_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            seed,
        };
        params.validate().map_err(inference_err)?;
        let constraint = match (json_schema, regex) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err("give json_schema or regex, not both"))
            }
            (Some(s), None) => {
                let v: serde_json::Value = serde_json::from_str(&s)
                    .map_err(|e| PyValueError::new_err(format!("json_schema: not JSON: {e}")))?;
                Some(Spec::JsonSchema(v))
            }
            (None, Some(r)) => Some(Spec::Regex(r)),
            (None, None) => None,
        };
        Ok(Self {
            max_tokens,
            params,
            stop,
            ignore_eos,
            constraint,
        })
    }
}

/// A text-generation model (Llama, Qwen2/3, Qwen3.5; safetensors or GGUF).
#[pyclass(frozen, name = "LLM", module = "lattice._lattice")]
struct Llm {
    model: Arc<TextModel>,
    pool: Pool,
}

impl Llm {
    fn request(&self, ids: Vec<u32>, o: &Options, seed_offset: u64) -> PyResult<GenerateRequest> {
        let mut p = o.params.clone();
        p.seed = p.seed.map(|s| s.wrapping_add(seed_offset));
        let mut r = GenerateRequest::new(ids, o.max_tokens, p);
        r.stop = o.stop.clone();
        r.ignore_eos = o.ignore_eos;
        if let Some(spec) = &o.constraint {
            r.constraint = Some(self.model.compile_constraint(spec).map_err(inference_err)?);
        }
        Ok(r)
    }
}

#[pymethods]
impl Llm {
    #[new]
    #[pyo3(signature = (model, *, device="cpu", threads=None, q8=false, bf16=false, f32=false,
                        kv_f16=false, lora=Vec::new(), lora_scales=Vec::new(), lora_merge=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &str,
        device: &str,
        threads: Option<usize>,
        q8: bool,
        bf16: bool,
        f32: bool,
        kv_f16: bool,
        lora: Vec<String>,
        lora_scales: Vec<f32>,
        lora_merge: bool,
    ) -> PyResult<Self> {
        if [q8, bf16, f32].iter().filter(|&&b| b).count() > 1 {
            return Err(PyValueError::new_err(
                "give at most one of q8, bf16 and f32",
            ));
        }
        if lora_scales.len() > lora.len() {
            return Err(PyValueError::new_err(format!(
                "{} lora_scales for {} lora adapters",
                lora_scales.len(),
                lora.len()
            )));
        }
        if lora.is_empty() && lora_merge {
            return Err(PyValueError::new_err("lora_merge needs lora adapters"));
        }
        let pool = Pool::new(threads)?;
        let mode = if f32 {
            WeightMode::F32
        } else if q8 {
            WeightMode::Q8
        } else if bf16 {
            WeightMode::Bf16
        } else {
            WeightMode::Quantized
        };
        let mut place = Placement::new(mode, self::device(device)?);
        if !lora.is_empty() {
            let mut adapters = Vec::with_capacity(lora.len());
            for (i, dir) in lora.iter().enumerate() {
                let a = lattice_inference::lora::Adapter::load(Path::new(dir))
                    .map_err(inference_err)?;
                adapters.push((a, lora_scales.get(i).copied().unwrap_or(1.0)));
            }
            place.lora = Some(Arc::new(lattice_inference::lora::LoraPlan::new(
                adapters, lora_merge,
            )));
        }
        let path = resolve(model)?;
        let mut model = pool
            .run(py, move || TextModel::load_on(&path, &place))
            .map_err(inference_err)?;
        if kv_f16 {
            model.kv_dtype = KvDtype::F16;
        }
        Ok(Self {
            model: Arc::new(model),
            pool,
        })
    }

    /// The token ids of `prompt` (the tokenizer's special tokens added).
    fn encode(&self, prompt: &str) -> PyResult<Vec<u32>> {
        self.model
            .encode_prompt(prompt, true)
            .map_err(inference_err)
    }

    /// The token ids of `messages` (`(role, content)` pairs) in the model's chat template, the
    /// assistant's turn opened.
    #[pyo3(signature = (messages, enable_thinking=None))]
    fn encode_chat(
        &self,
        messages: Vec<(String, String)>,
        enable_thinking: Option<bool>,
    ) -> PyResult<Vec<u32>> {
        let msgs: Vec<ChatMessage> = messages
            .iter()
            .map(|(r, c)| ChatMessage::new(r, c))
            .collect();
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking,
            ..Default::default()
        };
        self.model.encode_chat(&msgs, &opts).map_err(inference_err)
    }

    /// Generates from each prompt (token ids), all in one continuous batch; returns `(text,
    /// token ids, finish reason)` per prompt, in order.
    fn generate_ids(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<u32>>,
        sampling: &Options,
    ) -> PyResult<Vec<(String, Vec<u32>, String)>> {
        let o = sampling;
        let requests = prompts
            .into_iter()
            .enumerate()
            .map(|(i, ids)| self.request(ids, o, i as u64))
            .collect::<PyResult<Vec<_>>>()?;
        let model = Arc::clone(&self.model);
        let done = self
            .pool
            .run(py, move || {
                if let [one] = requests.as_slice() {
                    return generate(&model, one, &mut |_| true).map(|g| vec![(0, (0, g))]);
                }
                let mut engine = BatchEngine::new(&model, requests.len().clamp(1, 64));
                let mut ids = Vec::with_capacity(requests.len());
                for r in requests {
                    ids.push(engine.submit(r)?);
                }
                let mut done = engine.run_all()?;
                // In the order of the prompts.
                done.sort_by_key(|(id, _)| ids.iter().position(|i| i == id));
                Ok(done.into_iter().enumerate().collect())
            })
            .map_err(inference_err)?;
        Ok(done
            .into_iter()
            .map(|(_, (_, g))| (g.text, g.token_ids, g.finish_reason.as_str().to_owned()))
            .collect())
    }

    /// Starts generating from `prompt` (token ids) on a thread of its own; the returned stream
    /// yields the text as it is decoded.
    fn stream_ids(&self, prompt: Vec<u32>, sampling: &Options) -> PyResult<TextStream> {
        let o = sampling;
        let req = self.request(prompt, o, 0)?;
        let (tx, rx) = mpsc::channel::<Result<String, String>>();
        let model = Arc::clone(&self.model);
        let pool = self.pool.clone();
        std::thread::spawn(move || {
            let run = || {
                generate(&model, &req, &mut |piece| {
                    tx.send(Ok(piece.to_owned())).is_ok()
                })
            };
            let result = match &pool.0 {
                Some(p) => p.install(run),
                None => run(),
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e.to_string()));
            }
        });
        Ok(TextStream {
            rx: Mutex::new(Some(rx)),
        })
    }
}

/// Text pieces of one generation as it decodes (an iterator; dropping it stops generation at
/// the next token).
#[pyclass(module = "lattice._lattice")]
struct TextStream {
    rx: Mutex<Option<mpsc::Receiver<Result<String, String>>>>,
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<String> {
        let mut guard = self
            .rx
            .lock()
            .map_err(|_| PyRuntimeError::new_err("the stream's lock was poisoned"))?;
        let Some(rx) = guard.take() else {
            return Err(PyStopIteration::new_err(()));
        };
        let (rx, next) = py.detach(move || {
            let next = rx.recv();
            (rx, next)
        });
        *guard = Some(rx);
        match next {
            Ok(Ok(piece)) => Ok(piece),
            Ok(Err(message)) => {
                *guard = None;
                Err(PyRuntimeError::new_err(message))
            }
            Err(_) => {
                *guard = None;
                Err(PyStopIteration::new_err(()))
            }
        }
    }
}

/// The instruction set the CPU kernels chose on this machine (e.g. `avx512`).
#[pyfunction]
fn cpu_isa() -> &'static str {
    lattice_inference::backend::cpu::isa()
}

/// The extension module.
#[pymodule]
fn _lattice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The global pool (objects made without `threads`) flushes subnormals like the CLI's
    // (`LATTICE_SUBNORMALS=keep` to keep them; another value fails the import); if the process
    // already started rayon's pool elsewhere, that pool stays as it is.
    let _ = lattice_inference::backend::cpu::pool_builder(None)
        .map_err(inference_err)?
        .build_global();
    m.add_function(wrap_pyfunction!(cpu_isa, m)?)?;
    m.add_class::<Embedder>()?;
    m.add_class::<Reranker>()?;
    m.add_class::<Tokenizer>()?;
    m.add_class::<Llm>()?;
    m.add_class::<TextStream>()?;
    m.add_class::<Options>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
