// Stand-in for <cuda_pipeline.h> in the CPU emulator: the asynchronous-copy primitives of sm_80+
// (`cp.async`: global -> shared without staging through registers) as synchronous copies.
//
// A copy is done when __pipeline_memcpy_async returns, so __pipeline_commit and
// __pipeline_wait_prior have nothing left to wait for. That is one legal schedule of the real
// thing (a copy may complete at any time before the wait that covers it): a kernel that reads a
// buffer before waiting for its group is wrong on a GPU but may pass here; the barrier the kernel
// needs after the wait (other threads' copies) is still required and still checked.
//
// What is checked, because the hardware faults or silently misbehaves otherwise: the size is 4,
// 8 or 16 bytes, both addresses are aligned to it, and zfill (bytes zero-filled at the end instead
// of read) is at most the size.
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim.h"

#pragma push_macro("LLMCUPY_SIM_HOST_HEADERS")  // the host's own header, not the user's (HOST_HEADERS in sim/compiler.py)
#define LLMCUPY_SIM_HOST_HEADERS 1
#include <cstdio>
#include <cstdlib>
#include <cstring>
#pragma pop_macro("LLMCUPY_SIM_HOST_HEADERS")

#ifndef LLMCUPY_SIM_ACCESS_HOOKS
#define LLMCUPY_SIM_COPY_HELPER
#define LLMCUPY_SIM_SEE_COPY(DST, SRC, READ, WRITTEN) ((void)0)
#endif

LLMCUPY_SIM_COPY_HELPER inline void __pipeline_memcpy_async(void* dst_shared, const void* src_global,
                                                            size_t size_and_align, size_t zfill = 0) {
    const size_t n = size_and_align;
    if ((n != 4 && n != 8 && n != 16) || zfill > n || reinterpret_cast<size_t>(dst_shared) % n ||
        reinterpret_cast<size_t>(src_global) % n) {
        std::fprintf(stderr,
                     "llmcupy sim: __pipeline_memcpy_async(size %zu, zfill %zu) needs size 4, 8 or 16, both "
                     "addresses aligned to it and zfill <= size (dst %p, src %p)\n",
                     n, zfill, dst_shared, src_global);
        std::abort();
    }
    // src_global is not read for the zero-filled tail: a fully zero-filled copy may name any address
    LLMCUPY_SIM_SEE_COPY(dst_shared, src_global, n - zfill, n);  // the sanitizers see the copy (memcpy is not instrumented)
    std::memcpy(dst_shared, src_global, n - zfill);
    std::memset(static_cast<char*>(dst_shared) + (n - zfill), 0, zfill);
}

inline void __pipeline_commit() {}
inline void __pipeline_wait_prior(size_t /*prior*/) {}
// NVRTC's <cuda_pipeline.h> declares uint16_t, uint32_t, uint64_t and uintptr_t
#define LLMCUPY_SIM_NVRTC_HAS_PIPELINE_INTEGERS 1
#include "llmcupy_sim_nvrtc_names_on.h"
