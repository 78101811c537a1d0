/*
matmul_backward_bias: the bias gradient of a dense layer, the column sums of dout (B*T, OC) row-major,
ADDED to the existing gradient: dbias[o] += sum_bt dout[bt, o]. A pure memory-bound reduction.
FP32 throughout (llm.c's file is built for bf16; this is its FP32 build, where a 16-byte packet
holds 4 floats).

Versions (same numbers as llm.c's dev/cuda/matmul_backward_bias.cu; there is no version 6):

version 1: one block per output channel; each thread sums rows tid, tid + bs, ... (fp32), a halving
           tree in shared memory, thread 0 adds to dbias[o]. The block size is rounded down to a
           power of two by the launcher (768 -> 512). Column reads at stride OC: uncoalesced.
version 2: one warp per output channel: lanes stride over the rows by 32, cg::reduce, lane 0 adds.
version 3: one block per output channel, any multiple of 32 threads: per-thread strided sums, warp
           shuffle reduction, one partial per warp in shared memory, a second warp reduction.
version 4: coalesced column tile: a block owns 32 adjacent columns, lane = column, warp = first
           row, warps stride over the rows, so each warp load is one contiguous 128-byte row segment.
           Partials [warp][lane] in shared memory, warp 0 sums down the warps. OC % 32 == 0.
           (The FP32 trainer's kernel, with 1024 threads.)
version 5: one thread per column in x; gridDim.y splits the rows to fill the GPU; each thread adds its
           partial column sum to dbias with an fp32 global atomicAdd (so no zeroing is needed: the
           atomics accumulate into the existing gradient, which is the op's semantics). The order of
           the additions varies from run to run.
version 7: float4 packets: block (32, bs/32), bs raised to at least 256; each thread owns 4
           consecutive columns, a warp 128. Rows split over threadIdx.y and gridDim.y. Register sums
           -> shared-memory atomics into a zeroed 128-float array in a bank-conflict-free permuted
           order (element k of lane l at slot l + 32k) -> the first 4 warps read it back in natural
           column order -> one coalesced fp32 global atomicAdd per column into an fp32 buffer zeroed
           before the launch -> matmul_backward_bias_add_kernel adds that buffer into dbias.
           OC % 4 == 0.
version 8: block (4, 8, bs/32): the 4 x-threads are a row depth inside a warp, the 8 y-threads 8
           packets (32 columns per block in FP32), z the row groups. Each thread sums one packet
           over its strided rows in registers; width-4 shuffle-downs fold the depth; the results go
           to shared memory [4][32][8]; warp z == 0 folds the z partials (again with width-4
           shuffles). With gridDim.y == 1 it adds straight into dbias, else it atomically adds into
           an fp32 buffer (zeroed first) and matmul_backward_bias_add_kernel adds that into dbias.
           OC % 4 == 0.
version 9: as 8, but with gridDim.y > 1 grid row y writes its own partial row aux[y * OC + col] with
           plain stores (no atomics, no memset), and matmul_backward_bias_reduce_kernel9 (256
           threads, a float4 of 4 columns per thread) sums the gridDim.y rows and adds into dbias:
           deterministic. llm.c's harness allocates 32 * OC floats for aux, so gridDim.y > 32
           (possible at small block sizes on a large GPU) writes past it; here the launcher
           allocates gridDim.y * OC floats. OC % 4 == 0.

Versions 5, 7 and 8 size gridDim.y to fill the device (threads per SM * SMs); the emulator pretends
to hold 1024 resident threads, so that both the single-grid-row and the multi-row paths run in tests.
Fastest per llm.c's file: the versions are chronological, each removing a bottleneck of the one
before; version 9 is the last (and deterministic).
*/

// cooperative groups only in the files that use them: the header costs ~1 s of NVRTC per file
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include "common.cuh"

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------------------------
// version 1: one block per output channel, shared-memory tree (power-of-two block size)

__global__ void matmul_backward_bias_kernel1(float* dbias, const float* dout, int BT, int OC) {
    extern __shared__ float shared[];  // blockDim.x floats
    int o = blockIdx.x;
    int tid = threadIdx.x;
    float sum = 0.0f;
    for (int i = tid; i < BT; i += blockDim.x) {
        sum += dout[(size_t)i * OC + o];
    }
    shared[tid] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride >= 1; stride /= 2) {
        if (tid < stride) {
            shared[tid] += shared[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        dbias[o] += shared[0];
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one warp per output channel, cooperative-groups reduction

__global__ void matmul_backward_bias_kernel2(float* dbias, const float* dout, int BT, int OC) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int o = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (o >= OC) return;  // the whole warp leaves together: no collective is left half-attended
    float sum = 0.0f;
    for (int i = warp.thread_rank(); i < BT; i += warp.size()) {
        sum += dout[(size_t)i * OC + o];
    }
    sum = cg::reduce(warp, sum, cg::plus<float>());
    if (warp.thread_rank() == 0) {
        dbias[o] += sum;
    }
}

// ----------------------------------------------------------------------------------------------
// version 3: one block per output channel, warp reductions + one shared slot per warp

__global__ void matmul_backward_bias_kernel3(float* dbias, const float* dout, int BT, int OC) {
    __shared__ float warp_sums[32];
    int o = blockIdx.x;
    int tid = threadIdx.x;
    int warp_id = tid / 32;
    int lane = tid % 32;
    int num_warps = blockDim.x / 32;
    float sum = 0.0f;
    for (int i = tid; i < BT; i += blockDim.x) {
        sum += dout[(size_t)i * OC + o];
    }
    sum = warpReduceSum(sum);
    if (lane == 0) warp_sums[warp_id] = sum;
    __syncthreads();
    if (warp_id == 0) {
        float s = (lane < num_warps) ? warp_sums[lane] : 0.0f;  // unwritten slots are never read
        s = warpReduceSum(s);
        if (lane == 0) dbias[o] += s;
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: a block per 32 adjacent columns, coalesced row segments (OC % 32 == 0)

__global__ void matmul_backward_bias_kernel4(float* dbias, const float* dout, int BT, int OC) {
    extern __shared__ float smem[];  // blockDim.x floats: [warp][lane]
    int warp_id = threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    int num_warps = blockDim.x / 32;
    int col = blockIdx.x * 32 + lane;
    float sum = 0.0f;
    for (int row = warp_id; row < BT; row += num_warps) {
        sum += dout[(size_t)row * OC + col];  // the warp reads 32 consecutive floats of one row
    }
    smem[warp_id * 32 + lane] = sum;
    __syncthreads();
    if (warp_id == 0) {
        float total = 0.0f;
        for (int w = 0; w < num_warps; w++) {
            total += smem[w * 32 + lane];
        }
        dbias[col] += total;
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: a thread per column, rows split over gridDim.y, global fp32 atomics

__global__ void matmul_backward_bias_kernel5(float* dbias, const float* dout, int BT, int OC) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col < OC) {
        float sum = 0.0f;
        for (int row = blockIdx.y; row < BT; row += gridDim.y) {
            sum += dout[(size_t)row * OC + col];
        }
        atomicAdd(dbias + col, sum);
    }
}

// ----------------------------------------------------------------------------------------------
// shared by versions 7 and 8: add the fp32 accumulation buffer into dbias (the "cast and add"
// kernel of the bf16 build; in FP32 there is nothing to cast)

__global__ void matmul_backward_bias_add_kernel(float* dbias, const float* aux, int OC) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < OC) {
        dbias[i] += aux[i];
    }
}

// ----------------------------------------------------------------------------------------------
// version 7: float4 packets, shared-memory atomics in permuted order, global atomics (OC % 4 == 0)

__global__ void matmul_backward_bias_kernel7(float* aux, const float* dout, int BT, int OC) {
    __shared__ float block_sums[32 * 4];  // slot lane + 32 * k holds element k of lane's packet
    int lane = threadIdx.x;               // blockDim.x == 32
    int flat = threadIdx.y * 32 + lane;
    int col0 = blockIdx.x * 128 + 4 * lane;  // this thread's 4 columns
    bool valid = col0 < OC;                  // OC % 4 == 0: a packet is entirely in or out

    if (flat < 32 * 4) block_sums[flat] = 0.0f;  // blockDim.y >= 8 > 4, so all 128 slots are covered

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (valid) {
        for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < BT; row += gridDim.y * blockDim.y) {
            float4 v = load128(dout + (size_t)row * OC + col0);
            acc[0] += v.x;
            acc[1] += v.y;
            acc[2] += v.z;
            acc[3] += v.w;
        }
    }
    __syncthreads();  // block_sums is zeroed before anyone adds to it
    for (int k = 0; k < 4; k++) {
        atomicAdd(&block_sums[lane + 32 * k], acc[k]);  // consecutive lanes, consecutive banks
    }
    __syncthreads();
    if (threadIdx.y < 4) {
        // warp y reads columns 32y .. 32y + 31 of the block's 128 in natural order: coalesced global atomics
        int c = 32 * threadIdx.y + lane;
        int col = blockIdx.x * 128 + c;
        if (col < OC) {
            atomicAdd(aux + col, block_sums[(c / 4) + 32 * (c % 4)]);
        }
    }
}

// ----------------------------------------------------------------------------------------------
// versions 8 and 9: block (4, 8, bs/32), row depth of 4 inside a warp, packets of 4 columns

// Each thread sums its packet over its rows; the 4 depth threads are folded with width-4 shuffles and
// the z partials through shared memory. Returns true for the threads (x == 0 of warp z == 0) that
// hold a finished packet total in `total` for columns col0 .. col0 + 3 of a valid packet.
__device__ __forceinline__ bool bias_packet_sums(float total[4], const float* dout, int BT, int OC, int& col0) {
    __shared__ float sub[4][32][8];  // [element of packet][z][y]
    int x = threadIdx.x, y = threadIdx.y, z = threadIdx.z;
    col0 = blockIdx.x * 32 + 4 * y;
    bool valid = col0 < OC;  // OC % 4 == 0: a packet is entirely in or out

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (valid) {
        int stride = 4 * blockDim.z * gridDim.y;
        for (int row = x + 4 * (z + blockDim.z * blockIdx.y); row < BT; row += stride) {
            float4 v = load128(dout + (size_t)row * OC + col0);
            acc[0] += v.x;
            acc[1] += v.y;
            acc[2] += v.z;
            acc[3] += v.w;
        }
    }
    for (int k = 0; k < 4; k++) {
        // every lane takes part (invalid packets carry zeros); x == 0 ends with the 4-row sum
        acc[k] += __shfl_down_sync(0xFFFFFFFFu, acc[k], 2, 4);
        acc[k] += __shfl_down_sync(0xFFFFFFFFu, acc[k], 1, 4);
    }
    if (x == 0) {
        for (int k = 0; k < 4; k++) sub[k][z][y] = acc[k];
    }
    __syncthreads();
    if (z == 0) {  // one whole warp: x folds z = x, x + 4, ... then the width-4 shuffles again
        for (int k = 0; k < 4; k++) {
            float s = 0.0f;
            for (int zz = x; zz < (int)blockDim.z; zz += 4) s += sub[k][zz][y];
            s += __shfl_down_sync(0xFFFFFFFFu, s, 2, 4);
            s += __shfl_down_sync(0xFFFFFFFFu, s, 1, 4);
            total[k] = s;
        }
    }
    return z == 0 && x == 0 && valid;
}

__global__ void matmul_backward_bias_kernel8(float* dbias, float* aux, const float* dout, int BT, int OC) {
    float total[4];
    int col0;
    if (bias_packet_sums(total, dout, BT, OC, col0)) {
        for (int k = 0; k < 4; k++) {
            if (gridDim.y == 1) {
                dbias[col0 + k] += total[k];  // the only writer of these columns
            } else {
                atomicAdd(aux + col0 + k, total[k]);  // aux zeroed before the launch
            }
        }
    }
}

__global__ void matmul_backward_bias_kernel9(float* dbias, float* aux, const float* dout, int BT, int OC) {
    float total[4];
    int col0;
    if (bias_packet_sums(total, dout, BT, OC, col0)) {
        float4 t = make_float4(total[0], total[1], total[2], total[3]);
        if (gridDim.y == 1) {
            float4 d = load128(dbias + col0);
            store128(dbias + col0, make_float4(d.x + t.x, d.y + t.y, d.z + t.z, d.w + t.w));
        } else {
            store128(aux + (size_t)blockIdx.y * OC + col0, t);  // own partial row: a plain store
        }
    }
}

// version 9's second pass: sum the gridDim.y partial rows (4 columns per thread) and add to dbias
__global__ void matmul_backward_bias_reduce_kernel9(float* dbias, const float* aux, int rows, int OC) {
    int col0 = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (col0 < OC) {
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int r = 0; r < rows; r++) {
            float4 v = load128(aux + (size_t)r * OC + col0);
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        float4 d = load128(dbias + col0);
        store128(dbias + col0, make_float4(d.x + s.x, d.y + s.y, d.z + s.z, d.w + s.w));
    }
}
