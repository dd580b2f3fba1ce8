//! [`Metrics`]: the counters, gauges and histograms behind `GET /metrics`, rendered in the
//! Prometheus text format. Lock-free counters for the hot paths; histograms behind a mutex
//! (one short critical section per observation).

use lattice_inference::engine::MemoryStats;
use lattice_inference::metrics::{LayerTotals, Totals};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Latency buckets in seconds.
const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Batch-size buckets (sequences or texts).
const SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// A cumulative histogram with fixed buckets.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

/// Everything `/metrics` reports.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    durations: Mutex<BTreeMap<String, Histogram>>,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    draft_tokens: AtomicU64,
    accepted_draft_tokens: AtomicU64,
    embedding_tokens: AtomicU64,
    queue_depth: AtomicI64,
    running: AtomicI64,
    batch_size: Mutex<Histogram>,
    embed_batch_size: Mutex<Histogram>,
    time_to_first_token: Mutex<Histogram>,
    memory: Mutex<Option<MemoryStats>>,
    /// Per-layer sums while `--metrics layers` observes the generation model's layers.
    layers: std::sync::OnceLock<Arc<LayerTotals>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Mutex::default(),
            durations: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            accepted_draft_tokens: AtomicU64::new(0),
            embedding_tokens: AtomicU64::new(0),
            queue_depth: AtomicI64::new(0),
            running: AtomicI64::new(0),
            batch_size: Mutex::new(Histogram::new(SIZES)),
            embed_batch_size: Mutex::new(Histogram::new(SIZES)),
            time_to_first_token: Mutex::new(Histogram::new(SECONDS)),
            memory: Mutex::new(None),
            layers: std::sync::OnceLock::new(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain numbers behind: keep counting.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// Reports the per-layer sums of `totals` (the installed layer sink) on `/metrics`.
    pub fn set_layers(&self, totals: Arc<LayerTotals>) {
        let _ = self.layers.set(totals);
    }

    /// The per-layer section: row-weighted means and totals per layer.
    fn render_layers(&self, out: &mut String) {
        let Some(totals) = self.layers.get() else {
            return;
        };
        let layers = totals.snapshot();
        let mean = |sum: f64, rows: u64| if rows == 0 { 0.0 } else { sum / rows as f64 };
        type Pick = fn(&Totals) -> (f64, u64);
        let series: [(&str, &str, &str, Pick); 8] = [
            ("lattice_layer_passes_total", "counter", "Forward passes through the layer.", |t| (t.passes as f64, 1)),
            ("lattice_layer_rows_total", "counter", "Rows (tokens) through the layer.", |t| (t.rows as f64, 1)),
            ("lattice_layer_seconds_total", "counter", "Time in the layer (observed; includes copying its input and output to the host).", |t| (t.seconds, 1)),
            ("lattice_layer_input_norm", "gauge", "Mean L2 norm of the layer's input rows.", |t| (t.input_norm, t.rows)),
            ("lattice_layer_output_norm", "gauge", "Mean L2 norm of the layer's output rows.", |t| (t.output_norm, t.rows)),
            ("lattice_layer_update_ratio", "gauge", "Mean |out - in| / |in| of the layer's rows.", |t| (t.update_ratio, t.rows)),
            ("lattice_layer_influence", "gauge", "Mean 1 - cos(in, out) of the layer's rows (ShortGPT's block influence).", |t| (t.influence, t.rows)),
            ("lattice_layer_attention_entropy", "gauge", "Mean entropy (nats) of the layer's attention distributions (CPU attention layers).", |t| (t.attention_entropy, t.entropy_rows)),
        ];
        for (name, kind, help, pick) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (i, t) in layers.iter().enumerate() {
                let (v, rows) = pick(t);
                if rows > 0 {
                    let _ = writeln!(out, "{name}{{layer=\"{i}\"}} {}", mean(v, rows));
                }
            }
        }
    }

    /// One finished request on `route` with HTTP `status`, answered in `secs`.
    pub fn request(&self, route: &str, status: u16, secs: f64) {
        *lock(&self.requests)
            .entry((route.to_string(), status))
            .or_default() += 1;
        lock(&self.durations)
            .entry(route.to_string())
            .or_insert_with(|| Histogram::new(SECONDS))
            .observe(secs);
    }

    /// Prompt tokens admitted for generation.
    pub fn prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Tokens generated.
    pub fn generation_tokens(&self, n: usize) {
        self.generation_tokens
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Speculative decoding: tokens drafted, and those of them kept.
    pub fn drafts(&self, drafted: usize, accepted: usize) {
        self.draft_tokens
            .fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted_draft_tokens
            .fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// Tokens embedded (or scored by the reranker).
    pub fn embedding_tokens(&self, n: usize) {
        self.embedding_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Generation requests waiting and running, after a scheduler step.
    pub fn scheduler(&self, waiting: usize, running: usize) {
        self.queue_depth.store(waiting as i64, Ordering::Relaxed);
        self.running.store(running as i64, Ordering::Relaxed);
    }

    /// The generation engine's KV memory and prefix cache after a step.
    pub fn memory(&self, stats: &MemoryStats) {
        *lock(&self.memory) = Some(*stats);
    }

    /// Sequences in one decode step.
    pub fn batch_size(&self, n: usize) {
        lock(&self.batch_size).observe(n as f64);
    }

    /// Texts in one embedding forward pass.
    pub fn embed_batch_size(&self, n: usize) {
        lock(&self.embed_batch_size).observe(n as f64);
    }

    /// Seconds from a generation request's arrival to its first token.
    pub fn time_to_first_token(&self, secs: f64) {
        lock(&self.time_to_first_token).observe(secs);
    }

    /// The Prometheus text exposition of everything above plus the process's resident memory.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP lattice_requests_total HTTP requests answered, by route and status.\n# TYPE lattice_requests_total counter\n");
        for ((route, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "lattice_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP lattice_request_duration_seconds Time to answer (to the response head for streams).\n# TYPE lattice_request_duration_seconds histogram\n");
        for (route, h) in lock(&self.durations).iter() {
            h.render(
                &mut out,
                "lattice_request_duration_seconds",
                &format!("route=\"{route}\""),
            );
        }
        let counters = [
            (
                "lattice_prompt_tokens_total",
                "Prompt tokens admitted for generation.",
                &self.prompt_tokens,
            ),
            (
                "lattice_generation_tokens_total",
                "Tokens generated.",
                &self.generation_tokens,
            ),
            (
                "lattice_draft_tokens_total",
                "Speculative decoding: tokens drafted.",
                &self.draft_tokens,
            ),
            (
                "lattice_accepted_draft_tokens_total",
                "Speculative decoding: drafted tokens the model kept.",
                &self.accepted_draft_tokens,
            ),
            (
                "lattice_embedding_tokens_total",
                "Tokens embedded or reranked.",
                &self.embedding_tokens,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let gauges = [
            (
                "lattice_queue_depth",
                "Generation requests waiting for a slot.",
                &self.queue_depth,
            ),
            (
                "lattice_running_sequences",
                "Generation requests being prefilled or decoded.",
                &self.running,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let hists = [
            (
                "lattice_batch_size",
                "Sequences per generation step.",
                &self.batch_size,
            ),
            (
                "lattice_embed_batch_size",
                "Texts per embedding forward pass.",
                &self.embed_batch_size,
            ),
            (
                "lattice_time_to_first_token_seconds",
                "Arrival to first generated token.",
                &self.time_to_first_token,
            ),
        ];
        for (name, help, h) in hists {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            lock(h).render(&mut out, name, "");
        }
        if let Some(m) = *lock(&self.memory) {
            let budget = if m.budget_bytes == usize::MAX {
                0
            } else {
                m.budget_bytes
            };
            let rows: [(&str, &str, &str, u64); 10] = [
                (
                    "lattice_kv_budget_bytes",
                    "gauge",
                    "KV memory budget (pages, recurrent state, cached prefixes).",
                    budget as u64,
                ),
                (
                    "lattice_kv_used_bytes",
                    "gauge",
                    "KV memory in use.",
                    m.used_bytes as u64,
                ),
                (
                    "lattice_kv_pages_used",
                    "gauge",
                    "KV pages allocated (in use or cached).",
                    m.pages_used as u64,
                ),
                (
                    "lattice_kv_pages_free",
                    "gauge",
                    "KV pages that still fit in the budget.",
                    m.pages_free as u64,
                ),
                (
                    "lattice_prefix_cache_pages",
                    "gauge",
                    "Pages kept by the prefix cache.",
                    m.cached_pages as u64,
                ),
                (
                    "lattice_prefix_cache_snapshots",
                    "gauge",
                    "Recurrent-state snapshots kept by the prefix cache.",
                    m.cached_snapshots as u64,
                ),
                (
                    "lattice_prefix_cache_lookups_total",
                    "counter",
                    "Prefix-cache lookups (one per admitted request).",
                    m.prefix.lookups,
                ),
                (
                    "lattice_prefix_cache_queried_tokens_total",
                    "counter",
                    "Prompt tokens looked up in the prefix cache.",
                    m.prefix.queried_tokens,
                ),
                (
                    "lattice_prefix_cache_hit_tokens_total",
                    "counter",
                    "Prompt tokens found in the prefix cache (not recomputed).",
                    m.prefix.hit_tokens,
                ),
                (
                    "lattice_preemptions_total",
                    "counter",
                    "Sequences preempted for lack of KV memory (recomputed later).",
                    m.preemptions,
                ),
            ];
            for (name, kind, help, v) in rows {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
                );
            }
        }
        self.render_layers(&mut out);
        if let Some(rss) = resident_bytes() {
            let _ = writeln!(
                out,
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {rss}"
            );
        }
        out
    }
}

/// The process's resident set size (Linux: `VmRSS` of /proc/self/status).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_layer_metrics() {
        use lattice_inference::metrics::{LayerSink, LayerStats};
        let m = Metrics::default();
        assert!(!m.render().contains("lattice_layer_"));
        let totals = Arc::new(LayerTotals::default());
        m.set_layers(Arc::clone(&totals));
        let stats = |layer, rows, influence, entropy| LayerStats {
            layer,
            rows,
            input_norm: 2.0,
            output_norm: 3.0,
            update_ratio: 0.5,
            influence,
            attention_entropy: entropy,
            seconds: 0.25,
        };
        totals.record(&stats(0, 3, 0.1, Some(1.0)));
        totals.record(&stats(0, 1, 0.5, Some(2.0)));
        totals.record(&stats(1, 4, 0.2, None));
        let text = m.render();
        // Row-weighted means: (3 * 0.1 + 1 * 0.5) / 4 = 0.2; (3 * 1 + 2) / 4 = 1.25.
        assert!(
            text.contains("lattice_layer_influence{layer=\"0\"} 0.2"),
            "{text}"
        );
        assert!(text.contains("lattice_layer_attention_entropy{layer=\"0\"} 1.25"));
        assert!(!text.contains("lattice_layer_attention_entropy{layer=\"1\"}"));
        assert!(text.contains("lattice_layer_rows_total{layer=\"1\"} 4"));
        assert!(text.contains("lattice_layer_passes_total{layer=\"0\"} 2"));
        assert!(text.contains("lattice_layer_seconds_total{layer=\"0\"} 0.5"));
        assert!(text.contains("# TYPE lattice_layer_input_norm gauge"));
    }

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.request("/v1/embeddings", 200, 0.02);
        m.request("/v1/embeddings", 200, 0.3);
        m.request("/v1/embeddings", 400, 0.001);
        m.generation_tokens(7);
        m.drafts(5, 3);
        m.batch_size(3);
        m.scheduler(2, 5);
        let text = m.render();
        assert!(text.contains("lattice_requests_total{route=\"/v1/embeddings\",status=\"200\"} 2"));
        assert!(text.contains("lattice_requests_total{route=\"/v1/embeddings\",status=\"400\"} 1"));
        assert!(text.contains(
            "lattice_request_duration_seconds_bucket{route=\"/v1/embeddings\",le=\"0.025\"} 2"
        ));
        assert!(text.contains(
            "lattice_request_duration_seconds_bucket{route=\"/v1/embeddings\",le=\"+Inf\"} 3"
        ));
        assert!(text.contains("lattice_generation_tokens_total 7"));
        assert!(text.contains("lattice_draft_tokens_total 5"));
        assert!(text.contains("lattice_accepted_draft_tokens_total 3"));
        assert!(text.contains("lattice_batch_size_bucket{le=\"4\"} 1"));
        assert!(text.contains("lattice_batch_size_bucket{le=\"2\"} 0"));
        assert!(text.contains("lattice_queue_depth 2"));
        assert!(text.contains("lattice_running_sequences 5"));
        assert!(text.contains("process_resident_memory_bytes "));
    }
}
