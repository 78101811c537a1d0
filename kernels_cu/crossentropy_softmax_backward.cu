/*
crossentropy_softmax_backward: gradient of (softmax -> cross-entropy) with respect to the logits,
accumulated into dlogits:
    dlogits[b, t, v] += (probs[b, t, v] - [v == targets[b, t]]) * dlosses[b, t]
probs and dlogits are (B, T, V) FP32 with row stride V, targets (B, T) int32 in [0, V), dlosses
(B, T) FP32. The output is accumulated (+=): the caller zeroes it first when it wants a plain
gradient.

Versions (same numbers as llm.c's dev/cuda/crossentropy_softmax_backward.cu, whose header comment
calls itself "crossentropy forward" by a copy-paste slip):

version 1: elementwise over B*T*V, one thread per logit: b*T + t and v come back from the linear
           index by div/mod; every thread re-reads its row's dloss and target (broadcast loads that
           hit in cache). Coalesced read of probs and read-modify-write of dlogits. llm.c's linear
           index is a 32-bit int, which breaks once B*T*V >= 2^31; here it is size_t.

The optimised path is the fused classifier (classifier_fused.cu): it recomputes the probabilities
from the logits instead of reading a (B, T, V) probability tensor, and overwrites instead of +=.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: one thread per logit element

__global__ void crossentropy_softmax_backward_kernel1(float* dlogits, const float* dlosses, const float* probs,
                                                      const int* targets, int B, int T, int V) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // 64-bit: B*T*V may exceed 2^31
    if (i < (size_t)B * T * V) {
        size_t bt = i / V;           // row b*T + t
        int v = (int)(i % V);
        float dloss = dlosses[bt];
        int ix = targets[bt];
        float p = probs[i];
        float indicator = v == ix ? 1.0f : 0.0f;
        dlogits[i] += (p - indicator) * dloss;
    }
}
