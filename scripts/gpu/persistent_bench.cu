// How fast can a persistent decode step stream a Qwen3-0.6B-shaped model's matrix products at
// batch 1? (issue 13's 2,000 tokens/s asks ~15 µs per layer; the chain of kernels in a CUDA
// graph takes ~36.) One kernel, one block per SM, runs the 28 layers' four products (Q/K/V
// 1024 -> 4096, output 2048 -> 1024, gate/up 1024 -> 6144, down 3072 -> 1024, bf16 weights,
// f32 activations) as 112 stages separated by grid-wide barriers (a counter in global memory).
// Block b owns a fixed share of each product's output columns; while it waits at the barrier
// for a stage's input, its weights for that stage are already on their way into shared
// memory (asynchronous copies issued one stage ahead, double-buffered), so the weight stream
// is not interrupted by the dependency chain. Stand-ins: the output product reads the first
// 2,048 Q/K/V values (no attention), the down product reads silu(gate) * up, both add into the
// residual; no norms. Variants, side by side: the inputs read from shared memory per weight or
// held in registers per lane (`rows_xreg`), the weights by 16-byte copies per thread or one bulk
// (TMA) copy per block, the input loads one by one or together (`stage_inputs_together`).
// Prints each variant's time of the 112 stages per layer and their DRAM rate, the time of 112
// barriers alone (EMPTY stages), where a stage's time goes in two variants (SM clock marks),
// and checks each variant's final residual against the same chain run as one plain kernel per
// stage. Last, `fused` (written 2026-12-06, not yet run): two grid-wide points a layer, the
// output and down products as partial sums over each block's share of their inputs.
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/persistent_bench scripts/gpu/persistent_bench.cu
//   /tmp/persistent_bench [runs]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include "../../crates/inference/src/backend/cuda/kernels.cu"
#include "../../crates/inference/src/backend/cuda/attention.cu"  // stage16, stage_wait

#define LAYERS 28
#define HID 1024
#define QKV 4096
#define ATT 2048
#define FFN 3072
#define THREADS 256
// Shared memory: two weight buffers of the largest share (gate/up: 6,144 / 132 -> 47 rows of
// 2 KB) and the input vector (at most 3,072 f32).
#define WBUF_BYTES (48 * 1024 * 2)
#define XBUF_FLOATS FFN

struct Stage {
    const bf16_t* w;  // [n, k]
    int n, k;
    int kind;  // 0: x = h -> y; 1: x = y_qkv[:ATT] -> h += y; 2: x = h -> y_gu; 3: x = silu*up -> h += y
};

struct Net {
    const Stage* st;  // the 112 stages, in device memory
    float* h;       // residual [HID]
    float* y_qkv;   // [QKV]
    float* y_gu;    // [2 FFN]
    unsigned* barrier;
    // When set: each block's SM clock at six points of every stage (see `mark`).
    long long* times;
};

// Thread 0 notes the SM clock at point p of stage s (timed runs only).
__device__ __forceinline__ void mark(const Net& net, int s, int p) {
    if (net.times && threadIdx.x == 0)
        net.times[((size_t)blockIdx.x * 4 * LAYERS + s) * 6 + p] = clock64();
}

__device__ __forceinline__ float stage_input(const Net& net, int kind, int i) {
    switch (kind) {
        case 0:
        case 2: return __ldcg(net.h + i);
        case 1: return __ldcg(net.y_qkv + i);
        default: {
            const float g = __ldcg(net.y_gu + i), u = __ldcg(net.y_gu + FFN + i);
            return swiglu_value(g, u);
        }
    }
}

// Block b's columns of a product of n outputs: [n b / B, n (b + 1) / B).
__device__ __forceinline__ void share(int n, int& c0, int& c1) {
    c0 = (int)((long long)n * blockIdx.x / gridDim.x);
    c1 = (int)((long long)n * (blockIdx.x + 1) / gridDim.x);
}

// Issues the copies of stage s's weight rows of this block into buffer buf (one commit group).
__device__ void prefetch(const Net& net, int s, int n_stages, unsigned char* buf) {
    if (s < n_stages) {
        const Stage& st = net.st[s];
        int c0, c1;
        share(st.n, c0, c1);
        const int per_row = st.k * 2 / 16, total = (c1 - c0) * per_row;
        const unsigned char* src = (const unsigned char*)(st.w + (size_t)c0 * st.k);
        for (int i = threadIdx.x; i < total; i += blockDim.x) stage16(buf + 16 * i, src + 16 * i);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Issues the bulk copy of `bytes` at src into dst, counted by mbarrier `bar` (thread 0 only).
__device__ void bulk(unsigned char* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(d), "l"(src), "r"(bytes), "r"(b) : "memory");
}

// Announces `bytes` to come into the buffer of mbarrier `bar`, after ordering earlier ordinary
// reads of that buffer before the copies (thread 0 only).
__device__ void expect(unsigned long long* bar, unsigned bytes) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}

// Waits (thread 0, then the block) until every block has arrived `s` times in this launch.
__device__ __forceinline__ void grid_wait(const unsigned* barrier, unsigned epoch, int s) {
    if (threadIdx.x == 0) {
        const unsigned target = epoch + (unsigned)s * gridDim.x;
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(barrier) : "memory");
        } while ((int)(v - target) < 0);
    }
    __syncthreads();
}

// This block's arrival (after a __syncthreads): its writes made visible first.
__device__ __forceinline__ void grid_arrive(unsigned* barrier) {
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(barrier, 1u);
    }
}

// Makes the two mbarriers of a block's bulk copies (one arrival per fill), then syncs it.
__device__ __forceinline__ void init_bars(unsigned long long* bars) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; i++) {
            const unsigned b = (unsigned)__cvta_generic_to_shared(&bars[i]);
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

// The same copy as one bulk (TMA) copy of the block's contiguous share, issued by thread 0
// and counted by the buffer's mbarrier (the Hopper copy engine instead of 16-byte copies per
// thread).
__device__ void prefetch_bulk(const Net& net, int s, int n_stages, unsigned char* buf,
                              unsigned long long* bar) {
    if (s >= n_stages || threadIdx.x != 0) return;
    const Stage& st = net.st[s];
    int c0, c1;
    share(st.n, c0, c1);
    const unsigned bytes = (unsigned)(c1 - c0) * st.k * 2;
    // The buffer was last read by ordinary loads (stage s - 2): `expect` orders them first.
    expect(bar, bytes);
    bulk(buf, st.w + (size_t)c0 * st.k, bytes, bar);
}

// Waits until the bulk copy of the buffer's `use`-th fill has landed.
__device__ __forceinline__ void wait_bulk(unsigned long long* bar, unsigned use) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done) : "r"(b), "r"(use & 1) : "memory");
    }
}

// Stages a product's input into `xs` with every load issued before any is used: KV4 float4s
// per thread (k = 1024 KV4), both halves of the SwiGLU input at once for the down product.
template <int KV4>
__device__ __forceinline__ void stage_inputs_together(const Net& net, int kind, float* xs) {
    const float* src = kind == 1 ? net.y_qkv : (kind == 3 ? net.y_gu : net.h);
    const float4* a4 = (const float4*)src;
    const float4* b4 = (const float4*)(net.y_gu + FFN);
    float4 a[KV4], b[KV4];
#pragma unroll
    for (int j = 0; j < KV4; j++) {
        a[j] = __ldcg(a4 + threadIdx.x + THREADS * j);
        if (kind == 3) b[j] = __ldcg(b4 + threadIdx.x + THREADS * j);
    }
    float4* x4 = (float4*)xs;
#pragma unroll
    for (int j = 0; j < KV4; j++) {
        float4 v = a[j];
        if (kind == 3) {
            v.x = swiglu_value(a[j].x, b[j].x);
            v.y = swiglu_value(a[j].y, b[j].y);
            v.z = swiglu_value(a[j].z, b[j].z);
            v.w = swiglu_value(a[j].w, b[j].w);
        }
        x4[threadIdx.x + THREADS * j] = v;
    }
}

// A stage's rows from the weights in shared memory `ws` ([rows, 256 KJ] bf16) and the input
// `xs` (shared, 256 KJ floats), each lane's eight inputs per 16-byte unit held in registers for
// all rows (unit i of a row is lane i % 32's), so shared memory serves only the weights, in
// conflict-free 16-byte loads; one warp per row, `out[r]` (+)= the row's sum.
template <int KJ>
__device__ __forceinline__ void rows_xreg(const bf16_t* ws, const float* xs, int rows, float* out,
                                          bool add) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float x[KJ][8];
#pragma unroll
    for (int j = 0; j < KJ; j++) {
        const float4* p = (const float4*)(xs + 8 * (lane + 32 * j));
        const float4 a = p[0], b = p[1];
        x[j][0] = a.x; x[j][1] = a.y; x[j][2] = a.z; x[j][3] = a.w;
        x[j][4] = b.x; x[j][5] = b.y; x[j][6] = b.z; x[j][7] = b.w;
    }
    for (int r = warp; r < rows; r += THREADS / 32) {
        const uint4* wr = (const uint4*)(ws + (size_t)r * 256 * KJ);
        // The residual's old value, asked for before the sums (an L2 round trip).
        const float before = add && lane == 0 ? __ldcg(out + r) : 0.0f;
        uint4 w[KJ];
#pragma unroll
        for (int j = 0; j < KJ; j++) w[j] = wr[lane + 32 * j];
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < KJ; j++) {
            const unsigned wv[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                acc += bf16_to_f32((bf16_t)(wv[q] & 0xffffu)) * x[j][2 * q];
                acc += bf16_to_f32((bf16_t)(wv[q] >> 16)) * x[j][2 * q + 1];
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) out[r] = add ? before + acc : acc;
    }
}

// The persistent step: stages in order, each after every block finished the one before
// (EMPTY: barriers only; XREG: rows by `rows_xreg`, else the inputs read from shared memory
// per weight).
template <bool EMPTY, bool XREG, bool BULK = false, bool TOGETHER = false>
__global__ void __launch_bounds__(THREADS, 1) persistent(Net net, unsigned epoch) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* wbuf[2] = {smem, smem + WBUF_BYTES};
    float* xs = (float*)(smem + 2 * WBUF_BYTES);
    __shared__ __align__(8) unsigned long long bars[2];
    const int n_stages = 4 * LAYERS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (BULK) {
        init_bars(bars);
        prefetch_bulk(net, 0, n_stages, wbuf[0], &bars[0]);
    } else if (!EMPTY) {
        prefetch(net, 0, n_stages, wbuf[0]);
    }
    for (int s = 0; s < n_stages; s++) {
        mark(net, s, 0);
        if (BULK) prefetch_bulk(net, s + 1, n_stages, wbuf[(s + 1) & 1], &bars[(s + 1) & 1]);
        else if (!EMPTY) prefetch(net, s + 1, n_stages, wbuf[(s + 1) & 1]);
        // The barrier of stage s: every block has finished stage s - 1.
        if (s > 0) grid_wait(net.barrier, epoch, s);
        mark(net, s, 1);
        if (!EMPTY) {
            const Stage& st = net.st[s];
            if (TOGETHER) {
                switch (st.k) {
                    case HID: stage_inputs_together<HID / 1024>(net, st.kind, xs); break;
                    case ATT: stage_inputs_together<ATT / 1024>(net, st.kind, xs); break;
                    default: stage_inputs_together<FFN / 1024>(net, st.kind, xs); break;
                }
            } else {
                for (int i = threadIdx.x; i < st.k; i += blockDim.x) xs[i] = stage_input(net, st.kind, i);
            }
            mark(net, s, 2);
            if (BULK) wait_bulk(&bars[s & 1], (unsigned)s >> 1);
            else asm volatile("cp.async.wait_group 1;" ::: "memory");
            __syncthreads();
            mark(net, s, 3);
            int c0, c1;
            share(st.n, c0, c1);
            const bf16_t* ws = (const bf16_t*)wbuf[s & 1];
            float* out = st.kind == 0 ? net.y_qkv : (st.kind == 2 ? net.y_gu : net.h);
            const bool add = st.kind == 1 || st.kind == 3;
            if (XREG) {
                switch (st.k) {
                    case HID: rows_xreg<HID / 256>(ws, xs, c1 - c0, out + c0, add); break;
                    case ATT: rows_xreg<ATT / 256>(ws, xs, c1 - c0, out + c0, add); break;
                    default: rows_xreg<FFN / 256>(ws, xs, c1 - c0, out + c0, add); break;
                }
            } else {
                for (int r = warp; r < c1 - c0; r += THREADS / 32) {
                    const uint4* wr = (const uint4*)(ws + (size_t)r * st.k);
                    float acc = 0.0f;
                    for (int i = lane; i < st.k / 8; i += 32) {
                        const uint4 w8 = wr[i];
                        const unsigned wv[4] = {w8.x, w8.y, w8.z, w8.w};
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            acc += bf16_to_f32((bf16_t)(wv[j] & 0xffffu)) * xs[8 * i + 2 * j];
                            acc += bf16_to_f32((bf16_t)(wv[j] >> 16)) * xs[8 * i + 2 * j + 1];
                        }
                    }
                    acc = warp_sum(acc);
                    // (The residual's columns of both adding products are this block's.)
                    if (lane == 0) out[c0 + r] = add ? __ldcg(out + c0 + r) + acc : acc;
                }
            }
        }
        // Done with stage s: make the outputs visible, then arrive.
        __syncthreads();
        mark(net, s, 4);
        grid_arrive(net.barrier);
        mark(net, s, 5);
    }
}

// Two grid-wide points a layer instead of four (not yet run on a GPU). Stage A of a layer: each
// block takes the residual, its share of the Q/K/V rows, and at once the output product's
// partial sums over its own share of the first 2,048 Q/K/V values (the attention stand-in) for
// all 1,024 outputs, from the output weights stored transposed ([2048, 1024]: a block's rows
// of k are contiguous); stage B: its share of the intermediate's gate and up rows, their SwiGLU,
// and the down product's partial sums over that share (down stored transposed, [3072, 1024]).
// Partial sums are added into a delta buffer by atomics (so the order of the sums varies), the
// residual of stage s is R[s & 1] + D[s % 3]: each block writes its slice of the next R and
// zeroes its slice of the D two stages ahead. Weights: the first product's rows (buffer P) and
// the second's (buffer Q) by bulk copies, P for the next stage issued once this stage's first
// product is done with it, Q once its second is.
struct Fused {
    const bf16_t* const* qkv;  // [LAYERS] -> [QKV, HID]
    const bf16_t* const* o_t;  // [LAYERS] -> [ATT, HID] (the output product, transposed)
    const bf16_t* const* gu;   // [LAYERS] -> [2 FFN, HID] (gate rows, then up rows)
    const bf16_t* const* d_t;  // [LAYERS] -> [FFN, HID] (the down product, transposed)
    float* r;                  // [2, HID]
    float* d;                  // [3, HID]
    unsigned* barrier;
};

#define FUSED_P (96 * 1024)
#define FUSED_Q (64 * 1024)

// Stage s's first-product rows into P: Q/K/V rows (even s) or gate and up rows (odd s).
__device__ void fused_fill_p(const Fused& f, int s, unsigned char* p, unsigned long long* bar) {
    if (threadIdx.x != 0 || s >= 2 * LAYERS) return;
    const int l = s >> 1;
    int c0, c1;
    if ((s & 1) == 0) {
        share(QKV, c0, c1);
        expect(bar, (unsigned)(c1 - c0) * HID * 2);
        bulk(p, f.qkv[l] + (size_t)c0 * HID, (unsigned)(c1 - c0) * HID * 2, bar);
    } else {
        share(FFN, c0, c1);
        const unsigned half = (unsigned)(c1 - c0) * HID * 2;
        expect(bar, 2 * half);
        bulk(p, f.gu[l] + (size_t)c0 * HID, half, bar);
        bulk(p + half, f.gu[l] + (size_t)(FFN + c0) * HID, half, bar);
    }
}

// Stage s's second-product rows (transposed weights) into Q: the output product's rows of this
// block's Q columns below 2,048 (even s), or the down product's rows of its intermediate share.
__device__ void fused_fill_q(const Fused& f, int s, unsigned char* q, unsigned long long* bar) {
    if (threadIdx.x != 0 || s >= 2 * LAYERS) return;
    const int l = s >> 1;
    int c0, c1;
    const bf16_t* w;
    if ((s & 1) == 0) {
        share(QKV, c0, c1);
        c1 = min(c1, ATT);
        w = f.o_t[l];
    } else {
        share(FFN, c0, c1);
        w = f.d_t[l];
    }
    const unsigned bytes = c1 > c0 ? (unsigned)(c1 - c0) * HID * 2 : 0u;
    expect(bar, bytes);
    if (bytes) bulk(q, w + (size_t)c0 * HID, bytes, bar);
}

__global__ void __launch_bounds__(THREADS, 1) fused(Fused f, unsigned epoch) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* pbuf = smem;
    unsigned char* qbuf = smem + FUSED_P;
    float* xs = (float*)(smem + FUSED_P + FUSED_Q);  // the residual [HID]
    float* ys = xs + HID;                             // first-product outputs [2 * 24]
    __shared__ __align__(8) unsigned long long bars[2];
    const int n_stages = 2 * LAYERS;
    init_bars(bars);
    fused_fill_p(f, 0, pbuf, &bars[0]);
    fused_fill_q(f, 0, qbuf, &bars[1]);
    int h0, h1;
    share(HID, h0, h1);
    for (int s = 0; s < n_stages; s++) {
        if (s > 0) grid_wait(f.barrier, epoch, s);
        // The residual: R[s & 1] + D[s % 3], loads issued together (one float4 per thread).
        const float* rr = f.r + (s & 1) * HID;
        const float* dd = f.d + (s % 3) * HID;
        {
            const float4 a = __ldcg((const float4*)rr + threadIdx.x);
            const float4 b = __ldcg((const float4*)dd + threadIdx.x);
            ((float4*)xs)[threadIdx.x] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
        __syncthreads();
        // This block's slice of the next R, and of the D two stages ahead zeroed.
        for (int i = h0 + threadIdx.x; i < h1; i += THREADS) {
            f.r[((s + 1) & 1) * HID + i] = xs[i];
            f.d[((s + 2) % 3) * HID + i] = 0.0f;
        }
        // First product from P (1,024 values a row, inputs in registers).
        wait_bulk(&bars[0], (unsigned)s);
        __syncthreads();
        int c0, c1;
        share((s & 1) == 0 ? QKV : FFN, c0, c1);
        const int rows = (s & 1) == 0 ? c1 - c0 : 2 * (c1 - c0);
        rows_xreg<HID / 256>((const bf16_t*)pbuf, xs, rows, ys, false);
        __syncthreads();
        fused_fill_p(f, s + 1, pbuf, &bars[0]);
        // The second product's inputs: Q values (the output product's k share) or SwiGLU.
        int kk;
        if ((s & 1) == 0) {
            kk = max(0, min(c1, ATT) - c0);
        } else {
            kk = c1 - c0;
            if (threadIdx.x < kk) ys[2 * kk + threadIdx.x] = swiglu_value(ys[threadIdx.x], ys[kk + threadIdx.x]);
            __syncthreads();
        }
        const float* zs = (s & 1) == 0 ? ys : ys + 2 * kk;
        // Second product from Q: thread t's four outputs 4t .. 4t + 3 over this block's kk rows.
        wait_bulk(&bars[1], (unsigned)s);
        __syncthreads();
        if (kk > 0) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint2* w = (const uint2*)qbuf;
            for (int r = 0; r < kk; r++) {
                const uint2 v = w[r * (HID / 4) + threadIdx.x];
                const float z = zs[r];
                acc[0] += bf16_to_f32((bf16_t)(v.x & 0xffffu)) * z;
                acc[1] += bf16_to_f32((bf16_t)(v.x >> 16)) * z;
                acc[2] += bf16_to_f32((bf16_t)(v.y & 0xffffu)) * z;
                acc[3] += bf16_to_f32((bf16_t)(v.y >> 16)) * z;
            }
            float* out = f.d + ((s + 1) % 3) * HID + 4 * threadIdx.x;
            for (int j = 0; j < 4; j++) atomicAdd(out + j, acc[j]);
        }
        __syncthreads();
        fused_fill_q(f, s + 1, qbuf, &bars[1]);
        grid_arrive(f.barrier);
    }
}

// The reference: one plain kernel per stage (block per output column), in stream order.
__global__ void ref_stage(Net net, int s) {
    const Stage& st = net.st[s];
    const int c = blockIdx.x;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < st.k; i += blockDim.x)
        acc += bf16_to_f32(st.w[(size_t)c * st.k + i]) * stage_input(net, st.kind, i);
    acc = block_sum(acc);
    if (threadIdx.x == 0) {
        float* out = st.kind == 0 ? net.y_qkv : (st.kind == 2 ? net.y_gu : net.h);
        if (st.kind == 1 || st.kind == 3) out[c] = __ldcg(out + c) + acc;
        else out[c] = acc;
    }
}

#define CK(x)                                                                      \
    do {                                                                           \
        cudaError_t e = (x);                                                       \
        if (e != cudaSuccess) {                                                    \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));                \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

int main(int argc, char** argv) {
    const int runs = argc > 1 ? atoi(argv[1]) : 20;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs\n", prop.name, sms);
    // Weights: random bf16, |w| < 0.5 / sqrt(k) (values stay finite over 28 layers without
    // norms), one allocation per layer and product.
    const int shapes[4][2] = {{QKV, HID}, {HID, ATT}, {2 * FFN, HID}, {HID, FFN}};
    Net net{};
    std::vector<Stage> stages(4 * LAYERS);
    std::vector<const bf16_t*> transposed(2 * LAYERS);
    size_t bytes = 0;
    unsigned seed = 12345;
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 4; p++) {
            const int n = shapes[p][0], k = shapes[p][1];
            const float bound = 0.5f / sqrtf((float)k);
            std::vector<bf16_t> host((size_t)n * k);
            for (auto& v : host) {
                seed = seed * 1664525u + 1013904223u;
                const float f = ((int)(seed >> 9) - (1 << 22)) * (bound / (1 << 22));
                unsigned u;
                memcpy(&u, &f, 4);
                v = (bf16_t)(u >> 16);
            }
            bf16_t* d;
            CK(cudaMalloc(&d, host.size() * 2));
            CK(cudaMemcpy(d, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
            stages[4 * l + p] = Stage{d, n, k, p};
            bytes += host.size() * 2;
            // The output and down products transposed ([k, n]) for the two-point layer.
            if (p == 1 || p == 3) {
                std::vector<bf16_t> t((size_t)n * k);
                for (int r = 0; r < n; r++)
                    for (int c = 0; c < k; c++) t[(size_t)c * n + r] = host[(size_t)r * k + c];
                bf16_t* dt;
                CK(cudaMalloc(&dt, t.size() * 2));
                CK(cudaMemcpy(dt, t.data(), t.size() * 2, cudaMemcpyHostToDevice));
                transposed[2 * l + (p == 3)] = dt;
            }
        }
    // The largest share must fit a weight buffer.
    for (int p = 0; p < 4; p++) {
        const size_t rows = (shapes[p][0] + sms - 1) / sms;
        if (rows * shapes[p][1] * 2 > WBUF_BYTES) {
            fprintf(stderr, "a share of product %d does not fit %d bytes\n", p, WBUF_BYTES);
            return 1;
        }
    }
    Stage* dst;
    CK(cudaMalloc(&dst, stages.size() * sizeof(Stage)));
    CK(cudaMemcpy(dst, stages.data(), stages.size() * sizeof(Stage), cudaMemcpyHostToDevice));
    net.st = dst;
    std::vector<float> h0(HID);
    for (auto& v : h0) {
        seed = seed * 1664525u + 1013904223u;
        v = ((int)(seed >> 9) - (1 << 22)) * (1.0f / (1 << 22));
    }
    CK(cudaMalloc(&net.h, HID * 4));
    CK(cudaMalloc(&net.y_qkv, QKV * 4));
    CK(cudaMalloc(&net.y_gu, 2 * FFN * 4));
    CK(cudaMalloc(&net.barrier, 4));
    CK(cudaMemset(net.barrier, 0, 4));
    const int smem = 2 * WBUF_BYTES + XBUF_FLOATS * 4;
    CK(cudaFuncSetAttribute(persistent<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(persistent<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(persistent<false, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(persistent<false, true, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(persistent<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int resident = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent<false, true>, THREADS, smem));
    if (resident < 1) {
        fprintf(stderr, "the persistent kernel does not fit an SM\n");
        return 1;
    }
    // Each launch adds 112 * sms to the counter; the epoch is its value at the launch.
    unsigned epoch = 0;
    // Modes: 0 the inputs read from shared memory per weight, 1 held in registers
    // (`rows_xreg`), 2 that and the weights by bulk copies, 3 that and the inputs staged with
    // their loads together (`stage_inputs_together`), 4 barriers only.
    auto run = [&](int mode) {
        if (mode == 0) persistent<false, false><<<sms, THREADS, smem>>>(net, epoch);
        else if (mode == 1) persistent<false, true><<<sms, THREADS, smem>>>(net, epoch);
        else if (mode == 2) persistent<false, true, true><<<sms, THREADS, smem>>>(net, epoch);
        else if (mode == 3) persistent<false, true, true, true><<<sms, THREADS, smem>>>(net, epoch);
        else persistent<true, false><<<sms, THREADS, smem>>>(net, epoch);
        epoch += 4u * LAYERS * sms;
    };
    // Check: the residual after one persistent step against the reference chain.
    std::vector<float> got(HID), want(HID);
    CK(cudaMemcpy(net.h, h0.data(), HID * 4, cudaMemcpyHostToDevice));
    for (int s = 0; s < 4 * LAYERS; s++) ref_stage<<<stages[s].n, 256>>>(net, s);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(want.data(), net.h, HID * 4, cudaMemcpyDeviceToHost));
    double want2 = 0;
    for (float w : want) want2 += w * (double)w;
    // The normalized error of a final residual against the reference's.
    auto error_of = [&](const std::vector<float>& g) {
        double num = 0;
        for (int i = 0; i < HID; i++) num += (g[i] - want[i]) * (double)(g[i] - want[i]);
        return sqrt(num / std::max(want2, 1e-30));
    };
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    // The median time of `runs` launches, `prepare` run before each, outside the timing.
    auto median_ms = [&](auto prepare, auto launch) {
        std::vector<float> ms;
        for (int r = 0; r < runs; r++) {
            prepare();
            CK(cudaEventRecord(a));
            launch();
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            float t;
            CK(cudaEventElapsedTime(&t, a, b));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
    };
    const char* names[4] = {"inputs from shared memory", "inputs in registers",
                            "inputs in registers, weights by bulk copies",
                            "and inputs staged with their loads together"};
    for (int mode = 0; mode < 4; mode++) {
        CK(cudaMemcpy(net.h, h0.data(), HID * 4, cudaMemcpyHostToDevice));
        run(mode);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got.data(), net.h, HID * 4, cudaMemcpyDeviceToHost));
        printf("%s: residual after 28 layers (rms %.3g): normalized error %.2e against one "
               "kernel per stage\n", names[mode], sqrt(want2 / HID), error_of(got));
    }
    for (int mode = 0; mode < 5; mode++) {
        const float med = median_ms([] {}, [&] { run(mode); });
        if (mode == 4)
            printf("112 barriers alone: %.3f ms (%.2f us a barrier)\n", med, 1e3 * med / (4 * LAYERS));
        else
            printf("28 layers' products, persistent, %s: %.3f ms (%.2f us a layer; %.0f GB/s of "
                   "%.2f GB), median of %d\n", names[mode], med, 1e3 * med / LAYERS,
                   bytes / (med * 1e6), bytes / 1e9, runs);
    }
    // Two grid-wide points a layer (`fused`): checked against the same chain, then timed.
    {
        std::vector<const bf16_t*> ptrs(4 * LAYERS);
        for (int l = 0; l < LAYERS; l++) {
            ptrs[l] = stages[4 * l].w;
            ptrs[LAYERS + l] = transposed[2 * l];
            ptrs[2 * LAYERS + l] = stages[4 * l + 2].w;
            ptrs[3 * LAYERS + l] = transposed[2 * l + 1];
        }
        const bf16_t** dp;
        CK(cudaMalloc(&dp, ptrs.size() * sizeof(void*)));
        CK(cudaMemcpy(dp, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice));
        Fused fu{dp, dp + LAYERS, dp + 2 * LAYERS, dp + 3 * LAYERS, nullptr, nullptr, nullptr};
        CK(cudaMalloc(&fu.r, 2 * HID * 4));
        CK(cudaMalloc(&fu.d, 3 * HID * 4));
        CK(cudaMalloc(&fu.barrier, 4));
        CK(cudaMemset(fu.barrier, 0, 4));
        const int fsmem = FUSED_P + FUSED_Q + (HID + 96) * 4;
        CK(cudaFuncSetAttribute(fused, cudaFuncAttributeMaxDynamicSharedMemorySize, fsmem));
        int fres = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fres, fused, THREADS, fsmem));
        if (fres < 1 || (QKV + sms - 1) / sms > 32 || (FFN + sms - 1) / sms > 24) {
            printf("two points a layer: does not fit this GPU (%d resident)\n", fres);
        } else {
            unsigned fepoch = 0;
            // The residual back to h0 (R[0]) with no deltas.
            auto reset = [&]() {
                CK(cudaMemcpy(fu.r, h0.data(), HID * 4, cudaMemcpyHostToDevice));
                CK(cudaMemset(fu.d, 0, 3 * HID * 4));
            };
            auto launch = [&]() {
                fused<<<sms, THREADS, fsmem>>>(fu, fepoch);
                fepoch += 2u * LAYERS * sms;
            };
            reset();
            launch();
            CK(cudaDeviceSynchronize());
            // The residual after 2 * 28 stages: R[0] + D[56 % 3].
            std::vector<float> d2(HID);
            CK(cudaMemcpy(got.data(), fu.r, HID * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(d2.data(), fu.d + ((2 * LAYERS) % 3) * HID, HID * 4, cudaMemcpyDeviceToHost));
            for (int i = 0; i < HID; i++) got[i] += d2[i];
            printf("two points a layer: normalized error %.2e against one kernel per stage\n",
                   error_of(got));
            const float med = median_ms(reset, launch);
            printf("28 layers' products, two points a layer: %.3f ms (%.2f us a layer; %.0f GB/s), "
                   "median of %d\n", med, 1e3 * med / LAYERS, bytes / (med * 1e6), runs);
        }
    }
    // Where a stage's time goes (modes 2 and 3, one timed run each): per product, the mean over
    // blocks and layers of each part, and of the slowest block's wait for its weights.
    const size_t n_marks = (size_t)sms * 4 * LAYERS * 6;
    CK(cudaMalloc(&net.times, n_marks * 8));
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    const double mhz = khz / 1e3;
    const char* kinds[4] = {"q/k/v", "output", "gate/up", "down"};
    const char* parts[5] = {"waits at the barrier", "stages the input", "waits for its weights",
                            "multiplies", "arrives"};
    for (int mode = 2; mode < 4; mode++) {
        run(mode);
        CK(cudaDeviceSynchronize());
        std::vector<long long> t(n_marks);
        CK(cudaMemcpy(t.data(), net.times, n_marks * 8, cudaMemcpyDeviceToHost));
        printf("mode %d (%s), a timed run:\n", mode, names[mode]);
        for (int kind = 0; kind < 4; kind++) {
            double sum[5] = {0}, worst = 0;
            for (int l = 0; l < LAYERS; l++) {
                const int s = 4 * l + kind;
                double slowest = 0;
                for (int blk = 0; blk < sms; blk++) {
                    const long long* m = &t[((size_t)blk * 4 * LAYERS + s) * 6];
                    for (int p = 0; p < 5; p++) sum[p] += (m[p + 1] - m[p]) / mhz;
                    slowest = std::max(slowest, (double)(m[3] - m[2]) / mhz);
                }
                worst += slowest;
            }
            printf("  %s stage, us per block:", kinds[kind]);
            for (int p = 0; p < 5; p++) printf(" %s %.2f;", parts[p], sum[p] / (LAYERS * sms));
            printf(" slowest block's wait for weights %.2f\n", worst / LAYERS);
        }
    }
    return 0;
}
