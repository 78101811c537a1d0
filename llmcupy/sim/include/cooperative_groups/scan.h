// Stand-in for <cooperative_groups/scan.h> in the CPU emulator: inclusive_scan / exclusive_scan over
// a tile or coalesced group, an all-gather followed by a fold in rank order.
#pragma once
#include "../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "reduce.h"

namespace cooperative_groups {
namespace detail {
template <typename G, typename T, typename Op>
inline T scan(const G& group, T value, Op op, bool inclusive, int line) {
    static_assert(sizeof(T) <= llmcupy_sim::kPostBytes, "value too large for a scan in the emulator");
    unsigned int mask = group.mask();
    const auto& g = llmcupy_sim::warp_exchange(mask, &value, sizeof(T), line, "cg::scan");
    int me = llmcupy_sim::current_lane();
    T acc = value;
    bool first = true;
    for (int l = 0; l < 32 && (l < me || (inclusive && l == me)); ++l) {
        if (!(mask & (1u << l))) continue;
        T x = llmcupy_sim::read_lane(g, l, value);
        acc = first ? x : op(acc, x);
        first = false;
    }
    return first ? T{} : acc;  // exclusive scan: rank 0's value is undefined on the GPU; T{} here
}
}  // namespace detail
template <typename G, typename T, typename Op = plus<T>>
inline T inclusive_scan(const G& group, T value, Op op = Op(), int line = __builtin_LINE()) {
    return detail::scan(group, value, op, true, line);
}
template <typename G, typename T, typename Op = plus<T>>
inline T exclusive_scan(const G& group, T value, Op op = Op(), int line = __builtin_LINE()) {
    return detail::scan(group, value, op, false, line);
}
}  // namespace cooperative_groups
#include "../llmcupy_sim_nvrtc_names_on.h"
