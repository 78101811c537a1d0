/*
trimat_forward: the causal attention scores, out[b, h, t, t2] = scale * <q[b,h,t], k[b,h,t2]>
for t2 <= t, scale = 1/sqrt(HS), read straight from the packed QKV input (B, T, 3C) =
(B, T, 3, NH, HS). out is (B, NH, T, T); entries above the diagonal are "don't care". The point
of the file: only the lower triangle is needed, so a hand-written kernel can do half the FLOPs
of cuBLAS's full T x T product.

Versions (same numbers as llm.c's dev/cuda/trimat_forward.cu):

version 0: the cuBLAS baseline, no kernel in this file: the attention permute kernel
           (kernels_cu/permute.cu) into a (3, B, NH, T, HS) scratch, then one strided-batched GEMM
           out = scale * q k^T over the FULL T x T (llmcupy.runtime.blas, k read transposed in
           place), the scale folded into the GEMM's alpha as llm.c does. FP32 unless TF32 is on.

Versions 1-4 share one launch: grid (T/128, T/128, B*NH), blocks of 16x16 = 256 threads
(__launch_bounds__(256, 2)). Block (x, y) owns the 128x128 tile of query rows 128x.. and key
columns 128y..; blocks with y > x lie entirely above the diagonal and leave at once. Thread
(tx, ty) owns the 8x8 sub-tile of rows 128x + 8tx + [0, 8) and columns 128y + 8ty + [0, 8). Q and
K rows are read from the packed input with stride 3C; the scale is applied at the store. Sub-tiles
on the diagonal are computed in full (a "jagged" diagonal: some entries above it get real values);
sub-tiles and tiles wholly above it are not written. All need T % 128 == 0.

version 1: naive: each thread computes its 64 outputs one after the other, each an HS-long dot
           product re-reading q and k from global memory; sub-tiles above the diagonal skip.
version 2: register blocking: one sweep over HS; per step 8 q and 8 k values go to registers and
           their 8x8 outer product is accumulated in 64 registers.
version 3: as 2 with float4 loads along HS: 8 k float4 in registers, one q float4 per row, 4 FMAs
           per (row, column) pair; results stored as float4. Needs HS % 4 == 0. (64 accumulators +
           8 float4 of k live at once: NVRTC reports 8-16 bytes of spills under the 128-register
           cap that __launch_bounds__(256, 2) sets.)
version 4: shared-memory tiling: per 32-wide slice of HS, all 256 threads stage the 128x32 slices
           of Q and K in static shared memory (2 x 16 KiB), each warp reading 32 consecutive floats
           of one row (coalesced); then each thread does 32 8x8 outer products from shared memory,
           with the dim index rotated per thread, (si + tx) % 32, to spread a warp's reads over
           the banks. Threads above the diagonal still help load and only skip the store. Needs
           HS % 32 == 0.

Speeds per llm.c's comments: 1 = 20 ms, 2 = 3.5 ms, 3 = 1.7 ms (a little behind cuBLAS), 4 = no
number, the one meant to beat cuBLAS. Version 4 sums each slice in a rotated order, so its last
bits differ from versions 1-3.
*/

#include "common.cuh"

#define TRIMAT_TILE 128  // rows (and columns) per block
#define TRIMAT_SUB 8     // rows (and columns) per thread

// ----------------------------------------------------------------------------------------------
// version 1: one dot product per output

__global__ __launch_bounds__(256, 2) void trimat_forward_kernel1(float* out, const float* inp, int T, int C,
                                                                  int NH, float scale) {
    if (blockIdx.y > blockIdx.x) return;  // the whole tile is above the diagonal (block-uniform)
    int i_base = TRIMAT_TILE * blockIdx.x + TRIMAT_SUB * threadIdx.x;  // query rows
    int j_base = TRIMAT_TILE * blockIdx.y + TRIMAT_SUB * threadIdx.y;  // key columns
    if (j_base > i_base) return;  // sub-tile above the diagonal; v1 has no barrier to miss
    int bh = blockIdx.z;
    int b = bh / NH;
    int h = bh % NH;
    int HS = C / NH;
    const float* q = inp + (size_t)b * T * 3 * C + h * HS;  // row t at q + t * 3C
    const float* k = q + C;
    float* o = out + (size_t)bh * T * T;
    for (int io = 0; io < TRIMAT_SUB; io++) {
        for (int jo = 0; jo < TRIMAT_SUB; jo++) {
            int i = i_base + io;
            int j = j_base + jo;
            float val = 0.0f;
            for (int s = 0; s < HS; s++) {
                val += q[(size_t)i * 3 * C + s] * k[(size_t)j * 3 * C + s];
            }
            o[(size_t)i * T + j] = val * scale;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: 8x8 register blocking

__global__ __launch_bounds__(256, 2) void trimat_forward_kernel2(float* out, const float* inp, int T, int C,
                                                                  int NH, float scale) {
    if (blockIdx.y > blockIdx.x) return;
    int i_base = TRIMAT_TILE * blockIdx.x + TRIMAT_SUB * threadIdx.x;
    int j_base = TRIMAT_TILE * blockIdx.y + TRIMAT_SUB * threadIdx.y;
    if (j_base > i_base) return;
    int bh = blockIdx.z;
    int b = bh / NH;
    int h = bh % NH;
    int HS = C / NH;
    const float* q = inp + (size_t)b * T * 3 * C + h * HS + (size_t)i_base * 3 * C;
    const float* k = inp + (size_t)b * T * 3 * C + C + h * HS + (size_t)j_base * 3 * C;
    float* o = out + (size_t)bh * T * T;

    float acc[TRIMAT_SUB][TRIMAT_SUB];
    for (int io = 0; io < TRIMAT_SUB; io++)
        for (int jo = 0; jo < TRIMAT_SUB; jo++) acc[io][jo] = 0.0f;

    for (int s = 0; s < HS; s++) {
        float qv[TRIMAT_SUB], kv[TRIMAT_SUB];
        for (int u = 0; u < TRIMAT_SUB; u++) {
            qv[u] = q[(size_t)u * 3 * C + s];
            kv[u] = k[(size_t)u * 3 * C + s];
        }
        for (int io = 0; io < TRIMAT_SUB; io++)
            for (int jo = 0; jo < TRIMAT_SUB; jo++) acc[io][jo] += qv[io] * kv[jo];
    }
    for (int io = 0; io < TRIMAT_SUB; io++)
        for (int jo = 0; jo < TRIMAT_SUB; jo++) o[(size_t)(i_base + io) * T + j_base + jo] = acc[io][jo] * scale;
}

// ----------------------------------------------------------------------------------------------
// version 3: register blocking with float4 loads along HS and float4 stores

__global__ __launch_bounds__(256, 2) void trimat_forward_kernel3(float* out, const float* inp, int T, int C,
                                                                  int NH, float scale) {
    if (blockIdx.y > blockIdx.x) return;
    int i_base = TRIMAT_TILE * blockIdx.x + TRIMAT_SUB * threadIdx.x;
    int j_base = TRIMAT_TILE * blockIdx.y + TRIMAT_SUB * threadIdx.y;
    if (j_base > i_base) return;
    int bh = blockIdx.z;
    int b = bh / NH;
    int h = bh % NH;
    int HS = C / NH;
    // HS % 4 == 0 makes C and 3C multiples of 4: every row start is 16-byte aligned
    const float* q = inp + (size_t)b * T * 3 * C + h * HS + (size_t)i_base * 3 * C;
    const float* k = inp + (size_t)b * T * 3 * C + C + h * HS + (size_t)j_base * 3 * C;
    float* o = out + (size_t)bh * T * T;

    float acc[TRIMAT_SUB][TRIMAT_SUB];
    for (int io = 0; io < TRIMAT_SUB; io++)
        for (int jo = 0; jo < TRIMAT_SUB; jo++) acc[io][jo] = 0.0f;

    for (int s = 0; s < HS; s += 4) {
        float4 kv[TRIMAT_SUB];
        for (int u = 0; u < TRIMAT_SUB; u++) kv[u] = load128(k + (size_t)u * 3 * C + s);
        for (int io = 0; io < TRIMAT_SUB; io++) {
            float4 qv = load128(q + (size_t)io * 3 * C + s);
            for (int jo = 0; jo < TRIMAT_SUB; jo++) {
                acc[io][jo] += qv.x * kv[jo].x;
                acc[io][jo] += qv.y * kv[jo].y;
                acc[io][jo] += qv.z * kv[jo].z;
                acc[io][jo] += qv.w * kv[jo].w;
            }
        }
    }
    // T % 128 == 0 and j_base % 8 == 0: both float4 stores of a row are aligned
    for (int io = 0; io < TRIMAT_SUB; io++) {
        float* orow = o + (size_t)(i_base + io) * T + j_base;
        store128(orow, make_float4(acc[io][0] * scale, acc[io][1] * scale, acc[io][2] * scale, acc[io][3] * scale));
        store128(orow + 4, make_float4(acc[io][4] * scale, acc[io][5] * scale, acc[io][6] * scale, acc[io][7] * scale));
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: 128x32 slices of Q and K staged in shared memory

__global__ __launch_bounds__(256, 2) void trimat_forward_kernel4(float* out, const float* inp, int T, int C,
                                                                  int NH, float scale) {
    __shared__ float lhs_s[TRIMAT_TILE][32];  // Q rows 128x.. , dims so..so+31
    __shared__ float rhs_s[TRIMAT_TILE][32];  // K rows 128y.. , same dims
    if (blockIdx.y > blockIdx.x) return;  // the whole block leaves before any barrier
    int tx = threadIdx.x;
    int ty = threadIdx.y;
    int i_base = TRIMAT_TILE * blockIdx.x + TRIMAT_SUB * tx;
    int j_base = TRIMAT_TILE * blockIdx.y + TRIMAT_SUB * ty;
    int bh = blockIdx.z;
    int b = bh / NH;
    int h = bh % NH;
    int HS = C / NH;
    const float* q = inp + (size_t)b * T * 3 * C + h * HS + (size_t)TRIMAT_TILE * blockIdx.x * 3 * C;
    const float* k = inp + (size_t)b * T * 3 * C + C + h * HS + (size_t)TRIMAT_TILE * blockIdx.y * 3 * C;
    float* o = out + (size_t)bh * T * T;
    int tid = ty * blockDim.x + tx;
    int warp = tid / 32;
    int lane = tid % 32;
    int nwarps = (blockDim.x * blockDim.y) / 32;

    float acc[TRIMAT_SUB][TRIMAT_SUB];
    for (int io = 0; io < TRIMAT_SUB; io++)
        for (int jo = 0; jo < TRIMAT_SUB; jo++) acc[io][jo] = 0.0f;

    for (int so = 0; so < HS; so += 32) {
        __syncthreads();  // the previous slice is no longer being read
        for (int r = warp; r < TRIMAT_TILE; r += nwarps) {
            lhs_s[r][lane] = q[(size_t)r * 3 * C + so + lane];  // 32 consecutive floats per warp
            rhs_s[r][lane] = k[(size_t)r * 3 * C + so + lane];
        }
        __syncthreads();
        for (int si = 0; si < 32; si++) {
            int s = (si + tx) % 32;  // rotated per thread: neighbouring tx hit different banks
            float qv[TRIMAT_SUB], kv[TRIMAT_SUB];
            for (int u = 0; u < TRIMAT_SUB; u++) {
                qv[u] = lhs_s[TRIMAT_SUB * tx + u][s];
                kv[u] = rhs_s[TRIMAT_SUB * ty + u][s];
            }
            for (int io = 0; io < TRIMAT_SUB; io++)
                for (int jo = 0; jo < TRIMAT_SUB; jo++) acc[io][jo] += qv[io] * kv[jo];
        }
    }
    if (j_base <= i_base) {  // above-diagonal sub-tiles helped load; they do not store
        for (int io = 0; io < TRIMAT_SUB; io++) {
            float* orow = o + (size_t)(i_base + io) * T + j_base;
            store128(orow, make_float4(acc[io][0] * scale, acc[io][1] * scale, acc[io][2] * scale, acc[io][3] * scale));
            store128(orow + 4, make_float4(acc[io][4] * scale, acc[io][5] * scale, acc[io][6] * scale, acc[io][7] * scale));
        }
    }
}
