/*
encoder_backward: gradients of the token and position tables, ACCUMULATED into them:
    for every token (b, t):  dwte[inp[b, t], :] += dout[b, t, :]   and   dwpe[t, :] += dout[b, t, :]
dout is (B, T, C), inp (B, T) int32 ids in [0, V) (checked by the Python launcher), dwte (V, C),
dwpe (maxT, C) with maxT >= T. The caller zeroes the gradients at the start of a step.

Versions (same numbers as llm.c's dev/cuda/encoder_backward.cu; llm.c's header calls these
"forward pass" kernels by a copy-paste slip):

version 1: one thread per element of dout (B*T*C threads) and two fp32 atomicAdds, one into the
           token's dwte row and one into the position's dwpe row. In dwpe the B rows of a
           position collide on every element; in dwte only repeated tokens collide. The order of
           the additions, hence the last bits of the result, is not deterministic.
version 2: one thread per channel c (only C threads): each walks all B*T tokens in order with a
           plain read-modify-write of dwte[id, c] and dwpe[t, c]. A thread owns its column, so
           there is no race and the result is deterministic, but there is little parallelism.

Row offsets are computed in size_t. Fastest: version 1 (llm.c's FP32 trainer's choice, block 256).
llmcupy's default is version 2: deterministic, so two training runs print the same losses.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: one thread per (b, t, c), atomic scatter

__global__ void encoder_backward_kernel1(float* dwte, float* dwpe, const float* dout, const int* inp,
                                         int B, int T, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * T * C) {
        int bt = idx / C;
        int t = bt % T;
        int c = idx % C;
        int ix = inp[bt];
        float d = dout[idx];
        atomicAdd(dwte + (size_t)ix * C + c, d);
        atomicAdd(dwpe + (size_t)t * C + c, d);
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one thread per channel, serial over the tokens, no atomics

__global__ void encoder_backward_kernel2(float* dwte, float* dwpe, const float* dout, const int* inp,
                                         int B, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) {
        for (int bt = 0; bt < B * T; bt++) {
            int t = bt % T;
            int ix = inp[bt];
            float d = dout[(size_t)bt * C + c];
            dwte[(size_t)ix * C + c] += d;  // column c is touched by this thread only
            dwpe[(size_t)t * C + c] += d;
        }
    }
}
