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

// y = w * (x / sqrt(mean(x^2) + eps)) per row of `dim` (x == y allowed). Grid: rows.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int dim, float eps) {
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
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / width, j = i - r * width;
    const float g = gate_up[r * 2 * width + j], u = gate_up[r * 2 * width + width + j];
    out[i] = g / (1.0f + expf(-g)) * u;
}

// Exact (erf) GELU in place.
extern "C" __global__ void gelu(float* x, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

// y [rows, width] += bias [width] per row.
extern "C" __global__ void add_bias(float* y, const float* bias, int width, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += bias[i % width];
}

// y = bf16(x), rounded to nearest even.
extern "C" __global__ void to_bf16(const float* x, bf16_t* y, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f32_to_bf16(x[i]);
}

// out [n_cols_rows...]: y [rows, width] = x[:, col0 .. col0 + width] of x [rows, ld].
extern "C" __global__ void copy_cols(const float* x, int ld, int col0, float* y, int width,
                                     long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / width, j = i - r * width;
    y[i] = x[r * ld + col0 + j];
}

// y [n, width] = rows `idx` of x [*, width]. Grid: n.
extern "C" __global__ void gather_rows(const float* x, const unsigned* idx, float* y, int width) {
    const float* src = x + (size_t)idx[blockIdx.x] * width;
    float* dst = y + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

// y [n, dim] = rows `ids` of an f32 table. Grid: n.
extern "C" __global__ void embed_f32(const float* table, const unsigned* ids, float* y, int dim) {
    const float* src = table + (size_t)ids[blockIdx.x] * dim;
    float* dst = y + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

// Matrix-vector products for a few rows (decode): y [m, n] (+)= x [m, k] · Wᵀ, W [n, k]
// row-major, m <= GEMV_ROWS, k a multiple of 8. One warp per output column streams its row of
// W in 16-byte loads; x is staged in shared memory (rounded to bf16 for bf16 weights, as the
// CPU's bf16 path does). Decode is bound by reading W, so each lane keeps GEMV_PF loads in
// flight: the first ones are issued before x is staged, and each pass issues the next pass's
// loads before it multiplies. Block: 256 threads = 8 columns.
#define GEMV_ROWS 8
#define GEMV_PF 8

// A 16-byte load of streamed weights: read once, so kept out of L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// Lane `lane`'s chunks of pass `base` (chunk base + lane + 32 i), zero past the row's end.
__device__ __forceinline__ void gemv_fetch(uint4 (&v)[GEMV_PF], const uint4* wr, int base,
                                           int lane, int chunks) {
#pragma unroll
    for (int i = 0; i < GEMV_PF; i++) {
        const int c = base + lane + 32 * i;
        if (c < chunks) {
            v[i] = ld_stream(wr + c);
        } else {
            v[i].x = v[i].y = v[i].z = v[i].w = 0u;
        }
    }
}

template <bool BF16>
__device__ void gemv(const float* x, const void* w, float* y, int m, int n, int k, int accumulate,
                     const float* norm_w, float eps, int swiglu) {
    // Staged so that the lanes of a warp read consecutive 16-byte vectors (no bank conflicts):
    // bf16: row j's chunk c (values 8c .. 8c + 7) is xs4[(2j) * k8 + c] (first four) and
    // xs4[(2j + 1) * k8 + c] (last four); f32: chunk c (values 4c .. 4c + 3) is xs4[j * k4 + c].
    extern __shared__ float4 xs4[];
    float* xs = (float*)xs4;
    const int k8 = k / 8, k4 = k / 4;
    const int chunks = BF16 ? k8 : k4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * 8 + warp;
    const bool live = col < n;
    const uint4* wr = (const uint4*)((const char*)w + (size_t)(live ? col : 0) * k * (BF16 ? 2 : 4));
    uint4 next[GEMV_PF];
    if (live) gemv_fetch(next, wr, 0, lane, chunks);
    // Fused on the way in: an RMSNorm of each input row (norm_w [k]), or SwiGLU of rows of
    // 2k values (gate, up), as the separate ops compute them.
    __shared__ float rs[GEMV_ROWS];
    if (norm_w != nullptr) {
        if (warp < m) {
            float ss = 0.0f;
            for (int e = lane; e < k; e += 32) ss += x[warp * k + e] * x[warp * k + e];
            ss = warp_sum(ss);
            if (lane == 0) rs[warp] = 1.0f / sqrtf(ss / (float)k + eps);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < m * k; i += blockDim.x) {
        const int j = i / k, e = i - j * k;
        float v;
        if (swiglu) {
            const float g = x[(size_t)j * 2 * k + e], u = x[(size_t)j * 2 * k + k + e];
            v = g / (1.0f + expf(-g)) * u;
        } else {
            v = x[i];
        }
        if (norm_w != nullptr) v = norm_w[e] * (v * rs[j]);
        if (BF16) {
            const int c = e >> 3, q = e & 7;
            xs[(((2 * j + (q >> 2)) * k8 + c) << 2) + (q & 3)] = bf16_to_f32(f32_to_bf16(v));
        } else {
            xs[i] = v;
        }
    }
    __syncthreads();
    if (!live) return;
    float acc[GEMV_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_ROWS; j++) acc[j] = 0.0f;
    for (int base = 0; base < chunks; base += 32 * GEMV_PF) {
        uint4 cur[GEMV_PF];
#pragma unroll
        for (int i = 0; i < GEMV_PF; i++) cur[i] = next[i];
        if (base + 32 * GEMV_PF < chunks) gemv_fetch(next, wr, base + 32 * GEMV_PF, lane, chunks);
#pragma unroll
        for (int i = 0; i < GEMV_PF; i++) {
            const int c = base + lane + 32 * i;
            if (c >= chunks) break;
            const uint4 pk = cur[i];
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
    }
#pragma unroll
    for (int j = 0; j < GEMV_ROWS; j++) {
        if (j < m) {
            const float s = warp_sum(acc[j]);
            if (lane == 0) {
                float* out = y + (size_t)j * n + col;
                *out = accumulate ? *out + s : s;
            }
        }
    }
}

extern "C" __global__ void gemv_bf16(const float* x, const bf16_t* w, float* y, int m, int n, int k,
                                     int accumulate, const float* norm_w, float eps, int swiglu) {
    gemv<true>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu);
}

extern "C" __global__ void gemv_f32(const float* x, const float* w, float* y, int m, int n, int k,
                                    int accumulate, const float* norm_w, float eps, int swiglu) {
    gemv<false>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu);
}

// Index of the largest value of each row of x [rows, n] (the first one on ties). Grid: rows.
extern "C" __global__ void argmax_rows(const float* x, unsigned* out, int n) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float v = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float t = xr[i];
        if (t > v) { v = t; bi = i; }  // each thread walks up, so its first maximum stays
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > v || (ov == v && oi < bi)) { v = ov; bi = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        v = lane < n_warps ? best_v[lane] : -INFINITY;
        bi = lane < n_warps ? best_i[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > v || (ov == v && oi < bi)) { v = ov; bi = oi; }
        }
        if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0u : (unsigned)bi;
    }
}

// Writes row r of k and v [rows, kv_dim] into a page: dst[r] is the address of the page row
// (of attention slot 0); this layer's key row is `k_off` elements further and its value row
// `val_off` beyond that. Grid: rows.
extern "C" __global__ void kv_write_f32(const float* k, const float* v, const u64* dst,
                                        int kv_dim, long long k_off, long long val_off) {
    float* kd = (float*)dst[blockIdx.x] + k_off;
    float* vd = kd + val_off;
    const float* ks = k + (size_t)blockIdx.x * kv_dim;
    const float* vs = v + (size_t)blockIdx.x * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) { kd[i] = ks[i]; vd[i] = vs[i]; }
}

// kv_write_f32 into f16 pages (rounded to nearest even).
extern "C" __global__ void kv_write_f16(const float* k, const float* v, const u64* dst,
                                        int kv_dim, long long k_off, long long val_off) {
    f16_t* kd = (f16_t*)dst[blockIdx.x] + k_off;
    f16_t* vd = kd + val_off;
    const float* ks = k + (size_t)blockIdx.x * kv_dim;
    const float* vs = v + (size_t)blockIdx.x * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kd[i] = f32_to_f16(ks[i]);
        vd[i] = f32_to_f16(vs[i]);
    }
}

__device__ __forceinline__ float load_kv(const float* p) { return *p; }
__device__ __forceinline__ float load_kv(const f16_t* p) { return f16_to_f32(*p); }
__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_kv(f16_t* p, float v) { *p = f32_to_f16(v); }

// Causal attention over paged keys and values, flash style (online softmax, nothing of size
// context in memory). One block = one query head of up to ATTN_ROWS consecutive query rows of
// one sequence (a "tile"), one warp per row; keys and values are staged 32 at a time in shared
// memory and shared by the tile's rows. Lane j scores key j of the stage; each lane then owns
// head dimensions lane, lane + 32, ... of the output.
//
// q, out: [rows, n_heads * hd]. Tile t covers rows tile_row0[t] .. + tile_n[t] of sequence
// tile_seq[t]; row r sits at position row_pos[r] and sees keys max(0, pos - window + 1) ..= pos
// (window <= 0: no window). Sequence s's key row j lives in page pages[page0[s] + j / page_rows]
// at element k_off + (j % page_rows) * kv_dim + kv_head * hd; its value row val_off further.
#define ATTN_ROWS 8
#define ATTN_MAX_DIMS 8

template <typename KV>
__device__ void attn_paged(const float* q, float* out, const int* tile_seq, const int* tile_row0,
                           const int* tile_n, const int* row_pos, const u64* pages,
                           const int* page0, int page_rows, long long k_off, long long val_off,
                           int n_heads, int n_kv_heads, int hd, float scale, int window) {
    extern __shared__ float smem[];
    const int t = blockIdx.x, head = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int seq = tile_seq[t], row0 = tile_row0[t], n_rows = tile_n[t];
    const int kv_head = head / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * hd;
    const int q_dim = n_heads * hd;
    const int ks_ld = hd + 1;  // padded: lane j reads row j without bank conflicts
    float* ks = smem;                       // [32][hd + 1]
    float* vs = ks + 32 * ks_ld;            // [32][hd]
    float* qs = vs + 32 * hd;               // [ATTN_ROWS][hd]

    const bool active = warp < n_rows;
    const int row = row0 + (active ? warp : 0);
    const int pos = row_pos[row];
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    if (active) {
        for (int d = lane; d < hd; d += 32) qs[warp * hd + d] = q[(size_t)row * q_dim + head * hd + d] * scale;
    }
    // The keys any row of the tile sees.
    const int first_pos = row_pos[row0], last_pos = row_pos[row0 + n_rows - 1];
    const int key_lo = window > 0 ? max(0, first_pos - window + 1) : 0;
    const int key_hi = last_pos;  // inclusive

    float m = -INFINITY, l = 0.0f;
    float acc[ATTN_MAX_DIMS];
#pragma unroll
    for (int i = 0; i < ATTN_MAX_DIMS; i++) acc[i] = 0.0f;

    const int n_threads = blockDim.x;
    for (int base = key_lo; base <= key_hi; base += 32) {
        const int n_keys = min(32, key_hi - base + 1);
        __syncthreads();
        for (int e = threadIdx.x; e < n_keys * hd; e += n_threads) {
            const int j = e / hd, d = e - j * hd;
            const int key = base + j;
            const KV* page = (const KV*)pages[page0[seq] + key / page_rows];
            const long long off = k_off + (long long)(key % page_rows) * kv_dim + kv_head * hd + d;
            ks[j * ks_ld + d] = load_kv(page + off);
            vs[j * hd + d] = load_kv(page + off + val_off);
        }
        __syncthreads();
        if (!active) continue;
        // Lane j scores key base + j.
        const int key = base + lane;
        float s = -INFINITY;
        if (lane < n_keys && key >= lo && key <= pos) {
            float dot = 0.0f;
            const float* kr = ks + lane * ks_ld;
            const float* qr = qs + warp * hd;
            for (int d = 0; d < hd; d++) dot += qr[d] * kr[d];
            s = dot;
        }
        const float m_new = fmaxf(m, warp_max(s));
        if (m_new == -INFINITY) continue;
        const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
        const float corr = expf(m - m_new);
        l = l * corr + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int i = 0; i < ATTN_MAX_DIMS; i++) acc[i] *= corr;
        for (int j = 0; j < n_keys; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            if (pj == 0.0f) continue;
#pragma unroll
            for (int i = 0; i < ATTN_MAX_DIMS; i++) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] += pj * vs[j * hd + d];
            }
        }
    }
    if (!active) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int i = 0; i < ATTN_MAX_DIMS; i++) {
        const int d = lane + 32 * i;
        if (d < hd) out[(size_t)row * q_dim + head * hd + d] = acc[i] * inv;
    }
}

extern "C" __global__ void attn_paged_f32(const float* q, float* out, const int* tile_seq,
                                          const int* tile_row0, const int* tile_n,
                                          const int* row_pos, const u64* pages, const int* page0,
                                          int page_rows, long long k_off, long long val_off,
                                          int n_heads, int n_kv_heads, int hd, float scale,
                                          int window) {
    attn_paged<float>(q, out, tile_seq, tile_row0, tile_n, row_pos, pages, page0, page_rows,
                      k_off, val_off, n_heads, n_kv_heads, hd, scale, window);
}

extern "C" __global__ void attn_paged_f16(const float* q, float* out, const int* tile_seq,
                                          const int* tile_row0, const int* tile_n,
                                          const int* row_pos, const u64* pages, const int* page0,
                                          int page_rows, long long k_off, long long val_off,
                                          int n_heads, int n_kv_heads, int hd, float scale,
                                          int window) {
    attn_paged<f16_t>(q, out, tile_seq, tile_row0, tile_n, row_pos, pages, page0, page_rows,
                      k_off, val_off, n_heads, n_kv_heads, hd, scale, window);
}

// Decode attention: one query row per sequence (rows == sequences), over paged keys and values
// read in place (no staging), 8 warps per (sequence, head) splitting the keys: warp w takes
// chunks w, w + 8, ... of 32 keys, lane j scores key j of a chunk, each warp keeps its own
// online softmax, and the 8 partial results are merged at the end. hd must be a multiple of 4
// (16-byte rows for f32 pages, 8-byte for f16) and at most 256. Grid: (rows, n_heads).
__device__ __forceinline__ void load4(const float* p, float* v) {
    const float4 t = *(const float4*)p;
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
__device__ __forceinline__ void load4(const f16_t* p, float* v) {
    const uint2 t = *(const uint2*)p;
    v[0] = f16_to_f32((f16_t)(t.x & 0xffffu)); v[1] = f16_to_f32((f16_t)(t.x >> 16));
    v[2] = f16_to_f32((f16_t)(t.y & 0xffffu)); v[3] = f16_to_f32((f16_t)(t.y >> 16));
}

template <typename KV>
__device__ void attn_decode(const float* q, float* out, const int* row_pos, const u64* pages,
                            const int* page0, int page_rows, long long k_off, long long val_off,
                            int n_heads, int n_kv_heads, int hd, float scale, int window) {
    __shared__ float qs[256];
    __shared__ float part_m[8], part_l[8];
    __shared__ float part_acc[8][256];
    const int seq = blockIdx.x, head = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kv_head = head / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * hd, q_dim = n_heads * hd;
    const int pos = row_pos[seq];
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[(size_t)seq * q_dim + head * hd + d] * scale;
    __syncthreads();
    const u64* sp = pages + page0[seq];
    float m = -INFINITY, l = 0.0f;
    float acc[ATTN_MAX_DIMS];
#pragma unroll
    for (int i = 0; i < ATTN_MAX_DIMS; i++) acc[i] = 0.0f;
    for (int base = lo + warp * 32; base <= pos; base += 8 * 32) {
        const int key = base + lane;
        float s = -INFINITY;
        if (key <= pos) {
            const KV* kr = (const KV*)sp[key / page_rows] + k_off
                + (long long)(key % page_rows) * kv_dim + kv_head * hd;
            float dot = 0.0f;
            for (int d = 0; d < hd; d += 4) {
                float kv4[4];
                load4(kr + d, kv4);
                dot += qs[d] * kv4[0] + qs[d + 1] * kv4[1] + qs[d + 2] * kv4[2] + qs[d + 3] * kv4[3];
            }
            s = dot;
        }
        const float m_new = fmaxf(m, warp_max(s));
        if (m_new == -INFINITY) continue;
        const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
        const float corr = expf(m - m_new);
        l = l * corr + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int i = 0; i < ATTN_MAX_DIMS; i++) acc[i] *= corr;
        const int n_keys = min(32, pos - base + 1);
        for (int j = 0; j < n_keys; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const int kj = base + j;
            const KV* vr = (const KV*)sp[kj / page_rows] + k_off + val_off
                + (long long)(kj % page_rows) * kv_dim + kv_head * hd;
#pragma unroll
            for (int i = 0; i < ATTN_MAX_DIMS; i++) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] += pj * load_kv(vr + d);
            }
        }
    }
    if (lane == 0) { part_m[warp] = m; part_l[warp] = l; }
#pragma unroll
    for (int i = 0; i < ATTN_MAX_DIMS; i++) {
        const int d = lane + 32 * i;
        if (d < hd) part_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float gm = -INFINITY;
    for (int w = 0; w < 8; w++) gm = fmaxf(gm, part_m[w]);
    float gl = 0.0f;
    for (int w = 0; w < 8; w++) gl += part_m[w] == -INFINITY ? 0.0f : part_l[w] * expf(part_m[w] - gm);
    const float inv = gl > 0.0f ? 1.0f / gl : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < 8; w++) {
            if (part_m[w] != -INFINITY) o += part_acc[w][d] * expf(part_m[w] - gm);
        }
        out[(size_t)seq * q_dim + head * hd + d] = o * inv;
    }
}

extern "C" __global__ void attn_decode_f32(const float* q, float* out, const int* row_pos,
                                           const u64* pages, const int* page0, int page_rows,
                                           long long k_off, long long val_off, int n_heads,
                                           int n_kv_heads, int hd, float scale, int window) {
    attn_decode<float>(q, out, row_pos, pages, page0, page_rows, k_off, val_off, n_heads,
                       n_kv_heads, hd, scale, window);
}

extern "C" __global__ void attn_decode_f16(const float* q, float* out, const int* row_pos,
                                           const u64* pages, const int* page0, int page_rows,
                                           long long k_off, long long val_off, int n_heads,
                                           int n_kv_heads, int hd, float scale, int window) {
    attn_decode<f16_t>(q, out, row_pos, pages, page0, page_rows, k_off, val_off, n_heads,
                       n_kv_heads, hd, scale, window);
}

// The attention input of one layer from its fused Q/K/V product, in one pass: per row r of
// qkv [rows, (n_heads + 2 n_kv_heads) * hd] and per head, the optional per-head RMSNorm (Qwen3;
// weights [hd]), rotate-half RoPE of queries and keys (row r at pos[r]; `half` pairs), then the
// query to q_out [rows, n_heads * hd] and the key and value rows straight into the KV page at
// dst[r] (+ k_off, + val_off). What split_columns + RmsNorm + Rope + kv_write compute, one
// launch instead of eight. Grid: (rows, n_heads + 2 n_kv_heads); block: 128 threads.
template <typename KV>
__device__ void qkv_prep(const float* qkv, float* q_out, const u64* dst, const int* pos,
                         const float* inv_freq, int half, float attn, const float* q_w,
                         const float* k_w, float eps, int n_heads, int n_kv_heads, int hd,
                         long long k_off, long long val_off) {
    __shared__ float x[256];
    const int r = blockIdx.x, h = blockIdx.y;
    const int width = (n_heads + 2 * n_kv_heads) * hd;
    const int kind = h < n_heads ? 0 : (h < n_heads + n_kv_heads ? 1 : 2);  // q, k, v
    const float* src = qkv + (size_t)r * width + (size_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) x[d] = src[d];
    const float* w = kind == 0 ? q_w : (kind == 1 ? k_w : nullptr);
    if (w != nullptr) {
        __syncthreads();
        float ss = 0.0f;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) ss += x[d] * x[d];
        ss = block_sum(ss);
        const float rs = 1.0f / sqrtf(ss / (float)hd + eps);
        for (int d = threadIdx.x; d < hd; d += blockDim.x) x[d] = w[d] * (x[d] * rs);
    }
    __syncthreads();
    if (kind != 2) {
        const float p = (float)pos[r];
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const float angle = p * inv_freq[i];
            const float c = cosf(angle) * attn, s = sinf(angle) * attn;
            const float a = x[i], b = x[i + half];
            x[i] = a * c - b * s;
            x[i + half] = b * c + a * s;
        }
        __syncthreads();
    }
    if (kind == 0) {
        float* o = q_out + (size_t)r * n_heads * hd + (size_t)h * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = x[d];
    } else {
        const int kvh = kind == 1 ? h - n_heads : h - n_heads - n_kv_heads;
        KV* o = (KV*)dst[r] + k_off + (kind == 2 ? val_off : 0) + (long long)kvh * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) store_kv(o + d, x[d]);
    }
}

extern "C" __global__ void qkv_prep_f32(const float* qkv, float* q_out, const u64* dst,
                                        const int* pos, const float* inv_freq, int half,
                                        float attn, const float* q_w, const float* k_w, float eps,
                                        int n_heads, int n_kv_heads, int hd, long long k_off,
                                        long long val_off) {
    qkv_prep<float>(qkv, q_out, dst, pos, inv_freq, half, attn, q_w, k_w, eps, n_heads,
                    n_kv_heads, hd, k_off, val_off);
}

extern "C" __global__ void qkv_prep_f16(const float* qkv, float* q_out, const u64* dst,
                                        const int* pos, const float* inv_freq, int half,
                                        float attn, const float* q_w, const float* k_w, float eps,
                                        int n_heads, int n_kv_heads, int hd, long long k_off,
                                        long long val_off) {
    qkv_prep<f16_t>(qkv, q_out, dst, pos, inv_freq, half, attn, q_w, k_w, eps, n_heads,
                    n_kv_heads, hd, k_off, val_off);
}
