//! The model catalog: known embedding models with their pooling, normalization, prefixes and
//! token limits. A model directory's own sentence-transformers files take precedence; the
//! catalog supplies the defaults (and the hub id to fetch it by).

use lattice_inference::model::heads::Pooling;

/// An embedding model Lattice knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingModel {
    /// sentence-transformers/all-MiniLM-L6-v2
    AllMiniLmL6V2,
    /// sentence-transformers/all-MiniLM-L12-v2
    AllMiniLmL12V2,
    /// sentence-transformers/all-mpnet-base-v2
    AllMpnetBaseV2,
    /// BAAI/bge-small-en-v1.5
    BgeSmallEnV15,
    /// BAAI/bge-base-en-v1.5
    BgeBaseEnV15,
    /// BAAI/bge-large-en-v1.5
    BgeLargeEnV15,
    /// intfloat/e5-small-v2
    E5SmallV2,
    /// intfloat/e5-base-v2
    E5BaseV2,
    /// intfloat/multilingual-e5-small
    MultilingualE5Small,
    /// intfloat/multilingual-e5-base
    MultilingualE5Base,
    /// sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2
    ParaphraseMultilingualMiniLmL12V2,
    /// Qwen/Qwen3-Embedding-0.6B (last-token pooling, instruction-prefixed queries, Matryoshka)
    Qwen3Embedding06B,
    /// Qwen/Qwen3-Embedding-4B
    Qwen3Embedding4B,
    /// Qwen/Qwen3-Embedding-8B
    Qwen3Embedding8B,
}

/// What the catalog knows about one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Short name (`all-MiniLM-L6-v2`).
    pub name: &'static str,
    /// Hugging Face hub id.
    pub hub_id: &'static str,
    /// Output dimension.
    pub dim: usize,
    /// Pooling over token states.
    pub pooling: Pooling,
    /// Whether outputs are L2-normalized.
    pub normalize: bool,
    /// Longest input in tokens (special tokens included); longer inputs are truncated.
    pub max_tokens: usize,
    /// Prefix for queries (asymmetric retrieval), if the model expects one.
    pub query_prefix: Option<&'static str>,
    /// Prefix for passages / documents, if the model expects one.
    pub passage_prefix: Option<&'static str>,
}

const BGE_QUERY: &str = "Represent this sentence for searching relevant passages: ";
/// Qwen3-Embedding's default query instruction (its `config_sentence_transformers.json`).
pub const QWEN3_EMBEDDING_QUERY: &str =
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:";

impl EmbeddingModel {
    /// Every catalog entry.
    pub const ALL: [EmbeddingModel; 14] = [
        EmbeddingModel::AllMiniLmL6V2,
        EmbeddingModel::AllMiniLmL12V2,
        EmbeddingModel::AllMpnetBaseV2,
        EmbeddingModel::BgeSmallEnV15,
        EmbeddingModel::BgeBaseEnV15,
        EmbeddingModel::BgeLargeEnV15,
        EmbeddingModel::E5SmallV2,
        EmbeddingModel::E5BaseV2,
        EmbeddingModel::MultilingualE5Small,
        EmbeddingModel::MultilingualE5Base,
        EmbeddingModel::ParaphraseMultilingualMiniLmL12V2,
        EmbeddingModel::Qwen3Embedding06B,
        EmbeddingModel::Qwen3Embedding4B,
        EmbeddingModel::Qwen3Embedding8B,
    ];

    /// The model's facts.
    pub fn spec(self) -> ModelSpec {
        use EmbeddingModel::*;
        let st = |name, hub_id, dim, max_tokens| ModelSpec {
            name,
            hub_id,
            dim,
            pooling: Pooling::Mean,
            normalize: true,
            max_tokens,
            query_prefix: None,
            passage_prefix: None,
        };
        let bge = |name, hub_id, dim| ModelSpec {
            name,
            hub_id,
            dim,
            pooling: Pooling::Cls,
            normalize: true,
            max_tokens: 512,
            query_prefix: Some(BGE_QUERY),
            passage_prefix: None,
        };
        let e5 = |name, hub_id, dim| ModelSpec {
            name,
            hub_id,
            dim,
            pooling: Pooling::Mean,
            normalize: true,
            max_tokens: 512,
            query_prefix: Some("query: "),
            passage_prefix: Some("passage: "),
        };
        let qwen3 = |name, hub_id, dim| ModelSpec {
            name,
            hub_id,
            dim,
            pooling: Pooling::LastToken,
            normalize: true,
            max_tokens: 32_768,
            query_prefix: Some(QWEN3_EMBEDDING_QUERY),
            passage_prefix: None,
        };
        match self {
            AllMiniLmL6V2 => st(
                "all-MiniLM-L6-v2",
                "sentence-transformers/all-MiniLM-L6-v2",
                384,
                256,
            ),
            AllMiniLmL12V2 => st(
                "all-MiniLM-L12-v2",
                "sentence-transformers/all-MiniLM-L12-v2",
                384,
                128,
            ),
            AllMpnetBaseV2 => st(
                "all-mpnet-base-v2",
                "sentence-transformers/all-mpnet-base-v2",
                768,
                384,
            ),
            BgeSmallEnV15 => bge("bge-small-en-v1.5", "BAAI/bge-small-en-v1.5", 384),
            BgeBaseEnV15 => bge("bge-base-en-v1.5", "BAAI/bge-base-en-v1.5", 768),
            BgeLargeEnV15 => bge("bge-large-en-v1.5", "BAAI/bge-large-en-v1.5", 1024),
            E5SmallV2 => e5("e5-small-v2", "intfloat/e5-small-v2", 384),
            E5BaseV2 => e5("e5-base-v2", "intfloat/e5-base-v2", 768),
            MultilingualE5Small => e5(
                "multilingual-e5-small",
                "intfloat/multilingual-e5-small",
                384,
            ),
            MultilingualE5Base => e5("multilingual-e5-base", "intfloat/multilingual-e5-base", 768),
            ParaphraseMultilingualMiniLmL12V2 => ModelSpec {
                normalize: false,
                ..st(
                    "paraphrase-multilingual-MiniLM-L12-v2",
                    "sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2",
                    384,
                    128,
                )
            },
            Qwen3Embedding06B => qwen3("Qwen3-Embedding-0.6B", "Qwen/Qwen3-Embedding-0.6B", 1024),
            Qwen3Embedding4B => qwen3("Qwen3-Embedding-4B", "Qwen/Qwen3-Embedding-4B", 2560),
            Qwen3Embedding8B => qwen3("Qwen3-Embedding-8B", "Qwen/Qwen3-Embedding-8B", 4096),
        }
    }

    /// Looks a model up by short name or hub id (case-insensitive).
    pub fn from_name(name: &str) -> Option<EmbeddingModel> {
        Self::ALL.into_iter().find(|m| {
            let s = m.spec();
            s.name.eq_ignore_ascii_case(name) || s.hub_id.eq_ignore_ascii_case(name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_by_name_and_hub_id() {
        assert_eq!(
            EmbeddingModel::from_name("BAAI/bge-small-en-v1.5"),
            Some(EmbeddingModel::BgeSmallEnV15)
        );
        assert_eq!(
            EmbeddingModel::from_name("all-minilm-l6-v2"),
            Some(EmbeddingModel::AllMiniLmL6V2)
        );
        assert_eq!(EmbeddingModel::from_name("nope"), None);
        for m in EmbeddingModel::ALL {
            assert_eq!(EmbeddingModel::from_name(m.spec().name), Some(m));
        }
    }
}
