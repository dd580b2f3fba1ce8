//! Embedding tables: row lookup by id with bounds checks.

use crate::io::store::{Scope, Weight};
use crate::{Error, Result};

/// A `[n_rows, dim]` lookup table.
#[derive(Debug, Clone)]
pub struct Embedding {
    weight: Weight, // f32 [n_rows, dim]
}

impl Embedding {
    /// Loads `weight` f32 [n_rows, dim] under `scope`.
    pub fn load(scope: &Scope, n_rows: usize, dim: usize) -> Result<Self> {
        Ok(Self {
            weight: scope.get("weight", &[n_rows, dim])?,
        })
    }

    /// Row width.
    pub fn dim(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Number of rows.
    pub fn n_rows(&self) -> usize {
        self.weight.shape()[0]
    }

    /// One row.
    pub fn row(&self, id: usize) -> Result<&[f32]> {
        let dim = self.dim();
        if id >= self.n_rows() {
            return Err(Error::InvalidInput(format!(
                "id {id} is outside the embedding table of {} rows",
                self.n_rows()
            )));
        }
        Ok(&self.weight.as_slice()[id * dim..(id + 1) * dim])
    }

    /// Adds row `ids[i]` to row `i` of `out` f32 [ids.len(), dim].
    pub fn add_rows<I: IntoIterator<Item = usize>>(&self, ids: I, out: &mut [f32]) -> Result<()> {
        let dim = self.dim();
        for (id, o) in ids.into_iter().zip(out.chunks_exact_mut(dim)) {
            for (a, b) in o.iter_mut().zip(self.row(id)?) {
                *a += b;
            }
        }
        Ok(())
    }
}
