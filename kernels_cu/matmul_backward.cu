/*
matmul_backward: backward pass of the dense layer out = inp @ weight^T + bias. With dout (B*T, OC),
inp (B*T, C) and weight (OC, C), all row-major FP32:

    dinp   += dout @ weight          (B*T, C)
    dweight += dout^T @ inp          (OC, C)
    dbias   = column sums of dout    (OC)      -- written, not accumulated, as in llm.c's dev file

Versions (same numbers as llm.c's dev/cuda/matmul_backward.cu):

version 1: the two GEMMs are cuBLAS SGEMMs with beta = 1 (issued from Python through
           llmcupy.runtime.blas: a .cu file cannot call cuBLAS); the bias gradient is matmul_backward_bias_kernel1
           below: one block per output channel (512 threads in llm.c), each thread sums the rows
           tid, tid + blockDim.x, ... of its column in a double, then a halving tree in shared memory
           (block size a power of two) and thread 0 overwrites dbias[o]. A block reads its column at
           stride OC: not coalesced. Skipped when dbias is NULL (the LM head has no bias).

Past llm.c:

version 2: both GEMMs on matmul_forward version 5's warp-tiled, cp.async double-buffered kernel
           (matmul_forward.cu's matmul_backward_gemm_kernel2: version 5 with an accumulating
           epilogue, out += product, so beta = 1 costs one read of the output and no extra pass).
           That kernel multiplies two K-contiguous operands (out = A @ B^T); the backward's are
           not all K-contiguous, so the launcher makes transposed copies first:
             dinp (B*T, C)  += dout (B*T, OC) @ (weight^T)^T        copy weight^T: OC * C floats
             dweight (OC, C) += (dout^T) (OC, B*T) @ (inp^T)^T      copies dout^T, inp^T: (OC + C) * B*T
           At GPT-2 124M's shapes (B*T = 4096) the copies move ~2-3 % of the bytes a GEMM's FLOPs
           take in time; loaders that read K-major tiles directly (the next rung) would remove them.
           The bias gradient is version 1's kernel. Any shape.

llm.c's file also holds an unused naive bias kernel (one thread per column) and commented-out
cublasSgemv attempts; they are not versions and are not reproduced.
*/

#include "common.cuh"

// ----------------------------------------------------------------------------------------------
// version 1: the bias gradient, one block per output channel, double partial sums, tree reduction

__global__ void matmul_backward_bias_kernel1(float* dbias, const float* dout, int BT, int OC) {
    extern __shared__ float shared[];  // blockDim.x floats
    int o = blockIdx.x;
    int tid = threadIdx.x;
    double sum = 0.0;  // the CPU reference keeps the bias sum in double too
    for (int i = tid; i < BT; i += blockDim.x) {
        sum += dout[(size_t)i * OC + o];
    }
    shared[tid] = (float)sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride >= 1; stride /= 2) {
        if (tid < stride) {
            shared[tid] += shared[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        dbias[o] = shared[0];
    }
}
