// Stand-in for <cooperative_groups/memcpy_async.h> in the CPU emulator: cg::memcpy_async(group, dst,
// src, bytes) (bytes a size or an aligned-size type such as cuda::aligned_size_t<N>), the element-count
// form memcpy_async(group, dst, dst_count, src, src_count), cg::wait(group) and cg::wait_prior<N>(group).
//
// On the GPU the group's threads split the copy between them, each issuing its share as cp.async,
// and the data is guaranteed visible only after cg::wait / cg::wait_prior, which wait for the
// thread's own copies and then synchronise the group. Here each thread copies its own share at once
// (chunks rank, rank + size, ... of the copy's alignment), so before the wait's barrier a thread
// sees only its share and stale data elsewhere: a kernel that reads the buffer before waiting gets
// wrong answers in some thread orders, as it may on a GPU. Every copy being done on return,
// wait_prior<N> waits for no more than wait does; both are the group's barrier (__syncthreads for a
// block, __syncwarp of its lanes for a tile or coalesced group), with that barrier's checks.
#pragma once
#include "../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "../cooperative_groups.h"

#pragma push_macro("LLMCUPY_SIM_HOST_HEADERS")  // the host's own header, not the user's (HOST_HEADERS in sim/compiler.py)
#define LLMCUPY_SIM_HOST_HEADERS 1
#include <cstddef>
#include <cstring>
#include <type_traits>
#pragma pop_macro("LLMCUPY_SIM_HOST_HEADERS")

namespace cooperative_groups {
namespace detail {
// The groups the real header accepts; a grid or a thread_group is a compile error there too.
template <typename G> struct async_copy_group : std::false_type {};
template <> struct async_copy_group<thread_block> : std::true_type {};
template <unsigned int N> struct async_copy_group<thread_block_tile<N>> : std::true_type {};
template <> struct async_copy_group<coalesced_group> : std::true_type {};

// An aligned-size type (cuda::aligned_size_t<N> or alike): a class template over one size_t.
template <typename S> struct aligned_size_hint { static constexpr size_t value = 0; };
template <template <size_t> class A, size_t N> struct aligned_size_hint<A<N>> { static constexpr size_t value = N; };

#ifndef LLMCUPY_SIM_ACCESS_HOOKS
#define LLMCUPY_SIM_COPY_HELPER
#define LLMCUPY_SIM_SEE_COPY(DST, SRC, READ, WRITTEN) ((void)0)
#endif

template <typename G>
LLMCUPY_SIM_COPY_HELPER inline void async_copy_share(const G& group, void* dst, const void* src, size_t bytes, size_t align,
                             bool promised, const char* file, int line) {
    static_assert(async_copy_group<G>::value,
                  "cg::memcpy_async takes a thread_block, a thread_block_tile or a coalesced_group");
    // An aligned size promises the alignment of both addresses and of the size (cuda::aligned_size_t
    // requires the size to be a multiple of it); a broken promise is undefined on the GPU, so the
    // launch stops here, naming the place, instead of copying something plausible.
    if (promised && (reinterpret_cast<size_t>(dst) % align || reinterpret_cast<size_t>(src) % align || bytes % align))
        llmcupy_sim::device_assert_fail(
            "cg::memcpy_async with an aligned size: dst, src and the size must be multiples of its alignment", file,
            line);
    const size_t chunk = align > 16 ? 16 : align;  // cp.async moves at most 16 bytes a thread
    const size_t n = bytes / chunk, rank = group.thread_rank(), size = group.size();
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    // the sanitizers see each chunk (memcpy is not instrumented)
    for (size_t i = rank; i < n; i += size) {
        LLMCUPY_SIM_SEE_COPY(d + i * chunk, s + i * chunk, chunk, chunk);
        std::memcpy(d + i * chunk, s + i * chunk, chunk);
    }
    if (rank == size - 1 && bytes % chunk) {
        LLMCUPY_SIM_SEE_COPY(d + n * chunk, s + n * chunk, bytes % chunk, bytes % chunk);
        std::memcpy(d + n * chunk, s + n * chunk, bytes % chunk);
    }
}

template <typename T> constexpr size_t elem_align() {
    if constexpr (std::is_void<T>::value) return 1;
    else return alignof(T) > 16 ? 16 : alignof(T);
}
}  // namespace detail

// A batch copied by the group: bytes is a byte count, or an aligned-size type promising its alignment.
template <typename G, typename T, typename S>
inline void memcpy_async(const G& group, T* dst, const T* src, const S& bytes, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
    constexpr size_t hint = detail::aligned_size_hint<S>::value;
    if constexpr (hint != 0) {
        static_assert((hint & (hint - 1)) == 0, "an aligned size's alignment must be a power of two");
        detail::async_copy_share(group, dst, src, size_t(bytes), hint, true, file, line);
    } else {
        static_assert(std::is_integral<S>::value, "cg::memcpy_async: the size is a byte count or an aligned size");
        detail::async_copy_share(group, dst, src, size_t(bytes), detail::elem_align<T>(), false, file, line);
    }
}

// A batch of min(dst_count, src_count) elements (counts in elements, not bytes).
template <typename G, typename T, typename DstCount, typename SrcCount,
          typename = std::enable_if_t<!std::is_pointer<DstCount>::value>>
inline void memcpy_async(const G& group, T* dst, const DstCount& dst_count, const T* src, const SrcCount& src_count,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const size_t dn = size_t(dst_count), sn = size_t(src_count);
    detail::async_copy_share(group, dst, src, (dn < sn ? dn : sn) * sizeof(T), detail::elem_align<T>(), false, file,
                             line);
}

// Waits for all batches but the newest N (here all are done) and synchronises the group.
template <unsigned int N, typename G>
inline void wait_prior(const G& group, int line = __builtin_LINE()) {
    static_assert(detail::async_copy_group<G>::value, "cg::wait_prior takes the group that issued the copies");
    group.sync(line);
}

// Waits for every batch and synchronises the group.
template <typename G>
inline void wait(const G& group, int line = __builtin_LINE()) {
    static_assert(detail::async_copy_group<G>::value, "cg::wait takes the group that issued the copies");
    group.sync(line);
}
}  // namespace cooperative_groups
#include "../llmcupy_sim_nvrtc_names_on.h"
