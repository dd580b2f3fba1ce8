//! A SentencePiece BPE tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file (llama.cpp's
//! `llama` tokenizer model: tokens, scores and token types). The pieces become a SentencePiece
//! BPE model (merges by score, byte fallback through `<0xNN>` pieces) with llama.cpp's
//! normalization: a leading `▁` when `tokenizer.ggml.add_space_prefix` is set (the default),
//! spaces escaped as `▁`, whitespace otherwise kept. Control tokens become special added tokens.
//! This module builds tokenizers; it does not tokenize.

use crate::io::gguf::{GgufArray, GgufFile};
use crate::sentencepiece::model_proto::{
    ModelProto, ModelType, NormalizerSpec, Piece, PieceType, TrainerSpec,
};
use crate::sentencepiece::SentencePieceModel;
use crate::Result;

use super::added::AddedToken;
use super::decode::Decoder;
use super::json::invalid;
use super::model::Model;
use super::pretokenize::PreTokenizer;
use super::Tokenizer;

/// The SentencePiece piece type of a GGUF token type (GGUF keeps SentencePiece's numbering).
fn piece_type(t: Option<i64>) -> PieceType {
    match t {
        Some(2) => PieceType::Unknown,
        Some(3) => PieceType::Control,
        Some(4) => PieceType::UserDefined,
        Some(5) => PieceType::Unused,
        Some(6) => PieceType::Byte,
        _ => PieceType::Normal,
    }
}

/// Builds the tokenizer of a GGUF file whose `tokenizer.ggml.model` is `llama`.
pub(crate) fn from_gguf_spm(file: &GgufFile) -> Result<Tokenizer> {
    let path = file.path();
    let tokens = file
        .metadata("tokenizer.ggml.tokens")
        .and_then(|v| v.as_string_array())
        .ok_or_else(|| invalid(path, "tokenizer.ggml.tokens is missing or not strings"))?;
    let scores = match file
        .metadata("tokenizer.ggml.scores")
        .and_then(|v| v.as_array())
    {
        Some(GgufArray::F32(v)) if v.len() == tokens.len() => v.clone(),
        _ => {
            return Err(invalid(
                path,
                "tokenizer.ggml.scores is missing, not f32, or not one per token",
            ))
        }
    };
    let types = file
        .metadata("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array());
    let add_space_prefix = file
        .metadata("tokenizer.ggml.add_space_prefix")
        .and_then(|v| v.as_bool())
        .unwrap_or(true);
    let unk_id = file
        .metadata("tokenizer.ggml.unknown_token_id")
        .and_then(|v| v.as_u32())
        .or_else(|| {
            (0..tokens.len())
                .find(|&i| types.and_then(|a| a.int_at(i)) == Some(2))
                .and_then(|i| u32::try_from(i).ok())
        })
        .unwrap_or(0);
    let mut pieces = Vec::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (i, (t, &score)) in tokens.iter().zip(&scores).enumerate() {
        let id = u32::try_from(i).map_err(|_| invalid(path, "too many tokens"))?;
        let mut kind = piece_type(types.and_then(|a| a.int_at(i)));
        if kind == PieceType::Control {
            added.push(AddedToken::special(id, t));
        }
        // SentencePiece has one unknown piece: the file's unknown token, whatever its type
        // (Phi-3 types `<unk>` as control and pads as unknown). Other unknown-typed tokens
        // never come out of merges, as unused pieces.
        if id == unk_id {
            kind = PieceType::Unknown;
        } else if kind == PieceType::Unknown {
            kind = PieceType::Unused;
        }
        pieces.push(Piece {
            piece: t.clone(),
            score,
            kind,
        });
    }
    let byte_fallback = pieces.iter().any(|p| p.kind == PieceType::Byte);
    let proto = ModelProto {
        pieces,
        trainer_spec: TrainerSpec {
            model_type: ModelType::Bpe,
            vocab_size: i32::try_from(tokens.len()).unwrap_or(i32::MAX),
            byte_fallback,
            unk_id: i32::try_from(unk_id)
                .map_err(|_| invalid(path, "unknown_token_id too large"))?,
            ..TrainerSpec::default()
        },
        normalizer_spec: NormalizerSpec {
            add_dummy_prefix: add_space_prefix,
            remove_extra_whitespaces: false,
            escape_whitespaces: true,
            ..NormalizerSpec::default()
        },
    };
    let model = SentencePieceModel::from_proto(proto, path)?;
    Ok(Tokenizer::from_parts(
        None,
        PreTokenizer::None,
        Model::SentencePiece(Box::new(model)),
        added,
        None,
        Decoder::Metaspace {
            replacement: '\u{2581}',
            strip_first: add_space_prefix,
        },
    ))
}
