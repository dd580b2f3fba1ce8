//! [`TextModel`]: what generating text from a model folder or a GGUF file needs, loaded once.

use std::path::Path;

use serde_json::Value;

use crate::chat::{ChatMessage, ChatTemplate, RenderOptions};
use crate::model::decoder::{load_decoder_from, Decoder};
use crate::model::source::WeightMode;
use crate::model::source::{Placement, TensorSource};
use crate::model::vision::VisionWeights;
use crate::state::{KvDtype, MemoryLayout, SeqState};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A decoder with its tokenizer, chat template and generation-ending tokens.
pub struct TextModel {
    /// The network.
    pub decoder: Box<dyn Decoder>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, when the model ships one.
    pub chat_template: Option<ChatTemplate>,
    /// Tokens that end generation (EOS, end-of-turn).
    pub stop_token_ids: Vec<u32>,
    /// A token to put before every prompt (GGUF files whose `tokenizer.ggml.add_bos_token` is
    /// set); tokenizer.json files add their own through their post-processor.
    pub bos_prefix: Option<u32>,
    /// How the KV caches of new sequences store keys and values (f32 by default).
    pub kv_dtype: KvDtype,
    /// The LoRA adapters it was loaded with (requests pick one of a selectable plan).
    pub lora: Option<std::sync::Arc<crate::lora::LoraPlan>>,
    /// The vision tower and image settings of a vision-language checkpoint.
    pub vision: Option<super::VisionModel>,
    /// The vocabulary as output constraints see it, built on first use.
    vocabulary: std::sync::OnceLock<std::result::Result<crate::grammar::Vocabulary, String>>,
    /// The per-sequence memory layout, worked out on first use (it takes a throwaway state).
    layout: std::sync::OnceLock<MemoryLayout>,
}

impl std::fmt::Debug for TextModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextModel")
            .field("config", &self.decoder.info().config)
            .field("stop_token_ids", &self.stop_token_ids)
            .finish()
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

impl TextModel {
    /// Loads a model folder (config.json, safetensors, tokenizer files, optional
    /// generation_config.json) or a `.gguf` file. `mode` applies to GGUF weights.
    pub fn load(path: &Path, mode: WeightMode) -> Result<Self> {
        Self::load_on(path, &Placement::from(mode))
    }

    /// [`TextModel::load`] with the weights, activations and KV pages on `place.device`.
    pub fn load_on(path: &Path, place: &Placement) -> Result<Self> {
        let source = TensorSource::open(path)?;
        let decoder = load_decoder_from(&source, place)?;
        let mut stop_token_ids = decoder.info().config.eos_token_ids.clone();
        let vision = match &source {
            TensorSource::Safetensors { store, config, .. } => {
                let mode = match place.mode {
                    crate::model::source::WeightMode::Bf16 => VisionWeights::Bf16,
                    _ => VisionWeights::Exact,
                };
                super::VisionModel::load(path, config, store, mode)?
            }
            TensorSource::Gguf(_) => None,
        };
        let (tokenizer, chat_template, bos_prefix) = match &source {
            TensorSource::Safetensors { .. } => {
                let tokenizer = Tokenizer::from_dir(path)?;
                let config = path.join("tokenizer_config.json");
                let chat_template =
                    if config.is_file() || path.join("chat_template.jinja").is_file() {
                        ChatTemplate::from_tokenizer_config(&config)?
                    } else {
                        None
                    };
                if let Some(g) = read_json(&path.join("generation_config.json"))? {
                    stop_token_ids.extend(ids_of(g.get("eos_token_id")));
                }
                if let Some(eos) = chat_template.as_ref().and_then(|t| t.eos_token()) {
                    stop_token_ids.extend(tokenizer.token_to_id(eos));
                }
                (tokenizer, chat_template, None)
            }
            TensorSource::Gguf(gguf) => {
                let header = gguf.header();
                let tokenizer = Tokenizer::from_gguf(header)?;
                let token = |key: &str| {
                    header
                        .metadata(key)
                        .and_then(|v| v.as_u32())
                        .and_then(|id| tokenizer.id_to_token(id).map(|t| (id, t.to_string())))
                };
                let bos = token("tokenizer.ggml.bos_token_id");
                let eos = token("tokenizer.ggml.eos_token_id");
                stop_token_ids.extend(eos.iter().map(|e| e.0));
                stop_token_ids.extend(token("tokenizer.ggml.eot_token_id").map(|e| e.0));
                let chat_template = header
                    .metadata("tokenizer.chat_template")
                    .and_then(|v| v.as_str())
                    .map(|src| {
                        ChatTemplate::new(
                            src,
                            bos.as_ref().map(|b| b.1.clone()),
                            eos.as_ref().map(|e| e.1.clone()),
                        )
                    })
                    .transpose()?;
                // llama.cpp's default: SentencePiece vocabularies add BOS, BPE ones do not.
                let spm = header
                    .metadata("tokenizer.ggml.model")
                    .and_then(|v| v.as_str())
                    == Some("llama");
                let add_bos = header
                    .metadata("tokenizer.ggml.add_bos_token")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(spm);
                (
                    tokenizer,
                    chat_template,
                    bos.filter(|_| add_bos).map(|b| b.0),
                )
            }
        };
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        Ok(Self {
            decoder,
            tokenizer,
            chat_template,
            stop_token_ids,
            bos_prefix,
            kv_dtype: KvDtype::F32,
            lora: place.lora.clone(),
            vision,
            vocabulary: std::sync::OnceLock::new(),
            layout: std::sync::OnceLock::new(),
        })
    }

    /// Compiles an output constraint over this model's vocabulary (the vocabulary is built on
    /// the first call); an invalid or unsupported one is an error naming what is wrong.
    pub fn compile_constraint(
        &self,
        spec: &crate::grammar::Spec,
    ) -> Result<crate::grammar::Constraint> {
        let vocab = self
            .vocabulary
            .get_or_init(|| {
                let n = self.decoder.info().config.vocab_size;
                let eos = self.stop_token_ids.first().copied().unwrap_or(0);
                crate::grammar::Vocabulary::new(&self.tokenizer, n, eos).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::InvalidInput(e.clone()))?;
        vocab.compile(spec)
    }

    /// Why this model cannot draft for speculative decoding, if it cannot: a rejected draft
    /// rolls the sequence back, and a recurrent state on a GPU is updated in place (hybrid
    /// models draft on the CPU only). Verified logits equal decode's bit for bit on the CPU
    /// (short chunks run row by row); on a GPU the verifying pass takes the prompt kernels,
    /// which sum in another order, so they agree to f32 rounding (the GPU's batched decode
    /// differs from its one-row decode the same way).
    pub fn draft_refusal(&self) -> Option<String> {
        let device = &self.decoder.info().device;
        (!device.is_cpu() && self.memory_layout().is_recurrent()).then(|| {
            format!(
                "speculative decoding of a model with recurrent layers does not run on {device} \
                 yet (its state there cannot be rolled back after a rejected draft)"
            )
        })
    }

    /// The per-sequence memory the decoder needs (layer kinds, row width, its context).
    pub fn memory_layout(&self) -> MemoryLayout {
        self.layout
            .get_or_init(|| {
                let mut layout = self.decoder.new_cache(1).layout();
                layout.max_positions = self.decoder.info().config.max_positions;
                layout
            })
            .clone()
    }

    /// An empty state for a new sequence of at most `max_len` tokens, with [`Self::kv_dtype`].
    pub fn new_cache(&self, max_len: usize) -> SeqState {
        self.decoder.new_cache(max_len).with_kv_dtype(self.kv_dtype)
    }

    /// Token ids of a raw prompt, with the model's special tokens (BOS) when `add_special`.
    pub fn encode_prompt(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, add_special);
        let mut ids = Vec::with_capacity(enc.ids.len() + 1);
        if add_special {
            if let Some(b) = self.bos_prefix {
                if enc.ids.first() != Some(&b) {
                    ids.push(b);
                }
            }
        }
        ids.extend_from_slice(&enc.ids);
        Ok(ids)
    }

    /// The vision tower, or the error that says the model takes no images.
    fn vision(&self) -> Result<&super::VisionModel> {
        self.vision.as_ref().ok_or_else(|| {
            Error::InvalidInput("this model takes no images (it has no vision tower)".into())
        })
    }

    /// Reads an image for this vision-language model: decoded within `limits`, resized and
    /// cut into patches as the model's image processor does.
    pub fn prepare_image(
        &self,
        bytes: &[u8],
        limits: &crate::vision::ImageLimits,
    ) -> Result<std::sync::Arc<crate::vision::PreparedImage>> {
        let v = self.vision()?;
        Ok(std::sync::Arc::new(crate::vision::load(
            bytes,
            limits,
            &v.processor,
        )?))
    }

    /// The tokens that stand for one image in a raw prompt: `<|vision_start|>`, the image
    /// placeholder, `<|vision_end|>` (expanded by [`TextModel::expand_images`]).
    pub fn image_marker(&self) -> Result<Vec<u32>> {
        let v = self.vision()?;
        Ok(v.vision_start_id
            .into_iter()
            .chain([v.image_token_id])
            .chain(v.vision_end_id)
            .collect())
    }

    /// `ids` with each image placeholder repeated once per token of its image (`images` in
    /// the order of the placeholders); unchanged without images.
    pub fn expand_images(
        &self,
        ids: Vec<u32>,
        images: &[std::sync::Arc<crate::vision::PreparedImage>],
    ) -> Result<Vec<u32>> {
        match &self.vision {
            Some(v) => v.expand_placeholders(&ids, images),
            None if images.is_empty() => Ok(ids),
            None => self.vision().map(|_| ids),
        }
    }

    /// Renders `messages` with the chat template (ending with the assistant header) and
    /// tokenizes the result; special tokens in the rendered text are recognized as such.
    pub fn encode_chat(&self, messages: &[ChatMessage], opts: &RenderOptions) -> Result<Vec<u32>> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            Error::InvalidInput("this model has no chat template; use a raw prompt".into())
        })?;
        let text = template.render(messages, opts)?;
        // The template writes BOS itself where the model wants it.
        let enc = self.tokenizer.encode(&text, false);
        Ok(enc.ids)
    }
}
