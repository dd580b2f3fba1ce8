//! The vision tower of Qwen3-VL and Qwen3.5 (`model.visual.*`): a ViT over 16 × 16 × 2
//! (time) patches of an image, in the processor's order (groups of `merge²` neighbouring
//! patches back to back, see [`crate::vision`]).
//!
//! Patch embedding (a `Conv3d` whose stride is its kernel: one product per patch) plus a
//! learned square table of position embeddings resampled bilinearly (corners aligned) to the
//! image's patch grid; `depth` pre-norm blocks (LayerNorm, attention over the patches of each
//! frame with a 2-D rotary embedding — the first half of each head's pairs turned by the
//! patch row, the second half by its column —, LayerNorm, a GELU(tanh) MLP); the merger
//! (LayerNorm, then every `merge²` patches concatenated, Linear, GELU, Linear to the text
//! model's width). Qwen3-VL's DeepStack mergers (norm after the concatenation) turn the
//! outputs of some early blocks into features the text model adds to its first layers.

use std::path::Path;

use serde_json::Value;

use crate::attention::packed_attention;
use crate::io::store::{Scope, Weight, WeightStore};
use crate::ops::{put_columns, split_columns, LayerNorm, Linear, Rope};
use crate::{Error, Result};

/// The activation of the blocks' MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionAct {
    /// `gelu_pytorch_tanh` (Qwen3-VL, Qwen3.5).
    GeluTanh,
    /// The exact (erf) GELU.
    Gelu,
}

/// A vision tower's hyper-parameters (`vision_config` of `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// ViT blocks.
    pub depth: usize,
    /// Width of the patch embeddings.
    pub hidden_size: usize,
    /// Width of the blocks' MLP.
    pub intermediate_size: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Colour channels (3).
    pub in_channels: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// Frames per patch.
    pub temporal_patch_size: usize,
    /// Patches per side merged into one text-model token.
    pub merge_size: usize,
    /// Width of the merged tokens (the text model's hidden size).
    pub out_hidden_size: usize,
    /// Rows of the learned position table (a square number).
    pub num_position_embeddings: usize,
    /// Blocks after which a DeepStack merger takes features (Qwen3-VL).
    pub deepstack_indexes: Vec<usize>,
    /// Base of the rotary frequencies.
    pub rope_theta: f32,
    /// The MLP activation.
    pub act: VisionAct,
}

impl VisionConfig {
    /// Reads `vision_config` from a transformers `config.json` (`path` names it in errors);
    /// `None` when there is none.
    pub fn from_hf_json(top: &Value, path: &Path) -> Result<Option<Self>> {
        let Some(v) = top.get("vision_config").filter(|v| v.is_object()) else {
            return Ok(None);
        };
        let bad = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason: format!("vision_config: {reason}"),
        };
        let num = |key: &str, default: Option<usize>| -> Result<usize> {
            match v.get(key) {
                None | Some(Value::Null) => default.ok_or_else(|| bad(format!("missing `{key}`"))),
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n > 0 && n < 1 << 20)
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(format!("`{key}` must be a positive integer, not {x}"))),
            }
        };
        let act = match v.get("hidden_act").and_then(Value::as_str) {
            None | Some("gelu_pytorch_tanh") => VisionAct::GeluTanh,
            Some("gelu") => VisionAct::Gelu,
            Some(other) => return Err(bad(format!("hidden_act `{other}` is not supported"))),
        };
        let deepstack_indexes = match v.get("deepstack_visual_indexes") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("`deepstack_visual_indexes` must be integers".into()))?,
            Some(x) => {
                return Err(bad(format!(
                    "`deepstack_visual_indexes` must be a list, not {x}"
                )))
            }
        };
        let rope_theta = v
            .get("rope_parameters")
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0) as f32;
        let cfg = Self {
            depth: num("depth", None)?,
            hidden_size: num("hidden_size", None)?,
            intermediate_size: num("intermediate_size", None)?,
            n_heads: num("num_heads", None)?,
            in_channels: num("in_channels", Some(3))?,
            patch_size: num("patch_size", Some(16))?,
            temporal_patch_size: num("temporal_patch_size", Some(2))?,
            merge_size: num("spatial_merge_size", Some(2))?,
            out_hidden_size: num("out_hidden_size", None)?,
            num_position_embeddings: num("num_position_embeddings", None)?,
            deepstack_indexes,
            rope_theta,
            act,
        };
        let side = cfg.grid_side();
        if side * side != cfg.num_position_embeddings {
            return Err(bad(format!(
                "num_position_embeddings {} is not a square",
                cfg.num_position_embeddings
            )));
        }
        if !cfg.hidden_size.is_multiple_of(cfg.n_heads)
            || !(cfg.hidden_size / cfg.n_heads).is_multiple_of(4)
        {
            return Err(bad(format!(
                "hidden_size {} over {} heads must give heads of a multiple of 4",
                cfg.hidden_size, cfg.n_heads
            )));
        }
        if let Some(&i) = cfg.deepstack_indexes.iter().find(|&&i| i >= cfg.depth) {
            return Err(bad(format!(
                "DeepStack index {i} is past the {} blocks",
                cfg.depth
            )));
        }
        Ok(Some(cfg))
    }

    /// Values of one patch (`in_channels × temporal × patch²`).
    pub fn patch_values(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Side of the learned position grid.
    fn grid_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt().round() as usize
    }
}

#[derive(Debug)]
struct Block {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// A patch merger: `merge²` patches → one token of the text model's width.
#[derive(Debug)]
struct Merger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// One image for the tower: its patches in the processor's order and its grid.
#[derive(Debug, Clone, Copy)]
pub struct ImagePatches<'a> {
    /// f32 [t · h · w, patch values].
    pub pixel_values: &'a [f32],
    /// Frames, rows and columns of patches.
    pub grid_thw: [usize; 3],
}

/// What the tower makes of one image.
#[derive(Debug, Clone)]
pub struct ImageFeatures {
    /// Text-model tokens (`t · h · w / merge²`).
    pub tokens: usize,
    /// f32 [tokens, out_hidden]: the input embeddings of the image's placeholder tokens.
    pub embeds: Vec<f32>,
    /// Per DeepStack merger, f32 [tokens, out_hidden] added after text layer 0, 1, ...
    pub deepstack: Vec<Vec<f32>>,
}

/// The vision tower of a Qwen3-VL / Qwen3.5 checkpoint.
#[derive(Debug)]
pub struct VisionTower {
    cfg: VisionConfig,
    patch_embed: Linear,
    pos_embed: Weight, // [n_pos, hidden]
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
    rope: Rope,
}

/// How the tower's matrices multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VisionWeights {
    /// Exact f32 products (bf16 checkpoints kept in 16 bits, widened as they load).
    #[default]
    Exact,
    /// bf16 products (`--bf16`: activations rounded to bf16 where the CPU multiplies bf16).
    Bf16,
}

fn dense(
    w: &[f32],
    out_dim: usize,
    in_dim: usize,
    bias: Vec<f32>,
    mode: VisionWeights,
) -> Result<Linear> {
    match mode {
        VisionWeights::Exact => Linear::from_f32_compact(w, out_dim, in_dim, Some(bias)),
        VisionWeights::Bf16 => Linear::from_bf16(w, out_dim, in_dim, Some(bias)),
    }
}

fn linear(s: &Scope, out_dim: usize, in_dim: usize, mode: VisionWeights) -> Result<Linear> {
    let w = s.get("weight", &[out_dim, in_dim])?;
    let b = s.get("bias", &[out_dim])?;
    dense(w.as_slice(), out_dim, in_dim, b.as_slice().to_vec(), mode)
}

fn merger(s: &Scope, cfg: &VisionConfig, postshuffle: bool, mode: VisionWeights) -> Result<Merger> {
    let wide = cfg.hidden_size * cfg.merge_size * cfg.merge_size;
    let norm_dim = if postshuffle { wide } else { cfg.hidden_size };
    Ok(Merger {
        norm: LayerNorm::load(&s.pp("norm"), norm_dim, 1e-6)?,
        fc1: linear(&s.pp("linear_fc1"), wide, wide, mode)?,
        fc2: linear(&s.pp("linear_fc2"), cfg.out_hidden_size, wide, mode)?,
    })
}

impl Merger {
    /// `x` f32 [patches, hidden] (groups of merge² patches back to back) → [tokens, out].
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        // The norm's width says what it normalizes: each patch, or each concatenated group.
        let mut h = x.to_vec();
        self.norm.forward_inplace(&mut h);
        self.fc2.forward(&self.fc1.forward_gelu(&h))
    }
}

impl VisionTower {
    /// Loads the tower from `store` under `prefix` (`model.visual`, or `visual` in older
    /// saves); bf16 weights stay in 16 bits and multiply exactly as f32.
    /// `mode` picks exact f32 products or bf16 ones.
    pub fn load(
        cfg: VisionConfig,
        store: &WeightStore,
        prefix: &str,
        mode: VisionWeights,
    ) -> Result<Self> {
        let root = store.scope(prefix);
        let h = cfg.hidden_size;
        let pe = root.pp("patch_embed").pp("proj");
        let (c, t, p) = (cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size);
        let w = pe.get("weight", &[h, c, t, p, p])?;
        let b = pe.get("bias", &[h])?;
        let patch_embed = dense(
            w.as_slice(),
            h,
            cfg.patch_values(),
            b.as_slice().to_vec(),
            mode,
        )?;
        let pos_embed = root
            .pp("pos_embed")
            .get("weight", &[cfg.num_position_embeddings, h])?;
        let mut blocks = Vec::with_capacity(cfg.depth);
        for i in 0..cfg.depth {
            let s = root.pp(&format!("blocks.{i}"));
            blocks.push(Block {
                norm1: LayerNorm::load(&s.pp("norm1"), h, 1e-6)?,
                qkv: linear(&s.pp("attn").pp("qkv"), 3 * h, h, mode)?,
                proj: linear(&s.pp("attn").pp("proj"), h, h, mode)?,
                norm2: LayerNorm::load(&s.pp("norm2"), h, 1e-6)?,
                fc1: linear(
                    &s.pp("mlp").pp("linear_fc1"),
                    cfg.intermediate_size,
                    h,
                    mode,
                )?,
                fc2: linear(
                    &s.pp("mlp").pp("linear_fc2"),
                    h,
                    cfg.intermediate_size,
                    mode,
                )?,
            });
        }
        let merger_ = merger(&root.pp("merger"), &cfg, false, mode)?;
        let deepstack = (0..cfg.deepstack_indexes.len())
            .map(|j| {
                merger(
                    &root.pp(&format!("deepstack_merger_list.{j}")),
                    &cfg,
                    true,
                    mode,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let rope = Rope::vision_2d(cfg.rope_theta, h / cfg.n_heads)?;
        Ok(Self {
            cfg,
            patch_embed,
            pos_embed,
            blocks,
            merger: merger_,
            deepstack,
            rope,
        })
    }

    /// The tower's settings.
    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Floating-point operations (multiply-adds counted as 2) of encoding one image of
    /// `grid_thw` patches: the products and the attention scores and sums.
    pub fn flops(&self, grid_thw: [usize; 3]) -> f64 {
        let c = &self.cfg;
        let [t, h, w] = grid_thw;
        let (n, frame) = ((t * h * w) as f64, (h * w) as f64);
        let (hd, inter) = (c.hidden_size as f64, c.intermediate_size as f64);
        let wide = hd * (c.merge_size * c.merge_size) as f64;
        let tokens = n / (c.merge_size * c.merge_size) as f64;
        let block = 2.0 * n * (4.0 * hd * hd + 2.0 * hd * inter) + 4.0 * n * frame * hd;
        let merger = 2.0 * tokens * wide * (wide + c.out_hidden_size as f64);
        2.0 * n * c.patch_values() as f64 * hd
            + c.depth as f64 * block
            + (1 + self.deepstack.len()) as f64 * merger
    }

    /// Checks an image's patches against the tower: values per patch, a grid of whole
    /// merge groups.
    fn check(&self, img: &ImagePatches<'_>) -> Result<usize> {
        let [t, h, w] = img.grid_thw;
        let m = self.cfg.merge_size;
        let n = t * h * w;
        if n == 0 || !h.is_multiple_of(m) || !w.is_multiple_of(m) {
            return Err(Error::InvalidInput(format!(
                "image grid {:?} must be non-empty with rows and columns multiples of {m}",
                img.grid_thw
            )));
        }
        if img.pixel_values.len() != n * self.cfg.patch_values() {
            return Err(Error::InvalidInput(format!(
                "{} pixel values for {n} patches of {}",
                img.pixel_values.len(),
                self.cfg.patch_values()
            )));
        }
        Ok(n)
    }

    /// The (row, column) of every patch of an image in the processor's order: merge groups
    /// in raster order, each group's patches in raster order; repeated per frame.
    fn patch_coords(&self, [t, h, w]: [usize; 3]) -> Vec<(usize, usize)> {
        let m = self.cfg.merge_size;
        let mut out = Vec::with_capacity(t * h * w);
        for _ in 0..t {
            for br in 0..h / m {
                for bc in 0..w / m {
                    for ir in 0..m {
                        for ic in 0..m {
                            out.push((br * m + ir, bc * m + ic));
                        }
                    }
                }
            }
        }
        out
    }

    /// The learned position embeddings resampled to an `h × w` grid (bilinear, corners
    /// aligned, as transformers' `get_vision_interpolation_indices_and_weights`), added to
    /// the patch rows `x` of one image.
    fn add_positions(&self, x: &mut [f32], coords: &[(usize, usize)], h: usize, w: usize) {
        let side = self.cfg.grid_side();
        let dim = self.cfg.hidden_size;
        let table = self.pos_embed.as_slice();
        // Per axis: the two taps and their weights, in f32 as torch computes them.
        let taps = |index: usize, size: usize| -> [(usize, f32); 2] {
            let src = index as f32 * (side - 1) as f32 / (size.saturating_sub(1).max(1)) as f32;
            let floor = src.floor();
            let base = floor as isize;
            let mut out = [(0usize, 0f32); 2];
            for (o, slot) in out.iter_mut().enumerate() {
                let tap = (base + o as isize).clamp(0, side as isize - 1) as usize;
                let distance = (src - floor - o as f32).abs();
                *slot = (tap, (1.0 - distance).max(0.0));
            }
            out
        };
        for (row, &(r, c)) in x.chunks_exact_mut(dim).zip(coords) {
            let (th, tw) = (taps(r, h), taps(c, w));
            let mut acc = vec![0.0f32; dim];
            let mut first = true;
            for &(hi, hw) in &th {
                for &(wi, ww) in &tw {
                    let wt = hw * ww;
                    let src = &table[(hi * side + wi) * dim..][..dim];
                    for (a, &s) in acc.iter_mut().zip(src) {
                        if first {
                            *a = s * wt;
                        } else {
                            *a += s * wt;
                        }
                    }
                    first = false;
                }
            }
            for (v, a) in row.iter_mut().zip(&acc) {
                *v += a;
            }
        }
    }

    /// Runs the tower over several images at once (attention stays within each frame).
    pub fn encode(&self, images: &[ImagePatches<'_>]) -> Result<Vec<ImageFeatures>> {
        let cfg = &self.cfg;
        let (hidden, heads) = (cfg.hidden_size, cfg.n_heads);
        let hd = hidden / heads;
        let group = cfg.merge_size * cfg.merge_size;
        let mut counts = Vec::with_capacity(images.len());
        let mut pixels = Vec::new();
        let mut coords = Vec::new();
        let mut cu = vec![0usize];
        for img in images {
            let n = self.check(img)?;
            counts.push(n);
            pixels.extend_from_slice(img.pixel_values);
            let [t, h, w] = img.grid_thw;
            coords.extend(self.patch_coords(img.grid_thw));
            for _ in 0..t {
                cu.push(cu.last().unwrap() + h * w);
            }
        }
        let mut x = self.patch_embed.forward(&pixels);
        let mut at = 0;
        for (img, &n) in images.iter().zip(&counts) {
            let [_, h, w] = img.grid_thw;
            self.add_positions(
                &mut x[at * hidden..(at + n) * hidden],
                &coords[at..at + n],
                h,
                w,
            );
            at += n;
        }
        let positions: Vec<[usize; 3]> = coords.iter().map(|&(r, c)| [0, r, c]).collect();
        let mut taken: Vec<Vec<f32>> = Vec::with_capacity(self.deepstack.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let mut hn = x.clone();
            b.norm1.forward_inplace(&mut hn);
            let qkv = b.qkv.forward(&hn);
            let [mut q, mut k, _] = split_columns(&qkv, [hidden, hidden, hidden]);
            self.rope.apply_3d(&mut q, heads, &positions)?;
            self.rope.apply_3d(&mut k, heads, &positions)?;
            let mut qkv = qkv;
            put_columns(&mut qkv, 3 * hidden, 0..hidden, &q);
            put_columns(&mut qkv, 3 * hidden, hidden..2 * hidden, &k);
            let ctx = packed_attention(&qkv, &cu, heads, hd, None)?;
            x = b.proj.forward_residual(&ctx, &x);
            let mut hn = x.clone();
            b.norm2.forward_inplace(&mut hn);
            let act = match cfg.act {
                VisionAct::GeluTanh => {
                    let mut a = b.fc1.forward(&hn);
                    crate::ops::gelu_tanh(&mut a);
                    a
                }
                VisionAct::Gelu => b.fc1.forward_gelu(&hn),
            };
            x = b.fc2.forward_residual(&act, &x);
            // As transformers: features in block order, each from its index's merger.
            if let Some(j) = cfg.deepstack_indexes.iter().position(|&d| d == i) {
                taken.push(self.deepstack[j].forward(&x));
            }
        }
        let merged = self.merger.forward(&x);
        let out = cfg.out_hidden_size;
        let mut features = Vec::with_capacity(images.len());
        let mut tok = 0;
        for &n in &counts {
            let tokens = n / group;
            let range = tok * out..(tok + tokens) * out;
            features.push(ImageFeatures {
                tokens,
                embeds: merged[range.clone()].to_vec(),
                deepstack: taken.iter().map(|d| d[range.clone()].to_vec()).collect(),
            });
            tok += tokens;
        }
        Ok(features)
    }
}

/// The 3-D rotary positions of a prompt whose runs of `image_token` tokens are the images of
/// `grids` in order (transformers' `get_rope_index` for Qwen3-VL / Qwen3.5): text tokens
/// count on from the previous position on all three axes; an image's tokens sit at
/// `(start, start + row, start + col)` over its merged grid, and the text after it starts at
/// `start + max(rows, cols)`. Also returns the delta of later tokens: position = index + delta.
pub fn mrope_positions(
    ids: &[u32],
    image_token: u32,
    grids: &[[usize; 3]],
    merge: usize,
) -> Result<(Vec<[usize; 3]>, i64)> {
    let mut out = Vec::with_capacity(ids.len());
    let mut next = 0usize;
    let mut grid = grids.iter();
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != image_token {
            out.push([next; 3]);
            next += 1;
            i += 1;
            continue;
        }
        let &[t, h, w] = grid.next().ok_or_else(|| {
            Error::InvalidInput("more image token runs in the prompt than images".into())
        })?;
        let (gh, gw) = (h / merge, w / merge);
        let n = t * gh * gw;
        if ids.len() - i < n || ids[i..i + n].iter().any(|&x| x != image_token) {
            return Err(Error::InvalidInput(format!(
                "an image of {n} tokens has fewer placeholder tokens in the prompt"
            )));
        }
        for ti in 0..t {
            for r in 0..gh {
                for c in 0..gw {
                    out.push([next + ti, next + r, next + c]);
                }
            }
        }
        next += gh.max(gw);
        i += n;
    }
    if grid.next().is_some() {
        return Err(Error::InvalidInput(
            "fewer image token runs in the prompt than images".into(),
        ));
    }
    Ok((out, next as i64 - ids.len() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_only_positions_count_up_with_no_delta() {
        let (p, delta) = mrope_positions(&[5, 6, 7], 9, &[], 2).unwrap();
        assert_eq!(p, vec![[0, 0, 0], [1, 1, 1], [2, 2, 2]]);
        assert_eq!(delta, 0);
    }

    #[test]
    fn an_image_sits_on_its_merged_grid_and_text_resumes_past_its_longer_side() {
        // Two text tokens, an image of 4 x 6 patches (2 x 3 tokens), one text token.
        let ids = [1, 2, 9, 9, 9, 9, 9, 9, 3];
        let (p, delta) = mrope_positions(&ids, 9, &[[1, 4, 6]], 2).unwrap();
        assert_eq!(&p[..2], &[[0, 0, 0], [1, 1, 1]]);
        assert_eq!(
            &p[2..8],
            &[
                [2, 2, 2],
                [2, 2, 3],
                [2, 2, 4],
                [2, 3, 2],
                [2, 3, 3],
                [2, 3, 4]
            ]
        );
        assert_eq!(p[8], [5, 5, 5]);
        assert_eq!(delta, 6 - 9);
    }

    #[test]
    fn placeholder_counts_that_disagree_with_the_images_are_refused() {
        assert!(mrope_positions(&[9, 9, 9], 9, &[[1, 4, 6]], 2).is_err());
        assert!(mrope_positions(&[1, 2], 9, &[[1, 2, 2]], 2).is_err());
        assert!(mrope_positions(&[9, 1, 9], 9, &[[1, 2, 2]], 2).is_err());
    }
}
