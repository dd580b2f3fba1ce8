//! [`Mirror`]: small host values (norm weights, biases, rotary frequencies) with a device copy
//! made the first time an op needs it there, so op structs are built once, on the host, and
//! serve every device.

/// Lazily made device copies of some host values.
#[derive(Debug, Default)]
pub struct Mirror {
    #[cfg(feature = "cuda")]
    cuda: std::sync::OnceLock<(usize, super::cuda::Buf)>,
}

impl Mirror {
    /// An empty mirror.
    pub fn new() -> Self {
        Self::default()
    }

    /// The copy of `host` on `dev`, uploaded on first use. `host` must be the same values at
    /// every call.
    #[cfg(feature = "cuda")]
    pub fn cuda(
        &self,
        dev: &super::cuda::CudaDevice,
        host: &[f32],
    ) -> crate::Result<&super::cuda::Buf> {
        self.cuda_with(dev, || host.to_vec())
    }

    /// [`Mirror::cuda`] of values made by `host` (called only for the first upload).
    #[cfg(feature = "cuda")]
    pub fn cuda_with(
        &self,
        dev: &super::cuda::CudaDevice,
        host: impl FnOnce() -> Vec<f32>,
    ) -> crate::Result<&super::cuda::Buf> {
        if self.cuda.get().is_none() {
            let buf = dev.upload(&host())?;
            // A racing thread may have set it first; its copy holds the same values.
            let _ = self.cuda.set((dev.ordinal(), buf.into()));
        }
        let (ordinal, buf) = self.cuda.get().expect("set above");
        if *ordinal != dev.ordinal() {
            return Err(crate::Error::Device(format!(
                "weights already placed on cuda:{ordinal}, used on cuda:{}",
                dev.ordinal()
            )));
        }
        Ok(buf)
    }
}

impl Clone for Mirror {
    /// A clone starts without device copies (they are made again on first use).
    fn clone(&self) -> Self {
        Self::default()
    }
}
