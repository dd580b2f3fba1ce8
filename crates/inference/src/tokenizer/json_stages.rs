//! `tokenizer.json` sections that come as a `type`-tagged component (with `Sequence` for
//! composition): normalizers, pre-tokenizers, decoders, and the BPE and Unigram models. Each unknown type is
//! rejected with an error naming it. [`super::json`] reads the file and the other sections; this
//! module builds stage values and does not run them.

use fancy_regex::Regex;
use serde_json::{Map, Value};

use super::bpe::{Bpe, BpeOptions};
use super::decode::Decoder;
use super::json::{as_object, bad, field, get_bool, get_str, get_usize, type_of, Parsed, Reason};
use super::normalize::BertNormalizer;
use super::normalizers::{Form, Normalizer, Pattern};
use super::pretokenize::{Behavior, PreTokenizer, Prepend, SplitPattern, GPT2_PATTERN};
use super::unigram::Unigram;
use crate::sentencepiece::charsmap::CharsMap;

fn list<'a>(obj: &'a Map<String, Value>, key: &str, what: &str) -> Parsed<&'a Vec<Value>> {
    field(obj, key)
        .and_then(Value::as_array)
        .ok_or_else(|| Reason(format!("{what}.{key} must be an array")))
}

/// `{"String": s}` or `{"Regex": r}`: (is_regex, text).
fn pattern<'a>(obj: &'a Map<String, Value>, what: &str) -> Parsed<(bool, &'a str)> {
    let p = field(obj, "pattern").ok_or_else(|| format!("{what}.pattern is missing"))?;
    let p = as_object(p, &format!("{what}.pattern"))?;
    if let Some(s) = p.get("String").and_then(Value::as_str) {
        return Ok((false, s));
    }
    if let Some(r) = p.get("Regex").and_then(Value::as_str) {
        return Ok((true, r));
    }
    bad(format!(
        "{what}.pattern must be {{\"String\": ..}} or {{\"Regex\": ..}}"
    ))
}

fn regex(src: &str, what: &str) -> Parsed<Box<Regex>> {
    Regex::new(src)
        .map(Box::new)
        .map_err(|e| Reason(format!("{what}: cannot compile regex {src:?}: {e}")))
}

/// Parses a `normalizer` section.
pub(super) fn parse_normalizer(v: &Value) -> Parsed<Normalizer> {
    let what = "normalizer";
    let obj = as_object(v, what)?;
    Ok(match type_of(obj, what)? {
        "BertNormalizer" => {
            let lowercase = get_bool(obj, "lowercase", true, what)?;
            Normalizer::Bert(BertNormalizer {
                clean_text: get_bool(obj, "clean_text", true, what)?,
                handle_chinese_chars: get_bool(obj, "handle_chinese_chars", true, what)?,
                strip_accents: get_bool(obj, "strip_accents", lowercase, what)?,
                lowercase,
            })
        }
        "NFC" => Normalizer::Unicode(Form::Nfc),
        "NFD" => Normalizer::Unicode(Form::Nfd),
        "NFKC" => Normalizer::Unicode(Form::Nfkc),
        "Lowercase" => Normalizer::Lowercase,
        "Prepend" => Normalizer::Prepend(
            get_str(obj, "prepend", what)?
                .ok_or("normalizer Prepend has no `prepend`")?
                .to_owned(),
        ),
        "Replace" => {
            let (is_regex, pat) = pattern(obj, "normalizer Replace")?;
            let content = get_str(obj, "content", what)?.unwrap_or("").to_owned();
            if is_regex {
                Normalizer::ReplaceRegex {
                    pattern: Pattern(regex(pat, "normalizer Replace")?),
                    content,
                }
            } else if pat.is_empty() {
                return bad("normalizer Replace: empty String pattern");
            } else {
                Normalizer::Replace {
                    pattern: pat.to_owned(),
                    content,
                }
            }
        }
        "Precompiled" => {
            let blob = get_str(obj, "precompiled_charsmap", what)?
                .ok_or("normalizer type `Precompiled` has no `precompiled_charsmap`")?;
            let blob = base64_decode(blob)
                .ok_or("normalizer Precompiled: precompiled_charsmap is not valid base64")?;
            let map = CharsMap::parse(&blob)
                .map_err(|e| Reason(format!("normalizer Precompiled: {e}")))?;
            Normalizer::Precompiled(Box::new(map))
        }
        "Strip" => Normalizer::Strip {
            left: get_bool(obj, "strip_left", true, what)?,
            right: get_bool(obj, "strip_right", true, what)?,
        },
        "Sequence" => Normalizer::Sequence(
            list(obj, "normalizers", what)?
                .iter()
                .map(parse_normalizer)
                .collect::<Parsed<_>>()?,
        ),
        other => {
            return bad(format!(
                "unsupported normalizer type `{other}` (implemented: BertNormalizer, NFC, NFD, \
                 NFKC, Lowercase, Prepend, Replace, Strip, Precompiled, Sequence)"
            ))
        }
    })
}

fn behavior(obj: &Map<String, Value>, what: &str) -> Parsed<Behavior> {
    Ok(
        match get_str(obj, "behavior", what)?.unwrap_or("Isolated") {
            "Removed" => Behavior::Removed,
            "Isolated" => Behavior::Isolated,
            "MergedWithPrevious" => Behavior::MergedWithPrevious,
            "MergedWithNext" => Behavior::MergedWithNext,
            "Contiguous" => Behavior::Contiguous,
            other => return bad(format!("{what}: unknown split behavior `{other}`")),
        },
    )
}

fn replacement(obj: &Map<String, Value>, what: &str) -> Parsed<char> {
    let s = get_str(obj, "replacement", what)?.unwrap_or("\u{2581}");
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Ok(c),
        _ => bad(format!(
            "{what} Metaspace: `replacement` must be one character"
        )),
    }
}

/// `prepend_scheme` (or the older `add_prefix_space` flag).
fn prepend_scheme(obj: &Map<String, Value>, what: &str) -> Parsed<Prepend> {
    Ok(match get_str(obj, "prepend_scheme", what)? {
        Some("always") => Prepend::Always,
        Some("first") => Prepend::First,
        Some("never") => Prepend::Never,
        Some(other) => {
            return bad(format!(
                "{what} Metaspace: unknown prepend_scheme `{other}`"
            ))
        }
        None if get_bool(obj, "add_prefix_space", true, what)? => Prepend::Always,
        None => Prepend::Never,
    })
}

/// Parses a `pre_tokenizer` section; `nested` is true inside a `Sequence`.
pub(super) fn parse_pre_tokenizer(v: &Value, nested: bool) -> Parsed<PreTokenizer> {
    let what = "pre_tokenizer";
    let obj = as_object(v, what)?;
    Ok(match type_of(obj, what)? {
        "BertPreTokenizer" => PreTokenizer::Bert,
        "ByteLevel" => {
            let add_prefix_space = get_bool(obj, "add_prefix_space", true, what)?;
            if add_prefix_space && nested {
                return bad(
                    "pre_tokenizer ByteLevel with add_prefix_space inside a Sequence \
                            is not implemented",
                );
            }
            let regex = if get_bool(obj, "use_regex", true, what)? {
                Some(SplitPattern::Regex(regex(GPT2_PATTERN, what)?))
            } else {
                None
            };
            PreTokenizer::ByteLevel {
                add_prefix_space,
                regex,
            }
        }
        "Split" => {
            let (is_regex, pat) = pattern(obj, "pre_tokenizer Split")?;
            let pattern = if is_regex {
                SplitPattern::Regex(regex(pat, what)?)
            } else if pat.is_empty() {
                return bad("pre_tokenizer Split: empty String pattern");
            } else {
                SplitPattern::Literal(pat.to_owned())
            };
            PreTokenizer::Split {
                pattern,
                behavior: behavior(obj, what)?,
                invert: get_bool(obj, "invert", false, what)?,
            }
        }
        "Metaspace" => {
            if nested {
                return bad("pre_tokenizer Metaspace inside a Sequence is not implemented");
            }
            PreTokenizer::Metaspace {
                replacement: replacement(obj, what)?,
                prepend: prepend_scheme(obj, what)?,
                split: get_bool(obj, "split", true, what)?,
            }
        }
        "Whitespace" => PreTokenizer::Split {
            pattern: SplitPattern::Regex(regex(r"\w+|[^\w\s]+", what)?),
            behavior: Behavior::Removed,
            invert: true,
        },
        "WhitespaceSplit" => PreTokenizer::Split {
            pattern: SplitPattern::Class(char::is_whitespace),
            behavior: Behavior::Removed,
            invert: false,
        },
        "Digits" => PreTokenizer::Split {
            pattern: SplitPattern::Class(char::is_numeric),
            behavior: if get_bool(obj, "individual_digits", false, what)? {
                Behavior::Isolated
            } else {
                Behavior::Contiguous
            },
            invert: false,
        },
        "Sequence" => PreTokenizer::Sequence(
            list(obj, "pretokenizers", what)?
                .iter()
                .map(|p| parse_pre_tokenizer(p, true))
                .collect::<Parsed<_>>()?,
        ),
        other => {
            return bad(format!(
                "unsupported pre_tokenizer type `{other}` (implemented: BertPreTokenizer, \
                 ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit, Digits, Sequence)"
            ))
        }
    })
}

/// Parses a `decoder` section.
pub(super) fn parse_decoder(v: &Value) -> Parsed<Decoder> {
    let what = "decoder";
    let obj = as_object(v, what)?;
    Ok(match type_of(obj, what)? {
        "WordPiece" => Decoder::WordPiece {
            prefix: get_str(obj, "prefix", what)?.unwrap_or("##").to_owned(),
            cleanup: get_bool(obj, "cleanup", true, what)?,
        },
        "ByteLevel" => Decoder::ByteLevel,
        "Metaspace" => Decoder::Metaspace {
            replacement: replacement(obj, what)?,
            strip_first: prepend_scheme(obj, what)? != Prepend::Never,
        },
        "ByteFallback" => Decoder::ByteFallback,
        "Fuse" => Decoder::Fuse,
        "Replace" => {
            let (is_regex, pat) = pattern(obj, "decoder Replace")?;
            if is_regex || pat.is_empty() {
                return bad("decoder Replace: only non-empty String patterns are implemented");
            }
            Decoder::Replace {
                pattern: pat.to_owned(),
                content: get_str(obj, "content", what)?.unwrap_or("").to_owned(),
            }
        }
        "Strip" => {
            let content = get_str(obj, "content", what)?.unwrap_or(" ");
            let mut chars = content.chars();
            let (Some(c), None) = (chars.next(), chars.next()) else {
                return bad("decoder Strip: `content` must be one character");
            };
            Decoder::Strip {
                content: c,
                start: get_usize(obj, "start", what)?.unwrap_or(0),
                stop: get_usize(obj, "stop", what)?.unwrap_or(0),
            }
        }
        "Sequence" => Decoder::Sequence(
            list(obj, "decoders", what)?
                .iter()
                .map(parse_decoder)
                .collect::<Parsed<_>>()?,
        ),
        other => {
            return bad(format!(
                "unsupported decoder type `{other}` (implemented: WordPiece, ByteLevel, \
                 ByteFallback, Fuse, Replace, Strip, Metaspace, Sequence)"
            ))
        }
    })
}

/// Standard base64 (`+`, `/`, optional `=` padding, no line breaks); `None` when malformed.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    let body = s.trim_end_matches('=').as_bytes();
    if s.len() - body.len() > 2 || body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    for chunk in body.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | sextet(c)?;
        }
        acc <<= 6 * (4 - chunk.len() as u32);
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Parses a `model` section of type `Unigram`: `vocab` as `[[piece, score], ...]`, `unk_id`
/// (required) and `byte_fallback`.
pub(super) fn parse_unigram(obj: &Map<String, Value>) -> Parsed<Unigram> {
    let what = "model";
    let vocab = list(obj, "vocab", what)?
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_array().map(Vec::as_slice) {
            Some([p, s]) => match (p.as_str(), s.as_f64()) {
                (Some(p), Some(s)) => Ok((p.to_owned(), s)),
                _ => bad(format!("model.vocab[{i}] must be [string, number]")),
            },
            _ => bad(format!("model.vocab[{i}] must be [piece, score]")),
        })
        .collect::<Parsed<Vec<_>>>()?;
    let unk_id = match field(obj, "unk_id") {
        None => {
            return bad("model.unk_id is missing (a Unigram model without one is not supported)")
        }
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or("model.unk_id must be an integer id")?,
    };
    let byte_fallback = get_bool(obj, "byte_fallback", false, what)?;
    Unigram::new(vocab, unk_id, byte_fallback).map_err(|e| Reason(format!("model: {e}")))
}

/// One merge: `"a b"` or `["a", "b"]`.
fn merge(i: usize, v: &Value) -> Parsed<(String, String)> {
    if let Some(s) = v.as_str() {
        let mut parts = s.splitn(3, ' ');
        if let (Some(a), Some(b), None) = (parts.next(), parts.next(), parts.next()) {
            return Ok((a.to_owned(), b.to_owned()));
        }
        return bad(format!(
            "model.merges[{i}] must be two tokens separated by one space"
        ));
    }
    match v.as_array().map(Vec::as_slice) {
        Some([a, b]) => match (a.as_str(), b.as_str()) {
            (Some(a), Some(b)) => Ok((a.to_owned(), b.to_owned())),
            _ => bad(format!("model.merges[{i}] must hold two strings")),
        },
        _ => bad(format!(
            "model.merges[{i}] must be \"a b\" or [\"a\", \"b\"]"
        )),
    }
}

/// Parses a `model` section of type `BPE` (its vocabulary already read into `entries`).
pub(super) fn parse_bpe(obj: &Map<String, Value>, entries: Vec<(String, u32)>) -> Parsed<Bpe> {
    let what = "model";
    if field(obj, "dropout")
        .and_then(Value::as_f64)
        .is_some_and(|d| d > 0.0)
    {
        return bad("BPE dropout is not implemented");
    }
    let merges = list(obj, "merges", what)?
        .iter()
        .enumerate()
        .map(|(i, v)| merge(i, v))
        .collect::<Parsed<Vec<_>>>()?;
    let non_empty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
    let opts = BpeOptions {
        unk_token: get_str(obj, "unk_token", what)?.map(str::to_owned),
        fuse_unk: get_bool(obj, "fuse_unk", false, what)?,
        byte_fallback: get_bool(obj, "byte_fallback", false, what)?,
        ignore_merges: get_bool(obj, "ignore_merges", false, what)?,
        continuing_subword_prefix: non_empty(get_str(obj, "continuing_subword_prefix", what)?),
        end_of_word_suffix: non_empty(get_str(obj, "end_of_word_suffix", what)?),
        byte_level: false,
    };
    Bpe::new(entries, merges, opts).map_err(|e| Reason(format!("model: {e}")))
}
