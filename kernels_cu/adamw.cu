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

Ours, not llm.c's: the capturable form, for CUDA graphs (op adamw_capturable). A captured graph
replays its kernels with the arguments they had at capture, so whatever changes from step to step
lives in device memory instead of being passed by value:
    hyper[8] = {lr, beta1, beta2, eps, weight_decay, c1, c2, unused} (float)  and  step[1] (int).
    adamw_step_kernel: one thread; step += 1, then c1 and c2 of that step are copied into hyper
           from a table (2 rows of L floats) that the host filled with the very float32 numbers
           the eager path computes (host powf). powf on the device (__powf under fast math, or the
           2-ulp powf) is not bit-identical to the host's, so it is not used. Past the table's end
           the last entry is used: the host makes the table long enough that both corrections
           have rounded to 1.0f there, where they stay for every larger t.
    adamw_kernel1_capturable, adamw_kernel2_capturable: versions 1 and 2 with lr, beta1, beta2,
           eps, weight_decay, c1 and c2 read from hyper. The per-element arithmetic is the same
           __device__ function as in adamw_kernel1 / adamw_kernel2, so for the same scalars the
           update is bit-identical to the eager path's.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: naive transcription of the update

// the update of element i, shared with the capturable kernel (identical arithmetic)
__device__ __forceinline__ void adamw_update1(float* params_memory, const float* grads_memory, float* m_memory,
                                              float* v_memory, size_t i, float learning_rate, float beta1,
                                              float beta2, float beta1_correction, float beta2_correction,
                                              float eps, float weight_decay) {
    // each line goes back to global memory, as the CPU loop it transcribes does
    m_memory[i] = beta1 * m_memory[i] + (1.0f - beta1) * grads_memory[i];
    v_memory[i] = beta2 * v_memory[i] + (1.0f - beta2) * grads_memory[i] * grads_memory[i];
    float m_hat = m_memory[i] / beta1_correction;
    float v_hat = v_memory[i] / beta2_correction;
    params_memory[i] -= learning_rate * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params_memory[i]);
}

__global__ void adamw_kernel1(float* params_memory, const float* grads_memory, float* m_memory, float* v_memory,
                              long num_parameters, float learning_rate, float beta1, float beta2,
                              float beta1_correction, float beta2_correction, float eps, float weight_decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)num_parameters) {
        adamw_update1(params_memory, grads_memory, m_memory, v_memory, i, learning_rate, beta1, beta2,
                      beta1_correction, beta2_correction, eps, weight_decay);
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: values cached in registers, moments updated with a two-FMA lerp

// lerp(start, end, weight) = start + weight*(end - start) = weight*end + (1 - weight)*start,
// evaluated as fma(weight, end, fma(-weight, start, start)): two FMAs, no separate (1 - weight).
__device__ __forceinline__ float adamw_lerp(float start, float end, float weight) {
    return fmaf(weight, end, fmaf(-weight, start, start));
}

// the update of element i, shared with the capturable kernel (identical arithmetic)
__device__ __forceinline__ void adamw_update2(float* params_memory, const float* grads_memory, float* m_memory,
                                              float* v_memory, size_t i, float learning_rate, float beta1,
                                              float beta2, float beta1_correction, float beta2_correction,
                                              float eps, float weight_decay) {
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

__global__ void adamw_kernel2(float* params_memory, const float* grads_memory, float* m_memory, float* v_memory,
                              long num_parameters, float learning_rate, float beta1, float beta2,
                              float beta1_correction, float beta2_correction, float eps, float weight_decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)num_parameters) return;  // no barrier or collective follows
    adamw_update2(params_memory, grads_memory, m_memory, v_memory, i, learning_rate, beta1, beta2,
                  beta1_correction, beta2_correction, eps, weight_decay);
}

// ----------------------------------------------------------------------------------------------
// ours: the capturable form (scalars and step in device memory, for CUDA graphs)

// slots of the hyper array (llmcupy/ops/adamw_capturable.py uses the same numbers)
constexpr int ADAMW_LR = 0;
constexpr int ADAMW_BETA1 = 1;
constexpr int ADAMW_BETA2 = 2;
constexpr int ADAMW_EPS = 3;
constexpr int ADAMW_WEIGHT_DECAY = 4;
constexpr int ADAMW_C1 = 5;
constexpr int ADAMW_C2 = 6;

// One thread: advances the step counter and stores that step's bias corrections in hyper.
// corrections holds c1 for t = 1..table_len, then c2 for t = 1..table_len.
__global__ void adamw_step_kernel(float* hyper, int* step, const float* corrections, int table_len) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;  // no barrier or collective follows
    int t = step[0] + 1;
    step[0] = t;
    int i = t < table_len ? t - 1 : table_len - 1;  // past the end both corrections are 1.0f
    if (i < 0) i = 0;
    hyper[ADAMW_C1] = corrections[i];
    hyper[ADAMW_C2] = corrections[table_len + i];
}

__global__ void adamw_kernel1_capturable(float* params_memory, const float* grads_memory, float* m_memory,
                                         float* v_memory, long num_parameters, const float* hyper) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)num_parameters) {
        adamw_update1(params_memory, grads_memory, m_memory, v_memory, i, hyper[ADAMW_LR], hyper[ADAMW_BETA1],
                      hyper[ADAMW_BETA2], hyper[ADAMW_C1], hyper[ADAMW_C2], hyper[ADAMW_EPS],
                      hyper[ADAMW_WEIGHT_DECAY]);
    }
}

__global__ void adamw_kernel2_capturable(float* params_memory, const float* grads_memory, float* m_memory,
                                         float* v_memory, long num_parameters, const float* hyper) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)num_parameters) return;  // no barrier or collective follows
    adamw_update2(params_memory, grads_memory, m_memory, v_memory, i, hyper[ADAMW_LR], hyper[ADAMW_BETA1],
                  hyper[ADAMW_BETA2], hyper[ADAMW_C1], hyper[ADAMW_C2], hyper[ADAMW_EPS],
                  hyper[ADAMW_WEIGHT_DECAY]);
}
