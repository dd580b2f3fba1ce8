//! [`Device`]: where a model's weights, activations and KV pages live, and [`Op`], the
//! capability query a model asks at load time ("can this device run a Gated DeltaNet layer?")
//! so that an unsupported combination is refused with a clear error instead of failing mid-run.
//! Model code never branches on the device: it calls ops, and ops dispatch on where their
//! tensors live.

use std::fmt;
#[cfg(feature = "cuda")]
use std::sync::Arc;

use crate::{Error, Result};

/// A compute device, opened. Cloning is cheap (CUDA devices are shared handles).
#[derive(Clone, Default)]
pub enum Device {
    /// The host CPU (runtime-dispatched SIMD kernels, `backend::cpu`).
    #[default]
    Cpu,
    /// An NVIDIA GPU (`backend::cuda`).
    #[cfg(feature = "cuda")]
    Cuda(Arc<super::cuda::CudaDevice>),
}

/// Operations whose support differs between devices (see [`Device::supports`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Dense products with f32 weights.
    LinearF32,
    /// Dense products with bf16 weights (bf16-rounded activations, f32 sums).
    LinearBf16,
    /// Dense products over GGUF / Q8_0 quantized blocks.
    LinearQuant,
    /// RMSNorm.
    RmsNorm,
    /// LayerNorm.
    LayerNorm,
    /// Rotary embeddings.
    Rope,
    /// SwiGLU (`silu(gate) * up`).
    SiluMul,
    /// Exact GELU.
    Gelu,
    /// Causal attention over paged f32 keys and values.
    AttentionF32,
    /// Causal attention over paged f16 keys and values.
    AttentionF16,
    /// Bidirectional (encoder) attention over packed sequences.
    EncoderAttention,
    /// A Gated DeltaNet layer (causal conv, delta rule, recurrent state).
    GatedDeltaNet,
    /// Greedy token choice on the device.
    Argmax,
}

impl Device {
    /// Opens `spec`: `cpu`, `cuda` (device 0) or `cuda:N`. Fails with a message naming what is
    /// missing: CUDA support not built in, no driver, no such device.
    pub fn open(spec: &str) -> Result<Device> {
        let s = spec.trim().to_ascii_lowercase();
        if s == "cpu" {
            return Ok(Device::Cpu);
        }
        let ordinal = if s == "cuda" {
            0
        } else if let Some(n) = s.strip_prefix("cuda:") {
            n.parse::<usize>().map_err(|_| {
                Error::Device(format!(
                    "`{spec}`: the CUDA device number must be a non-negative integer"
                ))
            })?
        } else {
            return Err(Error::Device(format!(
                "unknown device `{spec}` (expected cpu, cuda or cuda:N)"
            )));
        };
        Self::open_cuda(ordinal)
    }

    #[cfg(feature = "cuda")]
    fn open_cuda(ordinal: usize) -> Result<Device> {
        Ok(Device::Cuda(super::cuda::CudaDevice::open(ordinal)?))
    }

    #[cfg(not(feature = "cuda"))]
    fn open_cuda(ordinal: usize) -> Result<Device> {
        Err(Error::Device(format!(
            "cuda:{ordinal}: this build of Lattice has no CUDA backend (rebuild with \
             `cargo build --release --features cuda`)"
        )))
    }

    /// Whether this is the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// Whether `op` runs on this device.
    pub fn supports(&self, op: Op) -> bool {
        match self {
            Device::Cpu => {
                let _ = op;
                true
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => super::cuda::supports(op),
        }
    }

    /// [`Error::Device`] naming `what` unless every op of `ops` runs here.
    pub fn require(&self, ops: &[Op], what: &str) -> Result<()> {
        match ops.iter().find(|&&op| !self.supports(op)) {
            None => Ok(()),
            Some(op) => Err(Error::Device(format!(
                "{what} needs {op:?}, which is not implemented on {self} yet (run it with \
                 --device cpu)"
            ))),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => write!(f, "cuda:{}", d.ordinal()),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "Cpu"),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => write!(f, "Cuda({}, {})", d.ordinal(), d.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses_clearly() {
        assert!(Device::open("cpu").unwrap().is_cpu());
        assert!(Device::open(" CPU ").unwrap().is_cpu());
        let e = Device::open("tpu").unwrap_err().to_string();
        assert!(e.contains("unknown device `tpu`"), "{e}");
        let e = Device::open("cuda:x").unwrap_err().to_string();
        assert!(e.contains("non-negative integer"), "{e}");
        // Without the feature, or on a machine without a driver or GPU, `cuda` is an error
        // that says which (never a panic).
        if let Err(e) = Device::open("cuda:7") {
            let e = e.to_string();
            assert!(e.contains("cuda"), "{e}");
        }
    }
}
