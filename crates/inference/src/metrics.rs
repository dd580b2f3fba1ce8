//! Per-layer inference metrics (`--metrics layers`) and the hidden-state comparison ShortGPT's
//! pruning ranks layers by.
//!
//! Off by default: a decoder's layer loop runs each layer through [`observe_layer`], which costs
//! one atomic load when no sink is installed. With a sink ([`install`]), every layer of every
//! forward pass reports a [`LayerStats`]: the mean L2 norm of its input and output rows, the
//! residual-update ratio ‖out − in‖ / ‖in‖, ShortGPT's block influence 1 − cos(in, out), the
//! wall time of the layer, and (attention layers on the CPU) the mean entropy of the attention
//! distributions of its heads. Observing copies each layer's input and output to the host, so
//! it slows the pass; times then include that copy and, on a GPU, the wait for the layer.
//!
//! This module owns the statistics and the process-wide sink; models own nothing of it beyond
//! the one call per layer, and the attention entry point adds the entropy.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::tensor::Tensor;
use crate::Result;

/// What one layer did in one forward pass (means over the pass's rows).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LayerStats {
    /// The layer's index.
    pub layer: usize,
    /// Rows (tokens) in the pass.
    pub rows: usize,
    /// Mean L2 norm of the layer's input rows (the residual stream before it).
    pub input_norm: f64,
    /// Mean L2 norm of its output rows.
    pub output_norm: f64,
    /// Mean ‖out − in‖ / ‖in‖ over rows: how much the layer changes the residual stream.
    pub update_ratio: f64,
    /// Mean 1 − cos(in, out) over rows: ShortGPT's block influence.
    pub influence: f64,
    /// Mean entropy (nats) of the attention distributions over heads and rows; `None` for
    /// layers without attention and on the GPU.
    pub attention_entropy: Option<f64>,
    /// Wall time of the layer, seconds (see the module doc).
    pub seconds: f64,
}

/// Receives every layer's statistics while installed.
pub trait LayerSink: Send + Sync {
    /// One layer of one pass.
    fn record(&self, stats: &LayerStats);
}

static ON: AtomicBool = AtomicBool::new(false);
static SINK: RwLock<Option<Arc<dyn LayerSink>>> = RwLock::new(None);

thread_local! {
    /// The entropy the attention of the layer running on this thread reported.
    static ENTROPY: RefCell<Option<f64>> = const { RefCell::new(None) };
}

/// Sends every layer's statistics to `sink` from now on (replacing any sink before it).
pub fn install(sink: Arc<dyn LayerSink>) {
    if let Ok(mut s) = SINK.write() {
        *s = Some(sink);
        ON.store(true, Ordering::Release);
    }
}

/// Stops observing layers.
pub fn uninstall() {
    if let Ok(mut s) = SINK.write() {
        ON.store(false, Ordering::Release);
        *s = None;
    }
}

/// Whether layers are being observed.
pub fn enabled() -> bool {
    ON.load(Ordering::Acquire)
}

/// Called by attention (when [`enabled`]) with the mean entropy of its distributions.
pub fn report_attention_entropy(mean: f64) {
    ENTROPY.with(|e| *e.borrow_mut() = Some(mean));
}

/// Runs layer `layer` (`f`, from its input `x` [rows, hidden] to its output), reporting its
/// statistics to the installed sink when one is.
pub fn observe_layer(
    layer: usize,
    x: Tensor,
    f: impl FnOnce(Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if !enabled() {
        return f(x);
    }
    let input = x.to_host()?;
    let width = x.cols();
    ENTROPY.with(|e| *e.borrow_mut() = None);
    let t0 = std::time::Instant::now();
    let y = f(x)?;
    let output = y.to_host()?;
    let seconds = t0.elapsed().as_secs_f64();
    let mut stats = compare_rows(&input, &output, width);
    stats.layer = layer;
    stats.seconds = seconds;
    stats.attention_entropy = ENTROPY.with(|e| e.borrow_mut().take());
    let sink = SINK.read().ok().and_then(|s| s.clone());
    if let Some(sink) = sink {
        sink.record(&stats);
    }
    Ok(y)
}

/// The row statistics of a layer with input rows `a` and output rows `b` (both [rows, width]);
/// layer, entropy and time left empty.
pub fn compare_rows(a: &[f32], b: &[f32], width: usize) -> LayerStats {
    let rows = a.len().checked_div(width).unwrap_or(0);
    let (mut na, mut nb, mut upd, mut infl) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (ra, rb) in a.chunks_exact(width).zip(b.chunks_exact(width)) {
        let (mut aa, mut bb, mut ab, mut dd) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (&x, &y) in ra.iter().zip(rb) {
            let (x, y) = (f64::from(x), f64::from(y));
            aa += x * x;
            bb += y * y;
            ab += x * y;
            dd += (y - x) * (y - x);
        }
        let (la, lb) = (aa.sqrt(), bb.sqrt());
        na += la;
        nb += lb;
        upd += if la > 0.0 { dd.sqrt() / la } else { 0.0 };
        infl += if la > 0.0 && lb > 0.0 {
            1.0 - ab / (la * lb)
        } else {
            0.0
        };
    }
    let n = rows.max(1) as f64;
    LayerStats {
        layer: 0,
        rows,
        input_norm: na / n,
        output_norm: nb / n,
        update_ratio: upd / n,
        influence: infl / n,
        attention_entropy: None,
        seconds: 0.0,
    }
}

/// Entropy (nats) of softmax(`scores`), the scores already scaled.
pub fn softmax_entropy(scores: &[f32]) -> f64 {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return 0.0;
    }
    let mut z = 0.0f64;
    let mut zs = 0.0f64;
    for &s in scores {
        let d = f64::from(s - max);
        let e = d.exp();
        z += e;
        zs += e * d;
    }
    // H = −Σ p ln p with p = e / z and ln p = d − ln z.
    z.ln() - zs / z
}

/// Sums [`LayerStats`] per layer (for `/metrics` and end-of-run reports).
#[derive(Debug, Default)]
pub struct LayerTotals {
    layers: std::sync::Mutex<Vec<Totals>>,
}

/// Running sums of one layer.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Totals {
    /// Passes observed.
    pub passes: u64,
    /// Rows observed.
    pub rows: u64,
    /// Sums over passes of each mean, weighted by rows.
    pub input_norm: f64,
    /// See `input_norm`.
    pub output_norm: f64,
    /// See `input_norm`.
    pub update_ratio: f64,
    /// See `input_norm`.
    pub influence: f64,
    /// Row-weighted sum of attention entropies, and the rows it covers.
    pub attention_entropy: f64,
    /// Rows with an attention entropy.
    pub entropy_rows: u64,
    /// Seconds in the layer.
    pub seconds: f64,
}

impl LayerTotals {
    /// Adds one layer's statistics.
    pub fn add(&self, s: &LayerStats) {
        let Ok(mut v) = self.layers.lock() else {
            return;
        };
        if v.len() <= s.layer {
            v.resize(s.layer + 1, Totals::default());
        }
        let t = &mut v[s.layer];
        let w = s.rows as f64;
        t.passes += 1;
        t.rows += s.rows as u64;
        t.input_norm += s.input_norm * w;
        t.output_norm += s.output_norm * w;
        t.update_ratio += s.update_ratio * w;
        t.influence += s.influence * w;
        if let Some(e) = s.attention_entropy {
            t.attention_entropy += e * w;
            t.entropy_rows += s.rows as u64;
        }
        t.seconds += s.seconds;
    }

    /// Per layer: the row-weighted means so far (input norm, output norm, update ratio,
    /// influence, attention entropy) with the rows and seconds.
    pub fn snapshot(&self) -> Vec<Totals> {
        self.layers.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl LayerSink for LayerTotals {
    fn record(&self, stats: &LayerStats) {
        self.add(stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_comparison() {
        // Row 1 unchanged; row 2 rotated by 90 degrees and doubled.
        let a = [1.0f32, 0.0, 0.0, 1.0];
        let b = [1.0f32, 0.0, -2.0, 0.0];
        let s = compare_rows(&a, &b, 2);
        assert_eq!(s.rows, 2);
        assert!((s.input_norm - 1.0).abs() < 1e-12);
        assert!((s.output_norm - 1.5).abs() < 1e-12);
        assert!((s.influence - 0.5).abs() < 1e-12);
        assert!((s.update_ratio - 5f64.sqrt() / 2.0).abs() < 1e-12);
    }

    #[test]
    fn entropy_of_a_softmax() {
        assert!((softmax_entropy(&[0.0; 4]) - 4f64.ln()).abs() < 1e-12);
        assert!(softmax_entropy(&[100.0, 0.0, 0.0]) < 1e-30);
        let p = [0.7f64, 0.2, 0.1];
        let s: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
        let want: f64 = -p.iter().map(|x| x * x.ln()).sum::<f64>();
        assert!((softmax_entropy(&s) - want).abs() < 1e-6);
    }
}
