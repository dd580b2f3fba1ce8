//! L2 prefetch of a later product's weights inside recorded decode steps.
//!
//! A batch-1 decode step is a chain of small dependent kernels: while the norms, the Q/K/V
//! preparation, attention and every kernel's ramp and tail run, the memory system stands
//! mostly idle, and each product then streams its weights from DRAM on the step's critical
//! path. So in a recorded step each product's kernel first asks L2 to fetch the weights of the
//! product `distance` places after it (`l2_prefetch` in kernels.cu, the sm_90 bulk prefetch):
//! those arrive while the kernels in between run, and that product reads them from L2.
//!
//! Which product comes next is learned, not declared: the eager pass that warms a step's
//! shape (graph.rs) lists the weights its products read, in order; the recording of that shape
//! looks each product up by its place in that list and stops prefetching at the first product
//! that differs from it. The list comes from the same model instance, whose weights are alive
//! while its steps are recorded. A prefetch is a hint: a stale one costs bandwidth, never a
//! wrong value. `LATTICE_CUDA_PREFETCH=N` sets the distance (default 1; 0 turns it off).

use std::collections::HashMap;
use std::sync::Mutex;

use super::graph::Key;
use super::CudaDevice;

/// Bytes one product's kernel prefetches at most (the LM head after the last layer is larger
/// than L2; its first part is what arrives in time).
const MAX_BYTES: usize = 16 << 20;

/// The weights (address, bytes) of a pass's products, in launch order.
type Order = Vec<(u64, usize)>;

/// Learned product orders of the shapes being warmed and recorded.
#[derive(Default)]
struct Orders {
    /// The pass that warms a shape: its products so far.
    learning: Option<(Key, Order)>,
    /// Warmed shapes' orders, waiting for their recording.
    learned: HashMap<Key, Order>,
    /// The recording in progress: its order, the next product's place, whether the products
    /// so far matched the order.
    playing: Option<(Order, usize, bool)>,
}

/// The prefetch distance and the orders (one per device).
pub(super) struct Prefetch {
    distance: usize,
    orders: Mutex<Orders>,
}

impl Prefetch {
    /// The distance from `LATTICE_CUDA_PREFETCH` (default 1), 0 where the device has no bulk
    /// prefetch (compute capability below 9.0).
    pub(super) fn new(compute_major: i32) -> Self {
        let distance = std::env::var("LATTICE_CUDA_PREFETCH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let distance = if compute_major >= 9 { distance } else { 0 };
        if super::graph::tracing() {
            eprintln!("cuda: recorded steps prefetch weights {distance} product(s) ahead");
        }
        Prefetch {
            distance,
            orders: Mutex::default(),
        }
    }

    /// The eager pass warming shape `key` starts: its products' weights are listed.
    pub(super) fn learn(&self, key: Key) {
        if let (Ok(mut o), true) = (self.orders.lock(), self.distance > 0) {
            o.learning = Some((key, Vec::new()));
        }
    }

    /// The recording of shape `key` starts: its products follow the learned order.
    pub(super) fn play(&self, key: Key) {
        if let Ok(mut o) = self.orders.lock() {
            o.playing = o.learned.remove(&key).map(|order| (order, 0, true));
        }
    }

    /// The warming or recording pass ended (`keep`: the warming pass succeeded).
    pub(super) fn end(&self, keep: bool) {
        if let Ok(mut o) = self.orders.lock() {
            if let Some((key, order)) = o.learning.take() {
                if keep {
                    o.learned.insert(key, order);
                }
            }
            o.playing = None;
        }
    }

    /// Forgets every learned order (the recordings were dropped).
    pub(super) fn clear(&self) {
        if let Ok(mut o) = self.orders.lock() {
            o.learned.clear();
        }
    }

    /// A product reading `bytes` at `w` is launched now: the range its kernel prefetches,
    /// (address, bytes a multiple of 16), or (0, 0).
    pub(super) fn target(&self, w: u64, bytes: usize) -> (u64, i64) {
        let none = (0, 0);
        if self.distance == 0 {
            return none;
        }
        let Ok(mut o) = self.orders.lock() else {
            return none;
        };
        if let Some((_, order)) = o.learning.as_mut() {
            order.push((w, bytes));
            return none;
        }
        let distance = self.distance;
        let Some((order, at, matched)) = o.playing.as_mut() else {
            return none;
        };
        let i = *at;
        *at += 1;
        *matched &= order.get(i) == Some(&(w, bytes));
        match order.get(i + distance) {
            Some(&(p, b)) if *matched => (p, (b.min(MAX_BYTES) & !15) as i64),
            _ => none,
        }
    }
}

impl CudaDevice {
    /// The range a product's kernel reading `bytes` of weights at `w` prefetches into L2
    /// (address 0: none); see the module comment.
    pub(super) fn prefetch_for(&self, w: u64, bytes: usize) -> (u64, i64) {
        if self.replaying() {
            return (0, 0);
        }
        self.graphs.prefetch.target(w, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_distance(distance: usize) -> Prefetch {
        Prefetch {
            distance,
            orders: Mutex::default(),
        }
    }

    #[test]
    fn a_recording_prefetches_the_learned_successor_until_it_differs() {
        let p = with_distance(1);
        let key = (7, 1);
        // Outside a warming or recording pass nothing is prefetched.
        assert_eq!(p.target(100, 64), (0, 0));
        p.learn(key);
        for (w, b) in [(100, 64), (200, 40 << 20), (300, 33), (400, 16)] {
            assert_eq!(p.target(w, b), (0, 0), "warming passes only learn");
        }
        p.end(true);
        p.play(key);
        assert_eq!(p.target(100, 64), (200, (16 << 20) as i64), "capped");
        assert_eq!(p.target(200, 40 << 20), (300, 32), "a multiple of 16");
        // A product that is not the learned one stops the prefetches of this recording.
        assert_eq!(p.target(999, 33), (0, 0));
        assert_eq!(p.target(400, 16), (0, 0));
        p.end(false);
        // The order was used up by its recording.
        p.play(key);
        assert_eq!(p.target(100, 64), (0, 0));
    }

    #[test]
    fn distance_two_skips_a_product_and_zero_turns_it_off() {
        let p = with_distance(2);
        p.learn((1, 1));
        for w in [16, 32, 48] {
            p.target(w, 1024);
        }
        p.end(true);
        p.play((1, 1));
        assert_eq!(p.target(16, 1024), (48, 1024));
        assert_eq!(p.target(32, 1024), (0, 0), "nothing two places after");
        p.end(false);

        let off = with_distance(0);
        off.learn((1, 1));
        off.target(16, 1024);
        off.end(true);
        off.play((1, 1));
        assert_eq!(off.target(16, 1024), (0, 0));
        // A failed warming pass keeps no order.
        let p = with_distance(1);
        p.learn((2, 1));
        p.target(16, 1024);
        p.target(32, 1024);
        p.end(false);
        p.play((2, 1));
        assert_eq!(p.target(16, 1024), (0, 0));
    }
}
