/*
permute: pure data-movement kernels. llm.c's dev/cuda/permute.cu is a teaching example that
reorders a 4-D tensor; the attention code path of the FP32 trainer uses four specialised
permutes with the same structure. All five live in this file, one op each, one version each
(llm.c has a single kernel per layout, so each is "version 1"). Every kernel is an exact copy:
one thread per element, 32-bit indices, no shared memory.

op permute (llm.c's demo kernel):
version 1: out[i4, i3, i1, i2] = inp[i1, i2, i3, i4], i.e. (d1, d2, d3, d4) -> (d4, d3, d1, d2).
           Threads enumerate the INPUT order: reads coalesce, consecutive threads (consecutive i4)
           write d3*d1*d2 floats apart. llm.c launches it with 256 threads only; any block size
           works here.

Attention layouts (B batch, T time, NH heads, HS = C / NH head size). The QKV projection writes
inp as (B, T, 3, NH, HS) = (B, T, 3C); attention works on q, k, v as (B, NH, T, HS) each.

op attention_permute:
version 1: (B, T, 3, NH, HS) -> three (B, NH, T, HS) tensors q, k, v (the trainer stores them
           back to back in `qkvr`). Threads enumerate the OUTPUT order, so the writes coalesce;
           each thread reads its q, k and v elements at offsets 0, NH*HS, 2*NH*HS of the packed
           row with streaming loads (the input is not read again), in runs of HS.
op attention_unpermute:
version 1: (B, NH, T, HS) -> (B, T, NH, HS) = (B, T, C), the attention output back in row order.
           Threads enumerate the INPUT order (streaming loads); writes come in runs of HS.
op attention_unpermute_backward:
version 1: the inverse of unpermute: dinp (B, NH, T, HS) gathered from dout (B, T, C). Threads
           enumerate dinp's order, so its writes coalesce.
op attention_permute_backward:
version 1: the inverse of permute: dq, dk, dv (B, NH, T, HS) read coalesced, written with plain
           stores into the (B, T, 3, NH, HS) gradient. Like the trainer (and unlike llm.c's dev
           attention_backward.cu, which accumulates), both backward kernels ASSIGN their result.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// op permute, version 1: the 4-D demo, one thread per input element

__global__ void permute_kernel1(float* out, const float* inp, int d1, int d2, int d3, int d4) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < d1 * d2 * d3 * d4) {
        // decompose the linear input index, innermost axis first
        int i4 = idx % d4;
        int i3 = (idx / d4) % d3;
        int i2 = (idx / (d3 * d4)) % d2;
        int i1 = idx / (d2 * d3 * d4);
        // output shape (d4, d3, d1, d2): consecutive threads land d3*d1*d2 floats apart
        out[((i4 * d3 + i3) * d1 + i1) * d2 + i2] = inp[idx];
    }
}

// ----------------------------------------------------------------------------------------------
// op attention_permute, version 1: (B, T, 3, NH, HS) -> q, k, v (B, NH, T, HS), one thread per
// output element of one of the three tensors

__global__ void attention_permute_kernel1(float* q, float* k, float* v, const float* inp,
                                          int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * HS) {
        int d = idx % HS;
        int t = (idx / HS) % T;
        int h = (idx / (HS * T)) % NH;
        int b = idx / (HS * T * NH);
        int C = NH * HS;
        // the query of (b, t, h) in the packed row; key and value are C and 2C further
        int src = (b * T + t) * 3 * C + h * HS + d;
        q[idx] = __ldcs(inp + src);
        k[idx] = __ldcs(inp + src + C);
        v[idx] = __ldcs(inp + src + 2 * C);
    }
}

// ----------------------------------------------------------------------------------------------
// op attention_unpermute, version 1: (B, NH, T, HS) -> (B, T, NH, HS), one thread per input element

__global__ void attention_unpermute_kernel1(float* out, const float* inp, int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * HS) {
        int d = idx % HS;
        int t = (idx / HS) % T;
        int h = (idx / (HS * T)) % NH;
        int b = idx / (HS * T * NH);
        out[((b * T + t) * NH + h) * HS + d] = __ldcs(inp + idx);
    }
}

// ----------------------------------------------------------------------------------------------
// op attention_unpermute_backward, version 1: dinp (B, NH, T, HS) <- dout (B, T, NH, HS), one
// thread per dinp element

__global__ void attention_unpermute_backward_kernel1(float* dinp, const float* dout,
                                                     int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * HS) {
        int d = idx % HS;
        int t = (idx / HS) % T;
        int h = (idx / (HS * T)) % NH;
        int b = idx / (HS * T * NH);
        dinp[idx] = dout[((b * T + t) * NH + h) * HS + d];
    }
}

// ----------------------------------------------------------------------------------------------
// op attention_permute_backward, version 1: dinp (B, T, 3, NH, HS) <- dq, dk, dv (B, NH, T, HS),
// one thread per element of dq (each moves one q, one k and one v gradient)

__global__ void attention_permute_backward_kernel1(float* dinp, const float* dq, const float* dk,
                                                   const float* dv, int B, int T, int NH, int HS) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < B * NH * T * HS) {
        int d = idx % HS;
        int t = (idx / HS) % T;
        int h = (idx / (HS * T)) % NH;
        int b = idx / (HS * T * NH);
        int C = NH * HS;
        int dst = (b * T + t) * 3 * C + h * HS + d;
        dinp[dst] = dq[idx];
        dinp[dst + C] = dk[idx];
        dinp[dst + 2 * C] = dv[idx];
    }
}
