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
efficient non-tensor-core" kernel the FP32 trainer uses for all five matmuls.
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
