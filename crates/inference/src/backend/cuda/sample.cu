// ---------------------------------------------------------------------------------------------
// Picking tokens where the logits are (sample/pick.rs, backend/cuda/sample.rs): a group of
// blocks per row (one block, or on compute capability 9.0 a cluster of 8 blocks, each
// over a slice of the row) runs the CPU sampler's steps over the row in passes and writes only
// the chosen id. Every step is the CPU's arithmetic, so the same logits give the same token:
//   - the exponential is processors::exp_neg with IEEE-rounded operations (no FMA contraction);
//   - weights become integer units of 2^-40 (processors::units), so every sum is exact in any
//     order (and any split of the row);
//   - the k best and the nucleus are found by radix selection over order-preserving keys of the
//     logits (ties to the lower id, -0 as 0), which has one answer as the CPU's sorts do.
// The row of logits is modified in place (bias, sanitizing, penalties).

// One row's parameters (backend/cuda/sample.rs `PickRow`, 48 bytes).
struct PickRow {
    float t;
    unsigned top_k;
    float top_p;
    float min_p;
    double u;
    unsigned bias0, bias_n;  // the row's logit-bias pairs in `pairs`, applied in order
    unsigned pen0, pen_n;    // the row's penalty pairs in `pairs` (distinct ids)
    float rep;
    unsigned pad;
};

struct IdValue {
    unsigned id;
    float v;
};

#define PICK_THREADS 1024
#define PICK_WARPS (PICK_THREADS / 32)
// The top bit of an output id: the random draw was used.
#define PICK_DREW 0x80000000u

typedef unsigned long long u64_t;

// processors::exp_neg, operation for operation.
__device__ __forceinline__ float pick_exp_neg(float x) {
    const bool live = x > -87.0f;
    const float xc = live ? fminf(x, 0.0f) : -87.0f;
    const float LOG2E = __int_as_float(0x3fb8aa3b);
    const float LN2_HI = __int_as_float(0x3f317200);
    const float LN2_LO = __int_as_float(0x35bfbe8e);
    const float ROUND = 12582912.0f;
    const float kr = __fadd_rn(__fmul_rn(xc, LOG2E), ROUND);
    const float k = __fsub_rn(kr, ROUND);
    const int ki = __float_as_int(kr) - __float_as_int(ROUND);
    const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(k, LN2_HI)), __fmul_rn(k, LN2_LO));
    float p = __fadd_rn(1.0f / 120.0f, __fmul_rn(r, 1.0f / 720.0f));
    p = __fadd_rn(1.0f / 24.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f / 6.0f, __fmul_rn(r, p));
    p = __fadd_rn(0.5f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    const float scale = __int_as_float((ki + 127) << 23);
    return live ? __fmul_rn(p, scale) : 0.0f;
}

// processors::units.
__device__ __forceinline__ u64_t pick_units(float w) {
    return (u64_t)__dmul_rn((double)w, 1099511627776.0);
}

// An order-preserving key of a (non-NaN) logit: larger logits, larger keys; -0 as 0.
__device__ __forceinline__ unsigned pick_key(float x) {
    const unsigned b = __float_as_uint(__fadd_rn(x, 0.0f));
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u64_t warp_sum_u64(u64_t v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (every thread gets it); `scratch` holds 32 values.
__device__ u64_t pick_block_sum(u64_t v, u64_t* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < PICK_WARPS ? scratch[lane] : 0ull;
    return warp_sum_u64(v);
}

// Largest value over the block (every thread gets it).
__device__ float pick_block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < PICK_WARPS ? scratch[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The blocks that pick one row together: `size` blocks (1, or a cluster on compute
// capability 9.0), block `rank` over the slice [lo, hi) of the row. A cluster's blocks
// exchange partial results through distributed shared memory: each block writes its own to its
// shared memory, the cluster meets at a barrier, every block reads all of them in rank order
// (the same answer in each block), and the cluster meets again before those slots change (so
// no block leaves while another still reads it). Cluster size: sample.rs `PICK_CLUSTER`.
struct PickGroup {
    unsigned rank, size;
    int lo, hi;
};

// Every thread of every block of the cluster (release / acquire at cluster scope).
__device__ __forceinline__ void pick_cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                 ::: "memory");
#endif
}

// The cluster address of `p` (in this block's shared memory) in block `rank`'s.
__device__ __forceinline__ unsigned pick_cluster_addr(const void* p, unsigned rank) {
    unsigned r = (unsigned)__cvta_generic_to_shared(p);
#if __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %0, %1;" : "+r"(r) : "r"(rank));
#endif
    return r;
}

// `*p` (in this block's shared memory) as block `rank` of the cluster holds it.
__device__ __forceinline__ u64_t pick_remote_u64(const u64_t* p, unsigned rank) {
    u64_t v = *p;
#if __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(pick_cluster_addr(p, rank))
                 : "memory");
#endif
    return v;
}
__device__ __forceinline__ unsigned pick_remote_u32(const unsigned* p, unsigned rank) {
    unsigned v = *p;
#if __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(pick_cluster_addr(p, rank))
                 : "memory");
#endif
    return v;
}

// One block's slot of the exchanges.
struct PickSlot {
    u64_t u;
    unsigned a, b;
};

// The group's total of the blocks' totals `v` (each block's, the same in all its threads).
__device__ u64_t group_sum(const PickGroup& g, u64_t v, PickSlot* slot) {
    if (g.size == 1) return v;
    if (threadIdx.x == 0) slot->u = v;
    pick_cluster_sync();
    u64_t t = 0;
    for (unsigned r = 0; r < g.size; ++r) t += pick_remote_u64(&slot->u, r);
    pick_cluster_sync();
    return t;
}

// f folded over the blocks' 32-bit values `v`, in rank order from `init`.
template <class F>
__device__ unsigned group_fold32(const PickGroup& g, unsigned v, unsigned init, PickSlot* slot,
                                 F f) {
    if (threadIdx.x == 0) slot->a = v;
    pick_cluster_sync();
    for (unsigned r = 0; r < g.size; ++r) init = f(init, pick_remote_u32(&slot->a, r));
    pick_cluster_sync();
    return init;
}

// The group's largest of the blocks' largest values `v`.
__device__ float group_max(const PickGroup& g, float v, PickSlot* slot) {
    if (g.size == 1) return v;
    return __uint_as_float(group_fold32(g, __float_as_uint(v), __float_as_uint(-INFINITY), slot,
        [](unsigned a, unsigned b) {
            return __float_as_uint(fmaxf(__uint_as_float(a), __uint_as_float(b)));
        }));
}

// The group's smallest of the blocks' values `v` (non-negative).
__device__ int group_min(const PickGroup& g, int v, PickSlot* slot) {
    if (g.size == 1) return v;
    return (int)group_fold32(g, (unsigned)v, (unsigned)v, slot,
                             [](unsigned a, unsigned b) { return min(a, b); });
}

// The group's best (value, index) of the blocks' bests, held by thread 0 (block_argmax's),
// in thread 0.
__device__ void group_argmax(const PickGroup& g, float& v, int& bi, PickSlot* slot) {
    if (g.size == 1) return;
    if (threadIdx.x == 0) { slot->a = __float_as_uint(v); slot->b = (unsigned)bi; }
    pick_cluster_sync();
    if (threadIdx.x == 0) {
        for (unsigned r = 0; r < g.size; ++r)
            arg_better(v, bi, __uint_as_float(pick_remote_u32(&slot->a, r)),
                       (int)pick_remote_u32(&slot->b, r));
    }
    pick_cluster_sync();
}

// Loads per thread in flight in a pass over a row.
#define PICK_ILP 8

// Calls f(i, x[i], w[i]) for every index i of [lo, n) the calling thread owns (w may be null:
// 0 then), PICK_ILP loads of each array in flight. Not warp-uniform at the end of the range.
template <class F>
__device__ __forceinline__ void pick_for(const float* xr, const float* wr, int lo, int n, F f) {
    const int step = blockDim.x;
    int i = lo + (int)threadIdx.x;
    for (; i + (PICK_ILP - 1) * step < n; i += PICK_ILP * step) {
        float v[PICK_ILP], w[PICK_ILP];
#pragma unroll
        for (int j = 0; j < PICK_ILP; ++j) {
            v[j] = xr[i + j * step];
            w[j] = wr ? wr[i + j * step] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < PICK_ILP; ++j) f(i + j * step, v[j], w[j]);
    }
    for (; i < n; i += step) f(i, xr[i], wr ? wr[i] : 0.0f);
}

// Inclusive scan over the block of one u64 per thread; every thread gets its inclusive sum.
__device__ u64_t pick_block_scan(u64_t v, u64_t* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const u64_t y = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += y;
    }
    __syncthreads();
    if (lane == 31) scratch[warp] = v;
    __syncthreads();
    u64_t before = 0;
    for (int w = 0; w < warp; ++w) before += scratch[w];
    return before + v;
}

// The first index i (in index order) at which the running sum of val(i, x[i], w[i]) over
// [0, n) exceeds r; n when it never does. Coarse: each warp sums a contiguous segment of the
// block's slice (its lanes reading in step, PICK_ILP loads in flight); the group's blocks
// exchange their slices' sums and the block whose slice holds the crossing finds the segment
// that does; fine: that block splits the segment into one contiguous piece per thread, scans
// the pieces' sums, and the thread whose piece holds the crossing walks it. Every thread of
// the group gets the index.
template <class F>
__device__ int pick_first_over(const float* xr, const float* wr, const PickGroup& g, int n,
                               u64_t r, F val, u64_t* seg, int* found, PickSlot* slot) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int span = (g.hi - g.lo + PICK_WARPS - 1) / PICK_WARPS;
    {
        const int lo = min(g.hi, g.lo + warp * span), hi = min(g.hi, lo + span);
        u64_t s = 0;
        int i = lo + lane;
        for (; i + (PICK_ILP - 1) * 32 < hi; i += PICK_ILP * 32) {
            float v[PICK_ILP], w[PICK_ILP];
#pragma unroll
            for (int j = 0; j < PICK_ILP; ++j) {
                v[j] = xr[i + j * 32];
                w[j] = wr ? wr[i + j * 32] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < PICK_ILP; ++j) s += val(i + j * 32, v[j], w[j]);
        }
        for (; i < hi; i += 32) s += val(i, xr[i], wr ? wr[i] : 0.0f);
        s = warp_sum_u64(s);
        __syncthreads();
        if (lane == 0) seg[warp] = s;
        __syncthreads();
    }
    // What the slices before this block's add up to.
    u64_t before = 0;
    if (g.size > 1) {
        u64_t mine = 0;
        for (int w = 0; w < PICK_WARPS; ++w) mine += seg[w];
        if (threadIdx.x == 0) slot->u = mine;
        pick_cluster_sync();
        for (unsigned q = 0; q < g.rank; ++q) before += pick_remote_u64(&slot->u, q);
        pick_cluster_sync();
    }
    // The segment holding the crossing, when this block's slice holds it (every thread of the
    // block finds the same one).
    int sw = PICK_WARPS;
    if (r >= before) {
        for (int w = 0; w < PICK_WARPS; ++w) {
            if (r < before + seg[w]) { sw = w; break; }
            before += seg[w];
        }
    }
    int at = n;
    if (sw < PICK_WARPS) {
        const int lo = min(g.hi, g.lo + sw * span), hi = min(g.hi, lo + span);
        const int piece = (hi - lo + (int)blockDim.x - 1) / (int)blockDim.x;
        const int plo = min(hi, lo + (int)threadIdx.x * piece), phi = min(hi, plo + piece);
        u64_t mine = 0;
        for (int i = plo; i < phi; ++i) mine += val(i, xr[i], wr ? wr[i] : 0.0f);
        const u64_t incl = pick_block_scan(mine, seg);
        if (threadIdx.x == 0) *found = n;
        __syncthreads();
        u64_t acc = before + incl - mine;
        if (r >= acc && r < acc + mine) {
            for (int i = plo; i < phi; ++i) {
                acc += val(i, xr[i], wr ? wr[i] : 0.0f);
                if (r < acc) { *found = i; break; }
            }
        }
        __syncthreads();
        at = *found;
    }
    return group_min(g, at, slot);
}

// Per-warp histograms of one radix pass (dynamic shared memory): counts and unit sums by
// digit, PICK_WARPS x 256 each, then the block's totals and the group's.
struct PickHist {
    unsigned n[PICK_WARPS][256];
    u64_t s[PICK_WARPS][256];
    unsigned tn[256];
    u64_t ts[256];
    unsigned gn[256];
    u64_t gs[256];
};

// Radix selection, best first, over the keys of the members of the row (the group's blocks each
// counting their slice, the counts summed over the group): the key K at which
// the running amount (amount(i, x, w) of each member i), taken over members in decreasing key
// order, first satisfies `enough(total)`; `*above` gets the amount of the members with keys
// above K, `*at` the amount of those at K and `*ties` their count. Four passes of 8 bits; each
// warp counts into its own histogram, and each thread adds a run of equal digits at once
// (logits crowd into few digits in the first passes: collectives or an atomic per value made
// these passes ~100 us on an H200).
template <class Member, class Amount, class Enough>
__device__ unsigned pick_select(const float* xr, const float* wr, const PickGroup& g,
                                Member member, Amount amount, Enough enough, u64_t* above,
                                u64_t* at, unsigned* ties, PickHist* h, unsigned* sel) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned prefix = 0, mask = 0;
    u64_t acc = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = lane; b < 256; b += 32) { h->n[warp][b] = 0; h->s[warp][b] = 0; }
        __syncwarp();
        unsigned run_d = 256, run_n = 0;
        u64_t run_s = 0;
        pick_for(xr, wr, g.lo, g.hi, [&](int i, float v, float w) {
            if (!member(i, v)) return;
            const unsigned key = pick_key(v);
            if ((key & mask) != prefix) return;
            const unsigned d = (key >> shift) & 255u;
            if (d != run_d) {
                if (run_n) {
                    atomicAdd(&h->n[warp][run_d], run_n);
                    atomicAdd(&h->s[warp][run_d], run_s);
                }
                run_d = d;
                run_n = 0;
                run_s = 0;
            }
            ++run_n;
            run_s += amount(i, v, w);
        });
        if (run_n) {
            atomicAdd(&h->n[warp][run_d], run_n);
            atomicAdd(&h->s[warp][run_d], run_s);
        }
        __syncthreads();
        for (int b = threadIdx.x; b < 256; b += blockDim.x) {
            unsigned cn = 0;
            u64_t cs = 0;
            for (int w = 0; w < PICK_WARPS; ++w) { cn += h->n[w][b]; cs += h->s[w][b]; }
            h->tn[b] = cn;
            h->ts[b] = cs;
        }
        __syncthreads();
        const unsigned* tn = h->tn;
        const u64_t* ts = h->ts;
        if (g.size > 1) {
            pick_cluster_sync();
            for (int b = threadIdx.x; b < 256; b += blockDim.x) {
                unsigned cn = 0;
                u64_t cs = 0;
                for (unsigned r = 0; r < g.size; ++r) {
                    cn += pick_remote_u32(&h->tn[b], r);
                    cs += pick_remote_u64(&h->ts[b], r);
                }
                h->gn[b] = cn;
                h->gs[b] = cs;
            }
            pick_cluster_sync();  // every block has read the totals (and its gn, gs are set)
            tn = h->gn;
            ts = h->gs;
        }
        if (threadIdx.x == 0) {
            int pick = -1;
            for (int b = 255; b >= 0; --b) {
                if (tn[b] == 0) continue;
                if (enough(acc + ts[b])) { pick = b; break; }
                acc += ts[b];
            }
            // Not reached when the amounts can satisfy `enough`: the last non-empty bin.
            for (int b = 0; b < 256 && pick < 0; ++b)
                if (tn[b]) { pick = b; acc -= ts[b]; }
            sel[0] = (unsigned)pick;
            sel[1] = tn[pick];
            *at = ts[pick];
        }
        __syncthreads();
        prefix |= sel[0] << shift;
        mask |= 255u << shift;
    }
    if (threadIdx.x == 0) *above = acc;
    *ties = sel[1];
    __syncthreads();
    return prefix;
}

// Picks the token of each row of x [rows, n] by rows[r] (sample::Pick): out[r] is the id, with
// PICK_DREW set when the random draw was used. w [rows, n] is scratch for the weights.
// Grid: rows x group blocks, `group` (1, or sample.rs' PICK_CLUSTER launched as clusters of
// that many on compute capability 9.0) picking each row; block: PICK_THREADS; dynamic shared
// memory: sizeof(PickHist).
extern "C" __global__ void __launch_bounds__(PICK_THREADS)
pick_rows(float* x, float* w, const PickRow* rows, const IdValue* pairs, unsigned* out, int n,
          int group) {
    DEP_ENTER();
    extern __shared__ __align__(16) unsigned char pick_smem[];
    PickHist* hist = (PickHist*)pick_smem;
    __shared__ float fscratch[32];
    __shared__ u64_t uscratch[32];
    __shared__ u64_t seg[32];
    __shared__ unsigned sel[2];
    __shared__ u64_t above, at;
    __shared__ int found;
    __shared__ PickSlot slot;
    // In shared memory, not registers (a block of PICK_THREADS threads has 64 a thread).
    __shared__ PickGroup g;
    const int row = blockIdx.x / group;
    if (threadIdx.x == 0) {
        g.size = (unsigned)group;
        g.rank = blockIdx.x - row * group;
        const int chunk = (n + group - 1) / group;
        g.lo = min(n, (int)g.rank * chunk);
        g.hi = min(n, g.lo + chunk);
    }
    __syncthreads();
    const bool leader = g.rank == 0 && threadIdx.x == 0;  // writes the row's id
    const PickRow P = rows[row];
    float* xr = x + (size_t)row * n;
    float* wr = w + (size_t)row * n;
    const int tid = threadIdx.x;
    const float* none = nullptr;
    auto mine = [&](unsigned id) { return id >= (unsigned)g.lo && id < (unsigned)g.hi; };

    // The logit bias, pair after pair (each block applies those in its slice).
    if (tid == 0)
        for (unsigned j = 0; j < P.bias_n; ++j) {
            const IdValue b = pairs[P.bias0 + j];
            if (mine(b.id)) xr[b.id] = __fadd_rn(xr[b.id], b.v);
        }
    __syncthreads();
    // The largest logit (NaN ignored), whether there is NaN, and how many are above -inf.
    float m = -INFINITY;
    int nan = 0;
    u64_t count = 0;
    pick_for(xr, none, g.lo, g.hi, [&](int, float v, float) {
        m = fmaxf(m, v);  // fmaxf ignores NaN
        nan |= v != v;
        count += v > -INFINITY;
    });
    m = group_max(g, pick_block_max(m, fscratch), &slot);
    nan = group_sum(g, (u64_t)__syncthreads_or(nan), &slot) != 0;
    count = group_sum(g, pick_block_sum(count, uscratch), &slot);
    const bool inf_mode = m == INFINITY;
    // Sanitize: NaN as -inf; when some logit is +inf, those become 0 and the rest -inf.
    if (inf_mode || nan) {
        for (int i = g.lo + tid; i < g.hi; i += blockDim.x) {
            const float v = xr[i];
            xr[i] = inf_mode ? (v == INFINITY ? 0.0f : -INFINITY) : (v != v ? -INFINITY : v);
        }
        __syncthreads();
    }
    // Penalties (distinct ids).
    for (unsigned j = tid; j < P.pen_n; j += blockDim.x) {
        const IdValue e = pairs[P.pen0 + j];
        if (!mine(e.id)) continue;
        const float v = xr[e.id];
        const float y = v > 0.0f ? __fdiv_rn(v, P.rep) : __fmul_rn(v, P.rep);
        xr[e.id] = __fsub_rn(y, e.v);
    }
    __syncthreads();

    // Greedy: the first largest value (0 when there is none).
    if (P.top_k == 1u || !(P.t > 0.0f)) {
        float v = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = g.lo + tid; i < g.hi; i += blockDim.x) {
            const float t = xr[i];
            if (t > v) { v = t; bi = i; }
        }
        block_argmax(v, bi);
        group_argmax(g, v, bi, &slot);
        if (leader) out[row] = bi == 0x7fffffff ? 0u : (unsigned)bi;
        return;
    }

    // Candidates: the finite logits; their largest value and count, again if the row changed.
    if (inf_mode || P.pen_n > 0) {
        m = -INFINITY;
        count = 0;
        pick_for(xr, none, g.lo, g.hi, [&](int, float v, float) {
            if (v > -INFINITY) { m = fmaxf(m, v); ++count; }
        });
        m = group_max(g, pick_block_max(m, fscratch), &slot);
        count = group_sum(g, pick_block_sum(count, uscratch), &slot);
    }
    if (m == -INFINITY) {  // nothing drawable: the argmax of all -inf, id 0, no draw
        if (leader) out[row] = 0u;
        return;
    }
    // Every candidate's weight exp((x - max) / t), once (x / 1 is x: no division then), and
    // the candidates' total units.
    const float t = P.t;
    u64_t total_all = 0;
    pick_for(xr, none, g.lo, g.hi, [&](int i, float v, float) {
        const float d = __fsub_rn(v, m);
        const float wi = v > -INFINITY ? pick_exp_neg(t == 1.0f ? d : __fdiv_rn(d, t)) : 0.0f;
        wr[i] = wi;
        total_all += pick_units(wi);
    });
    total_all = group_sum(g, pick_block_sum(total_all, uscratch), &slot);
    __syncthreads();
    auto finite = [&](int, float v) { return v > -INFINITY; };

    // Top-k: keys above kk, and the first tie_k ties at kk in id order.
    unsigned kk = 0;
    int tie_k = n;
    const bool use_k = P.top_k > 0u && (u64_t)P.top_k < count;
    if (use_k) {
        const u64_t k = P.top_k;
        unsigned ties;
        kk = pick_select(xr, none, g, finite, [&](int, float, float) { return 1ull; },
                         [&](u64_t a) { return a >= k; }, &above, &at, &ties, hist, sel);
        const u64_t take = k - above;
        if (take < ties) {
            tie_k = pick_first_over(
                xr, none, g, n, take - 1,
                [&](int, float v, float) {
                    return (u64_t)(v > -INFINITY && pick_key(v) == kk);
                },
                seg, &found, &slot);
        }
    }
    auto in_k = [&](int i, float v) {
        if (!(v > -INFINITY)) return false;
        const unsigned key = pick_key(v);
        return key > kk || (key == kk && i <= tie_k);
    };

    // Top-p: keys above kp, and the first tie_p ties at kp in id order.
    unsigned kp = 0;
    int tie_p = n;
    u64_t total = total_all;  // the kept units (passes only where they are not known)
    if (use_k) {
        total = 0;
        pick_for(xr, wr, g.lo, g.hi, [&](int i, float v, float wi) {
            if (in_k(i, v)) total += pick_units(wi);
        });
        total = group_sum(g, pick_block_sum(total, uscratch), &slot);
    }
    if (P.top_p < 1.0f) {
        const float p = fmaxf(P.top_p, 0.0f);
        const double target = __dmul_rn((double)p, (double)total);
        unsigned ties;
        kp = pick_select(xr, wr, g, in_k,
                         [&](int, float, float wi) { return pick_units(wi); },
                         [&](u64_t a) { return (double)a >= target; }, &above, &at, &ties,
                         hist, sel);
        // Every tie has the same weight: the fewest of them that reach the target.
        const u64_t a0 = above, unit = at / ties;
        const auto reach = [&](u64_t c) { return (double)(a0 + c * unit) >= target; };
        u64_t c = 1;
        if (!reach(1)) {
            const double need = ceil((target - (double)a0) / (double)unit);
            c = need < 1.0 ? 1ull : (need > (double)ties ? (u64_t)ties : (u64_t)need);
            while (c > 1 && reach(c - 1)) --c;
            while (c < ties && !reach(c)) ++c;
        }
        if (c < ties) {
            tie_p = pick_first_over(
                xr, none, g, n, c - 1,
                [&](int i, float v, float) {
                    return (u64_t)(in_k(i, v) && pick_key(v) == kp);
                },
                seg, &found, &slot);
        }
        total = a0 + c * unit;
    }
    const float min_p = P.min_p;
    const bool use_min_p = min_p > 0.0f && min_p <= 1.0f;
    auto kept_units = [&](int i, float v, float wi) -> u64_t {
        if (!in_k(i, v)) return 0ull;
        const unsigned key = pick_key(v);
        if (!(key > kp || (key == kp && i <= tie_p))) return 0ull;
        if (use_min_p && !(wi >= min_p || wi == 1.0f)) return 0ull;
        return pick_units(wi);
    };
    if (use_min_p) {
        total = 0;
        pick_for(xr, wr, g.lo, g.hi, [&](int i, float v, float wi) {
            total += kept_units(i, v, wi);
        });
        total = group_sum(g, pick_block_sum(total, uscratch), &slot);
    }

    // The draw: the first id, in id order, whose running units exceed r.
    if (total == 0) {  // not reached: the best token keeps its full weight
        if (leader) out[row] = PICK_DREW;
        return;
    }
    u64_t r = (u64_t)__dmul_rn(P.u, (double)total);
    if (r > total - 1) r = total - 1;
    const int id = pick_first_over(xr, wr, g, n, r, kept_units, seg, &found, &slot);
    if (leader) out[row] = (unsigned)id | PICK_DREW;
}
