/*
attention_forward: causal multi-head self-attention, forward, FP32.
inp (B, T, 3C) = (B, T, 3, NH, HS) is the QKV projection; HS = C / NH, scale = 1 / sqrt(HS).
For every (b, h): att = causal_softmax(scale * Q K^T) (T x T), y = att V (T x HS), and
out[b, t, h*HS + d] = y[b, h, t, d].

Versions (same numbers as llm.c's dev/cuda/attention_forward.cu):

version 1: naive, three kernels, all with the swept block size: (a) one thread per element of
           preatt (B, NH, T, T): an HS-long dot product read straight from the packed input, times
           scale, -inf above the diagonal; (b) one thread per (b, t, h) row: max, exp + float sum,
           normalise, att zero above the diagonal; (c) one thread per (b, t, h): out accumulated
           over t2 <= t directly in the (B, T, C) layout (no unpermute).
version 2: minimal FlashAttention-1: q, k, v permuted to (B, NH, T, HS); grid (B, NH), 32
           threads per block, tiles Br = Bc = 32 (one query row per thread); shared memory holds
           the Q, K, V tiles and the 32x32 score tile. Outer loop over key tiles, inner loop over
           query tiles; the running row max m, row sum l and the output O live in global memory
           and are read and rewritten at every step; every tile pair is visited (no skipping of
           the upper triangle), the causal mask is applied per element; __expf. Then unpermute.
           Changes from llm.c: m starts at -inf (llm.c "memsets" -10000 bytewise, which gives the
           float 0xF0F0F0F0 ~ -6e29 and works by accident) and O, l start at 0 explicitly; rows and
           columns past T are masked, so T need not be a multiple of 32; fully masked tile rows
           (score max -inf) contribute nothing instead of exp(-inf - -inf) = NaN; the result is
           unpermuted straight into out (llm.c unpermutes into scratch and copies). llm.c's v2
           produces no att; the op's output contract includes att (the backward needs it), so a
           second kernel materialises att from the saved statistics, att = exp(s - m) / l, the
           way FlashAttention's backward recomputes probabilities.
version 3: permute, cuBLAS (llmcupy.runtime.blas) strided-batched preatt = Q K^T (unscaled), an elementwise
           kernel that scales on/below the diagonal and writes -inf above it, a row softmax with the
           softmax_forward version 4 design (block of 256 per row of T, warp shuffles, separate
           shared slots for max and sum: llm.c's shared-slot race fixed), y = att V by cuBLAS,
           unpermute. The softmax is softmax_forward.cu's kernel 4, launched from there.
version 4: as version 3 without the scale kernel: preatt holds the UNSCALED Q K^T and the scale
           moves into a causal online softmax (llm.c's softmax_forward_kernel5, the one the FP32
           trainer uses): one warp per row (256-thread blocks, 8 rows each), query t = row % T,
           columns 0 .. 4*floor(t/4) - 1 read as float4 by all lanes, the 1-4 leftover columns by
           lanes 0-3; per-lane online max (on raw scores) and sum of exp(scale * (x - max)); warp
           max and sum with cg::reduce; the final pass recomputes the exponentials from preatt
           (streaming loads) and writes with streaming stores. Needs T % 4 == 0 (16-byte aligned
           rows). Changes from llm.c: the kernel also writes 0 to columns t2 > t (llm.c never
           writes them and relies on a freshly zeroed allocation, which CuPy's memory pool does
           not give, while the dense att V GEMM reads them); blocks visit rows last-first, as in
           the trainer, so the top of att is still in L2 when the att V GEMM starts.
version 5: llm.c's 16-bit version of 4 (builds BF16) - not available here.
version 6: version 5 without permute/unpermute, a timing-only point - not available here.
version 10: cuDNN flash attention (SDPA graph) - not available here.
(llm.c's header also lists a version 11 that its dispatcher never implemented.)

The permute and unpermute kernels of versions 1-4 are the attention layout kernels of
kernels_cu/permute.cu (ops attention_permute / attention_unpermute), launched from there.
Fastest FP32 version per llm.c: 4 (3 is about 20x faster than 1; 2 is about 3x slower than 1).
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------------------------
// version 1: three naive kernels on the packed input

// (a) preatt[b, h, t, t2] = scale * <q[b, t, h], k[b, t2, h]> for t2 <= t, -inf above
__global__ void attention_query_key_kernel1(float* preatt, const float* inp, int B, int T, int C, int NH) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * T) {
        int t2 = idx % T;
        int t = (idx / T) % T;
        int h = (idx / (T * T)) % NH;
        int b = idx / (T * T * NH);
        if (t2 > t) {
            preatt[idx] = -INFINITY;  // causal mask
        } else {
            int HS = C / NH;
            const float* q = inp + ((size_t)b * T + t) * 3 * C + h * HS;
            const float* k = inp + ((size_t)b * T + t2) * 3 * C + C + h * HS;
            float val = 0.0f;
            for (int i = 0; i < HS; i++) {
                val += q[i] * k[i];
            }
            preatt[idx] = val * (1.0f / sqrtf((float)HS));
        }
    }
}

// (b) one thread per (b, t, h), h fastest: softmax over t2 <= t, zeros above
__global__ void attention_softmax_kernel1(float* att, const float* preatt, int B, int T, int NH) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * T * NH) {
        int h = idx % NH;
        int t = (idx / NH) % T;
        int b = idx / (NH * T);
        const float* x = preatt + (((size_t)b * NH + h) * T + t) * T;
        float* y = att + (((size_t)b * NH + h) * T + t) * T;

        float maxval = -FLT_MAX;
        for (int t2 = 0; t2 <= t; t2++) {
            maxval = fmaxf(maxval, x[t2]);
        }
        float expsum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
            float e = expf(x[t2] - maxval);
            expsum += e;
            y[t2] = e;
        }
        float inv = expsum == 0.0f ? 0.0f : 1.0f / expsum;
        for (int t2 = 0; t2 < T; t2++) {
            y[t2] = t2 <= t ? y[t2] * inv : 0.0f;  // explicit zeros: att is read densely later
        }
    }
}

// (c) one thread per (b, t, h): out[b, t, h*HS:(h+1)*HS] = sum_{t2 <= t} att * v
__global__ void attention_value_kernel1(float* out, const float* att, const float* inp, int B, int T, int C, int NH) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * T * NH) {
        int h = idx % NH;
        int t = (idx / NH) % T;
        int b = idx / (NH * T);
        int HS = C / NH;
        float* y = out + ((size_t)b * T + t) * C + h * HS;
        const float* a = att + (((size_t)b * NH + h) * T + t) * T;
        for (int i = 0; i < HS; i++) {
            y[i] = 0.0f;
        }
        for (int t2 = 0; t2 <= t; t2++) {
            const float* v = inp + ((size_t)b * T + t2) * 3 * C + 2 * C + h * HS;
            float w = a[t2];
            for (int i = 0; i < HS; i++) {
                y[i] += w * v[i];
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: minimal FlashAttention-1 on permuted q, k, v (B, NH, T, HS)

// grid (B, NH), blockDim.x = Br = Bc = 32; dynamic shared memory (3 * 32 * HS + 32 * 32) floats.
// O (B, NH, T, HS) and l, m (B, NH, T) must hold 0, 0 and -inf on entry.
__global__ void attention_flash_kernel2(float* O, float* l, float* m, const float* Q, const float* K,
                                        const float* V, int T, int HS, float scale) {
    extern __shared__ float sram[];
    const int Br = blockDim.x;
    const int Bc = blockDim.x;
    int tx = threadIdx.x;
    size_t bh = (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    const float* q = Q + bh * T * HS;
    const float* k = K + bh * T * HS;
    const float* v = V + bh * T * HS;
    float* o = O + bh * T * HS;
    float* lrow = l + bh * T;
    float* mrow = m + bh * T;
    float* Qi = sram;            // Br x HS
    float* Kj = Qi + Br * HS;    // Bc x HS
    float* Vj = Kj + Bc * HS;    // Bc x HS
    float* S = Vj + Bc * HS;     // Br x Bc; each thread uses only its own row
    int Tc = CEIL_DIV(T, Bc);
    int Tr = CEIL_DIV(T, Br);

    for (int j = 0; j < Tc; j++) {
        // every thread loads one key row and one value row of the tile (zeros past T)
        int key = j * Bc + tx;
        for (int x = 0; x < HS; x++) {
            Kj[tx * HS + x] = key < T ? k[(size_t)key * HS + x] : 0.0f;
            Vj[tx * HS + x] = key < T ? v[(size_t)key * HS + x] : 0.0f;
        }
        __syncthreads();  // the whole K/V tile is in place

        for (int i = 0; i < Tr; i++) {
            int row = i * Br + tx;
            bool valid = row < T;  // threads past T stay for the barriers but compute nothing
            for (int x = 0; x < HS; x++) {
                Qi[tx * HS + x] = valid ? q[(size_t)row * HS + x] : 0.0f;
            }
            float row_m_prev = valid ? mrow[row] : -INFINITY;
            float row_l_prev = valid ? lrow[row] : 0.0f;

            // S = scale * Q_i K_j^T with the causal mask; row max
            float row_m = -INFINITY;
            for (int y = 0; y < Bc; y++) {
                int col = j * Bc + y;
                float s = -INFINITY;
                if (valid && col <= row) {  // col <= row < T: a real, unmasked key
                    s = 0.0f;
                    for (int x = 0; x < HS; x++) {
                        s += Qi[tx * HS + x] * Kj[y * HS + x];
                    }
                    s *= scale;
                }
                S[tx * Bc + y] = s;
                row_m = fmaxf(row_m, s);
            }
            // P = exp(S - row_m), row sum; masked entries are exactly 0 (and never NaN)
            float row_l = 0.0f;
            for (int y = 0; y < Bc; y++) {
                float s = S[tx * Bc + y];
                float p = s == -INFINITY ? 0.0f : __expf(s - row_m);
                S[tx * Bc + y] = p;
                row_l += p;
            }
            // merge with the running statistics
            float row_m_new = fmaxf(row_m_prev, row_m);
            float w_prev = row_m_prev == -INFINITY ? 0.0f : __expf(row_m_prev - row_m_new);
            float w_cur = row_m == -INFINITY ? 0.0f : __expf(row_m - row_m_new);
            float row_l_new = w_prev * row_l_prev + w_cur * row_l;
            if (valid) {  // key tile 0 always holds key 0 <= row, so row_l_new > 0 here
                float inv = 1.0f / row_l_new;
                for (int x = 0; x < HS; x++) {
                    float pv = 0.0f;
                    for (int y = 0; y < Bc; y++) {
                        pv += S[tx * Bc + y] * Vj[y * HS + x];
                    }
                    size_t at = (size_t)row * HS + x;
                    o[at] = inv * (w_prev * row_l_prev * o[at] + w_cur * pv);
                }
                mrow[row] = row_m_new;
                lrow[row] = row_l_new;
            }
        }
        __syncthreads();  // nobody still reads K/V tile j when tile j + 1 is loaded
    }
}

// att[bh, t, t2] = exp(scale * <q_t, k_t2> - m) / l for t2 <= t, 0 above: the probabilities
// rebuilt from the flash kernel's final row statistics. One thread per element of att.
__global__ void attention_att_from_stats_kernel2(float* att, const float* Q, const float* K, const float* l,
                                                 const float* m, int BNH, int T, int HS, float scale) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < BNH * T * T) {
        int t2 = idx % T;
        int row = idx / T;  // (b, h, t) flattened
        int t = row % T;
        int bh = row / T;
        float a = 0.0f;
        if (t2 <= t) {
            const float* q = Q + ((size_t)bh * T + t) * HS;
            const float* k = K + ((size_t)bh * T + t2) * HS;
            float s = 0.0f;
            for (int x = 0; x < HS; x++) {
                s += q[x] * k[x];
            }
            a = expf(s * scale - m[row]) / l[row];
        }
        att[idx] = a;
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: scale + mask the cuBLAS scores in place (the softmax is softmax_forward_kernel4)

__global__ void attention_scale_kernel3(float* preatt, float scale, int B, int NH, int T) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * T) {
        int t2 = idx % T;
        int t = (idx / T) % T;
        preatt[idx] = t2 > t ? -INFINITY : preatt[idx] * scale;
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: causal online softmax on unscaled scores, one warp per row (llm.c's
// softmax_forward_kernel5), float4 loads, zeros written above the diagonal

// N = B * NH * T rows of length T; T % 4 == 0 so every row starts 16-byte aligned.
__global__ void attention_softmax_kernel4(float* att, const float* preatt, float inv_temperature, int N, int T) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    // rows are handed out last-first (the trainer's order): the att V GEMM that follows starts
    // on the top rows, which are then the most recently written
    int row = (gridDim.x - blockIdx.x - 1) * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) return;  // the whole warp leaves together, before any collective
    int lane = warp.thread_rank();
    int t = row % T;  // query position: columns 0..t are live
    const float* x = preatt + (size_t)row * T;
    float* y = att + (size_t)row * T;

    // raw-score max and sum of exp(inv_temperature * (x - max)); scale > 0 so the max of the raw
    // scores is the max of the scaled ones. -FLT_MAX, not -inf: an idle lane's rescale must not
    // compute -inf - -inf.
    float maxval = -FLT_MAX;
    float sumval = 0.0f;
    int pos_by_4 = t / 4;  // full float4 groups strictly below column 4*floor(t/4)
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int i = lane; i < pos_by_4; i += 32) {
        float4 v = x4[i];
        float old_max = maxval;
        for (int u = 0; u < 4; u++) {
            maxval = fmaxf(maxval, float4_get(v, u));
        }
        sumval *= expf(inv_temperature * (old_max - maxval));
        for (int u = 0; u < 4; u++) {
            sumval += expf(inv_temperature * (float4_get(v, u) - maxval));
        }
    }
    // the 1 to 4 columns 4*pos_by_4 .. t go to lanes 0..3
    if (4 * pos_by_4 + lane <= t) {
        float v = x[4 * pos_by_4 + lane];
        float old_max = maxval;
        maxval = fmaxf(maxval, v);
        sumval *= expf(inv_temperature * (old_max - maxval));
        sumval += expf(inv_temperature * (v - maxval));
    }

    float global_max = cg::reduce(warp, maxval, cg::greater<float>());
    sumval *= expf(inv_temperature * (maxval - global_max));
    float sum = cg::reduce(warp, sumval, cg::plus<float>());
    float norm = 1.0f / sum;

    // recompute the exponentials rather than storing them in the first pass
    for (int i = lane; i <= t; i += 32) {
        float ev = expf(inv_temperature * (__ldcs(x + i) - global_max));
        __stcs(y + i, ev * norm);
    }
    for (int i = t + 1 + lane; i < T; i += 32) {
        __stcs(y + i, 0.0f);  // the causal zeros the dense att V GEMM reads
    }
}
