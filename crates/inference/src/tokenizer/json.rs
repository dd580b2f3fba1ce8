//! `tokenizer.json` → tokenizer stages. Each top-level key maps onto one stage: `version`,
//! `truncation`, `padding`, `added_tokens`, `normalizer`, `pre_tokenizer`, `model`,
//! `post_processor`, `decoder`. Component types this build does not implement are rejected with
//! an error naming them, never ignored. This module only reads the file; the pipeline lives in
//! the stage modules.

use std::path::Path;

use serde_json::{Map, Value};

use super::added::AddedToken;
use super::decode::Decoder;
use super::json_stages::{
    parse_bpe, parse_decoder, parse_normalizer, parse_pre_tokenizer, parse_unigram,
};
use super::model::Model;
use super::post::{Piece, PostProcessor};
use super::pretokenize::PreTokenizer;
use super::wordpiece::WordPiece;
use super::{Padding, PaddingDirection, Tokenizer};
use crate::{Error, Result};

/// Shorthand for a "this file is not usable" error.
pub(crate) fn invalid(path: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidTokenizer {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Why a section of the file is unusable; becomes the `reason` of [`Error::InvalidTokenizer`].
pub(super) struct Reason(pub(super) String);

impl From<String> for Reason {
    fn from(s: String) -> Self {
        Reason(s)
    }
}

impl From<&str> for Reason {
    fn from(s: &str) -> Self {
        Reason(s.to_owned())
    }
}

/// Result of parsing one section.
pub(super) type Parsed<T> = std::result::Result<T, Reason>;

pub(super) fn bad<T>(reason: impl Into<String>) -> Parsed<T> {
    Err(Reason(reason.into()))
}

/// Reads a JSON object's field, treating `null` as absent.
pub(super) fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(super) fn get_bool(
    obj: &Map<String, Value>,
    key: &str,
    default: bool,
    what: &str,
) -> Parsed<bool> {
    match field(obj, key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| Reason(format!("{what}.{key} must be a boolean"))),
    }
}

pub(super) fn get_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    what: &str,
) -> Parsed<Option<&'a str>> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| Reason(format!("{what}.{key} must be a string"))),
    }
}

pub(super) fn get_u32(obj: &Map<String, Value>, key: &str, what: &str) -> Parsed<Option<u32>> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| Reason(format!("{what}.{key} must be an integer in 0..2^32"))),
    }
}

pub(super) fn get_usize(obj: &Map<String, Value>, key: &str, what: &str) -> Parsed<Option<usize>> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| Reason(format!("{what}.{key} must be a non-negative integer"))),
    }
}

pub(super) fn as_object<'a>(v: &'a Value, what: &str) -> Parsed<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| Reason(format!("{what} must be a JSON object")))
}

pub(super) fn type_of<'a>(obj: &'a Map<String, Value>, what: &str) -> Parsed<&'a str> {
    get_str(obj, "type", what)?.ok_or_else(|| Reason(format!("{what} has no `type`")))
}

/// Parses the bytes of a `tokenizer.json`; `path` is only used in error messages.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Tokenizer> {
    let root: Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(path, format!("not valid JSON: {e}")))?;
    parse_root(&root).map_err(|Reason(reason)| invalid(path, reason))
}

fn parse_root(root: &Value) -> Parsed<Tokenizer> {
    let root = as_object(root, "tokenizer.json")?;
    if let Some(version) = get_str(root, "version", "tokenizer.json")? {
        if version != "1.0" {
            return bad(format!(
                "unsupported tokenizer.json version `{version}` (expected 1.0)"
            ));
        }
    }
    let normalizer = match field(root, "normalizer") {
        None => None,
        Some(v) => Some(parse_normalizer(v)?),
    };
    let pre_tokenizer = match field(root, "pre_tokenizer") {
        None => PreTokenizer::None,
        Some(v) => parse_pre_tokenizer(v, false)?,
    };
    let model = parse_model(field(root, "model").ok_or("the `model` section is missing")?)?;
    let added = match field(root, "added_tokens") {
        None => Vec::new(),
        Some(v) => parse_added_tokens(v)?,
    };
    let post = match field(root, "post_processor") {
        None => None,
        Some(v) => parse_post_processor(v)?,
    };
    let decoder = match field(root, "decoder") {
        None => Decoder::Join,
        Some(v) => parse_decoder(v)?,
    };
    let truncation = match field(root, "truncation") {
        None => None,
        Some(v) => Some(parse_truncation(v)?),
    };
    let padding = match field(root, "padding") {
        None => None,
        Some(v) => Some(parse_padding(v)?),
    };
    let mut tok = Tokenizer::from_parts(normalizer, pre_tokenizer, model, added, post, decoder);
    tok.set_truncation(truncation);
    tok.set_file_padding(padding);
    Ok(tok)
}

fn parse_model(v: &Value) -> Parsed<Model> {
    let obj = as_object(v, "model")?;
    let kind = match get_str(obj, "type", "model")? {
        Some(kind) => kind,
        // Old files leave `type` out; a WordPiece model is recognised by its own fields.
        None if obj.contains_key("continuing_subword_prefix") => "WordPiece",
        None => return bad("the model has no `type`"),
    };
    if kind == "Unigram" {
        return parse_unigram(obj).map(|m| Model::Unigram(Box::new(m)));
    }
    if kind != "WordPiece" && kind != "BPE" {
        return bad(format!(
            "unsupported model type `{kind}` (WordPiece, BPE and Unigram are implemented)"
        ));
    }
    let vocab = field(obj, "vocab").ok_or("model.vocab is missing")?;
    let vocab = vocab.as_object().ok_or("model.vocab must be an object")?;
    let mut entries = Vec::with_capacity(vocab.len());
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("model.vocab[{token:?}] must be an integer id"))?;
        entries.push((token.clone(), id));
    }
    if kind == "BPE" {
        return parse_bpe(obj, entries).map(|m| Model::Bpe(Box::new(m)));
    }
    let unk = get_str(obj, "unk_token", "model")?.unwrap_or("[UNK]");
    let prefix = get_str(obj, "continuing_subword_prefix", "model")?.unwrap_or("##");
    let max_chars = get_usize(obj, "max_input_chars_per_word", "model")?.unwrap_or(100);
    WordPiece::new(entries, unk, prefix, max_chars)
        .map(Model::WordPiece)
        .map_err(|e| Reason(e.to_string()))
}

fn parse_added_tokens(v: &Value) -> Parsed<Vec<AddedToken>> {
    let list = v.as_array().ok_or("added_tokens must be an array")?;
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let what = format!("added_tokens[{i}]");
        let obj = as_object(item, &what)?;
        let id = get_u32(obj, "id", &what)?.ok_or_else(|| format!("{what} has no `id`"))?;
        let content =
            get_str(obj, "content", &what)?.ok_or_else(|| format!("{what} has no `content`"))?;
        let special = get_bool(obj, "special", false, &what)?;
        out.push(AddedToken {
            id,
            content: content.to_owned(),
            special,
            single_word: get_bool(obj, "single_word", false, &what)?,
            lstrip: get_bool(obj, "lstrip", false, &what)?,
            rstrip: get_bool(obj, "rstrip", false, &what)?,
            normalized: get_bool(obj, "normalized", !special, &what)?,
        });
    }
    Ok(out)
}

/// `["[SEP]", 102]`.
fn token_pair(obj: &Map<String, Value>, key: &str, what: &str) -> Parsed<(String, u32)> {
    let msg = || format!("{what}.{key} must be [token, id]");
    let arr = field(obj, key).and_then(Value::as_array).ok_or_else(msg)?;
    match arr.as_slice() {
        [t, id] => {
            let t = t.as_str().ok_or_else(msg)?;
            let id = id
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(msg)?;
            Ok((t.to_owned(), id))
        }
        _ => bad(msg()),
    }
}

/// `None` for a `ByteLevel` post-processor without offset trimming (it adds no tokens); a
/// `ByteLevel` one with `trim_offsets` trims offsets only. A `Sequence` may hold at most one
/// token-adding processor, and its `ByteLevel` trimming is merged into it.
fn parse_post_processor(v: &Value) -> Parsed<Option<PostProcessor>> {
    let what = "post_processor";
    let obj = as_object(v, what)?;
    match type_of(obj, what)? {
        "ByteLevel" => {
            let trim = get_bool(obj, "trim_offsets", true, what)?;
            let add_prefix_space = get_bool(obj, "add_prefix_space", true, what)?;
            Ok(trim.then(|| PostProcessor::trim_only(add_prefix_space)))
        }
        "Sequence" => {
            let list = field(obj, "processors")
                .and_then(Value::as_array)
                .ok_or("post_processor.processors must be an array")?;
            let mut found: Option<PostProcessor> = None;
            for p in list {
                if let Some(p) = parse_post_processor(p)? {
                    found = Some(match found {
                        None => p,
                        Some(f) => f
                            .merge(p)
                            .ok_or("post_processor Sequence with two token-adding processors")?,
                    });
                }
            }
            Ok(found)
        }
        other => parse_adding_processor(obj, other).map(Some),
    }
}

fn parse_adding_processor(obj: &Map<String, Value>, kind: &str) -> Parsed<PostProcessor> {
    let what = "post_processor";
    match kind {
        "BertProcessing" => Ok(PostProcessor::bert(
            token_pair(obj, "cls", what)?,
            token_pair(obj, "sep", what)?,
        )),
        "RobertaProcessing" => Ok(PostProcessor::roberta(
            token_pair(obj, "cls", what)?,
            token_pair(obj, "sep", what)?,
            get_bool(obj, "trim_offsets", true, what)?,
            get_bool(obj, "add_prefix_space", true, what)?,
        )),
        "TemplateProcessing" => {
            let specials = match field(obj, "special_tokens") {
                None => Map::new(),
                Some(v) => as_object(v, "post_processor.special_tokens")?.clone(),
            };
            let single = parse_template(field(obj, "single"), &specials, "single")?;
            let pair = parse_template(field(obj, "pair"), &specials, "pair")?;
            let has_a = |t: &[Piece]| t.iter().any(|p| matches!(p, Piece::A(_)));
            if !has_a(&single) || !has_a(&pair) || !pair.iter().any(|p| matches!(p, Piece::B(_))) {
                return bad("TemplateProcessing needs `$A` in `single` and `$A`, `$B` in `pair`");
            }
            Ok(PostProcessor::template(single, pair))
        }
        other => bad(format!(
            "unsupported post_processor type `{other}` (BertProcessing, RobertaProcessing, \
             TemplateProcessing, ByteLevel and Sequence are implemented)"
        )),
    }
}

fn parse_template(
    v: Option<&Value>,
    specials: &Map<String, Value>,
    name: &str,
) -> Parsed<Vec<Piece>> {
    let what = format!("post_processor.{name}");
    let list = v
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{what} must be an array"))?;
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let obj = as_object(item, &what)?;
        if let Some(seq) = field(obj, "Sequence") {
            let seq = as_object(seq, &what)?;
            let type_id = get_u32(seq, "type_id", &what)?.unwrap_or(0);
            match get_str(seq, "id", &what)? {
                Some("A") => out.push(Piece::A(type_id)),
                Some("B") => out.push(Piece::B(type_id)),
                other => return bad(format!("{what}: unknown sequence id {other:?}")),
            }
        } else if let Some(sp) = field(obj, "SpecialToken") {
            let sp = as_object(sp, &what)?;
            let type_id = get_u32(sp, "type_id", &what)?.unwrap_or(0);
            let name = get_str(sp, "id", &what)?
                .ok_or_else(|| format!("{what}: special token without `id`"))?;
            let def = specials
                .get(name)
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    format!("{what}: special token `{name}` is not in special_tokens")
                })?;
            let ids = def
                .get("ids")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                        .collect::<Option<Vec<u32>>>()
                })
                .and_then(|x| x)
                .ok_or_else(|| format!("{what}: special token `{name}` has bad `ids`"))?;
            let tokens = def
                .get("tokens")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|x| x.as_str().map(str::to_owned))
                        .collect::<Option<Vec<String>>>()
                })
                .and_then(|x| x)
                .filter(|t| t.len() == ids.len())
                .ok_or_else(|| format!("{what}: special token `{name}` has bad `tokens`"))?;
            out.push(Piece::Special {
                ids,
                tokens,
                type_id,
            });
        } else {
            return bad(format!(
                "{what}: expected `Sequence` or `SpecialToken` entries"
            ));
        }
    }
    Ok(out)
}

fn parse_truncation(v: &Value) -> Parsed<usize> {
    let what = "truncation";
    let obj = as_object(v, what)?;
    if let Some(s) = get_str(obj, "strategy", what)? {
        if s != "LongestFirst" {
            return bad(format!(
                "unsupported truncation strategy `{s}` (only LongestFirst is implemented)"
            ));
        }
    }
    if let Some(d) = get_str(obj, "direction", what)? {
        if d != "Right" {
            return bad(format!(
                "unsupported truncation direction `{d}` (only Right is implemented)"
            ));
        }
    }
    Ok(get_usize(obj, "max_length", what)?.ok_or("truncation.max_length is missing")?)
}

fn parse_padding(v: &Value) -> Parsed<Padding> {
    let what = "padding";
    let obj = as_object(v, what)?;
    let fixed_length = match field(obj, "strategy") {
        None => None,
        Some(Value::String(s)) if s == "BatchLongest" => None,
        Some(Value::Object(m)) => Some(
            m.get("Fixed")
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or("padding.strategy must be BatchLongest or {\"Fixed\": n}")?,
        ),
        Some(_) => return bad("padding.strategy must be BatchLongest or {\"Fixed\": n}"),
    };
    let direction = match get_str(obj, "direction", what)? {
        None | Some("Right") => PaddingDirection::Right,
        Some("Left") => PaddingDirection::Left,
        Some(d) => return bad(format!("unknown padding direction `{d}`")),
    };
    Ok(Padding {
        fixed_length,
        direction,
        pad_to_multiple_of: get_usize(obj, "pad_to_multiple_of", what)?,
        pad_id: get_u32(obj, "pad_id", what)?.unwrap_or(0),
        pad_type_id: get_u32(obj, "pad_type_id", what)?.unwrap_or(0),
        pad_token: get_str(obj, "pad_token", what)?
            .unwrap_or("[PAD]")
            .to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        match parse(Path::new("t.json"), json.as_bytes()) {
            Ok(_) => panic!("expected an error for {json}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(err("{not json").contains("not valid JSON"));
        assert!(err(r#"{"model": {"type": "WordLevel", "vocab": {}}}"#).contains("`WordLevel`"));
        assert!(
            err(r#"{"model": {"type": "Unigram", "vocab": [], "unk_id": 0}}"#).contains("empty")
        );
        assert!(err(r#"{"model": {"type": "Unigram", "vocab": [["a", 0]]}}"#).contains("unk_id"));
        assert!(err(r#"{"model": {"type": "BPE", "vocab": {}}}"#).contains("model.merges"));
        assert!(err(r#"{"model": {"type": "WordPiece"}}"#).contains("model.vocab is missing"));
        assert!(err(r#"{"model": {"type": "WordPiece", "vocab": {"a": 0}}}"#).contains("[UNK]"));
        assert!(err(r#"{"version": "2.0", "model": {}}"#).contains("version"));
    }

    #[test]
    fn minimal_wordpiece_file() {
        let json = r#"{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "hi": 1}},
                       "normalizer": {"type": "BertNormalizer", "lowercase": true},
                       "pre_tokenizer": {"type": "BertPreTokenizer"}}"#;
        let tok = parse(Path::new("t.json"), json.as_bytes()).expect("valid file");
        assert_eq!(tok.encode("HI there", true).ids, [1, 0]);
    }
}
