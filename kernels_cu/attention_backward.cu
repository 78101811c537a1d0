/*
attention_backward: backward pass of causal multi-head self-attention (GPT-2).

Layouts: inp/dinp (B, T, 3C) = (B, T, 3, NH, HS) holding [q | k | v]; q, k, v and their gradients
(B, NH, T, HS); att, datt, dpreatt (B, NH, T, T); dout (B, T, C); HS = C / NH, scale = 1/sqrt(HS).
As in attention_forward version 4, preatt is the *unscaled* Q K^T and att = softmax_causal(scale *
preatt), so dpreatt (the gradient with respect to the unscaled scores) carries the factor scale.

Every version runs the same driver (llmcupy/ops/attention_backward.py) and differs only in the
softmax-backward kernel (step 5):
  1. permute: q, k, v (B, NH, T, HS) from inp (our op takes the packed qkv activations; llm.c's
     backward receives the forward's already permuted copy);
  2. unpermute-backward: dY (B, NH, T, HS) from dout (B, T, C), one thread per element;
  3. datt = dY V^T                      (strided-batched GEMM, llmcupy.runtime.blas)
  4. dV   = att^T dY                    (batched GEMM; reads all of att: its upper triangle must be 0)
  5. dpreatt[t, t3] = scale * att[t, t3] * (datt[t, t3] - sum_{t2<=t} att[t, t2] * datt[t, t2])
     for t3 <= t, the softmax Jacobian contracted with datt  (the versioned kernel below)
  6. dQ = dpreatt K,  dK = dpreatt^T Q  (batched GEMMs; read all of dpreatt: its upper triangle
     must be 0, so the driver zeroes a dpreatt buffer the first time it sees it: CuPy's pool
     hands back used memory, and no version writes above the diagonal afterwards)
  7. permute-backward: dinp (B, T, 3, NH, HS) from dQ, dK, dV, one thread per (b, h, t, d).
The dev file's GEMMs use beta = 1 and its permutes accumulate into zeroed buffers; ours overwrite
(beta = 0, plain stores) as the fp32 trainer does: the same result for freshly zeroed buffers.

Softmax-backward versions (same numbers as llm.c's dev/cuda/attention_backward.cu, whose header
lists only 1-5):

version 1: naive: one thread per column t3 looping over every (b, h), every row t >= t3 and an O(t)
           loop over t2 with the explicit indicator (t2 == t3). O(T^3) per head. llm.c launches it
           with gridDim.y = B*NH although the kernel ignores blockIdx.y, so every y-slice redoes
           the whole tensor with identical writes; ours launches gridDim.y = 1 (same result, B*NH
           times less redundant work).
version 2: as version 1, but (b, h) comes from blockIdx.y: one thread per (t3, b*h). Threads with
           a small t3 walk almost every row: heavy imbalance.
version 3: one warp per (t3, b*h): lanes stride over t2 (coalesced), att[t, t3] hoisted out of the
           t2 loop, a cg::reduce sum per row, lane 0 stores.
version 4: one warp per 8 consecutive columns: every att[t, t2], datt[t, t2] loaded feeds 8
           register accumulators; 8 warp reductions per row; lanes 0..7 store. llm.c reads
           att[t, t3+k] and stores (zeros) for t3+k > t, which relies on att being zero above the
           diagonal and reads/writes past the row when T % 8 != 0; ours loads 0 and skips the store
           there.
version 5: branch-light version 4: att[t, t3+k] read at the clamped column min(t, t3+k);
           p = att*datt formed once per t2; the t2 loop is split into t2 < t3 (indicator 0), the
           one lane-stride step where the diagonal t2 == t3+k can occur (UNROLL <= 32), and the
           rest (indicator 0 again); stores guarded by t >= t3+k.
version 6: one block per row t (grid (T, B*NH)), BlockSize a template parameter (32..1024): threads
           own the columns t3 in chunks of BlockSize; for every chunk the block stages att*datt of
           each t2 tile in shared memory (clamped index) and every thread scans the tile; the
           indicator is evaluated only on the diagonal tile. O(t^2) work per row: compute bound.
           llm.c stores every column of the last chunk, beyond t, which is correct only if att is
           zero above the diagonal and BlockSize divides T; ours stores only t3 <= t (and loads
           att[t, t3] only there), so any T works.
version 7: the closed form: one block reduction of s = sum_{t2<=t} att*datt (per-warp cg::reduce,
           one float per warp in shared memory, cg::reduce again), then
           dpreatt[t3] = scale*att[t3]*(datt[t3] - s) for t3 <= t; scale from the host. O(t) per
           row, memory bound. llm.c's warp 0 zeroes the 32 shared slots with no barrier before the
           other warps write their partials (a race); here every warp writes its own slot, one
           barrier, and the second reduction reads only the slots that were written.
version 8: version 7 with 4 rows per block, blocks taking rows from the end (t0 = T-1-4*blockIdx.x)
           so the longest rows start first, and streaming __ldcs/__stcs in the final pass. llm.c
           reuses the shared slots for the next row without a barrier after the broadcast read (a
           race); here a barrier separates the rows. llm.c needs T % 4 == 0; ours launches
           ceil(T/4) blocks and skips rows t < 0 (a block-uniform test), so any T works.

Fastest per llm.c: version 8 (a few percent ahead of 7); it is the trainer's kernel (256 threads).
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------------------------
// driver kernels shared by every version: one thread per element of (B, NH, T, HS)

// q, k, v (each (B, NH, T, HS)) gathered from the packed inp (B, T, 3, NH, HS).
__global__ void attention_backward_permute_kernel(float* q, float* k, float* v, const float* inp,
                                                  int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * HS) {
        int C = NH * HS;
        int d = idx % HS;
        int t = (idx / HS) % T;
        int h = (idx / (HS * T)) % NH;
        int b = idx / (HS * T * NH);
        size_t src = (size_t)(b * T + t) * 3 * C + h * HS + d;
        q[idx] = inp[src];
        k[idx] = inp[src + C];
        v[idx] = inp[src + 2 * C];
    }
}

// dY (B, NH, T, HS) from dout (B, T, NH, HS): the backward of the forward's unpermute.
__global__ void attention_backward_unpermute_kernel(float* dy, const float* dout, int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * HS) {
        int d = idx % HS;
        int t = (idx / HS) % T;
        int h = (idx / (HS * T)) % NH;
        int b = idx / (HS * T * NH);
        dy[idx] = dout[(size_t)(b * T + t) * NH * HS + h * HS + d];
    }
}

// dinp (B, T, 3, NH, HS) from dq, dk, dv (each (B, NH, T, HS)): the backward of the permute.
// Every element of dinp is written exactly once, so plain stores overwrite it (no zeroing needed).
__global__ void attention_backward_permute_backward_kernel(float* dinp, const float* dq, const float* dk,
                                                           const float* dv, int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * HS) {
        int C = NH * HS;
        int d = idx % HS;
        int t = (idx / HS) % T;
        int h = (idx / (HS * T)) % NH;
        int b = idx / (HS * T * NH);
        size_t dst = (size_t)(b * T + t) * 3 * C + h * HS + d;
        dinp[dst] = dq[idx];
        dinp[dst + C] = dk[idx];
        dinp[dst + 2 * C] = dv[idx];
    }
}

// ----------------------------------------------------------------------------------------------
// version 1: one thread per column t3, looping over every (b, h) itself

__global__ void softmax_autoregressive_backward_kernel1(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, int HS) {
    int t3 = blockIdx.x * blockDim.x + threadIdx.x;
    float scale = 1.0f / sqrtf((float)HS);
    if (t3 < T) {
        for (int bh = 0; bh < B * NH; bh++) {
            for (int t = t3; t < T; t++) {
                size_t row = ((size_t)bh * T + t) * T;
                float result = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float indicator = t2 == t3 ? 1.0f : 0.0f;
                    float local_derivative = att[row + t2] * (indicator - att[row + t3]);
                    result += local_derivative * datt[row + t2];
                }
                dpreatt[row + t3] = scale * result;
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one thread per (t3, b*h); (b, h) from blockIdx.y

__global__ void softmax_autoregressive_backward_kernel2(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, int HS) {
    int t3 = blockIdx.x * blockDim.x + threadIdx.x;
    int bh = blockIdx.y;
    float scale = 1.0f / sqrtf((float)HS);
    if (t3 < T) {
        for (int t = t3; t < T; t++) {
            size_t row = ((size_t)bh * T + t) * T;
            float result = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) {
                float indicator = t2 == t3 ? 1.0f : 0.0f;
                float local_derivative = att[row + t2] * (indicator - att[row + t3]);
                result += local_derivative * datt[row + t2];
            }
            dpreatt[row + t3] = scale * result;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: one warp per (t3, b*h), lanes stride over t2

__global__ void softmax_autoregressive_backward_kernel3(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, int HS) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int t3 = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();  // the same for the whole warp
    int bh = blockIdx.y;
    float scale = 1.0f / sqrtf((float)HS);
    // warps past the last column do no row at all: no collective is left half-attended
    for (int t = t3; t < T; t++) {
        size_t row = ((size_t)bh * T + t) * T;
        float att_t3 = att[row + t3];  // hoisted: the same for every t2
        float result = 0.0f;
        for (int t2 = warp.thread_rank(); t2 <= t; t2 += warp.size()) {
            float indicator = t2 == t3 ? 1.0f : 0.0f;
            result += att[row + t2] * (indicator - att_t3) * datt[row + t2];
        }
        result = cg::reduce(warp, result, cg::plus<float>());
        if (warp.thread_rank() == 0) {
            dpreatt[row + t3] = scale * result;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: one warp per 8 consecutive columns, 8 register accumulators

#define ATTBWD_UNROLL 8

__global__ void softmax_autoregressive_backward_kernel4(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, int HS) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int t3 = ATTBWD_UNROLL * (blockIdx.x * warp.meta_group_size() + warp.meta_group_rank());
    int bh = blockIdx.y;
    float scale = 1.0f / sqrtf((float)HS);
    for (int t = t3; t < T; t++) {
        size_t row = ((size_t)bh * T + t) * T;
        float att_t3[ATTBWD_UNROLL];
        float result[ATTBWD_UNROLL];
        #pragma unroll
        for (int k = 0; k < ATTBWD_UNROLL; k++) {
            // columns past the diagonal contribute nothing: load 0 rather than rely on att's
            // upper triangle (and on t3 + k < T)
            att_t3[k] = t3 + k <= t ? att[row + t3 + k] : 0.0f;
            result[k] = 0.0f;
        }
        for (int t2 = warp.thread_rank(); t2 <= t; t2 += warp.size()) {
            float a = att[row + t2];
            float da = datt[row + t2];
            #pragma unroll
            for (int k = 0; k < ATTBWD_UNROLL; k++) {
                float indicator = t2 == t3 + k ? 1.0f : 0.0f;
                result[k] += a * (indicator - att_t3[k]) * da;
            }
        }
        float mine = 0.0f;  // lane k keeps column t3 + k
        #pragma unroll
        for (int k = 0; k < ATTBWD_UNROLL; k++) {
            float total = cg::reduce(warp, result[k], cg::plus<float>());
            if (warp.thread_rank() == k) mine = total;
        }
        int k = warp.thread_rank();
        if (k < ATTBWD_UNROLL && t3 + k <= t) {
            dpreatt[row + t3 + k] = scale * mine;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: version 4 without branches in the hot loop

__global__ void softmax_autoregressive_backward_kernel5(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, int HS) {
    static_assert(ATTBWD_UNROLL <= 32, "the diagonal must fall inside a single lane-stride step");
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int t3 = ATTBWD_UNROLL * (blockIdx.x * warp.meta_group_size() + warp.meta_group_rank());
    int bh = blockIdx.y;
    float scale = 1.0f / sqrtf((float)HS);
    for (int t = t3; t < T; t++) {
        size_t row = ((size_t)bh * T + t) * T;
        const float* att_row = att + row;
        const float* datt_row = datt + row;
        float att_t3[ATTBWD_UNROLL];
        float result[ATTBWD_UNROLL];
        #pragma unroll
        for (int k = 0; k < ATTBWD_UNROLL; k++) {
            // clamped column: always a legal load; a column past t is never stored
            att_t3[k] = att_row[min(t, t3 + k)];
            result[k] = 0.0f;
        }
        int t2 = warp.thread_rank();
        // part 1: t2 < t3 <= t3 + k, the indicator is always 0
        for (; t2 < t3; t2 += warp.size()) {
            float p = att_row[t2] * datt_row[t2];
            #pragma unroll
            for (int k = 0; k < ATTBWD_UNROLL; k++) result[k] -= p * att_t3[k];
        }
        // part 2: now t3 <= t2 < t3 + 32, so every diagonal t2 == t3 + k (k < 32) is in this step
        if (t2 <= t) {
            float p = att_row[t2] * datt_row[t2];
            #pragma unroll
            for (int k = 0; k < ATTBWD_UNROLL; k++) {
                float indicator = t2 == t3 + k ? 1.0f : 0.0f;
                result[k] += p * (indicator - att_t3[k]);
            }
            t2 += warp.size();
        }
        // part 3: t2 >= t3 + 32 > t3 + k, the indicator is 0 again
        for (; t2 <= t; t2 += warp.size()) {
            float p = att_row[t2] * datt_row[t2];
            #pragma unroll
            for (int k = 0; k < ATTBWD_UNROLL; k++) result[k] -= p * att_t3[k];
        }
        float mine = 0.0f;
        #pragma unroll
        for (int k = 0; k < ATTBWD_UNROLL; k++) {
            float total = cg::reduce(warp, result[k], cg::plus<float>());
            if (warp.thread_rank() == k) mine = total;
        }
        int k = warp.thread_rank();
        if (k < ATTBWD_UNROLL && t >= t3 + k) {
            dpreatt[row + t3 + k] = scale * mine;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 6: one block per row, att*datt staged tile by tile in shared memory

template <int BlockSize>
__global__ void softmax_autoregressive_backward_kernel6(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, int HS) {
    __shared__ float p_tile[BlockSize];  // att*datt of the current t2 tile
    int t = blockIdx.x;
    int bh = blockIdx.y;
    int tid = threadIdx.x;
    size_t row = ((size_t)bh * T + t) * T;
    const float* att_row = att + row;
    const float* datt_row = datt + row;
    float scale = 1.0f / sqrtf((float)HS);

    // every loop bound below depends on t only: all threads of the block take every barrier
    int chunks = t / BlockSize + 1;  // ceil((t + 1) / BlockSize)
    for (int chunk = 0; chunk < chunks; chunk++) {
        int t3 = chunk * BlockSize + tid;
        float att_t3 = t3 <= t ? att_row[t3] : 0.0f;
        float acc = 0.0f;
        for (int tile = 0; tile <= t; tile += BlockSize) {
            int n = min(BlockSize, t + 1 - tile);
            __syncthreads();  // everyone is done with the previous tile
            int t2 = min(t, tile + tid);  // clamped: the slots past t are never read
            p_tile[tid] = att_row[t2] * datt_row[t2];
            __syncthreads();
            if (tile == chunk * BlockSize) {
                // the diagonal tile: the only one where t2 == t3 can happen
                for (int i = 0; i < n; i++) {
                    float indicator = tile + i == t3 ? 1.0f : 0.0f;
                    acc += p_tile[i] * (indicator - att_t3);
                }
            } else {
                for (int i = 0; i < n; i++) {
                    acc -= p_tile[i] * att_t3;
                }
            }
        }
        if (t3 <= t) {
            dpreatt[row + t3] = scale * acc;
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 7: closed form, one block per row

// Sum of `val` over the block, returned to every thread. `slots` holds one float per warp (at most
// 32). The caller must put a barrier between two calls that reuse the same slots.
__device__ __forceinline__ float attbwd_block_sum(float val, float* slots, const cg::thread_block_tile<32>& warp) {
    val = cg::reduce(warp, val, cg::plus<float>());
    if (warp.thread_rank() == 0) slots[warp.meta_group_rank()] = val;
    __syncthreads();
    // only the slots of existing warps were written: read those, never a stale or poisoned slot
    float partial = warp.thread_rank() < warp.meta_group_size() ? slots[warp.thread_rank()] : 0.0f;
    return cg::reduce(warp, partial, cg::plus<float>());
}

__global__ void softmax_autoregressive_backward_kernel7(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, float scale) {
    __shared__ float warp_sums[32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int t = blockIdx.x;
    int bh = blockIdx.y;
    size_t row = ((size_t)bh * T + t) * T;
    const float* att_row = att + row;
    const float* datt_row = datt + row;

    float local = 0.0f;
    for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        local += att_row[t2] * datt_row[t2];
    }
    float s = attbwd_block_sum(local, warp_sums, warp);

    for (int t3 = threadIdx.x; t3 <= t; t3 += blockDim.x) {
        dpreatt[row + t3] = scale * att_row[t3] * (datt_row[t3] - s);
    }
}

// ----------------------------------------------------------------------------------------------
// version 8: version 7 with 4 rows per block, longest rows first, streaming final pass

#define ATTBWD_ROWS_PER_BLOCK 4

__global__ void softmax_autoregressive_backward_kernel8(float* dpreatt, const float* datt, const float* att,
                                                        int B, int T, int NH, float scale) {
    __shared__ float warp_sums[32];
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int t0 = T - 1 - ATTBWD_ROWS_PER_BLOCK * blockIdx.x;
    int bh = blockIdx.y;

    for (int r = 0; r < ATTBWD_ROWS_PER_BLOCK; r++) {
        int t = t0 - r;
        if (t < 0) break;  // only in the last block when T % 4 != 0; the same for the whole block
        size_t row = ((size_t)bh * T + t) * T;
        const float* att_row = att + row;
        const float* datt_row = datt + row;

        float local = 0.0f;
        for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
            local += att_row[t2] * datt_row[t2];
        }
        float s = attbwd_block_sum(local, warp_sums, warp);
        __syncthreads();  // every warp has read the slots before the next row overwrites them

        // att and datt are not read again by this kernel, dpreatt not written again: stream them
        for (int t3 = threadIdx.x; t3 <= t; t3 += blockDim.x) {
            __stcs(dpreatt + row + t3, scale * __ldcs(att_row + t3) * (__ldcs(datt_row + t3) - s));
        }
    }
}
