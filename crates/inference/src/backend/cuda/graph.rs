//! Recorded decode steps (CUDA graphs). A decode step launches hundreds of small kernels; on
//! the host each launch costs microseconds, more than the kernel runs. So a step of a given
//! shape (model instance, rows) runs eagerly once (which also makes every lazily placed weight
//! and step input), is recorded the second time, and is replayed from then on.
//!
//! Replaying still runs the model's code on the host, with launches skipped: that keeps the
//! sequences' page tables, positions and step inputs (backend::cuda::Input, whose buffers keep
//! their addresses) current without any model-specific code here, and then one graph launch
//! does the device work. The chosen token ids land in a fixed output buffer, read after the
//! launch; [`CudaDevice::graph_launch`] instead leaves them on their way to host memory, so
//! the host can prepare and launch the next step, whose ids may be these very picks
//! ([`CudaDevice::graph_launch`]'s `follows`), while the device runs this one.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use cudarc::driver::{result, sys, CudaEvent, CudaSlice, PinnedHostSlice};

use super::{err, CudaDevice};
use crate::{Error, Result};

const EAGER: u8 = 0;
const RECORD: u8 = 1;
const REPLAY: u8 = 2;

/// Rows of the fixed output buffer (token ids of one step).
const OUTPUT_ROWS: usize = 4096;

/// Host buffers that launched steps' ids land in, used in turn: a step's ids must be read
/// before this many more steps are launched.
const LANDINGS: usize = 4;

/// Recorded steps kept at most (all are dropped when one more is recorded).
const MAX_RECORDED: usize = 256;

type Key = (u64, usize);

/// A recorded step: the captured graph and its executable.
struct Recording {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: a CUDA graph may be used from any thread as long as no two use it at once; every use
// here happens under `Graphs::recorded`'s lock, inside `Graphs::step`'s.
unsafe impl Send for Recording {}

impl Drop for Recording {
    fn drop(&mut self) {
        // SAFETY: both handles were made by this recording and are used by nothing else.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

#[derive(Default)]
struct Recorded {
    graphs: HashMap<Key, Recording>,
    /// Shapes that ran eagerly once (ready to record).
    warmed: HashSet<Key>,
    /// Shapes whose recording failed: they stay eager.
    refused: HashSet<Key>,
    /// Step-input copies made while recording, applied before the recording first runs.
    deferred: Vec<(u64, Vec<u8>)>,
    /// Functions launched as programmatic dependents while recording (CUfunction addresses).
    dependents: HashSet<usize>,
    /// What the last recording held.
    last: Option<super::RecordingShape>,
}

/// The recorded steps of one device and the mode of the step in flight.
#[derive(Default)]
pub(super) struct Graphs {
    mode: AtomicU8,
    recorded: Mutex<Recorded>,
    output: Mutex<Option<CudaSlice<u32>>>,
    /// Where launched steps' ids land ([`CudaDevice::graph_launch`]).
    landing: Mutex<Landing>,
    /// Whether the step in flight takes its token ids from the output buffer (the picks of
    /// the step before it; [`CudaDevice::graph_launch`]'s `follows`).
    follow: std::sync::atomic::AtomicBool,
    /// One step at a time goes through [`CudaDevice::graph_step`].
    step: Mutex<()>,
    /// Replayed steps so far (for `LATTICE_CUDA_TRACE`).
    traced: std::sync::atomic::AtomicU64,
    /// Host time of the step in flight spent on parts of its host pass (for
    /// `LATTICE_CUDA_TRACE`), in nanoseconds.
    host_parts: [std::sync::atomic::AtomicU64; HOST_PARTS],
}

/// Page-locked host buffers for the ids of steps launched ahead of their read, each with the
/// event recorded after its copy and the launch that last used it.
#[derive(Default)]
struct Landing {
    slots: Vec<(PinnedHostSlice<u32>, CudaEvent, u64)>,
    launched: u64,
}

/// A replayed step launched by [`CudaDevice::graph_launch`]: its ids are on their way to host
/// memory; [`CudaDevice::read_launched`] waits for them.
#[derive(Debug)]
pub struct LaunchedIds {
    /// The step's number among launched steps (which landing buffer, and whether it was
    /// reused since).
    seq: u64,
    rows: usize,
}

/// What [`CudaDevice::graph_launch`] did.
#[derive(Debug)]
pub enum Launched {
    /// The step ran (eagerly or recorded) and its ids were read.
    Ready(Vec<u32>),
    /// The step was replayed and runs on; its ids are read later.
    Ahead(LaunchedIds),
}

/// Parts of a replayed step's host pass that `LATTICE_CUDA_TRACE` times apart.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HostPart {
    /// Building attention's page tables and row destinations from the states.
    AttentionPlan = 0,
    /// Comparing and copying step inputs ([`CudaDevice::input`]).
    Inputs = 1,
}

const HOST_PARTS: usize = 2;

impl Graphs {
    /// Forgets every recording (a step input moved).
    pub(super) fn clear(&self) {
        if let Ok(mut r) = self.recorded.lock() {
            r.graphs.clear();
            r.warmed.clear();
        }
    }

    /// Whether the step in flight takes its token ids from the output buffer.
    pub(super) fn following(&self) -> bool {
        self.follow.load(Ordering::Acquire)
    }

    pub(super) fn recording(&self) -> bool {
        self.mode.load(Ordering::Acquire) == RECORD
    }

    pub(super) fn defer_copy(&self, p: u64, bytes: Vec<u8>) {
        if let Ok(mut r) = self.recorded.lock() {
            r.deferred.push((p, bytes));
        }
    }

    /// Notes that function `f` was launched as a programmatic dependent while recording.
    pub(super) fn note_dependent(&self, f: sys::CUfunction) {
        if let Ok(mut r) = self.recorded.lock() {
            r.dependents.insert(f as usize);
        }
    }
}

/// Launch slots of the kernel clock (kernels.cu `KCLOCK_SLOTS`), four u64 each.
const CLOCK_SLOTS: usize = 2048;

/// `LATTICE_CUDA_TRACE=1` prints, every 64th step, where a step's time goes: the host pass
/// (model code; launches skipped when replaying), the device time of the graph, the total.
pub(crate) fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LATTICE_CUDA_TRACE").is_ok_and(|v| v != "0"))
}

/// `LATTICE_CUDA_GRAPHS=0` runs every step eagerly (to measure what recording saves).
fn graphs_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LATTICE_CUDA_GRAPHS").map_or(true, |v| v != "0"))
}

enum Plan {
    Eager,
    Record,
    Replay,
}

impl CudaDevice {
    /// `f()`, its host time added to `part` of the step in flight under `LATTICE_CUDA_TRACE`.
    pub(crate) fn timed<R>(&self, part: HostPart, f: impl FnOnce() -> R) -> R {
        if !tracing() {
            return f();
        }
        let t0 = std::time::Instant::now();
        let r = f();
        self.graphs.host_parts[part as usize]
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// The host time of each [`HostPart`] since the last call, in ms (and resets them).
    fn take_host_parts(&self) -> [f64; HOST_PARTS] {
        let mut out = [0.0; HOST_PARTS];
        for (o, a) in out.iter_mut().zip(&self.graphs.host_parts) {
            *o = a.swap(0, Ordering::Relaxed) as f64 * 1e-6;
        }
        out
    }

    /// Clears the kernel clock (kernels.cu `LATTICE_KERNEL_CLOCK`) before a traced step, in
    /// stream order.
    fn clock_reset(&self) -> Result<()> {
        let Some(m) = self.clock_module() else {
            return Ok(());
        };
        let mut slots = m
            .get_global("lattice_clock", self.stream())
            .map_err(|e| err("the kernel clock", e))?;
        let mut host = vec![0u8; CLOCK_SLOTS * 32];
        for slot in host.chunks_mut(32) {
            slot[..16].fill(0xff);
        }
        self.stream()
            .memcpy_htod(&host, &mut slots)
            .map_err(|e| err("clearing the kernel clock", e))
    }

    /// Prints the kernel clock of the traced step just run: each launch that waited (in the
    /// order their first blocks' waits returned), its grid and block, when its first block
    /// started and its first and last blocks' waits returned, and the time until the next
    /// launch's wait returned (µs from the first launch's release).
    fn clock_report(&self, rows: usize) -> Result<()> {
        let Some(m) = self.clock_module() else {
            return Ok(());
        };
        let slots = m
            .get_global("lattice_clock", self.stream())
            .map_err(|e| err("the kernel clock", e))?;
        let mut host = vec![0u8; CLOCK_SLOTS * 32];
        self.stream()
            .memcpy_dtoh(&slots, &mut host)
            .map_err(|e| err("reading the kernel clock", e))?;
        self.synchronize()?;
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let mut launches: Vec<[u64; 4]> = host
            .chunks(32)
            .map(|c| {
                [
                    word(&c[..8]),
                    word(&c[8..16]),
                    word(&c[16..24]),
                    word(&c[24..]),
                ]
            })
            .filter(|s| s[1] != u64::MAX)
            .collect();
        launches.sort_by_key(|s| s[1]);
        let Some(first) = launches.first().map(|s| s[1]) else {
            return Ok(());
        };
        let us = |t: u64| (t as i64 - first as i64) as f64 * 1e-3;
        let last = launches.last().map_or(first, |s| s[2]);
        eprintln!(
            "cuda clock: step of {rows} rows: {} launches, {:.1} us from the first release to the last",
            launches.len(),
            us(last)
        );
        for (i, s) in launches.iter().enumerate() {
            let next = launches
                .get(i + 1)
                .map_or(f64::NAN, |n| us(n[1]) - us(s[1]));
            eprintln!(
                "cuda clock: {i:4} grid {:6} block {:4} start {:9.2} release {:9.2} last {:9.2} next {:7.2}",
                s[3] >> 32,
                s[3] & 0xffff_ffff,
                us(s[0]),
                us(s[1]),
                us(s[2]),
                next
            );
        }
        Ok(())
    }

    /// Whether launches are being skipped (a recorded step is being replayed).
    pub(crate) fn replaying(&self) -> bool {
        self.graphs.mode.load(Ordering::Acquire) == REPLAY
    }

    /// Whether a step is being recorded or replayed.
    pub(crate) fn graph_mode(&self) -> bool {
        self.graphs.mode.load(Ordering::Acquire) != EAGER
    }

    /// What the last recorded step held (kernels, memory nodes, programmatic edges).
    pub fn last_recording(&self) -> Option<super::RecordingShape> {
        self.graphs.recorded.lock().ok()?.last
    }

    /// The address of the fixed output buffer, holding at least `rows` ids.
    pub(crate) fn output(&self, rows: usize) -> Result<u64> {
        let mut out = self
            .graphs
            .output
            .lock()
            .map_err(|_| Error::Device("cuda: output poisoned".into()))?;
        if out.as_ref().is_none_or(|o| o.len() < rows) {
            if self.graph_mode() {
                return Err(Error::Device(format!(
                    "cuda: a recorded step of {rows} rows outgrew the output buffer"
                )));
            }
            *out = Some(self.alloc::<u32>(rows.max(OUTPUT_ROWS))?);
            self.clear_recordings();
        }
        Ok(self.ptr(out.as_ref().expect("allocated above")))
    }

    /// The first `rows` ids of the output buffer (waits for the device).
    pub(crate) fn read_output(&self, rows: usize) -> Result<Vec<u32>> {
        let out = self
            .graphs
            .output
            .lock()
            .map_err(|_| Error::Device("cuda: output poisoned".into()))?;
        match out.as_ref() {
            Some(o) if o.len() >= rows => self.download(o, rows),
            _ => Err(Error::Device("cuda: no step output to read".into())),
        }
    }

    /// Runs `step` eagerly (timed under `LATTICE_CUDA_TRACE`).
    fn eager(&self, rows: usize, step: impl FnOnce() -> Result<Vec<u32>>) -> Result<Vec<u32>> {
        let t0 = std::time::Instant::now();
        let ids = step()?;
        if tracing()
            && self
                .graphs
                .traced
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(64)
        {
            eprintln!(
                "cuda trace: eager step of {rows} rows: {:.3} ms (launches and the wait)",
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(ids)
    }

    /// Runs `step` (a greedy decode step of `rows` rows of model instance `key`, whose chosen
    /// ids come from [`CudaDevice::argmax_rows`]) eagerly the first time, recorded as a graph
    /// the second, replayed after that; returns the chosen ids.
    ///
    /// `step` must launch the same kernels with the same shapes every time for a given key
    /// (a decode step of that many sequences), allocate nothing outside the step but its
    /// activations, and take its per-step values from step inputs.
    pub fn graph_step(
        &self,
        key: u64,
        rows: usize,
        step: impl FnOnce() -> Result<Vec<u32>>,
    ) -> Result<Vec<u32>> {
        let _one = self
            .graphs
            .step
            .lock()
            .map_err(|_| Error::Device("cuda: step lock poisoned".into()))?;
        let k = (key, rows);
        if !graphs_enabled() {
            return self.eager(rows, step);
        }
        let plan = {
            let r = self
                .graphs
                .recorded
                .lock()
                .map_err(|_| Error::Device("cuda: graph table poisoned".into()))?;
            if r.graphs.contains_key(&k) {
                Plan::Replay
            } else if r.warmed.contains(&k) && !r.refused.contains(&k) {
                Plan::Record
            } else {
                Plan::Eager
            }
        };
        match plan {
            Plan::Eager => {
                let ids = self.eager(rows, step)?;
                if let Ok(mut r) = self.graphs.recorded.lock() {
                    r.warmed.insert(k);
                }
                Ok(ids)
            }
            Plan::Replay => {
                if tracing() {
                    self.take_host_parts();
                }
                let t0 = std::time::Instant::now();
                let host = self.replay_pass(step)?;
                let trace = tracing() && {
                    let n = self.graphs.traced.fetch_add(1, Ordering::Relaxed);
                    n.is_multiple_of(64)
                };
                let events = if trace {
                    let ctx = self.stream().context();
                    let a = ctx
                        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(|e| err("event", e))?;
                    let b = ctx
                        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .map_err(|e| err("event", e))?;
                    self.clock_reset()?;
                    a.record(self.stream()).map_err(|e| err("event", e))?;
                    Some((a, b))
                } else {
                    None
                };
                self.launch_recorded(k)?;
                if let Some((_, b)) = &events {
                    b.record(self.stream()).map_err(|e| err("event", e))?;
                }
                let ids = self.read_output(rows)?;
                if let Some((a, b)) = events {
                    let gpu = a.elapsed_ms(&b).map_err(|e| err("event", e))?;
                    let [plans, inputs] = self.take_host_parts();
                    eprintln!(
                        "cuda trace: replayed step of {rows} rows: host pass {:.3} ms \
                         (attention plans {plans:.3}, step inputs {inputs:.3}), graph \
                         {gpu:.3} ms on the device, total {:.3} ms",
                        host.as_secs_f64() * 1e3,
                        t0.elapsed().as_secs_f64() * 1e3
                    );
                    self.clock_report(rows)?;
                }
                Ok(ids)
            }
            Plan::Record => {
                // Keys also tell the rows' LoRA picks apart: a long-serving process records
                // new ones as batches change, so the table (and the buffers of its
                // recordings) is bounded.
                let full = self
                    .graphs
                    .recorded
                    .lock()
                    .is_ok_and(|r| r.graphs.len() >= MAX_RECORDED);
                if full {
                    self.clear_recordings();
                }
                self.stream()
                    .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                    .map_err(|e| err("recording a decode step", e))?;
                self.graphs.mode.store(RECORD, Ordering::Release);
                let done = step();
                self.graphs.mode.store(EAGER, Ordering::Release);
                let graph = self.end_recording(rows);
                let mut r = self
                    .graphs
                    .recorded
                    .lock()
                    .map_err(|_| Error::Device("cuda: graph table poisoned".into()))?;
                let deferred = std::mem::take(&mut r.deferred);
                r.dependents.clear();
                let graph = match (done, graph) {
                    (Ok(_), Ok(g)) => g,
                    (Err(e), _) => {
                        r.refused.insert(k);
                        return Err(e);
                    }
                    (Ok(_), Err(failed)) => {
                        r.refused.insert(k);
                        return Err(Error::Device(format!(
                            "cuda: recording a decode step of {rows} rows failed ({failed}); \
                             later steps of this shape run without a graph"
                        )));
                    }
                };
                for (p, bytes) in &deferred {
                    // SAFETY: `p` is a live step-input buffer holding at least these bytes
                    // (checked when the copy was deferred); queued on the device's stream.
                    unsafe {
                        cudarc::driver::result::memcpy_htod_async(
                            *p,
                            bytes,
                            self.stream().cu_stream(),
                        )
                    }
                    .map_err(|e| err("copying a step input", e))?;
                }
                self.launch_recording(&graph, "running a recorded decode step")?;
                r.graphs.insert(k, graph);
                drop(r);
                self.read_output(rows)
            }
        }
    }

    /// Whether a step of shape (`key`, `rows`) is replayed (recorded, graphs on): what a step
    /// whose ids follow the last launched step's picks needs ([`CudaDevice::graph_launch`]).
    pub fn replays(&self, key: u64, rows: usize) -> bool {
        graphs_enabled()
            && self
                .graphs
                .recorded
                .lock()
                .is_ok_and(|r| r.graphs.contains_key(&(key, rows)))
    }

    /// [`CudaDevice::graph_step`], but a replayed step does not wait for its ids: they are
    /// copied to a host buffer behind the step, and [`CudaDevice::read_launched`] waits for
    /// them. With `follows`, the step's token ids (the [`super::Input::TokenIds`] its host
    /// pass uploaded) are replaced on the device, row for row, by the ids of the step launched
    /// before it: the host launches step n + 1 before it knows step n's picks (the codes' top
    /// bit, set when a pick drew, is ignored by the embedding lookup). The step it follows
    /// must have had the same rows; a step that follows and is not recorded runs eagerly (and
    /// is read).
    pub fn graph_launch(
        &self,
        key: u64,
        rows: usize,
        follows: bool,
        step: impl FnOnce() -> Result<Vec<u32>>,
    ) -> Result<Launched> {
        let replay = self.replays(key, rows);
        // Under `LATTICE_CUDA_TRACE`, every 64th replayed step runs through `graph_step`,
        // which times it on the device (and reports the kernel clock), and is read at once.
        let traced = replay
            && tracing()
            && self
                .graphs
                .traced
                .load(Ordering::Relaxed)
                .is_multiple_of(64);
        if (!replay && !follows) || traced {
            return self
                .following(follows, || self.graph_step(key, rows, step))
                .map(Launched::Ready);
        }
        let _one = self
            .graphs
            .step
            .lock()
            .map_err(|_| Error::Device("cuda: step lock poisoned".into()))?;
        // A shape not recorded (recordings were just dropped) runs eagerly, so that no
        // recording holds the copy of the picks over the ids.
        if !replay {
            return self
                .following(true, || self.eager(rows, step))
                .map(Launched::Ready);
        }
        self.following(follows, || self.replay_pass(step))?;
        self.launch_recorded((key, rows))?;
        let seq = self.land(rows)?;
        if tracing() {
            self.graphs.traced.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Launched::Ahead(LaunchedIds { seq, rows }))
    }

    /// `f()` with the token ids' uploads followed by the copy of the output buffer's picks over
    /// them when `follows` (see `CudaDevice::input`).
    fn following<R>(&self, follows: bool, f: impl FnOnce() -> R) -> R {
        self.graphs.follow.store(follows, Ordering::Release);
        let r = f();
        self.graphs.follow.store(false, Ordering::Release);
        r
    }

    /// Runs `step`'s host pass with its launches skipped (a recorded step being replayed: its
    /// step inputs are brought up to date); its host time.
    fn replay_pass(&self, step: impl FnOnce() -> Result<Vec<u32>>) -> Result<std::time::Duration> {
        let t0 = std::time::Instant::now();
        self.graphs.mode.store(REPLAY, Ordering::Release);
        let done = step();
        self.graphs.mode.store(EAGER, Ordering::Release);
        done?;
        Ok(t0.elapsed())
    }

    /// Launches the recording of shape `k`, whose host pass [`CudaDevice::replay_pass`] just
    /// ran.
    fn launch_recorded(&self, k: Key) -> Result<()> {
        let r = self
            .graphs
            .recorded
            .lock()
            .map_err(|_| Error::Device("cuda: graph table poisoned".into()))?;
        match r.graphs.get(&k) {
            Some(g) => self.launch_recording(g, "replaying a decode step"),
            None => Err(Error::Device(
                "cuda: a recorded decode step vanished while it was replayed".into(),
            )),
        }
    }

    /// The ids of a step [`CudaDevice::graph_launch`] launched ahead (waits for the device).
    pub fn read_launched(&self, launched: LaunchedIds) -> Result<Vec<u32>> {
        let landing = self
            .graphs
            .landing
            .lock()
            .map_err(|_| Error::Device("cuda: landing buffers poisoned".into()))?;
        let slot = landing.slots.get(launched.seq as usize % LANDINGS);
        let Some((buf, done, _)) = slot.filter(|s| s.2 == launched.seq) else {
            return Err(Error::Device(format!(
                "cuda: the ids of a launched step were read after {LANDINGS} more steps were \
                 launched"
            )));
        };
        done.synchronize()
            .map_err(|e| err("waiting for a launched step", e))?;
        let host = buf
            .as_slice()
            .map_err(|e| err("reading a launched step's ids", e))?;
        Ok(host[..launched.rows].to_vec())
    }

    /// Queues the copy of the output buffer's first `rows` ids to the next landing buffer
    /// (after the step just launched) and the event after it; the launch's number.
    fn land(&self, rows: usize) -> Result<u64> {
        let out = self
            .graphs
            .output
            .lock()
            .map_err(|_| Error::Device("cuda: output poisoned".into()))?;
        let Some(o) = out.as_ref().filter(|o| o.len() >= rows) else {
            return Err(Error::Device("cuda: no step output to read".into()));
        };
        let mut landing = self
            .graphs
            .landing
            .lock()
            .map_err(|_| Error::Device("cuda: landing buffers poisoned".into()))?;
        if landing.slots.is_empty() {
            let ctx = self.stream().context();
            for _ in 0..LANDINGS {
                // SAFETY: a landing buffer is read only after a copy into it completed.
                let buf = unsafe { ctx.alloc_pinned_with_flags::<u32>(OUTPUT_ROWS, 0) }
                    .map_err(|e| err("allocating page-locked memory", e))?;
                let done = ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(|e| err("event", e))?;
                landing.slots.push((buf, done, 0));
            }
        }
        landing.launched += 1;
        let seq = landing.launched;
        let (buf, done, used) = &mut landing.slots[seq as usize % LANDINGS];
        if rows > buf.len() {
            return Err(Error::Device(format!(
                "cuda: a launched step of {rows} rows outgrew its landing buffer"
            )));
        }
        let host = buf.as_mut_slice().map_err(|e| err("a landing buffer", e))?;
        // SAFETY: the output buffer holds at least `rows` ids and `host` as many; the copy is
        // queued on the device's stream after the step, and the buffer stays in `landing`
        // (read only after `done`).
        unsafe {
            result::memcpy_dtoh_async(&mut host[..rows], self.ptr(o), self.stream().cu_stream())
        }
        .map_err(|e| err("copying a launched step's ids", e))?;
        done.record(self.stream()).map_err(|e| err("event", e))?;
        *used = seq;
        Ok(seq)
    }

    /// Copies the output buffer's first ids (the picks of the step before) over the token ids
    /// just uploaded to `ids` (`bytes` of them), in stream order, and forgets the host bytes
    /// the [`super::Input::TokenIds`] slot held (its next upload copies again).
    pub(super) fn ids_from_output(&self, ids: u64, bytes: usize) -> Result<()> {
        {
            let out = self
                .graphs
                .output
                .lock()
                .map_err(|_| Error::Device("cuda: output poisoned".into()))?;
            let rows = bytes / std::mem::size_of::<u32>();
            let Some(o) = out.as_ref().filter(|o| o.len() >= rows) else {
                return Err(Error::Device(format!(
                    "cuda: no picks of {rows} rows for the next step's ids"
                )));
            };
            // SAFETY: `ids` is a step-input buffer just given at least `bytes` and the output
            // holds as many; queued on the device's stream, after the step that picked and
            // before the kernels of this one.
            unsafe {
                result::memcpy_dtod_async(ids, self.ptr(o), bytes, self.stream().cu_stream())
            }
            .map_err(|e| err("copying picks to the next step's ids", e))?;
        }
        let mut inputs = self
            .inputs
            .lock()
            .map_err(|_| Error::Device("cuda: input table poisoned".into()))?;
        if let Some((host, _)) = inputs.get_mut(&super::Input::TokenIds) {
            host.clear();
        }
        Ok(())
    }

    /// Ends the capture of a step of `rows` rows and instantiates it.
    fn end_recording(&self, rows: usize) -> std::result::Result<Recording, String> {
        let cu = self.stream().cu_stream();
        // SAFETY: the device's stream was put in capture mode by this step.
        let graph = unsafe { result::stream::end_capture(cu) }.map_err(|e| format!("{e:?}"))?;
        if graph.is_null() {
            return Err("the capture made no graph".into());
        }
        let dependents = self
            .graphs
            .recorded
            .lock()
            .map(|r| r.dependents.clone())
            .unwrap_or_default();
        // SAFETY: `graph` was just made by the capture; only this thread holds it.
        let (shape, full) = match unsafe { super::shape::count(graph, &dependents, tracing()) } {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: as above; nothing else refers to the graph.
                let _ = unsafe { result::graph::destroy(graph) };
                return Err(format!("reading the recording: {e}"));
            }
        };
        if let Ok(mut r) = self.graphs.recorded.lock() {
            r.last = Some(shape);
        }
        if tracing() {
            eprintln!(
                "cuda trace: recorded step of {rows} rows: {} kernels ({} dependents), {} \
                 allocations ({:.1} MB), {} frees, {} other nodes; {} edges, {} programmatic, \
                 {} full edges from a kernel into a dependent",
                shape.kernels,
                shape.dependents,
                shape.allocations,
                shape.allocated as f64 / 1e6,
                shape.frees,
                shape.others,
                shape.edges,
                shape.programmatic,
                shape.full_into_dependents
            );
            for (pair, n) in full {
                eprintln!("cuda trace:   full edge {pair} (x{n})");
            }
        }
        // SAFETY: `graph` is valid; on failure it is destroyed here and never used again.
        match unsafe {
            result::graph::instantiate(
                graph,
                sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            )
        } {
            Ok(exec) => Ok(Recording { graph, exec }),
            Err(e) => {
                // SAFETY: as above.
                let _ = unsafe { result::graph::destroy(graph) };
                Err(format!("instantiating: {e:?}"))
            }
        }
    }

    /// Launches a recorded step on the device's stream.
    fn launch_recording(&self, g: &Recording, what: &str) -> Result<()> {
        self.stream()
            .context()
            .bind_to_thread()
            .map_err(|e| err(what, e))?;
        // SAFETY: `g.exec` is a live executable graph; the stream belongs to its context.
        unsafe { result::graph::launch(g.exec, self.stream().cu_stream()) }
            .map_err(|e| err(what, e))
    }
}
