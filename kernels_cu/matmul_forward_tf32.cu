/*
matmul_forward_tf32: the dense layer out = inp @ weight^T + bias (as matmul_forward) on TF32 tensor
cores. Its own op (and file) because TF32 keeps 10 mantissa bits of every input, so its results
need a tolerance sized for that (see llmcupy/ops/matmul_forward_tf32.py) rather than the exact-FP32
one of matmul_forward's versions, and because <mma.h> needs sm_80+ and crt/mma.h (which ships with
nvcc, not with the runtime headers), which should not hold back matmul_forward.cu.

version 1: matmul_forward version 5's block tile (128 x 128, 256 threads, 8 warps of 64 x 32), its
           16-wide slabs in padded shared rows and its cp.async double buffering, with the multiply
           on tensor cores through nvcuda::wmma: each warp's 64 x 32 tile is 4 x 2 m16n16k8 TF32
           fragments of FP32 accumulators; per 8-wide k step it loads 4 A fragments (row-major
           from the inp slab) and 2 B fragments (column-major from the weight slab: B = weight^T),
           rounds every element to TF32 (wmma::__float_to_tf32, round to nearest; the tensor core
           would otherwise just drop the low 13 bits) and issues 8 mma_sync. The padded 20-float
           rows keep fragment pointers 32-byte aligned (16 rows = 1280 bytes, 8 columns = 32
           bytes) and ldm a multiple of 4 floats. Epilogue: a fragment's element-to-lane mapping
           is opaque, so each goes through a per-warp 16 x 16 shared staging tile, then the lanes
           add the bias and store with bounds checks, 16 consecutive columns per half-warp row.
           Shared memory: 40 KiB of slabs + 8 KiB of staging = exactly the 48 KiB of static shared
           memory. Any shape: rows and columns past the edges are zero-filled by cp.async
           (float4 copies when C % 4 == 0 and the operands are 16-byte aligned, else single
           floats) and masked in the epilogue. Compiled for every target; below sm_80 the body is
           a trap, and the launcher refuses such devices with that reason.
           Next rungs: a larger warp tile (more fragments per A/B load), 3-4 pipeline stages in
           dynamic shared memory, storing the accumulators without the staging round trip.
*/

#include "common.cuh"

#include "async_copy.cuh"   // copy_chunk_async, as matmul_forward version 5 stages its slabs

#include <mma.h>

#define TF_BM 128                  // block tile: rows of inp (B*T)
#define TF_BN 128                  // block tile: rows of weight (OC)
#define TF_BK 16                   // the C-slab staged per step (two m16n16k8 k-steps)
#define TF_LD (TF_BK + 4)          // padded shared row (floats), see the header
#define TF_THREADS 256
#define TF_CHUNKS (TF_BM * TF_BK / 4 / TF_THREADS)  // float4 chunks per thread per slab (2)

// ----------------------------------------------------------------------------------------------
// version 1: wmma m16n16k8 TF32, FP32 accumulators, cp.async double-buffered slabs

__global__ void __launch_bounds__(TF_THREADS) matmul_forward_tf32_kernel1(float* out, const float* inp,
                                                                           const float* weight, const float* bias,
                                                                           int BT, int C, int OC) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // TF32 wmma needs sm_80; the launcher refuses older devices before getting here
#else
    using namespace nvcuda;
    // the slabs as version 5 (40 KiB) plus a 16 x 16 staging tile per warp for the epilogue (8 KiB):
    // exactly the 48 KiB of static shared memory. Fragment pointers must be 32-byte aligned: rows
    // start 16 * 20 floats = 1280 bytes apart and columns 8 floats apart, both multiples of 32.
    __shared__ __align__(128) float As[2][TF_BM * TF_LD];
    __shared__ __align__(128) float Bs[2][TF_BN * TF_LD];
    __shared__ __align__(128) float stage[TF_THREADS / 32][16 * 16];

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int wm = 64 * (warp / 4), wn = 32 * (warp % 4);  // a 64 x 32 warp tile: 4 x 2 fragments
    const int m0 = blockIdx.y * TF_BM, n0 = blockIdx.x * TF_BN;
    const bool vec = (C % 4 == 0) && ((size_t)inp % 16 == 0) && ((size_t)weight % 16 == 0);

    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[4][2];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int q = 0; q < TF_CHUNKS; q++) {
        int c = tid + q * TF_THREADS, r = c / 4, kc = 4 * (c % 4);
        copy_chunk_async(&As[0][r * TF_LD + kc], inp, m0 + r, kc, BT, C, vec);
        copy_chunk_async(&Bs[0][r * TF_LD + kc], weight, n0 + r, kc, OC, C, vec);
    }
    __pipeline_commit();

    const int ntiles = CEIL_DIV(C, TF_BK);
    for (int t = 0; t < ntiles; t++) {
        const int buf = t & 1;
        if (t + 1 < ntiles) {
            const int k_next = (t + 1) * TF_BK;
            for (int q = 0; q < TF_CHUNKS; q++) {
                int c = tid + q * TF_THREADS, r = c / 4, kc = 4 * (c % 4);
                copy_chunk_async(&As[buf ^ 1][r * TF_LD + kc], inp, m0 + r, k_next + kc, BT, C, vec);
                copy_chunk_async(&Bs[buf ^ 1][r * TF_LD + kc], weight, n0 + r, k_next + kc, OC, C, vec);
            }
        }
        __pipeline_commit();
        __pipeline_wait_prior(1);
        __syncthreads();
        for (int kk = 0; kk < TF_BK; kk += 8) {
            // A (16 x 8) is row-major in As; B (8 x 16) = weight^T is weight's rows read column-major
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b[2];
            for (int i = 0; i < 4; i++) {
                wmma::load_matrix_sync(a[i], &As[buf][(wm + 16 * i) * TF_LD + kk], TF_LD);
                for (int e = 0; e < a[i].num_elements; e++) a[i].x[e] = wmma::__float_to_tf32(a[i].x[e]);
            }
            for (int j = 0; j < 2; j++) {
                wmma::load_matrix_sync(b[j], &Bs[buf][(wn + 16 * j) * TF_LD + kk], TF_LD);
                for (int e = 0; e < b[j].num_elements; e++) b[j].x[e] = wmma::__float_to_tf32(b[j].x[e]);
            }
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();  // every warp is done with buf before step t + 1 copies into it
    }

    // epilogue: a fragment's element-to-lane mapping is opaque, so each goes through the warp's
    // staging tile; then the lanes add the bias and store what lies inside out, 16 columns per
    // half-warp row (coalesced 64-byte segments)
    float* st = stage[warp];
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 2; j++) {
            wmma::store_matrix_sync(st, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int row = m0 + wm + 16 * i + e / 16, col = n0 + wn + 16 * j + e % 16;
                if (row < BT && col < OC) out[(size_t)row * OC + col] = st[e] + (bias != NULL ? bias[col] : 0.0f);
            }
            __syncwarp();  // the tile is read before the next fragment overwrites it
        }
    }
#endif
}
