/*
crossentropy_forward: per-position negative log-likelihood from probabilities that are already
softmaxed, losses[b, t] = -ln(probs[b, t, targets[b, t]]). No mean is taken: the caller averages.
probs is (B, T, V) with row stride V, targets (B, T) int32 in [0, V), losses (B, T) FP32.

Versions (same numbers as llm.c's dev/cuda/crossentropy_forward.cu):

version 1: gather + log, one thread per (b, t) position: the thread reads its target id and the
           single matching probability (one scattered 4-byte read per row of V floats, so the
           kernel is latency-bound, not bandwidth-bound) and writes -logf(p). llm.c forms the
           offset b*T*V + t*V in 32-bit int, which overflows once B*T*V >= 2^31; here the row
           offset is computed in size_t.

The kernel does not check that probs is normalised, nor the target range (the Python launcher
validates targets before the launch). The optimised path is the fused classifier
(classifier_fused.cu), which never materialises the probabilities.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: one thread per position, gather one probability, take its log

__global__ void crossentropy_forward_kernel1(float* losses, const float* probs, const int* targets,
                                             int B, int T, int V) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // position index b*T + t
    if (i < B * T) {
        const float* probs_bt = probs + (size_t)i * V;  // 64-bit row offset: B*T*V may exceed 2^31
        int ix = targets[i];
        losses[i] = -logf(probs_bt[ix]);
    }
}
