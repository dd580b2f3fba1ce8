//! A byte-level BPE tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file (llama.cpp's
//! `gpt2` tokenizer model). GGUF keeps the vocabulary, merges and token types but not the
//! pre-tokenizer, only its name (`tokenizer.ggml.pre`); the split pattern and normalizer of the
//! HF tokenizers those names stand for are listed here. Control and user-defined tokens become
//! added tokens (matched in the raw input). Also llama.cpp's `gemma4` model: BPE over raw UTF-8
//! with `▁` for spaces. This module builds tokenizers; it does not tokenize.

use fancy_regex::Regex;

use crate::io::gguf::GgufFile;
use crate::Result;

use super::added::AddedToken;
use super::bpe::{Bpe, BpeOptions};
use super::decode::Decoder;
use super::json::invalid;
use super::model::Model;
use super::normalizers::{Form, Normalizer};
use super::pretokenize::{Behavior, PreTokenizer, SplitPattern, GPT2_PATTERN};
use super::Tokenizer;

/// Split pattern of Llama 3 (`llama-bpe`).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Split pattern of Qwen2 / Qwen3 (`qwen2`).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Split pattern of Qwen3.5 (`qwen35`): Qwen2's with combining marks (`\p{M}`) in words.
const QWEN35_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Letters of DeepSeek LLM's word split (cased scripts, as in its `tokenizer.json`).
const DEEPSEEK_LETTERS: &str = "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃";
/// Punctuation of DeepSeek LLM's split (ASCII and full-width symbols, quotes, CJK marks).
const DEEPSEEK_PUNCT: &str = "!-/:-~！-／：-～‘-‟　-。";
/// CJK ideographs and Hangul as DeepSeek's split ranges them.
const DEEPSEEK_CJK: &str = "一-龥ࠀ-一가-퟿";

/// Split patterns (applied in turn, each isolating its matches) of DeepSeek LLM.
fn deepseek_llm_patterns() -> Vec<String> {
    vec![
        r"[\r\n]".into(),
        format!(r"\s?[{DEEPSEEK_LETTERS}]+"),
        format!(r"\s?[{DEEPSEEK_PUNCT}]+"),
        r"\s+$".into(),
        format!("[{DEEPSEEK_CJK}]+"),
        r"\p{N}+".into(),
    ]
}

/// Split patterns of DeepSeek Coder.
fn deepseek_coder_patterns() -> Vec<String> {
    vec![
        r"[\r\n]".into(),
        r"\s?\p{L}+".into(),
        r"\s?\p{P}+".into(),
        format!("[{DEEPSEEK_CJK}]+"),
        r"\p{N}".into(),
    ]
}

/// Split patterns of Falcon: runs of punctuation (Unicode's and ASCII's), GPT-2's split, then
/// runs of three ASCII digits.
fn falcon_patterns() -> Vec<String> {
    vec![
        r"[\p{P}\$\+<=>\^~\|`]+".into(),
        GPT2_PATTERN.into(),
        "[0-9][0-9][0-9]".into(),
    ]
}

/// GGUF token type of control tokens.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF token type of user-defined tokens.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// (pre-tokenizer, normalizer, ignore_merges) of the HF tokenizer a `tokenizer.ggml.pre` names.
fn pipeline(pre: &str) -> Option<(PreTokenizer, Option<Normalizer>, bool)> {
    let split = |pattern: &str| -> Option<PreTokenizer> {
        let re = Regex::new(pattern).ok()?;
        Some(PreTokenizer::Sequence(vec![
            PreTokenizer::Split {
                pattern: SplitPattern::Regex(Box::new(re)),
                behavior: Behavior::Isolated,
                invert: false,
            },
            PreTokenizer::ByteLevel {
                add_prefix_space: false,
                regex: None,
            },
        ]))
    };
    let gpt2 = || -> Option<PreTokenizer> {
        let re = Regex::new(GPT2_PATTERN).ok()?;
        Some(PreTokenizer::ByteLevel {
            add_prefix_space: false,
            regex: Some(SplitPattern::Regex(Box::new(re))),
        })
    };
    // Several splits in turn, then the byte-level mapping without a split of its own.
    let splits = |patterns: Vec<String>| -> Option<PreTokenizer> {
        let mut seq = Vec::with_capacity(patterns.len() + 1);
        for p in &patterns {
            seq.push(PreTokenizer::Split {
                pattern: SplitPattern::Regex(Box::new(Regex::new(p).ok()?)),
                behavior: Behavior::Isolated,
                invert: false,
            });
        }
        seq.push(PreTokenizer::ByteLevel {
            add_prefix_space: false,
            regex: None,
        });
        Some(PreTokenizer::Sequence(seq))
    };
    let digits_then = |rest: PreTokenizer| {
        PreTokenizer::Sequence(vec![
            PreTokenizer::Split {
                pattern: SplitPattern::Class(char::is_numeric),
                behavior: Behavior::Isolated,
                invert: false,
            },
            rest,
        ])
    };
    match pre {
        "gpt-2" | "default" => Some((gpt2()?, None, false)),
        // GPT-NeoX's tokenizer (MPT) normalizes to NFC.
        "mpt" => Some((gpt2()?, Some(Normalizer::Unicode(Form::Nfc)), false)),
        // StarCoder-style: every digit alone, then GPT-2's split (llama.cpp groups SmolLM,
        // CodeShell, EXAONE and Minerva with these).
        "starcoder" | "refact" | "smollm" | "codeshell" | "exaone" | "minerva" => {
            Some((digits_then(gpt2()?), None, false))
        }
        "command-r" => Some((
            digits_then(gpt2()?),
            Some(Normalizer::Unicode(Form::Nfc)),
            false,
        )),
        "llama-bpe" | "llama3" => Some((split(LLAMA3_PATTERN)?, None, true)),
        "qwen2" => Some((
            split(QWEN2_PATTERN)?,
            Some(Normalizer::Unicode(Form::Nfc)),
            false,
        )),
        // Qwen3.5 keeps combining marks as they are: no NFC (llama.cpp's vectors agree).
        "qwen35" => Some((split(QWEN35_PATTERN)?, None, false)),
        "deepseek-llm" => Some((splits(deepseek_llm_patterns())?, None, false)),
        "deepseek-coder" => Some((splits(deepseek_coder_patterns())?, None, false)),
        "falcon" => Some((splits(falcon_patterns())?, None, false)),
        _ => None,
    }
}

/// Builds the tokenizer of a GGUF file whose `tokenizer.ggml.model` is `gpt2`.
pub(crate) fn from_gguf_bpe(file: &GgufFile) -> Result<Tokenizer> {
    let path = file.path();
    let pre_name = file
        .metadata("tokenizer.ggml.pre")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let (pre, normalizer, ignore_merges) = pipeline(pre_name).ok_or_else(|| {
        invalid(
            path,
            format!(
                "unsupported GGUF pre-tokenizer `{pre_name}` (implemented: gpt-2, mpt, \
                 starcoder, refact, smollm, codeshell, exaone, minerva, command-r, llama-bpe, \
                 qwen2, qwen35, deepseek-llm, deepseek-coder, falcon)"
            ),
        )
    })?;
    let tokens = file
        .metadata("tokenizer.ggml.tokens")
        .and_then(|v| v.as_string_array())
        .ok_or_else(|| invalid(path, "tokenizer.ggml.tokens is missing or not strings"))?;
    let merges = file
        .metadata("tokenizer.ggml.merges")
        .and_then(|v| v.as_string_array())
        .ok_or_else(|| invalid(path, "tokenizer.ggml.merges is missing or not strings"))?;
    let types = file
        .metadata("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array());
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let mut parts = m.splitn(3, ' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) => pairs.push((a.to_owned(), b.to_owned())),
            _ => {
                return Err(invalid(
                    path,
                    format!("tokenizer.ggml.merges[{i}] is not `a b`"),
                ))
            }
        }
    }
    let mut added = Vec::new();
    let mut entries = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let id = u32::try_from(i).map_err(|_| invalid(path, "too many tokens"))?;
        match types.and_then(|a| a.int_at(i)) {
            Some(TOKEN_TYPE_CONTROL) => added.push(AddedToken::special(id, t)),
            Some(TOKEN_TYPE_USER_DEFINED) => {
                let mut tok = AddedToken::special(id, t);
                tok.special = false;
                added.push(tok);
            }
            _ => {}
        }
        entries.push((t.clone(), id));
    }
    let opts = BpeOptions {
        ignore_merges,
        ..BpeOptions::default()
    };
    let model = Bpe::new(entries, pairs, opts).map_err(|e| invalid(path, e.to_string()))?;
    Ok(Tokenizer::from_parts(
        normalizer,
        pre,
        Model::Bpe(Box::new(model)),
        added,
        None,
        Decoder::ByteLevel,
    ))
}

/// Builds the tokenizer of a GGUF file whose `tokenizer.ggml.model` is `gemma4`: BPE over raw
/// UTF-8 (no byte-level mapping) with spaces replaced by `▁`, the text split into runs of
/// newlines and runs of other characters, byte fallback through `<0xNN>` tokens, and runs of
/// newlines that are tokens kept whole (as llama.cpp does). Control and user-defined tokens are
/// matched in the raw input.
pub(crate) fn from_gguf_gemma4(file: &GgufFile) -> Result<Tokenizer> {
    let path = file.path();
    let tokens = file
        .metadata("tokenizer.ggml.tokens")
        .and_then(|v| v.as_string_array())
        .ok_or_else(|| invalid(path, "tokenizer.ggml.tokens is missing or not strings"))?;
    let merges = file
        .metadata("tokenizer.ggml.merges")
        .and_then(|v| v.as_string_array())
        .ok_or_else(|| invalid(path, "tokenizer.ggml.merges is missing or not strings"))?;
    let types = file
        .metadata("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array());
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        // The separator is the first space after the first byte (a token may be a space).
        let sep = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
        match sep {
            Some(p) => pairs.push((m[..p].to_owned(), m[p + 1..].to_owned())),
            None => {
                return Err(invalid(
                    path,
                    format!("tokenizer.ggml.merges[{i}] is not `a b`"),
                ))
            }
        }
    }
    let mut added = Vec::new();
    let mut entries = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let id = u32::try_from(i).map_err(|_| invalid(path, "too many tokens"))?;
        let newlines = !t.is_empty() && t.bytes().all(|b| b == b'\n');
        match types.and_then(|a| a.int_at(i)) {
            Some(TOKEN_TYPE_CONTROL) => added.push(AddedToken::special(id, t)),
            Some(TOKEN_TYPE_USER_DEFINED) => {
                let mut tok = AddedToken::special(id, t);
                tok.special = false;
                added.push(tok);
            }
            _ if newlines => {
                let mut tok = AddedToken::special(id, t);
                tok.special = false;
                added.push(tok);
            }
            _ => {}
        }
        entries.push((t.clone(), id));
    }
    let opts = BpeOptions {
        byte_fallback: true,
        ..BpeOptions::default()
    };
    let model = Bpe::new(entries, pairs, opts).map_err(|e| invalid(path, e.to_string()))?;
    let re =
        Regex::new(r"[^\n]+|[\n]+").map_err(|e| invalid(path, format!("split pattern: {e}")))?;
    let pre = PreTokenizer::Split {
        pattern: SplitPattern::Regex(Box::new(re)),
        behavior: Behavior::Isolated,
        invert: false,
    };
    Ok(Tokenizer::from_parts(
        Some(Normalizer::Replace {
            pattern: " ".into(),
            content: "\u{2581}".into(),
        }),
        pre,
        Model::Bpe(Box::new(model)),
        added,
        None,
        Decoder::Sequence(vec![
            Decoder::Replace {
                pattern: "\u{2581}".into(),
                content: " ".into(),
            },
            Decoder::ByteFallback,
            Decoder::Fuse,
        ]),
    ))
}
