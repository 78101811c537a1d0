// async_copy.cuh -- the cp.async staging both warp-tiled GEMMs use (matmul_forward version 5 and
// matmul_forward_tf32). sm_80+ only: include it where cp.async is compiled in.
#pragma once

#include <cuda_pipeline.h>

// Chunk (row, k .. k + 3) of a row-major (nrows, K) matrix into shared memory at dst, without
// waiting for it (__pipeline_commit / __pipeline_wait_prior complete it). vec (K % 4 == 0 and the
// matrix 16-byte aligned): one 16-byte copy, the chunk being a whole float4 or wholly past K;
// otherwise four 4-byte copies. Whatever lies past the matrix is zero-filled without being read
// (src is then any valid aligned address), so the tiles need no bounds checks of their own.
__device__ __forceinline__ void copy_chunk_async(float* dst, const float* src, int row, int k, int nrows, int K,
                                                 bool vec) {
    if (vec) {
        bool in = row < nrows && k < K;
        __pipeline_memcpy_async(dst, in ? src + (size_t)row * K + k : src, 16, in ? 0 : 16);
    } else {
        for (int j = 0; j < 4; j++) {
            bool in = row < nrows && k + j < K;
            __pipeline_memcpy_async(dst + j, in ? src + (size_t)row * K + k + j : src, 4, in ? 0 : 4);
        }
    }
}
