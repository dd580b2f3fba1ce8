//! [`ForwardBatch`]: the one input of a decoder forward pass. The rows of every sequence in the
//! batch lie back to back (`seq_lens` gives how many each contributes, after what its state
//! already holds); the input is token ids or ready-made input embeddings (image patches, later);
//! positions are implicit (each sequence continues from its state's length) or explicit (1-D,
//! or 3-D for multimodal rotary embeddings); `outputs` says which rows need logits (the last of
//! each sequence for sampling, every row for verification or scoring, chosen rows); `adapters`
//! carries a per-row adapter id for LoRA.
//!
//! Models read it through [`ForwardBatch::validate`] (which also reserves the states' memory)
//! and the row helpers here, so every decoder checks a batch the same way.

use crate::state::SeqState;
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};

/// What the rows of a batch are made of.
#[derive(Debug, Clone, Copy)]
pub enum BatchInput<'a> {
    /// One token id per row.
    Tokens(&'a [u32]),
    /// One input embedding per row: f32 [rows, hidden].
    Embeddings(&'a [f32]),
}

/// The position of every row.
#[derive(Debug, Clone, Default)]
pub enum Positions {
    /// Each sequence continues from its state's length.
    #[default]
    Implicit,
    /// One position per row.
    Linear(Vec<usize>),
    /// Three positions per row (temporal, height, width: multimodal rotary embeddings).
    Rope3d(Vec<[usize; 3]>),
}

/// Which rows a pass turns into outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowOutputs {
    /// Logits of the last row of each sequence: f32 [n_seqs, vocab].
    LastLogits,
    /// Logits of every row: f32 [rows, vocab].
    AllLogits,
    /// Logits of the rows flagged `true`, in row order: f32 [flagged, vocab].
    Logits(Vec<bool>),
    /// Final-norm hidden states of every row: f32 [rows, hidden] (embeddings).
    AllHidden,
}

/// Rows whose input embedding is given instead of looked up (the image patches of a
/// multimodal prompt), with the features DeepStack (Qwen3-VL) adds to them after the first
/// decoder layers.
#[derive(Debug, Clone, Default)]
pub struct InjectedRows {
    /// Rows of the batch, ascending.
    pub rows: Vec<usize>,
    /// f32 [rows.len(), hidden]: the input embedding of each row.
    pub embeds: Vec<f32>,
    /// One entry per decoder layer from the first: f32 [rows.len(), hidden] added to that
    /// layer's output at these rows.
    pub deepstack: Vec<Vec<f32>>,
}

impl InjectedRows {
    /// Writes (or with `add`, adds) `values` [rows.len(), width] into those rows of `x`.
    fn put(&self, x: &mut Tensor, values: &[f32], add: bool) -> Result<()> {
        let width = x.cols();
        match x.storage_mut() {
            Storage::Cpu(v) => {
                for (&r, src) in self.rows.iter().zip(values.chunks_exact(width)) {
                    let dst = &mut v[r * width..(r + 1) * width];
                    if add {
                        dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
                    } else {
                        dst.copy_from_slice(src);
                    }
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device(
                "image inputs do not run on the GPU yet".into(),
            )),
        }
    }
}

/// The input of one decoder forward pass over several sequences.
#[derive(Debug, Clone)]
pub struct ForwardBatch<'a> {
    /// The rows.
    pub input: BatchInput<'a>,
    /// Rows of each sequence, in order; every entry is at least 1.
    pub seq_lens: Vec<usize>,
    /// Positions of the rows.
    pub positions: Positions,
    /// Which outputs to compute.
    pub outputs: RowOutputs,
    /// The LoRA adapters of every sequence (`None`, or an empty selection: the model's
    /// default; see [`crate::lora::Selection`]).
    pub adapters: Option<Vec<crate::lora::Selection>>,
    /// Rows whose input embedding is given (image patches), if any.
    pub injected: Option<InjectedRows>,
}

impl<'a> ForwardBatch<'a> {
    /// Token rows of sequences of `seq_lens` rows each, implicit positions, no adapters.
    pub fn tokens(ids: &'a [u32], seq_lens: &[usize], outputs: RowOutputs) -> Self {
        Self {
            input: BatchInput::Tokens(ids),
            seq_lens: seq_lens.to_vec(),
            positions: Positions::Implicit,
            outputs,
            adapters: None,
            injected: None,
        }
    }

    /// The 3-D positions of the rows, when the batch gives them.
    pub fn rope3d(&self) -> Option<&[[usize; 3]]> {
        match &self.positions {
            Positions::Rope3d(p) => Some(p),
            _ => None,
        }
    }

    /// Replaces the input embedding of the injected rows of `x` [rows, hidden].
    pub fn inject_embeddings(&self, x: &mut Tensor) -> Result<()> {
        match &self.injected {
            Some(inj) => inj.put(x, &inj.embeds, false),
            None => Ok(()),
        }
    }

    /// Adds the DeepStack features of decoder layer `layer` to the injected rows of its
    /// output `x` [rows, hidden] (nothing past the layers that have them).
    pub fn add_deepstack(&self, layer: usize, x: &mut Tensor) -> Result<()> {
        match &self.injected {
            Some(inj) if layer < inj.deepstack.len() => inj.put(x, &inj.deepstack[layer], true),
            _ => Ok(()),
        }
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.seq_lens.iter().sum()
    }

    /// Row range of each sequence.
    pub fn row_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut start = 0;
        self.seq_lens
            .iter()
            .map(|&n| {
                start += n;
                start - n..start
            })
            .collect()
    }

    /// Whether every sequence contributes exactly one row (a decode step).
    pub fn is_decode(&self) -> bool {
        self.seq_lens.iter().all(|&n| n == 1)
    }

    /// Checks the batch against `states` and a model of `hidden` features that supports the
    /// listed features (explicit 3-D positions, adapters), makes room in every state for its
    /// new rows, and returns the 1-D position of every row.
    ///
    /// Errors name what is wrong: lengths that do not add up, an empty sequence, a state of
    /// another model, no room left, a feature the model does not have.
    pub fn validate(
        &self,
        states: &mut [&mut SeqState],
        kv_dim: usize,
        hidden: usize,
        supports_rope3d: bool,
    ) -> Result<Vec<usize>> {
        let rows = self.rows();
        let bad = |m: String| Err(Error::InvalidInput(m));
        match self.input {
            BatchInput::Tokens(ids) if ids.len() != rows => {
                return bad(format!(
                    "{} token ids for sequences of lengths {:?}",
                    ids.len(),
                    self.seq_lens
                ))
            }
            BatchInput::Embeddings(x) if x.len() != rows * hidden => {
                return bad(format!(
                    "{} input-embedding values for {rows} rows of {hidden}",
                    x.len()
                ))
            }
            _ => {}
        }
        if self.seq_lens.len() != states.len() {
            return bad(format!(
                "{} sequences in the batch but {} states",
                self.seq_lens.len(),
                states.len()
            ));
        }
        if self.seq_lens.contains(&0) {
            return bad("a sequence in the batch has no new tokens".into());
        }
        if let RowOutputs::Logits(flags) = &self.outputs {
            if flags.len() != rows {
                return bad(format!("{} output flags for {rows} rows", flags.len()));
            }
        }
        if let Some(a) = &self.adapters {
            if a.len() != self.seq_lens.len() {
                return bad(format!(
                    "adapters for {} sequences in a batch of {}",
                    a.len(),
                    self.seq_lens.len()
                ));
            }
        }
        if let Some(inj) = &self.injected {
            let n = inj.rows.len();
            let sorted = inj.rows.windows(2).all(|w| w[0] < w[1]);
            if !sorted || inj.rows.last().is_some_and(|&r| r >= rows) {
                return bad(format!("injected rows must be ascending and below {rows}"));
            }
            if inj.embeds.len() != n * hidden || inj.deepstack.iter().any(|d| d.len() != n * hidden)
            {
                return bad(format!(
                    "injected embeddings must be {n} rows of {hidden} values"
                ));
            }
        }
        for state in states.iter() {
            if state.kv_dim() != kv_dim {
                return bad("the state belongs to another model".into());
            }
        }
        let implicit = || -> Vec<usize> {
            self.seq_lens
                .iter()
                .zip(states.iter())
                .flat_map(|(&n, s)| s.len()..s.len() + n)
                .collect()
        };
        let positions = match &self.positions {
            Positions::Implicit => implicit(),
            Positions::Linear(p) if p.len() == rows => p.clone(),
            Positions::Linear(p) => return bad(format!("{} positions for {rows} rows", p.len())),
            Positions::Rope3d(_) if !supports_rope3d => return bad(
                "3-D positions are for multimodal rotary embeddings, which this model does not use"
                    .into(),
            ),
            Positions::Rope3d(p) if p.len() == rows => p.iter().map(|x| x[0]).collect(),
            Positions::Rope3d(p) => return bad(format!("{} positions for {rows} rows", p.len())),
        };
        for (&n, state) in self.seq_lens.iter().zip(states.iter_mut()) {
            state.reserve(n)?;
        }
        Ok(positions)
    }

    /// Which rows `outputs` keeps (`None`: every row).
    pub fn output_rows(&self) -> Option<Vec<usize>> {
        match &self.outputs {
            RowOutputs::LastLogits => {
                Some(self.row_ranges().into_iter().map(|r| r.end - 1).collect())
            }
            RowOutputs::Logits(flags) => Some(
                flags
                    .iter()
                    .enumerate()
                    .filter(|(_, &f)| f)
                    .map(|(i, _)| i)
                    .collect(),
            ),
            RowOutputs::AllLogits | RowOutputs::AllHidden => None,
        }
    }
}
