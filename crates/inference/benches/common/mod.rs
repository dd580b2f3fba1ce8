//! Timing helpers shared by the kernel benches (`quant`, `ternary`): median wall time and
//! on-CPU time of repeated runs, rates, and the CPU's model name.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The CPU's model name (Linux `/proc/cpuinfo`), or "unknown".
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// On-CPU time of all threads of this process so far (Linux `schedstat`, ns); 0 elsewhere.
pub fn cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|e| {
        let s = std::fs::read_to_string(e.ok()?.path().join("schedstat")).ok()?;
        s.split_whitespace().next()?.parse::<u64>().ok()
    })
    .sum()
}

/// Timing of one case: median wall time of a run, and on-CPU time per run and thread (the CPU
/// time of the whole process over all timed runs, divided by runs and threads; the kernel's
/// `schedstat` clock lags by up to a tick, so only the total is used). On this shared 2-core
/// VM other processes take turns on the cores; the on-CPU figure is the speed while running.
#[derive(Clone, Copy)]
pub struct Timing {
    /// Median wall time of a run.
    pub wall: Duration,
    /// On-CPU time per run and thread.
    pub cpu: Duration,
}

/// Times `f` over enough runs to fill `budget` (at least 5, at most 20000), after a warm-up.
pub fn time_runs(budget: Duration, threads: usize, mut f: impl FnMut()) -> Timing {
    f();
    let t0 = Instant::now();
    f();
    let once = t0.elapsed().max(Duration::from_nanos(100));
    let runs = (budget.as_secs_f64() / once.as_secs_f64()).clamp(5.0, 20_000.0) as usize;
    let mut walls = Vec::with_capacity(runs);
    let c0 = cpu_ns();
    for _ in 0..runs {
        let t = Instant::now();
        f();
        walls.push(t.elapsed());
    }
    let cpu = (cpu_ns() - c0) / (runs * threads) as u64;
    walls.sort();
    Timing {
        wall: walls[runs / 2],
        cpu: Duration::from_nanos(cpu),
    }
}

/// `amount / time` in units of 1e9 per second, for wall time and on-CPU time.
pub fn rates(amount: f64, t: Timing) -> (f64, f64) {
    (
        amount / t.wall.as_secs_f64() / 1e9,
        amount / t.cpu.as_secs_f64().max(1e-12) / 1e9,
    )
}
