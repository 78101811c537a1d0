// common.cuh -- device helpers shared by every kernel file of the catalogue.
//
// Kept small on purpose: a kernel file should read on its own, so only what several files use
// lives here (ceil_div, warp reductions, float4 access, the GELU constant).
#pragma once

// No <cooperative_groups.h> here: it takes ~1.2 s of NVRTC time per file against ~0.04 s for a
// small kernel without it, so only the files that use cooperative groups include it (before this
// header) and declare `namespace cg = cooperative_groups;`.

// NVRTC compiles without the host C library, so <math.h>'s INFINITY and <cfloat>'s FLT_MAX are not
// defined there. CUDA 12.6+ headers bring FLT_MAX in through libcu++ (via cooperative_groups.h),
// 12.2-12.4 do not under NVRTC, and files without cooperative groups never get it: define both.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38F
#endif

#define CEIL_DIV(M, N) (((M) + (N) - 1) / (N))

// Full-warp butterfly reductions: every lane ends with the result. All 32 lanes must take part.
__device__ __forceinline__ float warpReduceSum(float val) {
    for (int offset = 16; offset > 0; offset /= 2) {
        val += __shfl_xor_sync(0xFFFFFFFFu, val, offset);
    }
    return val;
}

__device__ __forceinline__ float warpReduceMax(float val) {
    for (int offset = 16; offset > 0; offset /= 2) {
        val = fmaxf(val, __shfl_xor_sync(0xFFFFFFFFu, val, offset));
    }
    return val;
}

// 128-bit access to FP32 data: the "packed" loads of llm.c's bf16 kernels are float4 in FP32.
// The pointer must be 16-byte aligned, which the runtime checks for float4* parameters.
__device__ __forceinline__ float4 load128(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load128cs(const float* p) { return __ldcs(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ void store128(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store128cs(float* p, float4 v) { __stcs(reinterpret_cast<float4*>(p), v); }

__device__ __forceinline__ float float4_get(const float4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ void float4_set(float4& v, int i, float x) {
    if (i == 0) v.x = x; else if (i == 1) v.y = x; else if (i == 2) v.z = x; else v.w = x;
}

// sqrt(2/pi), the constant of GPT-2's tanh approximation of GELU.
#define GELU_SCALING_FACTOR 0.7978845608028654f

// tanh(u) as 1 - 2 / (e^(2u) + 1), for GELU and its gradient. Not tanhf: under --use_fast_math
// (our build, as llm.c's) NVRTC 12.8 and later compile tanhf to the tanh.approx.f32 instruction,
// whose relative error the PTX ISA bounds only by 2^-11. At x = 1 that can put GELU 1.7e-4 from its
// reference, 17 times llm.c's FP32 tolerance, while NVRTC 12.6 and earlier compile it to an
// accurate tanhf: the results would depend on the CUDA version. This form needs only the fast
// exponential (ex2.approx, relative error near 2^-22) and a division (2 ulp), so it is within about
// 1e-6 of tanh on every toolkit. For small |u| the subtraction cancels, but the absolute error stays
// near one ulp of 1, which is what GELU needs (it scales tanh by 0.5 x). The tails are exact: for
// u > 44, e^(2u) is inf and the quotient 0, giving 1; for very negative u, e^(2u) is 0, giving -1.
__device__ __forceinline__ float tanh_from_exp(float u) {
    return 1.0f - 2.0f / (__expf(2.0f * u) + 1.0f);
}

// GPT-2's GELU, one formula for gelu_forward and the matmul's fused GELU epilogue, so the fused
// and the unfused MLP give the same bits.
__device__ __forceinline__ float gelu_tanh(float x) {
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanh_from_exp(GELU_SCALING_FACTOR * (x + cube)));
}
