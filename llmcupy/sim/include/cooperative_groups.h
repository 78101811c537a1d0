// Stand-in for <cooperative_groups.h> in the CPU emulator: thread blocks and statically sized
// tiles (up to a warp) built on the emulator's barriers and warp collectives.
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
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
    T shfl(T v, int src, int line = __builtin_LINE()) const { return __shfl_sync<T, true>(mask(), v, src, int(N), line); }
    template <typename T>
    T shfl_down(T v, unsigned d, int line = __builtin_LINE()) const { return __shfl_down_sync<T, true>(mask(), v, d, int(N), line); }
    template <typename T>
    T shfl_up(T v, unsigned d, int line = __builtin_LINE()) const { return __shfl_up_sync<T, true>(mask(), v, d, int(N), line); }
    template <typename T>
    T shfl_xor(T v, int m, int line = __builtin_LINE()) const { return __shfl_xor_sync<T, true>(mask(), v, m, int(N), line); }
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

// A group of lanes of one warp given by a mask (coalesced_threads(), labeled/binary partitions):
// ranks count the mask's lanes in order, as on the GPU.
class coalesced_group {
  public:
    explicit coalesced_group(unsigned int mask) : mask_(mask) {}
    unsigned int size() const { return unsigned(__builtin_popcount(mask_)); }
    unsigned int num_threads() const { return size(); }
    unsigned int thread_rank() const { return unsigned(__builtin_popcount(mask_ & ((1u << llmcupy_sim::current_lane()) - 1u))); }
    unsigned int meta_group_rank() const { return 0; }
    unsigned int meta_group_size() const { return 1; }
    unsigned int mask() const { return mask_; }
    void sync(int line = __builtin_LINE()) const { __syncwarp(mask_, line); }
    template <typename T>
    T shfl(T v, unsigned int rank, int line = __builtin_LINE()) const { return __shfl_sync<T, true>(mask_, v, lane_of(rank), 32, line); }
    template <typename T>
    T shfl_down(T v, unsigned int d, int line = __builtin_LINE()) const {
        unsigned int r = thread_rank() + d;
        T got = __shfl_sync<T, true>(mask_, v, lane_of(r < size() ? r : thread_rank()), 32, line);
        return r < size() ? got : v;
    }
    template <typename T>
    T shfl_up(T v, unsigned int d, int line = __builtin_LINE()) const {
        unsigned int r = thread_rank();
        T got = __shfl_sync<T, true>(mask_, v, lane_of(r >= d ? r - d : r), 32, line);
        return r >= d ? got : v;
    }
    int any(int p, int line = __builtin_LINE()) const { return __any_sync(mask_, p, line); }
    int all(int p, int line = __builtin_LINE()) const { return __all_sync(mask_, p, line); }
    unsigned int ballot(int p, int line = __builtin_LINE()) const {
        unsigned int bits = __ballot_sync(mask_, p, line), out = 0, k = 0;
        for (int l = 0; l < 32; ++l)
            if (mask_ & (1u << l)) out |= ((bits >> l) & 1u) << k++;
        return out;
    }

  private:
    int lane_of(unsigned int rank) const {
        unsigned int m = mask_;
        for (unsigned int i = 0; i < rank && m; ++i) m &= m - 1;
        return m ? __builtin_ctz(m) : llmcupy_sim::current_lane();
    }
    unsigned int mask_;
};

// The lanes converged here (see __activemask).
inline coalesced_group coalesced_threads(int line = __builtin_LINE()) { return coalesced_group(__activemask(line)); }

// tiled_partition(parent, n) with a run-time size: a thread_group (n a power of two; up to 32 it
// synchronises its lanes, above that the whole block).
class thread_group {
  public:
    explicit thread_group(unsigned int n) : n_(n) {}
    unsigned int size() const { return n_; }
    unsigned int num_threads() const { return n_; }
    unsigned int thread_rank() const { return block_rank() % n_; }
    unsigned int meta_group_rank() const { return block_rank() / n_; }
    void sync(int line = __builtin_LINE()) const {
        if (n_ <= 32) {
            unsigned int bits = n_ == 32 ? 0xffffffffu : ((1u << n_) - 1u);
            __syncwarp(bits << ((llmcupy_sim::current_lane() / n_) * n_), line);
        } else {
            __syncthreads(line);
        }
    }

  private:
    static unsigned int block_rank() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
    unsigned int n_;
};
inline thread_group tiled_partition(const thread_block&, unsigned int n) { return thread_group(n); }
inline void sync(const thread_group& g, int line = __builtin_LINE()) { g.sync(line); }
inline void sync(const coalesced_group& g, int line = __builtin_LINE()) { g.sync(line); }

// Lanes of `g` with the same label / predicate form one group.
template <typename G>
inline coalesced_group labeled_partition(const G& g, int label, int line = __builtin_LINE()) {
    return coalesced_group(__match_any_sync(g.mask(), label, line));
}
template <typename G>
inline coalesced_group binary_partition(const G& g, bool pred, int line = __builtin_LINE()) {
    return coalesced_group(__match_any_sync(g.mask(), int(pred), line));
}
template <typename G, typename Fn, typename... Args>
inline void invoke_one(const G& g, Fn&& fn, Args&&... args) {
    if (g.thread_rank() == 0) fn(static_cast<Args&&>(args)...);
    g.sync();
}

// The whole grid. grid.sync() is a barrier of every thread of every block, which needs every block
// resident at once: a cooperative launch (RawModule(..., enable_cooperative_groups=True)), where the
// emulator runs each block on its own OS thread. In any other launch it stops with an error.
class grid_group {
  public:
    unsigned long long size() const { return (unsigned long long)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z; }
    unsigned long long num_threads() const { return size(); }
    unsigned long long thread_rank() const {
        unsigned long long b = blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
        return b * blockDim.x * blockDim.y * blockDim.z + threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    }
    unsigned long long num_blocks() const { return (unsigned long long)gridDim.x * gridDim.y * gridDim.z; }
    unsigned long long block_rank() const { return blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z); }
    dim3 group_dim() const { return gridDim; }
    bool is_valid() const { return llmcupy_sim::cooperative_launch(); }   // true only in a cooperative launch
    void sync(int line = __builtin_LINE()) const { llmcupy_sim::grid_sync(line); }
};
inline grid_group this_grid() { return grid_group(); }
inline void sync(const grid_group& g, int line = __builtin_LINE()) { g.sync(line); }

}  // namespace cooperative_groups
// NVRTC 12.9's and 13.5's <cooperative_groups.h> bring in <cuda/std/cstdint>'s types (12.4's not)
#define LLMCUPY_SIM_NVRTC_HAS_STDINT 1
#include "llmcupy_sim_nvrtc_names_on.h"
