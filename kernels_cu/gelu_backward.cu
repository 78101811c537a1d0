/*
gelu_backward: gradient through GPT-2's tanh-approximated GELU, elementwise over N floats.
With k = sqrt(2/pi) and u = k * (x + 0.044715 x^3):
    local   = 0.5 * (1 + tanh(u)) + 0.5 * x * sech^2(u) * k * (1 + 3 * 0.044715 * x^2)
    dinp[i] = local * dout[i]            (overwritten, not accumulated)
sech^2(u) is 1 / cosh(u)^2: for large |u| coshf overflows to inf and the term becomes exactly 0,
which is the right limit. tanh(u) is computed from the exponential (common.cuh's tanh_from_exp), not
with tanhf, which NVRTC 12.8+ turns into the coarse tanh.approx.f32 under --use_fast_math.

Every thread reads its element(s) of x and dout before writing dinp, so both versions may run in
place (dinp == dout), as the trainer does on its gradient buffer.

Versions (same numbers as llm.c's dev/cuda/gelu_backward.cu):

version 1: one thread per element, scalar loads and store; grid = ceil(N / block).
version 2: one thread per 128-bit pack (a float4 in FP32): x and dout are read with streaming
           128-bit loads, dinp is written with a plain 128-bit store. The guard tests only the
           pack's first index, so N must be a multiple of 4, and every pointer 16-byte aligned.

Fastest: version 2.
*/

#include "common.cuh"

__device__ __forceinline__ float gelu_tanh_grad(float x) {
    float cube = 0.044715f * x * x * x;
    float u = GELU_SCALING_FACTOR * (x + cube);
    float tanh_out = tanh_from_exp(u);   // not tanhf: see common.cuh (tanh.approx.f32 under fast math)
    float cosh_out = coshf(u);
    float sech2 = 1.0f / (cosh_out * cosh_out);
    return 0.5f * (1.0f + tanh_out) + x * 0.5f * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

// ----------------------------------------------------------------------------------------------
// version 1: one thread per element

__global__ void gelu_backward_kernel1(float* dinp, const float* inp, const float* dout, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        float g = dout[i];  // read before the write: dinp may alias dout
        dinp[i] = gelu_tanh_grad(inp[i]) * g;
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one thread per float4 pack

__global__ void gelu_backward_kernel2(float* dinp, const float* inp, const float* dout, int N) {
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i < N) {  // N % 4 == 0: the whole pack is in range
        float4 x = load128cs(inp + i);
        float4 g = load128cs(dout + i);
        float4 d;
        d.x = gelu_tanh_grad(x.x) * g.x;
        d.y = gelu_tanh_grad(x.y) * g.y;
        d.z = gelu_tanh_grad(x.z) * g.z;
        d.w = gelu_tanh_grad(x.w) * g.w;
        store128(dinp + i, d);
    }
}
