/*
global_norm: the SQUARED L2 norm of one large flat FP32 array, out[0] = sum_i data[i]^2 (used for
gradient clipping over all parameter gradients concatenated). Despite the name no square root is
taken: the caller takes it. Every thread accumulates x^2 in FP32 over a grid-stride loop
i = tid, tid + gridWidth, ...; the versions differ in how the per-thread sums are combined.

The launcher sizes the grid to fill the GPU exactly once, grid = maxThreadsPerSM * numSMs / block
(floor division: one block too many would run as a lone extra wave), read from the device on a
GPU and a fixed figure in the emulator, and never more blocks than the data needs.

Versions (same numbers as llm.c's dev/cuda/global_norm.cu, whose header describes none of them):

version 1: block reduce + one atomic per block: cooperative-groups warp reduce(plus), each warp's
           sum into a 32-float shared array, a barrier, warp 0 reduces the partials and its lane 0
           does one atomicAdd into out[0]. Fewest atomics; not deterministic.
version 2: warp reduce + one atomic per warp: cg::reduce(plus) only, no shared memory; lane 0 of
           every warp does the atomicAdd (about 6.9 K atomics on an A100). Not deterministic.
version 3: v1 written with the common block-reduction helper (xor-shuffle warp sum, 32-float
           shared array, a second xor-shuffle sum in every warp); thread 0 does the atomicAdd.
           Not deterministic.
version 4: deterministic, two kernels, no atomics: block b writes its sum (the v3 reduction) to
           partials[b]; then one block of 1024 threads sums the partials with the same block
           reduction and writes out[0]. Bit-reproducible run to run; about as fast as v3.
           llm.c writes the partials into out itself (which must then hold >= 1024 floats),
           promotes blocks <= 64 to 128 threads and asserts grid < 1024, which fails on big GPUs
           (1728 blocks of 128 on a 108-SM A100, 2112 on a 132-SM H100/H200, 1056 blocks of 256
           on the 132-SM parts). Here the launcher keeps the promotion but caps the grid at 1024
           blocks whatever the SM count (the grid-stride loop covers the rest), the partials live
           in their own scratch buffer, and the aggregation kernel loops over its inputs, so out
           is a single float and no SM count can break it.

Versions 1-3 only accumulate into out[0]: their launcher zeroes it before every launch, with
global_norm_zero_kernel (a kernel rather than a host-side fill, so a launch plan records it with the
accumulation and a replay or a captured graph zeroes out[0] too).
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

// Every thread's share of the sum of squares, over a grid-stride loop (64-bit indices).
__device__ __forceinline__ float global_norm_thread_sum(const float* data, size_t count) {
    float acc = 0.0f;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        float x = data[i];
        acc += x * x;
    }
    return acc;
}

// The common block-reduction helper: the block's total in every thread. Called once per kernel
// here, so its shared array is never reused without a barrier. blockDim.x a multiple of 32.
__device__ float global_norm_block_reduce_sum(float val) {
    __shared__ float warp_sums[32];
    int lane = threadIdx.x % 32;
    int warp_id = threadIdx.x / 32;
    int num_warps = blockDim.x / 32;
    float warp_sum = warpReduceSum(val);
    if (lane == 0) warp_sums[warp_id] = warp_sum;
    __syncthreads();
    float partial = lane < num_warps ? warp_sums[lane] : 0.0f;  // slots past the last warp are poison
    return warpReduceSum(partial);
}

// Versions 1-3 only add into out[0]: one thread clears it first (llm.c's harness memsets it).
__global__ void global_norm_zero_kernel(float* out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = 0.0f;
}

// ----------------------------------------------------------------------------------------------
// version 1: cg warp reduce, shared partials, warp 0 reduces them, one atomic per block

__global__ void global_norm_kernel1(float* out, const float* data, long count) {
    __shared__ float block_partials[32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);

    float sum = global_norm_thread_sum(data, (size_t)count);
    float warp_sum = cg::reduce(warp, sum, cg::plus<float>());
    if (warp.thread_rank() == 0) block_partials[warp.meta_group_rank()] = warp_sum;
    __syncthreads();
    if (warp.meta_group_rank() == 0) {  // the whole of warp 0 takes part in the reduce below
        float partial = warp.thread_rank() < warp.meta_group_size() ? block_partials[warp.thread_rank()] : 0.0f;
        float block_sum = cg::reduce(warp, partial, cg::plus<float>());
        if (warp.thread_rank() == 0) atomicAdd(out, block_sum);
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: cg warp reduce, one atomic per warp

__global__ void global_norm_kernel2(float* out, const float* data, long count) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);

    float sum = global_norm_thread_sum(data, (size_t)count);
    float warp_sum = cg::reduce(warp, sum, cg::plus<float>());
    if (warp.thread_rank() == 0) atomicAdd(out, warp_sum);
}

// ----------------------------------------------------------------------------------------------
// version 3: the common block-reduction helper, one atomic per block

__global__ void global_norm_kernel3(float* out, const float* data, long count) {
    float sum = global_norm_thread_sum(data, (size_t)count);
    float block_sum = global_norm_block_reduce_sum(sum);
    if (threadIdx.x == 0) atomicAdd(out, block_sum);
}

// ----------------------------------------------------------------------------------------------
// version 4: deterministic: per-block partials, then one block aggregates them

__global__ void global_norm_kernel4(float* partials, const float* data, long count) {
    float sum = global_norm_thread_sum(data, (size_t)count);
    float block_sum = global_norm_block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

// One block: sums partials[0 .. num_partials) in a fixed order, so the result is reproducible.
// The stride loop makes any number of partials legal (the launcher keeps it <= 1024 anyway).
__global__ void global_norm_aggregate_kernel(float* out, const float* partials, int num_partials) {
    float sum = 0.0f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) {
        sum += partials[i];
    }
    float total = global_norm_block_reduce_sum(sum);
    if (threadIdx.x == 0) out[0] = total;
}
