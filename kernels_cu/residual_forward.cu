/*
residual_forward: elementwise sum of two activations, out[i] = inp1[i] + inp2[i] for i in [0, N).
In GPT-2 this is the residual connection: N = B*T*C, called twice per layer (residual + attproj,
then residual2 + fcproj).

Versions (same numbers as llm.c's dev/cuda/residual_forward.cu):

version 1: one thread per element, scalar coalesced loads and stores; grid = ceil(N / block).
version 2: one thread per 128-bit pack (a float4 in FP32): both inputs are read with streaming
           (evict-first) 128-bit loads, the output is written with a plain 128-bit store so the
           next kernel may find it in cache. The guard tests only the first index of the pack, so
           N must be a multiple of 4, and every pointer 16-byte aligned (the launcher checks both).

llm.c's dev file runs in bf16 (8 elements per pack); here everything is FP32, so the pack is 4
floats. Fastest: version 2 (half the instructions per byte moved).
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: one thread per element

__global__ void residual_forward_kernel1(float* out, const float* inp1, const float* inp2, int N) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < N) {
        out[idx] = inp1[idx] + inp2[idx];
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one thread per float4 pack, streaming loads, cacheable store

__global__ void residual_forward_kernel2(float* out, const float* inp1, const float* inp2, int N) {
    int idx = (blockIdx.x * blockDim.x + threadIdx.x) * 4;  // first element of this thread's pack
    if (idx < N) {  // N % 4 == 0, so the whole pack is in range
        // the inputs are not read again by this kernel: evict them first
        float4 a = load128cs(inp1 + idx);
        float4 b = load128cs(inp2 + idx);
        float4 r;
        r.x = a.x + b.x;
        r.y = a.y + b.y;
        r.z = a.z + b.z;
        r.w = a.w + b.w;
        store128(out + idx, r);  // plain store: the consumer (a LayerNorm) reads it next
    }
}
