// llmcupy_sim.h -- the CPU emulator's stand-in for the CUDA device runtime.
//
// The emulator compiles an unchanged .cu file with g++ against this header. Every CUDA thread of a
// block is a fiber (its own stack) and all fibers of a block run on one OS thread; blocks are spread
// over a few OS threads (in a cooperative launch, one OS thread per block, all at once: see
// GridBarrier). A fiber only gives up the CPU at a synchronisation point: __syncthreads() and its
// variants, a warp collective (shuffle, vote, __syncwarp, __activemask, cooperative-groups
// sync/reduce/scan), and where a GPU thread may wait for another's progress: a volatile access (in
// sources that declare volatile data), an atomic that leaves memory unchanged twice in a row or a
// failed atomicCAS (a poll), __nanosleep. The scheduler then decides what is released, so between
// two such points the threads of a block run one after the other, in the order the launch asks
// for (forward, reverse or seeded random). Lanes of a warp are released from a collective together
// only when every lane of the group waits at the same kind of collective with the same mask.
//
// What makes it a test tool (counted per launch and returned to Python):
//   - shared memory is filled with 0xFF bytes (a NaN for float) when each block starts;
//   - divergent_barriers: a __syncthreads() released while threads wait at different call sites;
//   - barrier_after_exit: a __syncthreads() that some threads of the block never reach because
//     they returned (undefined in CUDA, even if recent GPUs tolerate it);
//   - exited_lane_reads: a warp collective that reads a lane which has exited or is not in the mask;
//   - deadlock: no thread can make progress; reported with the source lines they wait at.
// And as errors that stop the launch (a Python exception; the process lives on): a failed device
// assert(), a write into the guard bytes around a shared array, a launch past the watchdog's time
// limit (threads that never reach a sync point are interrupted by a signal), grid_group::sync()
// outside a cooperative launch; in a cooperative launch a block that returned while others wait at
// grid.sync() is a deadlock.
//
// What it does not model: timing, coalescing, bank conflicts, FMA contraction and rounding order.
// Races between two barriers are not visible in a plain build (a thread runs from one sync point
// to the next without interruption, so an unsynchronised read-after-write within that window is
// only exposed by changing the order); the instrumented build's racecheck names them (see "Access
// hooks" below and llmcupy_sim_check.h), with memcheck and initcheck beside it.
#pragma once
// uint, ushort, ulong: a -D the source's options give them stays out of glibc's typedefs (see the end)
#pragma push_macro("uint")
#pragma push_macro("ushort")
#pragma push_macro("ulong")
#undef uint
#undef ushort
#undef ulong

// clang keeps instrumenting the atomics of a no_sanitize_thread function (GCC does not), so the
// emulator's own ThreadSanitizer hooks, which use atomics, would call themselves without end; clang
// 14's disable_sanitizer_instrumentation turns that off too. Every no_sanitize_thread of these headers
// means both.
#if defined(__clang__) && (defined(LLMCUPY_SIM_ACCESS_HOOKS) || defined(LLMCUPY_SIM_VOLATILE_HOOKS))
#if __has_attribute(disable_sanitizer_instrumentation)
#define no_sanitize_thread no_sanitize_thread, disable_sanitizer_instrumentation
#else
#error "this clang is older than clang 14: the emulator's sanitizers and sources that use volatile need clang 14 or newer (or g++); set CXX to one"
#endif
#endif

// macOS declares the ucontext functions only under _XOPEN_SOURCE, and its ucontext_t has room for the
// registers getcontext saves only when _XOPEN_SOURCE was defined before the first system header (a
// ucontext_t declared without it is smaller, and getcontext writes past its end). _DARWIN_C_SOURCE
// keeps the rest of the system's declarations (MAP_ANON, ...) that _XOPEN_SOURCE alone would hide.
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700
#define _DARWIN_C_SOURCE 1
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <cassert>
#include <cfloat>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cfenv>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <limits>
#include <ctime>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <chrono>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

// The assembly context switch (llmcupy_sim_switch.h) is written for x86-64 and aarch64, ELF (Linux,
// the BSDs) and Mach-O (macOS); other CPUs, and builds with -DLLMCUPY_SIM_UCONTEXT, use ucontext.
#if (defined(__x86_64__) || defined(__aarch64__)) && (defined(__ELF__) || defined(__APPLE__)) && \
    !defined(LLMCUPY_SIM_UCONTEXT)
#define LLMCUPY_SIM_ASM_SWITCH 1
#endif
// ucontext: the switch without the assembly one; on macOS also the signal context that the fault
// handler reads the stack pointer from (signal_stack_pointer), declared there by this header
#if !defined(LLMCUPY_SIM_ASM_SWITCH) || defined(__APPLE__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/asan_interface.h>
#define LLMCUPY_SIM_ASAN 1
#endif

// ---------------------------------------------------------------------------------------------
// CUDA keywords
// ---------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
// __launch_bounds__'s third argument (max blocks per cluster) exists from sm_90 on: below, NVRTC refuses it.
#define LLMCUPY_SIM_FOURTH(a, b, c, d, ...) d
#define __launch_bounds__(...) LLMCUPY_SIM_FOURTH(__VA_ARGS__, LLMCUPY_SIM_CLUSTER_BOUND, , , )
// The register limit and a kernel parameter kept in constant memory change nothing on a CPU
// (NVRTC's rule that a __grid_constant__ parameter be const is checked in sim/compiler.py).
#define __maxnreg__(n)
#define __grid_constant__
// clang's __builtin_assume, which NVRTC has: a hint, never evaluated; g++ lacks it (its argument is still
// type-checked here, as NVRTC checks it)
#if !defined(__has_builtin) || !__has_builtin(__builtin_assume)
#define __builtin_assume(...) ((void)sizeof((__VA_ARGS__) ? 1 : 0))
#endif
#define __align__(n) alignas(n)
#define __builtin_align__(n) alignas(n)
// Not `static`: RawModule.get_global finds __constant__ and __device__ variables by address.
#define __constant__
// What sim/compiler.py puts on a __device__/__constant__ variable and a static local: NVRTC takes only a
// constant initializer there, and so does constinit (GCC's spelling works in C++17, clang's is an attribute).
#if defined(__clang__)
#define LLMCUPY_SIM_CONSTANT_INIT __attribute__((require_constant_initialization))
#else
#define LLMCUPY_SIM_CONSTANT_INIT __constinit
#endif
// The Python side rewrites every `__shared__` declaration it recognises (see sim/compiler.py) so
// that it is poisoned per block; anything it does not recognise still works, unpoisoned.
#define __shared__ static thread_local
#define __CUDACC__ 1
// As under NVRTC, so `#if` guards take the device branch; -arch=sm_XY sets it (sim/compiler.py).
#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 800
#endif
// (__launch_bounds__ above)
#if __CUDA_ARCH__ >= 900
#define LLMCUPY_SIM_CLUSTER_BOUND
#else
#define LLMCUPY_SIM_CLUSTER_BOUND _Pragma("GCC error \"__launch_bounds__ takes a third argument (max blocks per cluster) only for sm_90 and newer (NVRTC refuses it too: cannot specify max blocks per cluster for this GPU architecture); drop it, or compile with -arch=sm_90 or newer\"")
#endif
#define __CUDACC_RTC__ 1
#define __CUDACC_VER_MAJOR__ 12
#define __CUDACC_VER_MINOR__ 0
// NVRTC's other version macros (12.4, 12.9 and 13.5 define each; tests/test_nvrtc_parity.py), for the CUDA 12.0
// the emulator presents: undefined, a kernel's `#if CUDART_VERSION >= 11000` took the old branch here (an
// undefined name is 0 in #if) and the new one on a GPU. Hidden while libcu++ is read (llmcupy_sim_libcuxx_begin.h).
#define __CUDACC_VER_BUILD__ 76   // CUDA 12.0's first release: nvcc and NVRTC 12.0.76
#define CUDART_VERSION 12000      // major * 1000 + minor * 10
#define __CUDART_API_VERSION 12000
#define __CUDA_ARCH_LIST__ __CUDA_ARCH__   // NVRTC compiles for the one -arch it is given
#define __NVCC_DIAG_PRAGMA_SUPPORT__ 1     // #pragma nv_diag_suppress, ...: g++ ignores them
#define LLMCUPY_SIM 1
#define LLMCUPY_SIM_EXPORT __attribute__((visibility("default")))

// ---------------------------------------------------------------------------------------------
// Vector types, with CUDA's alignment (float4 is 16-byte aligned, which the float4 loads need)
// ---------------------------------------------------------------------------------------------
// All of CUDA's vector_types.h: NAME1..NAME4 with CUDA's alignment for 1, 2 and 4 components
// (3-component types are aligned like their element) and the make_NAME<k> constructors.
#define LLMCUPY_SIM_VEC(NAME, T, A2, A4)                                                         \
    struct alignas(sizeof(T)) NAME##1 { T x; };                                                   \
    struct alignas(A2) NAME##2 { T x, y; };                                                      \
    struct NAME##3 { T x, y, z; };                                                               \
    struct alignas(A4) NAME##4 { T x, y, z, w; };                                                \
    inline NAME##1 make_##NAME##1(T x) { return {x}; }                                            \
    inline NAME##2 make_##NAME##2(T x, T y) { return {x, y}; }                                    \
    inline NAME##3 make_##NAME##3(T x, T y, T z) { return {x, y, z}; }                            \
    inline NAME##4 make_##NAME##4(T x, T y, T z, T w) { return {x, y, z, w}; }
LLMCUPY_SIM_VEC(char, signed char, 2, 4)
LLMCUPY_SIM_VEC(uchar, unsigned char, 2, 4)
LLMCUPY_SIM_VEC(short, short, 4, 8)
LLMCUPY_SIM_VEC(ushort, unsigned short, 4, 8)
LLMCUPY_SIM_VEC(int, int, 8, 16)
LLMCUPY_SIM_VEC(uint, unsigned int, 8, 16)
LLMCUPY_SIM_VEC(long, long, 16, 16)
LLMCUPY_SIM_VEC(ulong, unsigned long, 16, 16)
LLMCUPY_SIM_VEC(longlong, long long, 16, 16)
LLMCUPY_SIM_VEC(ulonglong, unsigned long long, 16, 16)
LLMCUPY_SIM_VEC(float, float, 8, 16)
LLMCUPY_SIM_VEC(double, double, 16, 16)
#undef LLMCUPY_SIM_VEC

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

// the CUDA runtime's types and enumerators, which NVRTC declares in every kernel (cudaError_t, cudaStream_t, ...)
#include "llmcupy_sim_cudart_types.h"

namespace llmcupy_sim {

// ---------------------------------------------------------------------------------------------
// Launch interface shared with Python (ctypes mirrors these two structs)
// ---------------------------------------------------------------------------------------------
struct LaunchConfig {
    unsigned int grid[3];
    unsigned int block[3];
    unsigned long long shared_mem;
    int order;          // 0 forward, 1 reverse, 2 seeded random (reshuffled at every release)
    int workers;        // OS threads used for blocks
    unsigned long long seed;
    int poison;         // fill shared memory with 0xFF at block start
    unsigned long long stack_bytes;   // fiber stack the kernel needs (from -fstack-usage), 0: default
    unsigned long long timeout_ms;    // watchdog: abandon the launch after this long, 0: no limit
    // Instrumented builds only (LLMCUPY_SIM_ACCESS_HOOKS); plain builds ignore them.
    unsigned check;                   // CHECK_* bits wanted for this launch: 1 race, 2 memory, 4 init, 8 metrics
    unsigned nbuffers;                // how many (begin, end) pairs `buffers` holds
    const unsigned long long* buffers;   // the root allocations of the array arguments, index = argument
    int cooperative;                  // a cooperative launch: every block at once, grid.sync() allowed
};

struct LaunchResult {
    unsigned long long divergent_barriers;
    unsigned long long barrier_after_exit;
    unsigned long long exited_lane_reads;
    int deadlock;
    int error;
    char message[2048];
    int assert_failed;        // a device assert() failed (message names kernel, line, block, thread)
    int timed_out;            // the watchdog stopped the launch (message says where threads were)
    int shared_overflow;      // a write landed just outside a shared-memory array
    int sanitizer_stop;       // memcheck stopped the launch before a bad access (reports: llmcupy_sim_check_reports)
    int memory_fault;         // a thread faulted (SIGSEGV/SIGBUS) in kernel code; its block was abandoned
};

enum FiberState : int { READY = 0, AT_BARRIER = 1, AT_WARP = 2, DONE = 3 };
// What a lane waits at, for matching lanes of one warp collective: lanes are released together only
// when each waits at the same kind of collective with the same mask. Shuffles of different modes
// (idx/up/down/xor) and the votes mix as on sm_70+, where they are one instruction each.
enum CollectiveKind : int { COLL_OTHER = 0, COLL_SYNCWARP = 1, COLL_SHFL = 2, COLL_VOTE = 3, COLL_ACTIVEMASK = 4 };
// BAR_GRID: cg::this_grid().sync(), the block's barrier and then every other block's (cooperative launches)
enum BarrierKind : int { BAR_PLAIN = 0, BAR_COUNT = 1, BAR_AND = 2, BAR_OR = 3, BAR_GRID = 4 };

constexpr int kMaxThreads = 1024;
constexpr int kPostBytes = 32;   // largest value a warp collective moves per lane

struct Fiber {
    void* sp = nullptr;                   // saved stack pointer while switched out
#ifndef LLMCUPY_SIM_ASM_SWITCH
    ucontext_t ctx;
#endif
    char* stack = nullptr;                // mmap'ed, with a guard (stack_guard_bytes) at the low end
    size_t stack_size = 0;
    dim3 tid;
    int linear = 0, warp = 0, lane = 0;
    int state = READY;
    int wait_line = 0;                    // source line of the barrier or collective it waits at
    const char* wait_what = "";
    unsigned int wait_mask = 0;
    int wait_kind = COLL_OTHER;
    int predicate = 0;                    // for __syncthreads_count/and/or
    const void* poll_addr = nullptr;      // last atomic's address and value: repeated polls yield
    unsigned long long poll_value = 0;
    int poll_repeats = 0;
    bool polling = false;                 // last seen polling memory (volatile, atomic, __nanosleep)
    alignas(16) unsigned char post[kPostBytes];
};

struct WarpGather {
    alignas(16) unsigned char value[32][kPostBytes];  // snapshot of every lane's post at release
    unsigned int valid = 0;                           // lanes whose value is meaningful
};

constexpr size_t kGuardBytes = 16;       // canary bytes on both sides of every shared array
constexpr unsigned char kGuardByte = 0xA5;

// The shared memory of the block an OS thread runs, static arrays and dynamic (`extern __shared__`)
// alike, lives in a window of address space of its own, laid out as on a GPU: the static arrays,
// then the dynamic shared memory. The window is a large reservation without access rights; only
// the bytes in use (and their guard bytes) are readable and writable, in its middle. An index
// however far outside an array then stays inside the window: memcheck names the nearest array at
// any distance, and a plain launch faults there instead of reading or changing whatever memory lies
// beyond (in thread-local storage or the heap, a far index lands in the emulator's own data or a
// fiber stack and could pass unnoticed). Reserving costs address space only, never memory.
//
//   | no access ... | static arrays (grow down) | guard, dynamic, guard (grow up) | no access ... |
//                                               ^ the middle of the window
//
// A static array's storage is taken when a block first touches it on this OS thread and kept for
// the thread's life (the arrays of all the library's kernels, each at its own place); the dynamic
// bytes are resized at every launch. An index past the end of a static array runs into the arrays
// taken before it, then into the dynamic memory, as on a GPU where they share one window.
class SharedMemoryWindow {
public:
    // +-8 GiB around the middle: every 32-bit index of a 4-byte type stays inside
    static constexpr size_t kReserve = size_t(16) << 30;
    // static arrays at most this far below the middle (a GPU gives a block at most 227 KiB in all)
    static constexpr size_t kStaticLimit = size_t(1) << 30;

    SharedMemoryWindow() = default;
    SharedMemoryWindow(const SharedMemoryWindow&) = delete;
    SharedMemoryWindow& operator=(const SharedMemoryWindow&) = delete;
    ~SharedMemoryWindow() {
        if (base_ != nullptr) munmap(base_, kReserve);
    }

    // The launch's dynamic storage: kGuardBytes, then the shared_mem bytes, then kGuardBytes.
    unsigned char* dynamic() const { return base_ == nullptr ? nullptr : middle() - kGuardBytes; }
    size_t dynamic_size() const { return size_; }
    // Readable and writable bytes from dynamic() on (whole pages; dynamic_size() of them belong to the launch).
    size_t dynamic_capacity() const { return base_ == nullptr ? 0 : size_t(rw_end_ - dynamic()); }
    uintptr_t window_lo() const { return uintptr_t(base_); }
    uintptr_t window_hi() const { return uintptr_t(base_) + (base_ == nullptr ? 0 : kReserve); }

    // Makes `bytes` bytes from dynamic() on accessible and zero; the pages past them lose access again.
    void assign_dynamic(size_t bytes) {
        reserve();
        const size_t page = page_size();
        if (bytes > kReserve / 2 - page) {
            std::fprintf(stderr, "llmcupy sim: %zu bytes of dynamic shared memory do not fit the window\n", bytes);
            std::abort();
        }
        // whole pages from the middle's page (which holds the first guard bytes) to the one with the last byte
        size_t from_page = size_t(dynamic() - (middle() - page)) + bytes;
        unsigned char* end = middle() - page + (from_page + page - 1) / page * page;
        if (end > rw_end_) protect(rw_end_, end, PROT_READ | PROT_WRITE, bytes);
        if (end < rw_end_) mprotect(end, size_t(rw_end_ - end), PROT_NONE);
        rw_end_ = end;
        size_ = bytes;
        std::memset(dynamic(), 0, bytes);
    }

    // Storage for one static array (its guard bytes included) below those taken so far, aligned to
    // `align`; zero, and readable and writable for the rest of the thread's life.
    unsigned char* take_static(size_t bytes, size_t align) {
        reserve();
        uintptr_t lo = (uintptr_t(static_lo_) - bytes) & ~uintptr_t(align - 1);
        if (bytes > kStaticLimit || uintptr_t(middle()) - page_size() - lo > kStaticLimit) {
            std::fprintf(stderr, "llmcupy sim: more than %zu MiB of static shared arrays\n", kStaticLimit >> 20);
            std::abort();
        }
        unsigned char* p = reinterpret_cast<unsigned char*>(lo);
        unsigned char* begin = reinterpret_cast<unsigned char*>(lo & ~uintptr_t(page_size() - 1));
        if (begin < rw_begin_) {
            protect(begin, rw_begin_, PROT_READ | PROT_WRITE, bytes);
            rw_begin_ = begin;
        }
        static_lo_ = p;
        return p;
    }

private:
    static size_t page_size() { return size_t(sysconf(_SC_PAGESIZE)); }
    unsigned char* middle() const { return base_ + kReserve / 2; }

    void reserve() {
        if (base_ != nullptr) return;
        void* mem = mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) {
            std::fprintf(stderr, "llmcupy sim: cannot reserve %zu GiB of address space for shared memory: %s\n",
                         kReserve >> 30, std::strerror(errno));
            std::abort();
        }
        base_ = static_cast<unsigned char*>(mem);
        // the page below the middle holds the dynamic memory's first guard bytes; static arrays go below it
        rw_begin_ = rw_end_ = static_lo_ = middle() - page_size();
    }

    static void protect(unsigned char* from, unsigned char* to, int prot, size_t bytes) {
        if (mprotect(from, size_t(to - from), prot) != 0) {
            std::fprintf(stderr, "llmcupy sim: cannot map %zu bytes of shared memory: %s\n", bytes, std::strerror(errno));
            std::abort();
        }
    }

    unsigned char* base_ = nullptr;
    unsigned char* rw_begin_ = nullptr;   // the lowest accessible byte (static arrays' pages)
    unsigned char* rw_end_ = nullptr;     // one past the highest (the dynamic memory's pages)
    unsigned char* static_lo_ = nullptr;  // the lowest static storage taken
    size_t size_ = 0;
};

struct Worker;

// Per-OS-thread state. Fibers of one block run on one OS thread, so `thread_local` is per block.
struct Worker {
    std::vector<Fiber> fibers;
    std::vector<int> order;
    void* sched_sp = nullptr;
#ifndef LLMCUPY_SIM_ASM_SWITCH
    ucontext_t sched_ctx;
#endif
    Fiber* cur = nullptr;
    int nthreads = 0;
    dim3 block_idx;
    WarpGather gathers[kMaxThreads / 32];
    int barrier_result = 0;
    SharedMemoryWindow shared;
    unsigned long long epoch = 0;
    void (*thunk)(void*) = nullptr;
    void* closure = nullptr;
    std::mt19937_64 rng;
    LaunchResult counters{};
    bool abandoned = false;
    bool in_fiber = false;                // a fiber (not the scheduler) runs on this OS thread
    const char* kernel_name = "";
    const LaunchConfig* cfg = nullptr;
    struct SharedGuard { unsigned char* lo; unsigned char* hi; const char* name; int line; size_t bytes; };
    std::vector<SharedGuard> guards;      // canaries around the shared arrays this block touched
    bool dynamic_used = false;            // this block declared its extern __shared__ array
#ifdef LLMCUPY_SIM_ASAN
    void* fake_stack = nullptr;
    const void* sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
#endif
};

inline thread_local Worker* tls_worker = nullptr;
inline thread_local unsigned long long tls_epoch = 0;
inline thread_local int tls_poison = 1;
inline dim3 g_grid_dim, g_block_dim;   // same for every block of a launch (one launch at a time)
inline bool g_cooperative = false;     // the running launch is cooperative (grid_group::is_valid())

// Emulator code that kernel code calls (barriers, collectives, shared-memory lookup, the index
// accessors) is kept out of GCC's access instrumentation in instrumented builds: its loads and
// stores are the emulator's bookkeeping, not the kernel's. GCC does not inline such a function
// into instrumented code, which is fine there; in plain builds the attribute is absent.
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
#define LLMCUPY_SIM_NOSAN_FN __attribute__((no_sanitize_thread))
#else
#define LLMCUPY_SIM_NOSAN_FN
#endif

#ifdef LLMCUPY_SIM_ACCESS_HOOKS
// ---------------------------------------------------------------------------------------------
// Access hooks (instrumented builds: sim/compiler.py build_library(..., instrument=True)).
//
// The kernel's translation unit is compiled with GCC's -fsanitize=thread instrumentation (no TSan
// runtime) and line tables; the __tsan_* hooks at the end of this header turn every load and store
// of the kernel's own code into an Access handed to each registered AccessObserver, BEFORE the
// access happens (an observer may stop the launch there: see stop_launch). Accesses made by the
// emulator (scheduler, barriers, collectives, the hooks, the Worker and Fiber records) never reach
// observers. `pc` is the hook's return address, inside the kernel's code: sim/symbols.py maps it to
// file:line. LaunchConfig::check says what this launch wants (CHECK_* bits); an observer whose bit
// is off does nothing. Any member of an observer may be null. Observers are registered with
// add_observer, e.g. from a static initialiser in a header included by an instrumented build; the
// sanitizers (race, memory, init) live in llmcupy_sim_check.h.
//   on_launch_begin(cfg)          before any block runs (one launch at a time per library)
//   on_block_begin(w)             a block starts on worker w (w->block_idx, w->nthreads set)
//   on_access(w, f, access)       fiber f of w is about to load/store access.size bytes at access.addr
//   on_block_barrier(w)           a __syncthreads (any variant, cg sync) released the block
//   on_warp_sync(w, warp, lanes)  a warp collective or __syncwarp released these lanes of a warp
//   on_block_end(w)               every thread of the block finished (not called for a stopped block)
//   on_launch_end(res)            after the last block
//   on_fence(w)                   a thread of w executed __threadfence() or __threadfence_system()
//   on_atomic_begin(w, addr, flags), on_atomic_end(w, addr, flags)
//                                 around the memory operation of an atomic (after on_access saw it):
//                                 an observer may hold a lock between the two, so that what it
//                                 records per atomic is ordered as the atomics themselves are; also
//                                 right before a volatile load or store (flags has ACCESS_VOLATILE)
//   on_grid_arrive(w, gen, first) block w reached grid.sync() number `gen` of the launch (its own
//                                 barrier already released; `first`: no block arrived before it)
//   on_grid_depart(w, gen)        every block reached it: w goes on. Both are called with the grid
//                                 barrier's lock held, so arrivals of one sync all come before
//                                 any departure from it
// on_access runs on the worker's OS thread; blocks run concurrently on several workers, so
// per-block state belongs in thread_local storage and launch-wide state needs a lock.
// Rules for observer code, which is compiled into the same instrumented unit:
//   - mark its functions __attribute__((no_sanitize_thread)); the library templates it calls are
//     instrumented but silenced (tls_quiet is set while observers run);
//   - no thread_local object with a constructor (its initialiser is compiler-made, instrumented
//     code): use a thread_local pointer and allocate in on_block_begin;
//   - helpers that copy on the kernel's behalf with memcpy (cp.async stand-ins) report the copy
//     with LLMCUPY_SIM_SEE_COPY, as the compiler does not instrument library calls.
// The launch's buffers (LaunchConfig::buffers, the root allocation of each array argument, by
// argument index) and w->guards / w->shared (shared memory) tell observers what an address is.
// ---------------------------------------------------------------------------------------------
enum CheckBits : unsigned { CHECK_RACE = 1, CHECK_MEMORY = 2, CHECK_INIT = 4, CHECK_METRICS = 8 };
// ACCESS_VOLATILE: a volatile load or store. PTX treats those as relaxed, "morally strong" accesses
// that do not race with atomics or each other (between blocks); within a block racecheck keeps
// treating them as plain (warp-synchronous code that relied on volatile is a hazard since Volta).
// ACCESS_MISALIGNED: the compiler took the access as aligned to its size (the type's alignment: a
// float4 loaded through reinterpret_cast) but the address is not; a GPU stops with "misaligned
// address", x86 mostly does not notice.
enum AccessFlags : unsigned { ACCESS_WRITE = 1, ACCESS_ATOMIC = 2, ACCESS_VOLATILE = 4, ACCESS_MISALIGNED = 8 };
struct Access { const void* addr; unsigned size; unsigned flags; const void* pc; };
struct AccessObserver {
    void (*on_launch_begin)(const LaunchConfig*);
    void (*on_block_begin)(Worker*);
    void (*on_access)(Worker*, Fiber*, const Access&);
    void (*on_block_barrier)(Worker*);
    void (*on_warp_sync)(Worker*, int warp, unsigned lanes);
    void (*on_block_end)(Worker*);
    void (*on_launch_end)(LaunchResult*);
    void (*on_fence)(Worker*);
    void (*on_atomic_begin)(Worker*, const void* addr, unsigned flags);
    void (*on_atomic_end)(Worker*, const void* addr, unsigned flags);
    void (*on_grid_arrive)(Worker*, unsigned long long gen, bool first);
    void (*on_grid_depart)(Worker*, unsigned long long gen);
};
constexpr int kMaxObservers = 8;
inline const AccessObserver* g_observers[kMaxObservers];
inline int g_nobservers = 0;
inline unsigned g_check = 0;   // the running launch's LaunchConfig::check
// Non-zero while the emulator's own code runs on a fiber (an observer, the shared-memory set-up):
// the C++ library templates it calls are instrumented like any code in the unit, and their
// accesses must not reach the observers (nor re-enter them).
inline thread_local int tls_quiet = 0;
#define LLMCUPY_SIM_QUIET_BEGIN ++::llmcupy_sim::tls_quiet
#define LLMCUPY_SIM_QUIET_END --::llmcupy_sim::tls_quiet
// The kernel's own atomicCAS tells racecheck its address and compare value just before its
// compare-exchange (the emulator's CAS loops behind float atomics do not): a plain read whose value
// the same thread then passes as `compare` is validated by that CAS (see llmcupy_sim_check.h).
inline thread_local const void* tls_cas_addr = nullptr;
inline thread_local unsigned long long tls_cas_compare = 0;
template <typename T>
LLMCUPY_SIM_NOSAN_FN inline void note_cas(const T* a, T compare) {
    if (!(g_check & CHECK_RACE)) return;
    unsigned long long bits = 0;
    std::memcpy(&bits, &compare, sizeof(T) < 8 ? sizeof(T) : 8);
    tls_cas_addr = a;
    tls_cas_compare = bits;
}
LLMCUPY_SIM_NOSAN_FN inline void add_observer(const AccessObserver* o) {
    for (int i = 0; i < g_nobservers; ++i)
        if (g_observers[i] == o) return;
    if (g_nobservers < kMaxObservers) g_observers[g_nobservers++] = o;
}
#define LLMCUPY_SIM_NOTIFY(MEMBER, ...)                                                    \
    do {                                                                                  \
        if (::llmcupy_sim::g_check)                                                       \
            for (int i_ = 0; i_ < ::llmcupy_sim::g_nobservers; ++i_)                      \
                if (::llmcupy_sim::g_observers[i_]->MEMBER) ::llmcupy_sim::g_observers[i_]->MEMBER(__VA_ARGS__); \
    } while (0)
#else
#define LLMCUPY_SIM_NOTIFY(MEMBER, ...) do { } while (0)
#define LLMCUPY_SIM_QUIET_BEGIN ((void)0)
#define LLMCUPY_SIM_QUIET_END ((void)0)
#endif

}  // namespace llmcupy_sim

// The built-in index variables. threadIdx is read through the running fiber: the context switch
// is an opaque call, so the compiler reloads it after every sync point.
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
// Instrumented builds read them through uninstrumented accessors (by value), so the emulator's
// records never show up as kernel accesses.
namespace llmcupy_sim {
LLMCUPY_SIM_NOSAN_FN inline dim3 thread_idx() { return tls_worker->cur->tid; }
LLMCUPY_SIM_NOSAN_FN inline dim3 block_idx() { return tls_worker->block_idx; }
LLMCUPY_SIM_NOSAN_FN inline dim3 block_dim() { return g_block_dim; }
LLMCUPY_SIM_NOSAN_FN inline dim3 grid_dim() { return g_grid_dim; }
}  // namespace llmcupy_sim
#define threadIdx (llmcupy_sim::thread_idx())
#define blockIdx (llmcupy_sim::block_idx())
#define blockDim (llmcupy_sim::block_dim())
#define gridDim (llmcupy_sim::grid_dim())
#else
#define threadIdx (llmcupy_sim::tls_worker->cur->tid)
#define blockIdx (llmcupy_sim::tls_worker->block_idx)
#define blockDim (llmcupy_sim::g_block_dim)
#define gridDim (llmcupy_sim::g_grid_dim)
#endif
// warpSize is a built-in variable on a GPU, not a compile-time constant: NVRTC refuses it in an array
// size, a template argument, constexpr, static_assert or a case label ("expression must have a
// constant value"). A run-time initializer makes g++ refuse the same uses; its address and a static
// initializer, which g++ takes and NVRTC refuses, are refused by sim/compiler.py (rewrite_warp_size);
// every other use reads 32.
namespace llmcupy_sim {
inline int warp_size_read_at_run_time() { return 32; }
}  // namespace llmcupy_sim
static const int warpSize = llmcupy_sim::warp_size_read_at_run_time();

// ---------------------------------------------------------------------------------------------
// Context switch: llmcupy_sim_switch.h (assembly, x86-64 and aarch64, ELF and Mach-O), or ucontext
// elsewhere and with -DLLMCUPY_SIM_UCONTEXT.
// ---------------------------------------------------------------------------------------------
#ifdef LLMCUPY_SIM_ASM_SWITCH
#include "llmcupy_sim_switch.h"
#endif

namespace llmcupy_sim {

inline void fiber_main(Fiber* f);

inline void init_fiber_stack(Fiber* f) {
#if defined(LLMCUPY_SIM_ASM_SWITCH) && defined(__aarch64__)
    uintptr_t top = (reinterpret_cast<uintptr_t>(f->stack) + f->stack_size) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top) - LLMCUPY_SIM_SWITCH_FRAME_WORDS;   // 176 bytes
    std::memset(sp, 0, LLMCUPY_SIM_SWITCH_FRAME_WORDS * sizeof(uint64_t));  // x21..x29, d8..d15: 0
    sp[0] = reinterpret_cast<uint64_t>(f);                           // x19: argument
    sp[1] = reinterpret_cast<uint64_t>(&fiber_main);                 // x20: function
    sp[11] = reinterpret_cast<uint64_t>(&llmcupy_sim_trampoline);    // x30: where the switch returns
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    sp[20] = fpcr;                                                   // the creating thread's FP control
    f->sp = sp;
#elif defined(LLMCUPY_SIM_ASM_SWITCH)
    uintptr_t top = (reinterpret_cast<uintptr_t>(f->stack) + f->stack_size) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top) - LLMCUPY_SIM_SWITCH_FRAME_WORDS;   // 64 bytes
    uint32_t ctrl[2];
    __asm__ volatile("stmxcsr %0" : "=m"(ctrl[0]));
    __asm__ volatile("fnstcw %0" : "=m"(ctrl[1]));
    std::memcpy(&sp[0], ctrl, 8);                                    // mxcsr + x87 control word
    sp[1] = 0;                                                       // r15
    sp[2] = 0;                                                       // r14
    sp[3] = reinterpret_cast<uint64_t>(&fiber_main);                 // r13: function
    sp[4] = reinterpret_cast<uint64_t>(f);                           // r12: argument
    sp[5] = 0;                                                       // rbx
    sp[6] = 0;                                                       // rbp
    sp[7] = reinterpret_cast<uint64_t>(&llmcupy_sim_trampoline);     // return address
    f->sp = sp;
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = f->stack_size;
    f->ctx.uc_link = nullptr;
    // makecontext passes int arguments: split the pointer in two halves.
    uintptr_t p = reinterpret_cast<uintptr_t>(f);
    makecontext(&f->ctx, (void (*)())(+[](unsigned lo, unsigned hi) {
                    fiber_main(reinterpret_cast<Fiber*>((uintptr_t(hi) << 32) | lo));
                }),
                2, unsigned(p & 0xffffffffu), unsigned(p >> 32));
#endif
}

LLMCUPY_SIM_NOSAN_FN inline void switch_to_fiber(Worker* w, Fiber* f) {
    w->cur = f;
    w->in_fiber = true;
#ifdef LLMCUPY_SIM_ASAN
    __sanitizer_start_switch_fiber(&w->fake_stack, f->stack, f->stack_size);
#endif
#ifdef LLMCUPY_SIM_ASM_SWITCH
    llmcupy_sim_switch(&w->sched_sp, f->sp);
#else
    swapcontext(&w->sched_ctx, &f->ctx);
#endif
#ifdef LLMCUPY_SIM_ASAN
    __sanitizer_finish_switch_fiber(w->fake_stack, nullptr, nullptr);
#endif
    w->in_fiber = false;
}

LLMCUPY_SIM_NOSAN_FN inline void switch_to_scheduler(Worker* w, bool finished = false) {
    Fiber* f = w->cur;
#ifdef LLMCUPY_SIM_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, w->sched_stack_bottom, w->sched_stack_size);
#endif
#ifdef LLMCUPY_SIM_ASM_SWITCH
    llmcupy_sim_switch(&f->sp, w->sched_sp);
#else
    swapcontext(&f->ctx, &w->sched_ctx);
#endif
#ifdef LLMCUPY_SIM_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    (void)finished;
}

LLMCUPY_SIM_NOSAN_FN inline void fiber_main(Fiber* f) {
    Worker* w = tls_worker;
#ifdef LLMCUPY_SIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &w->sched_stack_bottom, &w->sched_stack_size);
#endif
    w->thunk(w->closure);
    f->state = DONE;
    switch_to_scheduler(w, true);
    std::abort();  // a finished fiber is never resumed
}

// ---------------------------------------------------------------------------------------------
// Synchronisation: a fiber records what it waits for and yields; the scheduler releases it.
// ---------------------------------------------------------------------------------------------
LLMCUPY_SIM_NOSAN_FN inline void wait_at_barrier(int kind, int pred, int line, const char* what) {
    Worker* w = tls_worker;
    Fiber* f = w->cur;
    f->state = AT_BARRIER;
    f->polling = false;
    f->wait_line = line;
    f->wait_what = what;
    f->predicate = (kind == BAR_PLAIN) ? 0 : pred;
    f->wait_mask = unsigned(kind);
    switch_to_scheduler(w);
}

// Posts `bytes` bytes of `value` for the lanes named in `mask`, waits until every live lane of the
// mask has posted, and returns the gathered snapshot of the warp.
LLMCUPY_SIM_NOSAN_FN inline const WarpGather& warp_exchange(unsigned mask, const void* value, size_t bytes, int line, const char* what,
                                       int kind = COLL_OTHER) {
    Worker* w = tls_worker;
    Fiber* f = w->cur;
    if (bytes) std::memcpy(f->post, value, bytes);
    f->state = AT_WARP;
    f->polling = false;
    f->wait_mask = mask | (1u << f->lane);
    f->wait_kind = kind;
    f->wait_line = line;
    f->wait_what = what;
    switch_to_scheduler(w);
    return w->gathers[f->warp];
}

// Gives the CPU to the other threads of the block without waiting for anything: used where a GPU
// thread could be waiting for another thread's progress (a volatile access, a repeated atomic poll),
// which independent thread scheduling (sm_70+) guarantees.
LLMCUPY_SIM_NOSAN_FN inline void yield_fiber(int line, const char* what) {
    Worker* w = tls_worker;
    if (w == nullptr || !w->in_fiber) return;
    Fiber* f = w->cur;
    f->polling = true;
    f->wait_line = line;
    f->wait_what = what;
    switch_to_scheduler(w);  // state stays READY: the scheduler resumes it on its next pass
}

// An atomic that returns the same old value at the same address as this thread's previous atomic is
// a poll (a spin lock, a flag wait): after two in a row the thread yields so the writer can run.
LLMCUPY_SIM_NOSAN_FN inline void note_atomic(const void* addr, unsigned long long old, int line, const char* what) {
    Worker* w = tls_worker;
    if (w == nullptr || !w->in_fiber) return;
    Fiber* f = w->cur;
    if (f->poll_addr == addr && f->poll_value == old) {
        if (++f->poll_repeats >= 2) {
            f->poll_repeats = 0;
            yield_fiber(line, what);
        }
    } else {
        f->poll_addr = addr;
        f->poll_value = old;
        f->poll_repeats = 0;
    }
}

LLMCUPY_SIM_NOSAN_FN inline int current_lane() { return tls_worker->cur->lane; }

// Reads lane `src`'s value from a gathered snapshot; a lane that exited or did not take part is a
// hazard (CUDA returns an undefined value), counted and answered with the caller's own value.
template <typename T>
LLMCUPY_SIM_NOSAN_FN inline T read_lane(const WarpGather& g, int src, T own) {
    if (src < 0 || src > 31 || !(g.valid & (1u << src))) {
        tls_worker->counters.exited_lane_reads++;
        return own;
    }
    T out;
    std::memcpy(&out, g.value[src], sizeof(T));
    return out;
}

// Shared memory: one storage per declaration site and per OS thread (= per running block), in the
// thread's shared-memory window (SharedMemoryWindow, above), poisoned the first time a block touches
// it. Guard bytes on both sides (kGuardBytes, above) are checked when the block ends, so a write just
// outside the array is reported at the launch that made it.

// In the AddressSanitizer build the guard bytes are also poisoned, so ASan reports any access to
// them, reads included, where it happens.
inline void guard_poison(void* p, size_t n) {
#ifdef LLMCUPY_SIM_ASAN
    __asan_poison_memory_region(p, n);
#else
    (void)p, (void)n;
#endif
}
inline void guard_unpoison(void* p, size_t n) {
#ifdef LLMCUPY_SIM_ASAN
    __asan_unpoison_memory_region(p, n);
#else
    (void)p, (void)n;
#endif
}

template <typename T, int ID>
LLMCUPY_SIM_NOSAN_FN inline T& shared_var(const char* name = "?", int line = 0) {
    constexpr size_t guard = alignof(T) > kGuardBytes ? alignof(T) : kGuardBytes;
    constexpr size_t bytes = sizeof(T) + 2 * guard;
    static thread_local unsigned char* storage = nullptr;
    static thread_local unsigned long long epoch = 0;
    if (__builtin_expect(epoch != tls_epoch, 0)) {
        LLMCUPY_SIM_QUIET_BEGIN;
        if (storage == nullptr) storage = tls_worker->shared.take_static(bytes, guard);
        epoch = tls_epoch;
        guard_unpoison(storage, bytes);
        if (tls_poison) std::memset(storage + guard, 0xFF, sizeof(T));
        std::memset(storage, kGuardByte, guard);
        std::memset(storage + guard + sizeof(T), kGuardByte, guard);
        guard_poison(storage, guard);
        guard_poison(storage + guard + sizeof(T), guard);
        tls_worker->guards.push_back({storage, storage + guard + sizeof(T), name, line, sizeof(T)});
        LLMCUPY_SIM_QUIET_END;
    }
    return *reinterpret_cast<T*>(storage + guard);
}

template <typename T>
LLMCUPY_SIM_NOSAN_FN inline T* dynamic_shared() {
    tls_worker->dynamic_used = true;
    return reinterpret_cast<T*>(tls_worker->shared.dynamic() + kGuardBytes);
}

// A `__shared__` variable declared at file scope (outside any function): every use looks up the
// running block's storage, because a file-scope object is created once, when the library loads.
template <typename T, int ID>
struct FileShared {
    const char* name;
    int line;
    T& get() const { return shared_var<T, ID>(name, line); }
    operator T&() const { return get(); }
    template <typename I> decltype(auto) operator[](I i) const { return get()[i]; }
    template <typename U, typename A = T, typename = std::enable_if_t<std::is_array_v<A>>>
    explicit operator U*() const { return reinterpret_cast<U*>(&get()); }
    auto operator&() const { return &get(); }
    template <typename V> const FileShared& operator=(const V& v) const { get() = v; return *this; }
};
template <typename T>
struct FileDynamicShared {
    T* get() const { return dynamic_shared<T>(); }
    operator T*() const { return get(); }
    template <typename I> T& operator[](I i) const { return get()[i]; }
    template <typename U, typename = std::enable_if_t<!std::is_same_v<U, T>>>
    explicit operator U*() const { return reinterpret_cast<U*>(get()); }
};

}  // namespace llmcupy_sim

// ---------------------------------------------------------------------------------------------
// Barriers
// ---------------------------------------------------------------------------------------------
inline void __syncthreads(int line = __builtin_LINE()) {
    llmcupy_sim::wait_at_barrier(llmcupy_sim::BAR_PLAIN, 0, line, "__syncthreads");
}
inline int __syncthreads_count(int pred, int line = __builtin_LINE()) {
    llmcupy_sim::wait_at_barrier(llmcupy_sim::BAR_COUNT, pred != 0, line, "__syncthreads_count");
    return llmcupy_sim::tls_worker->barrier_result;
}
inline int __syncthreads_and(int pred, int line = __builtin_LINE()) {
    llmcupy_sim::wait_at_barrier(llmcupy_sim::BAR_AND, pred != 0, line, "__syncthreads_and");
    return llmcupy_sim::tls_worker->barrier_result;
}
inline int __syncthreads_or(int pred, int line = __builtin_LINE()) {
    llmcupy_sim::wait_at_barrier(llmcupy_sim::BAR_OR, pred != 0, line, "__syncthreads_or");
    return llmcupy_sim::tls_worker->barrier_result;
}
inline void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
    llmcupy_sim::warp_exchange(mask, nullptr, 0, line, "__syncwarp", llmcupy_sim::COLL_SYNCWARP);
}
// A device-wide fence orders this thread's accesses for other blocks (which run on other OS threads);
// the threads of a block share one OS thread, so a block-wide fence only has to stop the compiler.
// Observers see device fences: racecheck between blocks treats a fence followed by an atomic as
// publishing the block's earlier accesses (llmcupy_sim_check.h).
namespace llmcupy_sim {
LLMCUPY_SIM_NOSAN_FN inline void device_fence() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
    Worker* w = tls_worker;
    if (g_check && !tls_quiet && w != nullptr && w->in_fiber) {
        ++tls_quiet;
        LLMCUPY_SIM_NOTIFY(on_fence, w);
        --tls_quiet;
    }
#endif
}
}  // namespace llmcupy_sim
inline void __threadfence() { llmcupy_sim::device_fence(); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { llmcupy_sim::device_fence(); }

// ---------------------------------------------------------------------------------------------
// Warp shuffles and votes (a masked all-gather; `width` splits the warp into segments)
// ---------------------------------------------------------------------------------------------
// Shuffles follow the PTX ISA's shfl.sync with CUDA's clamp operand c = ((32 - width) << 8) | 0x1f
// (0 for up): segmask = 32 - width, the segment's last lane maxLane = (lane & segmask) | (~segmask
// & 31), its first minLane = lane & segmask. A source past the allowed end returns the caller's own
// value; an xor source in an *earlier* segment is read (the programming guide's note).
// CUDA declares the shuffle intrinsics for these value types only (bool, char, short and enums
// convert to int); cooperative_groups' tile.shfl() takes any trivially copyable type of up to 32
// bytes, and calls them with kAnyType.
namespace llmcupy_sim {
template <typename T>
struct shuffle_value : std::bool_constant<std::is_arithmetic_v<T> || std::is_enum_v<T>> {};
}  // namespace llmcupy_sim
#define LLMCUPY_SIM_SHUFFLE_TYPES(T, ANY)                                                                   \
    static_assert(ANY || llmcupy_sim::shuffle_value<T>::value,                                                \
                  "a warp shuffle (__shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync) takes an " \
                  "int, unsigned, long long, float, double, __half, __nv_bfloat16 or their 2-vectors, as "    \
                  "CUDA declares it (NVRTC refuses others too: no instance of overloaded function matches "   \
                  "the argument list); shuffle a struct or a vector type (float2, float4) field by field, "   \
                  "or with a cooperative_groups tile's shfl(), which takes any trivially copyable type");     \
    static_assert(sizeof(T) <= llmcupy_sim::kPostBytes && std::is_trivially_copyable_v<T>,                    \
                  "Cooperative groups collectives are limited to trivially copyable types of size <= 32 bytes")
template <typename T, bool kAnyType = false>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32, int line = __builtin_LINE()) {
    LLMCUPY_SIM_SHUFFLE_TYPES(T, kAnyType);
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_sync", llmcupy_sim::COLL_SHFL);
    int segmask = (32 - width) & 31;
    int j = (lane & segmask) | (src & 31 & ~segmask);
    if (j > ((lane & segmask) | (31 & ~segmask))) return v;
    return llmcupy_sim::read_lane(g, j, v);
}
template <typename T, bool kAnyType = false>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, int line = __builtin_LINE()) {
    LLMCUPY_SIM_SHUFFLE_TYPES(T, kAnyType);
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_up_sync", llmcupy_sim::COLL_SHFL);
    int segmask = (32 - width) & 31;
    int j = lane - int(delta & 31);
    if (j < (lane & segmask)) return v;
    return llmcupy_sim::read_lane(g, j, v);
}
template <typename T, bool kAnyType = false>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, int line = __builtin_LINE()) {
    LLMCUPY_SIM_SHUFFLE_TYPES(T, kAnyType);
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_down_sync", llmcupy_sim::COLL_SHFL);
    int segmask = (32 - width) & 31;
    int j = lane + int(delta & 31);
    if (j > ((lane & segmask) | (31 & ~segmask))) return v;
    return llmcupy_sim::read_lane(g, j, v);
}
template <typename T, bool kAnyType = false>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, int line = __builtin_LINE()) {
    LLMCUPY_SIM_SHUFFLE_TYPES(T, kAnyType);
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_xor_sync", llmcupy_sim::COLL_SHFL);
    int segmask = (32 - width) & 31;
    int j = lane ^ (lane_mask & 31);
    if (j > ((lane & segmask) | (31 & ~segmask))) return v;
    return llmcupy_sim::read_lane(g, j, v);
}
inline unsigned __ballot_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    int p = pred != 0;
    const auto& g = llmcupy_sim::warp_exchange(mask, &p, sizeof(int), line, "__ballot_sync", llmcupy_sim::COLL_VOTE);
    unsigned out = 0;
    for (int l = 0; l < 32; ++l) {
        if (!(mask & (1u << l))) continue;
        int v = llmcupy_sim::read_lane(g, l, 0);
        if (v) out |= 1u << l;
    }
    return out;
}
inline int __all_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    int p = pred != 0;
    const auto& g = llmcupy_sim::warp_exchange(mask, &p, sizeof(int), line, "__all_sync", llmcupy_sim::COLL_VOTE);
    for (int l = 0; l < 32; ++l)
        if ((mask & (1u << l)) && !llmcupy_sim::read_lane(g, l, 1)) return 0;
    return 1;
}
inline int __any_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    int p = pred != 0;
    const auto& g = llmcupy_sim::warp_exchange(mask, &p, sizeof(int), line, "__any_sync", llmcupy_sim::COLL_VOTE);
    for (int l = 0; l < 32; ++l)
        if ((mask & (1u << l)) && llmcupy_sim::read_lane(g, l, 0)) return 1;
    return 0;
}
inline int __uni_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    return __all_sync(mask, pred, line) || !__any_sync(mask, pred, line);
}
// __match_*_sync and __reduce_*_sync (sm_70 / sm_80): an all-gather of the mask's lanes.
template <typename T>
inline unsigned __match_any_sync(unsigned mask, T v, int line = __builtin_LINE()) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "__match_any_sync takes 32- or 64-bit values");
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__match_any_sync", llmcupy_sim::COLL_SHFL);
    unsigned out = 0;
    for (int l = 0; l < 32; ++l)
        if ((mask & (1u << l)) && std::memcmp(g.value[l], &v, sizeof(T)) == 0 && (g.valid & (1u << l))) out |= 1u << l;
    return out;
}
template <typename T>
inline unsigned __match_all_sync(unsigned mask, T v, int* pred, int line = __builtin_LINE()) {
    unsigned same = __match_any_sync(mask, v, line);
    *pred = same == (mask & llmcupy_sim::tls_worker->gathers[llmcupy_sim::tls_worker->cur->warp].valid);
    return *pred ? mask : 0u;
}
namespace llmcupy_sim {
template <typename T, typename Op>
inline T warp_fold(unsigned mask, T v, Op op, int line, const char* what) {
    const auto& g = warp_exchange(mask, &v, sizeof(T), line, what, COLL_SHFL);
    bool first = true;
    T acc = v;
    for (int l = 0; l < 32; ++l) {
        if (!(mask & (1u << l))) continue;
        T x = read_lane(g, l, v);
        acc = first ? x : op(acc, x);
        first = false;
    }
    return acc;
}
}  // namespace llmcupy_sim
inline unsigned __reduce_add_sync(unsigned m, unsigned v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](unsigned a, unsigned b) { return a + b; }, line, "__reduce_add_sync"); }
inline int __reduce_add_sync(unsigned m, int v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](int a, int b) { return int(unsigned(a) + unsigned(b)); }, line, "__reduce_add_sync"); }
inline unsigned __reduce_min_sync(unsigned m, unsigned v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](unsigned a, unsigned b) { return a < b ? a : b; }, line, "__reduce_min_sync"); }
inline int __reduce_min_sync(unsigned m, int v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](int a, int b) { return a < b ? a : b; }, line, "__reduce_min_sync"); }
inline unsigned __reduce_max_sync(unsigned m, unsigned v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](unsigned a, unsigned b) { return a > b ? a : b; }, line, "__reduce_max_sync"); }
inline int __reduce_max_sync(unsigned m, int v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](int a, int b) { return a > b ? a : b; }, line, "__reduce_max_sync"); }
inline unsigned __reduce_and_sync(unsigned m, unsigned v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](unsigned a, unsigned b) { return a & b; }, line, "__reduce_and_sync"); }
inline unsigned __reduce_or_sync(unsigned m, unsigned v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](unsigned a, unsigned b) { return a | b; }, line, "__reduce_or_sync"); }
inline unsigned __reduce_xor_sync(unsigned m, unsigned v, int line = __builtin_LINE()) { return llmcupy_sim::warp_fold(m, v, [](unsigned a, unsigned b) { return a ^ b; }, line, "__reduce_xor_sync"); }

// The lanes converged at this call: the scheduler releases it only when no other collective of the
// warp can proceed, and then together with every lane of the warp waiting at the same call site, so
// the answer is the largest group a GPU could have converged there (never lanes elsewhere).
inline unsigned __activemask(int line = __builtin_LINE()) {
    const auto& g = llmcupy_sim::warp_exchange(0u, nullptr, 0, line, "__activemask", llmcupy_sim::COLL_ACTIVEMASK);
    (void)g;
    unsigned m;
    std::memcpy(&m, llmcupy_sim::tls_worker->cur->post, sizeof m);
    return m;
}

// ---------------------------------------------------------------------------------------------
// Atomics on global or shared memory. Blocks run on several OS threads, so these are real atomics.
// ---------------------------------------------------------------------------------------------
template <typename T>
inline T llmcupy_sim_atomic_rmw(T* addr, T val, int op) {
    if constexpr (std::is_integral_v<T>) {
        switch (op) {
            case 0: return __atomic_fetch_add(addr, val, __ATOMIC_SEQ_CST);
            case 1: return __atomic_fetch_sub(addr, val, __ATOMIC_SEQ_CST);
            case 2: return __atomic_exchange_n(addr, val, __ATOMIC_SEQ_CST);
            case 5: return __atomic_fetch_and(addr, val, __ATOMIC_SEQ_CST);
            case 6: return __atomic_fetch_or(addr, val, __ATOMIC_SEQ_CST);
            case 7: return __atomic_fetch_xor(addr, val, __ATOMIC_SEQ_CST);
            default: break;
        }
    }
    T old;
    __atomic_load(addr, &old, __ATOMIC_SEQ_CST);
    while (true) {
        T next;
        switch (op) {
            case 0: next = old + val; break;
            case 1: next = old - val; break;
            case 2: next = val; break;
            case 3: next = old > val ? old : val; break;
            default: next = old < val ? old : val; break;
        }
        if (__atomic_compare_exchange(addr, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return old;
    }
}
// CUDA declares plain overloads per pointer type (atomicAdd(unsigned*, unsigned), ...), so the value
// converts to the pointee: deduce T from the pointer only. Each atomic also notes a repeated poll of
// one address (see note_atomic), so a spin lock or a flag wait between threads of a block progresses.
namespace llmcupy_sim {
template <typename T> struct same_type { using type = T; };
template <typename T> using nondeduced = typename same_type<T>::type;
template <typename T>
inline unsigned long long poll_bits(T v) {
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T) < 8 ? sizeof(T) : 8);
    return bits;
}
// Only an atomic that cannot change memory is a poll (add/sub/or/xor of 0, exchange with the value
// already there, max/min that keeps the old value): the accumulating atomics of ordinary kernels
// skip the bookkeeping, which needs the thread-local worker.
template <typename T>
inline T atomic_op(T* a, T v, int op, int line, const char* what) {
    T old = llmcupy_sim_atomic_rmw(a, v, op);
    // Flags are integers: floating-point atomics (accumulations, often of 0) never count as polls.
    if constexpr (!std::is_integral_v<T>) return old;
    bool unchanged;
    switch (op) {
        case 0: case 1: case 6: case 7: unchanged = poll_bits(v) == 0; break;
        case 2: unchanged = poll_bits(v) == poll_bits(old); break;
        case 3: unchanged = !(old < v); break;
        case 4: unchanged = !(v < old); break;
        default: unchanged = (poll_bits(old) & poll_bits(v)) == poll_bits(old); break;  // and
    }
    if (__builtin_expect(unchanged, 0)) note_atomic(a, poll_bits(old), line, what);
    return old;
}
// libcu++'s atomics (cuda::atomic_ref, cuda::std::atomic, ...) are host code here, built on GCC's __atomic
// builtins, which never yield: a thread spinning on one (a flag wait, a spin lock) held the CPU until the
// watchdog, while the thread that would set the flag never ran. llmcupy_sim_libcuxx_begin.h sends the
// builtins of libcu++'s headers through these, which note a poll as CUDA's atomics do (note_atomic): a load or
// a failed compare-exchange that sees the same value at the same address, an exchange or fetch that leaves
// memory as it was.
template <typename P, typename R>
inline void libcuxx_atomic_load(P* a, R* ret, int order) {
    __atomic_load(a, ret, order);
    note_atomic((const void*)a, poll_bits(*ret), 0, "a libcu++ atomic load");
}
template <typename P, typename E, typename D>
inline bool libcuxx_atomic_compare_exchange(P* a, E* expected, D* desired, bool weak, int success, int failure) {
    bool exchanged = __atomic_compare_exchange(a, expected, desired, weak, success, failure);
    if (!exchanged) note_atomic((const void*)a, poll_bits(*expected), 0, "a libcu++ atomic compare-exchange");
    return exchanged;
}
template <typename P, typename V, typename R>
inline void libcuxx_atomic_exchange(P* a, V* value, R* ret, int order) {
    __atomic_exchange(a, value, ret, order);
    if (poll_bits(*value) == poll_bits(*ret)) note_atomic((const void*)a, poll_bits(*ret), 0, "a libcu++ atomic exchange");
}
// fetch_add/sub/or/xor of zero: a poll written as a read-modify-write (libcu++'s floating-point adds are
// compare-exchange loops, so these are integers and pointers)
#define LLMCUPY_SIM_LIBCUXX_FETCH(OP)                                                                   \
    template <typename P, typename V>                                                                  \
    inline auto libcuxx_atomic_fetch_##OP(P* a, V v, int order) {                                      \
        auto old = __atomic_fetch_##OP(a, v, order);                                                   \
        if (v == 0) note_atomic((const void*)a, poll_bits(old), 0, "a libcu++ atomic fetch_" #OP);   \
        return old;                                                                                    \
    }
LLMCUPY_SIM_LIBCUXX_FETCH(add)
LLMCUPY_SIM_LIBCUXX_FETCH(sub)
LLMCUPY_SIM_LIBCUXX_FETCH(or)
LLMCUPY_SIM_LIBCUXX_FETCH(xor)
#undef LLMCUPY_SIM_LIBCUXX_FETCH
}  // namespace llmcupy_sim
#define LLMCUPY_SIM_ATOMIC(NAME, OP)                                                                    \
    template <typename T>                                                                              \
    inline T NAME(T* a, llmcupy_sim::nondeduced<T> v, int line = __builtin_LINE()) {                    \
        return llmcupy_sim::atomic_op(a, v, OP, line, #NAME);                                           \
    }                                                                                                  \
    template <typename T>                                                                              \
    inline T NAME##_block(T* a, llmcupy_sim::nondeduced<T> v, int line = __builtin_LINE()) {            \
        return llmcupy_sim::atomic_op(a, v, OP, line, #NAME);                                           \
    }                                                                                                  \
    template <typename T>                                                                              \
    inline T NAME##_system(T* a, llmcupy_sim::nondeduced<T> v, int line = __builtin_LINE()) {           \
        return llmcupy_sim::atomic_op(a, v, OP, line, #NAME);                                           \
    }
LLMCUPY_SIM_ATOMIC(atomicAdd, 0)
LLMCUPY_SIM_ATOMIC(atomicSub, 1)
LLMCUPY_SIM_ATOMIC(atomicExch, 2)
LLMCUPY_SIM_ATOMIC(atomicMax, 3)
LLMCUPY_SIM_ATOMIC(atomicMin, 4)
LLMCUPY_SIM_ATOMIC(atomicAnd, 5)
LLMCUPY_SIM_ATOMIC(atomicOr, 6)
LLMCUPY_SIM_ATOMIC(atomicXor, 7)
#undef LLMCUPY_SIM_ATOMIC
// CUDA's wrapping counters: inc stores (old >= limit) ? 0 : old + 1, dec stores
// (old == 0 || old > limit) ? limit : old - 1; both return old.
inline unsigned int atomicInc(unsigned int* a, unsigned int limit, int line = __builtin_LINE()) {
    unsigned int old = __atomic_load_n(a, __ATOMIC_SEQ_CST), next;
    do { next = old >= limit ? 0u : old + 1u; } while (!__atomic_compare_exchange_n(a, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
inline unsigned int atomicDec(unsigned int* a, unsigned int limit, int line = __builtin_LINE()) {
    unsigned int old = __atomic_load_n(a, __ATOMIC_SEQ_CST), next;
    do { next = (old == 0u || old > limit) ? limit : old - 1u; } while (!__atomic_compare_exchange_n(a, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
// the scoped forms: every scope is the whole emulated device, as in atomicAdd_block/_system
inline unsigned int atomicInc_block(unsigned int* a, unsigned int limit, int line = __builtin_LINE()) { return atomicInc(a, limit, line); }
inline unsigned int atomicInc_system(unsigned int* a, unsigned int limit, int line = __builtin_LINE()) { return atomicInc(a, limit, line); }
inline unsigned int atomicDec_block(unsigned int* a, unsigned int limit, int line = __builtin_LINE()) { return atomicDec(a, limit, line); }
inline unsigned int atomicDec_system(unsigned int* a, unsigned int limit, int line = __builtin_LINE()) { return atomicDec(a, limit, line); }
template <typename T>
inline T atomicCAS(T* a, llmcupy_sim::nondeduced<T> compare, llmcupy_sim::nondeduced<T> val, int line = __builtin_LINE()) {
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
    llmcupy_sim::note_cas<T>(a, compare);
#endif
    if (!__atomic_compare_exchange(a, &compare, &val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        llmcupy_sim::note_atomic(a, llmcupy_sim::poll_bits(compare), line, "atomicCAS");  // a failed CAS may be a spin
    return compare;
}
template <typename T>
inline T atomicCAS_block(T* a, llmcupy_sim::nondeduced<T> c, llmcupy_sim::nondeduced<T> v, int line = __builtin_LINE()) { return atomicCAS(a, c, v, line); }
template <typename T>
inline T atomicCAS_system(T* a, llmcupy_sim::nondeduced<T> c, llmcupy_sim::nondeduced<T> v, int line = __builtin_LINE()) { return atomicCAS(a, c, v, line); }

// ---------------------------------------------------------------------------------------------
// Cache-hinted loads and stores are plain loads and stores on a CPU.
// ---------------------------------------------------------------------------------------------
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldca(const T* p) { return *p; }
template <typename T> inline T __ldlu(const T* p) { return *p; }
template <typename T> inline T __ldcv(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }
template <typename T> inline void __stwb(T* p, T v) { *p = v; }
template <typename T> inline void __stwt(T* p, T v) { *p = v; }

// ---------------------------------------------------------------------------------------------
// Math: fast-math intrinsics map to the accurate libm functions (the emulator is not a rounding
// model of the GPU; tolerances in the tests cover --use_fast_math on the device).
// ---------------------------------------------------------------------------------------------
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float fdividef(float a, float b) { return a / b; }   // the Math API's name for it
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return x > 0.f ? (x > 1.f ? 1.f : x) : 0.f; }  // NaN -> 0, as cvt.sat
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float exp10f(float x) { return std::pow(10.0f, x); }
// Float-to-integer conversions follow PTX's cvt: NaN gives 0 and out-of-range values saturate to
// the type's limits (a plain C++ cast is undefined there; x86 gives INT_MIN).
namespace llmcupy_sim {
template <typename I, typename F>
inline I cvt_sat(F x) {
    if (std::isnan(x)) return I(0);
    if (x <= F(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
    if (x >= F(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return I(x);
}
}  // namespace llmcupy_sim
inline int __float2int_rn(float x) { return llmcupy_sim::cvt_sat<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return llmcupy_sim::cvt_sat<int>(std::trunc(x)); }
inline int __float2int_rd(float x) { return llmcupy_sim::cvt_sat<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return llmcupy_sim::cvt_sat<int>(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return llmcupy_sim::cvt_sat<unsigned>(std::nearbyint(x)); }
inline unsigned __float2uint_rz(float x) { return llmcupy_sim::cvt_sat<unsigned>(std::trunc(x)); }
inline unsigned __float2uint_rd(float x) { return llmcupy_sim::cvt_sat<unsigned>(std::floor(x)); }
inline unsigned __float2uint_ru(float x) { return llmcupy_sim::cvt_sat<unsigned>(std::ceil(x)); }
inline long long __float2ll_rn(float x) { return llmcupy_sim::cvt_sat<long long>(std::nearbyint(x)); }
inline long long __float2ll_rz(float x) { return llmcupy_sim::cvt_sat<long long>(std::trunc(x)); }
inline unsigned long long __float2ull_rn(float x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::nearbyint(x)); }
inline unsigned long long __float2ull_rz(float x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::trunc(x)); }
inline int __double2int_rn(double x) { return llmcupy_sim::cvt_sat<int>(std::nearbyint(x)); }
inline int __double2int_rz(double x) { return llmcupy_sim::cvt_sat<int>(std::trunc(x)); }
inline int __double2int_rd(double x) { return llmcupy_sim::cvt_sat<int>(std::floor(x)); }
inline int __double2int_ru(double x) { return llmcupy_sim::cvt_sat<int>(std::ceil(x)); }
inline unsigned __double2uint_rn(double x) { return llmcupy_sim::cvt_sat<unsigned>(std::nearbyint(x)); }
inline unsigned __double2uint_rz(double x) { return llmcupy_sim::cvt_sat<unsigned>(std::trunc(x)); }
inline long long __double2ll_rn(double x) { return llmcupy_sim::cvt_sat<long long>(std::nearbyint(x)); }
inline long long __double2ll_rz(double x) { return llmcupy_sim::cvt_sat<long long>(std::trunc(x)); }
inline float __int2float_rn(int x) { return float(x); }
inline float __uint2float_rn(unsigned x) { return float(x); }
inline float __ll2float_rn(long long x) { return float(x); }
inline float __ull2float_rn(unsigned long long x) { return float(x); }
inline double __int2double_rn(int x) { return double(x); }
inline double __uint2double_rn(unsigned x) { return double(x); }
inline double __ll2double_rn(long long x) { return double(x); }
inline float __double2float_rn(double x) { return float(x); }
inline float __double2float_rz(double x) {
    float f = float(x);
    if (std::isfinite(x) && std::fabs(double(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
    return f;
}
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
inline double __longlong_as_double(long long i) { double x; std::memcpy(&x, &i, 8); return x; }
inline int __double2hiint(double x) { return int(__double_as_longlong(x) >> 32); }
inline int __double2loint(double x) { return int(__double_as_longlong(x) & 0xffffffff); }
inline double __hiloint2double(int hi, int lo) { return __longlong_as_double((long long)((unsigned long long)(unsigned)hi << 32 | (unsigned)lo)); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __drcp_rn(double a) { return 1.0 / a; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsub_rn(float a, float b) { return a - b; }
// The directed-rounding forms (_rz toward zero, _rd down, _ru up) compute under the C rounding mode the
// suffix names, which the CPU applies to its own IEEE operations and conversions, so each result is the
// exact value rounded that way, as PTX's add.rz etc. give it (overflow under _rz gives the largest finite
// value, not infinity). Nothing here flushes subnormals: the emulator ignores -ftz, for these as for the
// _rn forms. No other emulated thread computes on this OS thread until the mode is put back (a fiber
// switches only at a sync point). GCC, without -frounding-math, takes every operation to round to nearest:
// it would fold one on constants or move it across fesetround; the empty asm statements stop both.
namespace llmcupy_sim {
template <typename T> inline void opaque(T& x) { asm volatile("" : "+m"(x) : : "memory"); }
template <int Mode>
struct RoundingScope {
    int saved = std::fegetround();
    RoundingScope() { std::fesetround(Mode); asm volatile("" : : : "memory"); }
    ~RoundingScope() { asm volatile("" : : : "memory"); std::fesetround(saved); }
};
template <int Mode, typename R, typename... A, typename Op>
inline R rounded(Op op, A... args) {
    RoundingScope<Mode> scope;
    (opaque(args), ...);
    R r = op(args...);
    opaque(r);
    return r;
}
}  // namespace llmcupy_sim
#define LLMCUPY_SIM_DIRECTED(suffix, mode)                                                                          \
    inline float __fadd_##suffix(float a, float b) { return llmcupy_sim::rounded<mode, float>([](float x, float y) { return x + y; }, a, b); } \
    inline float __fsub_##suffix(float a, float b) { return llmcupy_sim::rounded<mode, float>([](float x, float y) { return x - y; }, a, b); } \
    inline float __fmul_##suffix(float a, float b) { return llmcupy_sim::rounded<mode, float>([](float x, float y) { return x * y; }, a, b); } \
    inline float __fdiv_##suffix(float a, float b) { return llmcupy_sim::rounded<mode, float>([](float x, float y) { return x / y; }, a, b); } \
    inline float __frcp_##suffix(float a) { return llmcupy_sim::rounded<mode, float>([](float x) { return 1.0f / x; }, a); } \
    inline float __fsqrt_##suffix(float a) { return llmcupy_sim::rounded<mode, float>([](float x) { return std::sqrt(x); }, a); } \
    inline float __fmaf_##suffix(float a, float b, float c) { return llmcupy_sim::rounded<mode, float>([](float x, float y, float z) { return std::fma(x, y, z); }, a, b, c); } \
    inline float __fmaf_ieee_##suffix(float a, float b, float c) { return __fmaf_##suffix(a, b, c); } \
    inline double __dadd_##suffix(double a, double b) { return llmcupy_sim::rounded<mode, double>([](double x, double y) { return x + y; }, a, b); } \
    inline double __dsub_##suffix(double a, double b) { return llmcupy_sim::rounded<mode, double>([](double x, double y) { return x - y; }, a, b); } \
    inline double __dmul_##suffix(double a, double b) { return llmcupy_sim::rounded<mode, double>([](double x, double y) { return x * y; }, a, b); } \
    inline double __ddiv_##suffix(double a, double b) { return llmcupy_sim::rounded<mode, double>([](double x, double y) { return x / y; }, a, b); } \
    inline double __drcp_##suffix(double a) { return llmcupy_sim::rounded<mode, double>([](double x) { return 1.0 / x; }, a); } \
    inline double __dsqrt_##suffix(double a) { return llmcupy_sim::rounded<mode, double>([](double x) { return std::sqrt(x); }, a); } \
    inline double __fma_##suffix(double a, double b, double c) { return llmcupy_sim::rounded<mode, double>([](double x, double y, double z) { return std::fma(x, y, z); }, a, b, c); } \
    inline float __uint2float_##suffix(unsigned a) { return llmcupy_sim::rounded<mode, float>([](unsigned x) { return float(x); }, a); } \
    inline float __ll2float_##suffix(long long a) { return llmcupy_sim::rounded<mode, float>([](long long x) { return float(x); }, a); } \
    inline float __ull2float_##suffix(unsigned long long a) { return llmcupy_sim::rounded<mode, float>([](unsigned long long x) { return float(x); }, a); } \
    inline double __ll2double_##suffix(long long a) { return llmcupy_sim::rounded<mode, double>([](long long x) { return double(x); }, a); } \
    inline double __ull2double_##suffix(unsigned long long a) { return llmcupy_sim::rounded<mode, double>([](unsigned long long x) { return double(x); }, a); }
LLMCUPY_SIM_DIRECTED(rz, FE_TOWARDZERO)
LLMCUPY_SIM_DIRECTED(rd, FE_DOWNWARD)
LLMCUPY_SIM_DIRECTED(ru, FE_UPWARD)
#undef LLMCUPY_SIM_DIRECTED
inline float __fmaf_ieee_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __ull2double_rn(unsigned long long x) { return double(x); }
inline float __int2float_rz(int a) { return llmcupy_sim::rounded<FE_TOWARDZERO, float>([](int x) { return float(x); }, a); }
inline float __int2float_rd(int a) { return llmcupy_sim::rounded<FE_DOWNWARD, float>([](int x) { return float(x); }, a); }
inline float __int2float_ru(int a) { return llmcupy_sim::rounded<FE_UPWARD, float>([](int x) { return float(x); }, a); }
inline float __double2float_rd(double a) { return llmcupy_sim::rounded<FE_DOWNWARD, float>([](double x) { return float(x); }, a); }
inline float __double2float_ru(double a) { return llmcupy_sim::rounded<FE_UPWARD, float>([](double x) { return float(x); }, a); }
inline long long __float2ll_rd(float x) { return llmcupy_sim::cvt_sat<long long>(std::floor(x)); }
inline long long __float2ll_ru(float x) { return llmcupy_sim::cvt_sat<long long>(std::ceil(x)); }
inline unsigned long long __float2ull_rd(float x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::floor(x)); }
inline unsigned long long __float2ull_ru(float x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::ceil(x)); }
inline long long __double2ll_rd(double x) { return llmcupy_sim::cvt_sat<long long>(std::floor(x)); }
inline long long __double2ll_ru(double x) { return llmcupy_sim::cvt_sat<long long>(std::ceil(x)); }
inline unsigned __double2uint_rd(double x) { return llmcupy_sim::cvt_sat<unsigned>(std::floor(x)); }
inline unsigned __double2uint_ru(double x) { return llmcupy_sim::cvt_sat<unsigned>(std::ceil(x)); }
inline unsigned long long __double2ull_rn(double x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::nearbyint(x)); }
inline unsigned long long __double2ull_rz(double x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::trunc(x)); }
inline unsigned long long __double2ull_rd(double x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::floor(x)); }
inline unsigned long long __double2ull_ru(double x) { return llmcupy_sim::cvt_sat<unsigned long long>(std::ceil(x)); }
inline float __frsqrt_rn(float x) { return float(1.0 / std::sqrt(double(x))); }
// sinpi and cospi reduce x exactly (fmod by 2, then folds by 1/2 that are exact in long double) before
// multiplying by pi, so an integer gives an exact zero and a large x loses nothing (sin(M_PI * x) gave
// sinpi(1) = 1.2e-16, and for x near 2^40 an error of its rounded product); CUDA's bound is 2 ulp
namespace llmcupy_sim {
// sin(pi y) for |y| <= 1, folded onto |y| <= 1/2
inline long double sin_pi_reduced(long double y) {
    if (y > 0.5L) y = 1.0L - y;
    else if (y < -0.5L) y = -1.0L - y;
    return std::sin(3.14159265358979323846264338327950288L * y);
}
}  // namespace llmcupy_sim
inline double sinpi(double x) {
    if (!std::isfinite(x)) return x - x;   // NaN
    long double r = std::fmod(x, 2.0);      // exact, in (-2, 2)
    if (r > 1.0L) r -= 2.0L;
    else if (r < -1.0L) r += 2.0L;
    return double(llmcupy_sim::sin_pi_reduced(r));
}
inline double cospi(double x) {
    if (!std::isfinite(x)) return x - x;
    long double r = std::fabs(std::fmod(x, 2.0));   // cos is even
    if (r > 1.0L) r = 2.0L - r;
    return double(llmcupy_sim::sin_pi_reduced(0.5L - r) + 0.0L);   // cos(pi r) = sin(pi (1/2 - r)); +0, never -0
}
inline float sinpif(float x) { return float(sinpi(x)); }
inline float cospif(float x) { return float(cospi(x)); }
inline void sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline void sincos(double x, double* s, double* c) { *s = std::sin(x); *c = std::cos(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline void sincospif(float x, float* s, float* c) { *s = sinpif(x); *c = cospif(x); }
inline float rcbrtf(float x) { return 1.0f / std::cbrt(x); }
inline float rhypotf(float a, float b) { return 1.0f / std::hypot(a, b); }
inline float norm3df(float a, float b, float c) { return float(std::sqrt(double(a) * a + double(b) * b + double(c) * c)); }
inline float rnorm3df(float a, float b, float c) { return 1.0f / norm3df(a, b, c); }
inline float norm4df(float a, float b, float c, float d) { return float(std::sqrt(double(a) * a + double(b) * b + double(c) * c + double(d) * d)); }
inline float normcdff(float x) { return 0.5f * std::erfc(-x / std::sqrt(2.0f)); }
inline double normcdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
// The inverse error functions by bisection in long double (slow, never diverging, and far inside CUDA's
// bounds: erfinv 5 ulp, erfcinv 6, normcdfinv 8; the float forms 2, 4 and 5). The tail is solved on erfc,
// so that erfcinv(1e-300) and normcdfinv(1e-300) keep their precision (1 - z would round it away).
namespace llmcupy_sim {
// x > 0 with erf(x) = y (0 < y < 1/2), or with erfc(x) = z (0 < z <= 1)
template <bool Complement>
inline long double erf_inverse_positive(long double target) {
    long double lo = 0.0L, hi = 30.0L;   // erfc(27.3) is below the smallest double
    for (int i = 0; i < 256; ++i) {
        long double mid = 0.5L * (lo + hi);
        if (mid == lo || mid == hi) break;
        bool below = Complement ? std::erfc(mid) > target : std::erf(mid) < target;
        (below ? lo : hi) = mid;
    }
    return 0.5L * (lo + hi);
}
// erfcinv(z) for 0 < z < 2, in long double
inline long double erfc_inverse(long double z) {
    if (z > 1.0L) return -erfc_inverse(2.0L - z);
    return z == 1.0L ? 0.0L : erf_inverse_positive<true>(z);
}
}  // namespace llmcupy_sim
inline double erfcinv(double z) {
    if (!(z > 0.0 && z < 2.0)) return z == 0.0 ? INFINITY : z == 2.0 ? -INFINITY : NAN;
    return double(llmcupy_sim::erfc_inverse(z));
}
inline double erfinv(double y) {
    if (!(y > -1.0 && y < 1.0)) return y == -1.0 ? -INFINITY : y == 1.0 ? INFINITY : NAN;
    if (y == 0.0) return y;   // -0 stays -0
    double a = std::fabs(y);
    if (a < 1e-4) {   // the series, whose next term is below 1e-24 of the sum here (bisection from 30 stops short of a tiny x)
        long double t = (long double)y * y, pi = 3.14159265358979323846264338327950288L;
        return double(0.88622692545275801364908374167057259L * y * (1.0L + pi / 12.0L * t + 7.0L * pi * pi / 480.0L * t * t));
    }
    // from 1/2 on, 1 - a is exact and the tail is solved on erfc
    long double x = a < 0.5 ? llmcupy_sim::erf_inverse_positive<false>(a) : llmcupy_sim::erfc_inverse(1.0L - a);
    return double(y < 0 ? -x : x);
}
inline double normcdfinv(double p) {
    if (!(p > 0.0 && p < 1.0)) return p == 0.0 ? -INFINITY : p == 1.0 ? INFINITY : NAN;
    return double(-std::sqrt(2.0L) * llmcupy_sim::erfc_inverse(2.0L * p) + 0.0L);   // +0 at 1/2, not -0
}
inline float erfinvf(float y) { return float(erfinv(y)); }
inline float erfcinvf(float z) { return float(erfcinv(z)); }
inline float normcdfinvf(float p) { return float(normcdfinv(p)); }
// erfcx(x) = exp(x^2) erfc(x) (CUDA's bound: 4 ulp, float too): directly in long double below 5, where
// neither factor leaves its range; from 5 on by erfc's continued fraction (Laplace), whose terms fall fast
// there, so a large x neither overflows exp(x^2) nor underflows erfc(x)
inline double erfcx(double x) {
    if (std::isnan(x)) return x;
    if (x < 5.0) return double(std::exp((long double)x * x) * std::erfc((long double)x));
    if (std::isinf(x)) return 0.0;
    long double t = x;
    for (int k = 120; k >= 1; --k) t = x + (0.5L * k) / t;
    return double(1.0L / (std::sqrt(3.14159265358979323846264338327950288L) * t));
}
inline float erfcxf(float x) { return float(erfcx(x)); }
// Euclidean norms in long double, so no square overflows or underflows on the way (CUDA: 2 ulp for
// norm3d/norm4d/rnorm3d/rnorm4d and their float forms; norm and normf state no bound)
namespace llmcupy_sim {
template <typename T>
inline long double sum_of_squares(int dim, const T* p) {
    long double sum = 0.0L;
    for (int i = 0; i < dim; ++i) sum += (long double)p[i] * p[i];
    return sum;
}
template <typename T>
inline T euclid(int dim, const T* p) {
    for (int i = 0; i < dim; ++i) if (std::isinf(p[i])) return T(INFINITY);   // infinity wins over NaN
    return T(std::sqrt(sum_of_squares(dim, p)));
}
template <typename T>
inline T reciprocal_euclid(int dim, const T* p) {
    for (int i = 0; i < dim; ++i) if (std::isinf(p[i])) return T(0);
    return T(1.0L / std::sqrt(sum_of_squares(dim, p)));
}
}  // namespace llmcupy_sim
inline double norm(int dim, const double* p) { return llmcupy_sim::euclid(dim, p); }
inline float normf(int dim, const float* p) { return llmcupy_sim::euclid(dim, p); }
inline double rnorm(int dim, const double* p) { return llmcupy_sim::reciprocal_euclid(dim, p); }
inline float rnormf(int dim, const float* p) { return llmcupy_sim::reciprocal_euclid(dim, p); }
inline double norm3d(double a, double b, double c) { double p[] = {a, b, c}; return norm(3, p); }
inline double norm4d(double a, double b, double c, double d) { double p[] = {a, b, c, d}; return norm(4, p); }
inline double rnorm3d(double a, double b, double c) { double p[] = {a, b, c}; return rnorm(3, p); }
inline double rnorm4d(double a, double b, double c, double d) { double p[] = {a, b, c, d}; return rnorm(4, p); }
inline float rnorm4df(float a, float b, float c, float d) { float p[] = {a, b, c, d}; return rnormf(4, p); }
inline double rcbrt(double x) { return double(1.0L / std::cbrt((long double)x)); }
inline double rhypot(double a, double b) { return double(1.0L / std::hypot((long double)a, (long double)b)); }
inline void sincospi(double x, double* s, double* c) { *s = sinpi(x); *c = cospi(x); }
// The modified Bessel functions of the first kind, orders 0 and 1, by their power series in long double:
// every term is positive, so nothing cancels (CUDA: 6 ulp, float too). I0 is even, I1 odd.
namespace llmcupy_sim {
inline long double bessel_i(int order, long double x) {
    long double quarter = x * x / 4.0L, term = order == 0 ? 1.0L : x / 2.0L, sum = term;
    for (int k = 1; k < 100000; ++k) {
        term *= quarter / ((long double)k * (k + order));
        sum += term;
        if (term <= sum * LDBL_EPSILON || std::isinf(sum)) break;
    }
    return sum;
}
}  // namespace llmcupy_sim
inline double cyl_bessel_i0(double x) { return std::isnan(x) ? x : double(llmcupy_sim::bessel_i(0, std::fabs(x))); }
inline double cyl_bessel_i1(double x) { return std::isnan(x) ? x : std::copysign(double(llmcupy_sim::bessel_i(1, std::fabs(x))), x); }
inline float cyl_bessel_i0f(float x) { return float(cyl_bessel_i0(x)); }
inline float cyl_bessel_i1f(float x) { return float(cyl_bessel_i1(x)); }
inline int __mul24(int a, int b) { return int((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __mulhi(int a, int b) { return int(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned(((unsigned long long)a * b) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) { return (unsigned long long)(((unsigned __int128)a * b) >> 64); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += int((signed char)(a >> (8 * i))) * int((signed char)(b >> (8 * i)));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}
inline int __dp2a_lo(int a, int b, int c) {
    for (int i = 0; i < 2; ++i) c += int((short)(a >> (16 * i))) * int((signed char)(b >> (8 * i)));
    return c;
}
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
    return (unsigned long long)__brev(unsigned(x)) << 32 | __brev(unsigned(x >> 32));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned out = 0;
    for (int i = 0; i < 4; ++i) out |= unsigned((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return out;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) { unsigned long long v = (unsigned long long)hi << 32 | lo; return unsigned((v << (s & 31)) >> 32); }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) { unsigned long long v = (unsigned long long)hi << 32 | lo; return unsigned(v >> (s & 31)); }
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned s) { return __funnelshift_l(lo, hi, s > 32 ? 32 : s); }
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned s) { unsigned long long v = (unsigned long long)hi << 32 | lo; return unsigned(v >> (s > 32 ? 32 : s)); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __sad(int a, int b, unsigned c) { return c + unsigned(a > b ? a - b : b - a); }
inline unsigned __usad(unsigned a, unsigned b, unsigned c) { return c + (a > b ? a - b : b - a); }
inline int __hadd(int a, int b) { return int(((long long)a + b) >> 1); }
inline int __rhadd(int a, int b) { return int(((long long)a + b + 1) >> 1); }
inline unsigned __uhadd(unsigned a, unsigned b) { return unsigned(((unsigned long long)a + b) >> 1); }
inline unsigned __urhadd(unsigned a, unsigned b) { return unsigned(((unsigned long long)a + b + 1) >> 1); }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long llmin(long long a, long long b) { return a < b ? a : b; }
inline long long llmax(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline void __nanosleep(unsigned) { llmcupy_sim::yield_fiber(__builtin_LINE(), "__nanosleep"); }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
// PTX fns.b32: the bit position of the offset-th set bit of mask counted from bit base, upward for a
// positive offset and downward for a negative one (offset 0: base itself if set); 0xffffffff if none
inline unsigned __fns(unsigned mask, unsigned base, int offset) {
    if (base > 31) return 0xffffffffu;   // undefined in PTX; no bit is found
    if (offset == 0) return (mask >> base) & 1u ? base : 0xffffffffu;
    long long left = offset > 0 ? offset : -(long long)offset;
    for (int pos = int(base); pos >= 0 && pos < 32; pos += offset > 0 ? 1 : -1)
        if ((mask >> pos) & 1u && --left == 0) return unsigned(pos);
    return 0xffffffffu;
}
// Clocks advance (monotonic per thread; a delay loop ends), in CPU time-stamp ticks, not GPU cycles.
inline long long clock64() {
#if defined(__x86_64__)
    return (long long)__builtin_ia32_rdtsc();
#else
    return (long long)std::chrono::steady_clock::now().time_since_epoch().count();
#endif
}
namespace llmcupy_sim { inline int clock32() { return int(clock64()); } }
#define clock() llmcupy_sim::clock32()
inline unsigned long long __globaltimer() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}
// CUDA's min/max for device code: the overload set CUDA declares (crt/math_functions.h and .hpp, the
// same in CUDA 12.4 to 13.5), not a template taking any two types, so that overload resolution picks
// what NVRTC picks: min(int, unsigned) is unsigned (the int converted, as CUDA's umin does), a float
// with a double is a double, and a call that mixes sizes or an integer with a float
// (max(1, 2.0f), min(int, long), max(long, long long)) is ambiguous here as under NVRTC ('more than
// one instance of overloaded function "max" matches the argument list'). Measured in
// tests/test_nvrtc_parity.py. Floats follow fminf/fmaxf: a NaN loses to a number.
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned min(int a, unsigned b) { return min(unsigned(a), b); }
inline unsigned min(unsigned a, int b) { return min(a, unsigned(b)); }
inline long min(long a, long b) { return a < b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long min(long a, unsigned long b) { return min((unsigned long)a, b); }
inline unsigned long min(unsigned long a, long b) { return min(a, (unsigned long)b); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long min(long long a, unsigned long long b) { return min((unsigned long long)a, b); }
inline unsigned long long min(unsigned long long a, long long b) { return min(a, (unsigned long long)b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double min(float a, double b) { return std::fmin(double(a), b); }
inline double min(double a, float b) { return std::fmin(a, double(b)); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned max(int a, unsigned b) { return max(unsigned(a), b); }
inline unsigned max(unsigned a, int b) { return max(a, unsigned(b)); }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline unsigned long max(long a, unsigned long b) { return max((unsigned long)a, b); }
inline unsigned long max(unsigned long a, long b) { return max(a, (unsigned long)b); }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long long max(long long a, unsigned long long b) { return max((unsigned long long)a, b); }
inline unsigned long long max(unsigned long long a, long long b) { return max(a, (unsigned long long)b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline double max(float a, double b) { return std::fmax(double(a), b); }
inline double max(double a, float b) { return std::fmax(a, double(b)); }

// abs and the float/double math functions, as CUDA declares them (crt/math_functions.h, .hpp and
// cmath: the same in CUDA 12.4 to 13.5): a float and a double overload of each, the double one
// being the C library's. So sqrt(x) of a float is a float (sqrtf), abs(x) of a float is not truncated
// to an int, and sqrt(2), exp(n) or fmax(1, 2.0) with integer or float-and-double arguments are
// ambiguous here as under NVRTC ('more than one instance of overloaded function'), where the host's
// std:: templates would take them; pow has an int exponent besides, copysign a float with a double.
// isnan, isinf, isfinite and signbit are an int under NVRTC. Measured in tests/test_nvrtc_parity.py.
// libstdc++ leaves the global namespace with the C functions only; libc++ (macOS) declares its own
// float overloads there, which these would redefine, so with it the host's stay.
#if defined(__GLIBCXX__)
inline long abs(long a) { return labs(a); }
inline long long abs(long long a) { return llabs(a); }
inline float abs(float a) { return fabsf(a); }
inline double abs(double a) { return fabs(a); }
#define LLMCUPY_SIM_FLOAT_OVERLOAD(RESULT, NAME) inline RESULT NAME(float x) { return NAME##f(x); }
#define LLMCUPY_SIM_FLOAT_OVERLOAD2(NAME) inline float NAME(float a, float b) { return NAME##f(a, b); }
LLMCUPY_SIM_FLOAT_OVERLOAD(float, acos)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, acosh)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, asin)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, asinh)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, atan)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, atanh)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, cbrt)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, ceil)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, cos)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, cosh)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, erf)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, erfc)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, exp)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, exp2)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, expm1)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, fabs)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, floor)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, lgamma)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, log)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, log10)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, log1p)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, log2)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, logb)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, nearbyint)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, rint)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, round)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, sin)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, sinh)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, sqrt)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, tan)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, tanh)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, tgamma)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, trunc)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, rsqrt)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, rcbrt)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, sinpi)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, cospi)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, exp10)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, erfinv)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, erfcinv)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, normcdf)
LLMCUPY_SIM_FLOAT_OVERLOAD(float, normcdfinv)
LLMCUPY_SIM_FLOAT_OVERLOAD(int, ilogb)
LLMCUPY_SIM_FLOAT_OVERLOAD(long, lrint)
LLMCUPY_SIM_FLOAT_OVERLOAD(long, lround)
LLMCUPY_SIM_FLOAT_OVERLOAD(long long, llrint)
LLMCUPY_SIM_FLOAT_OVERLOAD(long long, llround)
LLMCUPY_SIM_FLOAT_OVERLOAD2(fmax)
LLMCUPY_SIM_FLOAT_OVERLOAD2(fmin)
LLMCUPY_SIM_FLOAT_OVERLOAD2(fmod)
LLMCUPY_SIM_FLOAT_OVERLOAD2(atan2)
LLMCUPY_SIM_FLOAT_OVERLOAD2(hypot)
LLMCUPY_SIM_FLOAT_OVERLOAD2(fdim)
LLMCUPY_SIM_FLOAT_OVERLOAD2(remainder)
LLMCUPY_SIM_FLOAT_OVERLOAD2(nextafter)
LLMCUPY_SIM_FLOAT_OVERLOAD2(pow)
LLMCUPY_SIM_FLOAT_OVERLOAD2(copysign)
#undef LLMCUPY_SIM_FLOAT_OVERLOAD
#undef LLMCUPY_SIM_FLOAT_OVERLOAD2
inline float pow(float a, int b) { return float(std::pow(double(a), double(b))); }
inline double pow(double a, int b) { return std::pow(a, double(b)); }
inline double copysign(float a, double b) { return copysign(double(a), b); }
inline double copysign(double a, float b) { return copysign(a, double(b)); }
inline float fma(float a, float b, float c) { return fmaf(a, b, c); }
inline float ldexp(float a, int e) { return ldexpf(a, e); }
inline float scalbn(float a, int e) { return scalbnf(a, e); }
inline float frexp(float a, int* e) { return frexpf(a, e); }
inline float modf(float a, float* i) { return modff(a, i); }
inline float remquo(float a, float b, int* q) { return remquof(a, b, q); }
inline int isnan(float x) { return std::isnan(x); }
inline int isnan(double x) { return std::isnan(x); }
inline int isinf(float x) { return std::isinf(x); }
inline int isinf(double x) { return std::isinf(x); }
inline int isfinite(float x) { return std::isfinite(x); }
inline int isfinite(double x) { return std::isfinite(x); }
inline int signbit(float x) { return std::signbit(x); }
inline int signbit(double x) { return std::signbit(x); }
#else
using std::signbit;
using std::isinf;
using std::isnan;
using std::isfinite;
#endif

namespace llmcupy_sim {

// ---------------------------------------------------------------------------------------------
// Scheduler
// ---------------------------------------------------------------------------------------------
inline size_t fiber_stack_size(size_t needed = 0) {
    static size_t base = [] {
        const char* env = std::getenv("LLMCUPY_SIM_STACK_KB");
        size_t kb = env ? size_t(std::atol(env)) : 64;
        return std::max<size_t>(kb, 16) * 1024;
    }();
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    return (std::max(base, needed) + page - 1) / page * page;
}

// The inaccessible bytes below each fiber stack. -fstack-clash-protection makes a large frame touch
// its pages at most this far apart, so an overflow always lands in the guard: GCC probes every page on
// x86-64, but on aarch64 every 64 KiB (it assumes a 64 KiB guard), which would step over one page into
// the fiber stack mapped below. 64 KiB of address space per stack, still one mapping.
inline size_t stack_guard_bytes() {
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    return std::max<size_t>(page, 64 * 1024);
}

inline void ensure_fibers(Worker* w, int n, size_t needed) {
    size_t page = stack_guard_bytes();
    size_t size = fiber_stack_size(needed);
    size_t old = w->fibers.size();
    // Fiber holds raw pointers only; growing the vector before any fiber runs is safe.
    if (int(old) < n) w->fibers.resize(n);
    for (size_t i = 0; i < w->fibers.size(); ++i) {
        Fiber& f = w->fibers[i];
        if (f.stack != nullptr && f.stack_size >= size) continue;
        if (f.stack != nullptr) munmap(f.stack - page, f.stack_size + page);  // too small for this kernel
        void* mem = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) { std::fprintf(stderr, "llmcupy sim: cannot map a fiber stack of %zu bytes (fiber %zu): %s\n", size + page, i, std::strerror(errno)); std::abort(); }
        mprotect(mem, page, PROT_NONE);  // guard: a stack overflow faults instead of corrupting
        f.stack = static_cast<char*>(mem) + page;
        f.stack_size = size;
    }
}

inline void append_message(LaunchResult* r, const char* text) {
    size_t used = std::strlen(r->message);
    if (used + 1 >= sizeof(r->message)) return;
    std::snprintf(r->message + used, sizeof(r->message) - used, "%s", text);
}

inline bool same_collective(const Fiber& a, const Fiber& b) {
    if (a.wait_kind != b.wait_kind) return false;
    return a.wait_kind != COLL_OTHER || a.wait_what == b.wait_what || std::strcmp(a.wait_what, b.wait_what) == 0;
}

// Releases warp groups whose lanes have all arrived. A group is the mask of its first waiting lane
// (less the lanes that exited); it is released only when every lane of it waits at the same kind of
// collective with the same mask, so lanes still inside a narrower collective (two tiles of 16, an
// if/else with disjoint masks) are never handed a wider collective's snapshot. Returns how many
// fibers it released.
inline int release_warps(Worker* w) {
    int released = 0;
    int nwarps = (w->nthreads + 31) / 32;
    for (int warp = 0; warp < nwarps; ++warp) {
        unsigned live = 0, waiting = 0, activemask = 0;
        Fiber* lanes = &w->fibers[warp * 32];
        int nlanes = std::min(32, w->nthreads - warp * 32);
        for (int l = 0; l < nlanes; ++l) {
            int s = lanes[l].state;
            if (s != DONE) live |= 1u << l;
            if (s == AT_WARP) {
                if (lanes[l].wait_kind == COLL_ACTIVEMASK) activemask |= 1u << l;
                else waiting |= 1u << l;
            }
        }
        unsigned pending = waiting;
        bool done = false;
        while (pending) {
            int l = __builtin_ctz(pending);
            Fiber& f = lanes[l];
            unsigned group = f.wait_mask & live;
            bool ok = (group & waiting) == group;
            for (unsigned m = group; ok && m; m &= m - 1) {
                const Fiber& member = lanes[__builtin_ctz(m)];
                ok = (member.wait_mask & live) == group && same_collective(member, f);
            }
            if (ok) {
                LLMCUPY_SIM_NOTIFY(on_warp_sync, w, warp, group);
                WarpGather& g = w->gathers[warp];
                g.valid = group;
                for (unsigned m = group; m; m &= m - 1) {
                    Fiber& member = lanes[__builtin_ctz(m)];
                    std::memcpy(g.value[__builtin_ctz(m)], member.post, kPostBytes);
                    member.state = READY;
                    ++released;
                }
                // One snapshot per warp per round: the released lanes read it before anyone in
                // this warp can post again, because the scheduler runs every READY fiber first.
                done = true;
                break;
            }
            pending &= ~(1u << l);
        }
        if (done || !activemask) continue;
        // Nothing else in this warp can move: the lanes at the first __activemask call site are
        // the converged group.
        int first = __builtin_ctz(activemask);
        unsigned group = 0;
        for (unsigned m = activemask; m; m &= m - 1) {
            const Fiber& member = lanes[__builtin_ctz(m)];
            if (member.wait_line == lanes[first].wait_line) group |= 1u << __builtin_ctz(m);
        }
        for (unsigned m = group; m; m &= m - 1) {
            Fiber& member = lanes[__builtin_ctz(m)];
            std::memcpy(member.post, &group, sizeof group);
            member.state = READY;
            ++released;
        }
    }
    return released;
}

inline bool grid_barrier_wait(Worker* w, int line);

// Releases the block's barrier once every unfinished thread waits at one; returns the threads it
// released, 0 when none could be, -1 when the block waited at a grid.sync() that failed (a deadlock,
// the watchdog, another block's error: w->abandoned is set).
inline int release_block_barrier(Worker* w) {
    int waiting = 0, done = 0;
    int first_line = -1, grid_line = -1;
    bool divergent = false;
    int count = 0, all = 1, any = 0;
    int kind = BAR_PLAIN;
    for (int t = 0; t < w->nthreads; ++t) {
        Fiber& f = w->fibers[t];
        if (f.state == DONE) { ++done; continue; }
        if (f.state != AT_BARRIER) return 0;  // someone is still at a warp collective
        ++waiting;
        if (f.wait_mask == BAR_GRID) grid_line = f.wait_line;
        if (first_line < 0) first_line = f.wait_line, kind = int(f.wait_mask);
        else if (f.wait_line != first_line) divergent = true;
        count += f.predicate;
        all &= f.predicate;
        any |= f.predicate;
    }
    if (waiting == 0) return 0;
    LLMCUPY_SIM_NOTIFY(on_block_barrier, w);
    if (divergent) w->counters.divergent_barriers++;
    if (done) w->counters.barrier_after_exit++;
    w->barrier_result = kind == BAR_COUNT ? count : kind == BAR_AND ? all : kind == BAR_OR ? any : 0;
    // grid.sync(): the block's own barrier (above), then every block's; a thread that waits at another
    // barrier meanwhile is a divergent barrier, counted above, as on a GPU where both are bar.sync 0
    if (grid_line >= 0 && !grid_barrier_wait(w, grid_line)) return -1;
    for (int t = 0; t < w->nthreads; ++t)
        if (w->fibers[t].state == AT_BARRIER) w->fibers[t].state = READY;
    return waiting;
}

// Where every unfinished thread of the block is: the sync point it waits at, or for a running
// thread the last place the emulator saw it (its last sync point, yield or atomic poll).
inline void describe_threads(Worker* w, Fiber* running) {
    char line[256];
    int shown = 0;
    for (int t = 0; t < w->nthreads && shown < 12; ++t) {
        Fiber& f = w->fibers[t];
        if (f.state == DONE) continue;
        // Collapse runs of threads waiting at the same place into one line.
        int t_end = t;
        while (t_end + 1 < w->nthreads && &w->fibers[t_end + 1] != running && &f != running &&
               w->fibers[t_end + 1].state == f.state && w->fibers[t_end + 1].wait_line == f.wait_line &&
               w->fibers[t_end + 1].wait_what == f.wait_what)
            ++t_end;
        const char* verb = &f == running ? ": running, last seen at"
                           : f.state == READY ? ": last seen at"
                           : t == t_end ? " waits at" : " wait at";
        char who[48];
        if (t == t_end) std::snprintf(who, sizeof who, "thread %d", t);
        else std::snprintf(who, sizeof who, "threads %d-%d", t, t_end);
        if (f.wait_line == 0 && f.state == READY && !f.polling)  // a volatile access has no line: say what
            std::snprintf(line, sizeof line, "  %s %s the kernel's start (no sync point reached)\n", who,
                          &f == running ? "ran from" : "had not left");
        else if (f.wait_line == 0)
            std::snprintf(line, sizeof line, "  %s%s %s\n", who, verb, f.wait_what);
        else
            std::snprintf(line, sizeof line, "  %s%s %s (line %d)\n", who, verb, f.wait_what, f.wait_line);
        append_message(&w->counters, line);
        ++shown;
        t = t_end;
    }
}

inline void report_deadlock(Worker* w) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "deadlock in kernel %s, block (%u,%u,%u): no thread can proceed.\n",
                  w->kernel_name, w->block_idx.x, w->block_idx.y, w->block_idx.z);
    append_message(&w->counters, line);
    describe_threads(w, nullptr);
}

// The watchdog (see run_grid) sets this when a launch runs past its time limit.
inline std::atomic<int> g_timed_out{0};

inline void report_timeout(Worker* w, Fiber* running) {
    char line[320];
    std::snprintf(line, sizeof line,
                  "kernel %s ran past the emulator's time limit of %.1f s (a thread waiting for something "
                  "that never happens?); block (%u,%u,%u):\n",
                  w->kernel_name, double(w->cfg->timeout_ms) / 1000.0, w->block_idx.x, w->block_idx.y,
                  w->block_idx.z);
    append_message(&w->counters, line);
    describe_threads(w, running);
    bool polling = false;
    for (int t = 0; t < w->nthreads; ++t) polling |= w->fibers[t].state != DONE && w->fibers[t].polling;
    // a thread that polls through a volatile access or an atomic does see other threads' writes: the
    // value it waits for never comes; one that spins on a plain variable never sees them here
    append_message(&w->counters,
                   polling ? "A thread polling memory (a volatile access, a repeated atomic, __nanosleep) waits for a "
                             "value no running thread writes: a flag never set, or set by another block (the blocks "
                             "of a launch are not guaranteed to run at the same time, on a GPU as here). "
                           : "A thread spinning on a plain variable never sees another thread's write in the emulator "
                             "(declare the flag volatile, or use an atomic). ");
    append_message(&w->counters, "llmcupy.sim.settings(timeout=SECONDS) or LLMCUPY_SIM_TIMEOUT changes the limit; "
                                 "0 turns it off.\n");
    w->counters.timed_out = 1;
}

// ---------------------------------------------------------------------------------------------
// The grid barrier of a cooperative launch. Every block of such a launch runs at once, each on its
// own OS thread (run_grid), so grid.sync() is a barrier between OS threads: a block whose threads
// all reached grid.sync() (the block's barrier released them) waits here until every block of the
// grid has arrived. The mutex orders memory too: what any block wrote before grid.sync() is
// visible to every block after it, as a GPU's grid.sync() (a fence and a barrier) guarantees.
// A block that returned while others wait can never arrive: a GPU hangs; here that is a deadlock,
// reported by the first waiting block to see it. A block that failed (assert, fault, deadlock of
// its own) makes the waiting blocks leave quietly: its own report explains the launch's failure.
// ---------------------------------------------------------------------------------------------
struct GridBarrier {
    std::mutex m;
    std::condition_variable cv;
    unsigned long long nblocks = 0, arrived = 0, exited = 0, generation = 0;
    bool failed = false;
    dim3 first_exited;
};
inline GridBarrier g_grid_barrier;

inline void grid_barrier_reset(unsigned long long nblocks) {
    std::lock_guard<std::mutex> lk(g_grid_barrier.m);
    g_grid_barrier.nblocks = nblocks;
    g_grid_barrier.arrived = g_grid_barrier.exited = g_grid_barrier.generation = 0;
    g_grid_barrier.failed = false;
}

// Every thread of block w finished.
inline void grid_block_exit(Worker* w) {
    std::lock_guard<std::mutex> lk(g_grid_barrier.m);
    if (g_grid_barrier.exited++ == 0) g_grid_barrier.first_exited = w->block_idx;
    g_grid_barrier.cv.notify_all();
}

// A block was abandoned (its error is its own report): the blocks waiting at grid.sync() leave.
inline void grid_block_failed() {
    std::lock_guard<std::mutex> lk(g_grid_barrier.m);
    g_grid_barrier.failed = true;
    g_grid_barrier.cv.notify_all();
}

inline bool grid_barrier_wait(Worker* w, int line) {
    GridBarrier& g = g_grid_barrier;
    std::unique_lock<std::mutex> lk(g.m);
    const unsigned long long gen = g.generation;
    LLMCUPY_SIM_NOTIFY(on_grid_arrive, w, gen, g.arrived == 0);
    if (++g.arrived == g.nblocks) {   // the last block to arrive releases the others
        g.arrived = 0;
        ++g.generation;
        g.cv.notify_all();
        LLMCUPY_SIM_NOTIFY(on_grid_depart, w, gen);
        return true;
    }
    while (g.generation == gen) {
        if (g.failed) {
            w->abandoned = true;
            return false;
        }
        if (g.exited && g.arrived + g.exited == g.nblocks) {
            char msg[640];
            std::snprintf(msg, sizeof msg,
                          "deadlock in kernel %s: %llu block(s), block (%u,%u,%u) among them, wait at grid.sync() "
                          "(line %d) for %llu block(s) that returned without reaching it (block (%u,%u,%u) the "
                          "first); every block of the grid must reach each grid.sync() (on a GPU this launch "
                          "hangs).\n",
                          w->kernel_name, g.arrived, w->block_idx.x, w->block_idx.y, w->block_idx.z, line, g.exited,
                          g.first_exited.x, g.first_exited.y, g.first_exited.z);
            append_message(&w->counters, msg);
            w->counters.deadlock = 1;
            w->abandoned = true;
            g.failed = true;   // the other waiting blocks leave without a report of their own
            g.cv.notify_all();
            return false;
        }
        if (g_timed_out.load(std::memory_order_relaxed)) {
            char msg[480];
            std::snprintf(msg, sizeof msg,
                          "kernel %s ran past the emulator's time limit of %.1f s; block (%u,%u,%u) waited at "
                          "grid.sync() (line %d) for blocks that never reached it (%llu of %llu arrived). "
                          "llmcupy.sim.settings(timeout=SECONDS) or LLMCUPY_SIM_TIMEOUT changes the limit; 0 turns "
                          "it off.\n",
                          w->kernel_name, double(w->cfg->timeout_ms) / 1000.0, w->block_idx.x, w->block_idx.y,
                          w->block_idx.z, line, g.arrived, g.nblocks);
            append_message(&w->counters, msg);
            w->counters.timed_out = 1;
            w->abandoned = true;
            return false;
        }
        // woken by an arrival, an exit or a failure; the timeout makes it look at the watchdog's flag
        g.cv.wait_for(lk, std::chrono::milliseconds(20));
    }
    LLMCUPY_SIM_NOTIFY(on_grid_depart, w, gen);
    return true;
}

// The shared memory of the running block, for reports: the static arrays it touched (w->guards) and
// the dynamic shared memory, each as its data bytes [lo, hi) with its name and declaration line (none
// for the dynamic memory).
struct SharedArea { const unsigned char* lo; const unsigned char* hi; const char* name; int line; };

LLMCUPY_SIM_NOSAN_FN inline int shared_areas(Worker* w, SharedArea* out, int cap) {
    int n = 0;
    for (const auto& g : w->guards) {
        if (n == cap) break;
        out[n++] = {g.hi - g.bytes, g.hi, g.name, g.line};
    }
    // the dynamic memory when the launch has some or the block declared it (so an index into an
    // extern __shared__ array launched with shared_mem = 0 is named as such)
    if (n < cap && w->cfg && (w->cfg->shared_mem > 0 || w->dynamic_used)) {
        const unsigned char* d = w->shared.dynamic() + kGuardBytes;
        out[n++] = {d, d + w->cfg->shared_mem, nullptr, 0};
    }
    return n;
}

LLMCUPY_SIM_NOSAN_FN inline void describe_area(char* buf, size_t n, const SharedArea& s) {
    if (s.name) std::snprintf(buf, n, "shared array '%s' (line %d, %zu bytes)", s.name, s.line, size_t(s.hi - s.lo));
    else std::snprintf(buf, n, "the dynamic shared memory (extern __shared__, %zu bytes = the launch's shared_mem)",
                       size_t(s.hi - s.lo));
}

// Where `size` bytes at `a` lie relative to [lo, hi), as "N bytes before " / "N bytes past the end of "
// / "overlapping the end of ", followed by `what`; returns the distance (0 when overlapping).
LLMCUPY_SIM_NOSAN_FN inline unsigned long long place_relative(uintptr_t a, unsigned size, uintptr_t lo, uintptr_t hi,
                                                            const char* what, char* out, size_t n) {
    unsigned long long d;
    if (a + size <= lo) d = lo - a, std::snprintf(out, n, "%llu bytes before %s", d, what);
    else if (a >= hi) d = a - hi, std::snprintf(out, n, "%llu bytes past the end of %s", d, what);
    else d = 0, std::snprintf(out, n, "overlapping the end of %s", what);
    return d;
}

// An address in the shared-memory window, named by the nearest shared memory of the running block.
LLMCUPY_SIM_NOSAN_FN inline void nearest_shared(Worker* w, uintptr_t a, unsigned size, char* out, size_t n) {
    SharedArea areas[64];
    int na = shared_areas(w, areas, 64);
    unsigned long long best = ~0ull;
    char what[200], text[300];
    std::snprintf(out, n, "shared memory no array of this block holds");
    for (int i = 0; i < na; ++i) {
        describe_area(what, sizeof what, areas[i]);
        unsigned long long d = place_relative(a, size, uintptr_t(areas[i].lo), uintptr_t(areas[i].hi), what, text,
                                              sizeof text);
        if (d < best) best = d, std::snprintf(out, n, "%s", text);
    }
}

// Checks the guard bytes of the shared arrays this block used.
inline void check_shared_guards(Worker* w) {
#ifdef LLMCUPY_SIM_ASAN
    return;  // the guards are poisoned: AddressSanitizer has reported any access to them already
#endif
    auto bad = [](const unsigned char* p, size_t n) {
        for (size_t i = 0; i < n; ++i)
            if (p[i] != kGuardByte) return true;
        return false;
    };
    char line[400];
    // ptxas refuses a kernel whose static __shared__ arrays exceed 48 KiB: only dynamic shared
    // memory may go beyond, with an opt-in. The emulator has no such
    // limit, so a kernel that could never run on a GPU ran here; counted over the arrays the block used.
    constexpr size_t kMaxStaticShared = 48 * 1024;
    size_t static_bytes = 0;
    for (const auto& g : w->guards) static_bytes += g.bytes;
    if (static_bytes > kMaxStaticShared) {
        const auto* largest = &w->guards[0];
        for (const auto& g : w->guards) if (g.bytes > largest->bytes) largest = &g;
        std::snprintf(line, sizeof line,
                      "kernel %s declares %zu bytes of static shared memory (the largest: '%s', line %d, %zu bytes), "
                      "more than the 48 KiB (49152 bytes) a GPU allows (NVRTC's ptxas refuses to compile it); use "
                      "extern __shared__ and the launch's shared_mem for more\n",
                      w->kernel_name, static_bytes, largest->name, largest->line, largest->bytes);
        append_message(&w->counters, line);
        w->counters.shared_overflow = 1;
        w->abandoned = true;
        return;
    }
    for (const auto& g : w->guards) {
        size_t guard = size_t(g.hi - g.lo) - g.bytes;
        bool below = bad(g.lo, guard), above = bad(g.hi, guard);
        if (!below && !above) continue;
        std::snprintf(line, sizeof line,
                      "kernel %s, block (%u,%u,%u): a write landed %s shared array '%s' (line %d, %zu bytes): "
                      "an out-of-bounds shared-memory index\n",
                      w->kernel_name, w->block_idx.x, w->block_idx.y, w->block_idx.z,
                      below ? "just before" : "just past the end of", g.name, g.line, g.bytes);
        append_message(&w->counters, line);
        w->counters.shared_overflow = 1;
        w->abandoned = true;
        return;
    }
    const auto& d = w->shared;
    size_t bytes = d.dynamic_size() - 2 * kGuardBytes;
    bool below = bad(d.dynamic(), kGuardBytes), above = bad(d.dynamic() + kGuardBytes + bytes, kGuardBytes);
    if (below || above) {
        std::snprintf(line, sizeof line,
                      "kernel %s, block (%u,%u,%u): a write landed %s the dynamic shared memory (extern __shared__, "
                      "%zu bytes = the launch's shared_mem): an out-of-bounds index or too small a shared_mem\n",
                      w->kernel_name, w->block_idx.x, w->block_idx.y, w->block_idx.z,
                      below ? "just before" : "just past the end of", bytes);
        append_message(&w->counters, line);
        w->counters.shared_overflow = 1;
        w->abandoned = true;
    }
}

inline void run_block(Worker* w, const LaunchConfig* cfg, dim3 bidx) {
    w->block_idx = bidx;
    w->epoch = ++tls_epoch;
    w->guards.clear();
    w->dynamic_used = false;
    guard_unpoison(w->shared.dynamic(), w->shared.dynamic_size());
    if (cfg->poison && cfg->shared_mem) std::memset(w->shared.dynamic() + kGuardBytes, 0xFF, cfg->shared_mem);
    std::memset(w->shared.dynamic(), kGuardByte, kGuardBytes);
    std::memset(w->shared.dynamic() + kGuardBytes + cfg->shared_mem, kGuardByte, kGuardBytes);
    guard_poison(w->shared.dynamic(), kGuardBytes);
    guard_poison(w->shared.dynamic() + kGuardBytes + cfg->shared_mem, kGuardBytes);
    int n = w->nthreads;
    for (int t = 0; t < n; ++t) {
        Fiber& f = w->fibers[t];
        f.linear = t;
        f.tid = dim3(t % cfg->block[0], (t / cfg->block[0]) % cfg->block[1], t / (cfg->block[0] * cfg->block[1]));
        f.warp = t / 32;
        f.lane = t % 32;
        f.state = READY;
        f.wait_line = 0;
        f.wait_what = "";
        f.poll_addr = nullptr;
        f.polling = false;
        f.poll_repeats = 0;
        init_fiber_stack(&f);
    }
    w->order.resize(n);
    for (int t = 0; t < n; ++t) w->order[t] = cfg->order == 1 ? n - 1 - t : t;
    LLMCUPY_SIM_NOTIFY(on_block_begin, w);
    int finished = 0;
    while (true) {
        if (cfg->order == 2) std::shuffle(w->order.begin(), w->order.end(), w->rng);
        int ready = 0;
        for (int i = 0; i < n; ++i) {
            Fiber& f = w->fibers[w->order[i]];
            if (f.state == READY) {
                switch_to_fiber(w, &f);
                if (w->abandoned) {  // a failed assert, a fault, or the watchdog stopped a running thread
                    if (g_timed_out.load(std::memory_order_relaxed) && !w->counters.assert_failed &&
                        !w->counters.memory_fault)
                        report_timeout(w, &f);
                    return;
                }
                ready += f.state == READY;  // it yielded (a volatile access or a poll)
            }
        }
        finished = 0;
        for (int t = 0; t < n; ++t) finished += w->fibers[t].state == DONE;
        if (finished == n) break;
        if (g_timed_out.load(std::memory_order_relaxed)) {
            report_timeout(w, nullptr);
            w->abandoned = true;
            return;
        }
        if (release_warps(w)) continue;
        if (int released = release_block_barrier(w)) {
            if (released < 0) return;   // a grid.sync() that failed (the reason is in w->counters)
            continue;
        }
        if (ready) continue;
        report_deadlock(w);
        w->counters.deadlock = 1;
        w->abandoned = true;
        return;
    }
    LLMCUPY_SIM_NOTIFY(on_block_end, w);
    check_shared_guards(w);
    if (cfg->cooperative) grid_block_exit(w);
}

// Signal handling: a kernel that faults (out-of-bounds access, fiber stack overflow) says where,
// and what the faulting address was when the emulator knows it (the dynamic shared memory's
// window, a fiber stack's guard page). When the fault happened in a thread's own code, on its own
// fiber stack, the thread is left the way the watchdog leaves one: the scheduler takes over, the
// block is abandoned and the launch raises SimMemoryFaultError, so the process (a notebook's
// kernel, say) lives on, as a CUDA program gets cudaErrorIllegalAddress instead of dying. A fault
// anywhere else (the emulator itself) is reported on stderr and kills the process.
inline thread_local Worker* tls_fault_worker = nullptr;
// `no_address`: a general-protection fault (SIGSEGV with SI_KERNEL), which carries no address. In
// kernel code that is an aligned SSE access (a float4, int4 or double2) at an address that is not a
// multiple of 16, where a GPU stops with "misaligned address", or a pointer outside the address space.
inline void describe_fault(Worker* w, int sig, uintptr_t a, char* out, size_t n, bool no_address = false) {
    char what[360];
    const size_t guard = stack_guard_bytes();
    uintptr_t stack = uintptr_t(w->cur->stack);
    if (a >= w->shared.window_lo() && a < w->shared.window_hi()) {
        char place[300];
        nearest_shared(w, a, 1, place, sizeof place);
        std::snprintf(what, sizeof what, "a shared memory access %s", place);
    } else if (stack && a < stack && a + guard >= stack) {
        std::snprintf(what, sizeof what, "a fiber stack overflow (LLMCUPY_SIM_STACK_KB raises the fiber stack)");
    } else if (no_address) {
        const char* next = "the launch again inside `with llmcupy.sim.settings(check=\"memory\"):`, or with "
                           "LLMCUPY_SIM_CHECK=memory, names the line";
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
        // memcheck passed the access: its hook does not say a float4 from a struct of two doubles
        if (g_check & CHECK_MEMORY)
            next = "memcheck passed it: a 16-byte vector 8 bytes off a multiple of 16 looks to it like an "
                   "aligned struct of two doubles";
#endif
        std::snprintf(what, sizeof what, "a misaligned 16-byte access (a float4, int4 or double2 at an address "
                      "that is not a multiple of 16; a GPU stops with 'misaligned address') or a wild pointer "
                      "(%s)", next);
    } else {
        std::snprintf(what, sizeof what, "an out-of-bounds memory access at %#llx (the launch again inside "
                      "`with llmcupy.sim.settings(check=\"memory\"):`, or with LLMCUPY_SIM_CHECK=memory, names the "
                      "line)", (unsigned long long)a);
    }
    if (sig == SIGFPE)
        std::snprintf(what, sizeof what, "an integer division that traps on a CPU (INT_MIN / -1, or a division "
                      "by zero); a GPU gives an unspecified value: check the operands before dividing");
    std::snprintf(out, n, "kernel %s crashed with %s in block (%u,%u,%u), thread (%u,%u,%u): %s",
                  w->kernel_name,
                  sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : "a signal",
                  w->block_idx.x, w->block_idx.y, w->block_idx.z, w->cur->tid.x, w->cur->tid.y, w->cur->tid.z, what);
}

// The stack pointer of the interrupted code, read from the signal's context: on a fiber's stack, the
// signal hit a CUDA thread's own code, which may be left. 0 where the emulator cannot read it: a
// fault there kills the process, and the watchdog only stops threads at a sync point.
inline uintptr_t signal_stack_pointer(void* uctx) {
    auto* uc = static_cast<ucontext_t*>(uctx);
    (void)uc;
#if defined(__linux__) && defined(__x86_64__)
    return uintptr_t(uc->uc_mcontext.gregs[REG_RSP]);
#elif defined(__linux__) && defined(__aarch64__)
    return uintptr_t(uc->uc_mcontext.sp);
#elif defined(__APPLE__) && defined(__x86_64__)
    return uintptr_t(uc->uc_mcontext->__ss.__rsp);
#elif defined(__APPLE__) && defined(__aarch64__) && defined(__DARWIN_OPAQUE_ARM_THREAD_STATE64) && \
    __DARWIN_OPAQUE_ARM_THREAD_STATE64
    return uintptr_t(uc->uc_mcontext->__ss.__opaque_sp);
#elif defined(__APPLE__) && defined(__aarch64__)
    return uintptr_t(uc->uc_mcontext->__ss.__sp);
#else
    return 0;
#endif
}

// Not instrumented, and quiet for what it calls: its accesses are no kernel's, and memcheck would
// report them (a fault in an instrumented build: a float4 it could not tell from an aligned struct).
__attribute__((no_sanitize_thread)) inline void fault_handler(int sig, siginfo_t* info, void* uctx) {
    LLMCUPY_SIM_QUIET_BEGIN;
    Worker* w = tls_fault_worker;
    char msg[640];
    if (w && w->cur) {
#ifdef SI_KERNEL
        bool no_address = info && sig == SIGSEGV && info->si_code == SI_KERNEL;
#else
        bool no_address = false;   // Linux's code for a fault without an address
#endif
        describe_fault(w, sig, info ? uintptr_t(info->si_addr) : 0, msg, sizeof msg, no_address);
        uintptr_t sp = signal_stack_pointer(uctx);
        if (sp != 0) {
            uintptr_t a = info ? uintptr_t(info->si_addr) : 0, stack = uintptr_t(w->cur->stack);
            const size_t guard = stack_guard_bytes();
            // running on the fiber's stack, or touching its guard (an overflow, with the stack pointer
            // anywhere below): the thread's own code faulted
            bool own_stack = sp >= stack && sp <= stack + w->cur->stack_size;
            bool overflow = sig != SIGFPE && a < stack && a + guard >= stack;
            if (w->in_fiber && (own_stack || overflow)) {
                append_message(&w->counters, msg);
                append_message(&w->counters, overflow || sig == SIGFPE ? "; the block was abandoned\n"
                                                      : "; the block was abandoned (out-of-bounds writes before the "
                                                        "fault may have changed other memory of this process)\n");
                w->counters.memory_fault = 1;
                w->abandoned = true;
                w->in_fiber = false;
                LLMCUPY_SIM_QUIET_END;
                switch_to_scheduler(w, true);  // never returns: the fiber is not resumed
            }
        }
        char line[700];
        int n = std::snprintf(line, sizeof line, "\nllmcupy sim: %s\n", msg);
        if (n > 0) { ssize_t ignored = write(2, line, size_t(n) < sizeof line ? size_t(n) : sizeof line - 1); (void)ignored; }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

// The watchdog's signal: a thread that runs past the time limit without reaching any point where
// the emulator looks (a spin on a plain variable) is interrupted here. Only when the signal hit the
// running fiber's own stack is it safe to leave it: the scheduler takes over and abandons the block.
constexpr int kWatchdogSignal = SIGURG;
inline void watchdog_handler(int, siginfo_t*, void* uctx) {
    Worker* w = tls_fault_worker;
    if (w == nullptr || !w->in_fiber || w->cur == nullptr || !g_timed_out.load()) return;
    // where the stack pointer cannot be read, only threads that reach a sync point or yield are stopped
    uintptr_t sp = signal_stack_pointer(uctx);
    Fiber* f = w->cur;
    if (sp == 0 || sp < uintptr_t(f->stack) || sp > uintptr_t(f->stack) + f->stack_size) return;
    w->abandoned = true;
    w->in_fiber = false;
    switch_to_scheduler(w, true);
}

// Ends the running thread and the launch with `msg` (first one wins) and `flag` set in the result:
// the scheduler abandons the block, Python raises; the process lives on.
[[noreturn]] inline void stop_launch(Worker* w, Fiber* f, const char* msg, int LaunchResult::*flag) {
    if (!(w->counters.*flag)) append_message(&w->counters, msg);
    w->counters.*flag = 1;
    w->abandoned = true;
    f->state = DONE;
    switch_to_scheduler(w, true);
    std::abort();  // never resumed
}

// A device-side assert() that fails: the launch stops with an error naming the place, as a GPU's
// launch fails with cudaErrorAssert; the Python process lives on.
[[noreturn]] inline void device_assert_fail(const char* expr, const char* file, int line) {
    Worker* w = tls_worker;
    if (w == nullptr || w->cur == nullptr || !w->in_fiber) {
        std::fprintf(stderr, "%s:%d: assertion `%s' failed outside a kernel\n", file, line, expr);
        std::abort();
    }
    Fiber* f = w->cur;
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "device assert failed in kernel %s: `%s` at %s:%d, block (%u,%u,%u), thread (%u,%u,%u)\n",
                  w->kernel_name, expr, file, line, w->block_idx.x, w->block_idx.y, w->block_idx.z, f->tid.x,
                  f->tid.y, f->tid.z);
    stop_launch(w, f, msg, &LaunchResult::assert_failed);
}

// A kernel stopping its own launch at file:line (`kernel k called __trap() at ...: why`): the launch fails
// with an error naming the place; the Python process lives on.
[[noreturn]] inline void stop_kernel_here(const char* file, int line, const char* verb, const char* call,
                                          const char* why) {
    Worker* w = tls_worker;
    if (w == nullptr || w->cur == nullptr || !w->in_fiber) {
        std::fprintf(stderr, "%s:%d: %s outside a kernel\n", file, line, call);
        std::abort();
    }
    Fiber* f = w->cur;
    char msg[512];
    std::snprintf(msg, sizeof msg, "kernel %s %s %s at %s:%d, block (%u,%u,%u), thread (%u,%u,%u): %s\n",
                  w->kernel_name, verb, call, file, line, w->block_idx.x, w->block_idx.y, w->block_idx.z, f->tid.x,
                  f->tid.y, f->tid.z, why);
    stop_launch(w, f, msg, &LaunchResult::error);
}

// __trap(): the kernel aborts its own launch, which fails on a GPU with cudaErrorLaunchFailure.
[[noreturn]] inline void device_trap(const char* file, int line) {
    stop_kernel_here(file, line, "called", "__trap()", "the launch failed (cudaErrorLaunchFailure on a GPU)");
}

// __brkpt(): a breakpoint that suspends the kernel for a debugger (cuda-gdb); with none attached the
// GPU stops the launch with an error, and the emulator has no debugger.
[[noreturn]] inline void device_breakpoint(const char* file, int line) {
    stop_kernel_here(file, line, "reached", "__brkpt()",
                     "a breakpoint stops the launch with an error on a GPU unless a debugger (cuda-gdb) is attached, "
                     "and the emulator has none");
}

// A feature the emulator cannot honour, met at run time: the launch stops with an error saying so.
[[noreturn]] inline void device_unsupported(const char* what, int line) {
    Worker* w = tls_worker;
    if (w == nullptr || w->cur == nullptr || !w->in_fiber) {
        std::fprintf(stderr, "llmcupy sim: %s\n", what);
        std::abort();
    }
    Fiber* f = w->cur;
    char msg[512];
    std::snprintf(msg, sizeof msg, "kernel %s uses %s (line %d, block (%u,%u,%u), thread (%u,%u,%u))\n",
                  w->kernel_name, what, line, w->block_idx.x, w->block_idx.y, w->block_idx.z, f->tid.x, f->tid.y,
                  f->tid.z);
    stop_launch(w, f, msg, &LaunchResult::error);
}

// cg::this_grid().sync(): in a cooperative launch the block's barrier, then every block's (see
// GridBarrier); in any other launch an error, as a GPU gives no guarantee there (blocks that are not
// resident never arrive: the launch may hang).
LLMCUPY_SIM_NOSAN_FN inline bool cooperative_launch() { return g_cooperative; }
inline void grid_sync(int line) {
    Worker* w = tls_worker;
    if (w == nullptr || w->cur == nullptr || !w->in_fiber) {
        std::fprintf(stderr, "llmcupy sim: grid_group::sync() outside a kernel\n");
        std::abort();
    }
    if (!g_cooperative) {
        Fiber* f = w->cur;
        char msg[640];
        std::snprintf(msg, sizeof msg,
                      "kernel %s calls grid_group::sync() (line %d, block (%u,%u,%u), thread (%u,%u,%u)) outside a "
                      "cooperative launch, where a GPU gives no grid-wide barrier (the launch may hang): build "
                      "the module with llmcupy.RawModule(..., enable_cooperative_groups=True) (or RawKernel(code, "
                      "name, enable_cooperative_groups=True)) and keep the grid small enough for every block to be "
                      "resident at once\n",
                      w->kernel_name, line, w->block_idx.x, w->block_idx.y, w->block_idx.z, f->tid.x, f->tid.y,
                      f->tid.z);
        stop_launch(w, f, msg, &LaunchResult::error);
    }
    wait_at_barrier(BAR_GRID, 0, line, "grid.sync()");
}

// A plain C conversion of a float to an integer type that cannot hold it (or of a NaN): a GPU's
// cvt.rzi saturates (NaN gives 0), C++ leaves it undefined and x86 gives 0x80000000 or wraps. The
// library is built with GCC's -fsanitize=float-cast-overflow, whose check calls the handler below
// (no UBSan runtime involved) before the conversion; the launch stops with an error naming the
// place instead of going on with a value no GPU would compute.
struct UbsanSourceLocation { const char* file; unsigned line, column; };
struct UbsanTypeDescriptor { unsigned short kind, info; char name[1]; };
struct UbsanFloatCastData { UbsanSourceLocation loc; const UbsanTypeDescriptor* from; const UbsanTypeDescriptor* to; };

inline void float_cast_overflow(const UbsanFloatCastData* d) {
    Worker* w = tls_worker;
    if (w == nullptr || w->cur == nullptr || !w->in_fiber) return;  // host-side code: C++'s rules
    Fiber* f = w->cur;
    char msg[640];
    std::snprintf(msg, sizeof msg,
                  "kernel %s converts an out-of-range or NaN %s to %s at %s:%u, block (%u,%u,%u), thread "
                  "(%u,%u,%u): a GPU saturates (NaN gives 0) where C++ leaves the result undefined, so the "
                  "emulator cannot give the GPU's answer; use __float2int_rz / __float2uint_rz (the same "
                  "conversion, defined on both)\n",
                  w->kernel_name, d->from ? d->from->name : "float", d->to ? d->to->name : "an integer",
                  d->loc.file ? d->loc.file : "?", d->loc.line, w->block_idx.x, w->block_idx.y, w->block_idx.z,
                  f->tid.x, f->tid.y, f->tid.z);
    stop_launch(w, f, msg, &LaunchResult::error);
}

// An integer division or remainder by zero: a GPU gives an unspecified value and goes on, x86 traps
// (SIGFPE), which would kill the Python process. The library is built with GCC's
// -fsanitize=integer-divide-by-zero, whose check calls the handler below (no UBSan runtime) before
// the division; the launch stops with an error naming the line, as for the float casts above.
// (INT_MIN / -1, the other division x86 traps on, is not checked there: the SIGFPE handler reports it.)
struct UbsanDivremData { UbsanSourceLocation loc; const UbsanTypeDescriptor* type; };

inline void divide_by_zero(const UbsanDivremData* d) {
    Worker* w = tls_worker;
    if (w == nullptr || w->cur == nullptr || !w->in_fiber) return;  // host-side code: the CPU's trap
    Fiber* f = w->cur;
    char msg[640];
    std::snprintf(msg, sizeof msg,
                  "kernel %s divides %s by zero (/ or %%) at %s:%u, block (%u,%u,%u), thread (%u,%u,%u): a GPU "
                  "gives an unspecified value where the CPU traps, so the emulator stops the launch; check the "
                  "divisor before dividing\n",
                  w->kernel_name, d->type ? d->type->name : "an integer", d->loc.file ? d->loc.file : "?",
                  d->loc.line, w->block_idx.x, w->block_idx.y, w->block_idx.z, f->tid.x, f->tid.y, f->tid.z);
    stop_launch(w, f, msg, &LaunchResult::error);
}

struct AltStack {
    std::vector<char> mem;
    AltStack() : mem(1 << 16) {
        stack_t ss{};
        ss.ss_sp = mem.data();
        ss.ss_size = mem.size();
        sigaltstack(&ss, nullptr);
    }
};

// OS threads that run a launch's blocks, so the watchdog can interrupt them.
constexpr int kMaxWorkers = 256;
inline pthread_t g_worker_threads[kMaxWorkers];
inline std::atomic<int> g_worker_busy[kMaxWorkers];

// The Worker of this OS thread for this library (its fibers and their stacks).
inline Worker& this_thread_worker() {
    static thread_local Worker worker;
    return worker;
}

// Unmaps the fiber stacks of this thread's Worker; the next launch maps them again. Each stack is
// two memory mappings (its guard page splits it from the stack), and a process may only hold
// vm.max_map_count of them (65530 by default): Python gives the stacks of libraries it has not
// launched lately back through llmcupy_sim_release_fibers (sim/launcher.py, "Fiber stacks").
inline void release_fibers(Worker* w) {
    size_t page = stack_guard_bytes();
    for (Fiber& f : w->fibers)
        if (f.stack != nullptr) munmap(f.stack - page, f.stack_size + page);
    w->fibers.clear();
    w->fibers.shrink_to_fit();
}

inline void worker_loop(const LaunchConfig* cfg, std::atomic<unsigned long long>* next, unsigned long long nblocks,
                        std::atomic<int>* abort_flag, void (*thunk)(void*), void* closure, const char* name,
                        LaunchResult* total, std::atomic<int>* lock, int worker_index) {
    static thread_local AltStack altstack;
    (void)altstack;
    Worker* w = &this_thread_worker();
    tls_worker = w;
    tls_fault_worker = w;
    tls_poison = cfg->poison;
    w->cfg = cfg;
    w->nthreads = int(cfg->block[0] * cfg->block[1] * cfg->block[2]);
    ensure_fibers(w, w->nthreads, size_t(cfg->stack_bytes));
    guard_unpoison(w->shared.dynamic(), w->shared.dynamic_capacity());
    w->shared.assign_dynamic(cfg->shared_mem + 2 * kGuardBytes);
    w->thunk = thunk;
    w->closure = closure;
    w->counters = LaunchResult{};
    w->abandoned = false;
    w->kernel_name = name;
    w->rng.seed(cfg->seed * 0x9E3779B97F4A7C15ull + unsigned(worker_index));
    if (worker_index < kMaxWorkers) {
        g_worker_threads[worker_index] = pthread_self();
        g_worker_busy[worker_index].store(1);
    }
    while (!abort_flag->load()) {
        // a cooperative launch has one worker per block: worker i runs block i, all at once
        unsigned long long b = cfg->cooperative ? (unsigned long long)worker_index : next->fetch_add(1);
        if (b >= nblocks) break;
        dim3 bidx(unsigned(b % cfg->grid[0]), unsigned((b / cfg->grid[0]) % cfg->grid[1]),
                  unsigned(b / (unsigned long long)(cfg->grid[0] * cfg->grid[1])));
        run_block(w, cfg, bidx);
        if (w->abandoned) {
            abort_flag->store(1);
            if (cfg->cooperative) grid_block_failed();
            break;
        }
        if (cfg->cooperative) break;
    }
    if (worker_index < kMaxWorkers) g_worker_busy[worker_index].store(0);
    w->in_fiber = false;
    while (lock->exchange(1)) {}
    total->divergent_barriers += w->counters.divergent_barriers;
    total->barrier_after_exit += w->counters.barrier_after_exit;
    total->exited_lane_reads += w->counters.exited_lane_reads;
    bool failed = w->counters.deadlock || w->counters.assert_failed || w->counters.timed_out ||
                  w->counters.shared_overflow || w->counters.error || w->counters.sanitizer_stop ||
                  w->counters.memory_fault;
    bool reported = total->deadlock || total->assert_failed || total->timed_out || total->shared_overflow || total->error ||
                    total->sanitizer_stop || total->memory_fault;
    if (failed && !reported) {
        total->memory_fault = w->counters.memory_fault;
        total->sanitizer_stop = w->counters.sanitizer_stop;
        total->error = w->counters.error;
        total->deadlock = w->counters.deadlock;
        total->assert_failed = w->counters.assert_failed;
        total->timed_out = w->counters.timed_out;
        total->shared_overflow = w->counters.shared_overflow;
        std::memcpy(total->message, w->counters.message, sizeof total->message);
    }
    lock->store(0);
    w->cur = nullptr;
}

// OS threads that run blocks, kept for the life of the process: a Worker and its fiber stacks
// belong to one OS thread, so creating threads per launch would map new stacks every launch.
// The pool also keeps one watchdog thread, armed per launch with a deadline.
class WorkerPool {
  public:
    // Called with the launch mutex held. Never destroyed: its threads are detached. After fork()
    // the child has none of the parent's threads, so a child builds a pool of its own.
    static WorkerPool& instance() {
        static WorkerPool* pool = nullptr;
        static pid_t owner = 0;
        pid_t pid = getpid();
        if (pool == nullptr || owner != pid) {
            pool = new WorkerPool();
            owner = pid;
        }
        return *pool;
    }
    // Runs job on the calling thread and on every pool thread (as indices 0..threads).
    void run_everywhere(const std::function<void(int)>& job) {
        int n;
        {
            std::lock_guard<std::mutex> lk(mutex_);
            n = int(threads_) + 1;
        }
        run(n, job, 0);
    }
    // Runs job(0) on the calling thread and job(1..n-1) on pool threads; returns when all finish.
    void run(int n, const std::function<void(int)>& job, unsigned long long timeout_ms) {
        std::unique_lock<std::mutex> lk(mutex_);
        while (int(threads_) < n - 1) {
            int index = int(threads_++) + 1;
            std::thread([this, index] { loop(index); }).detach();
        }
        if (timeout_ms) arm(timeout_ms, n);
        job_ = &job;
        wanted_ = n;
        pending_ = n - 1;
        ++generation_;
        lk.unlock();
        start_.notify_all();
        job(0);
        lk.lock();
        done_.wait(lk, [this] { return pending_ == 0; });
        job_ = nullptr;
        if (timeout_ms) {
            std::lock_guard<std::mutex> dg(dog_mutex_);
            armed_ = false;
        }
    }

  private:
    void arm(unsigned long long timeout_ms, int n) {
        std::lock_guard<std::mutex> dg(dog_mutex_);
        if (!dog_started_) {
            dog_started_ = true;
            std::thread([this] { watch(); }).detach();
        }
        deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        dog_workers_ = std::min(n, kMaxWorkers);
        armed_ = true;
        dog_cv_.notify_all();
    }
    void watch() {
        std::unique_lock<std::mutex> lk(dog_mutex_);
        while (true) {
            dog_cv_.wait(lk, [this] { return armed_; });
            if (dog_cv_.wait_until(lk, deadline_, [this] { return !armed_; })) continue;
            // Time is up: every worker stops at its next look at the flag; one that runs a thread
            // that never looks is interrupted by the signal, repeated until the launch ends.
            g_timed_out.store(1);
            while (armed_) {
                for (int i = 0; i < dog_workers_; ++i)
                    if (g_worker_busy[i].load()) pthread_kill(g_worker_threads[i], kWatchdogSignal);
                dog_cv_.wait_for(lk, std::chrono::milliseconds(20), [this] { return !armed_; });
            }
        }
    }
    void loop(int index) {
        unsigned long long seen = 0;
        std::unique_lock<std::mutex> lk(mutex_);
        while (true) {
            start_.wait(lk, [&] { return generation_ != seen; });
            seen = generation_;
            if (index >= wanted_) continue;
            const std::function<void(int)>* job = job_;
            lk.unlock();
            (*job)(index);
            lk.lock();
            if (--pending_ == 0) done_.notify_all();
        }
    }
    std::mutex mutex_;
    std::condition_variable start_, done_;
    const std::function<void(int)>* job_ = nullptr;
    unsigned long long generation_ = 0;
    unsigned threads_ = 0;
    int wanted_ = 0, pending_ = 0;
    std::mutex dog_mutex_;
    std::condition_variable dog_cv_;
    bool dog_started_ = false, armed_ = false;
    int dog_workers_ = 0;
    std::chrono::steady_clock::time_point deadline_;
};

inline std::mutex g_launch_mutex;

inline int run_grid(const LaunchConfig* cfg, void (*thunk)(void*), void* closure, const char* name,
                    LaunchResult* res) {
    // One launch at a time per library (the grid and block dimensions are process-wide), as on a
    // single CUDA stream.
    std::lock_guard<std::mutex> guard(g_launch_mutex);
    std::memset(res, 0, sizeof *res);
    unsigned long long nthreads = (unsigned long long)cfg->block[0] * cfg->block[1] * cfg->block[2];
    if (nthreads == 0 || nthreads > kMaxThreads) {
        res->error = 1;
        std::snprintf(res->message, sizeof res->message, "block of %llu threads: CUDA allows 1 to %d", nthreads,
                      kMaxThreads);
        return 1;
    }
    unsigned long long nblocks = (unsigned long long)cfg->grid[0] * cfg->grid[1] * cfg->grid[2];
    g_grid_dim = dim3(cfg->grid[0], cfg->grid[1], cfg->grid[2]);
    g_block_dim = dim3(cfg->block[0], cfg->block[1], cfg->block[2]);
    if (nblocks == 0) return 0;
    g_cooperative = cfg->cooperative != 0;
    if (cfg->cooperative && nblocks > (unsigned long long)kMaxWorkers) {
        // a guard only: the co-residency rule (sim/launcher.py) refuses such grids before this
        res->error = 1;
        std::snprintf(res->message, sizeof res->message,
                      "cooperative launch of %llu blocks: the emulator runs at most %d blocks at once", nblocks,
                      kMaxWorkers);
        return 1;
    }
    struct sigaction sa{}, old_segv{}, old_bus{}, old_fpe{}, dog{}, old_dog{};
    sa.sa_sigaction = fault_handler;
    // SA_NODEFER: a handler that leaves a faulting thread never returns, so SIGSEGV must not stay blocked
    sa.sa_flags = SA_ONSTACK | SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    sigaction(SIGFPE, &sa, &old_fpe);
    if (cfg->timeout_ms) {
        // SA_NODEFER: the handler never returns when it abandons a thread, so it must not leave
        // its own signal blocked.
        dog.sa_sigaction = watchdog_handler;
        dog.sa_flags = SA_ONSTACK | SA_SIGINFO | SA_NODEFER | SA_RESTART;
        sigemptyset(&dog.sa_mask);
        sigaction(kWatchdogSignal, &dog, &old_dog);
    }
    g_timed_out.store(0);
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
    g_check = cfg->check;
    LLMCUPY_SIM_NOTIFY(on_launch_begin, cfg);
#endif
    std::atomic<unsigned long long> next{0};
    std::atomic<int> abort_flag{0}, lock{0};
    int workers = std::max(1, cfg->workers);
    if ((unsigned long long)workers > nblocks) workers = int(nblocks);
    if (cfg->cooperative) {
        workers = int(nblocks);   // every block at once (Python checked the grid fits the device)
        grid_barrier_reset(nblocks);
    }
    WorkerPool::instance().run(workers, [&](int i) {
        worker_loop(cfg, &next, nblocks, &abort_flag, thunk, closure, name, res, &lock, i);
    }, cfg->timeout_ms);
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    sigaction(SIGFPE, &old_fpe, nullptr);
    if (cfg->timeout_ms) sigaction(kWatchdogSignal, &old_dog, nullptr);
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
    LLMCUPY_SIM_NOTIFY(on_launch_end, res);
    g_check = 0;
#endif
    if (g_timed_out.load() && !res->timed_out && !res->deadlock && !res->assert_failed && !res->shared_overflow) {
        // The limit passed while the last blocks were finishing: the launch did complete.
        g_timed_out.store(0);
    }
    return res->deadlock ? 2 : 0;
}

template <int> constexpr bool always_false = false;
LLMCUPY_SIM_NOSAN_FN inline unsigned ptx_laneid() { return unsigned(tls_worker->cur->lane); }
LLMCUPY_SIM_NOSAN_FN inline unsigned ptx_warpid() { return unsigned(tls_worker->cur->warp); }

// Unpacks the argument array (one pointer to each argument's bytes, as cuLaunchKernel takes
// them) into the kernel's own parameter types and runs the grid.
template <typename... A, size_t... I>
inline std::tuple<std::decay_t<A>...> unpack_args(void** args, std::index_sequence<I...>) {
    return std::tuple<std::decay_t<A>...>(*static_cast<std::decay_t<A>*>(args[I])...);
}

// The kernel's parameters are by value: every CUDA thread gets its own copy of the arguments. The
// call is written out here, not left to std::apply: clang does not inline an instrumented library
// template into this uninstrumented caller, and std::apply's reads of the launching thread's
// closure would reach the sanitizers as the kernel's.
template <typename... A, typename T, size_t... I>
LLMCUPY_SIM_NOSAN_FN inline void call_kernel(void (*kernel)(A...), const T& args, std::index_sequence<I...>) {
    kernel(std::get<I>(args)...);
}

template <typename... A>
inline int launch(void (*kernel)(A...), const char* name, const LaunchConfig* cfg, void** args, LaunchResult* res) {
    struct Closure {
        void (*kernel)(A...);
        std::tuple<std::decay_t<A>...> args;
    } closure{kernel, unpack_args<A...>(args, std::index_sequence_for<A...>{})};
    // Not instrumented: the closure lives on the launching thread's stack, not in kernel memory.
    // (GCC does not inline the instrumented kernel into it, so the kernel's accesses stay hooked.)
    auto thunk = [](void* p) LLMCUPY_SIM_NOSAN_FN {
        auto* c = static_cast<Closure*>(p);
        call_kernel(c->kernel, c->args, std::index_sequence_for<A...>{});
    };
    return run_grid(cfg, thunk, &closure, name, res);
}

}  // namespace llmcupy_sim

// Gives back the fiber stacks of every worker thread of this library (between launches).
extern "C" LLMCUPY_SIM_EXPORT void llmcupy_sim_release_fibers() {
    std::lock_guard<std::mutex> guard(llmcupy_sim::g_launch_mutex);
    llmcupy_sim::WorkerPool::instance().run_everywhere(
        [](int) { llmcupy_sim::release_fibers(&llmcupy_sim::this_thread_worker()); });
}

namespace llmcupy_sim {

// The kernel's parameter types as C spellings, so Python can check arguments exactly.
template <typename T> struct type_name { static const char* get() { return nullptr; } };
#define LLMCUPY_SIM_TYPE_NAME(T)                                            \
    template <> struct type_name<T> { static const char* get() { return #T; } };
LLMCUPY_SIM_TYPE_NAME(float) LLMCUPY_SIM_TYPE_NAME(double) LLMCUPY_SIM_TYPE_NAME(int)
LLMCUPY_SIM_TYPE_NAME(unsigned int) LLMCUPY_SIM_TYPE_NAME(long) LLMCUPY_SIM_TYPE_NAME(unsigned long)
LLMCUPY_SIM_TYPE_NAME(long long) LLMCUPY_SIM_TYPE_NAME(unsigned long long) LLMCUPY_SIM_TYPE_NAME(bool)
LLMCUPY_SIM_TYPE_NAME(char) LLMCUPY_SIM_TYPE_NAME(signed char) LLMCUPY_SIM_TYPE_NAME(unsigned char)
LLMCUPY_SIM_TYPE_NAME(short) LLMCUPY_SIM_TYPE_NAME(unsigned short) LLMCUPY_SIM_TYPE_NAME(void)
LLMCUPY_SIM_TYPE_NAME(float2) LLMCUPY_SIM_TYPE_NAME(float4) LLMCUPY_SIM_TYPE_NAME(int2)
LLMCUPY_SIM_TYPE_NAME(int4) LLMCUPY_SIM_TYPE_NAME(double2) LLMCUPY_SIM_TYPE_NAME(uchar4) LLMCUPY_SIM_TYPE_NAME(char4)
LLMCUPY_SIM_TYPE_NAME(uchar2) LLMCUPY_SIM_TYPE_NAME(short2) LLMCUPY_SIM_TYPE_NAME(ushort2) LLMCUPY_SIM_TYPE_NAME(short4)
LLMCUPY_SIM_TYPE_NAME(uint2) LLMCUPY_SIM_TYPE_NAME(uint4) LLMCUPY_SIM_TYPE_NAME(float3) LLMCUPY_SIM_TYPE_NAME(int3)
LLMCUPY_SIM_TYPE_NAME(double4) LLMCUPY_SIM_TYPE_NAME(longlong2) LLMCUPY_SIM_TYPE_NAME(ulonglong2)
LLMCUPY_SIM_TYPE_NAME(float1) LLMCUPY_SIM_TYPE_NAME(int1)
#undef LLMCUPY_SIM_TYPE_NAME

template <typename T>
inline std::string param_spelling() {
    if constexpr (std::is_pointer_v<T>) {
        using P = std::remove_pointer_t<T>;
        const char* base = type_name<std::remove_cv_t<P>>::get();
        std::string s = base ? base : "?";
        return (std::is_const_v<P> ? "const " : "") + s + "*";
    } else {
        // a type without a name here (a struct passed by value) is "?" and its size, which Python
        // checks the argument's bytes against
        const char* base = type_name<std::remove_cv_t<T>>::get();
        return base ? std::string(base) : "?" + std::to_string(sizeof(T));
    }
}

template <typename... A>
inline const char* signature(void (*)(A...)) {
    static std::string s = [] {
        std::string out;
        ((out += param_spelling<std::decay_t<A>>() + ";"), ...);
        return out;
    }();
    return s.c_str();
}

}  // namespace llmcupy_sim

// A device assert() fails the launch with a Python exception instead of aborting the process. As
// under NVRTC, where assert() is built in, a kernel needs no header for it (<assert.h> and <cassert>
// are host headers, which NVRTC refuses; <cuda/std/cassert> routes here).
#undef assert
#ifdef NDEBUG
#define assert(e) ((void)0)
#else
#define assert(e) ((e) ? (void)0 : llmcupy_sim::device_assert_fail(#e, __FILE__, __LINE__))
#endif
#define __assertfail(msg, file, line, fn, size) llmcupy_sim::device_assert_fail(msg, file, line)
#define __trap() llmcupy_sim::device_trap(__FILE__, __LINE__)
#define __brkpt() llmcupy_sim::device_breakpoint(__FILE__, __LINE__)

// GCC's -fsanitize=float-cast-overflow check calls this (see float_cast_overflow above).
extern "C" __attribute__((used)) void __ubsan_handle_float_cast_overflow(void* data, void*) {
    llmcupy_sim::float_cast_overflow(static_cast<const llmcupy_sim::UbsanFloatCastData*>(data));
}
// GCC's -fsanitize=integer-divide-by-zero check calls this (see divide_by_zero above).
extern "C" __attribute__((used)) void __ubsan_handle_divrem_overflow(void* data, void*, void*) {
    llmcupy_sim::divide_by_zero(static_cast<const llmcupy_sim::UbsanDivremData*>(data));
}

#if defined(LLMCUPY_SIM_VOLATILE_HOOKS) || defined(LLMCUPY_SIM_ACCESS_HOOKS)
// ThreadSanitizer's hooks, compiled into sources that use `volatile` and into instrumented builds
// (see sim/compiler.py). A volatile access made by a CUDA thread yields, so the threads of a block
// take their volatile accesses in turns: warp-synchronous code on volatile shared memory runs in
// lock-step, and a thread spinning on a volatile flag lets the writer run. In an instrumented build
// every hook first hands the access to the observers (see "Access hooks" above); otherwise the
// plain hooks do nothing.
#define LLMCUPY_SIM_NOSAN extern "C" __attribute__((no_sanitize_thread, used))
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
namespace llmcupy_sim {
__attribute__((no_sanitize_thread)) inline void dispatch_access(const void* addr, unsigned size, unsigned flags,
                                                                const void* pc) {
    if (__builtin_expect(!g_check, 0) || tls_quiet) return;
    Worker* w = tls_worker;
    if (w == nullptr || !w->in_fiber) return;  // the scheduler's own accesses
    uintptr_t a = uintptr_t(addr);
    // The emulator's records, read by collectives compiled into the kernel (gathered lane values).
    if (a - uintptr_t(w) < sizeof(Worker)) return;
    if (a - uintptr_t(w->fibers.data()) < w->fibers.size() * sizeof(Fiber)) return;
    if (addr == &tls_worker || addr == &tls_epoch || addr == &tls_poison) return;
    if (addr == &warpSize) return;  // a register on a GPU (the header's stand-in variable), no memory
    Access acc{addr, size, flags, pc};
    ++tls_quiet;
    for (int i = 0; i < g_nobservers; ++i)
        if (g_observers[i]->on_access) g_observers[i]->on_access(w, w->cur, acc);
    --tls_quiet;
}
// Stops the launch from inside an observer, before the access it was shown happens (memcheck):
// the running thread never resumes, the block is abandoned, Python raises.
[[noreturn]] __attribute__((no_sanitize_thread)) inline void stop_launch(Worker* w) {
    Fiber* f = w->cur;
    tls_quiet = 0;
    w->counters.sanitizer_stop = 1;
    w->abandoned = true;
    f->state = DONE;
    switch_to_scheduler(w, true);
    std::abort();  // never resumed
}
// Brackets the memory operation of an atomic for the observers (on_atomic_begin / on_atomic_end),
// so that one holding a lock across it sees atomics on an address in the order they happened.
struct AtomicScope {
    Worker* w = nullptr;
    const void* addr;
    unsigned flags;
    __attribute__((no_sanitize_thread)) AtomicScope(const volatile void* a, unsigned f)
        : addr(const_cast<const void*>(a)), flags(f) {
        Worker* cur = tls_worker;
        if (!g_check || tls_quiet || cur == nullptr || !cur->in_fiber) return;
        w = cur;
        ++tls_quiet;
        LLMCUPY_SIM_NOTIFY(on_atomic_begin, w, addr, flags);
        --tls_quiet;
    }
    __attribute__((no_sanitize_thread)) ~AtomicScope() {
        if (w == nullptr) return;
        ++tls_quiet;
        LLMCUPY_SIM_NOTIFY(on_atomic_end, w, addr, flags);
        --tls_quiet;
    }
};
}  // namespace llmcupy_sim
#define LLMCUPY_SIM_SEE(ADDR, N, FLAGS) llmcupy_sim::dispatch_access((ADDR), (N), (FLAGS), __builtin_return_address(0))
#define LLMCUPY_SIM_ATOMIC_SCOPE(ADDR, FLAGS) llmcupy_sim::AtomicScope atomic_scope_((ADDR), (FLAGS))
// Copies the emulator makes for a kernel with memcpy (cp.async stand-ins) are not instrumented:
// such a helper is kept out of line in instrumented builds and reports the copy itself with
// LLMCUPY_SIM_SEE_COPY, its return address standing for the kernel's call site.
#define LLMCUPY_SIM_COPY_HELPER __attribute__((noinline))
#define LLMCUPY_SIM_SEE_COPY(DST, SRC, READ, WRITTEN)                                                   \
    do {                                                                                                 \
        if ((READ) > 0) llmcupy_sim::dispatch_access((SRC), unsigned(READ), 0u, __builtin_return_address(0)); \
        if ((WRITTEN) > 0) llmcupy_sim::dispatch_access((DST), unsigned(WRITTEN), 1u, __builtin_return_address(0)); \
    } while (0)
#else
#define LLMCUPY_SIM_SEE(ADDR, N, FLAGS) ((void)0)
#define LLMCUPY_SIM_ATOMIC_SCOPE(ADDR, FLAGS) ((void)0)
#endif
// A volatile access reports ACCESS_VOLATILE (4) beside read/write, then lets the block's other threads
// run. After that, right before the load or store itself, the observers hear of it as of an atomic:
// volatile accesses are strong, and a volatile flag can hand data from one block to another.
#define LLMCUPY_SIM_VOLATILE_HOOK(KIND, N)                                                         \
    LLMCUPY_SIM_NOSAN void __tsan_volatile_##KIND##N(void* p) {                                     \
        LLMCUPY_SIM_SEE(p, N, LLMCUPY_SIM_FLAGS_##KIND | 4u | LLMCUPY_SIM_MISALIGNED(p, N));        \
        llmcupy_sim::yield_fiber(0, "a volatile " #KIND);                                           \
        LLMCUPY_SIM_ATOMIC_SCOPE(p, LLMCUPY_SIM_FLAGS_##KIND | 4u);                                 \
    }                                                                                               \
    LLMCUPY_SIM_NOSAN void __tsan_unaligned_volatile_##KIND##N(void* p) {                           \
        LLMCUPY_SIM_SEE(p, N, LLMCUPY_SIM_FLAGS_##KIND | 4u);                                       \
        llmcupy_sim::yield_fiber(0, "a volatile " #KIND);                                           \
        LLMCUPY_SIM_ATOMIC_SCOPE(p, LLMCUPY_SIM_FLAGS_##KIND | 4u);                                 \
    }
// The hooks without `unaligned` are those of accesses the compiler took as aligned to their size, up
// to 8 bytes: g++ calls __tsan_read16 for a 16-byte access of alignment 8 too (a struct of two
// doubles, which a GPU reads from any multiple of 8), so a 16-byte one is only known misaligned off 8.
#define LLMCUPY_SIM_MISALIGNED(P, N) ((uintptr_t(P) & (((N) < 8 ? (N) : 8) - 1)) ? 8u : 0u)
#define LLMCUPY_SIM_FLAGS_read 0u
#define LLMCUPY_SIM_FLAGS_write 1u
#define LLMCUPY_SIM_SIZES(M, KIND) M(KIND, 1) M(KIND, 2) M(KIND, 4) M(KIND, 8) M(KIND, 16)
LLMCUPY_SIM_SIZES(LLMCUPY_SIM_VOLATILE_HOOK, read)
LLMCUPY_SIM_SIZES(LLMCUPY_SIM_VOLATILE_HOOK, write)
#define LLMCUPY_SIM_PLAIN(KIND, N)                                                                  \
    LLMCUPY_SIM_NOSAN void __tsan_##KIND##N(void* p) {                                              \
        LLMCUPY_SIM_SEE(p, N, LLMCUPY_SIM_FLAGS_##KIND | LLMCUPY_SIM_MISALIGNED(p, N));             \
    }                                                                                               \
    LLMCUPY_SIM_NOSAN void __tsan_unaligned_##KIND##N(void* p) { LLMCUPY_SIM_SEE(p, N, LLMCUPY_SIM_FLAGS_##KIND); }
LLMCUPY_SIM_SIZES(LLMCUPY_SIM_PLAIN, read)
LLMCUPY_SIM_SIZES(LLMCUPY_SIM_PLAIN, write)
LLMCUPY_SIM_NOSAN void __tsan_init() {}
LLMCUPY_SIM_NOSAN void __tsan_func_entry(void*) {}
LLMCUPY_SIM_NOSAN void __tsan_func_exit() {}
LLMCUPY_SIM_NOSAN void __tsan_read_range(void* p, unsigned long n) { LLMCUPY_SIM_SEE(p, unsigned(n), 0u); }
LLMCUPY_SIM_NOSAN void __tsan_write_range(void* p, unsigned long n) { LLMCUPY_SIM_SEE(p, unsigned(n), 1u); }
// Newer clang (19 is checked) calls these for every memcpy, memmove and memset of instrumented code,
// its own struct copies among them (a float4 assigned, a struct zeroed); g++ calls none of them.
LLMCUPY_SIM_NOSAN void* __tsan_memcpy(void* d, const void* s, unsigned long n) {
    if (n) { LLMCUPY_SIM_SEE(s, unsigned(n), 0u); LLMCUPY_SIM_SEE(d, unsigned(n), 1u); }
    return std::memcpy(d, s, n);
}
LLMCUPY_SIM_NOSAN void* __tsan_memmove(void* d, const void* s, unsigned long n) {
    if (n) { LLMCUPY_SIM_SEE(s, unsigned(n), 0u); LLMCUPY_SIM_SEE(d, unsigned(n), 1u); }
    return std::memmove(d, s, n);
}
LLMCUPY_SIM_NOSAN void* __tsan_memset(void* d, int c, unsigned long n) {
    if (n) LLMCUPY_SIM_SEE(d, unsigned(n), 1u);
    return std::memset(d, c, n);
}
LLMCUPY_SIM_NOSAN void __tsan_vptr_update(void**, void*) {}
LLMCUPY_SIM_NOSAN void __tsan_vptr_read(void**) {}
LLMCUPY_SIM_NOSAN void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
LLMCUPY_SIM_NOSAN void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
#define LLMCUPY_SIM_TSAN_ATOMIC(N, T)                                                                          \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_load(const volatile T* a, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 2u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 2u); return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN void __tsan_atomic##N##_store(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) { LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u); LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u); return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); } \
    LLMCUPY_SIM_NOSAN int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {              \
        LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u);                                                               \
        LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u);                                                                              \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); }                      \
    LLMCUPY_SIM_NOSAN int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                \
        LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u);                                                               \
        LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u);                                                                              \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); }                      \
    LLMCUPY_SIM_NOSAN T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                    \
        LLMCUPY_SIM_SEE((const void*)a, sizeof(T), 3u);                                                               \
        LLMCUPY_SIM_ATOMIC_SCOPE(a, 3u);                                                                              \
        __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return c; }
LLMCUPY_SIM_TSAN_ATOMIC(8, unsigned char)
LLMCUPY_SIM_TSAN_ATOMIC(16, unsigned short)
LLMCUPY_SIM_TSAN_ATOMIC(32, unsigned int)
LLMCUPY_SIM_TSAN_ATOMIC(64, unsigned long long)
#ifdef LLMCUPY_SIM_ACCESS_HOOKS
#include "llmcupy_sim_check.h"
#include "llmcupy_sim_metrics.h"
#endif
#endif

// glibc's <sys/types.h>, which the emulator needs, also defines uint, ushort and ulong; NVRTC does not,
// so a kernel using them (SGEMM tutorials written for nvcc do) fails to compile on a GPU. Renamed here
// to a name nothing declares, they fail here too, unless the source declares them itself (a typedef,
// a using, a #define or -D), which works under both compilers. sim/compiler.py names the error.
#pragma pop_macro("uint")
#pragma pop_macro("ushort")
#pragma pop_macro("ulong")
#ifndef uint
#define uint llmcupy_sim_nvrtc_has_no_uint
#endif
#ifndef ushort
#define ushort llmcupy_sim_nvrtc_has_no_ushort
#endif
#ifndef ulong
#define ulong llmcupy_sim_nvrtc_has_no_ulong
#endif
