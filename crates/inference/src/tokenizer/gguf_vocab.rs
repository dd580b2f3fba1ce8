//! A WordPiece tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file (llama.cpp's `bert`
//! tokenizer model). llama.cpp stores BERT vocabularies in "phantom space" form: a token that
//! starts a word carries a leading `▁` and a continuation has no `##`. We turn them back into
//! WordPiece form (`▁x` → `x`, `x` → `##x`; control tokens and bracketed `[unused0]`-style
//! tokens stay as they are) and then build the same pipeline as a BERT `vocab.txt`: uncased,
//! accents stripped, `[CLS] A [SEP]`, since llama.cpp's WPM tokenizer always lowercases.

use crate::io::gguf::GgufFile;
use crate::Result;

use super::added::AddedToken;
use super::json::invalid;
use super::normalize::BertNormalizer;
use super::Tokenizer;

/// GGUF token type of control tokens (`[CLS]`, `[SEP]`, ...).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of user-defined tokens, which are not word pieces either.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Undoes llama.cpp's phantom-space conversion of one BERT token.
fn wordpiece_form(token: &str, token_type: Option<i64>) -> String {
    if let Some(rest) = token.strip_prefix('\u{2581}') {
        return rest.to_owned();
    }
    let bracketed = token.len() > 2 && token.starts_with('[') && token.ends_with(']');
    if bracketed
        || matches!(
            token_type,
            Some(TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)
        )
    {
        return token.to_owned();
    }
    format!("##{token}")
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` keys: the `bert`
    /// tokenizer model (WordPiece), `gpt2` (byte-level BPE, for the pre-tokenizers listed in
    /// `gguf_bpe`), `llama` (SentencePiece BPE by score) or `gemma4` (BPE over raw UTF-8).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let path = file.path();
        let meta_str = |k: &str| file.metadata(k).and_then(|v| v.as_str());
        let meta_id = |k: &str| file.metadata(k).and_then(|v| v.as_u32());
        match meta_str("tokenizer.ggml.model") {
            Some("bert") => {}
            Some("gpt2") => return super::gguf_bpe::from_gguf_bpe(file),
            Some("llama") => return super::gguf_spm::from_gguf_spm(file),
            Some("gemma4") => return super::gguf_bpe::from_gguf_gemma4(file),
            Some(other) => {
                return Err(invalid(
                    path,
                    format!(
                        "unsupported GGUF tokenizer model `{other}` (`bert`, `gpt2`, \
                         `llama` and `gemma4` are implemented)"
                    ),
                ))
            }
            None => return Err(invalid(path, "no tokenizer.ggml.model key")),
        }
        let tokens = file
            .metadata("tokenizer.ggml.tokens")
            .and_then(|v| v.as_string_array())
            .ok_or_else(|| invalid(path, "tokenizer.ggml.tokens is missing or not strings"))?;
        let types = file
            .metadata("tokenizer.ggml.token_type")
            .and_then(|v| v.as_array());
        let vocab: Vec<String> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| wordpiece_form(t, types.and_then(|a| a.int_at(i))))
            .collect();
        let name = |id: Option<u32>, what: &str| -> Result<(String, u32)> {
            let id = id.ok_or_else(|| invalid(path, format!("no {what} token id")))?;
            let tok = vocab
                .get(id as usize)
                .ok_or_else(|| invalid(path, format!("{what} token id {id} is out of range")))?;
            Ok((tok.clone(), id))
        };
        let unk = name(meta_id("tokenizer.ggml.unknown_token_id"), "unknown")?;
        // llama.cpp spells the key "seperator"; accept the correct spelling too.
        let sep_id = meta_id("tokenizer.ggml.seperator_token_id")
            .or_else(|| meta_id("tokenizer.ggml.separator_token_id"))
            .or_else(|| meta_id("tokenizer.ggml.eos_token_id"));
        let sep = name(sep_id, "separator")?;
        let cls_id = meta_id("tokenizer.ggml.cls_token_id")
            .or_else(|| meta_id("tokenizer.ggml.bos_token_id"));
        let cls = name(cls_id, "cls")?;

        let mut added: Vec<AddedToken> = Vec::new();
        for (i, t) in vocab.iter().enumerate() {
            if types.and_then(|a| a.int_at(i)) == Some(TOKEN_TYPE_CONTROL) {
                added.push(AddedToken::special(i as u32, t));
            }
        }
        for key in ["padding", "mask", "unknown"] {
            if let Some(id) = meta_id(&format!("tokenizer.ggml.{key}_token_id")) {
                if let Some(t) = vocab.get(id as usize) {
                    if !added.iter().any(|a| a.id == id) {
                        added.push(AddedToken::special(id, t));
                    }
                }
            }
        }
        super::load::bert_pipeline(
            path,
            vocab,
            &unk.0,
            cls,
            sep,
            added,
            BertNormalizer::default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phantom_space_round_trip() {
        assert_eq!(wordpiece_form("\u{2581}hello", Some(1)), "hello");
        assert_eq!(wordpiece_form("ing", Some(1)), "##ing");
        assert_eq!(wordpiece_form("[unused3]", Some(1)), "[unused3]");
        assert_eq!(wordpiece_form("[CLS]", Some(3)), "[CLS]");
    }
}
