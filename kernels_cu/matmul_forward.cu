/*
matmul_forward: the dense (linear) layer, out[bt, o] = bias[o] + sum_c inp[bt, c] * weight[o, c],
i.e. out = inp @ weight^T + bias with inp (B*T, C), weight (OC, C) in PyTorch's nn.Linear layout,
out (B*T, OC), all row-major FP32. The bias may be NULL (GPT-2's LM head has none). In GPT-2 this
is the QKV (OC = 3C), attention projection (OC = C), MLP up (OC = 4C), MLP down (input width 4C)
and LM head (OC = Vp) layers.

Versions (same numbers as llm.c's dev/cuda/matmul_forward.cu):

version 1: naive, one thread per output on an s x s block ("sqrt block size" s): x walks the B*T
           rows, y walks OC; each thread does a length-C dot product straight from global memory.
           Neighbouring threads read different rows, so nothing coalesces.
version 2: cuBLAS SGEMM for inp @ weight^T (issued from Python through llmcupy.runtime.blas: a .cu
           file cannot call cuBLAS), then matmul_forward_bias_kernel2 below adds the bias in a
           separate grid-stride element-wise pass of s*s threads per block. Skipped when bias is NULL.
version 3: cuBLASLt with the bias fused into the GEMM epilogue (CUBLASLT_EPILOGUE_BIAS), issued from
           Python through llmcupy.runtime.blas; no kernel in this file. In the emulator the same
           call runs through NumPy.
version 4: hand-written register-blocked SIMT GEMM (no tensor cores). A 16 x 16 block owns a 128 x 128
           tile of out, each thread an 8 x 8 sub-tile of 64 accumulators in registers, initialised
           from the bias with float4 loads (zeros when bias is NULL). C is walked in chunks of 32:
           the block copies a 128 x 32 slab of inp and of weight into shared memory with float4
           loads, then each thread, per step of 4, loads its 8 weight rows as 8 float4, and per
           input row one float4 and does 8 x 4 FMAs. Each thread starts its walk through the chunk
           at 4 * (threadIdx.x % 8) to spread shared-memory bank accesses. Results leave with
           float4 stores. No bounds checks: B*T % 128 == 0, OC % 128 == 0, C % 32 == 0 and 16-byte
           aligned pointers are required (llm.c reads and writes out of bounds otherwise; here the
           launcher refuses such shapes). Always launched with 16 x 16 threads.

Fastest per llm.c's file: version 3, then version 2 ("very fast"); version 4 is the "relatively
efficient non-tensor-core" kernel the FP32 trainer uses for all five matmuls. llmcupy's default is
version 2: its trainer runs every GEMM on cuBLAS, and version 4 needs multiples of 128.

Past llm.c (not in its file):

version 5: warp-tiled SIMT SGEMM for any shape. Over version 4 it changes four things:
           - a three-level tiling: the 256-thread block owns a 128 x 128 tile of out, each of its 8
             warps a 64 x 32 warp tile (2 x 4 warps), each lane an 8 x 8 thread tile. A lane's rows
             are lm + 8i (lm = lane % 8) and its columns 4 ln + 16 jj + j (ln = lane / 8), so the 8
             lanes of a quarter-warp (one shared-memory wavefront of 128-bit loads) read 8
             consecutive rows of the inp slab and one row of the weight slab (a broadcast);
           - the C-slab is 16 wide and shared rows are padded to 20 floats: 8 consecutive rows then
             start 20 floats apart, i.e. in 8 different 4-bank groups, so those float4 reads are
             conflict-free (version 4's unpadded 32-float rows rely on a rotated start instead);
           - double buffering: two slabs in shared memory (2 x 2 x 128 x 20 floats = 40 KiB, so two
             blocks per SM on sm_80+ with __launch_bounds__(256, 2), i.e. <= 128 registers per
             thread: the thread keeps its 64 accumulators and the 8 weight float4 in registers and
             streams the inp float4; sm_75's 64 KiB per SM hold one such block, so there the bound
             asks for one and ptxas takes ~170 registers instead of spilling). On sm_80+ the next
             slab is copied global -> shared with cp.async (<cuda_pipeline.h>:
             __pipeline_memcpy_async / commit / wait_prior) while the current one is multiplied,
             without passing through registers; on older devices the next slab is loaded into
             registers before the multiply and stored after it (the loads are in flight during the
             FMAs). One barrier per 16-wide step either way;
           - tails: rows past B*T or OC and columns past C are zero-filled (cp.async's zfill), and
             the epilogue checks every row and column, so any B*T, C, OC works. When C % 4 == 0 and
             inp/weight are 16-byte aligned the slabs move as float4 (16-byte cp.async), else as
             single floats. The bias is added in the epilogue (NULL: none), stored as float4 where
             OC % 4 == 0.
           The grid is (ceil(OC/128), ceil(B*T/128)) with blockIdx.x along OC: neighbouring blocks
           share the inp slab, which stays in L2. Exact FP32 FMA chains, summed in C order per lane.

Op matmul_backward, version 2: matmul_backward_gemm_kernel2 below, version 5 with an accumulating
  epilogue (out += product), for the backward's two GEMMs (see matmul_backward.cu).

Op matmul_forward_tf32 (kernels_cu/matmul_forward_tf32.cu): version 5's tiling on TF32 tensor cores.

Op matmul_gelu_forward (same file: its fused kernel is version 5 with another epilogue):
  version 1: matmul_forward version 5, then gelu_forward version 1 (two launches; pre-activation
             written and read back once more).
  version 2: version 5's GEMM with bias and GELU in the epilogue, writing both the pre-activation
             (the backward's gelu_backward needs it) and the activation: one launch for the MLP's
             up-projection and its GELU.

*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: one thread per output, s x s blocks

__global__ void matmul_forward_kernel1(float* out, const float* inp, const float* weight, const float* bias,
                                       int BT, int C, int OC) {
    int bt = blockIdx.x * blockDim.x + threadIdx.x;
    int oc = blockIdx.y * blockDim.y + threadIdx.y;
    if (bt < BT && oc < OC) {
        float val = (bias != NULL) ? bias[oc] : 0.0f;  // the CPU reference seeds the sum with the bias
        const float* inp_bt = inp + (size_t)bt * C;
        const float* w_oc = weight + (size_t)oc * C;
        for (int i = 0; i < C; i++) {
            val += inp_bt[i] * w_oc[i];
        }
        out[(size_t)bt * OC + oc] = val;
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: the GEMM is cuBLAS (xp.matmul on the Python side); this kernel adds the bias after it

__global__ void matmul_forward_bias_kernel2(float* out, const float* bias, int BT, int OC) {
    size_t n = (size_t)BT * OC;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] += bias[i % OC];  // column of the row-major (BT, OC) output
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: 128 x 128 tiles, 8 x 8 outputs per thread, float4 loads through shared memory

#define MM4_TILE 128   // rows of inp (and of weight) per block tile
#define MM4_CHUNK 32   // width of the C-slab staged in shared memory per iteration

__global__ void __launch_bounds__(16 * 16, 2) matmul_forward_kernel4(float* out, const float* inp,
                                                                     const float* weight, const float* bias,
                                                                     int C, int OC) {
    // 2 x 16 KiB: a 128 x 32 slab of inp and one of weight
    __shared__ float lhs_s[MM4_TILE][MM4_CHUNK];
    __shared__ float rhs_s[MM4_TILE][MM4_CHUNK];

    int tx = threadIdx.x;  // picks 8 rows of the tile
    int ty = threadIdx.y;  // picks 8 output channels of the tile
    int flat = ty * blockDim.x + tx;
    int oc = 8 * (blockIdx.y * blockDim.y + ty);  // first of this thread's 8 output channels

    const float* inp_tile = inp + (size_t)MM4_TILE * blockIdx.x * C;
    const float* w_tile = weight + (size_t)MM4_TILE * blockIdx.y * C;
    float* out_tile = out + (size_t)MM4_TILE * blockIdx.x * OC + (size_t)MM4_TILE * blockIdx.y;

    float vals[8][8];
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 8; j += 4) {
            float4 b = (bias != NULL) ? load128(bias + oc + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            vals[i][j + 0] = b.x;
            vals[i][j + 1] = b.y;
            vals[i][j + 2] = b.z;
            vals[i][j + 3] = b.w;
        }
    }

    // the 8 threads of a row group move one 32-float row as 8 float4; 32 rows per group of 256 threads
    int load_row = flat / 8;
    int load_col = 4 * (flat % 8);
    int si_start = 4 * (tx % 8);

    for (int so = 0; so < C; so += MM4_CHUNK) {
        __syncthreads();  // every thread is done with the previous slab before it is overwritten
        for (int g = 0; g < MM4_TILE; g += 32) {
            int r = g + load_row;
            store128(&lhs_s[r][load_col], load128(inp_tile + (size_t)r * C + so + load_col));
            store128(&rhs_s[r][load_col], load128(w_tile + (size_t)r * C + so + load_col));
        }
        __syncthreads();

        for (int si = si_start; si < si_start + MM4_CHUNK; si += 4) {
            int s = si % MM4_CHUNK;  // rotated start: threads of a warp hit different banks
            float4 rhs[8];
            for (int u = 0; u < 8; u++) {
                rhs[u] = load128(&rhs_s[8 * ty + u][s]);
            }
            for (int ii = 0; ii < 8; ii++) {
                float4 lhs = load128(&lhs_s[8 * tx + ii][s]);
                for (int u = 0; u < 8; u++) {
                    vals[ii][u] += lhs.x * rhs[u].x;
                    vals[ii][u] += lhs.y * rhs[u].y;
                    vals[ii][u] += lhs.z * rhs[u].z;
                    vals[ii][u] += lhs.w * rhs[u].w;
                }
            }
        }
    }

    for (int i = 0; i < 8; i++) {
        float* out_row = out_tile + (size_t)(8 * tx + i) * OC + 8 * ty;
        store128(out_row, make_float4(vals[i][0], vals[i][1], vals[i][2], vals[i][3]));
        store128(out_row + 4, make_float4(vals[i][4], vals[i][5], vals[i][6], vals[i][7]));
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: warp-tiled SIMT SGEMM, double-buffered shared memory filled by cp.async, any shape
//
// Shared by version 5 (epilogue: + bias) and matmul_gelu_forward version 2 (epilogue: + bias,
// then GELU, writing both). See the file header for the tiling and why.

#define MM5_BM 128                 // block tile: rows of inp (B*T)
#define MM5_BN 128                 // block tile: rows of weight (OC)
#define MM5_BK 16                  // block tile: the C-slab staged per step
#define MM5_LD (MM5_BK + 4)        // padded shared row: 20 floats, so 8 consecutive rows of float4 hit 8 distinct bank quads
#define MM5_THREADS 256            // 8 warps: 2 (rows) x 4 (columns) warps of a 64 x 32 warp tile
#define MM5_CHUNKS (MM5_BM * MM5_BK / 4 / MM5_THREADS)  // float4 chunks per thread per slab (2)

// cp.async exists from sm_80 on; older devices stage the next slab through registers instead.
// The emulator defines __CUDA_ARCH__ as 800; -DMM5_ASYNC=0 builds the register-staged path there.
#ifndef MM5_ASYNC
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MM5_ASYNC 1
#else
#define MM5_ASYNC 0
#endif
#endif

// Two resident blocks per SM (<= 128 registers a thread) where two 40 KiB blocks fit: 164 KiB of
// shared memory per SM on sm_80, 228 KiB on sm_90. sm_75 gives an SM 64 KiB, so only one block
// fits whatever the registers; asking for two there would only cap the registers and make
// ptxas spill.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define MM5_MIN_BLOCKS 1
#else
#define MM5_MIN_BLOCKS 2
#endif

#if MM5_ASYNC
#include "async_copy.cuh"   // copy_chunk_async: a slab chunk by cp.async, zero-filled past the edges
#endif

#define MM_EPI_BIAS 0        // out = acc + bias
#define MM_EPI_BIAS_GELU 1   // pre = acc + bias, out = gelu(pre)
#define MM_EPI_ACCUMULATE 2  // out += acc (bias ignored): a GEMM with beta = 1, for the backward

// Chunk c (0..511) of a 128 x 16 slab: row c / 4, columns 4 * (c % 4) .. +3.
// vec: K % 4 == 0 and the matrix 16-byte aligned, so a chunk is a whole float4 or wholly past K.

#if !MM5_ASYNC
__device__ __forceinline__ float4 mm5_fetch(const float* src, int row, int k, int nrows, int K, bool vec) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row >= nrows) return v;
    const float* p = src + (size_t)row * K;
    if (vec) return k < K ? load128(p + k) : v;
    v.x = k < K ? p[k] : 0.0f;
    v.y = k + 1 < K ? p[k + 1] : 0.0f;
    v.z = k + 2 < K ? p[k + 2] : 0.0f;
    v.w = k + 3 < K ? p[k + 3] : 0.0f;
    return v;
}
#endif

template <int EPI>
__device__ __forceinline__ void mm5_gemm(float* out, float* pre, const float* inp, const float* weight,
                                         const float* bias, int M, int K, int N) {
    // 2 stages x (128 + 128) rows x 20 floats = 40 KiB: under the 48 KiB of static shared memory,
    // and two blocks fit an SM's 228 KiB (H100) / 164 KiB (A100) with room to spare (one on a T4)
    __shared__ __align__(16) float As[2][MM5_BM * MM5_LD];
    __shared__ __align__(16) float Bs[2][MM5_BN * MM5_LD];

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int wm = 64 * (warp / 4);        // the warp's first row in the block tile
    const int wn = 32 * (warp % 4);        // the warp's first column in the block tile
    const int lm = lane % 8, ln = lane / 8;
    // thread tile: rows wm + lm + 8i (i < 8), columns wn + 4ln + 16jj + j (jj < 2, j < 4)
    const int m0 = blockIdx.y * MM5_BM, n0 = blockIdx.x * MM5_BN;
    const bool vec = (K % 4 == 0) && ((size_t)inp % 16 == 0) && ((size_t)weight % 16 == 0);

    float acc[8][8];
    for (int i = 0; i < 8; i++)
        for (int u = 0; u < 8; u++) acc[i][u] = 0.0f;

    const int ntiles = CEIL_DIV(K, MM5_BK);

#if MM5_ASYNC
    for (int q = 0; q < MM5_CHUNKS; q++) {
        int c = tid + q * MM5_THREADS, r = c / 4, kc = 4 * (c % 4);
        copy_chunk_async(&As[0][r * MM5_LD + kc], inp, m0 + r, kc, M, K, vec);
        copy_chunk_async(&Bs[0][r * MM5_LD + kc], weight, n0 + r, kc, N, K, vec);
    }
    __pipeline_commit();
#else
    float4 ra[MM5_CHUNKS], rb[MM5_CHUNKS];
    for (int q = 0; q < MM5_CHUNKS; q++) {
        int c = tid + q * MM5_THREADS, r = c / 4, kc = 4 * (c % 4);
        store128(&As[0][r * MM5_LD + kc], mm5_fetch(inp, m0 + r, kc, M, K, vec));
        store128(&Bs[0][r * MM5_LD + kc], mm5_fetch(weight, n0 + r, kc, N, K, vec));
    }
    __syncthreads();
#endif

    for (int t = 0; t < ntiles; t++) {
        const int buf = t & 1;
        const int k_next = (t + 1) * MM5_BK;
#if MM5_ASYNC
        // issue the next slab into the other buffer (read during step t - 1, which every thread
        // finished before the barrier that ended it), then wait for this step's slab only
        if (t + 1 < ntiles) {
            for (int q = 0; q < MM5_CHUNKS; q++) {
                int c = tid + q * MM5_THREADS, r = c / 4, kc = 4 * (c % 4);
                copy_chunk_async(&As[buf ^ 1][r * MM5_LD + kc], inp, m0 + r, k_next + kc, M, K, vec);
                copy_chunk_async(&Bs[buf ^ 1][r * MM5_LD + kc], weight, n0 + r, k_next + kc, N, K, vec);
            }
        }
        __pipeline_commit();        // an empty group on the last step keeps the count uniform
        __pipeline_wait_prior(1);   // everything but the newest group (the next slab) has landed
        __syncthreads();            // ... for every thread's copies, not only this one's
#else
        // the next slab's global loads are in flight while this slab is multiplied
        if (t + 1 < ntiles) {
            for (int q = 0; q < MM5_CHUNKS; q++) {
                int c = tid + q * MM5_THREADS, r = c / 4, kc = 4 * (c % 4);
                ra[q] = mm5_fetch(inp, m0 + r, k_next + kc, M, K, vec);
                rb[q] = mm5_fetch(weight, n0 + r, k_next + kc, N, K, vec);
            }
        }
#endif
        const float* a_s = As[buf];
        const float* b_s = Bs[buf];
        for (int kk = 0; kk < MM5_BK; kk += 4) {
            // 8 + 8 float4 shared loads feed 8 x 8 x 4 = 256 FMAs; b stays in registers, a streams
            float4 b[8];
            for (int jj = 0; jj < 2; jj++)
                for (int j = 0; j < 4; j++) b[4 * jj + j] = load128(&b_s[(wn + 4 * ln + 16 * jj + j) * MM5_LD + kk]);
            for (int i = 0; i < 8; i++) {
                float4 a = load128(&a_s[(wm + lm + 8 * i) * MM5_LD + kk]);
                for (int u = 0; u < 8; u++) {
                    float s = acc[i][u];
                    s = fmaf(a.x, b[u].x, s);
                    s = fmaf(a.y, b[u].y, s);
                    s = fmaf(a.z, b[u].z, s);
                    s = fmaf(a.w, b[u].w, s);
                    acc[i][u] = s;
                }
            }
        }
#if MM5_ASYNC
        __syncthreads();  // every thread is done with buf before step t + 1 copies into it
#else
        if (t + 1 < ntiles) {
            for (int q = 0; q < MM5_CHUNKS; q++) {
                int c = tid + q * MM5_THREADS, r = c / 4, kc = 4 * (c % 4);
                store128(&As[buf ^ 1][r * MM5_LD + kc], ra[q]);
                store128(&Bs[buf ^ 1][r * MM5_LD + kc], rb[q]);
            }
        }
        __syncthreads();  // the stores are visible, and nobody reads buf while step t + 1 writes buf ^ 1
#endif
    }

    // epilogue: bias (and GELU), float4 stores where four columns are in range and aligned
    const bool vec_out = (N % 4 == 0) && ((size_t)out % 16 == 0) && (EPI == MM_EPI_BIAS || (size_t)pre % 16 == 0);
    for (int jj = 0; jj < 2; jj++) {
        const int col = n0 + wn + 4 * ln + 16 * jj;
        float bias_v[4];
        for (int j = 0; j < 4; j++) bias_v[j] = (bias != NULL && col + j < N) ? bias[col + j] : 0.0f;
        for (int i = 0; i < 8; i++) {
            const int row = m0 + wm + lm + 8 * i;
            if (row >= M) continue;
            float bv[4] = {bias_v[0], bias_v[1], bias_v[2], bias_v[3]};
            float v[4], g[4];
            size_t o = (size_t)row * N + col;
            if (EPI == MM_EPI_ACCUMULATE) {
                // each output belongs to exactly one thread: a plain read-modify-write is race-free
                for (int j = 0; j < 4; j++) bv[j] = col + j < N ? out[o + j] : 0.0f;
            }
            for (int j = 0; j < 4; j++) {
                v[j] = acc[i][4 * jj + j] + bv[j];
                g[j] = (EPI == MM_EPI_BIAS_GELU) ? gelu_tanh(v[j]) : v[j];
            }
            if (vec_out && col + 3 < N) {
                if (EPI == MM_EPI_BIAS_GELU) store128(pre + o, make_float4(v[0], v[1], v[2], v[3]));
                store128(out + o, make_float4(g[0], g[1], g[2], g[3]));
            } else {
                for (int j = 0; j < 4 && col + j < N; j++) {
                    if (EPI == MM_EPI_BIAS_GELU) pre[o + j] = v[j];
                    out[o + j] = g[j];
                }
            }
        }
    }
}

// grid (ceil(OC / 128), ceil(B*T / 128)): blockIdx.x walks OC, so consecutive blocks share a
// 128-row slab of inp (the operand every column tile rereads) while it is hot in L2
__global__ void __launch_bounds__(MM5_THREADS, MM5_MIN_BLOCKS)
matmul_forward_kernel5(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC) {
    mm5_gemm<MM_EPI_BIAS>(out, NULL, inp, weight, bias, BT, C, OC);
}

// ----------------------------------------------------------------------------------------------
// op matmul_gelu_forward, version 2: version 5 with GELU in the epilogue (pre = inp @ weight^T + bias,
// out = gelu(pre)); version 1 of that op is kernel5 followed by gelu_forward.cu's kernel

__global__ void __launch_bounds__(MM5_THREADS, MM5_MIN_BLOCKS)
matmul_gelu_forward_kernel2(float* pre, float* out, const float* inp, const float* weight, const float* bias, int BT,
                            int C, int OC) {
    mm5_gemm<MM_EPI_BIAS_GELU>(out, pre, inp, weight, bias, BT, C, OC);
}

// ----------------------------------------------------------------------------------------------
// op matmul_backward, version 2: both GEMMs of the backward on version 5's kernel, accumulating
// (out += inp @ weight^T, beta = 1). The launcher passes transposed copies where an operand is not
// K-contiguous (see matmul_backward.cu's header).

__global__ void __launch_bounds__(MM5_THREADS, MM5_MIN_BLOCKS)
matmul_backward_gemm_kernel2(float* out, const float* inp, const float* weight, int M, int K, int N) {
    mm5_gemm<MM_EPI_ACCUMULATE>(out, NULL, inp, weight, NULL, M, K, N);
}
