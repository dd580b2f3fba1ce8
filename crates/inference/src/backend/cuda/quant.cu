// GGUF Q8_0 products on the GPU (appended to kernels.cu by backend/cuda/mod.rs). A Q8_0 weight
// matrix [n, k] is held as int8 codes [n, k] and f16 scales [n, k / 32] (the GGUF blocks split
// in two arrays, so rows of codes are 16-byte aligned). Activations are quantized per block of
// 32 exactly as the CPU backend does (quant/act.rs, ggml's x86 quantizer): d = amax / 127
// rounded to f16, q = round_half_even(x * (127 / amax)); a block's dot product is the integer
// sum of its 32 code products times dw * dx. The integer sums are exact, so the GPU differs
// from the CPU only in the order the f32 block terms are added.

// Block r quantizes row r of x, with the input mode of split_bf16 applied (RMSNorm with
// norm_w, or SwiGLU of rows of 2k values), into codes q [r, k] and scales d [r, k / 32] (f32
// holding the f16-rounded scale). k is a multiple of 32; blockDim.x a multiple of 32.
extern "C" __global__ void q8_quantize(const float* x, signed char* q, float* d, int k,
                                       const float* norm_w, float eps, int swiglu) {
    DEP_ENTER();
    const int r = blockIdx.x;
    const float* xr = x + (size_t)r * (swiglu ? 2 * k : k);
    const float scale = norm_w != nullptr ? row_rms_scale(xr, k, swiglu, eps) : 1.0f;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int kb = k / 32;
    for (int b = warp; b < kb; b += warps) {
        const int i = b * 32 + lane;
        float v = split_input(xr, i, k, swiglu);
        if (norm_w != nullptr) v = norm_w[i] * (v * scale);
        const float amax = warp_max(fabsf(v));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        q[(size_t)r * k + i] = (signed char)__float2int_rn(v * id);
        if (lane == 0) d[(size_t)r * kb + b] = f16_to_f32(f32_to_f16(amax / 127.0f));
    }
}

// Chunks of 16 codes each lane loads before it multiplies any (bytes in flight per warp).
#define Q8_PF 4

// Rows one block of gemv_q8 takes (its grid's y dimension walks groups of them).
#define Q8_GEMV_ROWS 8

// y [m, n] (+)= x · Wᵀ for f32 rows x (input mode as q8_quantize) and Q8_0 weights (wq [n, k],
// wd [n, k / 32] f16): block (bx, g) quantizes rows 8g .. 8g + 7 into shared memory (codes,
// then scales: 9k / 8 bytes a row) exactly as q8_quantize, then each warp takes output columns
// as gemv does, streaming W once per row group (the second and later groups from L2).
extern "C" __global__ void gemv_q8(const float* x, const signed char* wq, const f16_t* wd,
                                   float* y, int m, int n, int k, int accumulate,
                                   const float* norm_w, float eps, int swiglu) {
    extern __shared__ int4 xs_q8[];
    const int kb = k / 32, k16 = k / 16;
    const int row0 = blockIdx.y * Q8_GEMV_ROWS;
    const int rows = min(Q8_GEMV_ROWS, m - row0);
    int4* xs = xs_q8;
    float* xds = (float*)(xs + rows * k16);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    DEP_ENTER();
    float rs[Q8_GEMV_ROWS];
#pragma unroll
    for (int j = 0; j < Q8_GEMV_ROWS; j++) {
        rs[j] = 1.0f;
        if (norm_w != nullptr && j < rows)
            rs[j] = row_rms_scale(x + (size_t)(row0 + j) * (swiglu ? 2 * k : k), k, swiglu, eps);
    }
    for (int t = warp; t < rows * kb; t += warps) {
        const int j = t / kb, b = t - j * kb, i = b * 32 + lane;
        const float* xr = x + (size_t)(row0 + j) * (swiglu ? 2 * k : k);
        float v = split_input(xr, i, k, swiglu);
        float r = 1.0f;
#pragma unroll
        for (int jj = 0; jj < Q8_GEMV_ROWS; jj++) {
            if (jj == j) r = rs[jj];
        }
        if (norm_w != nullptr) v = norm_w[i] * (v * r);
        const float amax = warp_max(fabsf(v));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        ((signed char*)xs)[(size_t)j * k + i] = (signed char)__float2int_rn(v * id);
        if (lane == 0) xds[j * kb + b] = f16_to_f32(f32_to_f16(amax / 127.0f));
    }
    __syncthreads();
    const int stride = gridDim.x * warps;
    for (int col = blockIdx.x * warps + warp; col < n; col += stride) {
        const int4* wr = (const int4*)(wq + (size_t)col * k);
        const f16_t* wdr = wd + (size_t)col * kb;
        float acc[Q8_GEMV_ROWS];
#pragma unroll
        for (int j = 0; j < Q8_GEMV_ROWS; j++) acc[j] = 0.0f;
        for (int c0 = lane; c0 < k16; c0 += 32 * Q8_PF) {
            int4 w4[Q8_PF];
            float dw[Q8_PF];
#pragma unroll
            for (int u = 0; u < Q8_PF; u++) {
                const int c = c0 + 32 * u;
                if (c < k16) {
                    w4[u] = wr[c];
                    dw[u] = f16_to_f32(wdr[c >> 1]);
                }
            }
#pragma unroll
            for (int u = 0; u < Q8_PF; u++) {
                const int c = c0 + 32 * u;
                if (c >= k16) break;
#pragma unroll
                for (int j = 0; j < Q8_GEMV_ROWS; j++) {
                    if (j >= rows) break;
                    const int4 a = xs[j * k16 + c];
                    int s = __dp4a(w4[u].x, a.x, 0);
                    s = __dp4a(w4[u].y, a.y, s);
                    s = __dp4a(w4[u].z, a.z, s);
                    s = __dp4a(w4[u].w, a.w, s);
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

// Tiles of the batched product: 64 rows x 64 columns per block of 256 threads (each 4 x 4
// outputs), k staged Q8_KB blocks of 32 at a time.
#define Q8_TILE 64
#define Q8_KB 4
#define Q8_WORDS (Q8_KB * 8)

// y [m, n] (+)= x · Wᵀ for any m, operands as gemv_q8; grid (n / 64, m / 64) rounded up.
extern "C" __global__ void gemm_q8(const signed char* xq, const float* xd,
                                   const signed char* wq, const f16_t* wd, float* y, int m,
                                   int n, int k, int accumulate) {
    // Rows padded by one word: the 16 columns a warp reads fall in distinct banks.
    __shared__ int xs[Q8_TILE][Q8_WORDS + 1];
    __shared__ int ws[Q8_TILE][Q8_WORDS + 1];
    __shared__ float xds[Q8_KB][Q8_TILE];
    __shared__ float wds[Q8_KB][Q8_TILE];
    DEP_ENTER();
    const int r0 = blockIdx.y * Q8_TILE, c0 = blockIdx.x * Q8_TILE;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int kb = k / 32;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int b0 = 0; b0 < kb; b0 += Q8_KB) {
        for (int t = threadIdx.x; t < Q8_TILE * Q8_WORDS; t += blockDim.x) {
            const int row = t / Q8_WORDS, w = t - row * Q8_WORDS;
            const int b = b0 + w / 8;
            const bool in_k = b < kb;
            const int xr = r0 + row, wc = c0 + row;
            xs[row][w] = xr < m && in_k
                ? ((const int*)(xq + (size_t)xr * k))[b0 * 8 + w] : 0;
            ws[row][w] = wc < n && in_k
                ? ((const int*)(wq + (size_t)wc * k))[b0 * 8 + w] : 0;
        }
        for (int t = threadIdx.x; t < Q8_TILE * Q8_KB; t += blockDim.x) {
            const int row = t / Q8_KB, bb = t - row * Q8_KB;
            const int b = b0 + bb;
            const int xr = r0 + row, wc = c0 + row;
            xds[bb][row] = xr < m && b < kb ? xd[(size_t)xr * kb + b] : 0.0f;
            wds[bb][row] = wc < n && b < kb ? f16_to_f32(wd[(size_t)wc * kb + b]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int bb = 0; bb < Q8_KB; bb++) {
            int s[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] = 0;
#pragma unroll
            for (int w = bb * 8; w < bb * 8 + 8; w++) {
                int a[4], c[4];
#pragma unroll
                for (int i = 0; i < 4; i++) a[i] = xs[ty + 16 * i][w];
#pragma unroll
                for (int j = 0; j < 4; j++) c[j] = ws[tx + 16 * j][w];
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) s[i][j] = __dp4a(a[i], c[j], s[i][j]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] += (float)s[i][j] * (xds[bb][ty + 16 * i] * wds[bb][tx + 16 * j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = r0 + ty + 16 * i;
        if (r >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int c = c0 + tx + 16 * j;
            if (c >= n) continue;
            float* o = y + (size_t)r * n + c;
            *o = accumulate ? *o + acc[i][j] : acc[i][j];
        }
    }
}
