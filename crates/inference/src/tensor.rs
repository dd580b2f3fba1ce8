//! [`Tensor`]: activations where they live. A tensor is f32 rows [rows, cols] on one
//! [`Device`]: a host `Vec<f32>` on the CPU, device memory on a GPU. Models pass tensors
//! between ops and never look inside; ops match on the storage and call their backend. Moving
//! data between host and device happens only where a tensor is made from host rows
//! ([`Tensor::from_host`]) or read back ([`Tensor::to_host`]).
//!
//! Large host buffers of dropped tensors are kept per thread and handed out again by
//! [`host_scratch`] to ops that overwrite their whole output, so a forward pass does not clear
//! (or fault in) fresh memory for every product.

use crate::backend::Device;
use crate::{Error, Result};

/// Where a tensor's values are.
pub enum Storage {
    /// Host memory, row-major.
    Cpu(Vec<f32>),
    /// Device memory on a GPU, row-major.
    #[cfg(feature = "cuda")]
    Cuda(CudaStorage),
}

/// A tensor's device memory and the device that owns it.
#[cfg(feature = "cuda")]
pub struct CudaStorage {
    /// The device.
    pub dev: std::sync::Arc<crate::backend::cuda::CudaDevice>,
    /// The values (at least rows * cols).
    pub buf: crate::backend::cuda::Buf,
}

/// f32 [rows, cols] on a device.
pub struct Tensor {
    rows: usize,
    cols: usize,
    storage: Storage,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor([{}, {}] on {})",
            self.rows,
            self.cols,
            self.device()
        )
    }
}

impl Tensor {
    /// A host tensor over `data` (rows * cols values).
    pub fn cpu(rows: usize, cols: usize, data: Vec<f32>) -> Tensor {
        assert_eq!(
            data.len(),
            rows * cols,
            "tensor data does not match its shape"
        );
        Tensor {
            rows,
            cols,
            storage: Storage::Cpu(data),
        }
    }

    /// `data` (rows * cols host values) placed on `device`.
    pub fn from_host(device: &Device, rows: usize, cols: usize, data: Vec<f32>) -> Result<Tensor> {
        if data.len() != rows * cols {
            return Err(Error::Shape {
                op: "Tensor::from_host",
                reason: format!("{} values for [{rows}, {cols}]", data.len()),
            });
        }
        match device {
            Device::Cpu => Ok(Tensor::cpu(rows, cols, data)),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => Ok(Tensor::cuda(dev, rows, cols, dev.upload(&data)?.into())),
        }
    }

    /// A tensor over device memory.
    #[cfg(feature = "cuda")]
    pub fn cuda(
        dev: &std::sync::Arc<crate::backend::cuda::CudaDevice>,
        rows: usize,
        cols: usize,
        buf: crate::backend::cuda::Buf,
    ) -> Tensor {
        assert!(
            buf.len() >= rows * cols,
            "device buffer smaller than its tensor"
        );
        Tensor {
            rows,
            cols,
            storage: Storage::Cuda(CudaStorage {
                dev: std::sync::Arc::clone(dev),
                buf,
            }),
        }
    }

    /// Zeros [rows, cols] on `device`.
    pub fn zeros(device: &Device, rows: usize, cols: usize) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(Tensor::cpu(rows, cols, vec![0.0; rows * cols])),
            #[cfg(feature = "cuda")]
            Device::Cuda(dev) => Ok(Tensor::cuda(dev, rows, cols, dev.zeros(rows * cols)?)),
        }
    }

    /// A copy on the same device.
    pub fn try_clone(&self) -> Result<Tensor> {
        match &self.storage {
            Storage::Cpu(v) => Ok(Tensor::cpu(self.rows, self.cols, v.clone())),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Tensor::cuda(
                &s.dev,
                self.rows,
                self.cols,
                s.dev.duplicate(&s.buf, self.len())?.into(),
            )),
        }
    }

    /// Overwrites the values with `src`'s (same shape, same device).
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        if (src.rows, src.cols) != (self.rows, self.cols) {
            return Err(Error::Shape {
                op: "Tensor::copy_from",
                reason: format!(
                    "[{}, {}] into [{}, {}]",
                    src.rows, src.cols, self.rows, self.cols
                ),
            });
        }
        #[cfg(feature = "cuda")]
        let n = self.len();
        match (&mut self.storage, &src.storage) {
            (Storage::Cpu(d), Storage::Cpu(s)) => {
                d.copy_from_slice(s);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(d), Storage::Cuda(s)) => d.dev.copy_within(&s.buf, &mut d.buf, n),
            #[cfg(feature = "cuda")]
            _ => Err(mixed("Tensor::copy_from")),
        }
    }

    /// Sets every value to zero.
    pub fn fill_zero(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        let n = self.len();
        match &mut self.storage {
            Storage::Cpu(v) => {
                v.fill(0.0);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.dev.fill_zero(&mut s.buf, n),
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the tensor holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device the values are on.
    pub fn device(&self) -> Device {
        match &self.storage {
            Storage::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Device::Cuda(std::sync::Arc::clone(&s.dev)),
        }
    }

    /// The storage (for ops).
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The storage, mutably (for ops).
    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// The storage, taken.
    pub fn into_storage(mut self) -> Storage {
        self.take_storage()
    }

    /// Moves the storage out, leaving an empty host vector for `Drop`.
    fn take_storage(&mut self) -> Storage {
        std::mem::replace(&mut self.storage, Storage::Cpu(Vec::new()))
    }

    /// A host copy of the values (waits for the device).
    pub fn to_host(&self) -> Result<Vec<f32>> {
        match &self.storage {
            Storage::Cpu(v) => Ok(v.clone()),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.dev.download(&s.buf, self.len()),
        }
    }

    /// The values on the host, moving them when they already are.
    pub fn into_host(mut self) -> Result<Vec<f32>> {
        match self.take_storage() {
            Storage::Cpu(v) => Ok(v),
            #[cfg(feature = "cuda")]
            Storage::Cuda(ref s) => s.dev.download(&s.buf, self.len()),
        }
    }

    /// The same values viewed as [rows, cols] (rows * cols must not change).
    pub fn reshape(mut self, rows: usize, cols: usize) -> Result<Tensor> {
        if rows * cols != self.len() {
            return Err(Error::Shape {
                op: "Tensor::reshape",
                reason: format!("[{}, {}] to [{rows}, {cols}]", self.rows, self.cols),
            });
        }
        self.rows = rows;
        self.cols = cols;
        Ok(self)
    }

    /// Rows `idx` (each < rows), in that order.
    pub fn gather_rows(&self, idx: &[usize]) -> Result<Tensor> {
        if let Some(&bad) = idx.iter().find(|&&r| r >= self.rows) {
            return Err(Error::Shape {
                op: "Tensor::gather_rows",
                reason: format!("row {bad} of {}", self.rows),
            });
        }
        let c = self.cols;
        match &self.storage {
            Storage::Cpu(v) => {
                let mut out = Vec::with_capacity(idx.len() * c);
                for &r in idx {
                    out.extend_from_slice(&v[r * c..(r + 1) * c]);
                }
                Ok(Tensor::cpu(idx.len(), c, out))
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                let idx: Vec<u32> = idx.iter().map(|&r| r as u32).collect();
                let buf = s.dev.gather_rows(&s.buf, self.rows, &idx, c)?;
                Ok(Tensor::cuda(&s.dev, idx.len(), c, buf))
            }
        }
    }

    /// Splits the columns into consecutive groups of `widths` (which must sum to cols).
    pub fn split_columns<const N: usize>(&self, widths: [usize; N]) -> Result<[Tensor; N]> {
        if widths.iter().sum::<usize>() != self.cols {
            return Err(Error::Shape {
                op: "Tensor::split_columns",
                reason: format!("widths {widths:?} of rows of {}", self.cols),
            });
        }
        let mut col0 = 0;
        let mut parts = Vec::with_capacity(N);
        for w in widths {
            parts.push(self.columns(col0, w)?);
            col0 += w;
        }
        Ok(parts
            .try_into()
            .unwrap_or_else(|_| unreachable!("N parts were made")))
    }

    /// Columns `col0 .. col0 + width` as a new tensor.
    pub fn columns(&self, col0: usize, width: usize) -> Result<Tensor> {
        if col0 + width > self.cols {
            return Err(Error::Shape {
                op: "Tensor::columns",
                reason: format!("columns {col0}..{} of {}", col0 + width, self.cols),
            });
        }
        match &self.storage {
            Storage::Cpu(v) => {
                let mut out = host_scratch(self.rows * width);
                let src = v.get(col0..).unwrap_or_default();
                crate::backend::cpu::copy_rows(src, self.cols, &mut out, width, self.rows, width);
                Ok(Tensor::cpu(self.rows, width, out))
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                let buf = s.dev.copy_cols(&s.buf, self.cols, col0, self.rows, width)?;
                Ok(Tensor::cuda(&s.dev, self.rows, width, buf))
            }
        }
    }
}

/// The error of an op given tensors on different devices (a caller bug).
#[cfg(feature = "cuda")]
pub(crate) fn mixed(op: &'static str) -> Error {
    Error::Shape {
        op,
        reason: "tensors on different devices".into(),
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        match &mut self.storage {
            Storage::Cpu(v) => recycle(std::mem::take(v)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => {}
        }
    }
}

/// Smallest host buffer worth keeping (values): below this, allocating is cheap.
const RECYCLE_MIN: usize = 16 * 1024;
/// Largest buffer kept (values: 64 MiB).
const RECYCLE_MAX: usize = 16 << 20;
/// Most values kept per thread (128 MiB).
const RECYCLE_TOTAL: usize = 32 << 20;
/// Buffers kept per thread.
const RECYCLE_COUNT: usize = 8;

thread_local! {
    /// This thread's kept host buffers (see the module doc).
    static RECYCLED: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps `v` for [`host_scratch`] if it is large enough and the thread's pool has room (the
/// oldest buffer goes when it is full). Dropped host tensors come here; ops call it for large
/// scratch vectors that never became a tensor.
pub(crate) fn recycle(v: Vec<f32>) {
    let cap = v.capacity();
    if !(RECYCLE_MIN..=RECYCLE_MAX).contains(&cap) {
        return;
    }
    // (`try_with`: a thread being torn down just frees the buffer.)
    let _ = RECYCLED.try_with(|pool| {
        let Ok(mut pool) = pool.try_borrow_mut() else {
            return;
        };
        pool.push(v);
        while pool.len() > RECYCLE_COUNT
            || pool.iter().map(Vec::capacity).sum::<usize>() > RECYCLE_TOTAL
        {
            pool.remove(0);
        }
    });
}

/// A host vector of `len` values whose contents are unspecified (stale values of a dropped
/// tensor, or zeros): for an op that writes every value before anything reads it. Takes a kept
/// buffer with at least `len` and at most twice `len` room (one already `len` long first, then
/// the best fit), else allocates.
pub(crate) fn host_scratch(len: usize) -> Vec<f32> {
    let kept = if len >= RECYCLE_MIN {
        RECYCLED
            .try_with(|pool| {
                let mut pool = pool.try_borrow_mut().ok()?;
                // Best: a buffer already `len` long (nothing to fill), then the best fit.
                let best = pool
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| (len..=2 * len).contains(&v.capacity()))
                    .min_by_key(|(_, v)| (v.len() < len, v.capacity()))
                    .map(|(i, _)| i)?;
                Some(pool.swap_remove(best))
            })
            .ok()
            .flatten()
    } else {
        None
    };
    let mut v = kept.unwrap_or_default();
    // Cut to `len`, or grow with zeros (only the new part is written).
    v.resize(len, 0.0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dropped host tensor's buffer comes back from `host_scratch` for a request it fits
    /// (its memory, cut to the length asked), the best fit first; small buffers, or ones more
    /// than twice the request, are not handed out.
    #[test]
    fn dropped_buffers_are_handed_out_again() {
        let n = RECYCLE_MIN * 2;
        let big = Tensor::cpu(2, n / 2, vec![1.0; n]);
        let fit = Tensor::cpu(1, n - 8, vec![2.0; n - 8]);
        let (big_ptr, fit_ptr) = match (big.storage(), fit.storage()) {
            (Storage::Cpu(a), Storage::Cpu(b)) => (a.as_ptr(), b.as_ptr()),
            #[cfg(feature = "cuda")]
            _ => unreachable!(),
        };
        drop(big);
        drop(fit);
        let a = host_scratch(n - 100);
        assert_eq!((a.as_ptr(), a.len()), (fit_ptr, n - 100), "best fit first");
        let b = host_scratch(n - 100);
        assert_eq!((b.as_ptr(), b.len()), (big_ptr, n - 100));
        // Nothing kept is left for these: fresh (zeroed) memory.
        assert!(host_scratch(n).iter().all(|&v| v == 0.0));
        drop(Tensor::cpu(1, 4 * n, vec![3.0; 4 * n]));
        assert!(
            host_scratch(n).iter().all(|&v| v == 0.0),
            "4x too big: not used"
        );
        drop(Tensor::cpu(1, 10, vec![4.0; 10]));
        assert!(host_scratch(8).iter().all(|&v| v == 0.0), "small: not kept");
        // A buffer shorter than the request but with room grows with zeros.
        let mut v = Vec::with_capacity(n);
        v.resize(n / 2 + 1, 5.0);
        recycle(v);
        let c = host_scratch(n);
        assert_eq!(c.len(), n);
        assert!(c[n / 2 + 1..].iter().all(|&v| v == 0.0));
    }
}
