//! Layer normalization (`torch.nn.LayerNorm` over the last dimension).

use crate::backend::{cpu, Mirror};
use crate::io::store::{Scope, Weight};
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};

fn check_width(op: &'static str, x: &Tensor, dim: usize) -> Result<()> {
    if x.cols() != dim {
        return Err(Error::Shape {
            op,
            reason: format!("rows of {} values, weight of {dim}", x.cols()),
        });
    }
    Ok(())
}

/// Layer norm with learned scale and shift.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Weight, // f32 [dim]
    bias: Weight,   // f32 [dim]
    eps: f32,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    weight_dev: Mirror,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    bias_dev: Mirror,
}

impl LayerNorm {
    /// Loads `weight`/`bias` under `scope`, falling back to the `gamma`/`beta` names of older
    /// TensorFlow-converted BERT checkpoints.
    pub fn load(scope: &Scope, dim: usize, eps: f32) -> Result<Self> {
        let (w, b) = if !scope.contains("weight") && scope.contains("gamma") {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok(Self {
            weight: scope.get(w, &[dim])?,
            bias: scope.get(b, &[dim])?,
            eps,
            weight_dev: Mirror::new(),
            bias_dev: Mirror::new(),
        })
    }

    /// Normalizes each row of `x` [n, dim] in place, on the device it lives on.
    pub fn apply(&self, x: &mut Tensor) -> Result<()> {
        check_width("LayerNorm", x, self.weight.shape()[0])?;
        #[cfg(feature = "cuda")]
        let rows = x.rows();
        match x.storage_mut() {
            Storage::Cpu(v) => {
                self.forward_inplace(v);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                let w = self.weight_dev.cuda(&s.dev, self.weight.as_slice())?;
                let b = self.bias_dev.cuda(&s.dev, self.bias.as_slice())?;
                let dim = self.weight.shape()[0];
                s.dev.layer_norm(&mut s.buf, w, b, rows, dim, self.eps)
            }
        }
    }

    /// Normalizes each row of `x` f32 [n, dim] in place.
    pub fn forward_inplace(&self, x: &mut [f32]) {
        let dim = self.weight.shape()[0];
        debug_assert_eq!(x.len() % dim, 0);
        cpu::layer_norm(
            x,
            dim,
            self.weight.as_slice(),
            self.bias.as_slice(),
            self.eps,
        );
    }
}

/// Values per task of a parallel norm (from four such tasks on).
const PAR_ROWS: usize = 1 << 14;

/// RMS norm (`LlamaRMSNorm` / `Qwen3RMSNorm`): `y = w ⊙ (x / sqrt(mean(x²) + eps))`, computed in
/// f32 in that order, as transformers does.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Weight, // f32 [dim]
    eps: f32,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    weight_dev: Mirror,
}

impl RmsNorm {
    /// Loads `weight` f32 [dim] under `scope`.
    pub fn load(scope: &Scope, dim: usize, eps: f32) -> Result<Self> {
        Ok(Self::new(scope.get("weight", &[dim])?, eps))
    }

    /// Wraps a loaded weight f32 [dim].
    pub fn new(weight: Weight, eps: f32) -> Self {
        Self {
            weight,
            eps,
            weight_dev: Mirror::new(),
        }
    }

    /// Normalizes each row of `x` [n, dim] in place, on the device it lives on. A tensor of
    /// rows of several heads normalizes each head when reshaped to [n * heads, dim] first.
    pub fn apply(&self, x: &mut Tensor) -> Result<()> {
        let dim = self.dim();
        check_width("RmsNorm", x, dim)?;
        #[cfg(feature = "cuda")]
        let rows = x.rows();
        match x.storage_mut() {
            Storage::Cpu(v) => {
                self.forward_inplace(v);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                let w = self.weight_dev.cuda(&s.dev, self.weight.as_slice())?;
                s.dev.rms_norm(&mut s.buf, w, None, rows, dim, self.eps)
            }
        }
    }

    /// The epsilon.
    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// The weight on a GPU (for kernels that fuse the norm).
    #[cfg(feature = "cuda")]
    pub fn cuda_weight(
        &self,
        dev: &crate::backend::cuda::CudaDevice,
    ) -> Result<&crate::backend::cuda::Buf> {
        self.weight_dev.cuda(dev, self.weight.as_slice())
    }

    /// A normalized copy of `x` [n, dim].
    pub fn norm(&self, x: &Tensor) -> Result<Tensor> {
        check_width("RmsNorm", x, self.dim())?;
        match x.storage() {
            Storage::Cpu(v) => {
                let mut y = crate::tensor::host_scratch(v.len());
                self.rows(&mut y, |i, out| {
                    out.copy_from_slice(&v[i * out.len()..][..out.len()])
                });
                Ok(Tensor::cpu(x.rows(), x.cols(), y))
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                let (rows, dim) = (x.rows(), x.cols());
                let w = self.weight_dev.cuda(&s.dev, self.weight.as_slice())?;
                let mut y = s.dev.alloc_buf(rows * dim)?;
                s.dev
                    .rms_norm_into(&s.buf, w, &mut y, rows, dim, self.eps)?;
                Ok(Tensor::cuda(&s.dev, rows, dim, y))
            }
        }
    }

    /// Width of each normalized row.
    pub fn dim(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Normalizes each row of `x` f32 [n, dim] in place.
    pub fn forward_inplace(&self, x: &mut [f32]) {
        self.rows(x, |_, _| ());
    }

    /// Normalizes one row in place.
    pub fn norm_row(&self, row: &mut [f32]) {
        let w = self.weight.as_slice();
        let r = 1.0 / (cpu::sum_squares(row) / w.len() as f32 + self.eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = g * (*v * r);
        }
    }

    /// For every row `i` of `x` f32 [n, dim]: `fill(i, row)`, then the row normalized in place;
    /// blocks of rows on the workers for large inputs.
    fn rows(&self, x: &mut [f32], fill: impl Fn(usize, &mut [f32]) + Sync + Send) {
        let dim = self.dim();
        debug_assert_eq!(x.len() % dim, 0);
        let per_task = (PAR_ROWS / dim.max(1)).max(1);
        cpu::par_chunks_mut(x, per_task * dim, x.len() >= 4 * PAR_ROWS, |t, part| {
            for (r, row) in part.chunks_exact_mut(dim).enumerate() {
                fill(t * per_task + r, row);
                self.norm_row(row);
            }
        });
    }
}
