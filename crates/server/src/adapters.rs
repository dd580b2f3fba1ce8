//! LoRA adapters served over the generation model: the named table requests pick from
//! (`"model": NAME`, vLLM's convention, or the `lora` extension for a weighted mixture), and
//! loading and unloading at run time (`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`,
//! vLLM's shapes) from folders under `--lora-dir` only: adapter paths come from the network, so
//! a path outside it, `..`, or a symlink leading out of it is refused (403).

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lattice_inference::lora::{Adapter, LoadedAdapter, LoraPlan, Selection};
use serde::Deserialize;

use crate::app::AppState;
use crate::error::ApiError;
use crate::protocol::{from_value, read_body};

/// Files of a PEFT folder the loader reads (each must stay inside `--lora-dir`).
const ADAPTER_FILES: [&str; 2] = ["adapter_config.json", "adapter_model.safetensors"];

/// One entry of a request's `lora` extension.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraRef {
    /// A served adapter's name.
    pub name: String,
    /// Its scale in the mixture (default 1).
    pub scale: Option<f32>,
}

/// The served adapters by name, and what run-time loading may do.
pub struct Adapters {
    plan: Option<Arc<LoraPlan>>,
    /// `--lora-dir`, canonical; `None`: no loading at run time.
    dir: Option<PathBuf>,
    /// Most adapters served at once.
    max: usize,
    table: RwLock<Vec<(String, Arc<LoadedAdapter>)>>,
}

impl Adapters {
    /// The adapters of `plan` (the generation model's) named `names` in its order, loading
    /// under `dir` at run time when given, at most `max` at once.
    pub fn new(
        plan: Option<Arc<LoraPlan>>,
        names: &[String],
        dir: Option<&Path>,
        max: usize,
    ) -> Self {
        let table = match &plan {
            Some(p) => names
                .iter()
                .cloned()
                .zip(p.loaded().iter().cloned())
                .collect(),
            None => Vec::new(),
        };
        Self {
            plan,
            dir: dir.and_then(|d| d.canonicalize().ok()),
            max,
            table: RwLock::new(table),
        }
    }

    /// The served adapters' names, in load order.
    pub fn names(&self) -> Vec<String> {
        self.read().iter().map(|(n, _)| n.clone()).collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<(String, Arc<LoadedAdapter>)>> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<(String, Arc<LoadedAdapter>)>> {
        self.table.write().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, name: &str) -> Option<Arc<LoadedAdapter>> {
        let table = self.read();
        table
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
    }

    /// What a request runs with: the adapter its `model` names (`Some(name)` then), or the
    /// mixture of its `lora` list; an error naming the field when a name is not served or a
    /// scale not finite.
    pub fn pick(
        &self,
        model: Option<&str>,
        lora: Option<&[LoraRef]>,
    ) -> Result<(Option<String>, Selection), ApiError> {
        let by_model = model.and_then(|m| self.get(m).map(|a| (m.to_owned(), a)));
        let list = lora.unwrap_or_default();
        if let Some((name, a)) = by_model {
            if !list.is_empty() {
                return Err(ApiError::invalid_param(
                    "lora",
                    format!(
                        "`model` names the adapter `{name}`; with `lora`, name the base model \
                         (or none) and list every adapter there"
                    ),
                ));
            }
            let sel =
                Selection::new(vec![(a, 1.0)]).map_err(|e| ApiError::internal(e.to_string()))?;
            return Ok((Some(name), sel));
        }
        if list.len() > self.max.max(1) {
            return Err(ApiError::invalid_param(
                "lora",
                format!("`lora` lists {} adapters; at most {}", list.len(), self.max),
            ));
        }
        let mut picked = Vec::with_capacity(list.len());
        for (i, r) in list.iter().enumerate() {
            let Some(a) = self.get(&r.name) else {
                let served = self.names();
                return Err(ApiError::invalid_param(
                    format!("lora[{i}].name"),
                    format!(
                        "no LoRA adapter `{}` is served; served: {}",
                        r.name,
                        if served.is_empty() {
                            "none".into()
                        } else {
                            served.join(", ")
                        }
                    ),
                ));
            };
            let scale = r.scale.unwrap_or(1.0);
            if !scale.is_finite() {
                return Err(ApiError::invalid_param(
                    format!("lora[{i}].scale"),
                    "the scale must be a finite number",
                ));
            }
            picked.push((a, scale));
        }
        let sel =
            Selection::new(picked).map_err(|e| ApiError::invalid_param("lora", e.to_string()))?;
        Ok((None, sel))
    }

    /// The folder `given` names under `--lora-dir`: 403 for a path outside it (absolute
    /// elsewhere, `..`, a symlink out of it, or files that lead out), 404 when missing.
    fn resolve(&self, given: &str) -> Result<PathBuf, ApiError> {
        let Some(dir) = &self.dir else {
            return Err(ApiError::forbidden(
                "loading LoRA adapters at run time is off; start lattice serve with \
                 --lora-dir DIR to load adapters from folders under DIR",
            ));
        };
        let path = Path::new(given);
        if given.is_empty() || path.components().any(|c| c == Component::ParentDir) {
            return Err(ApiError::forbidden(format!(
                "`lora_path` `{given}`: `..` and empty paths are refused; give a folder under \
                 --lora-dir"
            )));
        }
        let full = if path.is_absolute() {
            path.to_path_buf()
        } else {
            dir.join(path)
        };
        if !full.starts_with(dir) {
            return Err(ApiError::forbidden(format!(
                "`lora_path` `{given}` is outside --lora-dir"
            )));
        }
        let canon = full.canonicalize().map_err(|_| {
            ApiError::not_found(format!(
                "`lora_path` `{given}`: no such folder under --lora-dir"
            ))
        })?;
        let inside = |p: &Path| p.canonicalize().map_or(true, |c| c.starts_with(dir));
        if !canon.starts_with(dir) || !ADAPTER_FILES.iter().all(|f| inside(&canon.join(f))) {
            return Err(ApiError::forbidden(format!(
                "`lora_path` `{given}` leads outside --lora-dir (a symlink)"
            )));
        }
        Ok(canon)
    }
}

/// `POST /v1/load_lora_adapter` body (vLLM's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadRequest {
    lora_name: String,
    lora_path: String,
    /// Replace an adapter already loaded under the name.
    #[serde(default)]
    load_inplace: bool,
}

/// `POST /v1/unload_lora_adapter` body (vLLM's; adapters are named here, so vLLM's optional
/// `lora_int_id` is refused as an unknown field rather than ignored).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnloadRequest {
    lora_name: String,
}

/// The generation model's plan, when it takes adapters picked per request.
fn plan(state: &AppState) -> Result<Arc<LoraPlan>, ApiError> {
    let Some(g) = &state.generation else {
        return Err(ApiError::not_loaded("generation", "--model"));
    };
    match &state.adapters.plan {
        Some(p) if p.is_selectable() => Ok(Arc::clone(p)),
        _ => Err(ApiError::forbidden(format!(
            "`{}` was loaded without LoRA support; start lattice serve with --lora-dir DIR",
            g.name
        ))),
    }
}

/// The error for loading one adapter more than the server holds.
fn full(n: usize) -> ApiError {
    ApiError::invalid(format!(
        "{n} LoRA adapters are loaded, the most this server holds (--max-loras); unload one first"
    ))
}

/// `POST /v1/load_lora_adapter`: `{"lora_name", "lora_path", "load_inplace"?}`; requests may
/// pick the adapter as soon as this answers.
pub async fn load(State(state): State<Arc<AppState>>, body: Body) -> Result<Response, ApiError> {
    let value = read_body(body, &state.options).await?;
    let req: LoadRequest = from_value(&value)?;
    let plan = plan(&state)?;
    let name = req.lora_name.trim().to_owned();
    if name.is_empty() {
        return Err(ApiError::invalid_param("lora_name", "`lora_name` is empty"));
    }
    if let Some(g) = &state.generation {
        if g.check(Some(&name)).is_ok() {
            return Err(ApiError::invalid_param(
                "lora_name",
                format!("`{name}` is the base model's name"),
            ));
        }
    }
    let dir = state.adapters.resolve(&req.lora_path)?;
    {
        let table = state.adapters.read();
        let exists = table.iter().any(|(n, _)| *n == name);
        if exists && !req.load_inplace {
            return Err(ApiError::invalid_param(
                "lora_name",
                format!("the LoRA adapter `{name}` is already loaded (unload it first, or give load_inplace)"),
            ));
        }
        if !exists && table.len() >= state.adapters.max {
            return Err(full(table.len()));
        }
    }
    let loaded =
        tokio::task::spawn_blocking(move || Adapter::load(&dir).and_then(|a| plan.prepare(&a)))
            .await
            .map_err(|e| ApiError::internal(format!("adapter loading failed: {e}")))?
            .map_err(|e| ApiError::invalid_param("lora_path", e.to_string()))?;
    {
        let mut table = state.adapters.write();
        let n = table.len();
        match table.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = loaded,
            None if n >= state.adapters.max => return Err(full(n)),
            None => table.push((name.clone(), loaded)),
        }
    }
    eprintln!("lattice serve: loaded LoRA adapter {name}");
    Ok((
        StatusCode::OK,
        format!("Success: LoRA adapter '{name}' added successfully."),
    )
        .into_response())
}

/// `POST /v1/unload_lora_adapter`: `{"lora_name"}`. Requests already running with the adapter
/// finish with it; new ones no longer find it.
pub async fn unload(State(state): State<Arc<AppState>>, body: Body) -> Result<Response, ApiError> {
    let value = read_body(body, &state.options).await?;
    let req: UnloadRequest = from_value(&value)?;
    plan(&state)?;
    let removed = {
        let mut table = state.adapters.write();
        let before = table.len();
        table.retain(|(n, _)| *n != req.lora_name);
        before != table.len()
    };
    if !removed {
        return Err(ApiError::not_found(format!(
            "the LoRA adapter `{}` cannot be found",
            req.lora_name
        )));
    }
    eprintln!("lattice serve: unloaded LoRA adapter {}", req.lora_name);
    Ok((
        StatusCode::OK,
        format!(
            "Success: LoRA adapter '{}' removed successfully.",
            req.lora_name
        ),
    )
        .into_response())
}
