// Stand-in for <cooperative_groups/reduce.h> in the CPU emulator. cg::reduce is an all-gather over
// the tile followed by a fold in lane order, so every lane gets the same value (as on the GPU);
// the order of the fold differs from the GPU's tree, so float results may differ in the last bits.
#pragma once
#include "../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "../cooperative_groups.h"

namespace cooperative_groups {

template <typename T> struct plus { T operator()(const T& a, const T& b) const { return a + b; } };
template <typename T> struct less { T operator()(const T& a, const T& b) const { return b < a ? b : a; } };
template <typename T> struct greater { T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <typename T> struct bit_and { T operator()(const T& a, const T& b) const { return a & b; } };
template <typename T> struct bit_or { T operator()(const T& a, const T& b) const { return a | b; } };
template <typename T> struct bit_xor { T operator()(const T& a, const T& b) const { return a ^ b; } };

template <unsigned int N, typename T, typename Op>
inline T reduce(const thread_block_tile<N>& tile, T value, Op op, int line = __builtin_LINE()) {
    static_assert(sizeof(T) <= llmcupy_sim::kPostBytes, "value too large for cg::reduce in the emulator");
    const auto& g = llmcupy_sim::warp_exchange(tile.mask(), &value, sizeof(T), line, "cg::reduce");
    unsigned int first = (llmcupy_sim::current_lane() / N) * N;
    T acc = llmcupy_sim::read_lane(g, int(first), value);
    for (unsigned int l = 1; l < N; ++l) acc = op(acc, llmcupy_sim::read_lane(g, int(first + l), value));
    return acc;
}

template <typename T, typename Op>
inline T reduce(const coalesced_group& group, T value, Op op, int line = __builtin_LINE()) {
    const auto& g = llmcupy_sim::warp_exchange(group.mask(), &value, sizeof(T), line, "cg::reduce");
    bool first = true;
    T acc = value;
    for (int l = 0; l < 32; ++l) {
        if (!(group.mask() & (1u << l))) continue;
        T x = llmcupy_sim::read_lane(g, l, value);
        acc = first ? x : op(acc, x);
        first = false;
    }
    return acc;
}

}  // namespace cooperative_groups
#include "../llmcupy_sim_nvrtc_names_on.h"
