/*
encoder_forward: GPT-2's input embedding, token row plus position row:
    out[b, t, c] = wte[inp[b, t], c] + wpe[t, c]
inp holds int32 token ids in [0, V) (checked by the Python launcher, not here); wte is (V, C),
wpe is (maxT, C) with maxT >= T (only its first T rows are read); out is (B, T, C).

Versions (same numbers as llm.c's dev/cuda/encoder_forward.cu):

version 1: naive port of the CPU loop, one thread per token (b, t) walking its C channels.
           Neighbouring threads are C floats apart, so nothing coalesces.
version 2: one thread per output element over B*T*C; (b, t, c) recovered with div/mod, the token
           id re-read by every thread of the row. Coalesced along c.
version 3: one thread per 128-bit pack of 4 consecutive channels (a float4 in FP32): both table
           rows are read with streaming 128-bit loads, the output with a plain 128-bit store.
           The bounds check tests only the first element of the pack and a pack must not cross a
           row, so C must be a multiple of 4, and every pointer 16-byte aligned.

No shared memory, no shuffles, no atomics. Row offsets are computed in size_t (llm.c uses int,
which is fine at GPT-2 sizes but needlessly fragile). Fastest: version 3, the one the trainers use.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: one thread per token

__global__ void encoder_forward_kernel1(float* out, const int* inp, const float* wte, const float* wpe,
                                        int B, int T, int C) {
    int bt = blockIdx.x * blockDim.x + threadIdx.x;
    if (bt < B * T) {
        int t = bt % T;
        int ix = inp[bt];
        float* out_bt = out + (size_t)bt * C;
        const float* wte_ix = wte + (size_t)ix * C;
        const float* wpe_t = wpe + (size_t)t * C;
        for (int c = 0; c < C; c++) {
            out_bt[c] = wte_ix[c] + wpe_t[c];
        }
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one thread per output element

__global__ void encoder_forward_kernel2(float* out, const int* inp, const float* wte, const float* wpe,
                                        int B, int T, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * T * C) {
        int bt = idx / C;
        int t = bt % T;
        int c = idx % C;
        int ix = inp[bt];  // the same id is loaded by all C threads of the row (cached)
        out[idx] = wte[(size_t)ix * C + c] + wpe[(size_t)t * C + c];
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: one thread per float4 pack of channels

__global__ void encoder_forward_kernel3(float* out, const int* inp, const float* wte, const float* wpe,
                                        int B, int T, int C) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * 4;  // first element of the pack
    if (idx < B * T * C) {  // C % 4 == 0: the pack lies inside one row
        int bt = idx / C;
        int t = bt % T;
        int c = idx % C;
        int ix = inp[bt];
        float4 w = load128cs(wte + (size_t)ix * C + c);
        float4 p = load128cs(wpe + (size_t)t * C + c);
        float4 o;
        o.x = w.x + p.x;
        o.y = w.y + p.y;
        o.z = w.z + p.z;
        o.w = w.w + p.w;
        store128(out + idx, o);  // cacheable: layer 0's LayerNorm reads it next
    }
}
