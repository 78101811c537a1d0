/*
flash_attention: causal multi-head self-attention, FP32, without the (B, NH, T, T) matrices.
inp (B, T, 3C) = (B, T, 3, NH, HS) is the packed QKV projection; HS = C / NH, scale = 1 / sqrt(HS).
For every (b, h) and query row i: out_i = sum_{j <= i} P_ij v_j, P_ij = exp(s_ij - lse_i),
s_ij = scale * <q_i, k_j>, lse_i = log sum_{j <= i} exp(s_ij). Two ops share this file:

op flash_attention_forward (out, lse from inp)
version 1: FlashAttention's online softmax in SIMT FP32. One thread per query row, FA_BR = 64 rows
           (threads) per block, grid (ceil(T / 64), B * NH), query tiles longest-first (the last
           rows see the most keys). The thread keeps its q row (pre-scaled) and its output row in
           registers; the block walks the keys 0 .. min(T, i0 + 64) - 1 in tiles of FA_BC = 32 keys
           staged in shared memory (K and V tiles, 2 x 32 x HSMAX floats). Per tile a thread
           computes its <= 32 scores into registers, takes their max, rescales its running sum and
           output once (exp(m_old - m_new)) and accumulates exp(s - m) v. Every thread reads the
           same K/V element at the same time, so the shared loads are broadcasts (no bank
           conflicts) and each 32-key tile costs 2 * 32 * HS FMAs per thread against two global
           tile loads per block. Keys past a row's diagonal are skipped per thread; tiles wholly
           above the block's last row are never loaded. Reads q, k, v straight from the packed
           input and writes out in (B, T, C): no permute, no unpermute, no (B, NH, T, T) buffer.
           Writes lse = m + log(l) per row (B, NH, T) for the backward.
           HS is handled up to a compile-time bound HSMAX (template: 16, 32 or 64, the smallest
           that fits; GPT-2's heads are 64 wide at every size. 128 would need the register
           arrays split across two threads per row); q and K/V rows are zero-padded to HSMAX, so the padding adds
           nothing to a dot product and the inner loops are fully unrolled without guards.
           Registers: q and o (2 x HSMAX) and 32 scores, ~170 at HSMAX = 64 on sm_90 (NVRTC 12.9;
           ~250 on sm_80), hence 64-thread blocks (__launch_bounds__(64)): the registers let an
           SM hold 6 of them (4 on sm_80), so T = 1024, B * NH = 48 (768 blocks) is about one wave
           on 132 SMs, with 12 warps per SM (19% occupancy) to hide memory latency.
           Not done yet (next rungs): float4 tile loads, two rows per thread, cp.async double
           buffering of the K/V tiles as in matmul_forward version 5.

op flash_attention_backward (dinp from dout, inp, out, lse): FlashAttention-2's backward, the
scores recomputed from q, k and lse (P_ij = exp(s_ij - lse_i)), in two kernels:
version 1: (a) flash_attention_backward_dq_kernel1: one thread per query row (64 per block), as the
           forward: D_i = <dout_i, out_i> (stored for (b)), then over K/V tiles in shared memory
           dP_ij = <dout_i, v_j>, dS_ij = P_ij (dP_ij - D_i), dq_i += dS_ij k_j; writes
           dinp's q part = scale * dq. Registers: q, dout, dq (3 x HSMAX; ptxas spills ~80 bytes
           at HSMAX = 64 on sm_80).
           (b) flash_attention_backward_dkv_kernel1: one thread per key row j (64 per block); the
           block walks the query tiles from its first key to T (causality: only i >= j), Q and
           dout tiles and their lse and D in shared memory (broadcast reads);
           dv_j += P_ij dout_i, dk_j += dS_ij q_i (q pre-scaled, so dk needs no further scale);
           writes dinp's k and v parts. dk and dv stay in registers; the thread's own k and v rows
           sit in shared memory padded to HSMAX + 1 floats (a row per thread: the padding spreads
           the 32 rows of a warp over the 32 banks), which keeps it within 255 registers at
           HSMAX = 64 without spills; query tiles are 16 rows (FA_BCQ) so that everything fits
           the 48 KiB of static shared memory.
           Every element of dinp is written exactly once (no accumulation, no atomics): the
           backward is deterministic. Nothing of size T x T is read or written.

Activation memory (the trainer): the classic versions keep att (B, NH, T, T) per layer plus
preatt/datt/dpreatt scratch; flash keeps lse (B, NH, T) per layer. See README (flash attention).
*/

#include "common.cuh"

#define FA_BR 64  // query (forward, dq) or key (dk/dv) rows per block: one per thread
#define FA_BC 32   // keys per shared-memory tile (forward, dq)
#define FA_BCQ 16  // queries per shared-memory tile (dk/dv: its k and v rows take the rest of the 48 KiB)

// Keys j0 .. j0 + FA_BC - 1 of one (b, h) into shared memory, k and v rows side by side (the forward
// and the dq kernel walk the same key tiles). base points at (b, t = 0, q part, head h) of the packed
// QKV, C3 = 3C apart per position; entries past T or HS are zeros, so the tile loops need no bounds.
template <int HSMAX>
__device__ __forceinline__ void fa_load_kv_tile(float (*k_s)[HSMAX], float (*v_s)[HSMAX], const float* base, int j0,
                                                int T, int C, int HS) {
    for (int e = threadIdx.x; e < FA_BC * HSMAX; e += FA_BR) {
        int jj = e / HSMAX, d = e % HSMAX, j = j0 + jj;
        bool in = j < T && d < HS;
        k_s[jj][d] = in ? base[(size_t)j * 3 * C + C + d] : 0.0f;
        v_s[jj][d] = in ? base[(size_t)j * 3 * C + 2 * C + d] : 0.0f;
    }
}

// ----------------------------------------------------------------------------------------------
// op flash_attention_forward, version 1

template <int HSMAX>
__global__ void __launch_bounds__(FA_BR) flash_attention_forward_kernel1(float* out, float* lse, const float* inp,
                                                                          int B, int T, int NH, int HS, float scale) {
    __shared__ float k_s[FA_BC][HSMAX];
    __shared__ float v_s[FA_BC][HSMAX];
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * FA_BR;  // longest rows first
    const int i = i0 + threadIdx.x;
    const bool active = i < T;
    const float* base = inp + (size_t)b * T * C3 + h * HS;

    float q[HSMAX], o[HSMAX];
    for (int d = 0; d < HSMAX; d++) {
        q[d] = (active && d < HS) ? base[(size_t)i * C3 + d] * scale : 0.0f;
        o[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    const int keys = min(T, i0 + FA_BR);  // the block's last row sees keys 0 .. keys - 1
    for (int j0 = 0; j0 < keys; j0 += FA_BC) {
        __syncthreads();  // every thread is done with the previous tile
        fa_load_kv_tile<HSMAX>(k_s, v_s, base, j0, T, C, HS);
        __syncthreads();
        const int n = active ? min(FA_BC, i - j0 + 1) : 0;  // keys j0 .. i of this tile
        if (n <= 0) continue;
        float s[FA_BC];
        float m_new = m;
        for (int jj = 0; jj < FA_BC; jj++) {
            float dot = 0.0f;
            if (jj < n) {
                for (int d = 0; d < HSMAX; d++) dot = fmaf(q[d], k_s[jj][d], dot);
                m_new = fmaxf(m_new, dot);
            }
            s[jj] = dot;
        }
        const float corr = expf(m - m_new);  // m = -inf on the first tile: corr = 0, l and o are 0
        l *= corr;
        for (int d = 0; d < HSMAX; d++) o[d] *= corr;
        for (int jj = 0; jj < FA_BC; jj++) {
            if (jj < n) {
                float p = expf(s[jj] - m_new);
                l += p;
                for (int d = 0; d < HSMAX; d++) o[d] = fmaf(p, v_s[jj][d], o[d]);
            }
        }
        m = m_new;
    }
    if (active) {
        const float inv = 1.0f / l;  // l >= 1: the row's max term contributes exp(0)
        float* out_row = out + ((size_t)b * T + i) * C + h * HS;
        for (int d = 0; d < HSMAX; d++)
            if (d < HS) out_row[d] = o[d] * inv;
        lse[(size_t)bh * T + i] = m + logf(l);
    }
}

// ----------------------------------------------------------------------------------------------
// op flash_attention_backward, version 1: (a) dq and D, (b) dk and dv

template <int HSMAX>
__global__ void __launch_bounds__(FA_BR) flash_attention_backward_dq_kernel1(float* dinp, float* Dbuf,
                                                                              const float* dout, const float* inp,
                                                                              const float* out, const float* lse,
                                                                              int B, int T, int NH, int HS,
                                                                              float scale) {
    __shared__ float k_s[FA_BC][HSMAX];
    __shared__ float v_s[FA_BC][HSMAX];
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * FA_BR;
    const int i = i0 + threadIdx.x;
    const bool active = i < T;
    const float* base = inp + (size_t)b * T * C3 + h * HS;
    const size_t row = ((size_t)b * T + i) * C + h * HS;  // (B, T, C) offset of (b, i, head h)

    float q[HSMAX], g[HSMAX], dq[HSMAX];
    float D = 0.0f;
    for (int d = 0; d < HSMAX; d++) {
        bool in = active && d < HS;
        q[d] = in ? base[(size_t)i * C3 + d] * scale : 0.0f;
        g[d] = in ? dout[row + d] : 0.0f;
        D = fmaf(g[d], in ? out[row + d] : 0.0f, D);
        dq[d] = 0.0f;
    }
    const float L = active ? lse[(size_t)bh * T + i] : 0.0f;
    if (active) Dbuf[(size_t)bh * T + i] = D;

    const int keys = min(T, i0 + FA_BR);
    for (int j0 = 0; j0 < keys; j0 += FA_BC) {
        __syncthreads();
        fa_load_kv_tile<HSMAX>(k_s, v_s, base, j0, T, C, HS);
        __syncthreads();
        const int n = active ? min(FA_BC, i - j0 + 1) : 0;
        for (int jj = 0; jj < n; jj++) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < HSMAX; d++) {
                s = fmaf(q[d], k_s[jj][d], s);
                dp = fmaf(g[d], v_s[jj][d], dp);
            }
            const float ds = expf(s - L) * (dp - D);
            for (int d = 0; d < HSMAX; d++) dq[d] = fmaf(ds, k_s[jj][d], dq[d]);
        }
    }
    if (active) {
        for (int d = 0; d < HSMAX; d++)
            if (d < HS) dinp[((size_t)b * T + i) * C3 + h * HS + d] = scale * dq[d];
    }
}

template <int HSMAX>
__global__ void __launch_bounds__(FA_BR) flash_attention_backward_dkv_kernel1(float* dinp, const float* dout,
                                                                               const float* inp, const float* lse,
                                                                               const float* Dbuf, int B, int T,
                                                                               int NH, int HS, float scale) {
    // 2 x 16 x 64 + 2 x 64 x 65 floats = 41 KiB at HSMAX = 64 (static shared memory stops at 48 KiB)
    __shared__ float q_s[FA_BCQ][HSMAX];
    __shared__ float g_s[FA_BCQ][HSMAX];
    __shared__ float l_s[FA_BCQ];
    __shared__ float d_s[FA_BCQ];
    __shared__ float k_own[FA_BR][HSMAX + 1];  // a row per thread, padded: conflict-free across a warp
    __shared__ float v_own[FA_BR][HSMAX + 1];
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int C = NH * HS, C3 = 3 * C;
    const int j0 = blockIdx.x * FA_BR;
    const int j = j0 + threadIdx.x;
    const bool active = j < T;
    const float* base = inp + (size_t)b * T * C3 + h * HS;

    float dk[HSMAX], dv[HSMAX];
    for (int d = 0; d < HSMAX; d++) {
        bool in = active && d < HS;
        k_own[threadIdx.x][d] = in ? base[(size_t)j * C3 + C + d] : 0.0f;
        v_own[threadIdx.x][d] = in ? base[(size_t)j * C3 + 2 * C + d] : 0.0f;
        dk[d] = 0.0f;
        dv[d] = 0.0f;
    }

    for (int i0 = j0; i0 < T; i0 += FA_BCQ) {  // queries before the block's first key never see it
        __syncthreads();
        for (int e = threadIdx.x; e < FA_BCQ * HSMAX; e += FA_BR) {
            int ii = e / HSMAX, d = e % HSMAX, i = i0 + ii;
            bool in = i < T && d < HS;
            q_s[ii][d] = in ? base[(size_t)i * C3 + d] * scale : 0.0f;
            g_s[ii][d] = in ? dout[((size_t)b * T + i) * C + h * HS + d] : 0.0f;
        }
        for (int ii = threadIdx.x; ii < FA_BCQ; ii += FA_BR) {
            int i = i0 + ii;
            l_s[ii] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
            d_s[ii] = i < T ? Dbuf[(size_t)bh * T + i] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        const int first = max(0, j - i0);              // causal: queries i >= j
        const int last = min(FA_BCQ, T - i0);          // queries past T are padding
        for (int ii = first; ii < last; ii++) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < HSMAX; d++) {
                s = fmaf(q_s[ii][d], k_own[threadIdx.x][d], s);
                dp = fmaf(g_s[ii][d], v_own[threadIdx.x][d], dp);
            }
            const float p = expf(s - l_s[ii]);
            const float ds = p * (dp - d_s[ii]);
            for (int d = 0; d < HSMAX; d++) {
                dv[d] = fmaf(p, g_s[ii][d], dv[d]);
                dk[d] = fmaf(ds, q_s[ii][d], dk[d]);  // q_s is pre-scaled: dk = scale * sum ds q
            }
        }
    }
    if (active) {
        float* row = dinp + ((size_t)b * T + j) * C3 + h * HS;
        for (int d = 0; d < HSMAX; d++) {
            if (d < HS) {
                row[C + d] = dk[d];
                row[2 * C + d] = dv[d];
            }
        }
    }
}
