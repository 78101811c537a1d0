/*
gelu_forward: GPT-2's tanh approximation of GELU, elementwise over N floats:
    out[i] = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),  x = inp[i].
In GPT-2 it is applied to the MLP's hidden activation (N = B*T*4C).

Versions (same numbers as llm.c's dev/cuda/gelu_forward.cu):

version 1: one thread per element, scalar load and store; grid = ceil(N / block).
version 2: one thread per 128-bit pack (a float4 in FP32): the input is read with a streaming
           (evict-first) 128-bit load, the output is written with a plain cacheable 128-bit store
           (the next op, the projection matmul, reads it). The guard tests only the pack's first
           index, so N must be a multiple of 4, and both pointers 16-byte aligned.

llm.c's dev file is bf16 (8 elements per pack); in FP32 the pack is 4 floats. The cube is computed
as 0.044715 * x * x * x, as in llm.c. tanh is computed from the exponential (common.cuh's
tanh_from_exp), not with llm.c's tanhf: under --use_fast_math NVRTC 12.8+ turns tanhf into the
tanh.approx.f32 instruction (relative error up to 2^-11), too coarse for the FP32 tolerance.
Fastest: version 2.
*/

#include "common.cuh"   // gelu_tanh: the formula, shared with the matmul's fused GELU epilogue

// ----------------------------------------------------------------------------------------------
// version 1: one thread per element

__global__ void gelu_forward_kernel1(float* out, const float* inp, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        out[i] = gelu_tanh(inp[i]);
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one thread per float4 pack

__global__ void gelu_forward_kernel2(float* out, const float* inp, int N) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i < N) {  // N % 4 == 0: the whole pack is in range
        float4 x = load128cs(inp + i);  // read once: evict first
        float4 y;
        y.x = gelu_tanh(x.x);
        y.y = gelu_tanh(x.y);
        y.z = gelu_tanh(x.z);
        y.w = gelu_tanh(x.w);
        store128(out + i, y);  // cacheable: the matmul that follows reads it
    }
}
