// llmcupy_sim.h -- the CPU emulator's stand-in for the CUDA device runtime.
//
// The emulator compiles an unchanged .cu file with g++ against this header. Every CUDA thread of a
// block is a fiber (its own stack) and all fibers of a block run on one OS thread; blocks are spread
// over a few OS threads. A fiber only gives up the CPU at a synchronisation point: __syncthreads()
// and its variants, a warp collective (shuffle, vote, __syncwarp, cooperative-groups sync/reduce).
// The scheduler then decides what is released, so between two barriers the threads of a block run
// one after the other, in the order the launch asks for (forward, reverse or seeded random).
//
// What makes it a test tool (counted per launch and returned to Python):
//   - shared memory is filled with 0xFF bytes (a NaN for float) when each block starts;
//   - divergent_barriers: a __syncthreads() released while threads wait at different call sites;
//   - barrier_after_exit: a __syncthreads() that some threads of the block never reach because
//     they returned (undefined in CUDA, even if recent GPUs tolerate it);
//   - exited_lane_reads: a warp collective that reads a lane which has exited or is not in the mask;
//   - deadlock: no thread can make progress; reported with the source lines they wait at.
//
// What it does not model: timing, coalescing, bank conflicts, FMA contraction and rounding order,
// races between two barriers (a thread runs from one sync point to the next without interruption,
// so an unsynchronised read-after-write within that window is only exposed by changing the order).
#pragma once

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
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__) && !defined(LLMCUPY_SIM_UCONTEXT)
#define LLMCUPY_SIM_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
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
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __constant__ static
// The Python side rewrites every `__shared__` declaration it recognises (see sim/compiler.py) so
// that it is poisoned per block; anything it does not recognise still works, unpoisoned.
#define __shared__ static thread_local
#define __CUDACC__ 1
#define __CUDA_ARCH__ 800
#define LLMCUPY_SIM 1
#define LLMCUPY_SIM_EXPORT __attribute__((visibility("default")))

// ---------------------------------------------------------------------------------------------
// Vector types, with CUDA's alignment (float4 is 16-byte aligned, which the float4 loads need)
// ---------------------------------------------------------------------------------------------
#define LLMCUPY_SIM_VEC(NAME, T, ALIGN)                                                         \
    struct alignas(ALIGN) NAME##1 { T x; };                                                    \
    struct alignas(ALIGN * 2) NAME##2 { T x, y; };                                             \
    struct NAME##3 { T x, y, z; };                                                            \
    struct alignas(ALIGN * 4) NAME##4 { T x, y, z, w; };                                       \
    inline NAME##1 make_##NAME##1(T x) { return {x}; }                                         \
    inline NAME##2 make_##NAME##2(T x, T y) { return {x, y}; }                                 \
    inline NAME##3 make_##NAME##3(T x, T y, T z) { return {x, y, z}; }                         \
    inline NAME##4 make_##NAME##4(T x, T y, T z, T w) { return {x, y, z, w}; }
LLMCUPY_SIM_VEC(float, float, 4)
LLMCUPY_SIM_VEC(int, int, 4)
LLMCUPY_SIM_VEC(uint, unsigned int, 4)
#undef LLMCUPY_SIM_VEC
struct alignas(16) double2 { double x, y; };
inline double2 make_double2(double x, double y) { return {x, y}; }

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

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
};

struct LaunchResult {
    unsigned long long divergent_barriers;
    unsigned long long barrier_after_exit;
    unsigned long long exited_lane_reads;
    int deadlock;
    int error;
    char message[2048];
};

enum FiberState : int { READY = 0, AT_BARRIER = 1, AT_WARP = 2, DONE = 3 };
enum BarrierKind : int { BAR_PLAIN = 0, BAR_COUNT = 1, BAR_AND = 2, BAR_OR = 3 };

constexpr int kMaxThreads = 1024;
constexpr int kPostBytes = 32;   // largest value a warp collective moves per lane

struct Fiber {
    void* sp = nullptr;                   // saved stack pointer while switched out
#ifndef LLMCUPY_SIM_ASM_SWITCH
    ucontext_t ctx;
#endif
    char* stack = nullptr;                // mmap'ed, with a guard page at the low end
    size_t stack_size = 0;
    dim3 tid;
    int linear = 0, warp = 0, lane = 0;
    int state = READY;
    int wait_line = 0;                    // source line of the barrier or collective it waits at
    const char* wait_what = "";
    unsigned int wait_mask = 0;
    int predicate = 0;                    // for __syncthreads_count/and/or
    alignas(16) unsigned char post[kPostBytes];
};

struct WarpGather {
    alignas(16) unsigned char value[32][kPostBytes];  // snapshot of every lane's post at release
    unsigned int valid = 0;                           // lanes whose value is meaningful
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
    std::vector<unsigned char> dyn_shared;
    unsigned long long epoch = 0;
    void (*thunk)(void*) = nullptr;
    void* closure = nullptr;
    std::mt19937_64 rng;
    LaunchResult counters{};
    bool abandoned = false;
    const char* kernel_name = "";
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

}  // namespace llmcupy_sim

// The built-in index variables. threadIdx is read through the running fiber: the context switch
// is an opaque call, so the compiler reloads it after every sync point.
#define threadIdx (llmcupy_sim::tls_worker->cur->tid)
#define blockIdx (llmcupy_sim::tls_worker->block_idx)
#define blockDim (llmcupy_sim::g_block_dim)
#define gridDim (llmcupy_sim::g_grid_dim)
static constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------
// Context switch. x86-64: a small hand-written switch that saves the callee-saved registers and
// the floating-point control words. Elsewhere (or with -DLLMCUPY_SIM_UCONTEXT): ucontext, which
// is portable but about ten times slower because it saves the signal mask with a system call.
// ---------------------------------------------------------------------------------------------
#ifdef LLMCUPY_SIM_ASM_SWITCH
extern "C" void llmcupy_sim_switch(void** save_sp, void* new_sp);
extern "C" void llmcupy_sim_trampoline();
__asm__(
    ".text\n"
    ".globl llmcupy_sim_switch\n"
    ".hidden llmcupy_sim_switch\n"
    ".type llmcupy_sim_switch,@function\n"
    "llmcupy_sim_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size llmcupy_sim_switch, .-llmcupy_sim_switch\n"
    ".globl llmcupy_sim_trampoline\n"
    ".hidden llmcupy_sim_trampoline\n"
    ".type llmcupy_sim_trampoline,@function\n"
    "llmcupy_sim_trampoline:\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    ".size llmcupy_sim_trampoline, .-llmcupy_sim_trampoline\n");
#endif

namespace llmcupy_sim {

inline void fiber_main(Fiber* f);

inline void init_fiber_stack(Fiber* f) {
#ifdef LLMCUPY_SIM_ASM_SWITCH
    uintptr_t top = (reinterpret_cast<uintptr_t>(f->stack) + f->stack_size) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top) - 8;
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

inline void switch_to_fiber(Worker* w, Fiber* f) {
    w->cur = f;
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
}

inline void switch_to_scheduler(Worker* w, bool finished = false) {
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

inline void fiber_main(Fiber* f) {
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
inline void wait_at_barrier(int kind, int pred, int line, const char* what) {
    Worker* w = tls_worker;
    Fiber* f = w->cur;
    f->state = AT_BARRIER;
    f->wait_line = line;
    f->wait_what = what;
    f->predicate = (kind == BAR_PLAIN) ? 0 : pred;
    f->wait_mask = unsigned(kind);
    switch_to_scheduler(w);
}

// Posts `bytes` bytes of `value` for the lanes named in `mask`, waits until every live lane of the
// mask has posted, and returns the gathered snapshot of the warp.
inline const WarpGather& warp_exchange(unsigned mask, const void* value, size_t bytes, int line, const char* what) {
    Worker* w = tls_worker;
    Fiber* f = w->cur;
    if (bytes) std::memcpy(f->post, value, bytes);
    f->state = AT_WARP;
    f->wait_mask = mask | (1u << f->lane);
    f->wait_line = line;
    f->wait_what = what;
    switch_to_scheduler(w);
    return w->gathers[f->warp];
}

inline int current_lane() { return tls_worker->cur->lane; }

// Reads lane `src`'s value from a gathered snapshot; a lane that exited or did not take part is a
// hazard (CUDA returns an undefined value), counted and answered with the caller's own value.
template <typename T>
inline T read_lane(const WarpGather& g, int src, T own) {
    if (src < 0 || src > 31 || !(g.valid & (1u << src))) {
        tls_worker->counters.exited_lane_reads++;
        return own;
    }
    T out;
    std::memcpy(&out, g.value[src], sizeof(T));
    return out;
}

// Shared memory: one storage per declaration site and per OS thread (= per running block),
// poisoned the first time a block touches it.
template <typename T, int ID>
inline T& shared_var() {
    alignas(16) static thread_local unsigned char storage[sizeof(T)];
    static thread_local unsigned long long epoch = 0;
    if (epoch != tls_epoch) {
        epoch = tls_epoch;
        if (tls_poison) std::memset(storage, 0xFF, sizeof(T));
    }
    return *reinterpret_cast<T*>(storage);
}

template <typename T>
inline T* dynamic_shared() {
    return reinterpret_cast<T*>(tls_worker->dyn_shared.data());
}

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
    llmcupy_sim::warp_exchange(mask, nullptr, 0, line, "__syncwarp");
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---------------------------------------------------------------------------------------------
// Warp shuffles and votes (a masked all-gather; `width` splits the warp into segments)
// ---------------------------------------------------------------------------------------------
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32, int line = __builtin_LINE()) {
    static_assert(sizeof(T) <= llmcupy_sim::kPostBytes, "value too large for a warp shuffle");
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_sync");
    int base = lane & ~(width - 1);
    return llmcupy_sim::read_lane(g, base + (src & (width - 1)), v);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, int line = __builtin_LINE()) {
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_up_sync");
    int base = lane & ~(width - 1);
    int src = lane - int(delta);
    if (src < base) return v;
    return llmcupy_sim::read_lane(g, src, v);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, int line = __builtin_LINE()) {
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_down_sync");
    int base = lane & ~(width - 1);
    int src = lane + int(delta);
    if (src >= base + width) return v;
    return llmcupy_sim::read_lane(g, src, v);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, int line = __builtin_LINE()) {
    int lane = llmcupy_sim::current_lane();
    const auto& g = llmcupy_sim::warp_exchange(mask, &v, sizeof(T), line, "__shfl_xor_sync");
    int base = lane & ~(width - 1);
    int src = lane ^ lane_mask;
    if (src < base || src >= base + width) return v;
    return llmcupy_sim::read_lane(g, src, v);
}
inline unsigned __ballot_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    int p = pred != 0;
    const auto& g = llmcupy_sim::warp_exchange(mask, &p, sizeof(int), line, "__ballot_sync");
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
    const auto& g = llmcupy_sim::warp_exchange(mask, &p, sizeof(int), line, "__all_sync");
    for (int l = 0; l < 32; ++l)
        if ((mask & (1u << l)) && !llmcupy_sim::read_lane(g, l, 1)) return 0;
    return 1;
}
inline int __any_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    int p = pred != 0;
    const auto& g = llmcupy_sim::warp_exchange(mask, &p, sizeof(int), line, "__any_sync");
    for (int l = 0; l < 32; ++l)
        if ((mask & (1u << l)) && llmcupy_sim::read_lane(g, l, 0)) return 1;
    return 0;
}
inline unsigned __activemask() {
    auto* w = llmcupy_sim::tls_worker;
    int warp = w->cur->warp;
    unsigned m = 0;
    for (int l = 0; l < 32; ++l) {
        int t = warp * 32 + l;
        if (t < w->nthreads && w->fibers[t].state != llmcupy_sim::DONE) m |= 1u << l;
    }
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
    T old = *reinterpret_cast<volatile T*>(addr);
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
template <typename T> inline T atomicAdd(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 0); }
template <typename T> inline T atomicSub(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 1); }
template <typename T> inline T atomicExch(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 2); }
template <typename T> inline T atomicMax(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 3); }
template <typename T> inline T atomicMin(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 4); }
template <typename T> inline T atomicAnd(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 5); }
template <typename T> inline T atomicOr(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 6); }
template <typename T> inline T atomicXor(T* a, T v) { return llmcupy_sim_atomic_rmw(a, v, 7); }
// CUDA's wrapping counters: inc stores (old >= limit) ? 0 : old + 1, dec stores
// (old == 0 || old > limit) ? limit : old - 1; both return old.
inline unsigned int atomicInc(unsigned int* a, unsigned int limit) {
    unsigned int old = __atomic_load_n(a, __ATOMIC_SEQ_CST), next;
    do { next = old >= limit ? 0u : old + 1u; } while (!__atomic_compare_exchange_n(a, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
inline unsigned int atomicDec(unsigned int* a, unsigned int limit) {
    unsigned int old = __atomic_load_n(a, __ATOMIC_SEQ_CST), next;
    do { next = (old == 0u || old > limit) ? limit : old - 1u; } while (!__atomic_compare_exchange_n(a, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
template <typename T>
inline T atomicCAS(T* a, T compare, T val) {
    __atomic_compare_exchange(a, &compare, &val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;
}

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
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float exp10f(float x) { return std::pow(10.0f, x); }
inline int __float2int_rn(float x) { return int(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return int(x); }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline long long clock64() { return 0; }
using std::isinf;
using std::isnan;
using std::isfinite;
// CUDA's min/max for device code, including mixed argument types (int and unsigned -> unsigned),
// which std::min/std::max refuse.
template <typename A, typename B, typename = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return std::fmin(C(a), C(b));
    else return C(a) < C(b) ? C(a) : C(b);
}
template <typename A, typename B, typename = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return std::fmax(C(a), C(b));
    else return C(a) > C(b) ? C(a) : C(b);
}

namespace llmcupy_sim {

// ---------------------------------------------------------------------------------------------
// Scheduler
// ---------------------------------------------------------------------------------------------
inline size_t fiber_stack_size() {
    static size_t size = [] {
        const char* env = std::getenv("LLMCUPY_SIM_STACK_KB");
        size_t kb = env ? size_t(std::atol(env)) : 64;
        return std::max<size_t>(kb, 16) * 1024;
    }();
    return size;
}

inline void ensure_fibers(Worker* w, int n) {
    if (int(w->fibers.size()) >= n) return;
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    size_t size = fiber_stack_size();
    size_t old = w->fibers.size();
    // Fiber holds raw pointers only; growing the vector before any fiber runs is safe.
    w->fibers.resize(n);
    for (size_t i = old; i < size_t(n); ++i) {
        void* mem = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) { std::fprintf(stderr, "llmcupy sim: cannot map a fiber stack of %zu bytes (fiber %zu): %s\n", size + page, i, std::strerror(errno)); std::abort(); }
        mprotect(mem, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
        w->fibers[i].stack = static_cast<char*>(mem) + page;
        w->fibers[i].stack_size = size;
    }
}

inline void append_message(LaunchResult* r, const char* text) {
    size_t used = std::strlen(r->message);
    if (used + 1 >= sizeof(r->message)) return;
    std::snprintf(r->message + used, sizeof(r->message) - used, "%s", text);
}

// Releases every warp group whose live lanes have all arrived. Returns how many fibers it released.
inline int release_warps(Worker* w) {
    int released = 0;
    int nwarps = (w->nthreads + 31) / 32;
    for (int warp = 0; warp < nwarps; ++warp) {
        unsigned live = 0, waiting = 0;
        for (int l = 0; l < 32; ++l) {
            int t = warp * 32 + l;
            if (t >= w->nthreads) break;
            int s = w->fibers[t].state;
            if (s != DONE) live |= 1u << l;
            if (s == AT_WARP) waiting |= 1u << l;
        }
        unsigned pending = waiting;
        while (pending) {
            int l = __builtin_ctz(pending);
            Fiber& f = w->fibers[warp * 32 + l];
            unsigned group = f.wait_mask & live;
            if ((group & waiting) == group) {
                WarpGather& g = w->gathers[warp];
                g.valid = group;
                for (int m = 0; m < 32; ++m) {
                    if (!(group & (1u << m))) continue;
                    Fiber& member = w->fibers[warp * 32 + m];
                    std::memcpy(g.value[m], member.post, kPostBytes);
                    member.state = READY;
                    ++released;
                }
                waiting &= ~group;
                // One snapshot per warp per round: the released lanes read it before anyone in
                // this warp can post again, because the scheduler runs every READY fiber first.
                break;
            }
            pending &= ~(1u << l);
        }
    }
    return released;
}

inline int release_block_barrier(Worker* w) {
    int waiting = 0, done = 0;
    int first_line = -1;
    bool divergent = false;
    int count = 0, all = 1, any = 0;
    int kind = BAR_PLAIN;
    for (int t = 0; t < w->nthreads; ++t) {
        Fiber& f = w->fibers[t];
        if (f.state == DONE) { ++done; continue; }
        if (f.state != AT_BARRIER) return 0;  // someone is still at a warp collective
        ++waiting;
        if (first_line < 0) first_line = f.wait_line, kind = int(f.wait_mask);
        else if (f.wait_line != first_line) divergent = true;
        count += f.predicate;
        all &= f.predicate;
        any |= f.predicate;
    }
    if (waiting == 0) return 0;
    if (divergent) w->counters.divergent_barriers++;
    if (done) w->counters.barrier_after_exit++;
    w->barrier_result = kind == BAR_COUNT ? count : kind == BAR_AND ? all : kind == BAR_OR ? any : 0;
    for (int t = 0; t < w->nthreads; ++t)
        if (w->fibers[t].state == AT_BARRIER) w->fibers[t].state = READY;
    return waiting;
}

inline void report_deadlock(Worker* w) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "deadlock in kernel %s, block (%u,%u,%u): no thread can proceed.\n",
                  w->kernel_name, w->block_idx.x, w->block_idx.y, w->block_idx.z);
    append_message(&w->counters, line);
    int shown = 0;
    for (int t = 0; t < w->nthreads && shown < 12; ++t) {
        Fiber& f = w->fibers[t];
        if (f.state == DONE) continue;
        // Collapse runs of threads waiting at the same place into one line.
        int t_end = t;
        while (t_end + 1 < w->nthreads && w->fibers[t_end + 1].state == f.state &&
               w->fibers[t_end + 1].wait_line == f.wait_line)
            ++t_end;
        std::snprintf(line, sizeof line, "  threads %d-%d wait at %s (line %d)\n", t, t_end, f.wait_what,
                      f.wait_line);
        append_message(&w->counters, line);
        ++shown;
        t = t_end;
    }
}

inline void run_block(Worker* w, const LaunchConfig* cfg, dim3 bidx) {
    w->block_idx = bidx;
    w->epoch = ++tls_epoch;
    if (cfg->poison && !w->dyn_shared.empty()) std::memset(w->dyn_shared.data(), 0xFF, w->dyn_shared.size());
    int n = w->nthreads;
    for (int t = 0; t < n; ++t) {
        Fiber& f = w->fibers[t];
        f.linear = t;
        f.tid = dim3(t % cfg->block[0], (t / cfg->block[0]) % cfg->block[1], t / (cfg->block[0] * cfg->block[1]));
        f.warp = t / 32;
        f.lane = t % 32;
        f.state = READY;
        f.wait_line = 0;
        init_fiber_stack(&f);
    }
    w->order.resize(n);
    for (int t = 0; t < n; ++t) w->order[t] = cfg->order == 1 ? n - 1 - t : t;
    int finished = 0;
    while (true) {
        if (cfg->order == 2) std::shuffle(w->order.begin(), w->order.end(), w->rng);
        for (int i = 0; i < n; ++i) {
            Fiber& f = w->fibers[w->order[i]];
            if (f.state == READY) switch_to_fiber(w, &f);
        }
        finished = 0;
        for (int t = 0; t < n; ++t) finished += w->fibers[t].state == DONE;
        if (finished == n) break;
        if (release_warps(w)) continue;
        if (release_block_barrier(w)) continue;
        report_deadlock(w);
        w->counters.deadlock = 1;
        w->abandoned = true;
        return;
    }
}

// Signal handling: a kernel that faults (out-of-bounds access, fiber stack overflow) says where.
inline thread_local Worker* tls_fault_worker = nullptr;
inline void fault_handler(int sig) {
    Worker* w = tls_fault_worker;
    char msg[512];
    if (w && w->cur) {
        int n = std::snprintf(msg, sizeof msg,
                              "\nllmcupy sim: kernel %s crashed with %s in block (%u,%u,%u), thread (%u,%u,%u): "
                              "an out-of-bounds memory access or a fiber stack overflow "
                              "(LLMCUPY_SIM_STACK_KB raises the 64 KiB default)\n",
                              w->kernel_name, sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : "a signal",
                              w->block_idx.x, w->block_idx.y, w->block_idx.z, w->cur->tid.x, w->cur->tid.y,
                              w->cur->tid.z);
        if (n > 0) { ssize_t ignored = write(2, msg, size_t(n)); (void)ignored; }
    }
    signal(sig, SIG_DFL);
    raise(sig);
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

inline void worker_loop(const LaunchConfig* cfg, std::atomic<unsigned long long>* next, unsigned long long nblocks,
                        std::atomic<int>* abort_flag, void (*thunk)(void*), void* closure, const char* name,
                        LaunchResult* total, std::atomic<int>* lock, int worker_index) {
    static thread_local Worker worker;
    static thread_local AltStack altstack;
    (void)altstack;
    Worker* w = &worker;
    tls_worker = w;
    tls_fault_worker = w;
    tls_poison = cfg->poison;
    w->nthreads = int(cfg->block[0] * cfg->block[1] * cfg->block[2]);
    ensure_fibers(w, w->nthreads);
    w->dyn_shared.assign(cfg->shared_mem, 0);
    w->thunk = thunk;
    w->closure = closure;
    w->counters = LaunchResult{};
    w->abandoned = false;
    w->kernel_name = name;
    w->rng.seed(cfg->seed * 0x9E3779B97F4A7C15ull + unsigned(worker_index));
    while (!abort_flag->load()) {
        unsigned long long b = next->fetch_add(1);
        if (b >= nblocks) break;
        dim3 bidx(unsigned(b % cfg->grid[0]), unsigned((b / cfg->grid[0]) % cfg->grid[1]),
                  unsigned(b / (unsigned long long)(cfg->grid[0] * cfg->grid[1])));
        run_block(w, cfg, bidx);
        if (w->abandoned) { abort_flag->store(1); break; }
    }
    while (lock->exchange(1)) {}
    total->divergent_barriers += w->counters.divergent_barriers;
    total->barrier_after_exit += w->counters.barrier_after_exit;
    total->exited_lane_reads += w->counters.exited_lane_reads;
    if (w->counters.deadlock && !total->deadlock) {
        total->deadlock = 1;
        std::memcpy(total->message, w->counters.message, sizeof total->message);
    }
    lock->store(0);
    w->cur = nullptr;
}

// OS threads that run blocks, kept for the life of the process: a Worker and its fiber stacks
// belong to one OS thread, so creating threads per launch would map new stacks every launch.
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
    // Runs job(0) on the calling thread and job(1..n-1) on pool threads; returns when all finish.
    void run(int n, const std::function<void(int)>& job) {
        std::unique_lock<std::mutex> lk(mutex_);
        while (int(threads_) < n - 1) {
            int index = int(threads_++) + 1;
            std::thread([this, index] { loop(index); }).detach();
        }
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
    }

  private:
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
};

inline int run_grid(const LaunchConfig* cfg, void (*thunk)(void*), void* closure, const char* name,
                    LaunchResult* res) {
    // One launch at a time per library (the grid and block dimensions are process-wide), as on a
    // single CUDA stream.
    static std::mutex launch_mutex;
    std::lock_guard<std::mutex> guard(launch_mutex);
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
    struct sigaction sa{}, old_segv{}, old_bus{};
    sa.sa_handler = fault_handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    std::atomic<unsigned long long> next{0};
    std::atomic<int> abort_flag{0}, lock{0};
    int workers = std::max(1, cfg->workers);
    if ((unsigned long long)workers > nblocks) workers = int(nblocks);
    WorkerPool::instance().run(workers, [&](int i) {
        worker_loop(cfg, &next, nblocks, &abort_flag, thunk, closure, name, res, &lock, i);
    });
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    return res->deadlock ? 2 : 0;
}

// Unpacks the argument array (one pointer to each argument's bytes, as cuLaunchKernel takes
// them) into the kernel's own parameter types and runs the grid.
template <typename... A, size_t... I>
inline std::tuple<std::decay_t<A>...> unpack_args(void** args, std::index_sequence<I...>) {
    return std::tuple<std::decay_t<A>...>(*static_cast<std::decay_t<A>*>(args[I])...);
}

template <typename... A>
inline int launch(void (*kernel)(A...), const char* name, const LaunchConfig* cfg, void** args, LaunchResult* res) {
    struct Closure {
        void (*kernel)(A...);
        std::tuple<std::decay_t<A>...> args;
    } closure{kernel, unpack_args<A...>(args, std::index_sequence_for<A...>{})};
    auto thunk = [](void* p) {
        auto* c = static_cast<Closure*>(p);
        auto copy = c->args;  // every CUDA thread gets its own copy of the parameters
        std::apply(c->kernel, copy);
    };
    return run_grid(cfg, thunk, &closure, name, res);
}

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
LLMCUPY_SIM_TYPE_NAME(int4) LLMCUPY_SIM_TYPE_NAME(double2)
#undef LLMCUPY_SIM_TYPE_NAME

template <typename T>
inline std::string param_spelling() {
    if constexpr (std::is_pointer_v<T>) {
        using P = std::remove_pointer_t<T>;
        const char* base = type_name<std::remove_cv_t<P>>::get();
        std::string s = base ? base : "?";
        return (std::is_const_v<P> ? "const " : "") + s + "*";
    } else {
        const char* base = type_name<std::remove_cv_t<T>>::get();
        return base ? base : "?";
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
