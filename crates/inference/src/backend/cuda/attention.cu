// Attention on the GPU over the paged KV memory (appended to kernels.cu by backend/cuda/mod.rs):
// key and value rows into pages (kv_write), the fused Q/K/V preparation (qkv_prep), paged flash
// attention for prompts (attn_paged) and decode attention (attn_decode), f32 or f16 pages.

__device__ __forceinline__ float load_kv(const float* p) { return *p; }
__device__ __forceinline__ float load_kv(const f16_t* p) { return f16_to_f32(*p); }
__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }
// Rounded to nearest even.
__device__ __forceinline__ void store_kv(f16_t* p, float v) { *p = f32_to_f16(v); }

// The f32 and f16 entries of a kernel template over the page type: NAME_f32, NAME_f16.
#define KV_ENTRIES(ENTRY, NAME) ENTRY(NAME##_f32, float) ENTRY(NAME##_f16, f16_t)

// Writes row r of k and v [rows, kv_dim] into a page: dst[r] is the address of the page row
// (of attention slot 0); this layer's key row is `k_off` elements further and its value row
// `val_off` beyond that. Grid: rows.
template <typename KV>
__device__ void kv_write(const float* k, const float* v, const u64* dst, int kv_dim,
                         long long k_off, long long val_off) {
    KV* kd = (KV*)dst[blockIdx.x] + k_off;
    KV* vd = kd + val_off;
    const float* ks = k + (size_t)blockIdx.x * kv_dim;
    const float* vs = v + (size_t)blockIdx.x * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        store_kv(kd + i, ks[i]);
        store_kv(vd + i, vs[i]);
    }
}

#define KV_WRITE_ENTRY(NAME, KV)                                                               \
    extern "C" __global__ void NAME(const float* k, const float* v, const u64* dst, int kv_dim, \
                                    long long k_off, long long val_off) {                      \
        DEP_ENTER();                                                                           \
        kv_write<KV>(k, v, dst, kv_dim, k_off, val_off);                                       \
    }
KV_ENTRIES(KV_WRITE_ENTRY, kv_write)

// Four KV values as stored (f32: a float4; f16: four halves in a uint2), loaded by stored4 and
// widened by widen4. Kernels that keep many loads in flight load the stored form first and
// widen it afterwards: widening each value as it arrives let ptxas, under a register cap, reuse
// the registers of f16 loads and so wait for each before issuing the next (2026-12-06: 64-row
// decode attention 2.7x slower in f16 than in f32).
template <typename KV> struct Stored4;
template <> struct Stored4<float> { typedef float4 T; };
template <> struct Stored4<f16_t> { typedef uint2 T; };
__device__ __forceinline__ float4 stored4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ uint2 stored4(const f16_t* p) { return *(const uint2*)p; }
__device__ __forceinline__ void widen4(float4 t, float* v) {
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
}
__device__ __forceinline__ void widen4(uint2 t, float* v) {
    v[0] = f16_to_f32((f16_t)(t.x & 0xffffu)); v[1] = f16_to_f32((f16_t)(t.x >> 16));
    v[2] = f16_to_f32((f16_t)(t.y & 0xffffu)); v[3] = f16_to_f32((f16_t)(t.y >> 16));
}
template <typename KV> __device__ __forceinline__ void load4(const KV* p, float* v) {
    widen4(stored4(p), v);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// Causal attention over paged keys and values, flash style (online softmax, nothing of size
// context in memory), f32 on the CUDA cores, register-tiled like a matrix product. One block =
// one query head of up to ATTN_ROWS (64) consecutive query rows of one sequence (a "tile");
// keys and values are staged ATTN_KEYS (32) at a time in shared memory. Thread t owns rows
// 2 (t / 8) and 2 (t / 8) + 1 of the tile: it scores keys t % 8 + 8 i (i < 4) of each stage
// and accumulates output dimensions 4 (t % 8) + 32 i .. + 3 (i < D4); the 8 threads of a row
// pair are adjacent lanes and share their probabilities by shuffles. hd: a multiple of 4,
// at most 32 D4.
//
// q, out: [rows, n_heads * hd]. Tile t covers rows tile_row0[t] .. + tile_n[t] of sequence
// tile_seq[t]; row r sits at position row_pos[r] and sees keys max(0, pos - window + 1) ..= pos
// (window <= 0: no window). Sequence s's key row j lives in page pages[page0[s] + j / page_rows]
// at element k_off + (j % page_rows) * kv_dim + kv_head * hd; its value row val_off further.
#define ATTN_ROWS 64
#define ATTN_KEYS 32
#define ATTN_MAX_DIMS 8

template <typename KV, int D4>
__device__ void attn_paged(const float* q, float* out, const int* tile_seq, const int* tile_row0,
                           const int* tile_n, const int* row_pos, const u64* pages,
                           const int* page0, int page_rows, long long k_off, long long val_off,
                           int n_heads, int n_kv_heads, int hd, float scale, int window) {
    extern __shared__ float4 attn_smem[];
    const int ldk = hd + 4;                          // padded: the 8 key rows of a phase hit 8 bank groups
    float* qs = (float*)attn_smem;                   // [ATTN_ROWS][hd], scaled
    float* ks = qs + ATTN_ROWS * hd;                 // [ATTN_KEYS][hd + 4]
    float* vs = ks + ATTN_KEYS * ldk;                // [ATTN_KEYS][hd]
    const int t = threadIdx.x, pr = t >> 3, c = t & 7, lane = t & 31;
    const int tile = blockIdx.x, head = blockIdx.y;
    const int seq = tile_seq[tile], row0 = tile_row0[tile], n_rows = tile_n[tile];
    const int kv_head = head / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * hd, q_dim = n_heads * hd, h4 = hd / 4;
    for (int e = t; e < ATTN_ROWS * h4; e += blockDim.x) {
        const int r = e / h4, d4 = e - r * h4;
        float4 v;
        v.x = v.y = v.z = v.w = 0.0f;
        if (r < n_rows) {
            v = ((const float4*)(q + (size_t)(row0 + r) * q_dim + head * hd))[d4];
            v.x *= scale; v.y *= scale; v.z *= scale; v.w *= scale;
        }
        ((float4*)qs)[e] = v;
    }
    int pos[2], lo[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = min(2 * pr + i, n_rows - 1);
        pos[i] = 2 * pr + i < n_rows ? row_pos[row0 + r] : -1;  // a padding row sees nothing
        lo[i] = window > 0 ? max(0, pos[i] - window + 1) : 0;
    }
    // The keys any row of the tile sees.
    const int first_pos = row_pos[row0], key_hi = row_pos[row0 + n_rows - 1];
    const int key_lo = window > 0 ? max(0, first_pos - window + 1) : 0;
    const u64* sp = pages + page0[seq];

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float4 acc[2][D4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < D4; j++) acc[i][j].x = acc[i][j].y = acc[i][j].z = acc[i][j].w = 0.0f;

    for (int base = key_lo; base <= key_hi; base += ATTN_KEYS) {
        const int n_keys = min(ATTN_KEYS, key_hi - base + 1);
        __syncthreads();  // the previous stage is done with ks and vs (and qs is written)
        for (int e = t; e < ATTN_KEYS * h4; e += blockDim.x) {
            const int j = e / h4, d = 4 * (e - j * h4);
            float kv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, vv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (j < n_keys) {
                const int key = base + j;
                const KV* kr = (const KV*)sp[key / page_rows] + k_off
                    + (long long)(key % page_rows) * kv_dim + kv_head * hd + d;
                load4(kr, kv);
                load4(kr + val_off, vv);
            }
            float4 k4, v4;
            k4.x = kv[0]; k4.y = kv[1]; k4.z = kv[2]; k4.w = kv[3];
            v4.x = vv[0]; v4.y = vv[1]; v4.z = vv[2]; v4.w = vv[3];
            *(float4*)&ks[j * ldk + d] = k4;
            *(float4*)&vs[j * hd + d] = v4;
        }
        __syncthreads();
        float s[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int kk = 0; kk < 4; kk++) s[i][kk] = 0.0f;
        for (int d = 0; d < hd; d += 4) {
            const float4 q0 = *(const float4*)&qs[(2 * pr) * hd + d];
            const float4 q1 = *(const float4*)&qs[(2 * pr + 1) * hd + d];
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const float4 k4 = *(const float4*)&ks[(c + 8 * kk) * ldk + d];
                s[0][kk] += dot4(q0, k4);
                s[1][kk] += dot4(q1, k4);
            }
        }
        float p[2][4];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const int key = base + c + 8 * kk;
                if (c + 8 * kk >= n_keys || key > pos[i] || key < lo[i]) s[i][kk] = -INFINITY;
                mx = fmaxf(mx, s[i][kk]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            const float m_new = fmaxf(m[i], mx);
            float sum = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                p[i][kk] = s[i][kk] == -INFINITY ? 0.0f : expf(s[i][kk] - m_new);
                sum += p[i][kk];
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            const float corr = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            l[i] = l[i] * corr + sum;
            m[i] = m_new;
#pragma unroll
            for (int j = 0; j < D4; j++) {
                acc[i][j].x *= corr; acc[i][j].y *= corr; acc[i][j].z *= corr; acc[i][j].w *= corr;
            }
        }
        const int src0 = lane & ~7;
#pragma unroll
        for (int j = 0; j < ATTN_KEYS; j++) {
            const float p0 = __shfl_sync(0xffffffffu, p[0][j >> 3], src0 + (j & 7));
            const float p1 = __shfl_sync(0xffffffffu, p[1][j >> 3], src0 + (j & 7));
#pragma unroll
            for (int i4 = 0; i4 < D4; i4++) {
                const int d = 4 * c + 32 * i4;
                if (d < hd) {
                    const float4 v4 = *(const float4*)&vs[j * hd + d];
                    acc[0][i4].x += p0 * v4.x; acc[0][i4].y += p0 * v4.y;
                    acc[0][i4].z += p0 * v4.z; acc[0][i4].w += p0 * v4.w;
                    acc[1][i4].x += p1 * v4.x; acc[1][i4].y += p1 * v4.y;
                    acc[1][i4].z += p1 * v4.z; acc[1][i4].w += p1 * v4.w;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = 2 * pr + i;
        if (r >= n_rows) continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float* o = out + (size_t)(row0 + r) * q_dim + head * hd;
#pragma unroll
        for (int i4 = 0; i4 < D4; i4++) {
            const int d = 4 * c + 32 * i4;
            if (d < hd) {
                float4 v = acc[i][i4];
                v.x *= inv; v.y *= inv; v.z *= inv; v.w *= inv;
                *(float4*)&o[d] = v;
            }
        }
    }
}

#define ATTN_PAGED(NAME, KV, D4)                                                                \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                    \
        const float* q, float* out, const int* tile_seq, const int* tile_row0,                 \
        const int* tile_n, const int* row_pos, const u64* pages, const int* page0,             \
        int page_rows, long long k_off, long long val_off, int n_heads, int n_kv_heads,        \
        int hd, float scale, int window) {                                                     \
        DEP_ENTER();                                                                      \
        attn_paged<KV, D4>(q, out, tile_seq, tile_row0, tile_n, row_pos, pages, page0,         \
                           page_rows, k_off, val_off, n_heads, n_kv_heads, hd, scale, window); \
    }
// One kernel per page type and head size class (up to 32, 64, 128, 256 dimensions):
// NAME_f32_d1 .. NAME_f16_d8.
#define ATTN_VARIANTS(MACRO, NAME)                                                             \
    MACRO(NAME##_f32_d1, float, 1) MACRO(NAME##_f32_d2, float, 2)                              \
    MACRO(NAME##_f32_d4, float, 4) MACRO(NAME##_f32_d8, float, 8)                              \
    MACRO(NAME##_f16_d1, f16_t, 1) MACRO(NAME##_f16_d2, f16_t, 2)                              \
    MACRO(NAME##_f16_d4, f16_t, 4) MACRO(NAME##_f16_d8, f16_t, 8)

ATTN_VARIANTS(ATTN_PAGED, attn_paged)

// Decode attention: one query row per sequence (rows == sequences), over paged keys and values
// read in place (or staged ahead, below), DECODE_WARPS warps per (sequence, query heads: one, or
// G of one KV head) splitting the keys: warp w takes chunks w, w + DECODE_WARPS, ... of 32 keys,
// lane j scores key j of a chunk for each head, each warp keeps its own online softmax per head,
// and the warps' partial results are merged at the end. hd must be a multiple of 4 (16-byte rows
// for f32 pages, 8-byte for f16) and at most 256. Grid: (rows, head blocks, splits). With splits
// > 1 (few rows: flash-decoding), block z takes the z-th of `splits` equal spans (of `min_span`
// keys or more) of the row's keys; where more than one span holds keys, each writes its
// unnormalized partial (max, sum, acc[hd]) per head to part[((row * n_heads + head) * splits +
// z) * (hd + 2)] and the last of a (row, heads)'s blocks to finish (a ticket from
// counters[row * n_heads + first head], zero between launches) merges them.

// 4 warps: small blocks, so that many (row, head) blocks are resident at once (a batch of 64
// rows x 16 heads ran in 4 waves of 8-warp blocks).
#define DECODE_WARPS 4

// Staging ahead (launches of few (row, head) pairs; launch.rs `decode_stage_bytes`): before a
// decode attention block waits for the kernel before it (which writes the query and the key
// and value row at the current position, and nothing else the block reads), each warp copies
// the key and value rows of the first DECODE_STAGE_ROWS keys of its first chunk that earlier
// steps wrote into shared memory (rows padded by 16 bytes, which keeps them aligned for the
// copies and lets lane j read key row j without bank conflicts in f32, 2-way in f16), so their
// trip to memory overlaps the kernels before; the row at the current position follows after
// the wait. Enabled by launching with that much dynamic shared memory (H200, Qwen3-0.6B shape,
// batch 1: graph 1.12 -> 1.05 ms per decode step).
#define DECODE_STAGE_ROWS(D) ((D) >= 8 ? 16 : 32)
extern __shared__ __align__(16) unsigned char attn_stage[];

// Copies 16 bytes from global to shared memory past L1 (the line may hold a row that the
// kernel before writes): asynchronously where the architecture can (sm_80 and later; call
// stage_wait before reading), else through registers.
__device__ __forceinline__ void stage16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
    *(float4*)dst = __ldcg((const float4*)src);
#endif
}

// Waits for this thread's stage16 copies; the caller synchronizes the threads that read them.
__device__ __forceinline__ void stage_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Stages key rows [r0, r1] (and their value rows) of one chunk into sk / sv (rows of `ks`
// elements, row r at (r - c0) ks), 16 bytes per lane at a time.
template <typename KV>
__device__ void stage_rows(KV* sk, KV* sv, int ks, int c0, int r0, int r1, const u64* sp,
                           int page_rows, long long k_off, long long val_off, int kv_dim,
                           int kv_off, int hd, int lane) {
    const int per_row = hd * (int)sizeof(KV) / 16;
    const int n = (r1 - r0 + 1) * per_row;
    for (int i = lane; i < n; i += 32) {
        const int key = r0 + i / per_row, c = (i % per_row) * (16 / (int)sizeof(KV));
        const KV* src = (const KV*)sp[key / page_rows] + k_off
            + (long long)(key % page_rows) * kv_dim + kv_off + c;
        stage16(sk + (key - c0) * ks + c, src);
        stage16(sv + (key - c0) * ks + c, src + val_off);
    }
}

// One head of a layer's fused Q/K/V row prepared for attention by one warp, in two parts:
// head_consts, before the kernel waits for the product (what does not depend on it: the norm's
// weights and the rotation's cos/sin at the row's position, a step input), then head_prep:
// src [hd] into x [hd] (shared, the warp's own), the optional per-head RMSNorm (weight w,
// Qwen3), then with `rotate` rotate-half RoPE at position p (`half` pairs, cos/sin scaled by
// `attn`). What split_columns + RmsNorm + Rope compute. Lane `lane` holds dimensions lane + 32 i
// (hd <= 32 PREP_D) and pairs lane + 32 j (half <= 32 PREP_H).
#define PREP_D 8
#define PREP_H 4
struct HeadConsts {
    float w[PREP_D], c[PREP_H], s[PREP_H];
};

__device__ __forceinline__ HeadConsts head_consts(const float* w, float p, const float* inv_freq,
                                                  int half, float attn, int hd, bool rotate,
                                                  int lane) {
    HeadConsts k;
#pragma unroll
    for (int i = 0; i < PREP_D; i++) {
        const int d = lane + 32 * i;
        k.w[i] = w != nullptr && d < hd ? w[d] : 1.0f;
    }
#pragma unroll
    for (int j = 0; j < PREP_H; j++) {
        const int i = lane + 32 * j;
        k.c[j] = k.s[j] = 0.0f;
        if (rotate && i < half) {
            const float angle = p * inv_freq[i];
            k.c[j] = cosf(angle) * attn;
            k.s[j] = sinf(angle) * attn;
        }
    }
    return k;
}

// Ends with the warp synchronized. The row's values are loaded together (one trip to memory).
__device__ void head_prep(const float* src, float* x, const HeadConsts& k, bool norm, float eps,
                          int half, int hd, bool rotate, int lane) {
    float v[PREP_D];
#pragma unroll
    for (int i = 0; i < PREP_D; i++) {
        const int d = lane + 32 * i;
        v[i] = d < hd ? src[d] : 0.0f;
    }
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < PREP_D; i++) ss += v[i] * v[i];
        const float rs = 1.0f / sqrtf(warp_sum(ss) / (float)hd + eps);
#pragma unroll
        for (int i = 0; i < PREP_D; i++) v[i] = k.w[i] * (v[i] * rs);
    }
#pragma unroll
    for (int i = 0; i < PREP_D; i++) {
        const int d = lane + 32 * i;
        if (d < hd) x[d] = v[i];
    }
    __syncwarp();
    if (rotate) {
#pragma unroll
        for (int j = 0; j < PREP_H; j++) {
            const int i = lane + 32 * j;
            if (i < half) {
                const float a = x[i], b = x[i + half];
                x[i] = a * k.c[j] - b * k.s[j];
                x[i + half] = b * k.c[j] + a * k.s[j];
            }
        }
        __syncwarp();
    }
}

// The attention input of one layer from its fused Q/K/V product, in one pass: per row r of
// qkv [rows, (n_heads + 2 n_kv_heads) * hd] and per head, head_prep (queries and keys rotated,
// values as they are), then the query to q_out [rows, n_heads * hd] and the key and value rows
// straight into the KV page at dst[r] (+ k_off, + val_off). Grid: (rows, ceil((n_heads + 2
// n_kv_heads) / QKV_PREP_WARPS)); block: a warp per head. (Preparing a decode step's heads inside
// decode attention instead, one launch fewer, measured slower on an H100, 2026-12-06: batch-1
// graph 1.021 -> 1.038 ms, 64-row graph 2.51 -> 2.76 ms.)
#define QKV_PREP_WARPS 4
template <typename KV>
__device__ void qkv_prep(const float* qkv, float* q_out, const u64* dst, const int* pos,
                         const float* inv_freq, int half, float attn, const float* q_w,
                         const float* k_w, float eps, int n_heads, int n_kv_heads, int hd,
                         long long k_off, long long val_off) {
    __shared__ float xs[QKV_PREP_WARPS][256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x, h = blockIdx.y * QKV_PREP_WARPS + warp;
    const bool live = h < n_heads + 2 * n_kv_heads;
    const int width = (n_heads + 2 * n_kv_heads) * hd;
    const int kind = h < n_heads ? 0 : (h < n_heads + n_kv_heads ? 1 : 2);  // q, k, v
    const float* w = kind == 0 ? q_w : (kind == 1 ? k_w : nullptr);
    // Positions are step inputs (copied before the step) and the weights constant: read, and
    // the rotation computed, while the product before is still running (H100, 2026-12-06: with
    // decode attention's two changes, batch-1 graph 0.925 -> 0.902 ms; the preparation and
    // attention 11.5 -> 10.6 us a layer).
    HeadConsts k = {};
    DEP_TRIGGER();
    if (live) k = head_consts(w, (float)pos[r], inv_freq, half, attn, hd, kind != 2, lane);
    DEP_ENTER();
    if (!live) return;
    float* x = xs[warp];
    head_prep(qkv + (size_t)r * width + (size_t)h * hd, x, k, w != nullptr, eps, half, hd,
              kind != 2, lane);
    if (kind == 0) {
        float* o = q_out + (size_t)r * n_heads * hd + (size_t)h * hd;
        for (int d = lane; d < hd; d += 32) o[d] = x[d];
    } else {
        const int kvh = kind == 1 ? h - n_heads : h - n_heads - n_kv_heads;
        KV* o = (KV*)dst[r] + k_off + (kind == 2 ? val_off : 0) + (long long)kvh * hd;
        for (int d = lane; d < hd; d += 32) store_kv(o + d, x[d]);
    }
}

#define QKV_PREP_ENTRY(NAME, KV)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * QKV_PREP_WARPS) NAME(                   \
        const float* qkv, float* q_out, const u64* dst, const int* pos, const float* inv_freq, \
        int half, float attn, const float* q_w, const float* k_w, float eps, int n_heads,      \
        int n_kv_heads, int hd, long long k_off, long long val_off) {                          \
        qkv_prep<KV>(qkv, q_out, dst, pos, inv_freq, half, attn, q_w, k_w, eps, n_heads,       \
                     n_kv_heads, hd, k_off, val_off);                                          \
    }
KV_ENTRIES(QKV_PREP_ENTRY, qkv_prep)

// G query heads per block (grid y: KV heads x ceil(group / G) where group = n_heads /
// n_kv_heads): the G heads of one KV head read each key and value row once for all of them.
template <typename KV, int D, int G>
__device__ void attn_decode(const float* q, float* out, const int* row_pos, const u64* pages,
                            const int* page0, int page_rows, long long k_off, long long val_off,
                            int n_heads, int n_kv_heads, int hd, float scale, int window,
                            int splits, float* part, unsigned* counters, int min_span) {
    __shared__ float qs[G][256];
    __shared__ float part_m[DECODE_WARPS][G], part_l[DECODE_WARPS][G];
    __shared__ float part_acc[DECODE_WARPS][G][256];
    const int seq = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = n_heads / n_kv_heads, chunks = (group + G - 1) / G;
    const int kv_head = blockIdx.y / chunks;
    // This block's heads: head0 .. head0 + gh (heads past gh, when G does not divide the group,
    // have zero queries and are not written).
    const int head0 = kv_head * group + (blockIdx.y - kv_head * chunks) * G;
    const int gh = min(G, (kv_head + 1) * group - head0);
    const int kv_dim = n_kv_heads * hd, q_dim = n_heads * hd;
    const int pos = row_pos[seq];
    const int lo0 = window > 0 ? max(0, pos - window + 1) : 0;
    // At least `min_span` keys per block (a multiple of 32; launch.rs), so a short context
    // keeps few blocks busy and a long one spreads over all: only the first `used` blocks of a
    // (row, head) hold keys; the others return at once, and with one block used it writes the
    // output itself (no partials, no ticket, no merge).
    const int keys = pos - lo0 + 1;
    const int used = min(splits, max(1, (keys + min_span - 1) / min_span));
    if (blockIdx.z >= used) return;
    const int span = max(min_span, (keys + splits - 1) / splits);
    const int lo = lo0 + blockIdx.z * span;
    const int hi = min(pos, lo + span - 1);
    const u64* sp = pages + page0[seq];
    // Row positions and page tables are step inputs (copied before the step), and rows
    // before `pos` were written by earlier steps: both may be read before the wait.
    constexpr int SR = DECODE_STAGE_ROWS(D);
    const int ks = hd + 16 / (int)sizeof(KV);
    unsigned dyn_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
    const bool staged = (hd * (int)sizeof(KV)) % 16 == 0
        && dyn_smem >= (unsigned)(DECODE_WARPS * SR * ks * 2 * (int)sizeof(KV));
    KV* sk = (KV*)attn_stage + (size_t)warp * SR * ks * 2;
    KV* sv = sk + SR * ks;
    const int c0 = lo + warp * 32, c1 = min(hi, c0 + SR - 1);
    if (staged) {
        stage_rows<KV>(sk, sv, ks, c0, c0, min(c1, pos - 1), sp, page_rows, k_off, val_off,
                       kv_dim, kv_head * hd, hd, lane);
    }
    DEP_ENTER();
    if (staged && c0 <= pos && pos <= c1) {
        stage_rows<KV>(sk, sv, ks, c0, pos, pos, sp, page_rows, k_off, val_off, kv_dim,
                       kv_head * hd, hd, lane);
    }
    // The queries' loads go out while the current row's copy is in flight (one trip to memory
    // for both, not two in a row).
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
        const int g = i / hd, d = i - g * hd;
        qs[g][d] = g < gh ? q[(size_t)seq * q_dim + (head0 + g) * hd + d] * scale : 0.0f;
    }
    if (staged) stage_wait();
    __syncthreads();
    float m[G], l[G], acc[G][D];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < D; i++) acc[g][i] = 0.0f;
    }
    for (int base = lo + warp * 32; base <= hi; base += DECODE_WARPS * 32) {
        const int key = base + lane;
        float s[G];
#pragma unroll
        for (int g = 0; g < G; g++) s[g] = -INFINITY;
        if (key <= hi) {
            const KV* kr = staged && key <= c1 ? sk + (key - c0) * ks
                : (const KV*)sp[key / page_rows] + k_off
                    + (long long)(key % page_rows) * kv_dim + kv_head * hd;
            // Loads in batches of 16 (64 dimensions), issued before they are used: a key
            // row of 128 takes two round trips to memory.
            float dot[G];
#pragma unroll
            for (int g = 0; g < G; g++) dot[g] = 0.0f;
            for (int d0 = 0; d0 < hd; d0 += 64) {
                typename Stored4<KV>::T raw[16];
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    if (d0 + 4 * u < hd) raw[u] = stored4(kr + d0 + 4 * u);
                }
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    const int d = d0 + 4 * u;
                    if (d < hd) {
                        float kv[4];
                        widen4(raw[u], kv);
#pragma unroll
                        for (int g = 0; g < G; g++)
                            dot[g] += qs[g][d] * kv[0] + qs[g][d + 1] * kv[1]
                                    + qs[g][d + 2] * kv[2] + qs[g][d + 3] * kv[3];
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < G; g++) s[g] = dot[g];
        }
        float p[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            // A head whose scores are all -inf so far adds nothing (p = 0, nothing rescaled).
            const float m_new = fmaxf(m[g], warp_max(s[g]));
            p[g] = s[g] == -INFINITY ? 0.0f : expf(s[g] - m_new);
            const float corr = m_new == -INFINITY ? 1.0f : expf(m[g] - m_new);
            l[g] = l[g] * corr + warp_sum(p[g]);
            m[g] = m_new;
#pragma unroll
            for (int i = 0; i < D; i++) acc[g][i] *= corr;
        }
        const int n_keys = min(32, hi - base + 1);
        // Value rows VB keys at a time (16, or 8 for heads over 128), loaded before they are
        // used.
        constexpr int VB = D >= 8 ? 8 : 16;
        for (int j0 = 0; j0 < n_keys; j0 += VB) {
            KV vv[VB][D];  // as stored, widened below (see Stored4)
#pragma unroll
            for (int u = 0; u < VB; u++) {
                const int kj = base + j0 + u;
                if (j0 + u < n_keys) {
                    const KV* vr = staged && kj <= c1 ? sv + (kj - c0) * ks
                        : (const KV*)sp[kj / page_rows] + k_off + val_off
                            + (long long)(kj % page_rows) * kv_dim + kv_head * hd;
#pragma unroll
                    for (int i = 0; i < D; i++) {
                        const int d = lane + 32 * i;
                        vv[u][i] = d < hd ? vr[d] : (KV)0;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < VB; u++) {
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const float pj = __shfl_sync(0xffffffffu, p[g], j0 + u);
                    if (j0 + u < n_keys) {
#pragma unroll
                        for (int i = 0; i < D; i++) acc[g][i] += pj * load_kv(&vv[u][i]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) { part_m[warp][g] = m[g]; part_l[warp][g] = l[g]; }
#pragma unroll
        for (int i = 0; i < D; i++) {
            const int d = lane + 32 * i;
            if (d < hd) part_acc[warp][g][d] = acc[g][i];
        }
    }
    __syncthreads();
    for (int g = 0; g < gh; g++) {
        const int head = head0 + g;
        float gm = -INFINITY;
        for (int w = 0; w < DECODE_WARPS; w++) gm = fmaxf(gm, part_m[w][g]);
        float gl = 0.0f;
        for (int w = 0; w < DECODE_WARPS; w++)
            gl += part_m[w][g] == -INFINITY ? 0.0f : part_l[w][g] * expf(part_m[w][g] - gm);
        const float inv = gl > 0.0f ? 1.0f / gl : 0.0f;
        float* pp = part + ((size_t)(seq * n_heads + head) * splits + blockIdx.z) * (hd + 2);
        if (used > 1 && threadIdx.x == 0) { pp[0] = gm; pp[1] = gl; }
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < DECODE_WARPS; w++) {
                if (part_m[w][g] != -INFINITY) o += part_acc[w][g][d] * expf(part_m[w][g] - gm);
            }
            if (used > 1) {
                pp[2 + d] = o;
            } else if (splits > 1) {
                // What the merge of one partial computes.
                out[(size_t)seq * q_dim + head * hd + d] = gl > 0.0f ? o / gl : 0.0f;
            } else {
                out[(size_t)seq * q_dim + head * hd + d] = o * inv;
            }
        }
    }
    if (used == 1) return;
    // The last of the (row, heads)'s blocks to finish merges the splits' partials (so no merge
    // launch): each block takes a ticket (the counter of its first head) once its threads are
    // done, with release and acquire semantics at GPU scope (the block's partials, ordered
    // before it by the barrier, are visible to the block that takes the last ticket; one trip
    // to memory where a fence and then an atomic took two); the counter is left at zero for
    // the next launch (and the next replay of a recorded step).
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* c = counters + seq * n_heads + head0;
        unsigned prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                     : "=r"(prev)
                     : "l"(c)
                     : "memory");
        last = prev == (unsigned)(used - 1);
        if (last) *c = 0u;
    }
    __syncthreads();
    if (!last) return;
    __shared__ float fz[32];
    __shared__ float tot_m, tot_l;
    for (int g = 0; g < gh; g++) {
        const int head = head0 + g;
        const float* p0 = part + (size_t)(seq * n_heads + head) * splits * (hd + 2);
        if (g > 0) __syncthreads();  // the previous head is done with fz and tot_l
        if (warp == 0) {
            const float mz = lane < used ? __ldcg(p0 + lane * (hd + 2)) : -INFINITY;
            const float lz = lane < used ? __ldcg(p0 + lane * (hd + 2) + 1) : 0.0f;
            const float gmax = warp_max(mz);
            const float f = mz == -INFINITY ? 0.0f : expf(mz - gmax);
            fz[lane] = f;
            // Summed in split order, as the separate merge did.
            float lsum = 0.0f;
            for (int z = 0; z < used; z++) lsum += __shfl_sync(0xffffffffu, lz * f, z);
            if (lane == 0) { tot_m = gmax; tot_l = lsum; }
        }
        __syncthreads();
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float o = 0.0f;
            for (int z = 0; z < used; z++) {
                if (fz[z] != 0.0f) o += __ldcg(p0 + z * (hd + 2) + 2 + d) * fz[z];
            }
            out[(size_t)seq * q_dim + head * hd + d] = tot_l > 0.0f ? o / tot_l : 0.0f;
        }
    }
}

// Two entries per variant, both with up to two blocks resident per SM: `attn_decode_*` (one
// query head per block) for steps of few (row, head) pairs, and `attn_decode_many_*`
// (DECODE_MANY_HEADS query heads of one KV head per block) for steps of more pairs than two
// blocks per SM hold, of heads sharing KV heads (launch.rs),
// where a batch of 64 rows x 16 heads of Qwen3-0.6B (8 KV heads) is 512 blocks, 1.3 waves on
// 132 SMs, each key and value row read once for its two query heads (one head per block: 1,024
// blocks, 2.6 waves, each row read twice).
#define DECODE_MANY_HEADS 2
#define ATTN_DECODE_ENTRY(NAME, KV, D, MIN_BLOCKS, G)                                          \
    extern "C" __global__ void __launch_bounds__(32 * DECODE_WARPS, MIN_BLOCKS) NAME(          \
        const float* q, float* out, const int* row_pos, const u64* pages, const int* page0,    \
        int page_rows, long long k_off, long long val_off, int n_heads, int n_kv_heads,        \
        int hd, float scale, int window, int splits, float* part, unsigned* counters,         \
        int min_span) {                                                                        \
        attn_decode<KV, D, G>(q, out, row_pos, pages, page0, page_rows, k_off, val_off,       \
                              n_heads, n_kv_heads, hd, scale, window, splits, part, counters, \
                              min_span);                                                       \
    }
#define ATTN_DECODE(NAME, KV, D) ATTN_DECODE_ENTRY(NAME, KV, D, 1, 1)
#define ATTN_DECODE_MANY(NAME, KV, D) ATTN_DECODE_ENTRY(NAME, KV, D, 2, DECODE_MANY_HEADS)
ATTN_VARIANTS(ATTN_DECODE, attn_decode)
ATTN_VARIANTS(ATTN_DECODE_MANY, attn_decode_many)

