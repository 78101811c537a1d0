/*
layernorm_backward: the gradients of LayerNorm over (N, C) rows (N = B*T), given dout, the input
and the mean / rstd saved by the forward pass. Per row, with norm = (x - mean) * rstd and
dnorm = weight * dout:
    a = (1/C) sum_i dnorm_i,   b = (1/C) sum_i dnorm_i * norm_i
    dinp_i    += rstd * (dnorm_i - a - norm_i * b)
    dbias_i   += dout_i            (summed over all N rows)
    dweight_i += norm_i * dout_i   (summed over all N rows)
All three outputs accumulate (+=): dinp is the residual-stream gradient, and the trainer sums the
parameter gradients. The cross-row sums of dweight / dbias (C outputs reduced over N rows) are what
the versions differ in.

Versions (same numbers as llm.c's dev/cuda/layernorm_backward.cu):

version 1: naive, one thread per row looping twice over C; dweight / dbias by one global fp32
           atomicAdd per element.
version 2: one warp per row (cooperative groups), grid = ceil(32*N / block). Each block gathers its
           rows' dweight / dbias in 2C floats of shared memory with shared atomics, then adds them
           into zeroed fp32 temporaries with global atomics; a 1-block, 512-thread kernel then
           folds the temporaries into dweight / dbias. llm.c's copy kernel overwrites dweight /
           dbias; here it adds, like every other version. (The fp32 trainer's copy of this kernel
           skips the temporaries and lets the blocks add straight into dweight / dbias: the same
           kernel with the outputs passed as its accumulators.)
version 3: as 2, but a persistent grid of (1024/block) * numSMs blocks whose warps loop over the
           rows (stride = warps in the grid), so there is one global atomic per channel per block
           instead of per row-group; the second pass streams dout and inp (__ldcs).
version 4: bf16 only (a 32-bit compare-and-swap loop on pairs of bf16 values): not built in fp32.
version 5: as 3 with grid = numSMs. Each block writes its 2C partials to its own slice of an fp32
           scratch ([grid][C] for dbias, then [grid][C] for dweight), fences, and bumps a counter
           after the slices; the last block to arrive sums all slices and adds into the outputs.
           The slices are summed in block order, but each was filled by its warps' shared-memory
           atomics, whose order varies run to run: not deterministic either (9 removes them).
version 6: as 3, but every block adds its shared partials into one fp32 scratch (dbias C, dweight
           C, counter) with global atomics; the last block (by the counter) adds the scratch into
           the outputs. llm.c overwrites dweight / dbias here; ours accumulates, and fences
           between the scratch atomics and the counter.
version 7: version 6 without cooperative groups or templates (plain shuffle reductions).
version 8: as 3 with float4 (128-bit) loads and stores, dinp written with an L2-only store hint
           (__stcg), __launch_bounds__(1024, 2 on sm_80 / sm_90+, else 1: 32 registers per thread,
           so ptxas spills there in FP32). Shared partials use a bank-friendly permuted index
           (element x of lane l's float4 in iteration i lives at i*128 + l + 32*x) so the shared
           atomics of a warp hit 32 different banks; the block
           adds them into scratch in the same order; the last block (counter incremented with
           wrap-around, so it returns to zero) un-permutes and adds into the outputs. llm.c's
           second pass runs floor(C/128) iterations and silently skips the tail when C % 128 != 0
           (e.g. C = 1600); here it runs ceil(C/128) with the tail lanes masked and shared memory
           and scratch sized to C rounded up to 128, so any C % 4 == 0 works.
version 9: as 8 without shared atomics: per element, warps 1.. park their dbias / dweight terms in
           per-thread shared slots, a barrier, warp 0 adds them into its permuted partials, a
           barrier. Each block then writes its 2C partials to scratch (counter at float 0, block k
           at float 32 + 2*Cr*k: dbias then dweight), the last block sums the blocks in index order
           (deterministic) with float4 loads into shared memory, un-permutes and adds. llm.c needs
           C % 128 == 0 (assert / trap) and lets warps run different numbers of row iterations
           around its barriers (undefined when N is not a multiple of the warps in the grid); here
           the tail is masked as in 8 and every warp of a block runs the same iterations, a warp
           without a row contributing zeros.
version 10: as 9, but warps exchange whole float4s of partials in shared memory, so the partials
           stay in natural order (no permutation) with one exchange per float4 instead of per
           element; the first pass sums dnorm * x instead of dnorm * norm and converts,
           b = (sum(dnorm * x) / C - a * mean) * rstd. Shared memory and scratch use C rounded up
           to 128 with out-of-range lanes fed zeros. __launch_bounds__(512, 2): the launcher runs
           a requested 1024-thread block as 512. llm.c keeps the last-block flag just past its
           shared allocation at block 32; here it has its own float. Same row-iteration fix as 9.

Fastest per llm.c: each version is presented as an improvement on the one before; 10 is the one
the mainline trainer adopted (block 512). The fp32 trainer uses version 2 with block 512.
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

// Minimum resident 1024-thread blocks per SM for versions 8 and 9 (llm.c's bound): 2 where an SM
// holds 2048 threads. That caps a thread at 32 registers, too few for these FP32 kernels: ptxas
// spills to local memory on sm_80 / sm_90 (NVRTC 12.9 loads 72-76 bytes per thread back in
// version 8, 124-196 in version 9; `--compile-report layernorm_backward`). Version 10 asks for 2
// blocks of 512 instead and keeps 64 registers without spills.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ >= 900)
#define LNB_MIN_BLOCKS_1024 2
#else
#define LNB_MIN_BLOCKS_1024 1
#endif

// Versions 8-10 handle C in iterations of one float4 per lane: 32 * 4 channels.
#define LNB_C_PER_ITER 128

// Version 8 / 9's bank-friendly layout: channel c = i*128 + 4*l + x (float4 element x of lane l
// in iteration i) is kept at slot i*128 + l + 32*x.
__device__ __forceinline__ int lnb_permuted_slot(int c) {
    int i = c / LNB_C_PER_ITER;
    int r = c % LNB_C_PER_ITER;
    return i * LNB_C_PER_ITER + (r / 4) + 32 * (r % 4);
}

// CUDA's atomicInc(p, limit): stores (old >= limit ? 0 : old + 1) and returns old, so a counter
// bumped once by each of limit + 1 blocks is back at 0 afterwards. A CAS loop (same semantics).
__device__ __forceinline__ unsigned int lnb_atomic_inc_wrap(unsigned int* p, unsigned int limit) {
    unsigned int old = *((volatile unsigned int*)p);
    while (true) {
        unsigned int next = old >= limit ? 0u : old + 1u;
        unsigned int seen = atomicCAS(p, old, next);
        if (seen == old) return old;
        old = seen;
    }
}

// ----------------------------------------------------------------------------------------------
// version 1: one thread per row, global atomics for the parameter gradients

__global__ void layernorm_backward_kernel1(float* dinp, float* dweight, float* dbias, const float* dout,
                                           const float* inp, const float* weight, const float* mean,
                                           const float* rstd, int N, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < N) {
        const float* dout_bt = dout + (size_t)row * C;
        const float* inp_bt = inp + (size_t)row * C;
        float* dinp_bt = dinp + (size_t)row * C;
        float mean_bt = mean[row];
        float rstd_bt = rstd[row];

        float dnorm_mean = 0.0f;
        float dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
            float dnorm_i = weight[i] * dout_bt[i];
            dnorm_mean += dnorm_i;
            dnorm_norm_mean += dnorm_i * norm_bti;
        }
        dnorm_mean = dnorm_mean / C;
        dnorm_norm_mean = dnorm_norm_mean / C;

        for (int i = 0; i < C; i++) {
            float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
            float dnorm_i = weight[i] * dout_bt[i];
            atomicAdd(dbias + i, dout_bt[i]);
            atomicAdd(dweight + i, norm_bti * dout_bt[i]);
            float dval = dnorm_i - dnorm_mean - norm_bti * dnorm_norm_mean;
            dinp_bt[i] += dval * rstd_bt;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one warp per row, block partials in shared memory, temporaries + a folding kernel

__global__ void layernorm_backward_kernel2(float* dinp, float* dweight_acc, float* dbias_acc, const float* dout,
                                           const float* inp, const float* weight, const float* mean,
                                           const float* rstd, int N, int C) {
    extern __shared__ float shared[];  // 2C floats: the block's dbias, then dweight partials
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    float* dbias_shared = shared;
    float* dweight_shared = shared + C;

    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dbias_shared[i] = 0.0f;
        dweight_shared[i] = 0.0f;
    }
    __syncthreads();

    if (row < N) {  // warp-uniform; the warp still reaches the barrier below
        const float* dout_bt = dout + (size_t)row * C;
        const float* inp_bt = inp + (size_t)row * C;
        float* dinp_bt = dinp + (size_t)row * C;
        float mean_bt = mean[row];
        float rstd_bt = rstd[row];

        float dnorm_mean = 0.0f;
        float dnorm_norm_mean = 0.0f;
        for (int i = warp.thread_rank(); i < C; i += warp.size()) {
            float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
            float dnorm_i = weight[i] * dout_bt[i];
            dnorm_mean += dnorm_i;
            dnorm_norm_mean += dnorm_i * norm_bti;
        }
        dnorm_mean = cg::reduce(warp, dnorm_mean, cg::plus<float>{}) / C;
        dnorm_norm_mean = cg::reduce(warp, dnorm_norm_mean, cg::plus<float>{}) / C;

        for (int i = warp.thread_rank(); i < C; i += warp.size()) {
            float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
            float dnorm_i = weight[i] * dout_bt[i];
            atomicAdd(dbias_shared + i, dout_bt[i]);  // the block's warps share these slots
            atomicAdd(dweight_shared + i, norm_bti * dout_bt[i]);
            float dval = dnorm_i - dnorm_mean - norm_bti * dnorm_norm_mean;
            dinp_bt[i] += dval * rstd_bt;
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        atomicAdd(dbias_acc + i, dbias_shared[i]);
        atomicAdd(dweight_acc + i, dweight_shared[i]);
    }
}

// one block of 512 threads: adds the fp32 temporaries into the parameter gradients
__global__ void layernorm_backward_copy_kernel2(float* dweight, float* dbias, const float* dweight_acc,
                                                const float* dbias_acc, int C) {
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dweight[i] += dweight_acc[i];
        dbias[i] += dbias_acc[i];
    }
}

// ----------------------------------------------------------------------------------------------
// One warp's share of one row for versions 3, 5 and 6: the two row means with cg::reduce, then
// dinp += and the row's dbias / dweight terms added into the block's shared partials.

__device__ __forceinline__ void lnb_row_cg(const cg::thread_block_tile<32>& warp, float* dinp,
                                           float* dbias_shared, float* dweight_shared, const float* dout,
                                           const float* inp, const float* weight, const float* mean,
                                           const float* rstd, int row, int C) {
    const float* dout_bt = dout + (size_t)row * C;
    const float* inp_bt = inp + (size_t)row * C;
    float* dinp_bt = dinp + (size_t)row * C;
    float mean_bt = mean[row];
    float rstd_bt = rstd[row];

    float dnorm_mean = 0.0f;
    float dnorm_norm_mean = 0.0f;
    for (int i = warp.thread_rank(); i < C; i += warp.size()) {
        float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
        float dnorm_i = weight[i] * dout_bt[i];
        dnorm_mean += dnorm_i;
        dnorm_norm_mean += dnorm_i * norm_bti;
    }
    dnorm_mean = cg::reduce(warp, dnorm_mean, cg::plus<float>{}) / C;
    dnorm_norm_mean = cg::reduce(warp, dnorm_norm_mean, cg::plus<float>{}) / C;

    // last use of this row's dout and inp: evict-first loads
    for (int i = warp.thread_rank(); i < C; i += warp.size()) {
        float dout_i = __ldcs(dout_bt + i);
        float norm_bti = (__ldcs(inp_bt + i) - mean_bt) * rstd_bt;
        float dnorm_i = weight[i] * dout_i;
        atomicAdd(dbias_shared + i, dout_i);
        atomicAdd(dweight_shared + i, norm_bti * dout_i);
        float dval = dnorm_i - dnorm_mean - norm_bti * dnorm_norm_mean;
        dinp_bt[i] += dval * rstd_bt;
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: persistent grid, warps loop over rows, one global atomic per channel per block

__global__ void layernorm_backward_kernel3(float* dinp, float* dweight, float* dbias, const float* dout,
                                           const float* inp, const float* weight, const float* mean,
                                           const float* rstd, int N, int C) {
    extern __shared__ float shared[];  // 2C floats
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int first_row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    int warps_in_grid = gridDim.x * warp.meta_group_size();
    float* dbias_shared = shared;
    float* dweight_shared = shared + C;

    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dbias_shared[i] = 0.0f;
        dweight_shared[i] = 0.0f;
    }
    __syncthreads();

    // no block barrier inside: warps may run different numbers of rows
    for (int row = first_row; row < N; row += warps_in_grid) {
        lnb_row_cg(warp, dinp, dbias_shared, dweight_shared, dout, inp, weight, mean, rstd, row, C);
    }
    __syncthreads();

    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        atomicAdd(dbias + i, dbias_shared[i]);
        atomicAdd(dweight + i, dweight_shared[i]);
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: one block per SM, per-block scratch slices, the last block reduces them

__global__ void layernorm_backward_kernel5(float* dinp, float* dweight, float* dbias, float* scratch,
                                           const float* dout, const float* inp, const float* weight,
                                           const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float shared[];  // 2C floats of partials + 1 for the "last block" flag
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int first_row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    int warps_in_grid = gridDim.x * warp.meta_group_size();
    float* dbias_shared = shared;
    float* dweight_shared = shared + C;
    unsigned int* is_last = (unsigned int*)(shared + 2 * C);

    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dbias_shared[i] = 0.0f;
        dweight_shared[i] = 0.0f;
    }
    __syncthreads();

    for (int row = first_row; row < N; row += warps_in_grid) {
        lnb_row_cg(warp, dinp, dbias_shared, dweight_shared, dout, inp, weight, mean, rstd, row, C);
    }
    __syncthreads();

    // scratch: [gridDim.x][C] dbias slices, [gridDim.x][C] dweight slices, then the counter
    float* scratch_dbias = scratch;
    float* scratch_dweight = scratch + (size_t)gridDim.x * C;
    unsigned int* counter = (unsigned int*)(scratch + (size_t)2 * gridDim.x * C);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        scratch_dbias[(size_t)blockIdx.x * C + i] = dbias_shared[i];
        scratch_dweight[(size_t)blockIdx.x * C + i] = dweight_shared[i];
    }
    __threadfence();  // this thread's slice entries are visible device-wide before the count
    __syncthreads();
    if (threadIdx.x == 0) {
        *is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();

    if (*is_last) {  // block-uniform
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            float db = 0.0f;
            float dw = 0.0f;
            for (int b = 0; b < (int)gridDim.x; b++) {
                db += __ldcg(scratch_dbias + (size_t)b * C + i);  // L2: written by other SMs
                dw += __ldcg(scratch_dweight + (size_t)b * C + i);
            }
            dbias[i] += db;
            dweight[i] += dw;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 6: blocks add their partials into one scratch with atomics, the last block adds it out

__global__ void layernorm_backward_kernel6(float* dinp, float* dweight, float* dbias, float* scratch,
                                           const float* dout, const float* inp, const float* weight,
                                           const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float shared[];  // 2C floats + 1 flag
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int first_row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    int warps_in_grid = gridDim.x * warp.meta_group_size();
    float* dbias_shared = shared;
    float* dweight_shared = shared + C;
    unsigned int* is_last = (unsigned int*)(shared + 2 * C);

    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dbias_shared[i] = 0.0f;
        dweight_shared[i] = 0.0f;
    }
    __syncthreads();

    for (int row = first_row; row < N; row += warps_in_grid) {
        lnb_row_cg(warp, dinp, dbias_shared, dweight_shared, dout, inp, weight, mean, rstd, row, C);
    }
    __syncthreads();

    // scratch: dbias (C), dweight (C), counter; zeroed by the launcher
    float* scratch_dbias = scratch;
    float* scratch_dweight = scratch + C;
    unsigned int* counter = (unsigned int*)(scratch + 2 * C);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        atomicAdd(scratch_dbias + i, dbias_shared[i]);
        atomicAdd(scratch_dweight + i, dweight_shared[i]);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        *is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();

    if (*is_last) {
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            dbias[i] += __ldcg(scratch_dbias + i);  // llm.c overwrites; the trainer accumulates
            dweight[i] += __ldcg(scratch_dweight + i);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 7: version 6 with plain warp shuffles instead of cooperative groups

__global__ void layernorm_backward_kernel7(float* dinp, float* dweight, float* dbias, float* scratch,
                                           const float* dout, const float* inp, const float* weight,
                                           const float* mean, const float* rstd, int N, int C) {
    extern __shared__ float shared[];  // 2C floats + 1 flag
    int warp_id = threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int warps_in_block = blockDim.x / 32;
    int first_row = blockIdx.x * warps_in_block + warp_id;
    int warps_in_grid = gridDim.x * warps_in_block;
    float* dbias_shared = shared;
    float* dweight_shared = shared + C;
    unsigned int* is_last = (unsigned int*)(shared + 2 * C);

    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        dbias_shared[i] = 0.0f;
        dweight_shared[i] = 0.0f;
    }
    __syncthreads();

    for (int row = first_row; row < N; row += warps_in_grid) {
        const float* dout_bt = dout + (size_t)row * C;
        const float* inp_bt = inp + (size_t)row * C;
        float* dinp_bt = dinp + (size_t)row * C;
        float mean_bt = mean[row];
        float rstd_bt = rstd[row];

        float dnorm_mean = 0.0f;
        float dnorm_norm_mean = 0.0f;
        for (int i = lane; i < C; i += 32) {
            float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
            float dnorm_i = weight[i] * dout_bt[i];
            dnorm_mean += dnorm_i;
            dnorm_norm_mean += dnorm_i * norm_bti;
        }
        dnorm_mean = warpReduceSum(dnorm_mean) / C;
        dnorm_norm_mean = warpReduceSum(dnorm_norm_mean) / C;

        for (int i = lane; i < C; i += 32) {
            float dout_i = __ldcs(dout_bt + i);
            float norm_bti = (__ldcs(inp_bt + i) - mean_bt) * rstd_bt;
            float dnorm_i = weight[i] * dout_i;
            atomicAdd(dbias_shared + i, dout_i);
            atomicAdd(dweight_shared + i, norm_bti * dout_i);
            float dval = dnorm_i - dnorm_mean - norm_bti * dnorm_norm_mean;
            dinp_bt[i] += dval * rstd_bt;
        }
    }
    __syncthreads();

    float* scratch_dbias = scratch;
    float* scratch_dweight = scratch + C;
    unsigned int* counter = (unsigned int*)(scratch + 2 * C);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        atomicAdd(scratch_dbias + i, dbias_shared[i]);
        atomicAdd(scratch_dweight + i, dweight_shared[i]);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        *is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();

    if (*is_last) {
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            dbias[i] += __ldcg(scratch_dbias + i);
            dweight[i] += __ldcg(scratch_dweight + i);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 8: float4 accesses, permuted shared partials with shared atomics, wrap-around counter

__global__ void __launch_bounds__(1024, LNB_MIN_BLOCKS_1024)
layernorm_backward_kernel8(float* dinp, float* dweight, float* dbias, float* scratch, const float* dout,
                           const float* inp, const float* weight, const float* mean, const float* rstd,
                           int N, int C) {
    // 2*Cr floats of permuted partials (Cr = C rounded up to 128) + 1 flag
    extern __shared__ float shared[];
    int Cr = CEIL_DIV(C, LNB_C_PER_ITER) * LNB_C_PER_ITER;
    int iterations = Cr / LNB_C_PER_ITER;
    int warp_id = threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int warps_in_block = blockDim.x / 32;
    int first_row = blockIdx.x * warps_in_block + warp_id;
    int warps_in_grid = gridDim.x * warps_in_block;
    float* dbias_shared = shared;
    float* dweight_shared = shared + Cr;
    unsigned int* is_last = (unsigned int*)(shared + 2 * Cr);

    for (int i = threadIdx.x; i < Cr; i += blockDim.x) {
        dbias_shared[i] = 0.0f;
        dweight_shared[i] = 0.0f;
    }
    __syncthreads();

    for (int row = first_row; row < N; row += warps_in_grid) {
        const float* dout_bt = dout + (size_t)row * C;
        const float* inp_bt = inp + (size_t)row * C;
        float* dinp_bt = dinp + (size_t)row * C;
        float mean_bt = mean[row];
        float rstd_bt = rstd[row];

        float dnorm_mean = 0.0f;
        float dnorm_norm_mean = 0.0f;
        for (int c = lane * 4; c < C; c += LNB_C_PER_ITER) {
            float4 d4 = load128(dout_bt + c);
            float4 x4 = load128(inp_bt + c);
            float4 w4 = load128(weight + c);
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                float norm_k = (float4_get(x4, k) - mean_bt) * rstd_bt;
                float dnorm_k = float4_get(w4, k) * float4_get(d4, k);
                dnorm_mean += dnorm_k;
                dnorm_norm_mean += dnorm_k * norm_k;
            }
        }
        dnorm_mean = warpReduceSum(dnorm_mean) / C;
        dnorm_norm_mean = warpReduceSum(dnorm_norm_mean) / C;

        for (int it = 0; it < iterations; it++) {
            int c = it * LNB_C_PER_ITER + lane * 4;
            if (c < C) {  // only the last iteration can have idle lanes (llm.c skipped it)
                float4 d4 = load128cs(dout_bt + c);
                float4 x4 = load128cs(inp_bt + c);
                float4 w4 = load128(weight + c);
                float4 g4 = load128(dinp_bt + c);
                #pragma unroll
                for (int k = 0; k < 4; k++) {
                    float dout_k = float4_get(d4, k);
                    float norm_k = (float4_get(x4, k) - mean_bt) * rstd_bt;
                    float dnorm_k = float4_get(w4, k) * dout_k;
                    int slot = it * LNB_C_PER_ITER + lane + 32 * k;  // a warp's 32 lanes: 32 banks
                    atomicAdd(dbias_shared + slot, dout_k);
                    atomicAdd(dweight_shared + slot, norm_k * dout_k);
                    float dval = (dnorm_k - dnorm_mean - norm_k * dnorm_norm_mean) * rstd_bt;
                    float4_set(g4, k, float4_get(g4, k) + dval);
                }
                __stcg(reinterpret_cast<float4*>(dinp_bt + c), g4);  // keep in L2 for the next kernel
            }
        }
    }
    __syncthreads();

    // scratch: dbias (Cr, permuted), dweight (Cr, permuted), counter
    float* scratch_dbias = scratch;
    float* scratch_dweight = scratch + Cr;
    unsigned int* counter = (unsigned int*)(scratch + 2 * Cr);
    for (int i = threadIdx.x; i < Cr; i += blockDim.x) {
        atomicAdd(scratch_dbias + i, dbias_shared[i]);
        atomicAdd(scratch_dweight + i, dweight_shared[i]);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        *is_last = lnb_atomic_inc_wrap(counter, gridDim.x - 1) == gridDim.x - 1;
    }
    __syncthreads();

    if (*is_last) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            int slot = lnb_permuted_slot(c);
            dbias[c] += __ldcg(scratch_dbias + slot);
            dweight[c] += __ldcg(scratch_dweight + slot);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 9: no shared atomics (warp 0 folds the other warps' terms), per-block scratch slices

__global__ void __launch_bounds__(1024, LNB_MIN_BLOCKS_1024)
layernorm_backward_kernel9(float* dinp, float* dweight, float* dbias, float* scratch, const float* dout,
                           const float* inp, const float* weight, const float* mean, const float* rstd,
                           int N, int C) {
    // 2*Cr floats of permuted partials (only warp 0 touches them), 2*blockDim.x exchange slots,
    // 1 flag
    extern __shared__ float shared[];
    int Cr = CEIL_DIV(C, LNB_C_PER_ITER) * LNB_C_PER_ITER;
    int iterations = Cr / LNB_C_PER_ITER;
    int warp_id = threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int warps_in_block = blockDim.x / 32;
    float* dbias_shared = shared;
    float* dweight_shared = shared + Cr;
    float* dbias_tmp = shared + 2 * Cr;
    float* dweight_tmp = shared + 2 * Cr + blockDim.x;
    unsigned int* is_last = (unsigned int*)(shared + 2 * Cr + 2 * blockDim.x);

    for (int i = threadIdx.x; i < Cr; i += blockDim.x) {
        dbias_shared[i] = 0.0f;
        dweight_shared[i] = 0.0f;
    }
    __syncthreads();

    // The loop bound depends on the block only, so all warps meet the barriers inside it equally
    // often; a warp whose row is past N contributes zeros.
    for (int base = blockIdx.x * warps_in_block; base < N; base += gridDim.x * warps_in_block) {
        int row = base + warp_id;
        bool valid = row < N;  // warp-uniform
        const float* dout_bt = dout + (size_t)row * C;
        const float* inp_bt = inp + (size_t)row * C;
        float* dinp_bt = dinp + (size_t)row * C;
        float mean_bt = 0.0f;
        float rstd_bt = 0.0f;
        float dnorm_mean = 0.0f;
        float dnorm_norm_mean = 0.0f;
        if (valid) {
            mean_bt = mean[row];
            rstd_bt = rstd[row];
            for (int c = lane * 4; c < C; c += LNB_C_PER_ITER) {
                float4 d4 = load128(dout_bt + c);
                float4 x4 = load128(inp_bt + c);
                float4 w4 = load128(weight + c);
                #pragma unroll
                for (int k = 0; k < 4; k++) {
                    float norm_k = (float4_get(x4, k) - mean_bt) * rstd_bt;
                    float dnorm_k = float4_get(w4, k) * float4_get(d4, k);
                    dnorm_mean += dnorm_k;
                    dnorm_norm_mean += dnorm_k * norm_k;
                }
            }
            dnorm_mean = warpReduceSum(dnorm_mean) / C;
            dnorm_norm_mean = warpReduceSum(dnorm_norm_mean) / C;
        }

        for (int it = 0; it < iterations; it++) {
            int c = it * LNB_C_PER_ITER + lane * 4;
            bool live = valid && c < C;
            float4 d4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 x4 = d4, w4 = d4, g4 = d4;
            if (live) {
                d4 = load128cs(dout_bt + c);
                x4 = load128cs(inp_bt + c);
                w4 = load128(weight + c);
                g4 = load128(dinp_bt + c);
            }
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                float dout_k = float4_get(d4, k);  // 0 for dead lanes
                float norm_k = live ? (float4_get(x4, k) - mean_bt) * rstd_bt : 0.0f;
                float dnorm_k = float4_get(w4, k) * dout_k;
                float dval = (dnorm_k - dnorm_mean - norm_k * dnorm_norm_mean) * rstd_bt;
                float4_set(g4, k, float4_get(g4, k) + dval);

                float db = dout_k;
                float dw = norm_k * dout_k;
                if (warp_id != 0) {
                    dbias_tmp[threadIdx.x] = db;
                    dweight_tmp[threadIdx.x] = dw;
                }
                __syncthreads();
                if (warp_id == 0) {
                    for (int j = 1; j < warps_in_block; j++) {
                        db += dbias_tmp[lane + 32 * j];
                        dw += dweight_tmp[lane + 32 * j];
                    }
                    int slot = it * LNB_C_PER_ITER + lane + 32 * k;
                    dbias_shared[slot] += db;
                    dweight_shared[slot] += dw;
                }
                __syncthreads();  // the exchange slots are free again
            }
            if (live) {
                __stcg(reinterpret_cast<float4*>(dinp_bt + c), g4);
            }
        }
    }
    __syncthreads();

    // scratch: counter at float 0, block k's dbias (Cr) then dweight (Cr) at float 32 + 2*Cr*k
    unsigned int* counter = (unsigned int*)scratch;
    float* partials = scratch + 32;  // one 128-byte line in: every slice stays 16-byte aligned
    float* mine = partials + (size_t)2 * Cr * blockIdx.x;
    for (int i = threadIdx.x * 4; i < Cr; i += blockDim.x * 4) {
        store128(mine + i, load128(dbias_shared + i));
        store128(mine + Cr + i, load128(dweight_shared + i));
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        *is_last = lnb_atomic_inc_wrap(counter, gridDim.x - 1) == gridDim.x - 1;
    }
    __syncthreads();

    if (*is_last) {
        // blocks summed in index order: the result does not depend on which block came last
        for (int i = threadIdx.x * 4; i < Cr; i += blockDim.x * 4) {
            float4 db = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 dw = db;
            for (int b = 0; b < (int)gridDim.x; b++) {
                const float* slice = partials + (size_t)2 * Cr * b;
                float4 vb = __ldcg(reinterpret_cast<const float4*>(slice + i));
                float4 vw = __ldcg(reinterpret_cast<const float4*>(slice + Cr + i));
                db.x += vb.x; db.y += vb.y; db.z += vb.z; db.w += vb.w;
                dw.x += vw.x; dw.y += vw.y; dw.z += vw.z; dw.w += vw.w;
            }
            store128(dbias_shared + i, db);
            store128(dweight_shared + i, dw);
        }
        __syncthreads();  // block-uniform branch
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            int slot = lnb_permuted_slot(c);
            dbias[c] += dbias_shared[slot];
            dweight[c] += dweight_shared[slot];
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 10: float4 exchange between warps, natural-order partials, any C % 4 == 0

__global__ void __launch_bounds__(512, 2)
layernorm_backward_kernel10(float* dinp, float* dweight, float* dbias, float* scratch, const float* dout,
                            const float* inp, const float* weight, const float* mean, const float* rstd,
                            int N, int C) {
    // 2*Cr floats of partials (natural order, owned by warp 0), 2 * 4 * (blockDim.x - 32) floats
    // of float4 exchange slots for warps 1.., 1 flag
    extern __shared__ float shared[];
    int Cr = CEIL_DIV(C, LNB_C_PER_ITER) * LNB_C_PER_ITER;
    int iterations = Cr / LNB_C_PER_ITER;
    int warp_id = threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int warps_in_block = blockDim.x / 32;
    int exchange = 4 * (blockDim.x - 32);
    float* dbias_shared = shared;
    float* dweight_shared = shared + Cr;
    float* dbias_tmp = shared + 2 * Cr;  // thread t >= 32 owns floats [4(t-32), 4(t-32)+4)
    float* dweight_tmp = shared + 2 * Cr + exchange;
    unsigned int* is_last = (unsigned int*)(shared + 2 * Cr + 2 * exchange);

    for (int i = threadIdx.x * 4; i < Cr; i += blockDim.x * 4) {
        store128(dbias_shared + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        store128(dweight_shared + i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
    __syncthreads();

    for (int base = blockIdx.x * warps_in_block; base < N; base += gridDim.x * warps_in_block) {
        int row = base + warp_id;
        bool valid = row < N;
        const float* dout_bt = dout + (size_t)row * C;
        const float* inp_bt = inp + (size_t)row * C;
        float* dinp_bt = dinp + (size_t)row * C;
        float mean_bt = 0.0f;
        float rstd_bt = 0.0f;
        float dnorm_mean = 0.0f;
        float dnorm_norm_mean = 0.0f;
        if (valid) {
            mean_bt = mean[row];
            rstd_bt = rstd[row];
            float dnorm_x = 0.0f;  // sum of dnorm * x: no normalisation in the first pass
            for (int c = lane * 4; c < C; c += LNB_C_PER_ITER) {
                float4 d4 = load128(dout_bt + c);
                float4 x4 = load128(inp_bt + c);
                float4 w4 = load128(weight + c);
                #pragma unroll
                for (int k = 0; k < 4; k++) {
                    float dnorm_k = float4_get(w4, k) * float4_get(d4, k);
                    dnorm_mean += dnorm_k;
                    dnorm_x += dnorm_k * float4_get(x4, k);
                }
            }
            dnorm_mean = warpReduceSum(dnorm_mean) / C;
            // mean(dnorm * norm) = (mean(dnorm * x) - mean(dnorm) * mean) * rstd
            dnorm_norm_mean = (warpReduceSum(dnorm_x) / C - dnorm_mean * mean_bt) * rstd_bt;
        }

        for (int it = 0; it < iterations; it++) {
            int c = it * LNB_C_PER_ITER + lane * 4;  // < Cr always
            bool live = valid && c < C;
            float4 d4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 x4 = d4, w4 = d4, g4 = d4;
            if (live) {
                d4 = load128cs(dout_bt + c);
                x4 = load128cs(inp_bt + c);
                w4 = load128(weight + c);
                g4 = load128(dinp_bt + c);
            }
            float4 db4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 dw4 = db4;
            #pragma unroll
            for (int k = 0; k < 4; k++) {
                float dout_k = float4_get(d4, k);
                float norm_k = live ? (float4_get(x4, k) - mean_bt) * rstd_bt : 0.0f;
                float dnorm_k = float4_get(w4, k) * dout_k;
                float dval = (dnorm_k - dnorm_mean - norm_k * dnorm_norm_mean) * rstd_bt;
                float4_set(g4, k, float4_get(g4, k) + dval);
                float4_set(db4, k, dout_k);
                float4_set(dw4, k, norm_k * dout_k);
            }

            if (warp_id != 0) {
                store128(dbias_tmp + 4 * (threadIdx.x - 32), db4);
                store128(dweight_tmp + 4 * (threadIdx.x - 32), dw4);
            }
            __syncthreads();
            if (warp_id == 0) {
                for (int j = 1; j < warps_in_block; j++) {
                    float4 vb = load128(dbias_tmp + 4 * (lane + 32 * (j - 1)));
                    float4 vw = load128(dweight_tmp + 4 * (lane + 32 * (j - 1)));
                    db4.x += vb.x; db4.y += vb.y; db4.z += vb.z; db4.w += vb.w;
                    dw4.x += vw.x; dw4.y += vw.y; dw4.z += vw.z; dw4.w += vw.w;
                }
                float4 ob = load128(dbias_shared + c);
                float4 ow = load128(dweight_shared + c);
                ob.x += db4.x; ob.y += db4.y; ob.z += db4.z; ob.w += db4.w;
                ow.x += dw4.x; ow.y += dw4.y; ow.z += dw4.z; ow.w += dw4.w;
                store128(dbias_shared + c, ob);
                store128(dweight_shared + c, ow);
            }
            __syncthreads();
            if (live) {
                __stcg(reinterpret_cast<float4*>(dinp_bt + c), g4);
            }
        }
    }
    __syncthreads();

    // scratch layout as in version 9, partials in natural order
    unsigned int* counter = (unsigned int*)scratch;
    float* partials = scratch + 32;
    float* mine = partials + (size_t)2 * Cr * blockIdx.x;
    for (int i = threadIdx.x * 4; i < Cr; i += blockDim.x * 4) {
        store128(mine + i, load128(dbias_shared + i));
        store128(mine + Cr + i, load128(dweight_shared + i));
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        *is_last = lnb_atomic_inc_wrap(counter, gridDim.x - 1) == gridDim.x - 1;
    }
    __syncthreads();

    if (*is_last) {
        for (int i = threadIdx.x * 4; i < Cr; i += blockDim.x * 4) {
            float4 db = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 dw = db;
            for (int b = 0; b < (int)gridDim.x; b++) {
                const float* slice = partials + (size_t)2 * Cr * b;
                float4 vb = __ldcg(reinterpret_cast<const float4*>(slice + i));
                float4 vw = __ldcg(reinterpret_cast<const float4*>(slice + Cr + i));
                db.x += vb.x; db.y += vb.y; db.z += vb.z; db.w += vb.w;
                dw.x += vw.x; dw.y += vw.y; dw.z += vw.z; dw.w += vw.w;
            }
            store128(dbias_shared + i, db);
            store128(dweight_shared + i, dw);
        }
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            dbias[c] += dbias_shared[c];
            dweight[c] += dweight_shared[c];
        }
    }
}
