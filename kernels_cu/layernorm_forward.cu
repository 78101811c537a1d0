/*
layernorm_forward: LayerNorm over the channel dimension of an (N, C) FP32 matrix (N = B*T rows),
saving the row statistics for the backward pass:
    mean[i] = (1/C) sum_j x[i, j]
    rstd[i] = 1 / sqrt((1/C) sum_j (x[i, j] - mean[i])^2 + 1e-5)      (biased variance)
    out[i, j] = (x[i, j] - mean[i]) * rstd[i] * weight[j] + bias[j]
In GPT-2 this is ln1, ln2 and ln_f, C = 768 for the 124M model.

Versions (same numbers as llm.c's dev/cuda/layernorm_forward.cu; its header lists only 1-5):

version 1: naive port of the CPU loop, one thread per row: a mean pass, a centred variance pass and
           a normalisation pass. Neighbouring threads are C floats apart: nothing coalesces.
version 2: three kernels. (a) one block per row computes the mean with a strided partial sum and a
           halving tree in shared memory; (b) the same for rstd, re-reading x and the stored mean;
           (c) one thread per element normalises, with a fixed block of 256 threads. The swept block
           size (a, b) must be a power of two. llm.c's (c) has no bounds check and needs N*C to be a
           multiple of 256; here the tail threads are masked, so any N*C works.
version 3: one warp per row with cooperative groups (block/32 rows per block): an exact two-pass
           mean then sum of squared deviations, each with cg::reduce; rsqrtf. The last pass loads x
           and stores out with streaming hints so weight and bias stay in cache; lane 0 stores
           mean and rstd (streaming), skipping a null pointer. The fp32 trainer uses it (block 512).
version 4: as 3 but one read pass accumulating sum(x) and sum(x^2) together, var = E[x^2] - mean^2.
           One global read fewer, but the identity cancels when |mean| >> std. llm.c can then feed a
           slightly negative variance to rsqrtf; here it is clamped at 0 (no effect otherwise).
version 5: one block per row, single-pass variance as in 4: per-thread partials, a warp cg::reduce,
           one float per warp into two static shared arrays of 32, a barrier, then every warp
           re-reduces the <= 32 warp partials (lanes past the warp count contribute 0).
version 6: one warp per row, block = (32, block/32) so threadIdx.y picks the row. Dynamic shared
           memory holds weight, bias (loaded by the whole block before out-of-range warps leave,
           then a barrier) and one row cache per warp: x is read once from global memory with
           128-bit streaming loads, the exact two-pass statistics and the normalisation then read
           shared memory only, and out is written with 128-bit streaming stores. Needs C % 4 == 0
           and (2 + block/32) * C floats of shared memory (104,448 bytes at block 1024, C = 768:
           the runtime raises the 48 KiB limit); when even that is too much the launcher falls back
           to version 5, as llm.c's does.

Fastest per llm.c: version 6 (adopted by the bf16 mainline, block 256), with 3 as its fallback.
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

#define LN_EPS 1e-5f

// ----------------------------------------------------------------------------------------------
// version 1: one thread per row

__global__ void layernorm_forward_kernel1(float* out, float* mean, float* rstd, const float* inp,
                                          const float* weight, const float* bias, int N, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        const float* x = inp + (size_t)i * C;
        float* y = out + (size_t)i * C;
        float m = 0.0f;
        for (int j = 0; j < C; j++) {
            m += x[j];
        }
        m = m / C;
        float v = 0.0f;
        for (int j = 0; j < C; j++) {
            float d = x[j] - m;
            v += d * d;
        }
        v = v / C;
        float s = 1.0f / sqrtf(v + LN_EPS);
        for (int j = 0; j < C; j++) {
            y[j] = (s * (x[j] - m)) * weight[j] + bias[j];
        }
        mean[i] = m;
        rstd[i] = s;
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: mean kernel, rstd kernel (one block per row, tree reductions), normalisation kernel

__global__ void layernorm_forward_mean_kernel2(float* mean, const float* inp, int N, int C) {
    extern __shared__ float shared[];  // blockDim.x floats
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int i = tid; i < C; i += blockDim.x) {
        sum += x[i];
    }
    shared[tid] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride >= 1; stride /= 2) {
        if (tid < stride) {
            shared[tid] += shared[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        mean[row] = shared[0] / C;
    }
}

__global__ void layernorm_forward_rstd_kernel2(float* rstd, const float* inp, const float* mean, int N, int C) {
    extern __shared__ float shared[];  // blockDim.x floats
    int row = blockIdx.x;
    int tid = threadIdx.x;
    const float* x = inp + (size_t)row * C;
    float m = mean[row];  // written by the previous kernel of the same stream
    float sum = 0.0f;
    for (int i = tid; i < C; i += blockDim.x) {
        float d = x[i] - m;
        sum += d * d;
    }
    shared[tid] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride >= 1; stride /= 2) {
        if (tid < stride) {
            shared[tid] += shared[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        rstd[row] = 1.0f / sqrtf(shared[0] / C + LN_EPS);
    }
}

__global__ void layernorm_forward_normalization_kernel2(float* out, const float* inp, const float* mean,
                                                        const float* rstd, const float* weight,
                                                        const float* bias, int N, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)N * C) {  // llm.c has no guard here (N*C had to be a multiple of 256)
        int row = (int)(idx / C);
        int c = (int)(idx % C);
        float n = (inp[idx] - mean[row]) * rstd[row];
        out[idx] = n * weight[c] + bias[c];
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: one warp per row, exact two-pass statistics with cg::reduce

__global__ void layernorm_forward_kernel3(float* __restrict__ out, float* __restrict__ mean,
                                          float* __restrict__ rstd, const float* __restrict__ inp,
                                          const float* __restrict__ weight, const float* __restrict__ bias,
                                          int N, int C) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) return;  // the whole warp leaves together; there are no block barriers
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float sum = 0.0f;
    for (int i = warp.thread_rank(); i < C; i += warp.size()) {
        sum += x[i];
    }
    sum = cg::reduce(warp, sum, cg::plus<float>{});
    float m = sum / C;
    if (warp.thread_rank() == 0 && mean != nullptr) {
        __stcs(mean + row, m);
    }

    // second pass over the row (from cache, usually): sum of squared deviations, exact
    sum = 0.0f;
    for (int i = warp.thread_rank(); i < C; i += warp.size()) {
        float d = x[i] - m;
        sum += d * d;
    }
    sum = cg::reduce(warp, sum, cg::plus<float>{});
    float s = rsqrtf(sum / C + LN_EPS);
    if (warp.thread_rank() == 0 && rstd != nullptr) {
        __stcs(rstd + row, s);
    }

    // x and out are touched for the last time: stream them, so weight and bias stay cached
    for (int c = warp.thread_rank(); c < C; c += warp.size()) {
        float n = s * (__ldcs(x + c) - m);
        __stcs(y + c, n * weight[c] + bias[c]);
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: one warp per row, one read pass for sum(x) and sum(x^2)

__global__ void layernorm_forward_kernel4(float* __restrict__ out, float* __restrict__ mean,
                                          float* __restrict__ rstd, const float* __restrict__ inp,
                                          const float* __restrict__ weight, const float* __restrict__ bias,
                                          int N, int C) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) return;
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float sum = 0.0f;
    float sum2 = 0.0f;
    for (int i = warp.thread_rank(); i < C; i += warp.size()) {
        float xi = x[i];
        sum += xi;
        sum2 += xi * xi;
    }
    sum = cg::reduce(warp, sum, cg::plus<float>{});
    sum2 = cg::reduce(warp, sum2, cg::plus<float>{});
    float m = sum / C;
    float var = fmaxf(sum2 / C - m * m, 0.0f);  // E[x^2] - m^2 may cancel below zero
    float s = rsqrtf(var + LN_EPS);
    if (warp.thread_rank() == 0 && mean != nullptr) {
        __stcs(mean + row, m);
    }
    if (warp.thread_rank() == 0 && rstd != nullptr) {
        __stcs(rstd + row, s);
    }

    for (int c = warp.thread_rank(); c < C; c += warp.size()) {
        float n = s * (__ldcs(x + c) - m);
        __stcs(y + c, n * weight[c] + bias[c]);
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: one block per row, single-pass variance, two static shared arrays of warp partials

__global__ void layernorm_forward_kernel5(float* __restrict__ out, float* __restrict__ mean,
                                          float* __restrict__ rstd, const float* __restrict__ inp,
                                          const float* __restrict__ weight, const float* __restrict__ bias,
                                          int N, int C) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    __shared__ float shared_sum[32];   // one partial per warp (at most 32 warps)
    __shared__ float shared_sum2[32];
    int num_warps = blockDim.x / 32;
    int warp_id = threadIdx.x / 32;
    int lane_id = threadIdx.x % 32;
    int row = blockIdx.x;  // the grid has exactly N blocks
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    float sum = 0.0f;
    float sum2 = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float xi = x[i];
        sum += xi;
        sum2 += xi * xi;
    }
    sum = cg::reduce(warp, sum, cg::plus<float>{});
    sum2 = cg::reduce(warp, sum2, cg::plus<float>{});
    if (lane_id == 0) {
        shared_sum[warp_id] = sum;
        shared_sum2[warp_id] = sum2;
    }
    __syncthreads();
    // every warp folds the warp partials itself, so no second barrier is needed
    sum = lane_id < num_warps ? shared_sum[lane_id] : 0.0f;
    sum2 = lane_id < num_warps ? shared_sum2[lane_id] : 0.0f;
    sum = cg::reduce(warp, sum, cg::plus<float>{});
    sum2 = cg::reduce(warp, sum2, cg::plus<float>{});

    float m = sum / C;
    float var = fmaxf(sum2 / C - m * m, 0.0f);
    float s = rsqrtf(var + LN_EPS);
    if (threadIdx.x == 0 && mean != nullptr) {
        __stcs(mean + row, m);
    }
    if (threadIdx.x == 0 && rstd != nullptr) {
        __stcs(rstd + row, s);
    }

    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float n = s * (__ldcs(x + c) - m);
        __stcs(y + c, n * weight[c] + bias[c]);
    }
}

// ----------------------------------------------------------------------------------------------
// version 6: one warp per row, weight/bias/row staged in shared memory, 128-bit accesses

__global__ void layernorm_forward_kernel6(float* __restrict__ out, float* __restrict__ mean,
                                          float* __restrict__ rstd, const float* __restrict__ inp,
                                          const float* __restrict__ weight, const float* __restrict__ bias,
                                          int N, int C) {
    // (2 + blockDim.y) * C floats: weight, bias, then one row cache per warp (C % 4 == 0, so every
    // segment starts 16-byte aligned)
    extern __shared__ float shared[];
    float* s_weight = shared;
    float* s_bias = shared + C;
    float* s_in = shared + (size_t)(2 + threadIdx.y) * C;
    int lane = threadIdx.x;  // blockDim.x == 32
    int tid = threadIdx.y * 32 + threadIdx.x;
    int nthreads = blockDim.y * 32;

    // the whole block loads weight and bias, including warps whose row is out of range
    for (int i = tid * 4; i < C; i += nthreads * 4) {
        store128(s_weight + i, load128(weight + i));
        store128(s_bias + i, load128(bias + i));
    }
    __syncthreads();

    int row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= N) return;  // whole warps leave, after the block's only barrier
    const float* x = inp + (size_t)row * C;
    float* y = out + (size_t)row * C;

    // the only read of x from global memory: stash the row, summing on the way
    float sum = 0.0f;
    for (int c = lane * 4; c < C; c += 32 * 4) {
        float4 v = load128cs(x + c);
        sum += (v.x + v.y) + (v.z + v.w);
        store128(s_in + c, v);  // each lane re-reads only what it stored itself
    }
    float m = warpReduceSum(sum) / C;

    float var = 0.0f;
    for (int c = lane * 4; c < C; c += 32 * 4) {
        float4 v = load128(s_in + c);
        float dx = v.x - m, dy = v.y - m, dz = v.z - m, dw = v.w - m;
        var += (dx * dx + dy * dy) + (dz * dz + dw * dw);
    }
    float s = rsqrtf(warpReduceSum(var) / C + LN_EPS);

    for (int c = lane * 4; c < C; c += 32 * 4) {
        float4 v = load128(s_in + c);
        float4 w = load128(s_weight + c);
        float4 b = load128(s_bias + c);
        float4 o;
        o.x = s * (v.x - m) * w.x + b.x;
        o.y = s * (v.y - m) * w.y + b.y;
        o.z = s * (v.z - m) * w.z + b.z;
        o.w = s * (v.w - m) * w.w + b.w;
        store128cs(y + c, o);
    }
    if (lane == 0 && mean != nullptr) {
        __stcs(mean + row, m);
    }
    if (lane == 0 && rstd != nullptr) {
        __stcs(rstd + row, s);
    }
}
