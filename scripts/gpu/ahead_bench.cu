// A decode step's chain of kernels (28 layers of a Qwen3-0.6B-shaped model: Q/K/V product,
// two small kernels standing in for Q/K/V preparation and attention, output, gate/up and down
// products, with their real weights in DRAM), recorded in a CUDA graph with programmatic
// dependent launch, to compare the streaming matrix-vector kernel (`gemv`) with the one that
// loads its weights ahead into shared memory (`gemv_ahead`), and to see whether a kernel's
// blocks start before the kernel before it has finished: every block records the global timer
// when it starts and when it ends. REAL_ATTN=1 puts the real Q/K/V preparation and decode
// attention of attention.cu in the stand-ins' place (POS: the sequence's position, default 80).
// Not yet run with REAL_ATTN (written at the end of the 2026-12-03 session's device time).
//   nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/ahead_bench scripts/gpu/ahead_bench.cu && /tmp/ahead_bench
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <string>
#include "../../crates/inference/src/backend/cuda/kernels.cu"
#include "../../crates/inference/src/backend/cuda/attention.cu"

// The loaded-ahead matrix-vector kernel tried on 2026-12-03 (device calls 8.1-8.3; slower than
// `gemv` of kernels.cu, see docs/benchmarks.md): the same staging and sums (gemv_stage,
// gemv_chunk, gemv_store), so its results are bit-equal to gemv's.
// The shared-memory address of a generic pointer to shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Matrix-vector products with the weights loaded ahead (compute capability 9.0 and later):
// the same products as `gemv`, but block b owns columns [b * share, (b + 1) * share) and,
// before it waits for the kernel before it, asks the copy engine (cp.async.bulk) for its
// first `ring` tiles of `tile` weight rows into shared memory. With programmatic dependent
// launch its blocks run beside the previous kernel's, so the weights stream from memory while
// that kernel still works, and a decode step is no longer a chain of per-launch ramps. Tiles
// past the ring are loaded into the slot the tile `ring` before it freed. Dynamic shared
// memory: the staged rows (m k f32, padded to 128 bytes), then ring * tile weight rows; one
// mbarrier per slot. Block: 256 threads; warp w takes rows w, w + 8, ... of each tile.
#define GEMV_RING_MAX 32

template <bool BF16>
__device__ void gemv_ahead(const float* x, const void* w, float* y, int m, int n, int k,
                           int accumulate, const float* norm_w, float eps, int swiglu, int share,
                           int tile, int ring) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ float4 xs4[];
    __shared__ __align__(8) u64 bars[GEMV_RING_MAX];
    const int chunks = BF16 ? k / 8 : k / 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned row_bytes = (unsigned)k * (BF16 ? 2u : 4u);
    char* ws = (char*)xs4 + ((m * k * 4 + 127) & ~127);
    const int c0 = blockIdx.x * share, cols = min(n, c0 + share) - c0;
    const int tiles = (cols + tile - 1) / tile;
    // Tile t: rows c0 + t * tile .. of W (contiguous bytes) into slot t % ring.
    auto issue = [&](int t) {
        const int slot = t % ring;
        const unsigned bytes = (unsigned)min(tile, cols - t * tile) * row_bytes;
        const unsigned bar = smem_addr(&bars[slot]);
        const char* src = (const char*)w + (size_t)(c0 + t * tile) * row_bytes;
        asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                     :: "r"(bar), "r"(bytes) : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
            :: "r"(smem_addr(ws + (size_t)slot * tile * row_bytes)), "l"(src), "r"(bytes), "r"(bar)
            : "memory");
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < ring; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&bars[s])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int t = 0; t < min(tiles, ring); t++) issue(t);
    }
    // The weights stream in while the kernel before finishes; the barriers' initialization is
    // visible to every thread after the staging's synchronization.
    DEP_ENTER();
    gemv_stage<BF16>(x, xs4, m, k, norm_w, eps, swiglu);
    for (int t = 0; t < tiles; t++) {
        const int slot = t % ring;
        const unsigned bar = smem_addr(&bars[slot]), parity = (unsigned)(t / ring) & 1u;
        unsigned done = 0;
        while (!done) {
            asm volatile(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        }
        const int rows = min(tile, cols - t * tile);
        const char* wt = ws + (size_t)slot * tile * row_bytes;
        for (int r = warp; r < rows; r += 8) {
            const uint4* wr = (const uint4*)(wt + (size_t)r * row_bytes);
            float acc[GEMV_ROWS];
#pragma unroll
            for (int j = 0; j < GEMV_ROWS; j++) acc[j] = 0.0f;
            for (int c = lane; c < chunks; c += 32) gemv_chunk<BF16>(acc, wr[c], xs4, c, m, k);
            gemv_store(acc, y, m, n, c0 + t * tile + r, lane, accumulate);
        }
        if (t + ring < tiles) {
            // Every warp is done with the slot: the copy engine may overwrite it.
            __syncthreads();
            if (threadIdx.x == 0) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(t + ring);
            }
        }
    }
#else
    __trap();  // launched only on compute capability 9.0 and later (launch.rs)
#endif
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

#define SLOTS 512

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// Per launch l and block b (at most SLOTS blocks): start and end times (ns), when `stamps` is set.
__device__ void stamp(u64* stamps, int l, int end) {
    if (stamps != nullptr && threadIdx.x == 0) stamps[((size_t)l * SLOTS + blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) * 2 + end] = now_ns();
}

extern "C" __global__ void probe_stream(const float* x, const bf16_t* w, float* y, int m, int n, int k,
                                        int accumulate, const float* norm_w, float eps, int swiglu,
                                        u64* stamps, int l) {
    stamp(stamps, l, 0);
    gemv<true>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu);
    stamp(stamps, l, 1);
}

extern "C" __global__ void __launch_bounds__(256) probe_ahead(
    const float* x, const bf16_t* w, float* y, int m, int n, int k, int accumulate,
    const float* norm_w, float eps, int swiglu, int share, int tile, int ring, u64* stamps, int l) {
    stamp(stamps, l, 0);
    gemv_ahead<true>(x, w, y, m, n, k, accumulate, norm_w, eps, swiglu, share, tile, ring);
    stamp(stamps, l, 1);
}

// Stands in for a small kernel of `us` microseconds (Q/K/V preparation, attention).
extern "C" __global__ void busy(float* out, int us, u64* stamps, int l) {
    stamp(stamps, l, 0);
    DEP_ENTER();
    const u64 t0 = now_ns();
    while (now_ns() - t0 < (u64)us * 1000) {}
    if (threadIdx.x == 0) out[blockIdx.x] = 1.0f;
    stamp(stamps, l, 1);
}

// The real Q/K/V preparation and decode attention of attention.cu (Qwen3-0.6B heads: 16 query and
// 8 key/value heads of 128, f32 pages of 32 rows, one sequence at position `pos`), stamped.
extern "C" __global__ void probe_prep(const float* qkv, float* q_out, const u64* dst, const int* pos,
                                      const float* inv_freq, const float* q_w, const float* k_w,
                                      long long val_off, u64* stamps, int l) {
    stamp(stamps, l, 0);
    DEP_ENTER();
    qkv_prep<float>(qkv, q_out, dst, pos, inv_freq, 64, 1.0f, q_w, k_w, 1e-6f, 16, 8, 128, 0, val_off);
    stamp(stamps, l, 1);
}

extern "C" __global__ void __launch_bounds__(32 * DECODE_WARPS) probe_attn(
    const float* q, float* out, const int* row_pos, const u64* pages, const int* page0,
    long long val_off, int splits, float* part, unsigned* counters, u64* stamps, int l) {
    stamp(stamps, l, 0);
    DEP_ENTER();
    attn_decode<float, 4, 1>(q, out, row_pos, pages, page0, 32, 0, val_off, 16, 8, 128, 0.0884f, 0,
                          splits, part, counters);
    stamp(stamps, l, 1);
}

struct Mat { int n, k; int input; };  // input: 0 plain, 1 normed, 2 swiglu

template <typename... P, typename... A>
void launch(cudaStream_t s, bool pdl, void (*f)(P...), dim3 grid, int block, int smem, A... args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid; c.blockDim = dim3(block); c.dynamicSmemBytes = smem; c.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at; c.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&c, f, args...));
}

int main(int argc, char** argv) {
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    const int sms = p.multiProcessorCount;
    printf("%s, %d SMs, smem opt-in %zu\n", p.name, sms, p.sharedMemPerBlockOptin);
    const int layers = 28;
    const Mat mats[4] = {{4096, 1024, 1}, {1024, 2048, 0}, {6144, 1024, 1}, {1024, 3072, 2}};
    std::vector<bf16_t*> w(layers * 4);
    for (int l = 0; l < layers; l++)
        for (int i = 0; i < 4; i++) {
            const size_t b = (size_t)mats[i].n * mats[i].k * 2;
            CK(cudaMalloc(&w[l * 4 + i], b));
            CK(cudaMemset(w[l * 4 + i], 0x3c, b));
        }
    float *x, *y, *nw, *junk; u64* stamps;
    CK(cudaMalloc(&x, 2 * 6144 * 4)); CK(cudaMalloc(&y, 2 * 6144 * 4)); CK(cudaMalloc(&nw, 4096 * 4));
    CK(cudaMalloc(&junk, 4096 * 4)); CK(cudaMalloc(&stamps, (size_t)layers * 8 * SLOTS * 2 * 8));
    CK(cudaMemset(x, 0, 2 * 6144 * 4)); CK(cudaMemset(nw, 0, 4096 * 4));
    CK(cudaFuncSetAttribute(probe_ahead, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.sharedMemPerBlockOptin - 1024));
    CK(cudaFuncSetAttribute(probe_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    int res = 2;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&res, probe_stream, 256, 8 * 1024);
    cudaFuncAttributes fa;
    for (auto [name, f] : {std::pair<const char*, const void*>{"gemv", (const void*)probe_stream},
                           {"gemv_ahead", (const void*)probe_ahead}}) {
        CK(cudaFuncGetAttributes(&fa, f));
        printf("%-12s %d registers\n", name, fa.numRegs);
    }
    cudaStream_t s; CK(cudaStreamCreate(&s));
    // REAL_ATTN=1: the real preparation and attention kernels at position POS (default 80)
    // instead of the stand-ins.
    const bool real_attn = std::getenv("REAL_ATTN") && atoi(std::getenv("REAL_ATTN")) == 1;
    const int pos = std::getenv("POS") ? atoi(std::getenv("POS")) : 80;
    const int page_rows = 32, kv_dim = 8 * 128, n_pages = pos / page_rows + 1;
    const long long val_off = (long long)page_rows * kv_dim;
    const int splits = std::min(32, std::max(1, (2 * sms + 15) / 16));
    float *kv, *qbuf, *abuf, *part, *inv_freq, *norms;
    u64 *pages, *dst;
    int *row_pos, *page0;
    unsigned* counters;
    CK(cudaMalloc(&kv, (size_t)layers * n_pages * 2 * val_off * 4));
    CK(cudaMemset(kv, 0, (size_t)layers * n_pages * 2 * val_off * 4));
    CK(cudaMalloc(&qbuf, 2048 * 4)); CK(cudaMalloc(&abuf, 2048 * 4));
    CK(cudaMalloc(&part, (size_t)16 * splits * 130 * 4));
    CK(cudaMalloc(&counters, 4096 * 4)); CK(cudaMemset(counters, 0, 4096 * 4));
    CK(cudaMalloc(&inv_freq, 64 * 4)); CK(cudaMalloc(&norms, 256 * 4));
    {
        std::vector<float> f(64), one(256, 1.0f);
        for (int i = 0; i < 64; i++) f[i] = powf(1e6f, -(float)i / 64.0f);
        CK(cudaMemcpy(inv_freq, f.data(), 64 * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(norms, one.data(), 256 * 4, cudaMemcpyHostToDevice));
    }
    // Layer l's pages, its new row's address and the position.
    CK(cudaMalloc(&pages, (size_t)layers * n_pages * 8)); CK(cudaMalloc(&dst, layers * 8));
    CK(cudaMalloc(&row_pos, 4)); CK(cudaMalloc(&page0, layers * 4));
    {
        std::vector<u64> hp((size_t)layers * n_pages), hd(layers);
        std::vector<int> h0(layers);
        for (int l = 0; l < layers; l++) {
            for (int g = 0; g < n_pages; g++)
                hp[(size_t)l * n_pages + g] = (u64)(kv + ((size_t)l * n_pages + g) * 2 * val_off);
            hd[l] = hp[(size_t)l * n_pages + pos / page_rows] + (u64)(pos % page_rows) * kv_dim * 4;
            h0[l] = l * n_pages;
        }
        CK(cudaMemcpy(pages, hp.data(), hp.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dst, hd.data(), hd.size() * 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(page0, h0.data(), h0.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(row_pos, &pos, 4, cudaMemcpyHostToDevice));
    }
    if (real_attn) printf("real preparation and attention at position %d, %d splits\n", pos, splits);
    const int busy_us[2] = {std::getenv("PREP_US") ? atoi(std::getenv("PREP_US")) : 2,
                            std::getenv("ATTN_US") ? atoi(std::getenv("ATTN_US")) : 6};
    const char* kinds[4] = {"stream", "ahead", "stream", "ahead"};
    for (int variant = 0; variant < 4; variant++) {
        // Programmatic dependent launch on, then off.
        const bool ahead = variant & 1, pdl = variant < 2;
        const int resident = std::getenv("BLOCKS_PER_SM") ? atoi(std::getenv("BLOCKS_PER_SM")) : res;
        auto step = [&](u64* st) {
            int li = 0;
            for (int l = 0; l < layers; l++) {
                for (int i = 0; i < 4; i++) {
                    const Mat mt = mats[i];
                    const float* nwp = mt.input == 1 ? nw : nullptr;
                    const int sw = mt.input == 2;
                    if (ahead) {
                        const int row = mt.k * 2, share = (mt.n + sms - 1) / sms;
                        const int tile = std::min(share, std::max(1, std::min(8, 24 * 1024 / row)));
                        const int tiles = (share + tile - 1) / tile;
                        const int staged = (mt.k * 4 + 127) & ~127;
                        const int ring = std::min({tiles, 112 * 1024 / (tile * row), 32});
                        launch(s, pdl, probe_ahead, (mt.n + share - 1) / share, 256, staged + ring * tile * row,
                               (const float*)x, (const bf16_t*)w[l * 4 + i], y, 1, mt.n, mt.k, 0, nwp, 1e-6f, sw,
                               share, tile, ring, st, li++);
                    } else {
                        launch(s, pdl, probe_stream, std::min((mt.n + 7) / 8, resident * sms), 256, mt.k * 4,
                               (const float*)x, (const bf16_t*)w[l * 4 + i], y, 1, mt.n, mt.k, 0, nwp, 1e-6f, sw,
                               st, li++);
                    }
                    if (i == 0) {
                        if (real_attn) {
                            // The page table of one layer is `dst + l` and `page0 + l`: one row.
                            launch(s, pdl, probe_prep, dim3(1, 32), 128, 0, (const float*)y, qbuf,
                                   (const u64*)(dst + l), (const int*)row_pos, (const float*)inv_freq,
                                   (const float*)norms, (const float*)norms, val_off, st, li++);
                            launch(s, pdl, probe_attn, dim3(1, 16, splits), 32 * DECODE_WARPS, 0, (const float*)qbuf, abuf,
                                   (const int*)row_pos, (const u64*)pages, (const int*)(page0 + l),
                                   val_off, splits, part, counters, st, li++);
                        } else {
                            launch(s, pdl, busy, 48, 128, 0, junk, busy_us[0], st, li++);
                            launch(s, pdl, busy, 2 * sms, 128, 0, junk, busy_us[1], st, li++);
                        }
                    }
                }
            }
            return li;
        };
        for (int with_stamps = 0; with_stamps < 2; with_stamps++) {
            u64* st = with_stamps ? stamps : nullptr;
            cudaGraph_t g; cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            const int launches = step(st);
            CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
            cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
            std::vector<float> t;
            for (int r = 0; r < 9; r++) {
                cudaEventRecord(a, s); CK(cudaGraphLaunch(ge, s)); cudaEventRecord(b, s);
                CK(cudaEventSynchronize(b)); float ms_; cudaEventElapsedTime(&ms_, a, b); t.push_back(ms_);
            }
            std::sort(t.begin(), t.end());
            printf("%-6s pdl=%d stamps=%d: step %.3f ms (%.2f us per layer)\n", kinds[variant], pdl,
                   with_stamps, t[4], t[4] * 1e3 / layers);
            if (with_stamps) {
                // Per kernel: first start, last start, last end (relative to the kernel before's
                // last end), over one replay's middle layers.
                std::vector<u64> h((size_t)launches * SLOTS * 2);
                CK(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost));
                const char* names[6] = {"qkv", "prep", "attn", "o", "gate_up", "down"};
                double sum[6][3] = {};
                int cnt = 0;
                for (int l = 2; l < layers - 1; l++, cnt++) {
                    for (int j = 0; j < 6; j++) {
                        const int li = l * 6 + j, prev = li - 1;
                        auto range = [&](int q, u64& s0, u64& s1, u64& e1) {
                            s0 = ~0ull; s1 = 0; e1 = 0;
                            for (int b = 0; b < SLOTS; b++) {
                                const u64 a = h[((size_t)q * SLOTS + b) * 2], e = h[((size_t)q * SLOTS + b) * 2 + 1];
                                if (a == 0) continue;
                                s0 = std::min(s0, a); s1 = std::max(s1, a); e1 = std::max(e1, e);
                            }
                        };
                        u64 ps0, ps1, pe1, s0, s1, e1;
                        range(prev, ps0, ps1, pe1);
                        range(li, s0, s1, e1);
                        sum[j][0] += (double)s0 - (double)pe1;
                        sum[j][1] += (double)s1 - (double)pe1;
                        sum[j][2] += (double)e1 - (double)pe1;
                    }
                }
                for (int j = 0; j < 6; j++)
                    printf("   %-8s first start %+7.2f us, last start %+7.2f us, end %+7.2f us after the kernel before ends\n",
                           names[j], sum[j][0] / cnt / 1e3, sum[j][1] / cnt / 1e3, sum[j][2] / cnt / 1e3);
                CK(cudaMemset(stamps, 0, (size_t)layers * 8 * SLOTS * 2 * 8));
            }
            CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
        }
    }
    return 0;
}
