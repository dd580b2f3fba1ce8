// The matrix-vector kernel of kernels.cu (plain and with its fused norm / SwiGLU input),
// cuBLAS bf16 products and the small kernels of a decode step, timed on the device inside CUDA
// graphs over rotating weight copies (so weights come from DRAM, as in a decode step). The
// variants of the kernel tried on 2026-12-01 (columns per warp, warps per block; none was
// faster) are in the history of this file.
//   nvcc -O3 -arch=sm_90 -o /tmp/gemv_bench scripts/gpu/gemv_bench.cu -lcublas && /tmp/gemv_bench [gemv|blas]
// Prints, per shape and input, microseconds per launch and weight bytes per second.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <string>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include "../../crates/inference/src/backend/cuda/kernels.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

// Median of 5 replays of a graph of `launches` calls of `launch`, in microseconds per call.
template <typename F>
double time_in_graph(cudaStream_t s, int launches, F launch) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches; i++) launch(i);
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(a, s); CK(cudaGraphLaunch(ge, s)); cudaEventRecord(b, s);
        CK(cudaEventSynchronize(b)); float ms_; cudaEventElapsedTime(&ms_, a, b); t.push_back(ms_);
    }
    std::sort(t.begin(), t.end());
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    return t[2] * 1e3 / launches;
}

struct Shape { const char* name; int n, k; };

int main(int argc, char** argv) {
    const bool do_gemv = argc < 2 || std::string(argv[1]) == "gemv";
    const bool do_blas = argc < 2 || std::string(argv[1]) == "blas";
    cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
    Shape shapes[] = {{"qkv", 4096, 1024}, {"o", 1024, 2048}, {"gate_up", 6144, 1024},
                      {"down", 1024, 3072}, {"lm_head", 151936, 1024}};
    const int ms[] = {1, 2};
    cudaStream_t s; CK(cudaStreamCreate(&s));
    for (auto sh : shapes) {
        if (!do_gemv) break;
        const size_t wbytes = (size_t)sh.n * sh.k * 2;
        const int copies = (int)std::max<size_t>(2, (400u << 20) / wbytes);
        std::vector<bf16_t*> ws(copies);
        std::vector<unsigned short> h((size_t)sh.n * sh.k);
        for (auto& v : h) v = (unsigned short)(0x3c00 + (rand() & 0x3ff) - 0x200);
        for (auto& w : ws) { CK(cudaMalloc(&w, wbytes)); CK(cudaMemcpy(w, h.data(), wbytes, cudaMemcpyHostToDevice)); }
        float *x, *y, *nw; CK(cudaMalloc(&x, 8 * sh.k * 4 * 2)); CK(cudaMalloc(&y, (size_t)8 * sh.n * 4)); CK(cudaMalloc(&nw, sh.k * 4));
        std::vector<float> hx(8 * sh.k * 2); for (auto& v : hx) v = (rand() / (float)RAND_MAX) - 0.5f;
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(nw, hx.data(), sh.k * 4, cudaMemcpyHostToDevice));
        for (int m : ms) {
            const int smem = m * sh.k * 4;
            auto run = [&](const char* vname, auto launch) {
                const double us = time_in_graph(s, 100, [&](int i) { launch(ws[i % copies]); });
                printf("%-8s m=%d %-22s %8.2f us %7.0f GB/s\n", sh.name, m, vname, us, wbytes / us / 1e3);
            };
            const int nb8 = (sh.n + 7) / 8;
            run("current plain", [&](bf16_t* w) { gemv_bf16<<<nb8, 256, smem, s>>>(x, w, y, m, sh.n, sh.k, 0, nullptr, 0.f, 0); });
            run("current normed", [&](bf16_t* w) { gemv_bf16<<<nb8, 256, smem, s>>>(x, w, y, m, sh.n, sh.k, 0, nw, 1e-6f, 0); });
            if (sh.k == 3072 && sh.n == 1024)
                run("current swiglu", [&](bf16_t* w) { gemv_bf16<<<nb8, 256, smem, s>>>(x, w, y, m, sh.n, sh.k, 0, nullptr, 0.f, 1); });
        }
        for (auto w : ws) cudaFree(w);
        cudaFree(x); cudaFree(y); cudaFree(nw);
    }
    // cuBLAS bf16 products (as CudaDevice::matmul: bf16 x bf16 -> f32, f32 sums) and the small
    // kernels of a step of m rows, each timed alone in a graph of 50 launches.
    if (do_blas) {
        cublasHandle_t h; cublasCreate(&h); cublasSetStream(h, s);
        for (int m : {16, 32, 64, 128}) {
            for (auto sh : shapes) {
                const size_t wbytes = (size_t)sh.n * sh.k * 2;
                const int copies = (int)std::max<size_t>(2, (400u << 20) / wbytes);
                std::vector<void*> ws(copies);
                for (auto& w : ws) { CK(cudaMalloc(&w, wbytes)); CK(cudaMemset(w, 0x3c, wbytes)); }
                void* xb; float* y; CK(cudaMalloc(&xb, (size_t)m * sh.k * 2)); CK(cudaMemset(xb, 0x3c, (size_t)m * sh.k * 2));
                CK(cudaMalloc(&y, (size_t)m * sh.n * 4));
                const float one = 1.0f, zero = 0.0f;
                auto launch = [&](void* w) {
                    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &one, w, CUDA_R_16BF, sh.k, xb,
                                 CUDA_R_16BF, sh.k, &zero, y, CUDA_R_32F, sh.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                };
                launch(ws[0]); CK(cudaStreamSynchronize(s));
                const double us = time_in_graph(s, 50, [&](int i) { launch(ws[i % copies]); });
                printf("cublas bf16 %-8s m=%-4d %8.2f us %7.0f GB/s of weights\n", sh.name, m, us, wbytes / us / 1e3);
                for (auto w : ws) cudaFree(w);
                cudaFree(xb); cudaFree(y);
            }
        }
        // Small kernels at 64 rows of 1024 (and 6144 for SwiGLU), in graphs.
        float *a1, *a2, *wn; bf16_t* ab;
        CK(cudaMalloc(&a1, 64 * 6144 * 4)); CK(cudaMalloc(&a2, 64 * 6144 * 4)); CK(cudaMalloc(&wn, 4096 * 4)); CK(cudaMalloc(&ab, 64 * 6144 * 2));
        CK(cudaMemset(a1, 0, 64 * 6144 * 4)); CK(cudaMemset(wn, 0, 4096 * 4));
        auto small = [&](const char* name, auto launch) {
            const double us = time_in_graph(s, 100, [&](int) { launch(); });
            printf("%-40s %8.2f us per launch in a graph\n", name, us);
        };
        small("rms_norm 64x1024", [&] { rms_norm<<<64, 256, 0, s>>>(a1, wn, a2, 1024, 1e-6f); });
        small("split_bf16 64x1024", [&] { split_bf16<<<64, 256, 0, s>>>(a1, ab, 1024, nullptr, 0.f, 0); });
        small("silu_mul 64x3072", [&] { silu_mul<<<768, 256, 0, s>>>(a1, a2, 3072, 64 * 3072); });
        small("rms_norm 1x1024", [&] { rms_norm<<<1, 256, 0, s>>>(a1, wn, a2, 1024, 1e-6f); });
    }
    return 0;
}
