/*
adamw: the fused AdamW update of P flat FP32 parameters, in place on params and on the first and
second moments m and v. With the step's bias corrections c1 = 1 - beta1^t and c2 = 1 - beta2^t
computed once on the host (FP32 powf), and theta the parameter before the update:
    m = beta1*m + (1 - beta1)*g
    v = beta2*v + (1 - beta2)*g^2
    theta -= lr * ((m / c1) / (sqrt(v / c2) + eps) + weight_decay * theta)
i.e. decoupled weight decay scaled by lr (PyTorch's AdamW), eps added after the sqrt, and the new
m and v (not the bias-corrected ones) stored.

Versions (same numbers as llm.c's dev/cuda/adamw.cu):

version 1: naive fused kernel, one thread per parameter (block 512): a direct transcription that
           reads grads[i] twice and re-reads m[i], v[i] and params[i] from global memory after
           writing them (without __restrict__ the compiler must assume they alias).
version 2: register-cached + FMA lerp, same launch: g, m and v are loaded once, each moment update
           is a linear interpolation done with two FMAs, lerp(a, b, w) = fma(w, b, fma(-w, a, a)),
           so m = lerp(g, m, beta1) and v = lerp(g*g, v, beta2), and params, m, v are each written
           once.

llm.c's thread index is a 32-bit int while P is a long; here the index is size_t, so any P fits.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: naive transcription of the update

__global__ void adamw_kernel1(float* params_memory, const float* grads_memory, float* m_memory, float* v_memory,
                              long num_parameters, float learning_rate, float beta1, float beta2,
                              float beta1_correction, float beta2_correction, float eps, float weight_decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)num_parameters) {
        // each line goes back to global memory, as the CPU loop it transcribes does
        m_memory[i] = beta1 * m_memory[i] + (1.0f - beta1) * grads_memory[i];
        v_memory[i] = beta2 * v_memory[i] + (1.0f - beta2) * grads_memory[i] * grads_memory[i];
        float m_hat = m_memory[i] / beta1_correction;
        float v_hat = v_memory[i] / beta2_correction;
        params_memory[i] -= learning_rate * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params_memory[i]);
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: values cached in registers, moments updated with a two-FMA lerp

// lerp(start, end, weight) = start + weight*(end - start) = weight*end + (1 - weight)*start,
// evaluated as fma(weight, end, fma(-weight, start, start)): two FMAs, no separate (1 - weight).
__device__ __forceinline__ float adamw_lerp(float start, float end, float weight) {
    return fmaf(weight, end, fmaf(-weight, start, start));
}

__global__ void adamw_kernel2(float* params_memory, const float* grads_memory, float* m_memory, float* v_memory,
                              long num_parameters, float learning_rate, float beta1, float beta2,
                              float beta1_correction, float beta2_correction, float eps, float weight_decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)num_parameters) return;  // no barrier or collective follows
    float grad = grads_memory[i];
    float m = m_memory[i];
    float v = v_memory[i];
    m = adamw_lerp(grad, m, beta1);         // beta1*m + (1 - beta1)*grad
    m_memory[i] = m;
    v = adamw_lerp(grad * grad, v, beta2);  // beta2*v + (1 - beta2)*grad^2
    v_memory[i] = v;
    m /= beta1_correction;  // m_hat
    v /= beta2_correction;  // v_hat
    float param = params_memory[i];
    params_memory[i] = param - learning_rate * (m / (sqrtf(v) + eps) + weight_decay * param);
}
