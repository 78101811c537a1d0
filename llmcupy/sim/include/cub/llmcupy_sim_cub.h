// The emulator's stand-in for a subset of CUB (CCCL's headers refuse a host compiler): block- and
// warp-wide reductions, cub::BlockReduce and cub::WarpReduce with Sum / Reduce (also with a
// number of valid items). The fold runs in rank order, so
// float results may differ from CUB's tree in the last bits. Other CUB parts (scans, sorts, loads,
// device-wide algorithms) are not provided.
#pragma once
#include "../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "../llmcupy_sim.h"
// CCCL's CUB brings in libcu++'s <cuda/functional> (cuda::maximum<>, cuda::minimum<>, cuda::std::plus<>, ...:
// NVRTC 12.4 to 13.5), which a reduction's operator is written with since CCCL 3 (what CuPy 14 bundles, and so
// what a GPU compiles against) removed cub::Sum, cub::Max and cub::Min: the real libcu++'s (sim/libcuxx.py),
// or with the stand-ins, their <cuda/std/functional> and the two extrema here.
#if __has_include(<cuda/functional>)
#include <cuda/functional>
#else
#include <cuda/std/functional>
namespace cuda {
template <typename T = void>
struct maximum { T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <>
struct maximum<void> {
    template <typename T, typename U> auto operator()(const T& a, const U& b) const { return a < b ? b : a; }
};
template <typename T = void>
struct minimum { T operator()(const T& a, const T& b) const { return b < a ? b : a; } };
template <>
struct minimum<void> {
    template <typename T, typename U> auto operator()(const T& a, const U& b) const { return b < a ? b : a; }
};
}  // namespace cuda
#endif

namespace llmcupy_sim {
struct cub_sum { template <typename T> T operator()(const T& a, const T& b) const { return a + b; } };
}  // namespace llmcupy_sim

namespace cub {

enum BlockReduceAlgorithm { BLOCK_REDUCE_RAKING_COMMUTATIVE_ONLY, BLOCK_REDUCE_RAKING, BLOCK_REDUCE_WARP_REDUCTIONS };

// The aggregate is valid in thread 0, as in CUB; reusing the temporary storage needs a
// __syncthreads() first, as in CUB.
template <typename T, int BLOCK_DIM_X, BlockReduceAlgorithm ALGORITHM = BLOCK_REDUCE_WARP_REDUCTIONS,
          int BLOCK_DIM_Y = 1, int BLOCK_DIM_Z = 1, int LEGACY_PTX_ARCH = 0>
class BlockReduce {
    static constexpr int kThreads = BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z;

  public:
    struct TempStorage { T values[kThreads]; };
    explicit BlockReduce(TempStorage& storage) : storage_(storage) {}

    template <typename Op>
    T Reduce(T input, Op op, int num_valid = kThreads, int line = __builtin_LINE()) {
        int rank = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
        storage_.values[rank] = input;
        __syncthreads(line);
        if (rank != 0) return input;
        T acc = storage_.values[0];
        for (int i = 1; i < num_valid && i < kThreads; ++i) acc = op(acc, storage_.values[i]);
        return acc;
    }
    template <int N, typename Op>
    T Reduce(T (&items)[N], Op op, int line = __builtin_LINE()) {
        T acc = items[0];
        for (int i = 1; i < N; ++i) acc = op(acc, items[i]);
        return Reduce(acc, op, kThreads, line);
    }
    T Sum(T input, int line = __builtin_LINE()) { return Reduce(input, llmcupy_sim::cub_sum(), kThreads, line); }
    T Sum(T input, int num_valid, int line = __builtin_LINE()) { return Reduce(input, llmcupy_sim::cub_sum(), num_valid, line); }
    template <int N>
    T Sum(T (&items)[N], int line = __builtin_LINE()) { return Reduce(items, llmcupy_sim::cub_sum(), line); }

  private:
    TempStorage& storage_;
};

// Logical warps of LOGICAL_WARP_THREADS lanes; the aggregate is valid in each logical warp's lane 0.
template <typename T, int LOGICAL_WARP_THREADS = 32, int LEGACY_PTX_ARCH = 0>
class WarpReduce {
    static_assert(LOGICAL_WARP_THREADS >= 1 && LOGICAL_WARP_THREADS <= 32, "logical warps of 1 to 32 lanes");

  public:
    struct TempStorage { unsigned char unused; };
    explicit WarpReduce(TempStorage&) {}

    template <typename Op>
    T Reduce(T input, Op op, int valid_items = LOGICAL_WARP_THREADS, int line = __builtin_LINE()) {
        static_assert(sizeof(T) <= llmcupy_sim::kPostBytes, "value too large for a warp reduction in the emulator");
        int lane = llmcupy_sim::current_lane();
        int first = (lane / LOGICAL_WARP_THREADS) * LOGICAL_WARP_THREADS;
        unsigned bits = LOGICAL_WARP_THREADS == 32 ? 0xffffffffu : ((1u << LOGICAL_WARP_THREADS) - 1u);
        const auto& g = llmcupy_sim::warp_exchange(bits << first, &input, sizeof(T), line, "cub::WarpReduce");
        T acc = llmcupy_sim::read_lane(g, first, input);
        for (int l = 1; l < valid_items && l < LOGICAL_WARP_THREADS; ++l)
            acc = op(acc, llmcupy_sim::read_lane(g, first + l, input));
        return acc;
    }
    T Sum(T input, int line = __builtin_LINE()) { return Reduce(input, llmcupy_sim::cub_sum(), LOGICAL_WARP_THREADS, line); }
    T Sum(T input, int valid_items, int line = __builtin_LINE()) { return Reduce(input, llmcupy_sim::cub_sum(), valid_items, line); }
};

}  // namespace cub
#include "../llmcupy_sim_nvrtc_names_on.h"
