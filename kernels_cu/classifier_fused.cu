/*
classifier_fused: softmax + cross-entropy loss + logit gradient in one kernel, the last step of the
GPT-2 forward and the first of its backward, so no (B*T, V) probability tensor is ever written.
It works because each position's upstream gradient dloss is known before the backward starts
(in pretraining the constant 1/(B*T) of a mean).

logits (N = B*T rows, row stride P >= V: the padded vocabulary; only the first V columns are real,
the padding is never read as data nor written), targets (N) int32 in [0, V), dlosses (N) FP32 or
a null pointer meaning "every dloss = 1/N" (versions 2-5). Per row: Offset = max_{i<V} x_i,
Scale = 1 / sum_{i<V} exp(x_i - Offset), p_i = exp(x_i - Offset) * Scale; outputs
losses[r] = -log(p[target_r]) and dlogits[r, i] = (p_i - [i == target_r]) * dloss_r for i < V,
same (N, P) layout; optionally probs[r, i] = p_i (every launcher passes null). Every stats pass
keeps an online (max, sum) pair per thread and merges the pairs.

IN PLACE: the trainer passes the logits buffer as dlogits too, and our launchers always do. llm.c
lets thread 0 (lane 0 in version 1) read the target's logit for the loss after the reductions,
while other threads may already be overwriting logits with gradients: a formal race in version 3,
the trainer's. Here every version reads the target's logit at the start, before the first
reduction, so the loss is right in place whatever the thread order.

Versions (same numbers as llm.c's dev/cuda/classifier_fused.cu, whose header lists only 1-4):

version 1: warp per row: one 32-thread tile per row, bs/32 rows per block; lanes stride over V;
           warp max with cg::reduce(greater), each lane rescales its sum, warp sum with
           cg::reduce(plus); lane 0 writes the loss; a second strided pass recomputes p and writes
           dlogits, re-reading target and dloss inside the loop. Needs dlosses. llm.c's grid is
           B*T / (bs/32) (rows dropped when that does not divide); here it is rounded up and the
           surplus warps leave together.
version 2: block per row, float4: the stats pass walks the float4 chunks DOWNWARDS from the end of
           the row (so the start of the row is the most recently touched data when the ascending
           gradient pass begins: more L2 hits), checking every element against V. Block reduction
           in three steps: warp cg::reduce, lane 0 to a 32-slot shared array per quantity, cg::reduce
           over the slots (missing warps read as -FLT_MAX / 0). Thread 0 writes the loss. Gradient pass:
           float4 reads with __ldcs (evict-first, the data is dead afterwards). Needs P % 4 == 0 and
           16-byte aligned rows. llm.c writes zeros into the padding up to 4*ceil(V/4); here the
           last, partial chunk is stored element by element for the columns < V only.
version 3: version 2 with plain float loads: reverse-order stats loop, __ldcs on the second read.
           Touches only columns < V, no alignment requirement: the trainer's choice (block 1024).
version 4: version 2 with a generic 128-bit packet (a float4 in FP32): streaming 128-bit loads in
           both passes, plain (no hint) 128-bit stores of dlogits. llm.c skips the lanes >= V of the
           last packet but still stores the whole packet, writing uninitialised values into the
           padding; here that packet is stored element by element for the columns < V only.
version 5: the tuned 128-bit version: compile-time switches "write dlogits" (on) and "write probs"
           (off); __launch_bounds__(1024, 2) on sm_80 and sm_90+ (1 elsewhere). Stats pass: the one
           partial packet at the end of the row is peeled off into a bounds-checked scalar loop, then
           an unchecked descending loop over full packets with normal (cache-keeping) 128-bit loads,
           so the row is still in cache for pass 2; reductions with the block-reduce helper
           (xor-shuffle warp reduce, 32-slot shared array, second warp reduce). Gradient pass: full
           packets with plain loads and streaming stores, then a scalar tail for the last V mod 4
           columns with __stcs. llm.c's tail loop advances by 1 instead of by the block size, so
           several threads write the same tail entries; here it is block-strided. Needs P % 4 == 0
           and 16-byte aligned rows; reads and writes only columns < V.

The file gives no timings; version 5 is presented as the fix of version 4's cache thrashing.
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

// Online softmax normaliser: fold one value into a thread's running (max, sum) pair. A thread
// with no elements yet holds (-FLT_MAX, 0): the first fold multiplies 0 by exp(-huge) = 0, and
// an idle thread's rescale to the row max is 0 * 0. -FLT_MAX rather than -INFINITY: from -inf, a
// first logit of -inf (a masked one) would give exp(-inf - -inf) = NaN and poison the row's sum.
__device__ __forceinline__ void classifier_online_update(float& maxval, float& sumval, float v) {
    float old_max = maxval;
    maxval = fmaxf(maxval, v);
    sumval *= expf(old_max - maxval);
    sumval += expf(v - maxval);
}

// ----------------------------------------------------------------------------------------------
// version 1: one warp per row

__global__ void classifier_fused_kernel1(float* dlogits, float* losses, float* probs, const float* logits,
                                         const float* dlosses, const int* targets, int N, int V, int P) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) return;  // the whole warp leaves together: no collective is left half-attended
    int lane = warp.thread_rank();
    const float* x = logits + (size_t)row * P;
    // read before any lane can overwrite it with a gradient (in-place use)
    float x_target = lane == 0 ? x[targets[row]] : 0.0f;

    float maxval = -FLT_MAX;
    float sumval = 0.0f;
    for (int i = lane; i < V; i += warp.size()) {
        classifier_online_update(maxval, sumval, x[i]);
    }
    float offset = cg::reduce(warp, maxval, cg::greater<float>());
    sumval *= expf(maxval - offset);  // rescale this lane's sum to the row max (0 stays 0)
    float sum = cg::reduce(warp, sumval, cg::plus<float>());
    float scale = 1.0f / sum;

    if (lane == 0) {
        float prob = expf(x_target - offset) * scale;
        losses[row] = -logf(prob);
    }
    for (int i = lane; i < V; i += warp.size()) {
        float prob = expf(x[i] - offset) * scale;
        if (probs != nullptr) probs[(size_t)row * P + i] = prob;
        float indicator = i == targets[row] ? 1.0f : 0.0f;
        dlogits[(size_t)row * P + i] = (prob - indicator) * dlosses[row];
    }
}

// ----------------------------------------------------------------------------------------------
// Block-wide (max, sum) of the per-thread online pairs, the three-step cg way of versions 2-4:
// warp cg::reduce, lane 0 to a 32-slot shared array per quantity, cg::reduce over the slots.
// Separate arrays for the max and the sum, so no barrier is needed between reading one and
// writing the other. Returns (Offset, Scale) in every thread.

struct ClassifierStats {
    float offset;
    float scale;
};

__device__ ClassifierStats classifier_block_stats_cg(float maxval, float sumval, float* shared_max, float* shared_sum) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int lane = warp.thread_rank();
    int warp_id = warp.meta_group_rank();
    int num_warps = warp.meta_group_size();

    float warp_max = cg::reduce(warp, maxval, cg::greater<float>());
    if (lane == 0) shared_max[warp_id] = warp_max;
    __syncthreads();
    float slot_max = lane < num_warps ? shared_max[lane] : -FLT_MAX;  // missing warps: neutral
    float block_max = cg::reduce(warp, slot_max, cg::greater<float>());

    sumval *= expf(maxval - block_max);
    float warp_sum = cg::reduce(warp, sumval, cg::plus<float>());
    if (lane == 0) shared_sum[warp_id] = warp_sum;
    __syncthreads();
    float slot_sum = lane < num_warps ? shared_sum[lane] : 0.0f;
    float block_sum = cg::reduce(warp, slot_sum, cg::plus<float>());

    ClassifierStats s;
    s.offset = block_max;
    s.scale = 1.0f / block_sum;
    return s;
}

// One float4 chunk of the gradient pass (versions 2 and 4): columns >= V are left alone, so the
// last, partial chunk is stored element by element and the padding is never written.
__device__ __forceinline__ void classifier_store_chunk(float* dlogits_row, float* probs_row, float4 x4, int i,
                                                       ClassifierStats s, int target, float dloss, int V) {
    float4 grad;
    float4 prob4;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        int col = 4 * i + k;
        float prob = col < V ? expf(float4_get(x4, k) - s.offset) * s.scale : 0.0f;
        float indicator = col == target ? 1.0f : 0.0f;
        float4_set(prob4, k, prob);
        float4_set(grad, k, (prob - indicator) * dloss);
    }
    if (4 * i + 4 <= V) {
        store128(dlogits_row + 4 * i, grad);
        if (probs_row != nullptr) store128(probs_row + 4 * i, prob4);
    } else {
        for (int k = 0; 4 * i + k < V; k++) {
            dlogits_row[4 * i + k] = float4_get(grad, k);
            if (probs_row != nullptr) probs_row[4 * i + k] = float4_get(prob4, k);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one block per row, float4 chunks, descending stats pass

__global__ void classifier_fused_kernel2(float* dlogits, float* losses, float* probs, const float* logits,
                                         const float* dlosses, const int* targets, int N, int V, int P) {
    __shared__ float shared_max[32];
    __shared__ float shared_sum[32];
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* x = logits + (size_t)row * P;
    int target = targets[row];
    float x_target = tid == 0 ? x[target] : 0.0f;  // before the barriers: in place it is overwritten later

    // stats pass: chunks from the end of the row downwards; the last chunk may hold padding
    float maxval = -FLT_MAX;
    float sumval = 0.0f;
    int num_chunks = CEIL_DIV(V, 4);
    for (int i = num_chunks - 1 - tid; i >= 0; i -= blockDim.x) {
        float4 x4 = load128(x + 4 * i);
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            if (4 * i + k < V) classifier_online_update(maxval, sumval, float4_get(x4, k));
        }
    }
    ClassifierStats s = classifier_block_stats_cg(maxval, sumval, shared_max, shared_sum);

    if (tid == 0) {
        float prob = expf(x_target - s.offset) * s.scale;
        losses[row] = -logf(prob);
    }
    float dloss = dlosses != nullptr ? dlosses[row] : 1.0f / N;
    float* dlogits_row = dlogits + (size_t)row * P;
    float* probs_row = probs != nullptr ? probs + (size_t)row * P : nullptr;
    // gradient pass, ascending; the row is dead after this read: evict-first
    for (int i = tid; i < num_chunks; i += blockDim.x) {
        float4 x4 = load128cs(x + 4 * i);
        classifier_store_chunk(dlogits_row, probs_row, x4, i, s, target, dloss, V);
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: version 2 with scalar loads (no alignment requirement; the trainer's version)

__global__ void classifier_fused_kernel3(float* dlogits, float* losses, float* probs, const float* logits,
                                         const float* dlosses, const int* targets, int N, int V, int P) {
    __shared__ float shared_max[32];
    __shared__ float shared_sum[32];
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* x = logits + (size_t)row * P;
    int target = targets[row];
    // llm.c reads this after the reductions, racing with threads that already write gradients
    // into the same buffer when it runs in place; read it first instead
    float x_target = tid == 0 ? x[target] : 0.0f;

    float maxval = -FLT_MAX;
    float sumval = 0.0f;
    for (int i = V - 1 - tid; i >= 0; i -= blockDim.x) {  // reverse order, as in version 2
        classifier_online_update(maxval, sumval, x[i]);
    }
    ClassifierStats s = classifier_block_stats_cg(maxval, sumval, shared_max, shared_sum);

    if (tid == 0) {
        float prob = expf(x_target - s.offset) * s.scale;
        losses[row] = -logf(prob);
    }
    float dloss = dlosses != nullptr ? dlosses[row] : 1.0f / N;
    float* dlogits_row = dlogits + (size_t)row * P;
    for (int i = tid; i < V; i += blockDim.x) {
        float prob = expf(__ldcs(x + i) - s.offset) * s.scale;
        if (probs != nullptr) probs[(size_t)row * P + i] = prob;
        float indicator = i == target ? 1.0f : 0.0f;
        dlogits_row[i] = (prob - indicator) * dloss;
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: 128-bit packets, streaming loads in both passes, plain 128-bit stores

__global__ void classifier_fused_kernel4(float* dlogits, float* losses, float* probs, const float* logits,
                                         const float* dlosses, const int* targets, int N, int V, int P) {
    __shared__ float shared_max[32];
    __shared__ float shared_sum[32];
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* x = logits + (size_t)row * P;
    int target = targets[row];
    float x_target = tid == 0 ? x[target] : 0.0f;  // before the barriers (in-place use)

    float maxval = -FLT_MAX;
    float sumval = 0.0f;
    int num_packets = CEIL_DIV(V, 4);
    for (int i = num_packets - 1 - tid; i >= 0; i -= blockDim.x) {
        float4 x4 = load128cs(x + 4 * i);
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            if (4 * i + k < V) classifier_online_update(maxval, sumval, float4_get(x4, k));
        }
    }
    ClassifierStats s = classifier_block_stats_cg(maxval, sumval, shared_max, shared_sum);

    if (tid == 0) {
        float prob = expf(x_target - s.offset) * s.scale;
        losses[row] = -logf(prob);
    }
    float dloss = dlosses != nullptr ? dlosses[row] : 1.0f / N;
    float* dlogits_row = dlogits + (size_t)row * P;
    float* probs_row = probs != nullptr ? probs + (size_t)row * P : nullptr;
    for (int i = tid; i < num_packets; i += blockDim.x) {
        float4 x4 = load128cs(x + 4 * i);
        classifier_store_chunk(dlogits_row, probs_row, x4, i, s, target, dloss, V);  // plain stores
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: tuned 128-bit version, peeled partial packet, streaming stores, xor-shuffle block reduce

// The block-reduce helper: warp reduce by xor shuffles, one slot per warp in shared memory, a
// second warp reduce over the slots in every warp; the block's result in every thread.
__device__ __forceinline__ float classifier_block_reduce_max(float val, float* slots) {
    int lane = threadIdx.x % 32;
    float w = warpReduceMax(val);
    if (lane == 0) slots[threadIdx.x / 32] = w;
    __syncthreads();
    float slot = lane < (int)(blockDim.x / 32) ? slots[lane] : -FLT_MAX;
    return warpReduceMax(slot);
}

__device__ __forceinline__ float classifier_block_reduce_sum(float val, float* slots) {
    int lane = threadIdx.x % 32;
    float w = warpReduceSum(val);
    if (lane == 0) slots[threadIdx.x / 32] = w;
    __syncthreads();
    float slot = lane < (int)(blockDim.x / 32) ? slots[lane] : 0.0f;
    return warpReduceSum(slot);
}

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ >= 900)
#define CLASSIFIER5_MIN_BLOCKS 2  // 2 x 1024 threads per SM fit on sm_80 and sm_90
#else
#define CLASSIFIER5_MIN_BLOCKS 1
#endif

template <bool WriteDLogits, bool WriteProbs>
__device__ __forceinline__ void classifier_fused5_body(float* dlogits, float* losses, float* probs, const float* logits,
                                                       const float* dlosses, const int* targets, int N, int V, int P,
                                                       float* shared_max, float* shared_sum) {
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* x = logits + (size_t)row * P;
    int target = targets[row];
    float x_target = tid == 0 ? x[target] : 0.0f;  // before the barriers (in-place use)

    // stats pass. The one partial packet at the end of the row is peeled off: thread 0 reads its
    // columns one by one, bounds-checked (the padding is never read); then every thread walks the
    // full packets downwards with unchecked, cache-keeping 128-bit loads.
    float maxval = -FLT_MAX;
    float sumval = 0.0f;
    int full_packets = V / 4;
    if (tid == 0) {
        for (int col = 4 * full_packets; col < V; col++) {
            classifier_online_update(maxval, sumval, x[col]);
        }
    }
    for (int i = full_packets - 1 - tid; i >= 0; i -= blockDim.x) {
        float4 x4 = load128(x + 4 * i);
        classifier_online_update(maxval, sumval, x4.x);
        classifier_online_update(maxval, sumval, x4.y);
        classifier_online_update(maxval, sumval, x4.z);
        classifier_online_update(maxval, sumval, x4.w);
    }
    float offset = classifier_block_reduce_max(maxval, shared_max);
    sumval *= expf(maxval - offset);
    float scale = 1.0f / classifier_block_reduce_sum(sumval, shared_sum);

    if (tid == 0) {
        float prob = expf(x_target - offset) * scale;
        losses[row] = -logf(prob);
    }
    float dloss = dlosses != nullptr ? dlosses[row] : 1.0f / N;
    float* dlogits_row = dlogits + (size_t)row * P;
    float* probs_row = probs != nullptr ? probs + (size_t)row * P : nullptr;  // used only when WriteProbs

    // gradient pass: full packets, plain loads (the row is still in cache), streaming stores
    for (int i = tid; i < full_packets; i += blockDim.x) {
        float4 x4 = load128(x + 4 * i);
        float4 grad;
        float4 prob4;
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            float prob = expf(float4_get(x4, k) - offset) * scale;
            float indicator = 4 * i + k == target ? 1.0f : 0.0f;
            float4_set(prob4, k, prob);
            float4_set(grad, k, (prob - indicator) * dloss);
        }
        if (WriteDLogits) store128cs(dlogits_row + 4 * i, grad);
        if (WriteProbs) store128cs(probs_row + 4 * i, prob4);
    }
    // scalar tail: the last V mod 4 columns, block-strided (llm.c steps by 1 here)
    for (int col = 4 * full_packets + tid; col < V; col += blockDim.x) {
        float prob = expf(x[col] - offset) * scale;
        float indicator = col == target ? 1.0f : 0.0f;
        if (WriteDLogits) __stcs(dlogits_row + col, (prob - indicator) * dloss);
        if (WriteProbs) __stcs(probs_row + col, prob);
    }
}

__global__ void __launch_bounds__(1024, CLASSIFIER5_MIN_BLOCKS)
classifier_fused_kernel5(float* dlogits, float* losses, float* probs, const float* logits,
                         const float* dlosses, const int* targets, int N, int V, int P) {
    __shared__ float shared_max[32];
    __shared__ float shared_sum[32];
    // the launcher's configuration: write dlogits, not probs (probs may be null)
    classifier_fused5_body<true, false>(dlogits, losses, probs, logits, dlosses, targets, N, V, P,
                                        shared_max, shared_sum);
}
