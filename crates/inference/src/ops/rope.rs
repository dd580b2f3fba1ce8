//! Rotary position embeddings (RoPE) in the "rotate half" layout transformers uses: the first
//! `rotary_dim / 2` features of a head pair with the next `rotary_dim / 2`, features past
//! `rotary_dim` (partial rotary) pass through.
//!
//! The inverse frequencies follow transformers' `modeling_rope_utils` for the scaling types
//! decoders ship with (default, linear, llama3, yarn), computed in f32 in the same order, so
//! positions far into the context rotate by the same angles as the reference.

use crate::backend::Mirror;
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};

/// How the base frequencies are rescaled for longer contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Every frequency divided by `factor` (position interpolation).
    Linear {
        /// Interpolation factor.
        factor: f32,
    },
    /// Llama 3.1's piecewise scaling of low and medium frequencies.
    Llama3 {
        /// Interpolation factor for the low frequencies.
        factor: f32,
        /// Wavelength boundary (as a fraction of the original context) of the low band.
        low_freq_factor: f32,
        /// Wavelength boundary of the high band.
        high_freq_factor: f32,
        /// Context length the model was pretrained with.
        original_max_position_embeddings: usize,
    },
    /// YaRN: a ramp between interpolated and extrapolated frequencies plus an attention factor.
    Yarn {
        /// Context extension factor.
        factor: f32,
        /// Context length the model was pretrained with.
        original_max_position_embeddings: usize,
        /// Rotations at which extrapolation ends (default 32).
        beta_fast: f32,
        /// Rotations at which interpolation begins (default 1).
        beta_slow: f32,
        /// Scale of cos/sin; derived from `factor` (and `mscale`s) when absent.
        attention_factor: Option<f32>,
        /// Optional numerator scale of the derived attention factor.
        mscale: Option<f32>,
        /// Optional denominator scale of the derived attention factor.
        mscale_all_dim: Option<f32>,
        /// Whether the correction range is rounded to whole dimensions (default true).
        truncate: bool,
    },
}

/// The parameters of a model's rotary embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Base of the frequencies (`rope_theta`).
    pub theta: f32,
    /// Features of each head that rotate (`head_dim * partial_rotary_factor`), even.
    pub rotary_dim: usize,
    /// Frequency scaling.
    pub scaling: RopeScaling,
}

/// Multimodal rotary embeddings (M-RoPE, Qwen2-VL and later): each rotated pair takes its
/// angle from one of three position axes (temporal, height, width).
#[derive(Debug, Clone, PartialEq)]
pub struct Mrope {
    /// Pairs per axis (`mrope_section`, summing to the rotated pairs).
    pub section: [usize; 3],
    /// Qwen3-VL's layout: pair `i` reads height when `i % 3 == 1` and `i < 3 * section[1]`,
    /// width when `i % 3 == 2` and `i < 3 * section[2]`, else time; otherwise the sections
    /// lie back to back (Qwen2-VL).
    pub interleaved: bool,
}

impl Mrope {
    /// The axis (0 time, 1 height, 2 width) of each of `pairs` rotated pairs.
    pub fn axes(&self, pairs: usize) -> Result<Vec<u8>> {
        let [t, h, w] = self.section;
        // Interleaved sections only bound where height and width may appear (transformers
        // slices them to the pairs there are); contiguous ones must cover every pair.
        if !self.interleaved && t + h + w != pairs {
            return Err(Error::InvalidInput(format!(
                "mrope_section {:?} sums to {}, but {pairs} pairs rotate",
                self.section,
                t + h + w
            )));
        }
        Ok((0..pairs)
            .map(|i| {
                if self.interleaved {
                    match i % 3 {
                        1 if i < 3 * h => 1,
                        2 if i < 3 * w => 2,
                        _ => 0,
                    }
                } else if i < t {
                    0
                } else if i < t + h {
                    1
                } else {
                    2
                }
            })
            .collect())
    }
}

/// Precomputed inverse frequencies and the cos/sin scale.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>, // [rotary_dim / 2]
    attention_scaling: f32,
    head_dim: usize,
    /// The position axis of each pair (3-D positions); `None`: 1-D positions only.
    axes: Option<Vec<u8>>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    inv_freq_dev: Mirror,
}

impl Rope {
    /// Builds the frequencies for heads of `head_dim` features.
    pub fn new(cfg: &RopeConfig, head_dim: usize) -> Result<Self> {
        let dim = cfg.rotary_dim;
        if dim == 0 || !dim.is_multiple_of(2) || dim > head_dim {
            return Err(Error::InvalidInput(format!(
                "rotary dimension {dim} must be even, positive and at most head_dim {head_dim}"
            )));
        }
        if !(cfg.theta.is_finite() && cfg.theta > 1.0) {
            return Err(Error::InvalidInput(format!(
                "rope_theta {} must be a finite number above 1",
                cfg.theta
            )));
        }
        // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), all in f32.
        let base = cfg.theta;
        let pos_freqs: Vec<f32> = (0..dim / 2)
            .map(|i| base.powf((2 * i) as f32 / dim as f32))
            .collect();
        let default: Vec<f32> = pos_freqs.iter().map(|p| 1.0 / p).collect();
        let check_factor = |factor: f32| {
            if factor.is_finite() && factor > 0.0 {
                Ok(())
            } else {
                Err(Error::InvalidInput(format!(
                    "rope scaling factor {factor} must be positive"
                )))
            }
        };
        let (inv_freq, attention_scaling) = match &cfg.scaling {
            RopeScaling::None => (default, 1.0),
            RopeScaling::Linear { factor } => {
                check_factor(*factor)?;
                (default.iter().map(|f| f / factor).collect(), 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                check_factor(*factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(Error::InvalidInput(format!(
                        "llama3 rope: high_freq_factor {high_freq_factor} must exceed low_freq_factor {low_freq_factor}"
                    )));
                }
                let old = *original_max_position_embeddings as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let f = default
                    .iter()
                    .map(|&inv| {
                        let wavelen = 2.0 * std::f32::consts::PI / inv;
                        let scaled = if wavelen > low_wavelen {
                            inv / factor
                        } else {
                            inv
                        };
                        // NaN-free here: wavelengths of positive finite frequencies.
                        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                        if medium {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * scaled / factor + smooth * scaled
                        } else {
                            scaled
                        }
                    })
                    .collect();
                (f, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                check_factor(*factor)?;
                let get_mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                let factor64 = *factor as f64;
                let attn = match (attention_factor, mscale, mscale_all_dim) {
                    (Some(a), _, _) => *a,
                    (None, Some(m), Some(ma)) if *m != 0.0 && *ma != 0.0 => {
                        (get_mscale(factor64, *m as f64) / get_mscale(factor64, *ma as f64)) as f32
                    }
                    _ => get_mscale(factor64, 1.0) as f32,
                };
                // Correction range in f64, as transformers computes it with Python floats.
                let base64 = base as f64;
                let max_pos = *original_max_position_embeddings as f64;
                let correction_dim = |rotations: f64| {
                    (dim as f64 * (max_pos / (rotations * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * base64.ln())
                };
                let (mut low, mut high) = (
                    correction_dim(*beta_fast as f64),
                    correction_dim(*beta_slow as f64),
                );
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min((dim - 1) as f64);
                if low == high {
                    high += 0.001;
                }
                let f = pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        // As torch: the tensor in f32, the Python-float bounds (and their
                        // difference) each rounded to f32.
                        let ramp =
                            ((i as f32 - low as f32) / ((high - low) as f32)).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        let extrapolation = 1.0 / p;
                        let interpolation = 1.0 / (factor * p);
                        interpolation * (1.0 - extrapolation_factor)
                            + extrapolation * extrapolation_factor
                    })
                    .collect();
                (f, attn)
            }
        };
        Ok(Self {
            inv_freq,
            attention_scaling,
            head_dim,
            axes: None,
            inv_freq_dev: Mirror::new(),
        })
    }

    /// This rotation over 3-D positions, each pair reading the axis `mrope` gives it.
    pub fn with_mrope(mut self, mrope: &Mrope) -> Result<Self> {
        self.axes = Some(mrope.axes(self.inv_freq.len())?);
        Ok(self)
    }

    /// The 2-D rotation of Qwen-VL vision towers: over the whole head, the first half of the
    /// pairs rotated by the row (height) position, the second half by the column, both with
    /// the frequencies `1 / theta^(2i / (head_dim / 2))` (positions are `[0, row, col]`).
    pub fn vision_2d(theta: f32, head_dim: usize) -> Result<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(4) {
            return Err(Error::InvalidInput(format!(
                "vision head_dim {head_dim} must be a positive multiple of 4"
            )));
        }
        let spatial = head_dim / 2;
        let inv: Vec<f32> = (0..spatial / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / spatial as f32))
            .collect();
        let quarter = inv.len();
        Ok(Self {
            inv_freq: inv.iter().chain(&inv).copied().collect(),
            attention_scaling: 1.0,
            head_dim,
            axes: Some(
                (0..2 * quarter)
                    .map(|i| 1 + u8::from(i >= quarter))
                    .collect(),
            ),
            inv_freq_dev: Mirror::new(),
        })
    }

    /// Whether this rotation reads 3-D positions.
    pub fn is_3d(&self) -> bool {
        self.axes.is_some()
    }

    /// The inverse frequencies on a GPU (for kernels that fuse the rotation).
    #[cfg(feature = "cuda")]
    pub fn cuda_inv_freq(
        &self,
        dev: &crate::backend::cuda::CudaDevice,
    ) -> Result<&crate::backend::cuda::Buf> {
        self.inv_freq_dev.cuda(dev, &self.inv_freq)
    }

    /// Checks that `x` is `rows` rows of `n_heads` heads.
    fn check_rows(&self, op: &'static str, x: &Tensor, n_heads: usize, rows: usize) -> Result<()> {
        if x.rows() != rows || x.cols() != n_heads * self.head_dim {
            return Err(Error::Shape {
                op,
                reason: format!(
                    "[{}, {}] for {rows} positions of {n_heads} heads of {}",
                    x.rows(),
                    x.cols(),
                    self.head_dim
                ),
            });
        }
        Ok(())
    }

    /// Features per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// [`Rope::apply`] on a tensor [positions.len(), n_heads * head_dim], on its device.
    pub fn rotate(&self, x: &mut Tensor, n_heads: usize, positions: &[usize]) -> Result<()> {
        self.check_rows("Rope::rotate", x, n_heads, positions.len())?;
        match x.storage_mut() {
            Storage::Cpu(v) => {
                self.apply(v, n_heads, positions);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => {
                let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
                let f = self.inv_freq_dev.cuda(&s.dev, &self.inv_freq)?;
                s.dev.rope(
                    &mut s.buf,
                    &pos,
                    f,
                    n_heads,
                    self.head_dim,
                    self.attention_scaling,
                )
            }
        }
    }

    /// [`Rope::rotate`] at 3-D positions (see [`Rope::with_mrope`]); on the CPU only, except
    /// where every row's three positions agree (text), which is the 1-D rotation.
    pub fn rotate_3d(
        &self,
        x: &mut Tensor,
        n_heads: usize,
        positions: &[[usize; 3]],
    ) -> Result<()> {
        if positions.iter().all(|p| p[0] == p[1] && p[1] == p[2]) && !self.is_vision() {
            let flat: Vec<usize> = positions.iter().map(|p| p[0]).collect();
            return self.rotate(x, n_heads, &flat);
        }
        self.check_rows("Rope::rotate_3d", x, n_heads, positions.len())?;
        match x.storage_mut() {
            Storage::Cpu(v) => self.apply_3d(v, n_heads, positions),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::Device(
                "multimodal (3-D) rotary positions do not run on the GPU yet".into(),
            )),
        }
    }

    /// [`Rope::apply`] at `positions`, or at the 3-D positions `p3` when given.
    pub fn apply_rows(
        &self,
        x: &mut [f32],
        n_heads: usize,
        positions: &[usize],
        p3: Option<&[[usize; 3]]>,
    ) -> Result<()> {
        match p3 {
            Some(p) => self.apply_3d(x, n_heads, p),
            None => {
                self.apply(x, n_heads, positions);
                Ok(())
            }
        }
    }

    /// Whether the rotation is a vision tower's (no time axis: rows never reduce to 1-D).
    fn is_vision(&self) -> bool {
        self.axes.as_ref().is_some_and(|a| !a.contains(&0))
    }

    /// [`Rope::apply`] at 3-D positions: pair `i` of row `r` turns by
    /// `positions[r][axis(i)] * inv_freq[i]`.
    pub fn apply_3d(&self, x: &mut [f32], n_heads: usize, positions: &[[usize; 3]]) -> Result<()> {
        let axes = self.axes.as_ref().ok_or_else(|| {
            Error::InvalidInput(
                "3-D positions are for multimodal rotary embeddings, which this model does not use"
                    .into(),
            )
        })?;
        self.rotate_rows(x, n_heads, positions, |pos, i| pos[axes[i] as usize]);
        Ok(())
    }

    /// The inverse frequencies, one per rotated pair.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// The factor applied to cos and sin (1 except for YaRN).
    pub fn attention_scaling(&self) -> f32 {
        self.attention_scaling
    }

    /// Rotates every head of every row of `x` f32 [positions.len(), n_heads * head_dim] in place;
    /// row `i` is at position `positions[i]`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, positions: &[usize]) {
        self.rotate_rows(x, n_heads, positions, |&pos, _| pos);
    }

    /// Rotates every head of every row of `x` in place, pair `i` of a row at `position(p, i)`
    /// for the row's `p` (the one loop of [`Rope::apply`] and [`Rope::apply_3d`]).
    fn rotate_rows<P>(
        &self,
        x: &mut [f32],
        n_heads: usize,
        positions: &[P],
        position: impl Fn(&P, usize) -> usize,
    ) {
        let hd = self.head_dim;
        let half = self.inv_freq.len();
        debug_assert_eq!(x.len(), positions.len() * n_heads * hd);
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        for (row, pos) in x.chunks_exact_mut(n_heads * hd).zip(positions) {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                let angle = position(pos, i) as f32 * f;
                cos[i] = angle.cos() * self.attention_scaling;
                sin[i] = angle.sin() * self.attention_scaling;
            }
            rotate_heads(row, hd, &cos, &sin);
        }
    }
}

/// Rotates each head of `row` (heads of `hd` features) pair-wise by the given cos / sin: the
/// first `cos.len()` features pair with the next as many ("rotate half").
fn rotate_heads(row: &mut [f32], hd: usize, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for head in row.chunks_exact_mut(hd) {
        let (x1, rest) = head.split_at_mut(half);
        let x2 = &mut rest[..half];
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = a * cos[i] - b * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(scaling: RopeScaling) -> RopeConfig {
        RopeConfig {
            theta: 10000.0,
            rotary_dim: 8,
            scaling,
        }
    }

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let rope = Rope::new(&cfg(RopeScaling::None), 8).unwrap();
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 2.0).collect();
        let orig = x.clone();
        rope.apply(&mut x, 1, &[0, 5]);
        assert_eq!(&x[..8], &orig[..8]);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x[8..]) - n(&orig[8..])).abs() < 1e-4);
    }

    #[test]
    fn relative_property_of_dot_products() {
        // <R(p)q, R(p+d)k> depends only on d.
        let rope = Rope::new(&cfg(RopeScaling::None), 8).unwrap();
        let q: Vec<f32> = (0..8).map(|i| (i as f32).sin()).collect();
        let k: Vec<f32> = (0..8).map(|i| (i as f32 * 0.7).cos()).collect();
        let dot_at = |p: usize, d: usize| {
            let (mut a, mut b) = (q.clone(), k.clone());
            rope.apply(&mut a, 1, &[p]);
            rope.apply(&mut b, 1, &[p + d]);
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((dot_at(3, 4) - dot_at(40, 4)).abs() < 1e-4);
    }

    #[test]
    fn mrope_axes_interleave_or_follow_sections() {
        let inter = Mrope {
            section: [2, 1, 1],
            interleaved: true,
        };
        assert_eq!(inter.axes(4).unwrap(), vec![0, 1, 2, 0]);
        // Qwen3.5's sections [11, 11, 10] over 32 pairs: h at 1, 4, .., 31; w at 2, .., 29.
        let q35 = Mrope {
            section: [11, 11, 10],
            interleaved: true,
        };
        let axes = q35.axes(32).unwrap();
        assert_eq!(axes.iter().filter(|&&a| a == 1).count(), 11);
        assert_eq!(axes.iter().filter(|&&a| a == 2).count(), 10);
        assert_eq!(axes[30], 0);
        let flat = Mrope {
            section: [1, 1, 2],
            interleaved: false,
        };
        assert_eq!(flat.axes(4).unwrap(), vec![0, 1, 2, 2]);
        assert!(flat.axes(5).is_err());
    }

    #[test]
    fn equal_3d_positions_rotate_as_1d() {
        let rope = Rope::new(&cfg(RopeScaling::None), 8)
            .unwrap()
            .with_mrope(&Mrope {
                section: [2, 1, 1],
                interleaved: true,
            })
            .unwrap();
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut a, mut b) = (x.clone(), x);
        rope.apply(&mut a, 1, &[3, 11]);
        rope.apply_3d(&mut b, 1, &[[3, 3, 3], [11, 11, 11]])
            .unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(Rope::new(&cfg(RopeScaling::None), 6).is_err());
        let mut c = cfg(RopeScaling::Linear { factor: 0.0 });
        assert!(Rope::new(&c, 8).is_err());
        c.scaling = RopeScaling::None;
        c.rotary_dim = 7;
        assert!(Rope::new(&c, 8).is_err());
    }
}
