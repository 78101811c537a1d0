// Stand-in for <cooperative_groups.h> in the CPU emulator: thread blocks and statically sized
// tiles (up to a warp) built on the emulator's barriers and warp collectives.
#pragma once
#include "llmcupy_sim.h"

namespace cooperative_groups {

class thread_block {
  public:
    unsigned int thread_rank() const {
        return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    }
    unsigned int size() const { return blockDim.x * blockDim.y * blockDim.z; }
    unsigned int num_threads() const { return size(); }
    dim3 group_dim() const { return blockDim; }
    dim3 dim_threads() const { return blockDim; }
    dim3 thread_index() const { return threadIdx; }
    dim3 group_index() const { return blockIdx; }
    void sync(int line = __builtin_LINE()) const { __syncthreads(line); }
};

inline thread_block this_thread_block() { return thread_block(); }
inline void sync(const thread_block& g, int line = __builtin_LINE()) { g.sync(line); }

// A tile of N consecutive threads (N a power of two, at most 32). Its collectives use the lanes of
// its own segment of the warp, so tiles of one warp proceed independently.
template <unsigned int N>
class thread_block_tile {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "tile size must be a power of two <= 32");

  public:
    static constexpr unsigned int num_threads() { return N; }
    static constexpr unsigned int size() { return N; }
    unsigned int thread_rank() const { return llmcupy_sim::current_lane() % N; }
    unsigned int meta_group_rank() const { return block_rank() / N; }
    unsigned int meta_group_size() const {
        unsigned int threads = blockDim.x * blockDim.y * blockDim.z;
        return (threads + N - 1) / N;
    }
    unsigned int mask() const {
        unsigned int bits = N == 32 ? 0xffffffffu : ((1u << N) - 1u);
        unsigned int first = (llmcupy_sim::current_lane() / N) * N;
        return bits << first;
    }
    void sync(int line = __builtin_LINE()) const { __syncwarp(mask(), line); }
    template <typename T>
    T shfl(T v, int src, int line = __builtin_LINE()) const { return __shfl_sync(mask(), v, src, int(N), line); }
    template <typename T>
    T shfl_down(T v, unsigned d, int line = __builtin_LINE()) const { return __shfl_down_sync(mask(), v, d, int(N), line); }
    template <typename T>
    T shfl_up(T v, unsigned d, int line = __builtin_LINE()) const { return __shfl_up_sync(mask(), v, d, int(N), line); }
    template <typename T>
    T shfl_xor(T v, int m, int line = __builtin_LINE()) const { return __shfl_xor_sync(mask(), v, m, int(N), line); }
    int any(int p, int line = __builtin_LINE()) const { return __any_sync(mask(), p, line); }
    int all(int p, int line = __builtin_LINE()) const { return __all_sync(mask(), p, line); }
    unsigned int ballot(int p, int line = __builtin_LINE()) const {
        return __ballot_sync(mask(), p, line) >> ((llmcupy_sim::current_lane() / N) * N);
    }

  private:
    static unsigned int block_rank() {
        return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    }
};

template <unsigned int N, typename Parent>
inline thread_block_tile<N> tiled_partition(const Parent&) { return thread_block_tile<N>(); }

template <unsigned int N>
inline void sync(const thread_block_tile<N>& g, int line = __builtin_LINE()) { g.sync(line); }

}  // namespace cooperative_groups
