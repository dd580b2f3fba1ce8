//! ShortGPT layer pruning (Men et al., 2024): a layer's block influence is 1 − cos between its
//! input and output hidden states, averaged over calibration tokens; the layers of least
//! influence change the residual stream least and are removed. This module measures the
//! influence (through [`crate::metrics`]) and writes the pruned model as a GGUF file. Its
//! calibration pass ([`run_calibration`]) also serves GPTQ (`crate::quantize`).

use std::path::Path;
use std::sync::Arc;

use crate::io::gguf::{GgufArray, GgufValue};
use crate::io::gguf_tensors::GgufTensors;
use crate::io::gguf_write::{write_gguf, TensorOut};
use crate::metrics::{install, uninstall, LayerTotals};
use crate::model::batch::{ForwardBatch, RowOutputs};
use crate::model::decoder::Decoder;
use crate::state::SeqState;
use crate::{Error, Result};

/// Runs `decoder` over `tokens` in whole chunks of `ctx` tokens, each from a fresh state
/// (`new_state(ctx)`) and computing only the last row's logits, calling `on_chunk(done, total)`
/// after each: the calibration pass whose layers something observes (block influence here,
/// GPTQ's input Hessians in `crate::quantize`). Leftover tokens are not run.
pub fn run_calibration(
    decoder: &dyn Decoder,
    new_state: impl Fn(usize) -> SeqState,
    tokens: &[u32],
    ctx: usize,
    mut on_chunk: impl FnMut(usize, usize),
) -> Result<()> {
    if ctx == 0 || tokens.len() < ctx {
        return Err(Error::InvalidInput(format!(
            "the calibration text has {} tokens; at least one chunk of {ctx} is needed",
            tokens.len()
        )));
    }
    let chunks = tokens.len() / ctx;
    for (c, chunk) in tokens.chunks_exact(ctx).enumerate() {
        let mut state = new_state(ctx);
        let batch = ForwardBatch::tokens(chunk, &[ctx], RowOutputs::LastLogits);
        decoder.forward_batch(&batch, &mut [&mut state])?;
        on_chunk(c + 1, chunks);
    }
    Ok(())
}

/// Each layer's block influence over `tokens`, run in chunks of `ctx` tokens, each from a fresh
/// state (`new_state(ctx)`); `on_chunk(done, total)` after each. Observes the layers through
/// the process-wide metrics sink, which it replaces while it runs and removes after.
pub fn block_influence(
    decoder: &dyn Decoder,
    new_state: impl Fn(usize) -> SeqState,
    tokens: &[u32],
    ctx: usize,
    on_chunk: impl FnMut(usize, usize),
) -> Result<Vec<f64>> {
    let totals = Arc::new(LayerTotals::default());
    install(Arc::clone(&totals) as _);
    let run = run_calibration(decoder, new_state, tokens, ctx, on_chunk);
    uninstall();
    run?;
    let layers = totals.snapshot();
    if layers.len() != decoder.info().config.n_layers {
        return Err(Error::UnsupportedModel(format!(
            "{} reported {} of its {} layers (only decoders whose layers are observed can be \
             pruned)",
            decoder.info().config.model_type,
            layers.len(),
            decoder.info().config.n_layers
        )));
    }
    Ok(layers
        .iter()
        .map(|t| t.influence / t.rows.max(1) as f64)
        .collect())
}

/// The `k` layers of least influence, ascending by index.
pub fn least_influential(influence: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..influence.len()).collect();
    order.sort_by(|&a, &b| influence[a].total_cmp(&influence[b]).then(a.cmp(&b)));
    let mut chosen: Vec<usize> = order.into_iter().take(k).collect();
    chosen.sort_unstable();
    chosen
}

/// What [`prune_gguf`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pruned {
    /// Layers before.
    pub layers_before: usize,
    /// Layers after.
    pub layers_after: usize,
    /// Tensor bytes before and after.
    pub bytes_before: u64,
    /// See `bytes_before`.
    pub bytes_after: u64,
}

/// Writes `src` without the layers `remove` to `dst`: their `blk.N.*` tensors dropped, the
/// others renumbered, `{arch}.block_count` and every per-layer metadata array shortened.
/// Hybrid architectures (whose layer kinds follow a fixed interval) are refused.
pub fn prune_gguf(src: &Path, dst: &Path, remove: &[usize]) -> Result<Pruned> {
    let g = GgufTensors::open(src)?;
    let h = g.header();
    let arch = h
        .metadata("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("")
        .to_string();
    let bad = |reason: String| Error::InvalidInput(format!("{}: {reason}", src.display()));
    if matches!(arch.as_str(), "qwen35" | "qwen35moe" | "qwen3next") {
        return Err(bad(format!(
            "`{arch}` interleaves layer kinds by a fixed interval; removing layers would change \
             which layers attend (prune its safetensors checkpoint instead)"
        )));
    }
    let count_key = format!("{arch}.block_count");
    let n = h
        .metadata(&count_key)
        .and_then(GgufValue::as_u64)
        .ok_or_else(|| bad(format!("no `{count_key}`")))? as usize;
    if let Some(&l) = remove.iter().find(|&&l| l >= n) {
        return Err(bad(format!("layer {l} does not exist (the model has {n})")));
    }
    let mut keep_map = vec![None; n];
    let mut next = 0;
    for (i, slot) in keep_map.iter_mut().enumerate() {
        if !remove.contains(&i) {
            *slot = Some(next);
            next += 1;
        }
    }
    if next == 0 {
        return Err(bad("every layer would be removed".into()));
    }
    let trim = |a: &GgufArray| -> Option<GgufArray> {
        macro_rules! keep {
            ($v:expr, $variant:ident) => {
                GgufArray::$variant(
                    $v.iter()
                        .enumerate()
                        .filter(|(i, _)| keep_map[*i].is_some())
                        .map(|(_, x)| x.clone())
                        .collect(),
                )
            };
        }
        if a.len() != n {
            return None;
        }
        Some(match a {
            GgufArray::U8(v) => keep!(v, U8),
            GgufArray::I8(v) => keep!(v, I8),
            GgufArray::U16(v) => keep!(v, U16),
            GgufArray::I16(v) => keep!(v, I16),
            GgufArray::U32(v) => keep!(v, U32),
            GgufArray::I32(v) => keep!(v, I32),
            GgufArray::F32(v) => keep!(v, F32),
            GgufArray::Bool(v) => keep!(v, Bool),
            GgufArray::String(v) => keep!(v, String),
            GgufArray::Array(v) => keep!(v, Array),
            GgufArray::U64(v) => keep!(v, U64),
            GgufArray::I64(v) => keep!(v, I64),
            GgufArray::F64(v) => keep!(v, F64),
        })
    };
    let prefix = format!("{arch}.");
    let metadata: Vec<(String, GgufValue)> = h
        .metadata_entries()
        .map(|(k, v)| {
            let v = if k == count_key {
                match v {
                    GgufValue::U64(_) => GgufValue::U64(next as u64),
                    _ => GgufValue::U32(next as u32),
                }
            } else if let (true, GgufValue::Array(a)) = (k.starts_with(&prefix), v) {
                trim(a).map_or_else(|| v.clone(), GgufValue::Array)
            } else {
                v.clone()
            };
            (k.to_string(), v)
        })
        .collect();
    let mut tensors = Vec::with_capacity(h.tensors().len());
    let (mut before, mut after) = (0u64, 0u64);
    for info in h.tensors() {
        let raw = g.raw(&info.name)?;
        before += raw.bytes.len() as u64;
        let name = match layer_of(&info.name) {
            Some((l, rest)) if l < n => match keep_map[l] {
                Some(j) => format!("blk.{j}.{rest}"),
                None => continue,
            },
            Some((l, _)) => return Err(bad(format!("tensor `{}` of layer {l} >= {n}", info.name))),
            None => info.name.clone(),
        };
        after += raw.bytes.len() as u64;
        tensors.push(TensorOut {
            name,
            dims: info.dims.clone(),
            ggml_type: info.ggml_type,
            bytes: raw.bytes,
        });
    }
    write_gguf(dst, &metadata, &tensors, h.alignment())?;
    Ok(Pruned {
        layers_before: n,
        layers_after: next,
        bytes_before: before,
        bytes_after: after,
    })
}

/// `blk.N.rest` → (N, rest).
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (num, tail) = rest.split_once('.')?;
    Some((num.parse().ok()?, tail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_influential() {
        assert_eq!(
            least_influential(&[0.5, 0.1, 0.3, 0.1, 0.9], 3),
            vec![1, 2, 3]
        );
        assert_eq!(least_influential(&[0.5, 0.1], 0), Vec::<usize>::new());
        assert_eq!(
            layer_of("blk.12.attn_q.weight"),
            Some((12, "attn_q.weight"))
        );
        assert_eq!(layer_of("token_embd.weight"), None);
    }
}
