/*
softmax_forward: row-wise softmax of an (N, C) FP32 matrix, out[i, j] = exp(x[i, j] - max_i) / sum_i.
In GPT-2 this is the probability over the vocabulary: N = B*T rows of C = V = 50257.

Versions (same numbers as llm.c's dev/cuda/softmax_forward.cu):

version 1: naive port of the CPU loop, one thread per row: a max pass, an exp + sum pass (double
           accumulator), a divide pass. Neighbouring threads are C floats apart: nothing coalesces.
version 2: one block per row; block-stride loops and a halving tree in shared memory, once for the
           max and once for the sum (which re-reads the exponentials from `out`). Block size must
           be a power of two.
version 3: one warp per row (the launcher always uses blocks of 32 threads): max by a shuffle-down
           reduction broadcast from lane 0, sum by an xor butterfly.
version 4: one block per row, any multiple of 32 threads: warp shuffles, then one float per warp in
           shared memory folded by thread 0. llm.c reuses one shared slot for the max and then the
           sum without a barrier in between (a formal race); here they have separate slots.
version 5: online softmax (Milakov & Gimelshein 2018), one thread per row: a single pass keeps the
           running (max, sum) pair, then one pass writes exp(x - max) / sum. Still uncoalesced.
version 6: online softmax, one warp per row with cooperative groups: each lane folds its strided
           elements into a (max, sum) pair, one cg::reduce merges the pairs, the write pass uses
           streaming stores.
version 7: one block per row, unrolled by 8 for very large C: each thread issues 8 independent loads
           (indices clamped to C-1 so the loads need no branch) before using them. llm.c lets threads
           with tid >= C return before the barriers, undefined when C < block size; here they stay
           and simply contribute nothing. llm.c's last pass also clamps its loads of `out`, which that
           same pass overwrites: a thread past the end re-reads out[C-1] while its owner rewrites it
           (a data race, though the value is discarded; found by the emulator's racecheck on global
           memory). Here that pass loads only its own elements.
version 8: online softmax, one warp per row with raw shuffles: the (max, sum) pairs merge with
           __shfl_down_sync applying the rescale rule, lane 0's pair is broadcast with __shfl_sync.

Fastest per llm.c's header: version 4 among the classic designs, version 7 for very large C.
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------------------------
// version 1: one thread per row, three passes

__global__ void softmax_forward_kernel1(float* out, const float* inp, int N, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        const float* inp_row = inp + (size_t)i * C;
        float* out_row = out + (size_t)i * C;
        float maxval = -INFINITY;
        for (int j = 0; j < C; j++) {
            maxval = fmaxf(maxval, inp_row[j]);
        }
        double sum = 0.0;  // the CPU reference sums in double too
        for (int j = 0; j < C; j++) {
            out_row[j] = expf(inp_row[j] - maxval);
            sum += out_row[j];
        }
        float norm = (float)(1.0 / sum);
        for (int j = 0; j < C; j++) {
            out_row[j] *= norm;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one block per row, shared-memory tree reductions (blockDim.x a power of two)

__global__ void softmax_forward_kernel2(float* out, const float* inp, int N, int C) {
    extern __shared__ float shared[];  // blockDim.x floats
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float maxval = -INFINITY;
    for (int i = tid; i < C; i += blockDim.x) {
        maxval = fmaxf(maxval, x[i]);
    }
    shared[tid] = maxval;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride >= 1; stride /= 2) {
        if (tid < stride) {
            shared[tid] = fmaxf(shared[tid], shared[tid + stride]);
        }
        __syncthreads();
    }
    float offset = shared[0];
    __syncthreads();  // everyone has read the max before the slots are reused for the sum

    for (int i = tid; i < C; i += blockDim.x) {
        y[i] = expf(x[i] - offset);
    }
    float sumval = 0.0f;
    for (int i = tid; i < C; i += blockDim.x) {
        sumval += y[i];  // the thread reads back only what it wrote itself: no barrier needed
    }
    shared[tid] = sumval;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride >= 1; stride /= 2) {
        if (tid < stride) {
            shared[tid] += shared[tid + stride];
        }
        __syncthreads();
    }
    float sum = shared[0];
    for (int i = tid; i < C; i += blockDim.x) {
        y[i] = y[i] / sum;
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: one warp (block of 32 threads) per row

__global__ void softmax_forward_kernel3(float* out, const float* inp, int N, int C) {
    int row = blockIdx.x;
    int lane = threadIdx.x;
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float maxval = -INFINITY;
    for (int i = lane; i < C; i += 32) {
        maxval = fmaxf(maxval, x[i]);
    }
    // shuffle-down leaves the result in lane 0 only, so broadcast it
    for (int offset = 16; offset > 0; offset /= 2) {
        maxval = fmaxf(maxval, __shfl_down_sync(0xFFFFFFFFu, maxval, offset));
    }
    float offset_val = __shfl_sync(0xFFFFFFFFu, maxval, 0);

    for (int i = lane; i < C; i += 32) {
        y[i] = expf(x[i] - offset_val);
    }
    float sumval = 0.0f;
    for (int i = lane; i < C; i += 32) {
        sumval += y[i];
    }
    sumval = warpReduceSum(sumval);  // xor butterfly: every lane has the total
    for (int i = lane; i < C; i += 32) {
        y[i] = y[i] / sumval;
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: one block per row, warp shuffles + one shared float per warp

__global__ void softmax_forward_kernel4(float* out, const float* inp, int N, int C) {
    // 2 * warpsPerBlock floats: the max partials, then the sum partials in their own slots
    extern __shared__ float shared[];
    int row = blockIdx.x;
    int tid = threadIdx.x;
    int warpId = tid / 32;
    int laneId = tid % 32;
    int warpsPerBlock = blockDim.x / 32;
    float* maxvals = shared;
    float* sumvals = shared + warpsPerBlock;
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float maxval = -INFINITY;
    for (int i = tid; i < C; i += blockDim.x) {
        maxval = fmaxf(maxval, x[i]);
    }
    maxval = warpReduceMax(maxval);
    if (laneId == 0) maxvals[warpId] = maxval;
    __syncthreads();
    if (tid == 0) {
        float val = maxvals[0];
        for (int i = 1; i < warpsPerBlock; i++) val = fmaxf(val, maxvals[i]);
        maxvals[0] = val;
    }
    __syncthreads();
    float offset = maxvals[0];

    for (int i = tid; i < C; i += blockDim.x) {
        y[i] = expf(x[i] - offset);
    }
    float sumval = 0.0f;
    for (int i = tid; i < C; i += blockDim.x) {
        sumval += y[i];
    }
    sumval = warpReduceSum(sumval);
    if (laneId == 0) sumvals[warpId] = sumval;  // separate slot: no race with readers of maxvals[0]
    __syncthreads();
    if (tid == 0) {
        float val = sumvals[0];
        for (int i = 1; i < warpsPerBlock; i++) val += sumvals[i];
        sumvals[0] = val;
    }
    __syncthreads();
    float sum = sumvals[0];
    for (int i = tid; i < C; i += blockDim.x) {
        y[i] = y[i] / sum;
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: online softmax, one thread per row

__global__ void softmax_forward_online_kernel5(float* out, const float* inp, int N, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        const float* inp_row = inp + (size_t)i * C;
        float* out_row = out + (size_t)i * C;
        float maxval = -INFINITY;
        double sum = 0.0;
        for (int j = 0; j < C; j++) {
            float x = inp_row[j];
            if (x > maxval) {
                sum *= exp((double)(maxval - x));  // rescale what was summed under the old max
                maxval = x;
            }
            sum += exp((double)(x - maxval));
        }
        for (int j = 0; j < C; j++) {
            out_row[j] = (float)(exp((double)(inp_row[j] - maxval)) / sum);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 6: online softmax, one warp per row, a single cg::reduce over (max, sum) pairs

struct __align__(8) SumMax {
    float maxval;
    float sum;
};

// Merges two partial softmax normalisers: rescale the one with the smaller max. A pair with no
// elements yet is (-inf, 0) and must not turn the result into NaN through exp(-inf - -inf).
__device__ __forceinline__ SumMax reduce_sum_max_op(SumMax a, SumMax b) {
    bool a_bigger = a.maxval > b.maxval;
    SumMax bigger = a_bigger ? a : b;
    SumMax smaller = a_bigger ? b : a;
    SumMax res;
    res.maxval = bigger.maxval;
    res.sum = bigger.sum + (smaller.sum == 0.0f ? 0.0f : smaller.sum * expf(smaller.maxval - bigger.maxval));
    return res;
}

struct SumMaxOp {
    __device__ SumMax operator()(SumMax a, SumMax b) const { return reduce_sum_max_op(a, b); }
};

__global__ void softmax_forward_online_kernel6(float* out, const float* inp, int N, int C) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) return;  // the whole warp leaves together: no collective is left half-attended
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    SumMax sm_partial;
    sm_partial.maxval = -INFINITY;
    sm_partial.sum = 0.0f;
    for (int i = warp.thread_rank(); i < C; i += warp.size()) {
        SumMax one;
        one.maxval = x[i];
        one.sum = 1.0f;
        sm_partial = reduce_sum_max_op(sm_partial, one);
    }
    SumMax sm_total = cg::reduce(warp, sm_partial, SumMaxOp());

    for (int i = warp.thread_rank(); i < C; i += warp.size()) {
        // the row is read once more; the output is written with a streaming store since it is
        // not read again by this kernel
        __stcs(y + i, expf(x[i] - sm_total.maxval) / sm_total.sum);
    }
}

// ----------------------------------------------------------------------------------------------
// version 7: one block per row, 8 loads in flight per thread

#define SOFTMAX7_UNROLL 8

__global__ void softmax_forward_kernel7(float* out, const float* inp, int N, int C) {
    extern __shared__ float shared[];  // 2 * warpsPerBlock floats: max partials, sum partials
    int row = blockIdx.x;
    int tid = threadIdx.x;
    int warpId = tid / 32;
    int laneId = tid % 32;
    int warpsPerBlock = blockDim.x / 32;
    float* maxvals = shared;
    float* sumvals = shared + warpsPerBlock;
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float maxval = -INFINITY;
    for (int i = tid; i < C; i += blockDim.x * SOFTMAX7_UNROLL) {
        float reg[SOFTMAX7_UNROLL];
        #pragma unroll
        for (int u = 0; u < SOFTMAX7_UNROLL; u++) {
            reg[u] = x[min(C - 1, i + u * blockDim.x)];  // clamped: the load is always legal
        }
        #pragma unroll
        for (int u = 0; u < SOFTMAX7_UNROLL; u++) {
            if (i + u * blockDim.x < C) maxval = fmaxf(maxval, reg[u]);
        }
    }
    maxval = warpReduceMax(maxval);
    if (laneId == 0) maxvals[warpId] = maxval;
    __syncthreads();
    if (tid == 0) {
        float val = maxvals[0];
        for (int i = 1; i < warpsPerBlock; i++) val = fmaxf(val, maxvals[i]);
        maxvals[0] = val;
    }
    __syncthreads();
    float offset = maxvals[0];

    // exp, store and sum fused in one pass; the input is not read again, so stream it
    float sumval = 0.0f;
    for (int i = tid; i < C; i += blockDim.x * SOFTMAX7_UNROLL) {
        float reg[SOFTMAX7_UNROLL];
        #pragma unroll
        for (int u = 0; u < SOFTMAX7_UNROLL; u++) {
            reg[u] = __ldcs(x + min(C - 1, i + u * blockDim.x));
        }
        #pragma unroll
        for (int u = 0; u < SOFTMAX7_UNROLL; u++) {
            int pos = i + u * blockDim.x;
            if (pos < C) {
                float e = expf(reg[u] - offset);
                y[pos] = e;
                sumval += e;
            }
        }
    }
    sumval = warpReduceSum(sumval);
    if (laneId == 0) sumvals[warpId] = sumval;
    __syncthreads();
    if (tid == 0) {
        float val = sumvals[0];
        for (int i = 1; i < warpsPerBlock; i++) val += sumvals[i];
        sumvals[0] = val;
    }
    __syncthreads();
    float sum = sumvals[0];

    for (int i = tid; i < C; i += blockDim.x * SOFTMAX7_UNROLL) {
        float reg[SOFTMAX7_UNROLL];
        #pragma unroll
        for (int u = 0; u < SOFTMAX7_UNROLL; u++) {
            // Not clamped: y[C-1] is rewritten in this very pass by the thread that owns it, so a
            // clamped load of it by another thread is a data race (racecheck, global memory).
            int pos = i + u * blockDim.x;
            reg[u] = pos < C ? y[pos] : 0.0f;
        }
        #pragma unroll
        for (int u = 0; u < SOFTMAX7_UNROLL; u++) {
            int pos = i + u * blockDim.x;
            if (pos < C) y[pos] = reg[u] / sum;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 8: online softmax, one warp per row, raw shuffles

__global__ void softmax_forward_online_kernel8(float* out, const float* inp, int N, int C) {
    int lane = threadIdx.x % 32;
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (row >= N) return;  // whole warps leave together
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float maxval = -INFINITY;
    float sumval = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float v = x[i];
        if (v > maxval) {
            sumval *= expf(maxval - v);
            maxval = v;
        }
        sumval += expf(v - maxval);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        float other_max = __shfl_down_sync(0xFFFFFFFFu, maxval, offset);
        float other_sum = __shfl_down_sync(0xFFFFFFFFu, sumval, offset);
        float new_max = fmaxf(maxval, other_max);
        // a lane without elements holds (-inf, 0): skip it rather than compute exp(-inf + inf)
        float mine = sumval == 0.0f ? 0.0f : sumval * expf(maxval - new_max);
        float theirs = other_sum == 0.0f ? 0.0f : other_sum * expf(other_max - new_max);
        sumval = mine + theirs;
        maxval = new_max;
    }
    float row_max = __shfl_sync(0xFFFFFFFFu, maxval, 0);
    float row_sum = __shfl_sync(0xFFFFFFFFu, sumval, 0);
    for (int i = lane; i < C; i += 32) {
        y[i] = expf(x[i] - row_max) / row_sum;
    }
}
