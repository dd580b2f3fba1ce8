//! Images in prompts: a vision-language model's tower and image settings ([`VisionModel`]),
//! the expansion of each image's placeholder token to one token per merged patch group, and
//! what a running request keeps for its images ([`PromptImages`]): the 3-D rotary position of
//! every prompt token, the image features (encoded when a prompt chunk first needs them; the
//! chunk's image rows take them instead of the placeholder's embedding) and the tokens the
//! prefix cache keys the prompt by (placeholders replaced by ids derived from each image's
//! content, so two prompts share cached pages only where their images are the same).

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use crate::io::store::WeightStore;
use crate::model::batch::InjectedRows;
use crate::model::vision::{
    mrope_positions, ImageFeatures, ImagePatches, VisionConfig, VisionTower, VisionWeights,
};
use crate::vision::{ImageProcessorConfig, PreparedImage};
use crate::{Error, Result};

/// The vision half of a vision-language checkpoint.
#[derive(Debug)]
pub struct VisionModel {
    /// The tower.
    pub tower: VisionTower,
    /// How images are turned into patches (`preprocessor_config.json`).
    pub processor: ImageProcessorConfig,
    /// The placeholder token one image token stands for (`<|image_pad|>`).
    pub image_token_id: u32,
    /// The token before an image (`<|vision_start|>`), if the config names one.
    pub vision_start_id: Option<u32>,
    /// The token after an image (`<|vision_end|>`), if the config names one.
    pub vision_end_id: Option<u32>,
}

impl VisionModel {
    /// Loads the tower of the checkpoint in `dir` when its `config.json` (`top`) has a
    /// `vision_config` and its weights hold the tower; `None` for text-only checkpoints.
    /// `mode` picks how the tower multiplies (`--bf16`: bf16 products).
    pub fn load(
        dir: &Path,
        top: &serde_json::Value,
        store: &WeightStore,
        mode: VisionWeights,
    ) -> Result<Option<Self>> {
        let config_path = dir.join("config.json");
        // A text-only save of a multimodal architecture has a vision config but no tower.
        let Some(prefix) = ["model.visual", "visual"]
            .into_iter()
            .find(|p| store.contains(&format!("{p}.patch_embed.proj.weight")))
        else {
            return Ok(None);
        };
        let Some(cfg) = VisionConfig::from_hf_json(top, &config_path)? else {
            return Ok(None);
        };
        let id = |key: &str| top.get(key).and_then(|v| v.as_u64()).map(|v| v as u32);
        let image_token_id = id("image_token_id").ok_or_else(|| Error::InvalidConfig {
            path: config_path.clone(),
            reason: "a vision model without `image_token_id`".into(),
        })?;
        let processor = ImageProcessorConfig::from_dir(dir)?;
        if processor.patch_size != cfg.patch_size
            || processor.merge_size != cfg.merge_size
            || processor.temporal_patch_size != cfg.temporal_patch_size
        {
            return Err(Error::InvalidConfig {
                path: dir.join("preprocessor_config.json"),
                reason: format!(
                    "patch {} / merge {} / temporal {} differ from the vision tower's {} / {} / {}",
                    processor.patch_size,
                    processor.merge_size,
                    processor.temporal_patch_size,
                    cfg.patch_size,
                    cfg.merge_size,
                    cfg.temporal_patch_size
                ),
            });
        }
        Ok(Some(Self {
            tower: VisionTower::load(cfg, store, prefix, mode)?,
            processor,
            image_token_id,
            vision_start_id: id("vision_start_token_id"),
            vision_end_id: id("vision_end_token_id"),
        }))
    }

    /// Text-model tokens an image becomes.
    pub fn tokens_of(&self, image: &PreparedImage) -> usize {
        let m = self.tower.config().merge_size;
        image.grid_thw.iter().product::<usize>() / (m * m)
    }

    /// `ids` with the `k`-th image placeholder repeated once per token of `images[k]`;
    /// the counts must agree.
    pub fn expand_placeholders(
        &self,
        ids: &[u32],
        images: &[Arc<PreparedImage>],
    ) -> Result<Vec<u32>> {
        let found = ids.iter().filter(|&&t| t == self.image_token_id).count();
        if found != images.len() {
            return Err(Error::InvalidInput(format!(
                "the prompt has {found} image placeholders for {} images",
                images.len()
            )));
        }
        let mut out =
            Vec::with_capacity(ids.len() + images.iter().map(|i| self.tokens_of(i)).sum::<usize>());
        let mut next = images.iter();
        for &t in ids {
            if t == self.image_token_id {
                let img = next.next().expect("counted above");
                out.extend(std::iter::repeat_n(t, self.tokens_of(img)));
            } else {
                out.push(t);
            }
        }
        Ok(out)
    }
}

/// What a running request keeps for the images of its prompt.
pub(crate) struct PromptImages {
    images: Vec<Arc<PreparedImage>>,
    /// 3-D position of every prompt token.
    positions: Vec<[usize; 3]>,
    /// Position of a token past the prompt, minus its index.
    delta: i64,
    /// Prompt index of every image token, ascending (image after image).
    rows: Vec<usize>,
    /// First image-token ordinal of each image, and one past the last.
    starts: Vec<usize>,
    /// Encoded images, as chunks first need them.
    features: Vec<Option<ImageFeatures>>,
    /// The prompt with image tokens replaced by ids derived from the images' content.
    key: Vec<u32>,
}

impl PromptImages {
    /// Plans a prompt whose image tokens (already expanded) take `images` in order.
    pub fn new(
        vision: &VisionModel,
        prompt: &[u32],
        images: Vec<Arc<PreparedImage>>,
    ) -> Result<Self> {
        let rows: Vec<usize> = prompt
            .iter()
            .enumerate()
            .filter(|(_, &t)| t == vision.image_token_id)
            .map(|(i, _)| i)
            .collect();
        let mut starts = vec![0];
        for img in &images {
            starts.push(starts.last().unwrap() + vision.tokens_of(img));
        }
        if *starts.last().unwrap() != rows.len() {
            return Err(Error::InvalidInput(format!(
                "the prompt has {} image tokens; its {} images make {}",
                rows.len(),
                images.len(),
                starts.last().unwrap()
            )));
        }
        let grids: Vec<[usize; 3]> = images.iter().map(|i| i.grid_thw).collect();
        let merge = vision.tower.config().merge_size;
        let (positions, delta) = mrope_positions(prompt, vision.image_token_id, &grids, merge)?;
        let mut key = prompt.to_vec();
        for (k, img) in images.iter().enumerate() {
            let words: Vec<u32> = img
                .content_hash
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            for (j, &row) in rows[starts[k]..starts[k + 1]].iter().enumerate() {
                key[row] = 0x8000_0000 | ((words[j % words.len()] ^ j as u32) & 0x7fff_ffff);
            }
        }
        let features = vec![None; images.len()];
        Ok(Self {
            images,
            positions,
            delta,
            rows,
            starts,
            features,
            key,
        })
    }

    /// The 3-D position of history token `idx` (prompt or generated).
    pub fn position(&self, idx: usize) -> [usize; 3] {
        match self.positions.get(idx) {
            Some(&p) => p,
            None => {
                let p = (idx as i64 + self.delta).max(0) as usize;
                [p, p, p]
            }
        }
    }

    /// The prefix cache's key of `history` (this request's prompt, then generated tokens).
    pub fn key<'a>(&self, history: &'a [u32]) -> Cow<'a, [u32]> {
        let n = self.key.len().min(history.len());
        let mut k = self.key[..n].to_vec();
        k.extend_from_slice(&history[n..]);
        Cow::Owned(k)
    }

    /// Adds the image rows among history tokens `from..to` (batch rows from `at`) to
    /// `out`, encoding the images they belong to first.
    pub fn inject(
        &mut self,
        vision: &VisionModel,
        from: usize,
        to: usize,
        at: usize,
        out: &mut InjectedRows,
    ) -> Result<()> {
        let lo = self.rows.partition_point(|&r| r < from);
        let hi = self.rows.partition_point(|&r| r < to);
        if lo == hi {
            return Ok(());
        }
        let first = self.starts.partition_point(|&s| s <= lo) - 1;
        let last = self.starts.partition_point(|&s| s < hi) - 1;
        let missing: Vec<usize> = (first..=last)
            .filter(|&k| self.features[k].is_none())
            .collect();
        if !missing.is_empty() {
            let patches: Vec<ImagePatches<'_>> = missing
                .iter()
                .map(|&k| ImagePatches {
                    pixel_values: &self.images[k].pixel_values,
                    grid_thw: self.images[k].grid_thw,
                })
                .collect();
            let encoded = vision.tower.encode(&patches)?;
            for (k, f) in missing.into_iter().zip(encoded) {
                self.features[k] = Some(f);
            }
        }
        let width = vision.tower.config().out_hidden_size;
        for ordinal in lo..hi {
            let k = self.starts.partition_point(|&s| s <= ordinal) - 1;
            let f = self.features[k].as_ref().expect("encoded above");
            let j = ordinal - self.starts[k];
            out.rows.push(at + self.rows[ordinal] - from);
            out.embeds
                .extend_from_slice(&f.embeds[j * width..(j + 1) * width]);
            if out.deepstack.len() < f.deepstack.len() {
                out.deepstack.resize(f.deepstack.len(), Vec::new());
            }
            for (d, layer) in out.deepstack.iter_mut().zip(&f.deepstack) {
                d.extend_from_slice(&layer[j * width..(j + 1) * width]);
            }
        }
        Ok(())
    }
}
