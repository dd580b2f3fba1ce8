//! Hand-built GGUF files that are wrong in one way each: the decoder loader must name the
//! problem (absurd dimensions, unknown tensor types, data past the end, missing tensors, wrong
//! shapes), never panic or allocate absurd amounts.

use lattice_inference::model::decoder::load_decoder;
use lattice_inference::model::source::WeightMode;

/// A minimal GGUF v3 writer.
struct Gguf {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl Gguf {
    fn new() -> Self {
        let mut g = Self {
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        };
        g.str("general.architecture", "llama");
        g
    }
    fn str(&mut self, k: &str, v: &str) -> &mut Self {
        string(&mut self.kv, k);
        self.kv.extend_from_slice(&8u32.to_le_bytes());
        string(&mut self.kv, v);
        self.n_kv += 1;
        self
    }
    fn u32(&mut self, k: &str, v: u32) -> &mut Self {
        string(&mut self.kv, k);
        self.kv.extend_from_slice(&4u32.to_le_bytes());
        self.kv.extend_from_slice(&v.to_le_bytes());
        self.n_kv += 1;
        self
    }
    fn u64(&mut self, k: &str, v: u64) -> &mut Self {
        string(&mut self.kv, k);
        self.kv.extend_from_slice(&10u32.to_le_bytes());
        self.kv.extend_from_slice(&v.to_le_bytes());
        self.n_kv += 1;
        self
    }
    /// A small valid llama config: hidden 32, 2 heads, 1 layer, vocab 16.
    fn small_config(&mut self) -> &mut Self {
        self.u32("llama.embedding_length", 32)
            .config_without_width()
    }
    /// [`Gguf::small_config`] without `llama.embedding_length`.
    fn config_without_width(&mut self) -> &mut Self {
        self.u32("llama.block_count", 1)
            .u32("llama.feed_forward_length", 64)
            .u32("llama.attention.head_count", 2)
            .u32("llama.context_length", 128)
            .u32("llama.vocab_size", 16)
    }
    /// An F32 tensor of the given shape (outermost first), zero-filled.
    fn f32_tensor(&mut self, name: &str, shape: &[u64]) -> &mut Self {
        let n: u64 = shape.iter().product();
        self.tensors.push((
            name.into(),
            shape.iter().rev().copied().collect(),
            0,
            vec![0u8; 4 * n as usize],
        ));
        self
    }
    fn raw_tensor(&mut self, name: &str, ne: &[u64], ggml_type: u32, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.into(), ne.to_vec(), ggml_type, data));
        self
    }
    fn bytes(&self, data_offset_shift: u64) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        let mut offset = 0u64;
        for (name, ne, t, data) in &self.tensors {
            string(&mut out, name);
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&(offset + data_offset_shift).to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }
}

fn load_err(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    let msg = match load_decoder(&path, WeightMode::Quantized) {
        Ok(_) => panic!("load must fail"),
        Err(e) => e.to_string(),
    };
    assert!(
        msg.contains("model.gguf"),
        "error does not name the file: {msg}"
    );
    msg
}

#[test]
fn absurd_dimensions_are_refused() {
    let mut g = Gguf::new();
    g.u64("llama.embedding_length", 1 << 40)
        .config_without_width();
    let msg = load_err(&g.bytes(0));
    assert!(msg.contains("implausibly large"), "{msg}");

    let mut g = Gguf::new();
    g.small_config()
        .str("general.name", "x")
        .str("general.name", "y");
    let msg = load_err(&g.bytes(0));
    assert!(msg.contains("duplicate metadata key"), "{msg}");

    let mut g = Gguf::new();
    g.small_config().u32("llama.attention.head_count_kv", 3);
    // (head_count is 2.)
    let msg = load_err(&g.bytes(0));
    assert!(msg.contains("not a multiple"), "{msg}");
}

#[test]
fn unknown_tensor_types_are_named() {
    let mut g = Gguf::new();
    g.small_config();
    // IQ2_XXS: a valid GGML type this engine does not implement (66 bytes per 256 values).
    g.raw_tensor("token_embd.weight", &[256, 16], 16, vec![0u8; 66 * 16]);
    let msg = load_err(&g.bytes(0));
    assert!(msg.contains("IQ2_XXS"), "{msg}");

    let mut g = Gguf::new();
    g.small_config();
    g.raw_tensor("token_embd.weight", &[32, 16], 4242, vec![0u8; 64]);
    let msg = load_err(&g.bytes(0));
    assert!(msg.contains("4242") || msg.contains("type"), "{msg}");
}

#[test]
fn data_past_the_end_missing_tensors_and_wrong_shapes() {
    let mut g = Gguf::new();
    g.small_config().f32_tensor("token_embd.weight", &[16, 32]);
    let msg = load_err(&g.bytes(1 << 30));
    assert!(msg.contains("token_embd.weight"), "{msg}");

    // Only the embedding: the first block's tensors are missing.
    let mut g = Gguf::new();
    g.small_config().f32_tensor("token_embd.weight", &[16, 32]);
    let msg = load_err(&g.bytes(0));
    assert!(msg.contains("blk.0.attn_norm.weight"), "{msg}");

    let mut g = Gguf::new();
    g.small_config().f32_tensor("token_embd.weight", &[17, 32]);
    let msg = load_err(&g.bytes(0));
    assert!(msg.contains("expected shape [16, 32]"), "{msg}");

    // Truncated in the middle of the metadata.
    let mut g = Gguf::new();
    g.small_config();
    let bytes = g.bytes(0);
    load_err(&bytes[..bytes.len() / 2]);
}
