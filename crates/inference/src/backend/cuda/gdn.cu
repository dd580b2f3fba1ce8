
// ---- Qwen3.5's layers: Gated DeltaNet (attention/gdn.rs is the CPU form) and gated attention ----
//
// A sequence's recurrent state is one device block (state/seq.rs): per recurrent layer its
// convolution window [K - 1, conv_dim] at `conv_off` and n_v_heads matrices S [dk, dv] at
// `rec_off` (values from the block's start). `states[s]` is sequence s's block and rows
// cu[s] .. cu[s + 1] of the packed rows are its new tokens. The kernels update the states in
// place.

// x *= sigmoid(gate) elementwise, both [n].
extern "C" __global__ void sigmoid_gate(float* x, const float* gate, long long n) {
    DEP_ENTER();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

// A gated query projection [rows, n_heads * 2 hd | rest] (per head: query, then gate) into
// qkv [rows, n_heads * hd + rest] (the queries, then the rest as it is) and gate
// [rows, n_heads * hd]. One thread per input value; `width` = n_heads * 2 hd + rest.
extern "C" __global__ void split_query_gate(const float* x, float* qkv, float* gate, int n_heads,
                                            int hd, int width, long long n) {
    DEP_ENTER();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / width;
    const int c = (int)(i - r * width);
    const int qg = n_heads * 2 * hd, q_dim = n_heads * hd;
    const float v = x[i];
    if (c >= qg) {
        qkv[r * (width - q_dim) + q_dim + (c - qg)] = v;
        return;
    }
    const int h = c / (2 * hd), d = c - h * 2 * hd;
    if (d < hd) qkv[r * (width - q_dim) + h * hd + d] = v;
    else gate[r * q_dim + h * hd + (d - hd)] = v;
}

// Gated RMSNorm of x [rows * n_heads, dim] in place: w * (x / sqrt(mean(x^2) + eps)) * silu(z),
// with z of row r, head h at z[r * ld + h * dim ..]. Grid: rows * n_heads.
extern "C" __global__ void rms_norm_silu_gate(float* x, const float* w, const float* z, int ld,
                                              int n_heads, int dim, float eps) {
    DEP_ENTER();
    const int r = blockIdx.x / n_heads, h = blockIdx.x - r * n_heads;
    float* xr = x + (size_t)blockIdx.x * dim;
    const float* zr = z + (size_t)r * ld + (size_t)h * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    const float rs = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float g = zr[i];
        xr[i] = w[i] * (xr[i] * rs) * (g / (1.0f + expf(-g)));
    }
}

#define GDN_MAX_KERNEL 8

// The causal depthwise convolution and SiLU of a GDN layer, one thread per (channel, row):
// mixed[t, c] = silu(sum_j w[c, j] x[t + j - (K - 1), c]) with x the first conv_dim columns
// of proj (rows of ld values) and, before its sequence's first new row, the sequence's window.
// The window itself is advanced afterwards by gdn_delta. Grid: (rows, ceil(conv_dim / 128)).
extern "C" __global__ void gdn_conv(const float* proj, int ld, float* mixed, const float* w,
                                    const u64* states, long long conv_off, const int* cu,
                                    int n_seqs, int conv_dim, int K) {
    DEP_ENTER();
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const int t = blockIdx.x;
    if (c >= conv_dim) return;
    int s = 0;
    while (s + 1 < n_seqs && cu[s + 1] <= t) ++s;
    const float* win = (const float*)states[s] + conv_off;
    const int t0 = cu[s];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < GDN_MAX_KERNEL; ++j) {
        if (j < K) {
            const int p = t + j - (K - 1);  // row of the input; before t0: the window
            const float x = p >= t0 ? proj[(size_t)p * ld + c]
                                    : win[(size_t)(p - t0 + K - 1) * conv_dim + c];
            acc += w[c * K + j] * x;
        }
    }
    mixed[(size_t)t * conv_dim + c] = acc / (1.0f + expf(-acc));
}

// Advances sequence s's convolution window after a pass of n new rows from row t0 (gdn_conv
// has read the old one): new row r holds input n - (K - 1) + r of the pass, a new row, or old
// row n + r. The sequence's blocks share the channels; each channel is one thread's, rows in
// increasing order (row r is written after row n + r > r is read).
__device__ void gdn_advance_window(float* win, const float* proj, int ld, int t0, int n,
                                   int conv_dim, int K) {
    if (n == 0) return;
    const int per_seq = gridDim.x * gridDim.y * blockDim.x;
    const int me = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    for (int c = me; c < conv_dim; c += per_seq) {
        for (int r = 0; r < K - 1; ++r) {
            const int p = n - (K - 1) + r;
            win[(size_t)r * conv_dim + c] = p >= 0 ? proj[(size_t)(t0 + p) * ld + c]
                                                   : win[(size_t)(n + r) * conv_dim + c];
        }
    }
}

// The gated delta rule of one value head over a sequence's new tokens, token by token:
//   S <- S exp(g);  S <- S + k (beta (v - S^T k))^T;  o = S^T q
// with q, k L2-normalized (eps 1e-6; q also scaled by q_scale), beta = sigmoid(b) and
// g = -a_log_exp * softplus(a + dt_bias) from the layer's projection (b at column bcol + h, a at
// bcol + n_v_heads + h of proj). A block per (32 value columns, value head, sequence) of
// DK / 32 warps: warp w holds rows 32w .. 32w + 31 of those columns of S in registers (lane =
// column), so a token costs each warp 32 rows and the sums over rows meet in shared memory.
// q, k, v come from mixed [rows, conv_dim] (the convolution's output: queries, keys, values
// side by side); o goes to out [rows, vd]. The next token's inputs are loaded while the
// current one is computed. The block also advances its share of the sequence's convolution
// window.
template <int DK>
__device__ void gdn_delta(const float* mixed, const float* proj, int ld, int bcol, float* out,
                          const float* a_log_exp, const float* dt_bias, const u64* states,
                          long long conv_off, long long rec_off, const int* cu, int n_k_heads,
                          int n_v_heads, int dk, int dv, int v_tiled, float q_scale, int K) {
    constexpr int WARPS = DK / 32;
    constexpr int PER = DK / 32;  // q / k values each lane loads
    __shared__ float qk[WARPS][2][DK];
    // Per-warp partial sums over rows, double-buffered by token parity (two barriers a token).
    __shared__ float pm[2][WARPS][32], po[2][WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j = blockIdx.x * 32 + lane;
    const int h = blockIdx.y, s = blockIdx.z;
    const int kh = v_tiled ? h % n_k_heads : h / (n_v_heads / n_k_heads);
    const int kd = n_k_heads * dk, vd = n_v_heads * dv, conv_dim = 2 * kd + vd;
    const bool col = j < dv;
    float* block = (float*)states[s];
    float* S = block + rec_off + (size_t)h * dk * dv;
    const int r0 = warp * 32;  // this warp's rows
    float st[32];
#pragma unroll
    for (int i = 0; i < 32; ++i)
        st[i] = (col && r0 + i < dk) ? S[(size_t)(r0 + i) * dv + j] : 0.0f;
    const float ae = a_log_exp[h], dt = dt_bias[h];
    const int t0 = cu[s], end = cu[s + 1];
    float qv[PER], kv[PER], v = 0.0f, bv = 0.0f, av = 0.0f;
    auto load = [&](int t) {
        const float* row = mixed + (size_t)t * conv_dim;
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int i = p * 32 + lane;
            qv[p] = i < dk ? row[kh * dk + i] : 0.0f;
            kv[p] = i < dk ? row[kd + kh * dk + i] : 0.0f;
        }
        v = col ? row[2 * kd + h * dv + j] : 0.0f;
        bv = proj[(size_t)t * ld + bcol + h];
        av = proj[(size_t)t * ld + bcol + n_v_heads + h];
    };
    if (t0 < end) load(t0);
    int parity = 0;
    for (int t = t0; t < end; ++t, parity ^= 1) {
        // Every warp normalizes the whole q and k (a few shuffles) into its own copy.
        float sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            sq += qv[p] * qv[p];
            sk += kv[p] * kv[p];
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
        float* qs = qk[warp][0];
        float* ks = qk[warp][1];
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            qs[p * 32 + lane] = (qv[p] * rq) * q_scale;
            ks[p * 32 + lane] = kv[p] * rk;
        }
        const float beta = 1.0f / (1.0f + expf(-bv));
        const float x = av + dt;
        const float decay = expf(-ae * (x > 20.0f ? x : log1pf(expf(x))));
        const float vt = v;
        __syncwarp();
        if (t + 1 < end) load(t + 1);
        float m0 = 0.0f, m1 = 0.0f, m2 = 0.0f, m3 = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i += 4) {
            st[i] *= decay;
            st[i + 1] *= decay;
            st[i + 2] *= decay;
            st[i + 3] *= decay;
            m0 += st[i] * ks[r0 + i];
            m1 += st[i + 1] * ks[r0 + i + 1];
            m2 += st[i + 2] * ks[r0 + i + 2];
            m3 += st[i + 3] * ks[r0 + i + 3];
        }
        pm[parity][warp][lane] = (m0 + m1) + (m2 + m3);
        if (WARPS > 1) __syncthreads();
        float mem = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mem += pm[parity][w][lane];
        const float d = (vt - mem) * beta;
        float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i += 4) {
            st[i] += ks[r0 + i] * d;
            st[i + 1] += ks[r0 + i + 1] * d;
            st[i + 2] += ks[r0 + i + 2] * d;
            st[i + 3] += ks[r0 + i + 3] * d;
            o0 += st[i] * qs[r0 + i];
            o1 += st[i + 1] * qs[r0 + i + 1];
            o2 += st[i + 2] * qs[r0 + i + 2];
            o3 += st[i + 3] * qs[r0 + i + 3];
        }
        po[parity][warp][lane] = (o0 + o1) + (o2 + o3);
        if (WARPS > 1) __syncthreads();
        if (warp == 0 && col) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) o += po[parity][w][lane];
            out[(size_t)t * vd + h * dv + j] = o;
        }
        __syncwarp();  // this warp's q / k copy is rewritten next token
    }
#pragma unroll
    for (int i = 0; i < 32; ++i)
        if (col && r0 + i < dk) S[(size_t)(r0 + i) * dv + j] = st[i];

    gdn_advance_window(block + conv_off, proj, ld, t0, end - t0, conv_dim, K);
}


// ---- The chunked (WY / UT-transform) form of the delta rule, for prompts ----
//
// As attention/gdn.rs `delta_rule_chunked`: per chunk of up to 64 tokens, with gamma the
// cumulative log decay, A = (beta k k^T) * exp(gamma_i - gamma_j) below the diagonal,
// intra = (q k^T) * exp(gamma_i - gamma_j) on and below it, U = (I + A)^-1 (v beta),
// W = (I + A)^-1 (k beta exp(gamma)); v_new = U - W S; o = (q exp(gamma)) S + intra v_new;
// S = S exp(gamma_L) + (k exp(gamma_L - gamma))^T v_new. A block of 256 threads per (32 value
// columns, value head, sequence) keeps its slice of S [DK, 32] and the chunk in shared memory
// (gdn_chunk_smem in gdn.rs); the slices of one head repeat the key-only work (A, W).
#define GDN_CHUNK 64
#define GDN_CHUNK_THREADS 256

template <int DK>
__device__ void gdn_chunked(const float* mixed, const float* proj, int ld, int bcol, float* out,
                            const float* a_log_exp, const float* dt_bias, const u64* states,
                            long long conv_off, long long rec_off, const int* cu,
                            int n_k_heads, int n_v_heads, int dk, int dv, int v_tiled,
                            float q_scale, int K) {
    constexpr int C = GDN_CHUNK, KS = DK + 1, NT = GDN_CHUNK_THREADS, PER = DK / 32;
    extern __shared__ float sm[];
    float* Qn = sm;              // [C][KS] normalized, scaled queries
    float* Kn = Qn + C * KS;     // [C][KS] normalized keys
    float* W = Kn + C * KS;      // [C][DK]
    float* A = W + C * DK;       // [C][C]
    float* In = A + C * C;       // [C][C]
    float* U = In + C * C;       // [C][32]: v beta, then U, then v_new
    float* Sm = U + C * 32;      // [DK][32] the state slice
    float* gam = Sm + DK * 32;   // [C] cumulative log decay
    float* bet = gam + C;        // [C]
    float* eg = bet + C;         // [C] exp(gamma)
    float* ed = eg + C;          // [C] exp(gamma_L - gamma)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.y, s = blockIdx.z, j0 = blockIdx.x * 32;
    const int kh = v_tiled ? h % n_k_heads : h / (n_v_heads / n_k_heads);
    const int kd = n_k_heads * dk, vd = n_v_heads * dv, conv_dim = 2 * kd + vd;
    float* block = (float*)states[s];
    float* S = block + rec_off + (size_t)h * dk * dv;
    for (int e = tid; e < DK * 32; e += NT) {
        const int d = e >> 5, c = e & 31;
        Sm[e] = (d < dk && j0 + c < dv) ? S[(size_t)d * dv + j0 + c] : 0.0f;
    }
    const float ae = a_log_exp[h], dt = dt_bias[h];
    const int t0 = cu[s], end = cu[s + 1];
    for (int c0 = t0; c0 < end; c0 += C) {
        const int l = min(C, end - c0);
        __syncthreads();  // the previous chunk is done with Kn, U, Sm
        // Inputs: every load of the chunk in flight at once, then a warp per token normalizes.
#pragma unroll 4
        for (int e = tid; e < C * DK; e += NT) {
            const int i = e / DK, d = e - i * DK;
            const bool ok = i < l && d < dk;
            const float* row = mixed + (size_t)(c0 + i) * conv_dim;
            Qn[i * KS + d] = ok ? row[kh * dk + d] : 0.0f;
            Kn[i * KS + d] = ok ? row[kd + kh * dk + d] : 0.0f;
        }
        for (int e = tid; e < C * 32; e += NT) {
            const int i = e >> 5, c = e & 31;
            U[e] = i < l && j0 + c < dv ? mixed[(size_t)(c0 + i) * conv_dim + 2 * kd + h * dv + j0 + c]
                                         : 0.0f;
        }
        if (tid < C) {
            float beta = 0.0f, g = 0.0f;
            if (tid < l) {
                const float* pr = proj + (size_t)(c0 + tid) * ld + bcol;
                const float b = pr[h], x = pr[n_v_heads + h] + dt;
                beta = 1.0f / (1.0f + expf(-b));
                g = -ae * (x > 20.0f ? x : log1pf(expf(x)));
            }
            bet[tid] = beta;
            gam[tid] = g;
        }
        __syncthreads();
        for (int i = warp; i < l; i += NT / 32) {
            float sq = 0.0f, sk = 0.0f;
#pragma unroll
            for (int p = 0; p < PER; ++p) {
                const float q = Qn[i * KS + p * 32 + lane], k = Kn[i * KS + p * 32 + lane];
                sq += q * q;
                sk += k * k;
            }
            sq = warp_sum(sq);
            sk = warp_sum(sk);
            const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
#pragma unroll
            for (int p = 0; p < PER; ++p) {
                Qn[i * KS + p * 32 + lane] = (Qn[i * KS + p * 32 + lane] * rq) * q_scale;
                Kn[i * KS + p * 32 + lane] *= rk;
            }
            U[i * 32 + lane] *= bet[i];
        }
        __syncthreads();
        if (tid == 0) {  // cumulative log decay, summed in token order as the CPU does
            float acc = 0.0f;
            for (int i = 0; i < l; ++i) {
                acc += gam[i];
                gam[i] = acc;
            }
        }
        __syncthreads();
        const float gl = gam[l - 1];
        if (tid < C) {
            eg[tid] = expf(gam[tid]);
            ed[tid] = expf(gl - gam[tid]);
        }
        // A (strictly lower) and intra (lower with the diagonal), decayed: a 4 x 4 tile of
        // both per thread (register-tiled: 12 shared loads per 32 products).
        {
            const int i0 = (tid >> 4) * 4, jt = (tid & 15) * 4;
            float sa[4][4] = {}, sq[4][4] = {};
            if (jt <= i0 + 3 && i0 < l) {
                for (int d = 0; d < DK; ++d) {
                    float ki[4], qi[4], kj[4];
#pragma unroll
                    for (int r = 0; r < 4; ++r) {
                        ki[r] = Kn[(i0 + r) * KS + d];
                        qi[r] = Qn[(i0 + r) * KS + d];
                        kj[r] = Kn[(jt + r) * KS + d];
                    }
#pragma unroll
                    for (int r = 0; r < 4; ++r)
#pragma unroll
                        for (int c = 0; c < 4; ++c) {
                            sa[r][c] += ki[r] * kj[c];
                            sq[r][c] += qi[r] * kj[c];
                        }
                }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int i = i0 + r, j = jt + c;
                    float av = 0.0f, iv = 0.0f;
                    if (j <= i && i < l) {
                        const float dec = expf(gam[i] - gam[j]);
                        iv = sq[r][c] * dec;
                        if (j < i) av = (sa[r][c] * bet[i]) * dec;
                    }
                    A[i * C + j] = av;
                    In[i * C + j] = iv;
                }
        }
        __syncthreads();
        // Forward substitution by (I + A), a thread per column of W (k beta exp(gamma)) and U.
        if (tid < DK + 32) {
            const bool isw = tid < DK;
            const int col = isw ? tid : tid - DK, ldx = isw ? DK : 32;
            float* X = isw ? W : U;
            // Subtracted in order, as the CPU's solve does (the solve amplifies rounding).
            for (int i = 0; i < l; ++i) {
                float v = isw ? (Kn[i * KS + col] * bet[i]) * eg[i] : U[i * 32 + col];
                const float* ai = A + i * C;
                for (int j = 0; j < i; ++j) v -= ai[j] * X[j * ldx + col];
                X[i * ldx + col] = v;
            }
        }
        __syncthreads();
        // The [C, 32] products below: a tile of 4 rows x 2 columns per thread.
        const int r0 = (tid >> 4) * 4, cc = (tid & 15) * 2;
        // v_new = U - W S.
        if (r0 < l) {
            float acc[4][2] = {};
            for (int d = 0; d < DK; ++d) {
                const float s0 = Sm[d * 32 + cc], s1 = Sm[d * 32 + cc + 1];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float w = W[(r0 + r) * DK + d];
                    acc[r][0] += w * s0;
                    acc[r][1] += w * s1;
                }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                U[(r0 + r) * 32 + cc] -= acc[r][0];
                U[(r0 + r) * 32 + cc + 1] -= acc[r][1];
            }
        }
        __syncthreads();
        // o = (q exp(gamma)) S + intra v_new (intra is zero above its diagonal).
        if (r0 < l) {
            float a1[4][2] = {}, a2[4][2] = {};
            for (int d = 0; d < DK; ++d) {
                const float s0 = Sm[d * 32 + cc], s1 = Sm[d * 32 + cc + 1];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float q = Qn[(r0 + r) * KS + d];
                    a1[r][0] += q * s0;
                    a1[r][1] += q * s1;
                }
            }
            const int jn = min(r0 + 4, l);
            for (int j = 0; j < jn; ++j) {
                const float u0 = U[j * 32 + cc], u1 = U[j * 32 + cc + 1];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float in = In[(r0 + r) * C + j];
                    a2[r][0] += in * u0;
                    a2[r][1] += in * u1;
                }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int i = r0 + r;
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    if (i < l && j0 + cc + c < dv)
                        out[(size_t)(c0 + i) * vd + h * dv + j0 + cc + c] =
                            a1[r][c] * eg[i] + a2[r][c];
            }
        }
        __syncthreads();
        // S = S exp(gamma_L) + (k exp(gamma_L - gamma))^T v_new: DK / 32 rows x 4 columns a
        // thread.
        {
            constexpr int RD = DK / 32;
            const int d0 = (tid >> 3) * RD, c4 = (tid & 7) * 4;
            const float el = expf(gl);
            float acc[RD][4] = {};
            for (int j = 0; j < l; ++j) {
                float u[4], kk[RD];
#pragma unroll
                for (int c = 0; c < 4; ++c) u[c] = U[j * 32 + c4 + c];
#pragma unroll
                for (int r = 0; r < RD; ++r) kk[r] = Kn[j * KS + d0 + r] * ed[j];
#pragma unroll
                for (int r = 0; r < RD; ++r)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[r][c] += kk[r] * u[c];
            }
#pragma unroll
            for (int r = 0; r < RD; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float* sp = Sm + (d0 + r) * 32 + c4 + c;
                    *sp = *sp * el + acc[r][c];
                }
        }
    }
    __syncthreads();
    for (int e = tid; e < DK * 32; e += NT) {
        const int d = e >> 5, c = e & 31;
        if (d < dk && j0 + c < dv) S[(size_t)d * dv + j0 + c] = Sm[e];
    }
    gdn_advance_window(block + conv_off, proj, ld, t0, end - t0, conv_dim, K);
}

// The entry points of both delta-rule forms, by key width (gdn.rs DELTA_KEY_DIMS).
#define GDN_KERNEL(NAME, FORM, DK)                                                              \
    extern "C" __global__ void NAME(const float* mixed, const float* proj, int ld, int bcol,    \
                                    float* out, const float* a_log_exp, const float* dt_bias,   \
                                    const u64* states, long long conv_off, long long rec_off,   \
                                    const int* cu, int n_k_heads, int n_v_heads, int dk, int dv, \
                                    int v_tiled, float q_scale, int K) {                        \
        DEP_ENTER();                                                                            \
        FORM<DK>(mixed, proj, ld, bcol, out, a_log_exp, dt_bias, states, conv_off, rec_off, cu, \
                 n_k_heads, n_v_heads, dk, dv, v_tiled, q_scale, K);                            \
    }
GDN_KERNEL(gdn_delta_k32, gdn_delta, 32)
GDN_KERNEL(gdn_delta_k64, gdn_delta, 64)
GDN_KERNEL(gdn_delta_k128, gdn_delta, 128)
GDN_KERNEL(gdn_chunked_k32, gdn_chunked, 32)
GDN_KERNEL(gdn_chunked_k64, gdn_chunked, 64)
GDN_KERNEL(gdn_chunked_k128, gdn_chunked, 128)
