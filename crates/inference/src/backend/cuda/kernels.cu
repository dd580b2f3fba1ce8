// Lattice's CUDA kernels, compiled at run time by NVRTC (backend/cuda/device.rs) for the
// device's own architecture. Plain CUDA C with no headers: bf16 and f16 are handled as their
// bit patterns. Every kernel computes what the CPU backend computes (same formulas, f32
// arithmetic, no fast-math), so op-parity tests compare them by normalized error.
//
// Conventions: activations are f32 row-major [rows, width]; `rows` is gridDim.x unless said;
// device pointers to pages arrive as 64-bit integers.

typedef unsigned short bf16_t;
typedef unsigned short f16_t;
typedef unsigned long long u64;

#define INFINITY __int_as_float(0x7f800000)

// Programmatic dependent launch (compute capability 9.0 and later; backend/cuda/launch.rs):
// a kernel may be started while the kernel before it in the stream is still running. Every
// kernel therefore begins with DEP_ENTER: let the next kernel start (it waits in turn), then
// wait until the kernels before it have finished and their writes are visible. Only reads of
// what no kernel of the step writes may come before it: weights (the matrix-vector product's
// first loads), step inputs, and key and value rows of earlier steps (decode attention's
// staging). Without the launch attribute both instructions return at once. Triggering before
// the wait lets the next kernel's blocks start (and load their weights) while this one waits
// (H100, 2026-12-06: batch-1 step 0.966 -> 0.950 ms); compiled with LATTICE_LATE_TRIGGER
// (`LATTICE_CUDA_EARLY_TRIGGER=0`) a kernel triggers only after its own wait.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LATTICE_LATE_TRIGGER)
#define DEP_SYNC()                                                 \
    do {                                                           \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
        asm volatile("griddepcontrol.wait;" ::: "memory");         \
    } while (0)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DEP_SYNC()                                                 \
    do {                                                           \
        asm volatile("griddepcontrol.wait;" ::: "memory");         \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#else
#define DEP_SYNC() do {} while (0)
#endif
// The trigger alone, for a kernel with work to do before its wait (its DEP_ENTER triggers again,
// which changes nothing).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(LATTICE_LATE_TRIGGER)
#define DEP_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define DEP_TRIGGER() do {} while (0)
#endif

#ifdef LATTICE_KERNEL_CLOCK
// A timeline of the kernels of a step, to measure (`LATTICE_CUDA_DEFINES=LATTICE_KERNEL_CLOCK`
// with `LATTICE_CUDA_TRACE=1`; backend/cuda/graph.rs reads and prints it): per launch, in slot
// (grid id mod KCLOCK_SLOTS), the global timer (ns) when its first block started, when its
// first block's wait returned (the kernels before it done), when its last block's did, and its
// grid and block sizes. Before a traced step the host sets the first two of each slot to
// all ones and the others to zero.
#define KCLOCK_SLOTS 2048
extern "C" {
__device__ unsigned long long lattice_clock[KCLOCK_SLOTS][4];
}
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void kclock_mark(unsigned long long t0) {
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        const unsigned long long t1 = global_ns();
        unsigned long long g;
        asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
        unsigned long long* c = lattice_clock[g % KCLOCK_SLOTS];
        atomicMin(c, t0);
        atomicMin(c + 1, t1);
        atomicMax(c + 2, t1);
        c[3] = ((unsigned long long)(gridDim.x * gridDim.y * gridDim.z) << 32)
            | (blockDim.x * blockDim.y * blockDim.z);
    }
}
#define DEP_ENTER()                                                \
    do {                                                           \
        const unsigned long long t0_ = global_ns();                \
        DEP_SYNC();                                                \
        kclock_mark(t0_);                                          \
    } while (0)
#else
#define DEP_ENTER() DEP_SYNC()
#endif

__device__ __forceinline__ float bf16_to_f32(bf16_t x) {
    return __uint_as_float(((unsigned)x) << 16);
}

// Round to nearest even, as the CPU backend's `half::bf16::from_f32` (NaN stays NaN).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float f16_to_f32(f16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ f16_t f32_to_f16(float f) {
    f16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int n_warps = blockDim.x >> 5;
    v = threadIdx.x < n_warps ? part[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) part[0] = v;
    __syncthreads();
    return part[0];
}

// SwiGLU of one value pair: silu(g) * u, as the CPU's silu_mul computes it.
__device__ __forceinline__ float swiglu_value(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// RMSNorm factors of up to R rows from each thread's partial sums of squares ss[j]: summed per
// warp, then the warps' sums in order (a fixed order), rs[j] = 1 / sqrt(sum / k + eps) for
// j < rows, in shared memory. Every thread of the block must call it; ends synchronized.
template <int R>
__device__ void block_rms_factors(const float (&ss)[R], int rows, int k, float eps, float* rs) {
    __shared__ float part[32][R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < R; j++) {
        if (j < rows) {
            const float s = warp_sum(ss[j]);
            if (lane == 0) part[warp][j] = s;
        }
    }
    __syncthreads();
    if ((int)threadIdx.x < rows) {
        float s = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += part[w][threadIdx.x];
        rs[threadIdx.x] = 1.0f / sqrtf(s / (float)k + eps);
    }
    __syncthreads();
}

// y = w * (x / sqrt(mean(x^2) + eps)) per row of `dim` (x == y allowed). Grid: rows.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int dim, float eps) {
    DEP_ENTER();
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* yr = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (xr[i] * r);
}

// LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b per row (x == y allowed). Grid: rows.
extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* y,
                                      int dim, float eps) {
    DEP_ENTER();
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* yr = y + (size_t)blockIdx.x * dim;
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s) / (float)dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float d = xr[i] - mean;
        ss += d * d;
    }
    const float r = 1.0f / sqrtf(block_sum(ss) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] - mean) * r * w[i] + b[i];
}

// Rotate-half RoPE in place over x [rows, n_heads * head_dim]: pairs (i, i + half) of each
// head, i < half, rotated by pos[row] * inv_freq[i]; cos and sin scaled by `attn`. Grid: rows.
extern "C" __global__ void rope(float* x, const int* pos, const float* inv_freq, int n_heads,
                                int head_dim, int half, float attn) {
    DEP_ENTER();
    const float p = (float)pos[blockIdx.x];
    float* xr = x + (size_t)blockIdx.x * n_heads * head_dim;
    for (int t = threadIdx.x; t < n_heads * half; t += blockDim.x) {
        const int h = t / half, i = t - h * half;
        const float angle = p * inv_freq[i];
        const float c = cosf(angle) * attn, s = sinf(angle) * attn;
        float* hp = xr + h * head_dim;
        const float a = hp[i], b = hp[i + half];
        hp[i] = a * c - b * s;
        hp[i + half] = b * c + a * s;
    }
}

// out [rows, width] = silu(gate) * up with gate_up [rows, 2 * width] side by side.
extern "C" __global__ void silu_mul(const float* gate_up, float* out, int width, long long n) {
    DEP_ENTER();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / width, j = i - r * width;
    const float g = gate_up[r * 2 * width + j], u = gate_up[r * 2 * width + width + j];
    out[i] = swiglu_value(g, u);
}

// Exact (erf) GELU in place.
extern "C" __global__ void gelu(float* x, long long n) {
    DEP_ENTER();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

// y [rows, width] += bias [width] per row.
extern "C" __global__ void add_bias(float* y, const float* bias, int width, long long n) {
    DEP_ENTER();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += bias[i % width];
}

// LoRA's low-rank updates (backend/cuda/lowrank.rs), y[r, col + o] += scale · (A v_r) · Bt[:, o]
// for each term of row r, in two launches: `low_rank_shrink` sums A v_r over slices of 256
// inputs (a block per term, slice and 16 rank components: one load of A per thread, issued
// before the wait for the kernel before, whose output v_r is), `low_rank_expand` adds the
// slices' sums and multiplies by Bt (a block per row and column tile). v_r is x's row r with
// the matrix-vector kernel's input mode applied (as the separate ops compute it): as is, its
// RMSNorm with norm_w [k], or SwiGLU of its 2k values (gate then up). `work` holds each row's
// first term (rows + 1 ints, padded to an even count), then the terms; `part` [slices,
// total_rank] the partial sums, a term's rank components from `toff`.
struct LowRankTerm {
    u64 a, bt;
    int rank, n, col;
    float scale;
    int row, toff;
};
#define LOW_RANK_CHUNK 16
#define LOW_RANK_SLICE 256

__device__ __forceinline__ const LowRankTerm* low_rank_terms(const int* work, int rows) {
    return (const LowRankTerm*)(work + ((rows + 2) & ~1));
}

// Grid: (terms, slices, rank chunks); LOW_RANK_SLICE threads.
extern "C" __global__ void __launch_bounds__(LOW_RANK_SLICE) low_rank_shrink(
    const float* x, int in_dim, const int* work, int rows, float* part, int total_rank,
    const float* norm_w, float eps, int swiglu) {
    __shared__ float sums[LOW_RANK_SLICE / 32][LOW_RANK_CHUNK];
    const LowRankTerm d = low_rank_terms(work, rows)[blockIdx.x];
    const int k0 = blockIdx.z * LOW_RANK_CHUNK;
    const int kn = min(LOW_RANK_CHUNK, d.rank - k0);
    const int i = blockIdx.y * LOW_RANK_SLICE + threadIdx.x;
    // The factors are never written by a kernel: loaded before the wait.
    float a[LOW_RANK_CHUNK];
    const float* ai = (const float*)d.a + (size_t)k0 * in_dim + i;
#pragma unroll
    for (int k = 0; k < LOW_RANK_CHUNK; k++)
        a[k] = (k < kn && i < in_dim) ? ai[(size_t)k * in_dim] : 0.0f;
    DEP_ENTER();
    if (kn <= 0) return;  // the same for every thread of the block
    const float* xr = x + (size_t)d.row * (swiglu ? 2 * in_dim : in_dim);
    float inv_rms = 1.0f;
    if (norm_w) {
        float ss = 0.0f;
        for (int j = threadIdx.x; j < in_dim; j += blockDim.x) ss += xr[j] * xr[j];
        inv_rms = 1.0f / sqrtf(block_sum(ss) / (float)in_dim + eps);
    }
    float v = 0.0f;
    if (i < in_dim) {
        if (swiglu) {
            const float g = xr[i], u = xr[in_dim + i];
            v = swiglu_value(g, u);
        } else {
            v = xr[i];
            if (norm_w) v = norm_w[i] * (v * inv_rms);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < LOW_RANK_CHUNK; k++) {
        const float s = warp_sum(a[k] * v);
        if (lane == 0) sums[warp][k] = s;
    }
    __syncthreads();
    if (threadIdx.x < kn) {
        float s = 0.0f;
        for (int w = 0; w < LOW_RANK_SLICE / 32; w++) s += sums[w][threadIdx.x];
        part[(size_t)blockIdx.y * total_rank + d.toff + k0 + threadIdx.x] = s;
    }
}

// Grid: (rows, column tiles of `cols` outputs); 256 threads.
extern "C" __global__ void __launch_bounds__(256) low_rank_expand(
    float* y, int out_dim, const int* work, int rows, const float* part, int slices,
    int total_rank, int cols) {
    DEP_ENTER();
    __shared__ float t[LOW_RANK_CHUNK];
    const int r = blockIdx.x;
    const int c0 = blockIdx.y * cols, c1 = min(c0 + cols, out_dim);
    const LowRankTerm* terms = low_rank_terms(work, rows);
    float* yr = y + (size_t)r * out_dim;
    for (int e = work[r]; e < work[r + 1]; e++) {
        const LowRankTerm d = terms[e];
        const int lo = max(d.col, c0), hi = min(d.col + d.n, c1);
        if (lo >= hi) continue;  // the same for every thread of the block
        const float* Bt = (const float*)d.bt;
        for (int k0 = 0; k0 < d.rank; k0 += LOW_RANK_CHUNK) {
            const int kn = min(LOW_RANK_CHUNK, d.rank - k0);
            if (threadIdx.x < kn) {
                float s = 0.0f;
                for (int sl = 0; sl < slices; sl++)
                    s += part[(size_t)sl * total_rank + d.toff + k0 + threadIdx.x];
                t[threadIdx.x] = d.scale * s;
            }
            __syncthreads();
            for (int c = lo + threadIdx.x; c < hi; c += blockDim.x) {
                const float* bc = Bt + (size_t)k0 * d.n + (c - d.col);
                float sum = 0.0f;
                for (int k = 0; k < kn; k++) sum += t[k] * bc[(size_t)k * d.n];
                yr[c] += sum;
            }
            __syncthreads();
        }
    }
}

// Values of a row each thread of split_bf16 holds at once (launch.rs SPLIT_HELD: launched with
// k / 4 threads up to 1,024, a row of up to 4,096 is one round trip to memory). The loads of a
// batch are unconditional (indices clamped into the row, results past it unused) and held
// together (`hold`), so that they are all issued before any value is used.
#define SPLIT_HELD 4
static_assert(SPLIT_HELD == 4, "hold takes four values");

// Makes the compiler materialize the four values here (an empty asm that may change them):
// loads written before it are issued before it, not sunk to their uses after it.
__device__ __forceinline__ void hold(float (&v)[4]) {
    asm volatile("" : "+f"(v[0]), "+f"(v[1]), "+f"(v[2]), "+f"(v[3]));
}

// A batch of the split's input values of row xr, at i0, i0 + step, ... (SWIGLU: silu(gate) *
// up of a row of 2k, gate then up).
template <bool SWIGLU>
__device__ __forceinline__ void split_batch(const float* xr, int i0, int step, int k,
                                            float (&v)[SPLIT_HELD]) {
    float g[SPLIT_HELD], u[SPLIT_HELD];
#pragma unroll
    for (int j = 0; j < SPLIT_HELD; j++) {
        const int i = min(i0 + j * step, k - 1);
        g[j] = xr[i];
        if (SWIGLU) u[j] = xr[k + i];
    }
    // Left to itself the compiler sinks each load to its use, between the divisions of
    // swiglu_value (one round trip each).
    hold(g);
    if (SWIGLU) hold(u);
#pragma unroll
    for (int j = 0; j < SPLIT_HELD; j++) v[j] = SWIGLU ? swiglu_value(g[j], u[j]) : g[j];
}

template <bool NORM, bool SWIGLU>
__device__ void split_row(const float* xr, bf16_t* hi, bf16_t* lo, int k, const float* norm_w,
                          float eps) {
    const int step = blockDim.x;
    float scale = 1.0f;
    if (NORM) {
        // The RMSNorm factor 1 / sqrt(mean(v²) + eps), summed over the block in block_sum's
        // order.
        float ss = 0.0f;
        for (int i0 = threadIdx.x; i0 < k; i0 += SPLIT_HELD * step) {
            float v[SPLIT_HELD];
            split_batch<SWIGLU>(xr, i0, step, k, v);
#pragma unroll
            for (int j = 0; j < SPLIT_HELD; j++) {
                if (i0 + j * step < k) ss += v[j] * v[j];
            }
        }
        ss = block_sum(ss);
        scale = 1.0f / sqrtf(ss / (float)k + eps);
    }
    for (int i0 = threadIdx.x; i0 < k; i0 += SPLIT_HELD * step) {
        float v[SPLIT_HELD], w[SPLIT_HELD];
        split_batch<SWIGLU>(xr, i0, step, k, v);
        if (NORM) {
#pragma unroll
            for (int j = 0; j < SPLIT_HELD; j++) w[j] = norm_w[min(i0 + j * step, k - 1)];
        }
#pragma unroll
        for (int j = 0; j < SPLIT_HELD; j++) {
            const int i = i0 + j * step;
            if (i >= k) break;
            const float x = NORM ? w[j] * (v[j] * scale) : v[j];
            const bf16_t h = f32_to_bf16(x);
            const float hf = bf16_to_f32(h);
            hi[i] = h;
            lo[i] = isfinite(hf) ? f32_to_bf16(x - hf) : (bf16_t)0;
        }
    }
}

// The two-term bf16 split of a product's input rows for bf16 tensor cores, with the
// matrix-vector kernel's input modes applied on the way: row r of v [rows, k] is x's row (or
// SwiGLU of x's row of 2k values, gate then up), then its RMSNorm with norm_w [k] when given,
// computed as the separate ops compute them; hl[r k + i] = bf16(v) and hl[rows k + r k + i] =
// bf16(v - hi), so that hi + lo holds 16 significant bits of v. A product of bf16 weights with
// both halves, summed in f32 (add_halves), is within ~2^-17 relative of the f32 product of the
// same weights (cuBLAS multiplies bf16 only by bf16). Inf and NaN: lo = 0. Grid: rows.
extern "C" __global__ void split_bf16(const float* x, bf16_t* hl, int k, const float* norm_w,
                                      float eps, int swiglu) {
    DEP_ENTER();
    const int r = blockIdx.x;
    const float* xr = x + (size_t)r * (swiglu ? 2 * k : k);
    bf16_t* hi = hl + (size_t)r * k;
    bf16_t* lo = hi + (size_t)gridDim.x * k;
    if (swiglu) {
        if (norm_w != nullptr) split_row<true, true>(xr, hi, lo, k, norm_w, eps);
        else split_row<false, true>(xr, hi, lo, k, norm_w, eps);
    } else {
        if (norm_w != nullptr) split_row<true, false>(xr, hi, lo, k, norm_w, eps);
        else split_row<false, false>(xr, hi, lo, k, norm_w, eps);
    }
}

// y [n] = y2[i] + y2[n + i] (the halves of a split product), or y += that with `accumulate`.
extern "C" __global__ void add_halves(const float* y2, float* y, long long n, int accumulate) {
    DEP_ENTER();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float s = y2[i] + y2[n + i];
    y[i] = accumulate ? y[i] + s : s;
}

// out [n_cols_rows...]: y [rows, width] = x[:, col0 .. col0 + width] of x [rows, ld].
extern "C" __global__ void copy_cols(const float* x, int ld, int col0, float* y, int width,
                                     long long n) {
    DEP_ENTER();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / width, j = i - r * width;
    y[i] = x[r * ld + col0 + j];
}

// y [n, width] = rows `idx` of x [*, width]. Grid: n.
extern "C" __global__ void gather_rows(const float* x, const unsigned* idx, float* y, int width) {
    DEP_ENTER();
    const float* src = x + (size_t)idx[blockIdx.x] * width;
    float* dst = y + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

// y [n, dim] = rows `ids` of an f32 table. Grid: n.
// Row ids[r] of the table into row r of y. The top bit of an id is ignored: a step run ahead
// takes its ids from the picks of the step before, whose codes set it when the pick drew
// (Picked::code).
extern "C" __global__ void embed_f32(const float* table, const unsigned* ids, float* y, int dim) {
    DEP_ENTER();
    const float* src = table + (size_t)(ids[blockIdx.x] & 0x7fffffffu) * dim;
    float* dst = y + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

// Matrix-vector products for a few rows (decode): y [m, n] (+)= x [m, k] · Wᵀ, W [n, k]
// row-major, m <= GEMV_ROWS, k a multiple of 8. One warp per output column streams its row of
// W in 16-byte loads; x is staged in shared memory in f32 (bf16 weights are widened in
// registers, so the products are the f32 products of the same weights). Decode is bound by
// reading W, so each lane keeps GEMV_PF loads in flight: the first ones are issued before x is
// staged (and before the kernel waits for the one before it), and each pass issues the next
// pass's loads before it multiplies. Block: 256 threads = 8 columns.
#define GEMV_ROWS 2
#define GEMV_PF 8
#define GEMV_SB 4

// A 16-byte load of streamed weights: read once, so kept out of L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// Lane `lane`'s chunks of pass `base` (chunk base + lane + 32 i), zero past the row's end.
template <int PF>
__device__ __forceinline__ void gemv_fetch(uint4 (&v)[PF], const uint4* wr, int base, int lane,
                                           int chunks) {
#pragma unroll
    for (int i = 0; i < PF; i++) {
        const int c = base + lane + 32 * i;
        if (c < chunks) {
            v[i] = ld_stream(wr + c);
        } else {
            v[i].x = v[i].y = v[i].z = v[i].w = 0u;
        }
    }
}

// Where values 4 e4 .. 4 e4 + 3 of row j go in the staged x (float4 units; see gemv).
template <bool BF16>
__device__ __forceinline__ int gemv_slot(int j, int e4, int k) {
    // bf16: chunk c = e4 / 2 of 8 values, half e4 & 1: xs4[(2j + half) * k8 + c].
    return BF16 ? (2 * j + (e4 & 1)) * (k / 8) + (e4 >> 1) : j * (k / 4) + e4;
}

// Stages the m input rows of a matrix-vector product in shared memory (xs4) in the layout the
// dot products read: lanes of a warp read consecutive 16-byte vectors (no bank conflicts).
// bf16: row j's chunk c (values 8c .. 8c + 7) is xs4[(2j) * k8 + c] (first four) and
// xs4[(2j + 1) * k8 + c] (last four); f32: chunk c (values 4c .. 4c + 3) is xs4[j * k4 + c].
// Fused on the way in: SwiGLU of rows of 2k values (gate, up), or an RMSNorm of each input
// row (norm_w [k]), as the separate ops compute them. Staging is latency-bound, so each
// thread issues its loads in batches of GEMV_SB float4 before it uses any of them. Ends with
// the block synchronized.
template <bool BF16>
__device__ void gemv_stage(const float* x, float4* xs4, int m, int k, const float* norm_w,
                           float eps, int swiglu) {
    // Pass 1: x (or SwiGLU of it) into the staged layout, with each thread's partial sums of
    // squares per row.
    const int q4 = m * k / 4, r4 = k / 4;
    float ss[GEMV_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_ROWS; j++) ss[j] = 0.0f;
    for (int t0 = threadIdx.x; t0 < q4; t0 += GEMV_SB * blockDim.x) {
        float4 a[GEMV_SB], b[GEMV_SB];
#pragma unroll
        for (int i = 0; i < GEMV_SB; i++) {
            const int t = t0 + i * blockDim.x;
            if (t < q4) {
                const int j = t / r4, e4 = t - j * r4;
                if (swiglu) {
                    a[i] = ((const float4*)x)[(size_t)j * 2 * r4 + e4];
                    b[i] = ((const float4*)x)[(size_t)j * 2 * r4 + r4 + e4];
                } else {
                    a[i] = ((const float4*)x)[t];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < GEMV_SB; i++) {
            const int t = t0 + i * blockDim.x;
            if (t >= q4) break;
            const int j = t / r4, e4 = t - j * r4;
            float4 v = a[i];
            if (swiglu) {
                v.x = swiglu_value(v.x, b[i].x);
                v.y = swiglu_value(v.y, b[i].y);
                v.z = swiglu_value(v.z, b[i].z);
                v.w = swiglu_value(v.w, b[i].w);
            }
            if (norm_w != nullptr) {
                const float s2 = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
#pragma unroll
                for (int jj = 0; jj < GEMV_ROWS; jj++) {
                    if (jj == j) ss[jj] += s2;
                }
            }
            xs4[gemv_slot<BF16>(j, e4, k)] = v;
        }
    }
    if (norm_w != nullptr) {
        // Per-row factors over the block in a fixed order, then pass 2 scales the staged rows
        // in place: w * (x * r).
        __shared__ float rs[GEMV_ROWS];
        block_rms_factors(ss, m, k, eps, rs);
        for (int t0 = threadIdx.x; t0 < q4; t0 += GEMV_SB * blockDim.x) {
            float4 g[GEMV_SB];
#pragma unroll
            for (int i = 0; i < GEMV_SB; i++) {
                const int t = t0 + i * blockDim.x;
                if (t < q4) g[i] = ((const float4*)norm_w)[t % r4];
            }
#pragma unroll
            for (int i = 0; i < GEMV_SB; i++) {
                const int t = t0 + i * blockDim.x;
                if (t >= q4) break;
                const int j = t / r4, e4 = t - j * r4;
                const int slot = gemv_slot<BF16>(j, e4, k);
                float4 v = xs4[slot];
                const float r = rs[j];
                v.x = g[i].x * (v.x * r);
                v.y = g[i].y * (v.y * r);
                v.z = g[i].z * (v.z * r);
                v.w = g[i].w * (v.w * r);
                xs4[slot] = v;
            }
        }
    }
    __syncthreads();
}

// acc[j] += chunk c of the weight row (16 bytes: 8 bf16 or 4 f32 values) · chunk c of staged
// row j, for j < m. Both matrix-vector kernels sum through this, in the same order per lane
// (chunks lane, lane + 32, ...), so their results are bit-equal.
template <bool BF16>
__device__ __forceinline__ void gemv_chunk(float (&acc)[GEMV_ROWS], uint4 pk, const float4* xs4,
                                           int c, int m, int k) {
    const int k8 = k / 8, k4 = k / 4;
    if (BF16) {
        const unsigned parts[4] = {pk.x, pk.y, pk.z, pk.w};
        float wv[8];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            wv[2 * q] = __uint_as_float(parts[q] << 16);
            wv[2 * q + 1] = __uint_as_float(parts[q] & 0xffff0000u);
        }
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; j++) {
            if (j < m) {
                const float4 a = xs4[(2 * j) * k8 + c], b = xs4[(2 * j + 1) * k8 + c];
                acc[j] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w
                        + wv[4] * b.x + wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
            }
        }
    } else {
        float4 wf;
        wf.x = __uint_as_float(pk.x);
        wf.y = __uint_as_float(pk.y);
        wf.z = __uint_as_float(pk.z);
        wf.w = __uint_as_float(pk.w);
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; j++) {
            if (j < m) {
                const float4 a = xs4[j * k4 + c];
                acc[j] += wf.x * a.x + wf.y * a.y + wf.z * a.z + wf.w * a.w;
            }
        }
    }
}

// With `accumulate`, lane 0 reads the column's values y[j * n + col] that its sums add to:
// called before the sums, so that the read's trip to memory overlaps them (H100, 2026-12-06:
// within the noise of reading them after the sums, 0-3 us a step).
__device__ __forceinline__ void gemv_prior(float (&prior)[GEMV_ROWS], const float* y, int m,
                                           int n, int col, int lane, int accumulate) {
#pragma unroll
    for (int j = 0; j < GEMV_ROWS; j++) {
        prior[j] = accumulate && lane == 0 && j < m ? y[(size_t)j * n + col] : 0.0f;
    }
}

// Lane 0 of the warp gets the column's sums and writes them, or adds them to `prior` (see
// gemv_prior): y[j * n + col].
__device__ __forceinline__ void gemv_store(const float (&acc)[GEMV_ROWS],
                                           const float (&prior)[GEMV_ROWS], float* y, int m,
                                           int n, int col, int lane, int accumulate) {
#pragma unroll
    for (int j = 0; j < GEMV_ROWS; j++) {
        if (j < m) {
            const float s = warp_sum(acc[j]);
            if (lane == 0) y[(size_t)j * n + col] = accumulate ? prior[j] + s : s;
        }
    }
}

// PF: load slots a lane (GEMV_PF, or GEMV_PF / 2 in the lean entry for short rows).
template <bool BF16, int PF>
__device__ void gemv(const float* x, const void* w, float* y, int m, int n, int k, int accumulate,
                     const float* norm_w, float eps, int swiglu) {
    extern __shared__ float4 xs4[];
    const int chunks = BF16 ? k / 8 : k / 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // Warp `warp` of block b takes columns b * 8 + warp, then every gridDim.x * 8-th: a grid
    // smaller than n / 8 keeps every block resident at once, next to the blocks of the kernel
    // after it. Its passes over its columns form one sequence, each pass's loads issued
    // before the previous pass multiplies (also across columns).
    const int stride = gridDim.x * 8;
    const size_t row_bytes = (size_t)k * (BF16 ? 2 : 4);
    const int passes = (chunks + 32 * PF - 1) / (32 * PF);
    int col = blockIdx.x * 8 + warp;
    uint4 next[PF];
    if (col < n) gemv_fetch(next, (const uint4*)((const char*)w + col * row_bytes), 0, lane, chunks);
    // The first loads of the weights are in flight while the kernel before finishes.
    DEP_ENTER();
    gemv_stage<BF16>(x, xs4, m, k, norm_w, eps, swiglu);
    for (; col < n; col += stride) {
        const uint4* wr = (const uint4*)((const char*)w + col * row_bytes);
        float prior[GEMV_ROWS];
        gemv_prior(prior, y, m, n, col, lane, accumulate);
        float acc[GEMV_ROWS];
#pragma unroll
        for (int j = 0; j < GEMV_ROWS; j++) acc[j] = 0.0f;
        for (int p = 0; p < passes; p++) {
            const int base = p * 32 * PF;
            uint4 cur[PF];
#pragma unroll
            for (int i = 0; i < PF; i++) cur[i] = next[i];
            if (p + 1 < passes) {
                gemv_fetch(next, wr, base + 32 * PF, lane, chunks);
            } else if (col + stride < n) {
                gemv_fetch(next, (const uint4*)((const char*)w + (col + stride) * row_bytes), 0,
                           lane, chunks);
            }
#pragma unroll
            for (int i = 0; i < PF; i++) {
                const int c = base + lane + 32 * i;
                if (c >= chunks) break;
                gemv_chunk<BF16>(acc, cur[i], xs4, c, m, k);
            }
        }
        gemv_store(acc, prior, y, m, n, col, lane, accumulate);
    }
}

extern "C" __global__ void gemv_bf16(const float* x, const bf16_t* w, float* y, int m, int n, int k,
                                     int accumulate, const float* norm_w, float eps, int swiglu) {
    gemv<true, GEMV_PF>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu);
}

// The register-lean entries (launch.rs `gemv_bf16_entry`, `LATTICE_CUDA_GEMV_LEAN=1`): two
// blocks of a product leave room on their SM for a block of the kernel after it, so that it
// starts and fetches its own inputs while the product runs (H100, 2026-12-07, F1: at 128 registers the
// products filled the register file and every launch of the step got slower). Rows of at most
// 32 GEMV_PF / 2 chunks (k <= 1,024 bf16, which fills only half the slots of `gemv_bf16`) take
// half the slots, at most 72 registers (2 x 256 x 72 + a decode attention block of 128 x 200
// fit 64 Ki); longer rows all slots at most 112 (two gate/up blocks + one down block fit).
// The same loads in flight and the same sums in the same order as `gemv_bf16` (bit-equal).
extern "C" __global__ void __maxnreg__(72)
gemv_half_bf16(const float* x, const bf16_t* w, float* y, int m, int n, int k, int accumulate,
               const float* norm_w, float eps, int swiglu) {
    gemv<true, GEMV_PF / 2>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu);
}

extern "C" __global__ void __maxnreg__(112)
gemv_capped_bf16(const float* x, const bf16_t* w, float* y, int m, int n, int k, int accumulate,
                 const float* norm_w, float eps, int swiglu) {
    gemv<true, GEMV_PF>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu);
}

extern "C" __global__ void gemv_f32(const float* x, const float* w, float* y, int m, int n, int k,
                                    int accumulate, const float* norm_w, float eps, int swiglu) {
    gemv<false, GEMV_PF>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu);
}

// The larger of two (value, index) candidates: the larger value, the lower index on ties;
// index 0x7fffffff stands for "no number yet" (NaN never wins).
__device__ __forceinline__ void arg_better(float& v, int& i, float ov, int oi) {
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
}

// The best candidate of the block (blockDim.x a multiple of 32), in thread 0.
__device__ void block_argmax(float& v, int& bi) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    for (int o = 16; o > 0; o >>= 1)
        arg_better(v, bi, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, bi, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        v = lane < n_warps ? best_v[lane] : -INFINITY;
        bi = lane < n_warps ? best_i[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1)
            arg_better(v, bi, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, bi, o));
    }
}

// Argmax, stage 1: block (r, b) finds the largest value of slice b of row r of x [rows, n]
// (gridDim.y slices; the first on ties) and writes (value, index) to part [rows, gridDim.y].
extern "C" __global__ void argmax_part(const float* x, float* part_v, int* part_i, int n) {
    DEP_ENTER();
    const int r = blockIdx.x, b = blockIdx.y, nb = gridDim.y;
    const int span = (n + nb - 1) / nb, lo = b * span, hi = min(n, lo + span);
    const float* xr = x + (size_t)r * n;
    float v = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float t = xr[i];
        if (t > v) { v = t; bi = i; }  // each thread walks up, so its first maximum stays
    }
    block_argmax(v, bi);
    if (threadIdx.x == 0) { part_v[r * nb + b] = v; part_i[r * nb + b] = bi; }
}

// Argmax, stage 2: the index of each row's best partial (0 for a row without a number) into
// out [rows]. Grid: rows; block: 32 threads per slice up to 1024.
extern "C" __global__ void argmax_merge(const float* part_v, const int* part_i, unsigned* out,
                                        int nb) {
    DEP_ENTER();
    const int r = blockIdx.x;
    float v = -INFINITY;
    int bi = 0x7fffffff;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) arg_better(v, bi, part_v[r * nb + b], part_i[r * nb + b]);
    block_argmax(v, bi);
    if (threadIdx.x == 0) out[r] = bi == 0x7fffffff ? 0u : (unsigned)bi;
}
