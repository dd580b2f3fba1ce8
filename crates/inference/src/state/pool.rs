//! [`PagePool`]: the memory every sequence's keys and values live in, as fixed-size pages under
//! one byte budget. A page holds `page_rows` consecutive tokens of every attention layer of a
//! model (keys, then values, per layer), so one page id covers a token range across the whole
//! model, as vLLM's blocks do. Pages are reference-counted ([`PageRef`]): a page shared by
//! several sequences (a common prompt prefix) or kept by the prefix cache is read-only, and is
//! returned to the pool when its last holder drops it. Recurrent state (Gated DeltaNet) and its
//! snapshots are charged against the same budget ([`Charge`]). A pool lives on one
//! [`Device`]: on a GPU its pages are device memory that attention kernels read by address.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use half::f16;

use super::seq::KvDtype;
use super::view::KvRows;
use crate::backend::Device;
use crate::{Error, Result};

/// Tokens per page unless a pool is made with another size.
pub const DEFAULT_PAGE_ROWS: usize = 32;

/// The shape of the pages of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageShape {
    /// Tokens per page.
    pub page_rows: usize,
    /// Attention layers (each stores keys and values in every page).
    pub attn_layers: usize,
    /// Width of one layer's key (or value) row.
    pub kv_dim: usize,
    /// How keys and values are stored.
    pub dtype: KvDtype,
}

impl PageShape {
    /// Values in one layer's keys (or values) of a page.
    pub fn layer_values(&self) -> usize {
        self.page_rows * self.kv_dim
    }

    /// Values in a page.
    pub fn page_values(&self) -> usize {
        2 * self.attn_layers * self.layer_values()
    }

    /// Bytes of a page.
    pub fn page_bytes(&self) -> usize {
        self.page_values() * self.dtype.bytes()
    }
}

#[derive(Debug)]
enum PageBuf {
    F32(Box<[f32]>),
    F16(Box<[f16]>),
    /// Device memory (f32 values, or f16 bit patterns).
    #[cfg(feature = "cuda")]
    CudaF32(cudarc::driver::CudaSlice<f32>),
    #[cfg(feature = "cuda")]
    CudaF16(cudarc::driver::CudaSlice<u16>),
}

#[derive(Debug)]
struct PoolInner {
    shape: PageShape,
    device: Device,
    budget: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    pages: AtomicUsize,
    free: Mutex<Vec<PageBuf>>,
}

impl PoolInner {
    fn try_charge(&self, bytes: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes).filter(|&n| n <= self.budget) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A shared pool of pages under a byte budget (cloning shares it).
#[derive(Debug, Clone)]
pub struct PagePool {
    inner: Arc<PoolInner>,
}

/// One page: `page_rows` tokens of every attention layer. Returned to its pool when dropped.
#[derive(Debug)]
pub struct Page {
    buf: Option<PageBuf>,
    pool: Arc<PoolInner>,
}

/// A reference-counted page; shared pages are read-only.
pub type PageRef = Arc<Page>;

/// Bytes charged against a pool's budget for something other than a page (recurrent state, a
/// snapshot); released when dropped.
#[derive(Debug)]
pub struct Charge {
    bytes: usize,
    pool: Arc<PoolInner>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.pool.release(self.bytes);
    }
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl PagePool {
    /// A pool of pages of `shape` holding at most `budget` bytes (pages plus charges).
    pub fn new(shape: PageShape, budget: usize) -> Self {
        Self::on_device(&Device::Cpu, shape, budget)
    }

    /// [`PagePool::new`] with the pages on `device`.
    pub fn on_device(device: &Device, shape: PageShape, budget: usize) -> Self {
        assert!(shape.page_rows > 0, "pages hold at least one token");
        Self {
            inner: Arc::new(PoolInner {
                shape,
                device: device.clone(),
                budget,
                used: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                pages: AtomicUsize::new(0),
                free: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A pool with no budget (one sequence's own memory, tests).
    pub fn unbounded(shape: PageShape) -> Self {
        Self::new(shape, usize::MAX)
    }

    /// The page shape.
    pub fn shape(&self) -> PageShape {
        self.inner.shape
    }

    /// The device the pages live on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The budget in bytes.
    pub fn budget(&self) -> usize {
        self.inner.budget
    }

    /// Bytes in use (pages and charges).
    pub fn used_bytes(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }

    /// The most bytes ever in use at once.
    pub fn peak_bytes(&self) -> usize {
        self.inner.peak.load(Ordering::Acquire)
    }

    /// Pages allocated now.
    pub fn pages_used(&self) -> usize {
        self.inner.pages.load(Ordering::Acquire)
    }

    /// Pages that would still fit in the budget.
    pub fn pages_free(&self) -> usize {
        let bytes = self.inner.shape.page_bytes().max(1);
        self.budget().saturating_sub(self.used_bytes()) / bytes
    }

    fn full(&self, what: &str, bytes: usize) -> Error {
        Error::OutOfMemory(format!(
            "{what} needs {bytes} more bytes; the KV memory budget of {} bytes has {} in use",
            self.budget(),
            self.used_bytes()
        ))
    }

    /// A new page (contents unspecified), or [`Error::OutOfMemory`] when the budget is spent.
    pub fn alloc(&self) -> Result<Page> {
        let shape = self.inner.shape;
        let bytes = shape.page_bytes();
        if !self.inner.try_charge(bytes) {
            return Err(self.full("a KV page", bytes));
        }
        self.inner.pages.fetch_add(1, Ordering::AcqRel);
        let recycled = self.inner.free.lock().map(|mut f| f.pop()).unwrap_or(None);
        let buf = match recycled {
            Some(b) => b,
            None => match self.new_buf(shape) {
                Ok(b) => b,
                Err(e) => {
                    self.inner.release(bytes);
                    self.inner.pages.fetch_sub(1, Ordering::AcqRel);
                    return Err(e);
                }
            },
        };
        Ok(Page {
            buf: Some(buf),
            pool: Arc::clone(&self.inner),
        })
    }

    fn new_buf(&self, shape: PageShape) -> Result<PageBuf> {
        let n = shape.page_values();
        Ok(match (&self.inner.device, shape.dtype) {
            (Device::Cpu, KvDtype::F32) => PageBuf::F32(vec![0.0; n].into_boxed_slice()),
            (Device::Cpu, KvDtype::F16) => PageBuf::F16(vec![f16::ZERO; n].into_boxed_slice()),
            #[cfg(feature = "cuda")]
            (Device::Cuda(d), KvDtype::F32) => PageBuf::CudaF32(d.alloc(n)?),
            #[cfg(feature = "cuda")]
            (Device::Cuda(d), KvDtype::F16) => PageBuf::CudaF16(d.alloc(n)?),
        })
    }

    /// Charges `bytes` against the budget, or [`Error::OutOfMemory`].
    pub fn charge(&self, bytes: usize) -> Result<Charge> {
        if !self.inner.try_charge(bytes) {
            return Err(self.full("recurrent state", bytes));
        }
        Ok(Charge {
            bytes,
            pool: Arc::clone(&self.inner),
        })
    }

    /// Charges `bytes` even beyond the budget (a copy the caller cannot refuse, e.g. `Clone`).
    pub fn force_charge(&self, bytes: usize) -> Charge {
        self.inner.used.fetch_add(bytes, Ordering::AcqRel);
        self.inner
            .peak
            .fetch_max(self.used_bytes(), Ordering::Relaxed);
        Charge {
            bytes,
            pool: Arc::clone(&self.inner),
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        self.pool.release(self.pool.shape.page_bytes());
        self.pool.pages.fetch_sub(1, Ordering::AcqRel);
        if let (Some(buf), Ok(mut free)) = (self.buf.take(), self.pool.free.lock()) {
            // Keep a few buffers for the next allocations instead of returning them to the
            // allocator (decode allocates a page every `page_rows` tokens per sequence).
            if free.len() < 64 {
                free.push(buf);
            }
        }
    }
}

impl Page {
    fn shape(&self) -> PageShape {
        self.pool.shape
    }

    fn range(&self, slot: usize, values: bool) -> std::ops::Range<usize> {
        let n = self.shape().layer_values();
        let start = (2 * slot + usize::from(values)) * n;
        start..start + n
    }

    /// Attention layer `slot`'s keys (`values == false`) or values in this page.
    pub fn rows(&self, slot: usize, values: bool) -> KvRows<'_> {
        let r = self.range(slot, values);
        match self.buf.as_ref().expect("a live page has its buffer") {
            PageBuf::F32(b) => KvRows::F32(&b[r]),
            PageBuf::F16(b) => KvRows::F16(&b[r]),
            #[cfg(feature = "cuda")]
            PageBuf::CudaF32(_) | PageBuf::CudaF16(_) => {
                panic!("host read of a device page (a caller bug)")
            }
        }
    }

    /// The device address of this page's first value, for a page in device memory.
    pub fn device_addr(&self) -> Option<u64> {
        match self.buf.as_ref()? {
            PageBuf::F32(_) | PageBuf::F16(_) => None,
            #[cfg(feature = "cuda")]
            PageBuf::CudaF32(b) => match &self.pool.device {
                Device::Cuda(d) => Some(d.ptr(b)),
                Device::Cpu => None,
            },
            #[cfg(feature = "cuda")]
            PageBuf::CudaF16(b) => match &self.pool.device {
                Device::Cuda(d) => Some(d.ptr(b)),
                Device::Cpu => None,
            },
        }
    }

    /// Element offset, from the page's start, of row `row` of attention layer `slot`'s keys
    /// (`values == false`) or values.
    pub fn offset(&self, slot: usize, values: bool, row: usize) -> usize {
        self.range(slot, values).start + row * self.shape().kv_dim
    }

    /// Writes `data` (f32 rows, rounded in an f16 page) at row `row` of layer `slot`'s keys or
    /// values.
    pub fn write(&mut self, slot: usize, values: bool, row: usize, data: &[f32]) {
        let r = self.range(slot, values);
        let at = r.start + row * self.shape().kv_dim;
        assert!(at + data.len() <= r.end, "write past the page");
        match self.buf.as_mut().expect("a live page has its buffer") {
            PageBuf::F32(b) => b[at..at + data.len()].copy_from_slice(data),
            PageBuf::F16(b) => {
                for (d, &x) in b[at..at + data.len()].iter_mut().zip(data) {
                    *d = f16::from_f32(x);
                }
            }
            #[cfg(feature = "cuda")]
            PageBuf::CudaF32(_) | PageBuf::CudaF16(_) => {
                panic!("host write of a device page (a caller bug)")
            }
        }
    }

    /// A copy of this page in a new page of the same pool (copy-on-write of a shared page).
    pub fn duplicate(&self) -> Result<Page> {
        let mut p = PagePool {
            inner: Arc::clone(&self.pool),
        }
        .alloc()?;
        match (p.buf.as_mut(), self.buf.as_ref()) {
            (Some(PageBuf::F32(d)), Some(PageBuf::F32(s))) => d.copy_from_slice(s),
            (Some(PageBuf::F16(d)), Some(PageBuf::F16(s))) => d.copy_from_slice(s),
            #[cfg(feature = "cuda")]
            (Some(PageBuf::CudaF32(d)), Some(PageBuf::CudaF32(s))) => {
                if let Device::Cuda(dev) = &self.pool.device {
                    *d = dev.duplicate(s, s.len())?;
                }
            }
            #[cfg(feature = "cuda")]
            (Some(PageBuf::CudaF16(d)), Some(PageBuf::CudaF16(s))) => {
                if let Device::Cuda(dev) = &self.pool.device {
                    *d = dev.duplicate(s, s.len())?;
                }
            }
            _ => unreachable!("pages of one pool share a dtype"),
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> PageShape {
        PageShape {
            page_rows: 4,
            attn_layers: 2,
            kv_dim: 3,
            dtype: KvDtype::F32,
        }
    }

    #[test]
    fn budget_counts_pages_and_charges() {
        let s = shape();
        let pool = PagePool::new(s, 2 * s.page_bytes() + 10);
        let a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        assert_eq!(pool.pages_used(), 2);
        assert!(matches!(pool.alloc(), Err(Error::OutOfMemory(_))));
        let c = pool.charge(10).unwrap();
        assert!(pool.charge(1).is_err());
        drop(a);
        assert_eq!(pool.pages_free(), 1);
        assert_eq!(pool.used_bytes(), s.page_bytes() + 10);
        drop(c);
        assert_eq!(pool.used_bytes(), s.page_bytes());
        let mut d = pool.alloc().unwrap();
        d.write(1, true, 3, &[1.0, 2.0, 3.0]);
        assert_eq!(d.rows(1, true).to_f32(9..12), vec![1.0, 2.0, 3.0]);
        let e = Arc::new(b);
        drop(d);
        let copy = e.duplicate().unwrap();
        assert_eq!(copy.rows(0, false).len(), 12);
        assert_eq!(pool.peak_bytes(), 2 * s.page_bytes() + 10);
    }
}
