// GGUF block-type products on the GPU (appended to kernels.cu by backend/cuda/mod.rs).
//
// Q4_0, Q4_1, Q5_0, Q4_K, Q6_K (and Q8_0 where it shares a matrix with them): one
// matrix-vector kernel per type (gemv_blocks<T>) for up to 8 rows a group (groups along the
// grid's y), a tiled kernel (gemm_blocks<T>) beyond. A matrix keeps its file's bytes, with each
// block's f16 scale(s) moved into a separate array so the rest (the body) is 4-byte aligned:
// BLK_BODY bytes and BLK_HALVES f16 per block (see quant.rs). The activations are quantized as
// the CPU backend does for each weight type (quant/act.rs, ggml's x86 quantizers; here
// quantize_rows): Q8_0 per 32 (Q4_0, Q5_0, Q8_0), Q8_1 per 32 (Q4_1: plus s = f16(d · Σq)),
// Q8_K per 256 (Q4_K, Q6_K: f32 scale, signed-max rule, sums). Each lane takes units of 32
// values: it unpacks them to signed codes (the type's offset removed), takes exact integer dot
// products with dp4a, and adds the unit's float term as the CPU reference does per block
// ((d_w · d_a) · Σ, minus (dmin · d_a) · Σ mins for Q4_K, plus m · s for Q4_1); only the order
// of the f32 unit terms differs from the CPU.
//
// Q8_0 matrices of their own are held as int8 codes [n, k] and f16 scales [n, k / 32] (the
// blocks split in two arrays, so rows of codes are 16-byte aligned); their matrix-vector kernel
// is gemv_q8, with d = f16(amax / 127) and q = round_half_even(x · 127 / amax) per block of 32.

#define T_Q4_0 0
#define T_Q4_1 1
#define T_Q5_0 2
#define T_Q4_K 3
#define T_Q6_K 4
#define T_Q8_0 5

// Body bytes and f16 scales per block, and units of 32 values per block.
__host__ __device__ constexpr int blk_body(int t) {
    return t == T_Q4_0 || t == T_Q4_1 ? 16
         : t == T_Q5_0               ? 20
         : t == T_Q8_0               ? 32
         : t == T_Q4_K               ? 140
                                     : 208;
}
__host__ __device__ constexpr int blk_halves(int t) {
    return t == T_Q4_1 || t == T_Q4_K ? 2 : 1;
}
__host__ __device__ constexpr int blk_units(int t) { return t == T_Q4_K || t == T_Q6_K ? 8 : 1; }

// 4-byte words of a block's body one unit needs (load_unit), by type.
__host__ __device__ constexpr int raw_words(int t) {
    return t == T_Q4_0 || t == T_Q4_1 ? 4
         : t == T_Q5_0               ? 5
         : t == T_Q8_0               ? 8
         : t == T_Q4_K               ? 11
                                     : 17;
}

// One unit of weights as loaded from memory (load_unit), before decode_unit unpacks it: the
// body words it needs and its block's f16 scales. Kept apart so that loads can be issued
// early (before the kernel waits for the one before it, and a unit ahead of the products).
template <int T>
struct RawUnit {
    unsigned w[raw_words(T)];
    f16_t h[2];
};

// The unpacked signed codes of one unit: 8 words of 4 values, in the activations' order.
struct Unit {
    int w[8];
};

// A weight unit's scales as the products combine them: the f16 scale(s) of its block (d, and
// dm: Q4_1's m or Q4_K's dmin) and its integer scales (Q4_K: sc for both halves and the min mi;
// Q6_K: one per half of 16; 1 otherwise).
struct UnitScales {
    float d, dm;
    int s0, s1, mi;
};

// Loads unit j of the block at `blk` (4-byte aligned body) with scales `h`.
template <int T>
__device__ __forceinline__ void load_unit(const unsigned char* blk, const f16_t* h, int j,
                                          RawUnit<T>& r) {
    const unsigned* b = (const unsigned*)blk;
    r.h[0] = h[0];
    if constexpr (blk_halves(T) == 2) r.h[1] = h[1];
    if constexpr (T == T_Q4_K) {
        // The 32 code bytes of sub-blocks 2p, 2p + 1, and the scale bytes j's six-bit scale and
        // min are made of: j < 4: s[j], s[j + 4]; else s[j + 4], s[j - 4], s[j].
        const unsigned* qs = b + 3 + 8 * (j >> 1);
#pragma unroll
        for (int i = 0; i < 8; i++) r.w[i] = qs[i];
        r.w[8] = blk[j < 4 ? j : j + 4];
        r.w[9] = blk[j < 4 ? j + 4 : j - 4];
        r.w[10] = blk[j];
    } else if constexpr (T == T_Q6_K) {
        // Values 128h + 32q + l (l < 32) are in ql[64h + 32(q & 1) + l] (low or high nibble)
        // and bits 2q.. of qh[32h + l]; their scales in bytes 192 + 2j and 193 + 2j.
        const int hh = j >> 2, q = j & 3;
        const unsigned* ql = b + (64 * hh + 32 * (q & 1)) / 4;
        const unsigned* qh = b + (128 + 32 * hh) / 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            r.w[i] = ql[i];
            r.w[8 + i] = qh[i];
        }
        r.w[16] = b[(192 + 2 * j) / 4];
    } else if constexpr (T == T_Q8_0) {
        // 32 codes, 32-byte aligned (a Q8_0 body is the whole block but its scale).
        const uint4 lo = ld_stream((const uint4*)blk), hi = ld_stream((const uint4*)blk + 1);
        r.w[0] = lo.x, r.w[1] = lo.y, r.w[2] = lo.z, r.w[3] = lo.w;
        r.w[4] = hi.x, r.w[5] = hi.y, r.w[6] = hi.z, r.w[7] = hi.w;
    } else {
#pragma unroll
        for (int i = 0; i < raw_words(T); i++) r.w[i] = b[i];
    }
}

// Unpacks unit j (as loaded by load_unit) into signed codes (the type's offset removed) and
// its scales.
template <int T>
__device__ __forceinline__ void decode_unit(const RawUnit<T>& r, int j, Unit& u,
                                            UnitScales& sc) {
    sc.d = f16_to_f32(r.h[0]);
    sc.dm = blk_halves(T) == 2 ? f16_to_f32(r.h[1]) : 0.0f;
    sc.s0 = 1;
    sc.s1 = 1;
    sc.mi = 0;
    if constexpr (T == T_Q8_0) {
#pragma unroll
        for (int i = 0; i < 8; i++) u.w[i] = (int)r.w[i];
    } else if constexpr (T == T_Q4_0 || T == T_Q4_1) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int lo = (int)(r.w[i] & 0x0F0F0F0Fu), hi = (int)((r.w[i] >> 4) & 0x0F0F0F0Fu);
            if constexpr (T == T_Q4_0) {
                lo = __vsubss4(lo, 0x08080808);
                hi = __vsubss4(hi, 0x08080808);
            }
            u.w[i] = lo;
            u.w[4 + i] = hi;
        }
    } else if constexpr (T == T_Q5_0) {
        const unsigned qh = r.w[0];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned q = r.w[1 + (i & 3)];
            const unsigned lo = i < 4 ? q & 0x0F0F0F0Fu : (q >> 4) & 0x0F0F0F0Fu;
            const unsigned h = qh >> (4 * i);
            const unsigned hb = ((h << 4) & 0x10u) | ((h << 11) & 0x1000u) |
                                ((h << 18) & 0x100000u) | ((h << 25) & 0x10000000u);
            u.w[i] = __vsubss4((int)(lo | hb), 0x10101010);
        }
    } else if constexpr (T == T_Q4_K) {
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int i = 0; i < 8; i++) u.w[i] = (int)((r.w[i] >> sh) & 0x0F0F0F0Fu);
        const unsigned a = r.w[8], b = r.w[9], c = r.w[10];
        if (j < 4) {
            sc.s0 = a & 63;
            sc.mi = b & 63;
        } else {
            sc.s0 = (a & 0x0F) | ((b >> 6) << 4);
            sc.mi = (a >> 4) | ((c >> 6) << 4);
        }
        sc.s1 = sc.s0;
    } else {
        const int q = j & 3, sl = 4 * (q >> 1), sh = 2 * q;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned lo = (r.w[i] >> sl) & 0x0F0F0F0Fu;
            const unsigned hi = ((r.w[8 + i] >> sh) & 0x03030303u) << 4;
            u.w[i] = __vsubss4((int)(lo | hi), 0x20202020);
        }
        const int at = 16 * (j & 1);
        sc.s0 = (int)(signed char)(r.w[16] >> at);
        sc.s1 = (int)(signed char)(r.w[16] >> (at + 8));
    }
}

// The f32 term of one unit: t0 / t1 the integer sums of its two halves of 16 with the
// activation codes, dx and xa the activation unit's scale and extra term (quantize_rows), in
// the CPU reference's form per block.
template <int T>
__device__ __forceinline__ float unit_term(const UnitScales& w, int t0, int t1, float dx,
                                           float xa) {
    if constexpr (T == T_Q4_K) {
        return (w.d * dx) * (float)(w.s0 * (t0 + t1)) - (w.dm * dx) * (float)(w.mi * (int)xa);
    } else if constexpr (T == T_Q6_K) {
        return (w.d * dx) * (float)(w.s0 * t0 + w.s1 * t1);
    } else if constexpr (T == T_Q4_1) {
        return (float)(t0 + t1) * (w.d * dx) + w.dm * xa;
    } else {
        return (float)(t0 + t1) * (w.d * dx);
    }
}

// Tasks of 8 input values each thread of quantize_rows loads before it uses any (latency:
// the rows are read from L2 right after the kernel before wrote them).
#define QR_SB 2

// Task t's 8 values (split_batch's values, row t / k8, values 8 (t % k8) ..) into v, zeros
// where t >= tasks; with norm_w, also the 8 norm weights into g. Loads first, math after.
__device__ __forceinline__ void qr_load(const float* x, int row0, int k, int swiglu,
                                        const float* norm_w, int base, int tasks,
                                        float (&v)[QR_SB][8], float4 (&g)[QR_SB][2]) {
    const int k8 = k / 8, ldx = swiglu ? 2 * k : k;
    float4 a[QR_SB][2], b[QR_SB][2];
#pragma unroll
    for (int i = 0; i < QR_SB; i++) {
        const int t = base + i * blockDim.x + threadIdx.x;
        const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        a[i][0] = a[i][1] = b[i][0] = b[i][1] = g[i][0] = g[i][1] = z;
        if (t < tasks) {
            const int j = t / k8, e8 = t - j * k8;
            const float4* p = (const float4*)(x + (size_t)(row0 + j) * ldx) + 2 * e8;
            a[i][0] = p[0];
            a[i][1] = p[1];
            if (swiglu) {
                b[i][0] = p[k / 4];
                b[i][1] = p[k / 4 + 1];
            }
            if (norm_w != nullptr) {
                g[i][0] = ((const float4*)norm_w)[2 * e8];
                g[i][1] = ((const float4*)norm_w)[2 * e8 + 1];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < QR_SB; i++) {
        const float r[8] = {a[i][0].x, a[i][0].y, a[i][0].z, a[i][0].w,
                            a[i][1].x, a[i][1].y, a[i][1].z, a[i][1].w};
        const float u[8] = {b[i][0].x, b[i][0].y, b[i][0].z, b[i][0].w,
                            b[i][1].x, b[i][1].y, b[i][1].z, b[i][1].w};
#pragma unroll
        for (int e = 0; e < 8; e++) v[i][e] = swiglu ? swiglu_value(r[e], u[e]) : r[e];
    }
}

// Quantizes rows row0 .. row0 + rows - 1 of x (input mode as gemv_q8: SwiGLU of rows of 2k
// values, then an RMSNorm with norm_w) for weights of type T: codes xs [rows, k], per unit of
// 32 the scale xd and (when xa is not null) the extra term xa (Q4_1: s = f16(d · Σq); Q4_K:
// Σq of the unit; otherwise unused). Each thread takes 8 consecutive values at a time, so a
// unit of 32 is 4 neighbouring lanes and a super-block of 256 (Q8_K) one warp; the row's
// RMSNorm factor is a block sum first (every thread of the block must call this). The codes and
// scales are the CPU quantizer's (quant/act.rs); only the order of the sum of squares differs.
template <int T>
__device__ void quantize_rows(const float* x, int row0, int rows, int k, const float* norm_w,
                              float eps, int swiglu, signed char* xs, float* xd, float* xa) {
    constexpr bool kquant = T == T_Q4_K || T == T_Q6_K;
    const int lane = threadIdx.x & 31;
    const int k8 = k / 8, units = k / 32, tasks = rows * k8, step = QR_SB * blockDim.x;
    __shared__ float rs[8];
    float v[QR_SB][8];
    float4 g[QR_SB][2];
    if (norm_w != nullptr) {
        // The rows' sums of squares: per thread here, then block_rms_factors.
        float ss[8];
#pragma unroll
        for (int j = 0; j < 8; j++) ss[j] = 0.0f;
        for (int base = 0; base < tasks; base += step) {
            qr_load(x, row0, k, swiglu, nullptr, base, tasks, v, g);
#pragma unroll
            for (int i = 0; i < QR_SB; i++) {
                const int t = base + i * blockDim.x + threadIdx.x;
                float s2 = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) s2 += v[i][e] * v[i][e];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (t < tasks && j == t / k8) ss[j] += s2;
                }
            }
        }
        block_rms_factors(ss, rows, k, eps, rs);
    }
    for (int base = 0; base < tasks; base += step) {
        qr_load(x, row0, k, swiglu, norm_w, base, tasks, v, g);
#pragma unroll
        for (int i = 0; i < QR_SB; i++) {
            const int t = base + i * blockDim.x + threadIdx.x;
            const bool in = t < tasks;
            const int j = in ? t / k8 : 0, e8 = t - j * k8;
            if (norm_w != nullptr) {
                const float r = rs[j];
                const float w[8] = {g[i][0].x, g[i][0].y, g[i][0].z, g[i][0].w,
                                    g[i][1].x, g[i][1].y, g[i][1].z, g[i][1].w};
#pragma unroll
                for (int e = 0; e < 8; e++) v[i][e] = w[e] * (v[i][e] * r);
            }
            int c[8];
            float d;
            if constexpr (kquant) {
                // Q8_K over the warp's 256 values: iscale = -127 / (the value of largest
                // magnitude, the first one on ties).
                float amax = 0.0f, vmax = 0.0f;
                int imax = 0x7fffffff;
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    if (fabsf(v[i][e]) > amax) {
                        amax = fabsf(v[i][e]);
                        vmax = v[i][e];
                        imax = 8 * lane + e;
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    const float am = __shfl_xor_sync(0xffffffffu, amax, o);
                    const float vm = __shfl_xor_sync(0xffffffffu, vmax, o);
                    const int im = __shfl_xor_sync(0xffffffffu, imax, o);
                    if (am > amax || (am == amax && im < imax)) {
                        amax = am;
                        vmax = vm;
                        imax = im;
                    }
                }
                const float iscale = amax != 0.0f ? -127.0f / vmax : 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    c[e] = amax != 0.0f ? min(127, __float2int_rn(__fmul_rn(iscale, v[i][e]))) : 0;
                d = amax != 0.0f ? 1.0f / iscale : 0.0f;
            } else {
                // Per unit of 32 (4 lanes): d = f16(amax / 127), q = round(x · 127 / amax).
                float amax = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v[i][e]));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++) c[e] = __float2int_rn(__fmul_rn(v[i][e], id));
                d = amax / 127.0f;
            }
            int s = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) s += c[e];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            if (!in) continue;
            uint2 packed;
            packed.x = (c[0] & 0xff) | ((c[1] & 0xff) << 8) | ((c[2] & 0xff) << 16) |
                       ((unsigned)c[3] << 24);
            packed.y = (c[4] & 0xff) | ((c[5] & 0xff) << 8) | ((c[6] & 0xff) << 16) |
                       ((unsigned)c[7] << 24);
            *(uint2*)(xs + (size_t)j * k + 8 * e8) = packed;
            if ((lane & 3) == 0) {
                const int u = j * units + e8 / 4;
                if constexpr (kquant) {
                    xd[u] = d;
                    if (xa != nullptr) xa[u] = (float)s;
                } else {
                    xd[u] = f16_to_f32(f32_to_f16(d));
                    if (xa != nullptr) xa[u] = f16_to_f32(f32_to_f16(d * (float)s));
                }
            }
        }
    }
}

// Units of W each lane of gemv_blocks keeps in flight.
#define BLK_PF 2

// y [m, n] (+)= x · Wᵀ (y's rows ldy apart, so a matrix in parts writes its columns) for f32
// rows x (input mode as gemv_q8) and weights of type T (body, halves: see above). Block
// (bx, g) quantizes rows R g .. R g + R - 1 (R = rows_per_block <= 8) into shared memory, then
// each warp takes output columns as gemv_q8 does, unpacking each unit of W once for all rows.
// Each lane loads BLK_PF units ahead of its products; the first ones before the kernel waits
// for the one before it (the weights are not written by earlier kernels) and quantizes.
template <int T>
__device__ void gemv_blocks(const float* x, const unsigned char* body, const f16_t* halves,
                            float* y, int m, int n, int k, int ldy, int accumulate,
                            const float* norm_w, float eps, int swiglu, int rows_per_block) {
    extern __shared__ int4 xs_blk[];
    constexpr int UPB = blk_units(T), BODY = blk_body(T), HALVES = blk_halves(T);
    const int units = k / 32, nb = units / UPB;
    const int row0 = blockIdx.y * rows_per_block;
    const int rows = min(rows_per_block, m - row0);
    signed char* xs = (signed char*)xs_blk;
    float* xd = (float*)(xs + (size_t)rows * k);
    float* xa = xd + rows * units;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int stride = gridDim.x * warps;
    RawUnit<T> raw[BLK_PF];
    // Loads units base + 32 p + lane (p < BLK_PF) of column col into raw.
    auto load = [&](int col, int base) {
#pragma unroll
        for (int p = 0; p < BLK_PF; p++) {
            const int u = base + 32 * p + lane;
            if (col < n && u < units) {
                const int b = u / UPB;
                const size_t bi = (size_t)col * nb + b;
                load_unit<T>(body + bi * BODY, halves + bi * HALVES, u - b * UPB, raw[p]);
            }
        }
    };
    int col = blockIdx.x * warps + warp;
    load(col, 0);
    DEP_ENTER();
    quantize_rows<T>(x, row0, rows, k, norm_w, eps, swiglu, xs, xd, xa);
    __syncthreads();
    for (; col < n; col += stride) {
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = 0.0f;
        for (int base = 0; base < units; base += 32 * BLK_PF) {
            Unit w[BLK_PF];
            UnitScales sc[BLK_PF];
#pragma unroll
            for (int p = 0; p < BLK_PF; p++) {
                const int u = base + 32 * p + lane;
                if (u < units) decode_unit<T>(raw[p], u % UPB, w[p], sc[p]);
            }
            // The next pass's units: further along this column, or the next column's first.
            if (base + 32 * BLK_PF < units) load(col, base + 32 * BLK_PF);
            else load(col + stride, 0);
#pragma unroll
            for (int p = 0; p < BLK_PF; p++) {
                const int u = base + 32 * p + lane;
                if (u >= units) break;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (j >= rows) break;
                    const int4* a = (const int4*)(xs + (size_t)j * k + 32 * u);
                    const int4 a0 = a[0], a1 = a[1];
                    int t0 = __dp4a(w[p].w[0], a0.x, 0);
                    t0 = __dp4a(w[p].w[1], a0.y, t0);
                    t0 = __dp4a(w[p].w[2], a0.z, t0);
                    t0 = __dp4a(w[p].w[3], a0.w, t0);
                    int t1 = __dp4a(w[p].w[4], a1.x, 0);
                    t1 = __dp4a(w[p].w[5], a1.y, t1);
                    t1 = __dp4a(w[p].w[6], a1.z, t1);
                    t1 = __dp4a(w[p].w[7], a1.w, t1);
                    acc[j] += unit_term<T>(sc[p], t0, t1, xd[j * units + u], xa[j * units + u]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j >= rows) break;
            const float s = warp_sum(acc[j]);
            if (lane == 0) {
                float* o = y + (size_t)(row0 + j) * ldy + col;
                *o = accumulate ? *o + s : s;
            }
        }
    }
}

#define GEMV_BLOCKS_ENTRY(name, T)                                                             \
    extern "C" __global__ void name(const float* x, const unsigned char* body,                 \
                                    const f16_t* halves, float* y, int m, int n, int k,        \
                                    int ldy, int accumulate, const float* norm_w, float eps,   \
                                    int swiglu, int rows_per_block) {                          \
        gemv_blocks<T>(x, body, halves, y, m, n, k, ldy, accumulate, norm_w, eps, swiglu,      \
                       rows_per_block);                                                        \
    }
GEMV_BLOCKS_ENTRY(gemv_q4_0, T_Q4_0)
GEMV_BLOCKS_ENTRY(gemv_q4_1, T_Q4_1)
GEMV_BLOCKS_ENTRY(gemv_q5_0, T_Q5_0)
GEMV_BLOCKS_ENTRY(gemv_q4_k, T_Q4_K)
GEMV_BLOCKS_ENTRY(gemv_q6_k, T_Q6_K)
GEMV_BLOCKS_ENTRY(gemv_q8_0, T_Q8_0)

// Chunks of 16 codes each lane loads per pass over a column.
#define Q8_PF 4

// Rows one block of gemv_q8 takes (its grid's y dimension walks groups of them).
#define Q8_GEMV_ROWS 8

// y [m, n] (+)= x · Wᵀ for f32 rows x (input mode as split_bf16: RMSNorm with norm_w, or
// SwiGLU of rows of 2k values) and Q8_0 weights (wq [n, k], wd [n, k / 32] f16): block (bx, g)
// quantizes rows 8g .. 8g + 7 into shared memory (quantize_rows: codes, then scales, 9k / 8
// bytes a row), then each warp takes output columns as gemv does, streaming W once per row
// group (the second and later groups from L2). Each lane's loads of a pass over a column are
// issued before the pass before it multiplies (across columns too); the first ones before the
// kernel waits for the one before it.
extern "C" __global__ void gemv_q8(const float* x, const signed char* wq, const f16_t* wd,
                                   float* y, int m, int n, int k, int accumulate,
                                   const float* norm_w, float eps, int swiglu) {
    extern __shared__ int4 xs_q8[];
    const int kb = k / 32, k16 = k / 16;
    const int row0 = blockIdx.y * Q8_GEMV_ROWS;
    const int rows = min(Q8_GEMV_ROWS, m - row0);
    const int4* xs = xs_q8;
    float* xds = (float*)(xs_q8 + rows * k16);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int stride = gridDim.x * warps, per_pass = 32 * Q8_PF;
    const int passes = (k16 + per_pass - 1) / per_pass;
    uint4 next[Q8_PF];
    f16_t next_d[Q8_PF];
    // Loads chunks base + lane + 32 u (u < Q8_PF) of column col, and their scales.
    auto fetch = [&](int col, int base) {
#pragma unroll
        for (int u = 0; u < Q8_PF; u++) {
            const int c = base + lane + 32 * u;
            next[u] = make_uint4(0u, 0u, 0u, 0u);
            next_d[u] = 0;
            if (col < n && c < k16) {
                next[u] = ld_stream((const uint4*)(wq + (size_t)col * k) + c);
                next_d[u] = wd[(size_t)col * kb + (c >> 1)];
            }
        }
    };
    int col = blockIdx.x * warps + warp;
    fetch(col, 0);
    DEP_ENTER();
    quantize_rows<T_Q8_0>(x, row0, rows, k, norm_w, eps, swiglu, (signed char*)xs_q8, xds,
                          nullptr);
    __syncthreads();
    for (; col < n; col += stride) {
        float acc[Q8_GEMV_ROWS];
#pragma unroll
        for (int j = 0; j < Q8_GEMV_ROWS; j++) acc[j] = 0.0f;
        for (int p = 0; p < passes; p++) {
            uint4 w4[Q8_PF];
            float dw[Q8_PF];
#pragma unroll
            for (int u = 0; u < Q8_PF; u++) {
                w4[u] = next[u];
                dw[u] = f16_to_f32(next_d[u]);
            }
            if (p + 1 < passes) fetch(col, (p + 1) * per_pass);
            else fetch(col + stride, 0);
#pragma unroll
            for (int u = 0; u < Q8_PF; u++) {
                const int c = p * per_pass + lane + 32 * u;
                if (c >= k16) break;
#pragma unroll
                for (int j = 0; j < Q8_GEMV_ROWS; j++) {
                    if (j >= rows) break;
                    const int4 a = xs[j * k16 + c];
                    int s = __dp4a((int)w4[u].x, a.x, 0);
                    s = __dp4a((int)w4[u].y, a.y, s);
                    s = __dp4a((int)w4[u].z, a.z, s);
                    s = __dp4a((int)w4[u].w, a.w, s);
                    // Half a block: its integer sum is exact in f32 (|s| < 2^24).
                    acc[j] += (float)s * (dw[u] * xds[j * kb + (c >> 1)]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < Q8_GEMV_ROWS; j++) {
            if (j >= rows) break;
            const float s = warp_sum(acc[j]);
            if (lane == 0) {
                float* o = y + (size_t)(row0 + j) * n + col;
                *o = accumulate ? *o + s : s;
            }
        }
    }
}

// The activations of m rows quantized for the block types once (for gemm_blocks): codes xq
// [m, k], per unit xd and xa, as quantize_rows; block r takes row r. Two forms:
// per 32 (Q8_0 / Q8_1: Q4_0, Q4_1, Q5_0, Q8_0) and per 256 (Q8_K: Q4_K, Q6_K).
template <int T>
__device__ void quantize_blocks_act(const float* x, signed char* xq, float* xd, float* xa, int m,
                                    int k, const float* norm_w, float eps, int swiglu) {
    DEP_ENTER();
    const int row0 = blockIdx.x, units = k / 32;
    quantize_rows<T>(x, row0, 1, k, norm_w, eps, swiglu, xq + (size_t)row0 * k,
                     xd + (size_t)row0 * units, xa + (size_t)row0 * units);
}
extern "C" __global__ void blk_quantize_32(const float* x, signed char* xq, float* xd, float* xa,
                                           int m, int k, const float* norm_w, float eps,
                                           int swiglu) {
    quantize_blocks_act<T_Q4_0>(x, xq, xd, xa, m, k, norm_w, eps, swiglu);
}
extern "C" __global__ void blk_quantize_256(const float* x, signed char* xq, float* xd,
                                            float* xa, int m, int k, const float* norm_w,
                                            float eps, int swiglu) {
    quantize_blocks_act<T_Q4_K>(x, xq, xd, xa, m, k, norm_w, eps, swiglu);
}

// Tiles of gemm_blocks: 64 rows x 64 columns per block of 256 threads, k staged BLK_KU units of
// 32 at a time; every thread unpacks one unit of one column a stage. On compute capability 8.0
// and later each warp takes 32 rows x 16 columns with int8 tensor-core products (mma m16n8k32,
// or two m16n8k16 for Q6_K's halves): exact integer sums, so the same results as dp4a; before
// 8.0, each thread takes 4 x 4 outputs with dp4a.
#define BLK_TILE 64
#define BLK_KU 4
// Words per staged row: 8 per unit, padded so the fragment loads (rows g, words t) fall in
// distinct banks.
#define BLK_ROW (BLK_KU * 8 + 4)

#if __CUDA_ARCH__ >= 800
// D += A (16 x 32, rows of 4 words) · Bᵀ (8 x 32), int8 in, int32 sums.
__device__ __forceinline__ void mma_k32(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// D += A (16 x 16) · Bᵀ (8 x 16), int8 in, int32 sums.
__device__ __forceinline__ void mma_k16(int (&d)[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
#endif

// y [m, n] (+)= x · Wᵀ (rows ldy apart) for rows quantized by blk_quantize_* and weights of
// type T: integer sums per unit (per half unit for Q6_K), combined per unit by unit_term.
// Grid (n / 64, m / 64) rounded up.
template <int T>
__device__ void gemm_blocks(const signed char* xq, const float* xd, const float* xa,
                            const unsigned char* body, const f16_t* halves, float* y, int m,
                            int n, int k, int ldy, int accumulate) {
    __shared__ int xs[BLK_TILE][BLK_ROW];
    __shared__ int ws[BLK_TILE][BLK_ROW];
    __shared__ float xds[BLK_KU][BLK_TILE];
    __shared__ float xas[BLK_KU][BLK_TILE];
    __shared__ UnitScales wsc[BLK_KU][BLK_TILE];
    DEP_ENTER();
    constexpr int UPB = blk_units(T), BODY = blk_body(T), HALVES = blk_halves(T);
    const int r0 = blockIdx.y * BLK_TILE, c0 = blockIdx.x * BLK_TILE;
    const int units = k / 32, nb = units / UPB;
#if __CUDA_ARCH__ >= 800
    // Warp (wm, wn): rows 32 wm .. + 32 (two tiles of 16), columns 16 wn .. + 16 (two of 8);
    // lane = 4 g + t holds rows g, g + 8 and columns 2t, 2t + 1 of each tile.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t = lane & 3;
    float acc[2][2][4];
    // K-quants: integer sums of the current super-block (sc · Σ and, Q4_K, m · Σ activations).
    int isum[2][2][4], msum[2][2][4];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        ((int*)isum)[i] = 0;
        ((int*)msum)[i] = 0;
    }
#else
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[4][4];
#endif
#pragma unroll
    for (int i = 0; i < (int)(sizeof(acc) / sizeof(float)); i++) ((float*)acc)[i] = 0.0f;
    for (int u0 = 0; u0 < units; u0 += BLK_KU) {
        for (int i = threadIdx.x; i < BLK_TILE * BLK_KU * 8; i += blockDim.x) {
            const int row = i / (BLK_KU * 8), w = i - row * (BLK_KU * 8);
            const int xr = r0 + row;
            xs[row][w] = xr < m && u0 + w / 8 < units
                ? ((const int*)(xq + (size_t)xr * k))[u0 * 8 + w] : 0;
        }
        for (int i = threadIdx.x; i < BLK_TILE * BLK_KU; i += blockDim.x) {
            const int row = i / BLK_KU, uu = i - row * BLK_KU;
            const int xr = r0 + row, u = u0 + uu;
            const bool in = xr < m && u < units;
            xds[uu][row] = in ? xd[(size_t)xr * units + u] : 0.0f;
            xas[uu][row] = in ? xa[(size_t)xr * units + u] : 0.0f;
        }
        for (int i = threadIdx.x; i < BLK_TILE * BLK_KU; i += blockDim.x) {
            const int col = i / BLK_KU, uu = i - col * BLK_KU;
            const int wc = c0 + col, u = u0 + uu;
            if (wc < n && u < units) {
                const int b = u / UPB, ju = u - b * UPB;
                const size_t bi = (size_t)wc * nb + b;
                RawUnit<T> r;
                load_unit<T>(body + bi * BODY, halves + bi * HALVES, ju, r);
                Unit w;
                decode_unit<T>(r, ju, w, wsc[uu][col]);
#pragma unroll
                for (int q = 0; q < 8; q++) ws[col][uu * 8 + q] = w.w[q];
            } else {
#pragma unroll
                for (int q = 0; q < 8; q++) ws[col][uu * 8 + q] = 0;
                wsc[uu][col] = UnitScales{0.0f, 0.0f, 0, 0, 0};
            }
        }
        __syncthreads();
#pragma unroll
        for (int uu = 0; uu < BLK_KU; uu++) {
#if __CUDA_ARCH__ >= 800
            // s[mt][nt][0..3]: the unit's sums (Q6_K: first half; h: second half).
            int s[2][2][4], h[2][2][4];
#pragma unroll
            for (int i = 0; i < 16; i++) {
                ((int*)s)[i] = 0;
                ((int*)h)[i] = 0;
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int ra = 32 * wm + 16 * mt + g;
                const int a[4] = {xs[ra][uu * 8 + t], xs[ra + 8][uu * 8 + t],
                                  xs[ra][uu * 8 + 4 + t], xs[ra + 8][uu * 8 + 4 + t]};
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const int cb = 16 * wn + 8 * nt + g;
                    const int b[2] = {ws[cb][uu * 8 + t], ws[cb][uu * 8 + 4 + t]};
                    if constexpr (T == T_Q6_K) {
                        mma_k16(s[mt][nt], a[0], a[1], b[0]);
                        mma_k16(h[mt][nt], a[2], a[3], b[1]);
                    } else {
                        mma_k32(s[mt][nt], a, b);
                    }
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const UnitScales sc = wsc[uu][16 * wn + 8 * nt + 2 * t + e];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
#pragma unroll
                        for (int hr = 0; hr < 2; hr++) {
                            const int row = 32 * wm + 16 * mt + g + 8 * hr, r = 2 * hr + e;
                            if constexpr (T == T_Q4_K || T == T_Q6_K) {
                                // Integer sums over the super-block, as the CPU reference.
                                isum[mt][nt][r] += sc.s0 * s[mt][nt][r] + sc.s1 * h[mt][nt][r];
                                if constexpr (T == T_Q4_K)
                                    msum[mt][nt][r] += sc.mi * (int)xas[uu][row];
                            } else {
                                acc[mt][nt][r] += unit_term<T>(sc, s[mt][nt][r], h[mt][nt][r],
                                                               xds[uu][row], xas[uu][row]);
                            }
                        }
                    }
                }
            }
            if constexpr (T == T_Q4_K || T == T_Q6_K) {
                // The last unit of a super-block of 256 (8 units; u0 is a multiple of 4): its
                // f32 term, (d · dy) · isum - (dmin · dy) · msum.
                if (uu == BLK_KU - 1 && (u0 & 7) == 4) {
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const UnitScales sc = wsc[uu][16 * wn + 8 * nt + 2 * t + e];
#pragma unroll
                            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                                for (int hr = 0; hr < 2; hr++) {
                                    const int row = 32 * wm + 16 * mt + g + 8 * hr;
                                    const int r = 2 * hr + e;
                                    const float dy = xds[uu][row];
                                    acc[mt][nt][r] += (sc.d * dy) * (float)isum[mt][nt][r];
                                    if constexpr (T == T_Q4_K)
                                        acc[mt][nt][r] -= (sc.dm * dy) * (float)msum[mt][nt][r];
                                    isum[mt][nt][r] = 0;
                                    msum[mt][nt][r] = 0;
                                }
                        }
                }
            }
#else
            int s0[4][4], s1[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) s0[i][j] = s1[i][j] = 0;
#pragma unroll
            for (int w = 0; w < 8; w++) {
                int a[4], c[4];
#pragma unroll
                for (int i = 0; i < 4; i++) a[i] = xs[ty + 16 * i][uu * 8 + w];
#pragma unroll
                for (int j = 0; j < 4; j++) c[j] = ws[tx + 16 * j][uu * 8 + w];
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        if (w < 4) s0[i][j] = __dp4a(a[i], c[j], s0[i][j]);
                        else s1[i][j] = __dp4a(a[i], c[j], s1[i][j]);
                    }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const UnitScales sc = wsc[uu][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[i][j] += unit_term<T>(sc, s0[i][j], s1[i][j], xds[uu][ty + 16 * i],
                                              xas[uu][ty + 16 * i]);
            }
#endif
        }
        __syncthreads();
    }
#if __CUDA_ARCH__ >= 800
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int row = r0 + 32 * wm + 16 * mt + g + 8 * (r >> 1);
                const int col = c0 + 16 * wn + 8 * nt + 2 * t + (r & 1);
                if (row >= m || col >= n) continue;
                float* o = y + (size_t)row * ldy + col;
                *o = accumulate ? *o + acc[mt][nt][r] : acc[mt][nt][r];
            }
#else
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + ty + 16 * i;
        if (r >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = c0 + tx + 16 * j;
            if (c >= n) continue;
            float* o = y + (size_t)r * ldy + c;
            *o = accumulate ? *o + acc[i][j] : acc[i][j];
        }
    }
#endif
}

#define GEMM_BLOCKS_ENTRY(name, T)                                                             \
    extern "C" __global__ void name(const signed char* xq, const float* xd, const float* xa,  \
                                    const unsigned char* body, const f16_t* halves, float* y,  \
                                    int m, int n, int k, int ldy, int accumulate) {            \
        gemm_blocks<T>(xq, xd, xa, body, halves, y, m, n, k, ldy, accumulate);                 \
    }
GEMM_BLOCKS_ENTRY(gemm_q4_0, T_Q4_0)
GEMM_BLOCKS_ENTRY(gemm_q4_1, T_Q4_1)
GEMM_BLOCKS_ENTRY(gemm_q5_0, T_Q5_0)
GEMM_BLOCKS_ENTRY(gemm_q4_k, T_Q4_K)
GEMM_BLOCKS_ENTRY(gemm_q6_k, T_Q6_K)
GEMM_BLOCKS_ENTRY(gemm_q8_0, T_Q8_0)
