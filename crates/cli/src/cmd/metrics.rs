//! `--metrics layers` of `generate`, `chat`, `bench generate` and `perplexity`: every layer's
//! statistics (lattice_inference::metrics) as one JSON object per line, to `--metrics-file`
//! or stderr. (`serve --metrics layers` reports them on `/metrics` instead.)

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use lattice_inference::metrics::{install, LayerSink, LayerStats};

/// What `--metrics` observes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsKind {
    /// Per-layer statistics of every forward pass.
    Layers,
}

/// Writes each layer's statistics as a JSON line, numbering the passes.
struct JsonLines {
    out: Mutex<Box<dyn Write + Send>>,
    pass: AtomicU64,
}

impl LayerSink for JsonLines {
    fn record(&self, s: &LayerStats) {
        let pass = if s.layer == 0 {
            self.pass.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.pass.load(Ordering::Relaxed)
        };
        let mut v = serde_json::to_value(s).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("pass".into(), pass.into());
        }
        if let Ok(mut out) = self.out.lock() {
            let _ = writeln!(out, "{v}");
            let _ = out.flush();
        }
    }
}

/// Starts observing the layers when `kind` asks for it, writing to `file` (else stderr).
pub fn start(kind: Option<MetricsKind>, file: Option<&Path>) -> anyhow::Result<()> {
    let Some(MetricsKind::Layers) = kind else {
        return Ok(());
    };
    let out: Box<dyn Write + Send> = match file {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p)
                .with_context(|| format!("cannot create the metrics file `{}`", p.display()))?,
        )),
        None => Box::new(std::io::stderr()),
    };
    install(Arc::new(JsonLines {
        out: Mutex::new(out),
        pass: AtomicU64::new(0),
    }));
    Ok(())
}
