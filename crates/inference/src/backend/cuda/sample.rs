//! Launcher of sample.cu: picking each row's token where the logits are ([`Pick`]), so that a
//! step sends back ids, not logits. The kernel runs the CPU sampler's arithmetic
//! ([`Pick::choose`]); tests/cuda_ops.rs holds the two to the same token.

use cudarc::driver::LaunchConfig;

use super::{CudaDevice, Input};
use crate::sample::Pick;
use crate::Result;

/// Threads of a pick block (`PICK_THREADS` in sample.cu).
const PICK_THREADS: u32 = 1024;

/// Dynamic shared memory of a pick block (`sizeof(PickHist)` in sample.cu): per-warp counts
/// (u32) and unit sums (u64) of 256 digits, and the block's and its group's totals.
pub(super) const PICK_SMEM_BYTES: usize = 32 * 256 * (4 + 8) + 2 * 256 * (4 + 8);

/// Blocks of a cluster that pick one row together (sample.cu's `pick_rows` takes it as its
/// `group` argument).
pub(super) const PICK_CLUSTER: usize = 8;

/// One row's parameters as the kernel reads them (`PickRow` in sample.cu, 48 bytes): t,
/// top_k, top_p, min_p, u (an f64, low word first), bias0, bias_n, pen0, pen_n, rep, pad.
type PickRow = [u32; 12];

/// The rows' parameters and their (id, value) pairs: each row's logit bias, then its penalty
/// entries.
fn pick_inputs(picks: &[Pick]) -> (Vec<PickRow>, Vec<[u32; 2]>) {
    let mut pairs: Vec<[u32; 2]> = Vec::new();
    let rows = picks
        .iter()
        .map(|p| {
            let bias0 = pairs.len() as u32;
            pairs.extend(p.bias.iter().map(|&(id, v)| [id, v.to_bits()]));
            let pen0 = pairs.len() as u32;
            pairs.extend(p.penalized.iter().map(|&(id, v)| [id, v.to_bits()]));
            let f = &p.filters;
            let u = p.u.to_bits();
            [
                f.temperature.to_bits(),
                f.top_k.min(u32::MAX as usize) as u32,
                f.top_p.to_bits(),
                f.min_p.to_bits(),
                u as u32,
                (u >> 32) as u32,
                bias0,
                p.bias.len() as u32,
                pen0,
                p.penalized.len() as u32,
                p.repetition.to_bits(),
                0,
            ]
        })
        .collect();
    if pairs.is_empty() {
        pairs.push([0, 0]); // a buffer to point at
    }
    (rows, pairs)
}

impl CudaDevice {
    /// Makes room for the pair list of `picks` before a recorded step runs (a replayed step
    /// cannot move its inputs; this may drop the recordings instead).
    pub fn reserve_picks(&self, picks: &[Pick]) -> Result<()> {
        let pairs: usize = picks.iter().map(|p| p.bias.len() + p.penalized.len()).sum();
        self.reserve_input(Input::PickPairs, 8 * pairs.max(1))
    }

    /// Picks the token of each row of x [rows, n] (logits, modified in place) by `picks`,
    /// returning [`crate::sample::Picked::code`]s. While a step is recorded or replayed the
    /// ids go to the device's output and zeros are returned (see [`CudaDevice::graph_step`]).
    pub fn pick_rows(
        &self,
        x: &super::Buf,
        rows: usize,
        n: usize,
        picks: &[Pick],
    ) -> Result<Vec<u32>> {
        assert!(x.len() >= rows * n && n > 0 && picks.len() == rows);
        if rows == 0 {
            return Ok(Vec::new());
        }
        let po = self.output(rows)?;
        let (params, pairs) = pick_inputs(picks);
        let pp = self.input(Input::PickRows, &params)?;
        let pq = self.input(Input::PickPairs, &pairs)?;
        if self.replaying() {
            return Ok(vec![0; rows]); // the recording writes the output
        }
        let mut w = self.alloc_buf(rows * n)?;
        let px = self.ptr(x);
        let pw = self.mptr(&mut w);
        // Fewer rows than multiprocessors leave most of them idle with a block per row (a
        // batch-1 top-p pick took ~0.4 ms on one): a cluster of blocks takes each row, each
        // over a slice, where clusters launch (compute capability 9.0).
        let group = if rows <= self.pick_cluster_rows() {
            PICK_CLUSTER
        } else {
            1
        };
        let (n_i, g_i) = (n as i32, group as i32);
        let mut b = self.args(&self.kernels().pick_rows);
        b.arg(&px)
            .arg(&pw)
            .arg(&pp)
            .arg(&pq)
            .arg(&po)
            .arg(&n_i)
            .arg(&g_i);
        let cfg = LaunchConfig {
            grid_dim: ((rows * group) as u32, 1, 1),
            block_dim: (PICK_THREADS, 1, 1),
            shared_mem_bytes: PICK_SMEM_BYTES as u32,
        };
        // SAFETY: the blocks of row r (`group` of them, launched as one cluster when more
        // than one) read and write row r of x and of w (both [rows, n]), each its own slice,
        // read params[r] and the pairs it names (uploaded above, ids checked against the
        // slice in the kernel), and the first writes output[r] (the output holds `rows`).
        unsafe { self.go_clusters(&mut b, cfg, group as u32, "pick_rows") }?;
        drop(w);
        if self.graph_mode() {
            return Ok(vec![0; rows]);
        }
        self.read_output(rows)
    }
}
