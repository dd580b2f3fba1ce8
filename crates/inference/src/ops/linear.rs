//! `Linear`: `y = x · Wᵀ + b` with `W` in the `nn.Linear` layout `[out_dim, in_dim]`.
//!
//! f32 weights are repacked once at load into the panel layout the GEMM kernel streams
//! ([`cpu::PackedWeights`]), so no call pays for a transpose; bias, exact GELU and residual adds
//! are fused into the kernel's epilogue while each output tile is still in cache. Quantized
//! weights ([`QuantMatrix`], from GGUF) multiply with their blocks directly; a layer may stack
//! several of them along the output dimension (e.g. Q, K and V of different block types).
//! bf16 weights ([`Bf16Weights`], opt-in) multiply with bf16-rounded activations and f32 sums;
//! weights that are exactly bf16 (bf16 checkpoints, by default) stay in 16 bits in the f32
//! panel layout and are widened as the microkernel loads them ([`cpu::PackedBf16`]): the f32
//! path's results bit for bit at half the bytes.
//! Ternary weights ([`cpu::TernaryMatrix`], BitNet b1.58) multiply int8 activations quantized
//! per row as transformers' `BitLinear` does (absmax to ±127), with exact integer sums scaled
//! back by the row's and the matrix's scales. int8 weights ([`cpu::Int8Matrix`], the
//! encoders' `--q8`) are quantized per output row and multiply input rows quantized the same
//! way, exact integer sums scaled by both rows' steps.
//! On a GPU the weight is a device matrix (f32 or bf16, row-major; bf16 multiplies the f32
//! activations, see backend/cuda) multiplied by the device's kernels or cuBLAS; the tensor
//! methods ([`Linear::apply`] and friends) run wherever the input lives.

use crate::backend::cpu::bf16::{gemm_bt_bf16, Bf16Weights};
use crate::backend::cpu::{self, PackedWeights, QuantMatrix};
use crate::backend::{Device, Mirror};
use crate::io::store::{Scope, Weight};
use crate::lora::LoraPlan;
use crate::ops::RmsNorm;
use crate::quant::hadamard::Rotation;
use crate::quant::ternary::TernaryScale;
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};
use std::sync::Arc;

/// How a layer's weight is held.
#[derive(Debug)]
enum LinearWeight {
    /// f32, repacked for the SGEMM kernel.
    Packed(PackedWeights),
    /// Quantized blocks, stacked along the output dimension.
    Quant(Vec<QuantMatrix>),
    /// bf16, packed in k-pairs for the bf16 dot-product kernel.
    Bf16(Bf16Weights),
    /// Exactly-bf16 values kept in 16 bits in the f32 panel layout, widened as they load.
    Widened(cpu::PackedBf16),
    /// Ternary (BitNet) matrices stacked along the output dimension, each with its scale;
    /// the input rows are quantized to int8 per row first (see [`Linear::from_ternary`]).
    Ternary(Vec<(cpu::TernaryMatrix, TernaryScale)>),
    /// int8 values with each output row's step (value · step ≈ weight); the input rows are
    /// quantized to int8 per row first (see [`Linear::from_int8`]).
    Int8(cpu::Int8Matrix, Vec<f32>),
    /// On a GPU (f32 or bf16, row-major).
    #[cfg(feature = "cuda")]
    Cuda(crate::backend::cuda::MatrixData),
}

/// A dense layer.
#[derive(Debug)]
pub struct Linear {
    weight: LinearWeight,   // [out_dim, in_dim]
    bias: Option<Vec<f32>>, // f32 [out_dim]
    in_dim: usize,
    out_dim: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    bias_dev: Mirror,
    /// The LoRA plan and site this layer's unmerged adapters attach at: each row adds the
    /// deltas of the adapters its request picked (see `crate::lora`).
    lora: Option<(Arc<LoraPlan>, usize)>,
    /// An orthogonal rotation applied to every input row before the product (QuaRot's online
    /// Hadamard: the weights were rotated by it offline, see `crate::quantize`). CPU only.
    input_rotation: Option<Arc<Rotation>>,
    /// The probe and site that see this layer's input rows (calibration). CPU only.
    probe: Option<(Arc<dyn InputProbe>, usize)>,
}

/// Sees the input rows of the layers it is attached to, e.g. to collect GPTQ's Hessians
/// (`crate::quant::gptq`) over calibration text. Attached at load through
/// `Placement::probe`; layers without one pay nothing.
pub trait InputProbe: Send + Sync + std::fmt::Debug {
    /// Registers a layer whose weights are the tensors `names` (stacked along the output,
    /// all reading the same input) with inputs of `in_dim` features; returns its site.
    fn add_site(&self, names: Vec<String>, in_dim: usize) -> usize;
    /// `rows` input rows `x` [rows, in_dim] of `site`, as the product sees them (after any
    /// input rotation).
    fn observe(&self, site: usize, x: &[f32], rows: usize);
}

impl Linear {
    /// A CPU layer around `weight` (no adapters, no input rotation).
    fn with_weight(
        weight: LinearWeight,
        bias: Option<Vec<f32>>,
        in_dim: usize,
        out_dim: usize,
    ) -> Self {
        Self {
            weight,
            bias,
            in_dim,
            out_dim,
            bias_dev: Mirror::new(),
            lora: None,
            input_rotation: None,
            probe: None,
        }
    }

    /// Loads `weight` (and `bias` when `with_bias`) under `scope`.
    pub fn load(scope: &Scope, in_dim: usize, out_dim: usize, with_bias: bool) -> Result<Self> {
        Self::load_fused(std::slice::from_ref(scope), in_dim, &[out_dim], with_bias)
    }

    /// Loads several layers with the same input and stacks them along the output dimension
    /// (e.g. the Q, K and V projections as one product of width `sum(out_dims)`).
    pub fn load_fused(
        scopes: &[Scope],
        in_dim: usize,
        out_dims: &[usize],
        with_bias: bool,
    ) -> Result<Self> {
        let out_dim: usize = out_dims.iter().sum();
        let mut weights: Vec<Weight> = Vec::with_capacity(scopes.len());
        let mut bias = with_bias.then(|| Vec::with_capacity(out_dim));
        for (scope, &n) in scopes.iter().zip(out_dims) {
            weights.push(scope.get("weight", &[n, in_dim])?);
            if let Some(b) = bias.as_mut() {
                b.extend_from_slice(scope.get("bias", &[n])?.as_slice());
            }
        }
        let weight = if let [single] = weights.as_slice() {
            cpu::pack_weights(out_dim, in_dim, single.as_slice(), in_dim)
        } else {
            let stacked: Vec<f32> = weights.iter().flat_map(|w| w.as_slice()).copied().collect();
            cpu::pack_weights(out_dim, in_dim, &stacked, in_dim)
        };
        Ok(Self::with_weight(
            LinearWeight::Packed(weight),
            bias,
            in_dim,
            out_dim,
        ))
    }

    /// [`Linear::load_fused`] with the weights placed on `device` (f32).
    pub fn load_fused_on(
        device: &Device,
        scopes: &[Scope],
        in_dim: usize,
        out_dims: &[usize],
        with_bias: bool,
    ) -> Result<Self> {
        if device.is_cpu() {
            return Self::load_fused(scopes, in_dim, out_dims, with_bias);
        }
        let out_dim: usize = out_dims.iter().sum();
        let mut w = Vec::with_capacity(out_dim * in_dim);
        let mut bias = with_bias.then(|| Vec::with_capacity(out_dim));
        for (scope, &n) in scopes.iter().zip(out_dims) {
            w.extend_from_slice(scope.get("weight", &[n, in_dim])?.as_slice());
            if let Some(b) = bias.as_mut() {
                b.extend_from_slice(scope.get("bias", &[n])?.as_slice());
            }
        }
        Self::from_f32_on(device, &w, out_dim, in_dim, bias)
    }

    /// A layer from f32 weights `w` [out_dim, in_dim] (row-major) and an optional bias.
    pub fn from_f32(
        w: &[f32],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_parts(w.len(), out_dim * in_dim, bias.as_deref(), out_dim)?;
        Ok(Self::with_weight(
            LinearWeight::Packed(cpu::pack_weights(out_dim, in_dim, w, in_dim)),
            bias,
            in_dim,
            out_dim,
        ))
    }

    /// [`Linear::from_f32`], kept in 16 bits when every value of `w` is exactly a bf16 value
    /// (a bf16 checkpoint): bit-identical products at half the bytes.
    pub fn from_f32_compact(
        w: &[f32],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_parts(w.len(), out_dim * in_dim, bias.as_deref(), out_dim)?;
        match cpu::pack_weights_bf16(out_dim, in_dim, cpu::Bf16Rows::F32(w, in_dim)) {
            Some(b) => Ok(Self::with_weight(
                LinearWeight::Widened(b),
                bias,
                in_dim,
                out_dim,
            )),
            None => Self::from_f32(w, out_dim, in_dim, bias),
        }
    }

    /// [`Linear::from_f32_compact`] of a bf16 checkpoint's matrix as stored (`bits`
    /// [out_dim, in_dim]): the same layer, packed straight from the 16-bit values.
    pub fn from_bf16_bits(
        bits: &[u16],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_parts(bits.len(), out_dim * in_dim, bias.as_deref(), out_dim)?;
        let packed = cpu::pack_weights_bf16(out_dim, in_dim, cpu::Bf16Rows::Bits(bits, in_dim))
            .expect("bf16 bits always pack");
        Ok(Self::with_weight(
            LinearWeight::Widened(packed),
            bias,
            in_dim,
            out_dim,
        ))
    }

    /// A layer from f32 weights `w` [out_dim, in_dim] rounded to bf16 (exact for values that
    /// came from a bf16 checkpoint). Where the CPU has bf16 dot-product instructions
    /// (AVX512-BF16) products round the activations to bf16 and sum in f32; elsewhere the
    /// rounded weights multiply the f32 activations in the f32 kernels (as on a GPU): the bf16
    /// products would be emulated there, several times slower than f32, and no more exact.
    pub fn from_bf16(
        w: &[f32],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_parts(w.len(), out_dim * in_dim, bias.as_deref(), out_dim)?;
        if !cpu::bf16::native_supported() {
            let rounded: Vec<f32> = w
                .iter()
                .map(|&v| cpu::bf16::bf16_to_f32(cpu::bf16::round_to_bf16(v)))
                .collect();
            return Self::from_f32_compact(&rounded, out_dim, in_dim, bias);
        }
        Ok(Self::with_weight(
            LinearWeight::Bf16(Bf16Weights::from_f32(out_dim, in_dim, w)?),
            bias,
            in_dim,
            out_dim,
        ))
    }

    /// [`Linear::from_f32`] with the weights placed on `device` (f32).
    pub fn from_f32_on(
        device: &Device,
        w: &[f32],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        match device {
            Device::Cpu => Self::from_f32(w, out_dim, in_dim, bias),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Self::on_gpu(d, w, out_dim, in_dim, bias, false),
        }
    }

    /// [`Linear::from_bf16`] with the weights placed on `device` (bf16).
    pub fn from_bf16_on(
        device: &Device,
        w: &[f32],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        match device {
            Device::Cpu => Self::from_bf16(w, out_dim, in_dim, bias),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Self::on_gpu(d, w, out_dim, in_dim, bias, true),
        }
    }

    /// A layer whose weights `w` [out_dim, in_dim] are uploaded to `d`, as f32 or (with `bf16`)
    /// rounded to bf16.
    #[cfg(feature = "cuda")]
    fn on_gpu(
        d: &crate::backend::cuda::CudaDevice,
        w: &[f32],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
        bf16: bool,
    ) -> Result<Self> {
        use crate::backend::cuda::MatrixData;
        check_parts(w.len(), out_dim * in_dim, bias.as_deref(), out_dim)?;
        let m = if bf16 {
            let bits: Vec<u16> = w
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect();
            MatrixData::Bf16(d.upload(&bits)?)
        } else {
            MatrixData::F32(d.upload(w)?)
        };
        Ok(Self::on_device(m, out_dim, in_dim, bias))
    }

    /// A layer over the device matrix `m` [out_dim, in_dim].
    #[cfg(feature = "cuda")]
    fn on_device(
        m: crate::backend::cuda::MatrixData,
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Self {
        Self::with_weight(LinearWeight::Cuda(m), bias, in_dim, out_dim)
    }

    /// A layer from quantized matrices with the same input width, stacked along the output
    /// dimension in order, and an optional bias over the stacked outputs.
    pub fn from_quant(parts: Vec<QuantMatrix>, bias: Option<Vec<f32>>) -> Result<Self> {
        let in_dim = parts.first().map_or(0, QuantMatrix::k);
        if parts.is_empty() || parts.iter().any(|p| p.k() != in_dim) {
            return Err(Error::Shape {
                op: "Linear::from_quant",
                reason: "needs at least one matrix, all with the same input width".into(),
            });
        }
        let out_dim = parts.iter().map(QuantMatrix::n_rows).sum();
        check_parts(out_dim * in_dim, out_dim * in_dim, bias.as_deref(), out_dim)?;
        Ok(Self::with_weight(
            LinearWeight::Quant(parts),
            bias,
            in_dim,
            out_dim,
        ))
    }

    /// A BitNet layer from ternary matrices with the same input width, stacked along the output
    /// dimension in order, each with its scale. Every input row `x` is quantized to int8 as
    /// transformers' `BitLinear.activation_quant` does (`s = 127 / max(max|x|, 1e-5)`,
    /// `q = round_half_even(x · s)` clamped to ±127..−128); the exact integer products `Σ q·w`
    /// become outputs as the part's [`TernaryScale`] says. CPU only.
    pub fn from_ternary(
        parts: Vec<(cpu::TernaryMatrix, TernaryScale)>,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        let in_dim = parts.first().map_or(0, |(m, _)| m.k());
        if parts.is_empty() || parts.iter().any(|(m, _)| m.k() != in_dim) {
            return Err(Error::Shape {
                op: "Linear::from_ternary",
                reason: "needs at least one matrix, all with the same input width".into(),
            });
        }
        let out_dim = parts.iter().map(|(m, _)| m.n_rows()).sum();
        check_parts(out_dim * in_dim, out_dim * in_dim, bias.as_deref(), out_dim)?;
        Ok(Self::with_weight(
            LinearWeight::Ternary(parts),
            bias,
            in_dim,
            out_dim,
        ))
    }

    /// A layer over the f32 rows `w` [out_dim, in_dim] quantized to int8 per output row
    /// ([`cpu::Int8Matrix::quantize_rows`]); every input row is quantized the same way (its
    /// largest magnitude to ±127) before the product, and the exact integer sums are scaled by
    /// both rows' steps. CPU only. Fails on a weight that is not finite, naming `what`.
    pub fn from_int8(
        w: &[f32],
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
        what: &str,
    ) -> Result<Self> {
        check_parts(w.len(), out_dim * in_dim, bias.as_deref(), out_dim)?;
        let (q, steps) = cpu::Int8Matrix::quantize_rows(w, out_dim, in_dim)
            .map_err(|e| Error::InvalidInput(format!("{what}: {e}")))?;
        Ok(Self::with_weight(
            LinearWeight::Int8(q, steps),
            bias,
            in_dim,
            out_dim,
        ))
    }

    /// [`Linear::from_quant`] with the matrices placed on `device`: on a GPU, float tensors
    /// (F32, F16 as f32; BF16 as bf16) or quantized blocks of any supported type (parts of
    /// different block types side by side); a mix of float and quantized parts is refused.
    pub fn from_quant_on(
        device: &Device,
        parts: Vec<QuantMatrix>,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        match device {
            Device::Cpu => Self::from_quant(parts, bias),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                use crate::quant::QuantType;
                let in_dim = parts.first().map_or(0, QuantMatrix::k);
                let out_dim: usize = parts.iter().map(QuantMatrix::n_rows).sum();
                let floats = |t| matches!(t, QuantType::F32 | QuantType::F16 | QuantType::BF16);
                if parts.iter().all(|p| floats(p.qtype()) && p.k() == in_dim) {
                    // Float GGUF tensors: bf16 ones stay bf16 (exact), the others f32.
                    let w: Vec<f32> = parts.iter().flat_map(QuantMatrix::dequantize).collect();
                    let bf16 = parts.iter().all(|p| p.qtype() == QuantType::BF16);
                    return Self::on_gpu(d, &w, out_dim, in_dim, bias, bf16);
                }
                if parts.iter().any(|p| p.k() != in_dim || floats(p.qtype())) {
                    let types: Vec<&str> = parts.iter().map(|p| p.qtype().name()).collect();
                    return Err(Error::Device(format!(
                        "a matrix fused from tensors of types [{}] and widths {:?} cannot be \
                         placed on {device}: its parts must be all float or all quantized, of \
                         one width",
                        types.join(", "),
                        parts.iter().map(QuantMatrix::k).collect::<Vec<_>>()
                    )));
                }
                check_parts(out_dim * in_dim, out_dim * in_dim, bias.as_deref(), out_dim)?;
                let gguf = |p: &QuantMatrix| {
                    p.to_gguf().ok_or_else(|| {
                        Error::Device(format!(
                            "a {} matrix has no GGUF blocks to place on {device}",
                            p.qtype().name()
                        ))
                    })
                };
                let m = if parts.iter().all(|p| p.qtype() == QuantType::Q8_0) {
                    let mut bytes = Vec::new();
                    for p in &parts {
                        bytes.extend_from_slice(&gguf(p)?);
                    }
                    crate::backend::cuda::q8_matrix(d, &bytes, out_dim, in_dim)?
                } else {
                    let mut runs = Vec::with_capacity(parts.len());
                    for p in &parts {
                        let b = gguf(p)?;
                        runs.push(crate::backend::cuda::BlockRows::new(
                            d,
                            p.qtype(),
                            &b,
                            p.n_rows(),
                            in_dim,
                        )?);
                    }
                    crate::backend::cuda::MatrixData::Blocks(runs)
                };
                Ok(Self::on_device(m, out_dim, in_dim, bias))
            }
        }
    }

    /// This layer with unmerged LoRA adapters attached at `site` of `plan`: after the product
    /// each row adds `s · B (A x)` for the adapters it runs with (on a GPU too).
    pub fn with_lora(mut self, plan: Arc<LoraPlan>, site: usize) -> Self {
        self.lora = Some((plan, site));
        self
    }

    /// Bytes of weight data one product reads (f32, or the quantized blocks as stored in GGUF).
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            LinearWeight::Packed(_) => self.in_dim * self.out_dim * 4,
            LinearWeight::Bf16(_) | LinearWeight::Widened(_) => self.in_dim * self.out_dim * 2,
            LinearWeight::Quant(parts) => parts.iter().map(QuantMatrix::gguf_bytes).sum(),
            LinearWeight::Ternary(parts) => parts.iter().map(|(m, _)| m.packed_bytes()).sum(),
            LinearWeight::Int8(q, _) => q.packed_bytes(),
            #[cfg(feature = "cuda")]
            LinearWeight::Cuda(crate::backend::cuda::MatrixData::F32(_)) => {
                self.in_dim * self.out_dim * 4
            }
            #[cfg(feature = "cuda")]
            LinearWeight::Cuda(crate::backend::cuda::MatrixData::Bf16(_)) => {
                self.in_dim * self.out_dim * 2
            }
            #[cfg(feature = "cuda")]
            LinearWeight::Cuda(crate::backend::cuda::MatrixData::Q8 { .. }) => {
                self.in_dim * self.out_dim / 32 * 34
            }
            #[cfg(feature = "cuda")]
            LinearWeight::Cuda(crate::backend::cuda::MatrixData::Blocks(runs)) => runs
                .iter()
                .map(|r| r.rows() * r.qtype().row_bytes(self.in_dim).unwrap_or(0))
                .sum(),
        }
    }

    /// Input features.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    fn rows(&self, x: &[f32]) -> usize {
        debug_assert_eq!(x.len() % self.in_dim, 0);
        x.len() / self.in_dim
    }

    /// This layer with `rotation` (order `in_dim`) applied to its input rows first: for weights
    /// stored as `W · R`, the product of the unrotated input with `W`. CPU only.
    pub fn with_input_rotation(mut self, rotation: Arc<Rotation>) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if matches!(&self.weight, LinearWeight::Cuda(_)) {
            return Err(Error::Device(
                "an input rotation (QuaRot's online Hadamard) runs on the CPU only".into(),
            ));
        }
        if rotation.n() != self.in_dim {
            return Err(Error::Shape {
                op: "Linear::with_input_rotation",
                reason: format!(
                    "a rotation of order {} on a layer of input width {}",
                    rotation.n(),
                    self.in_dim
                ),
            });
        }
        self.input_rotation = Some(rotation);
        Ok(self)
    }

    /// This layer with its input rows shown to `probe` at `site` before every product. CPU
    /// only.
    pub fn with_probe(mut self, probe: Arc<dyn InputProbe>, site: usize) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if matches!(&self.weight, LinearWeight::Cuda(_)) {
            return Err(Error::Device(
                "input probes (calibration) run on the CPU only".into(),
            ));
        }
        self.probe = Some((probe, site));
        Ok(self)
    }

    fn run(&self, x: &[f32], y: &mut [f32], accumulate: bool, gelu: bool) {
        let rotated;
        let x = match &self.input_rotation {
            Some(r) => {
                rotated = {
                    let mut v = x.to_vec();
                    r.rotate_rows(&mut v);
                    v
                };
                &rotated[..]
            }
            None => x,
        };
        if let Some((probe, site)) = &self.probe {
            probe.observe(*site, x, self.rows(x));
        }
        let Some((plan, site)) = &self.lora else {
            return self.run_base(x, y, accumulate, gelu);
        };
        // y = base + Σ s · B (A x) per row, then the activation.
        let m = self.rows(x);
        let added = crate::lora::with_terms(plan, *site, m, |rows| {
            self.run_base(x, y, accumulate, false);
            cpu::add_low_rank(x, self.in_dim, y, self.out_dim, rows);
        });
        if added.is_none() {
            self.run_base(x, y, accumulate, gelu);
        } else if gelu {
            cpu::gelu_erf(y);
        }
    }

    fn run_base(&self, x: &[f32], y: &mut [f32], accumulate: bool, gelu: bool) {
        let m = self.rows(x);
        debug_assert_eq!(y.len(), m * self.out_dim);
        if m == 0 {
            return;
        }
        match &self.weight {
            LinearWeight::Packed(w) => cpu::gemm_bt_packed(
                m,
                x,
                self.in_dim,
                w,
                y,
                self.out_dim,
                accumulate,
                self.bias.as_deref(),
                gelu,
            ),
            LinearWeight::Widened(w) => cpu::gemm_bt_packed_bf16(
                m,
                x,
                self.in_dim,
                w,
                y,
                self.out_dim,
                accumulate,
                self.bias.as_deref(),
                gelu,
            ),
            LinearWeight::Quant(parts) => {
                // Each part writes (or adds) its columns of `y` in place.
                let mut col = 0;
                for p in parts {
                    p.matmul_strided(x, m, &mut y[col..], self.out_dim, accumulate);
                    col += p.n_rows();
                }
                self.epilogue(y, gelu);
            }
            LinearWeight::Ternary(parts) => {
                self.run_ternary(parts, x, m, y, accumulate);
                self.epilogue(y, gelu);
            }
            LinearWeight::Int8(q, steps) => self.run_int8(q, steps, x, m, y, accumulate, gelu),
            LinearWeight::Bf16(w) => gemm_bt_bf16(
                m,
                self.out_dim,
                self.in_dim,
                x,
                w,
                y,
                self.out_dim,
                accumulate,
                self.bias.as_deref(),
                gelu,
            )
            .expect("Linear: shapes checked at construction"),
            #[cfg(feature = "cuda")]
            LinearWeight::Cuda(_) => unreachable!("device weights take the tensor path"),
        }
    }

    /// The ternary product: `y[r, o] (+)= Σ_c q[r, c] · w[o, c]` scaled by row `r`'s
    /// activation scale and the part's scale, in transformers' order of operations.
    fn run_ternary(
        &self,
        parts: &[(cpu::TernaryMatrix, TernaryScale)],
        x: &[f32],
        m: usize,
        y: &mut [f32],
        accumulate: bool,
    ) {
        let (k, n_out) = (self.in_dim, self.out_dim);
        with_i8_scratch(m * k, m * n_out, |q, sums| {
            let x_scales = cpu::ternary::quantize_rows_absmax(x, m, k, q);
            let mut col = 0;
            for (w, _) in parts {
                let end = (m - 1) * n_out + col + w.n_rows();
                w.matmul_i8(q, m, &mut sums[col..end], n_out);
                col += w.n_rows();
            }
            for ((out, row), &xs) in y
                .chunks_exact_mut(n_out)
                .zip(sums.chunks_exact(n_out))
                .zip(&x_scales)
            {
                let mut col = 0;
                for (w, scale) in parts {
                    let span = col..col + w.n_rows();
                    for (o, &s) in out[span.clone()].iter_mut().zip(&row[span]) {
                        let v = match *scale {
                            TernaryScale::Divide(ws) => s as f32 / (ws * xs),
                            TernaryScale::Multiply(ws) => s as f32 / xs * ws,
                        };
                        *o = if accumulate { *o + v } else { v };
                    }
                    col += w.n_rows();
                }
            }
        });
    }

    /// The int8 product: `y[r, o] (+)= Σ_c q[r, c] · w[o, c] · step_x[r] · step_w[o] + b[o]`,
    /// then the GELU if asked (both fused into the product's tiles).
    #[allow(clippy::too_many_arguments)] // the product's operands and its epilogue flags
    fn run_int8(
        &self,
        w: &cpu::Int8Matrix,
        w_steps: &[f32],
        x: &[f32],
        m: usize,
        y: &mut [f32],
        accumulate: bool,
        gelu: bool,
    ) {
        with_i8_scratch(m * self.in_dim, 0, |q, _| {
            let scales = cpu::ternary::quantize_rows_absmax(x, m, self.in_dim, q);
            let x_steps: Vec<f32> = scales.iter().map(|s| s.recip()).collect();
            let deq = cpu::Dequant {
                x_steps: &x_steps,
                w_steps,
                bias: self.bias.as_deref(),
                accumulate,
                gelu,
            };
            w.matmul_dequant(q, m, &deq, y, self.out_dim);
        });
    }

    /// Bias and GELU after a product that does not fuse them. Those products (quantized
    /// blocks, ternary, bf16 activations) change numbers far more than the rational GELU's
    /// `2.5e-7 · |x|`, so they take it ([`cpu::gelu_rational`]); the exact f32 paths fuse the
    /// exact GELU into their tiles.
    fn epilogue(&self, y: &mut [f32], gelu: bool) {
        if let Some(b) = self.bias.as_deref() {
            cpu::add_bias(y, b);
        }
        if gelu {
            cpu::gelu_rational(y);
        }
    }

    /// `x` f32 [n, in_dim] → f32 [n, out_dim].
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0f32; self.rows(x) * self.out_dim];
        self.run(x, &mut y, false, false);
        y
    }

    /// `gelu(x · Wᵀ + b)` with the exact (erf) GELU fused into the product.
    pub fn forward_gelu(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0f32; self.rows(x) * self.out_dim];
        self.run(x, &mut y, false, true);
        y
    }

    /// `residual + x · Wᵀ + b` (a residual connection fused into the product); `residual` has
    /// the output's shape f32 [n, out_dim].
    pub fn forward_residual(&self, x: &[f32], residual: &[f32]) -> Vec<f32> {
        let mut y = residual.to_vec();
        self.run(x, &mut y, true, false);
        y
    }
}

impl Linear {
    /// `x` [n, in_dim] → [n, out_dim], on the device `x` lives on (the weights' device).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        self.apply_with(x, None, false)
    }

    /// [`Linear::forward_gelu`] on a tensor.
    pub fn apply_gelu(&self, x: &Tensor) -> Result<Tensor> {
        self.apply_with(x, None, true)
    }

    /// [`Linear::forward_residual`] on tensors: `residual + x · Wᵀ + b`, reusing the
    /// residual's memory for the output.
    pub fn apply_residual(&self, x: &Tensor, residual: Tensor) -> Result<Tensor> {
        self.apply_with(x, Some(residual), false)
    }

    /// `norm(x) · Wᵀ + b`: the RMSNorm of the input rows fused into the product where the
    /// device can (a GPU's matrix-vector kernel or the bf16 split of cuBLAS's input), else the
    /// two ops.
    pub fn apply_normed(&self, x: &Tensor, norm: &RmsNorm) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Storage::Cuda(s) = x.storage() {
            let input =
                crate::backend::cuda::GemvInput::Normed(norm.cuda_weight(&s.dev)?, norm.eps());
            if let Some(y) = self.fused_product(x, self.in_dim, &mut None, input)? {
                return Ok(y);
            }
        }
        self.apply(&norm.norm(x)?)
    }

    /// `residual + swiglu(gate_up) · Wᵀ + b` with `gate_up` [n, 2 * in_dim] (gate and up side
    /// by side): SwiGLU fused into the product where the device can, else the two ops.
    pub fn apply_swiglu_residual(&self, gate_up: &Tensor, residual: Tensor) -> Result<Tensor> {
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut residual = Some(residual);
        #[cfg(feature = "cuda")]
        if let Some(y) = self.fused_product(
            gate_up,
            2 * self.in_dim,
            &mut residual,
            crate::backend::cuda::GemvInput::Swiglu,
        )? {
            return Ok(y);
        }
        let residual = residual.expect("the residual is taken only when the product is fused");
        self.apply_residual(&crate::ops::swiglu(gate_up)?, residual)
    }

    /// The product on a GPU with `input` applied to the rows of `x` (`cols` values each)
    /// inside its kernels (`CudaDevice::matmul_in`), adding to `residual` (taken) when given;
    /// `None` when `x` or the weights are not on a GPU or the device does not fuse that shape.
    #[cfg(feature = "cuda")]
    fn fused_product(
        &self,
        x: &Tensor,
        cols: usize,
        residual: &mut Option<Tensor>,
        input: crate::backend::cuda::GemvInput<'_>,
    ) -> Result<Option<Tensor>> {
        let (Storage::Cuda(s), LinearWeight::Cuda(w)) = (x.storage(), &self.weight) else {
            return Ok(None);
        };
        let m = x.rows();
        let residual_ok = residual.as_ref().is_none_or(|r| {
            (r.rows(), r.cols()) == (m, self.out_dim) && matches!(r.storage(), Storage::Cuda(_))
        });
        if x.cols() != cols || !s.dev.fuses(m, self.out_dim, self.in_dim, w) || !residual_ok {
            return Ok(None);
        }
        let (mut y, accumulate) = match residual.take().map(Tensor::into_storage) {
            Some(Storage::Cuda(r)) => (r.buf, true),
            _ => (s.dev.alloc_buf(m * self.out_dim)?, false),
        };
        s.dev.matmul_in(
            &s.buf,
            m,
            w,
            self.out_dim,
            self.in_dim,
            &mut y,
            accumulate,
            input,
        )?;
        if let Some(b) = self.bias.as_deref() {
            let b = self.bias_dev.cuda(&s.dev, b)?;
            s.dev.add_bias(&mut y, b, m, self.out_dim)?;
        }
        self.add_lora_cuda(&s.dev, &s.buf, input, m, &mut y)?;
        Ok(Some(Tensor::cuda(&s.dev, m, self.out_dim, y)))
    }

    /// The LoRA updates of the `m` rows of this layer's product `y` on a GPU (none without
    /// adapters), reading the product's input `x` with `input` applied.
    #[cfg(feature = "cuda")]
    fn add_lora_cuda(
        &self,
        dev: &std::sync::Arc<crate::backend::cuda::CudaDevice>,
        x: &crate::backend::cuda::Buf,
        input: crate::backend::cuda::GemvInput<'_>,
        m: usize,
        y: &mut crate::backend::cuda::Buf,
    ) -> Result<()> {
        let Some((plan, site)) = &self.lora else {
            return Ok(());
        };
        crate::lora::with_terms(plan, *site, m, |rows| {
            let rows = rows
                .iter()
                .map(|r| r.iter().map(|t| t.cuda(dev)).collect())
                .collect::<Result<Vec<Vec<_>>>>()?;
            let key = (plan.id(), *site);
            plan.uses_device(dev);
            dev.add_low_rank(x, self.in_dim, input, y, self.out_dim, &rows, key)
        })
        .transpose()
        .map(|_| ())
    }

    fn apply_with(&self, x: &Tensor, residual: Option<Tensor>, gelu: bool) -> Result<Tensor> {
        let m = x.rows();
        if x.cols() != self.in_dim
            || residual
                .as_ref()
                .is_some_and(|r| (r.rows(), r.cols()) != (m, self.out_dim))
        {
            return Err(Error::Shape {
                op: "Linear",
                reason: format!(
                    "input [{m}, {}] (want rows of {}), residual {:?} (want [{m}, {}])",
                    x.cols(),
                    self.in_dim,
                    residual.as_ref().map(|r| (r.rows(), r.cols())),
                    self.out_dim
                ),
            });
        }
        match (x.storage(), &self.weight) {
            #[cfg(feature = "cuda")]
            (Storage::Cuda(s), LinearWeight::Cuda(w)) => {
                let accumulate = residual.is_some();
                let mut y = match residual.map(|r| (r.device(), r.into_storage())) {
                    Some((_, Storage::Cuda(r))) => r.buf,
                    Some((d, _)) => {
                        return Err(Error::Device(format!(
                            "Linear: residual on {d}, input on {}",
                            x.device()
                        )))
                    }
                    None => s.dev.alloc_buf(m * self.out_dim)?,
                };
                s.dev
                    .matmul(&s.buf, m, w, self.out_dim, self.in_dim, &mut y, accumulate)?;
                if let Some(b) = self.bias.as_deref() {
                    let b = self.bias_dev.cuda(&s.dev, b)?;
                    s.dev.add_bias(&mut y, b, m, self.out_dim)?;
                }
                let plain = crate::backend::cuda::GemvInput::Plain;
                self.add_lora_cuda(&s.dev, &s.buf, plain, m, &mut y)?;
                if gelu {
                    s.dev.gelu(&mut y, m * self.out_dim)?;
                }
                Ok(Tensor::cuda(&s.dev, m, self.out_dim, y))
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(_), _) | (_, LinearWeight::Cuda(_)) => Err(Error::Device(format!(
                "Linear: input on {}, weights elsewhere",
                x.device()
            ))),
            (Storage::Cpu(v), _) => {
                let (mut y, accumulate) = match residual {
                    Some(r) => (r.into_host()?, true),
                    // (Every product path overwrites the whole output when not accumulating.)
                    None => (crate::tensor::host_scratch(m * self.out_dim), false),
                };
                self.run(v, &mut y, accumulate, gelu);
                Ok(Tensor::cpu(m, self.out_dim, y))
            }
        }
    }
}

thread_local! {
    /// Per-thread buffers of the ternary and int8 products (int8 activations, i32 sums), kept
    /// between calls so a prompt's products do not map and clear fresh pages each time.
    static I8_SCRATCH: std::cell::RefCell<(Vec<i8>, Vec<i32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` with this thread's int8 scratch buffers cut to `q_len` activations and `sums_len`
/// sums (fresh ones when a product on this thread is already using them, e.g. a task the pool
/// ran while the first one waited). Their contents are stale: `f` writes before it reads.
fn with_i8_scratch<R>(
    q_len: usize,
    sums_len: usize,
    f: impl FnOnce(&mut [i8], &mut [i32]) -> R,
) -> R {
    let run = |q: &mut Vec<i8>, sums: &mut Vec<i32>| {
        // Grown, never shrunk: products of different widths alternate.
        if q.len() < q_len {
            q.resize(q_len, 0);
        }
        if sums.len() < sums_len {
            sums.resize(sums_len, 0);
        }
        f(&mut q[..q_len], &mut sums[..sums_len])
    };
    I8_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => {
            let (q, sums) = &mut *s;
            run(q, sums)
        }
        Err(_) => run(&mut Vec::new(), &mut Vec::new()),
    })
}

fn check_parts(w_len: usize, want: usize, bias: Option<&[f32]>, out_dim: usize) -> Result<()> {
    if w_len != want || bias.is_some_and(|b| b.len() != out_dim) {
        return Err(Error::Shape {
            op: "Linear",
            reason: format!(
                "weight has {w_len} values (want {want}), bias {:?} (want {out_dim})",
                bias.map(<[f32]>::len)
            ),
        });
    }
    Ok(())
}
