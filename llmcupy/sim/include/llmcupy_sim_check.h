// llmcupy_sim_check.h -- racecheck, memcheck and initcheck on the emulator's access hooks.
//
// Included by llmcupy_sim.h in instrumented builds only (LLMCUPY_SIM_ACCESS_HOOKS); registers one
// AccessObserver. What it checks, per launch (LaunchConfig::check bits):
//   race (1):   two accesses to the same byte by different threads of a block between the same two
//               barriers, at least one a write, not both atomic -> RAW / WAR / WAW. Lanes of one warp
//               are ordered by a __syncwarp or warp collective that both took part in; without one
//               the hazard is reported as warp-synchronous. Shared memory, and global memory within
//               a block.
//               Between blocks (global memory, "Racecheck between blocks" below): two accesses to the
//               same bytes of a launch's buffer by different blocks, at least one a write, not both
//               atomic, with no release/acquire chain between them -> RAW / WAR / WAW naming both
//               blocks. Blocks of a launch are ordered only through atomics and volatile accesses: a
//               block's accesses before a __threadfence() and a later atomic (or volatile store) are
//               seen by a block whose atomic (or volatile load) on the same address comes after that
//               one (llm.c's last-block reductions; a flag handing data over). In a cooperative
//               launch grid.sync() orders every block's accesses before it before every access after.
//               A plain read that conflicts only with an atomic write (the Programming Guide's CAS
//               loop: `old = *p; do { assumed = old; old = atomicCAS(p, assumed, f(assumed)); } while
//               (assumed != old);`) is reported only if the same thread does not pass the value it read
//               as `compare` to its own atomicCAS on that address before its next barrier: the CAS
//               checks the value, so a stale read costs a retry, not a wrong answer ("Validated reads").
//   memory (2): an access outside every root allocation passed to the launch, the shared arrays
//               (their registered extents; dynamic: the launch's shared_mem), the thread's own fiber
//               stack, the library's own image (__device__ / __constant__ variables) and the blocks
//               kernels allocated ("The device heap") -> the launch stops before the access happens.
//   init (4):   a shared-memory read of a byte no thread of the block wrote in this launch.
// Detection is by shadow state per byte (epoch of the last barrier, last writer, two readers), not
// by watching interleavings: the emulator runs each thread from one sync point to the next, so a
// race is reported in every thread order.
#pragma once

#include <dlfcn.h>
#include <link.h>
#include <map>
#include <unordered_map>

namespace llmcupy_sim {
namespace check {

// Shadow of one byte. Epochs are (block serial << 24) + barriers released so far in the block, so
// cells of an earlier block or barrier interval are stale without being cleared.
struct Cell {
    unsigned long long w_epoch = 0;   // 0: never written
    const void* w_pc = nullptr;
    unsigned w_gen = 0;               // the writer's warp-sync generation at the write
    unsigned short w_tid = 0;
    unsigned char w_atomic = 0;
    unsigned char nreaders = 0;
    unsigned long long r_epoch = 0;   // readers belong to this interval
    const void* r_pc[2] = {nullptr, nullptr};
    unsigned r_gen[2] = {0, 0};
    unsigned short r_tid[2] = {0, 0};
    unsigned char r_atomic[2] = {0, 0};
};

struct Region {                       // one shared array's storage on this worker
    const unsigned char* lo = nullptr;   // data (not the guard bytes)
    size_t bytes = 0;
    std::vector<Cell> shadow;
};

struct Event { unsigned id; unsigned mask; };
constexpr unsigned kHistory = 64;     // warp-sync events remembered per warp

struct GlobalSlot { uintptr_t addr; unsigned long long serial; Cell cell; };
constexpr size_t kGlobalSlots = size_t(1) << 18;   // per worker; a block touching more loses coverage

// A plain read that found a conflict with an atomic write only: its report, held until the reading
// thread validates the read with an atomicCAS (dropped) or reaches a barrier or its end (reported).
struct Suspect {
    uintptr_t addr;
    unsigned size;
    unsigned long long value;   // what the read returned (the bytes there when its hook ran)
    bool exact;                 // shared memory: value is what the load returned (no other block writes
                                // there); global memory may change between the hook and the load
    const char* kind;
    int space, warp;
    const void* pc;
    const void* prev_pc;
    unsigned tid, prev_tid;
    unsigned prev_block[3];
    char where[240];
};

struct BlockState {
    unsigned long long serial = 0, epoch = 0, launch = 0;
    std::vector<unsigned> gen;           // per thread: id of the last warp-sync event it took part in
    std::vector<unsigned> warp_events;   // per warp: events so far
    std::vector<Event> history;          // per warp: kHistory slots
    std::vector<Region> regions;
    std::vector<GlobalSlot> global;
    size_t global_used = 0;
    // racecheck between blocks (see there)
    unsigned linear = 0;                 // this block's linear index + 1 (0: no block)
    unsigned clock = 1;                  // advances when the block publishes (a fence, then an atomic)
    bool fenced = false;                 // a device fence since the last publication
    std::vector<std::pair<unsigned, unsigned>> seen;   // vector clock: (block + 1, clock) acquired, sorted
    uintptr_t pending_acquire = 0;       // a volatile load's address, acquired at the block's next access
    std::vector<Suspect> suspects;   // plain reads racing only with atomics, until a CAS validates them
    // value: what the read returned (the bytes there when its hook ran), which its CAS must compare
    struct LastRead { uintptr_t addr; const void* pc; unsigned clock; unsigned size; unsigned long long value; };
    std::vector<LastRead> last_read;    // per thread: its last plain read of a launch buffer
};
// A pointer, not an object: a thread_local with a constructor is initialised by a compiler-made
// function that is itself instrumented, and would call the hooks from inside the hooks.
inline thread_local BlockState* tls_block = nullptr;
inline thread_local unsigned long long tls_serial = 0;

// Reports, launch-wide (blocks run on several workers).
struct Report {
    char kind[8];          // RAW WAR WAW OOB UNINIT
    int space;             // 0 shared, 1 global, 2 unknown (memcheck)
    int warp;              // a warp-synchronous hazard (lanes of one warp, no __syncwarp between)
    const void* pc;        // the access that found it
    const void* prev_pc;   // the earlier access it conflicts with (races)
    unsigned block[3];
    unsigned prev_block[3];   // the block of the earlier access (races between blocks; else = block)
    unsigned tid, prev_tid;   // linear thread ids in their blocks
    unsigned long long addr;
    unsigned size;
    int write;
    unsigned long long count;
    char where[240];
};
constexpr size_t kMaxReports = 256;
inline std::mutex g_report_mutex;
inline std::vector<Report> g_reports;
inline unsigned long long g_dropped = 0;
inline unsigned long long g_launch = 0;
inline const LaunchConfig* g_cfg = nullptr;
inline uintptr_t g_image_lo[16], g_image_hi[16];
inline int g_nimage = -1;

__attribute__((no_sanitize_thread)) inline void find_image() {
    // The PT_LOAD segments of this library: __device__ / __constant__ variables and read-only tables.
    g_nimage = 0;
    Dl_info info;
    if (!dladdr(reinterpret_cast<void*>(&find_image), &info)) return;
    struct Ctx { const void* base; } ctx{info.dli_fbase};
    dl_iterate_phdr([](dl_phdr_info* pi, size_t, void* p) -> int {
        auto* c = static_cast<Ctx*>(p);
        bool ours = false;
        for (int i = 0; i < pi->dlpi_phnum; ++i)
            if (pi->dlpi_phdr[i].p_type == PT_LOAD && pi->dlpi_phdr[i].p_offset == 0 &&
                reinterpret_cast<const void*>(pi->dlpi_addr + pi->dlpi_phdr[i].p_vaddr) == c->base)
                ours = true;
        if (!ours) return 0;
        for (int i = 0; i < pi->dlpi_phnum && g_nimage < 16; ++i) {
            if (pi->dlpi_phdr[i].p_type != PT_LOAD) continue;
            g_image_lo[g_nimage] = pi->dlpi_addr + pi->dlpi_phdr[i].p_vaddr;
            g_image_hi[g_nimage] = g_image_lo[g_nimage] + pi->dlpi_phdr[i].p_memsz;
            ++g_nimage;
        }
        return 1;
    }, &ctx);
}

__attribute__((no_sanitize_thread)) inline void fill_report(Report& r, Worker* w, const char* kind, int space, int warp,
                                                            const void* pc, const void* prev_pc, unsigned tid,
                                                            unsigned prev_tid, const void* addr, unsigned size,
                                                            int write, const char* where, const unsigned* prev_block) {
    r = Report{};
    std::snprintf(r.kind, sizeof r.kind, "%s", kind);
    r.space = space;
    r.warp = warp;
    r.pc = pc;
    r.prev_pc = prev_pc;
    r.block[0] = w->block_idx.x, r.block[1] = w->block_idx.y, r.block[2] = w->block_idx.z;
    for (int k = 0; k < 3; ++k) r.prev_block[k] = prev_block ? prev_block[k] : r.block[k];
    r.tid = tid;
    r.prev_tid = prev_tid;
    r.addr = (unsigned long long)(uintptr_t)addr;
    r.size = size;
    r.write = write;
    r.count = 1;
    std::snprintf(r.where, sizeof r.where, "%s", where);
}

__attribute__((no_sanitize_thread)) inline void keep_report(const Report& r) {
    std::lock_guard<std::mutex> lk(g_report_mutex);
    for (auto& k : g_reports)
        if (k.pc == r.pc && k.prev_pc == r.prev_pc && std::strcmp(k.kind, r.kind) == 0) { ++k.count; return; }
    // memcheck's report is always kept: it explains why the launch stopped
    if (g_reports.size() >= kMaxReports && std::strcmp(r.kind, "OOB") != 0) { ++g_dropped; return; }
    g_reports.push_back(r);
}

__attribute__((no_sanitize_thread)) inline void add_report(Worker* w, const char* kind, int space, int warp,
                                                           const void* pc, const void* prev_pc, unsigned tid,
                                                           unsigned prev_tid, const void* addr, unsigned size,
                                                           int write, const char* where,
                                                           const unsigned* prev_block = nullptr) {
    Report r;
    fill_report(r, w, kind, space, warp, pc, prev_pc, tid, prev_tid, addr, size, write, where, prev_block);
    keep_report(r);
}

// ---------------------------------------------------------------------------------------------
// Validated reads
//
// The Programming Guide's atomicAdd(double) (and float atomicMax through atomicCAS) starts its loop
// with a plain read of the address other threads update with atomicCAS. The read is unordered with
// those writes, but its value is only a guess the CAS checks: a stale one makes the CAS fail and
// return the current value. So a plain read whose only conflict is an atomic write is held back
// (a Suspect) until the same thread passes the value it read as `compare` to an atomicCAS of the
// same size on the same address (dropped), or reaches a barrier or its end first (reported). A read
// whose value is used otherwise (printed, stored, compared before an atomicAdd) keeps its report.
// Within a block the read is always the later of the two accesses (a thread runs from its read to
// its CAS without yielding). Between blocks another block's CAS may land in between: its WAR against
// the plain read is kept aside (g_deferred) and reported at the launch's end unless the reading
// thread validated that read. On global memory, which other blocks change while the hooks run, the
// value read is not known exactly: there the CAS's compare must be the value the read's hook saw or the
// value its own hook sees (checks_value).
// ---------------------------------------------------------------------------------------------
__attribute__((no_sanitize_thread)) inline bool hold_suspect(Worker* w, BlockState& bs, const Access& a,
                                                             const char* kind, int space, int warp,
                                                             const void* prev_pc, unsigned tid, unsigned prev_tid,
                                                             const unsigned* prev_block, const char* where) {
    if (a.size > 8) return false;
    uintptr_t addr = uintptr_t(a.addr);
    for (const Suspect& s : bs.suspects)
        if (s.tid == tid && s.addr == addr && s.pc == a.pc) return true;   // the same read, another byte
    Suspect s{};
    s.addr = addr, s.size = a.size, s.kind = kind, s.space = space, s.warp = warp;
    std::memcpy(&s.value, a.addr, a.size);   // the hook runs just before the load: the value it returns
    s.exact = space == 0;
    s.pc = a.pc, s.prev_pc = prev_pc, s.tid = tid, s.prev_tid = prev_tid;
    s.prev_block[0] = w->block_idx.x, s.prev_block[1] = w->block_idx.y, s.prev_block[2] = w->block_idx.z;
    if (prev_block) std::memcpy(s.prev_block, prev_block, sizeof s.prev_block);
    std::snprintf(s.where, sizeof s.where, "%s", where);
    bs.suspects.push_back(s);
    return true;
}

// Does a CAS with `compare` check the value a plain read returned? `value`: the bytes at the address when
// the read's hook ran, just before the load; `current`: those when the CAS's hook runs. Where no other
// block writes (shared memory) the load returned `value`. On global memory another block's write may land
// between a read's hook and its load, so the load may have returned a value the hook did not see; the
// CAS loop then compares that value, which is the current one if no further write came (a CAS that
// fails retries with the value it found, which is current again). A CAS of another value (a constant, a
// value read elsewhere) checks nothing and validates nothing.
__attribute__((no_sanitize_thread)) inline bool checks_value(bool exact, unsigned long long value,
                                                             unsigned long long current, unsigned long long compare) {
    return compare == value || (!exact && compare == current);
}

__attribute__((no_sanitize_thread)) inline void validate(BlockState& bs, unsigned tid, uintptr_t addr, unsigned size,
                                                         unsigned long long compare, unsigned long long current) {
    auto& v = bs.suspects;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const Suspect& s) {
        return s.tid == tid && s.addr == addr && s.size == size && checks_value(s.exact, s.value, current, compare);
    }), v.end());
}

__attribute__((no_sanitize_thread)) inline void report_suspects(Worker* w, BlockState& bs) {
    for (const Suspect& s : bs.suspects)
        add_report(w, s.kind, s.space, s.warp, s.pc, s.prev_pc, s.tid, s.prev_tid, reinterpret_cast<void*>(s.addr),
                   s.size, 0, s.where, s.prev_block);
    bs.suspects.clear();
}

// Did a warp-sync event that both lanes took part in come after a's access (made at generation
// a_gen) and before b's current position?
__attribute__((no_sanitize_thread)) inline bool ordered(const BlockState& bs, unsigned a, unsigned a_gen, unsigned b) {
    if (a / 32 != b / 32) return false;
    unsigned warp = a / 32, cur = bs.gen[b];
    if (cur <= a_gen) return false;
    if (bs.warp_events[warp] - a_gen > kHistory) return true;  // too old to tell: assume synchronised
    unsigned both = (1u << (a % 32)) | (1u << (b % 32));
    for (unsigned id = a_gen + 1; id <= cur; ++id) {
        const Event& e = bs.history[warp * kHistory + id % kHistory];
        if (e.id == id && (e.mask & both) == both) return true;
    }
    return false;
}

// The race rules on one byte's shadow. Returns the conflicting thread (or -1) and its pc/kind.
struct Conflict { int tid = -1; const void* pc = nullptr; const char* kind = ""; bool atomic = false; };

__attribute__((no_sanitize_thread)) inline Conflict race_step(BlockState& bs, Cell& c, unsigned t, const void* pc,
                                                              bool write, bool atomic) {
    Conflict out;
    unsigned gen = bs.gen[t];
    unsigned long long e = bs.epoch;
    if (c.w_epoch == e && c.w_tid != t && !(atomic && c.w_atomic) && !ordered(bs, c.w_tid, c.w_gen, t)) {
        out.tid = c.w_tid, out.pc = c.w_pc, out.kind = write ? "WAW" : "RAW", out.atomic = c.w_atomic;
    }
    if (c.r_epoch != e) c.nreaders = 0, c.r_epoch = e;
    if (write) {
        if (out.tid < 0)
            for (int k = 0; k < c.nreaders; ++k)
                if (c.r_tid[k] != t && !(atomic && c.r_atomic[k]) && !ordered(bs, c.r_tid[k], c.r_gen[k], t)) {
                    out.tid = c.r_tid[k], out.pc = c.r_pc[k], out.kind = "WAR";
                    break;
                }
        // A thread's own plain write stays the record when it follows with an atomic on the same bytes
        // (`if (tid == 0) s = 0; atomicAdd(&s, 1);` with no barrier): the other threads' atomics race
        // with that write, and an atomic record would hide it from them (two atomics never conflict).
        bool keep_own_plain = atomic && c.w_epoch == e && !c.w_atomic && c.w_tid == t;
        if (!keep_own_plain)
            c.w_epoch = e, c.w_pc = pc, c.w_gen = gen, c.w_tid = (unsigned short)t, c.w_atomic = atomic;
    }
    if (!write || atomic) {  // an atomic read-modify-write is also a read
        int k = 0;
        while (k < c.nreaders && c.r_tid[k] != t) ++k;
        if (k == c.nreaders) {
            if (c.nreaders < 2) ++c.nreaders;
            else k = 1;  // two distinct readers are enough to find any later writer's conflict
        }
        c.r_tid[k] = (unsigned short)t, c.r_pc[k] = pc, c.r_gen[k] = gen, c.r_atomic[k] = atomic;
    }
    return out;
}

// The memory an access hit, for a report: a shared array (area) or argument `arg` (global). Built
// only when something is reported: a snprintf per access would dominate the checker's cost.
__attribute__((no_sanitize_thread)) inline void describe_memory(char* where, size_t n, const SharedArea* area, int arg) {
    if (area) describe_area(where, n, *area);
    else std::snprintf(where, n, "argument %d", arg);
}

__attribute__((no_sanitize_thread)) inline void check_cells(Worker* w, Fiber* f, Cell* cells, size_t n,
                                                            const Access& a, int space, const SharedArea* area,
                                                            int arg) {
    char where[240];
    BlockState& bs = *tls_block;
    unsigned t = unsigned(f->linear);
    bool write = a.flags & ACCESS_WRITE, atomic = a.flags & ACCESS_ATOMIC;
    bool race = g_check & CHECK_RACE, init = (g_check & CHECK_INIT) && space == 0 && (!write || atomic);
    bool race_seen = false, init_seen = false;
    for (size_t i = 0; i < n; ++i) {
        Cell& c = cells[i];
        if (init && !init_seen && (c.w_epoch >> 24) != bs.serial) {
            init_seen = true;
            describe_memory(where, sizeof where, area, arg);
            add_report(w, "UNINIT", space, 0, a.pc, nullptr, t, t, a.addr, a.size, write, where);
        }
        if (race) {
            Conflict k = race_step(bs, c, t, a.pc, write, atomic);
            if (k.tid >= 0 && !race_seen) {
                race_seen = true;
                describe_memory(where, sizeof where, area, arg);
                int warp = unsigned(k.tid) / 32 == t / 32;
                if (!write && !atomic && k.atomic &&
                    hold_suspect(w, bs, a, k.kind, space, warp, k.pc, t, unsigned(k.tid), nullptr, where))
                    continue;
                add_report(w, k.kind, space, warp, a.pc, k.pc, t, unsigned(k.tid), a.addr, a.size, write, where);
            }
        } else if (write) {
            c.w_epoch = bs.epoch, c.w_tid = (unsigned short)t;
        }
    }
}

__attribute__((no_sanitize_thread)) inline Cell* global_cell(BlockState& bs, uintptr_t addr) {
    size_t mask = bs.global.size() - 1;
    size_t h = (addr * 0x9E3779B97F4A7C15ull) >> 20;
    for (size_t probe = 0; probe < 32; ++probe) {
        GlobalSlot& s = bs.global[(h + probe) & mask];
        if (s.serial != bs.serial) {
            if (bs.global_used * 2 > bs.global.size()) return nullptr;  // full for this block
            s.serial = bs.serial, s.addr = addr, s.cell = Cell{};
            ++bs.global_used;
            return &s.cell;
        }
        if (s.addr == addr) return &s.cell;
    }
    return nullptr;
}

__attribute__((no_sanitize_thread)) inline Region& region_for(BlockState& bs, const unsigned char* lo, size_t bytes) {
    for (auto& r : bs.regions)
        if (r.lo == lo && r.bytes == bytes) return r;
    bs.regions.push_back(Region{lo, bytes, std::vector<Cell>(bytes)});
    return bs.regions.back();
}

// The nearest known memory to a bad address, as "N bytes past the end of argument 2 (...)".
// ---------------------------------------------------------------------------------------------
// The device heap
//
// CUDA gives kernels a heap: malloc/free and new/delete in device code. The instrumented library is
// linked with those functions wrapped (-Wl,--wrap, sim/compiler.py; Linux), so a block a kernel thread
// allocates is recorded, kept across launches until freed (as a GPU's heap is), and memcheck takes it
// as memory of the launch. The emulator's own allocations are not recorded: its observers run quiet
// and its scheduler off the fibers.
// ---------------------------------------------------------------------------------------------
inline std::mutex g_heap_mutex;
inline std::map<uintptr_t, size_t> g_heap;   // start -> bytes, of the blocks kernels hold
inline std::atomic<size_t> g_heap_blocks{0};

__attribute__((no_sanitize_thread)) inline bool kernel_is_running() {
    Worker* w = tls_worker;
    return w != nullptr && w->in_fiber && !tls_quiet;
}

// quiet while the map allocates or frees its nodes: those go through the same wrappers
__attribute__((no_sanitize_thread)) inline void heap_record(void* p, size_t n) {
    if (p == nullptr) return;
    ++tls_quiet;
    {
        std::lock_guard<std::mutex> lk(g_heap_mutex);
        g_heap[uintptr_t(p)] = n ? n : 1;
        g_heap_blocks.store(g_heap.size(), std::memory_order_relaxed);
    }
    --tls_quiet;
}

__attribute__((no_sanitize_thread)) inline void heap_forget(void* p) {
    if (p == nullptr || tls_quiet || g_heap_blocks.load(std::memory_order_relaxed) == 0) return;
    ++tls_quiet;
    {
        std::lock_guard<std::mutex> lk(g_heap_mutex);
        g_heap.erase(uintptr_t(p));
        g_heap_blocks.store(g_heap.size(), std::memory_order_relaxed);
    }
    --tls_quiet;
}

// The block that holds [a, end), or the nearest ones below and above a (lo == hi: none).
struct HeapBlock { uintptr_t lo, hi; };
__attribute__((no_sanitize_thread)) inline bool heap_block(uintptr_t a, uintptr_t end, HeapBlock* below = nullptr,
                                                           HeapBlock* above = nullptr) {
    if (g_heap_blocks.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard<std::mutex> lk(g_heap_mutex);
    auto it = g_heap.upper_bound(a);
    if (above && it != g_heap.end()) *above = HeapBlock{it->first, it->first + it->second};
    if (it == g_heap.begin()) return false;
    --it;
    if (below) *below = HeapBlock{it->first, it->first + it->second};
    return end <= it->first + it->second;
}

__attribute__((no_sanitize_thread)) inline void nearest(Worker* w, uintptr_t a, unsigned size, char* out, size_t n) {
    unsigned long long best = ~0ull;
    std::snprintf(out, n, "no buffer of the launch");
    char what[200], text[300];
    auto consider = [&](uintptr_t lo, uintptr_t hi) {
        unsigned long long d = place_relative(a, size, lo, hi, what, text, sizeof text);
        if (d < best) best = d, std::snprintf(out, n, "%s", text);
    };
    const LaunchConfig* cfg = w->cfg;
    for (unsigned i = 0; cfg && i < cfg->nbuffers; ++i) {
        uintptr_t lo = uintptr_t(cfg->buffers[2 * i]), hi = uintptr_t(cfg->buffers[2 * i + 1]);
        if (lo == hi) continue;
        std::snprintf(what, sizeof what, "argument %u (a %llu-byte allocation at %#llx)", i,
                      (unsigned long long)(hi - lo), (unsigned long long)lo);
        consider(lo, hi);
    }
    SharedArea areas[64];
    int na = shared_areas(w, areas, 64);
    for (int i = 0; i < na; ++i) {
        describe_area(what, sizeof what, areas[i]);
        consider(uintptr_t(areas[i].lo), uintptr_t(areas[i].hi));
    }
    HeapBlock near[2] = {{0, 0}, {0, 0}};
    heap_block(a, a + size, &near[0], &near[1]);
    for (const HeapBlock& b : near) {
        if (b.lo == b.hi) continue;
        std::snprintf(what, sizeof what, "a %llu-byte block from the kernel's malloc or new at %#llx",
                      (unsigned long long)(b.hi - b.lo), (unsigned long long)b.lo);
        consider(b.lo, b.hi);
    }
}

// ---------------------------------------------------------------------------------------------
// Racecheck between blocks
//
// The blocks of a launch run concurrently on the emulator's workers, in no fixed order, and a GPU
// orders them only through global memory. A block publishes its accesses so far with a device fence
// followed by an atomic (a release); a block whose atomic on the same address comes later has seen
// them (an acquire). An atomic acquires without a fence of its own: llm.c's last-block reductions
// read the other blocks' partials right after their atomicAdd on the counter (as CUDA's
// threadFenceReduction sample does), which GPUs honour, so the checker does not report it. The
// fence is tracked per block, not per thread: the pattern fences in every thread, then
// __syncthreads, then one thread's atomic. Volatile accesses are strong too: a fence then a volatile
// store publishes, and a volatile load acquires (a flag handing data from block to block).
//
// Vector clocks, with FastTrack's epochs: every block counts its publications (`clock`); an access
// is stamped with its block and that block's clock; `seen` holds, per other block, the latest clock
// this block has acquired; a sync address keeps the join of everything published through it. An
// earlier access by block A at clock c is ordered before this block's access iff seen[A] >= c.
//
// The shadow is per 4-byte granule of each buffer of the launch (a byte mask says which bytes an
// access touched), allocated a page at a time as the launch touches memory, up to kShadowBudget
// bytes per launch (pages past it go unchecked). Per granule: the last write (and one other block's
// atomic write beside an atomic one), and up to two reads by distinct blocks since it (a third
// block's read takes the second slot), so a race with a displaced access can be missed, never
// invented.
// ---------------------------------------------------------------------------------------------
namespace between {

using Clock = std::vector<std::pair<unsigned, unsigned>>;   // (block + 1, clock), sorted by block

// Validated reads between blocks (see "Validated reads"): a WAR of an atomic write against another
// block's plain read waits until the reading block ends, and is dropped if the reading thread validated
// that read by then (a later CAS cannot: the block is gone). Both are kept per reading block while it
// runs, each WAR as the few fields its report is rebuilt from, so the memory held is that of the blocks
// running, not of the grid: a CAS loop over a 1024 x 256 grid used to keep a whole report per deferred
// WAR until the launch's end (about 50 MB); llmcupy_sim_check_deferred_peak_bytes() says how much.
struct ReadKey {
    unsigned block, tid;   // block: linear index + 1
    const void* pc;
    unsigned clock;        // the reading block's clock at the read
    bool operator<(const ReadKey& o) const {
        return std::tie(block, tid, pc, clock) < std::tie(o.block, o.tid, o.pc, o.clock);
    }
};
struct Deferred {
    ReadKey read;          // the plain read
    const void* pc;        // the atomic write, by thread `tid` of block `block` (linear index + 1)
    uintptr_t addr;
    unsigned block, tid, size;
    int arg;
};
struct PendingReads { std::vector<ReadKey> validated; std::vector<Deferred> deferred; };
inline std::mutex g_validated_mutex;
inline std::unordered_map<unsigned, PendingReads> g_pending;   // by reading block (linear index + 1)
inline std::vector<bool> g_settled;      // by linear index: the block ended and its reads were settled
inline size_t g_pending_bytes = 0, g_pending_peak = 0;

__attribute__((no_sanitize_thread)) inline void count_pending(long long bytes) {
    g_pending_bytes += size_t(bytes);
    if (g_pending_bytes > g_pending_peak) g_pending_peak = g_pending_bytes;
}

__attribute__((no_sanitize_thread)) inline void report_war(const Deferred& d) {
    auto xyz = [](unsigned linear1, unsigned* out) {
        unsigned b = linear1 - 1;
        out[0] = b % g_grid_dim.x, out[1] = (b / g_grid_dim.x) % g_grid_dim.y, out[2] = b / (g_grid_dim.x * g_grid_dim.y);
    };
    Report r{};
    std::snprintf(r.kind, sizeof r.kind, "WAR");
    r.space = 1, r.warp = 0, r.pc = d.pc, r.prev_pc = d.read.pc;
    xyz(d.block, r.block);
    xyz(d.read.block, r.prev_block);
    r.tid = d.tid, r.prev_tid = d.read.tid, r.addr = d.addr, r.size = d.size, r.write = 1, r.count = 1;
    describe_memory(r.where, sizeof r.where, nullptr, d.arg);
    keep_report(r);
}

// With g_validated_mutex held: the block's deferred WARs that no validated read answers are reported.
__attribute__((no_sanitize_thread)) inline void settle_locked(std::unordered_map<unsigned, PendingReads>::iterator it) {
    std::vector<ReadKey>& validated = it->second.validated;
    // sorted, not searched in turn: a CAS loop validates a read per thread and may defer a WAR per thread
    std::sort(validated.begin(), validated.end());
    for (const Deferred& d : it->second.deferred)
        if (!std::binary_search(validated.begin(), validated.end(), d.read)) report_war(d);
    count_pending(-(long long)(validated.size() * sizeof(ReadKey) + it->second.deferred.size() * sizeof(Deferred)));
    g_pending.erase(it);
}

// The reading block has ended: its reads are validated or never will be.
__attribute__((no_sanitize_thread)) inline void settle_block(unsigned block) {
    std::lock_guard<std::mutex> lk(g_validated_mutex);
    auto it = g_pending.find(block);
    if (it != g_pending.end()) settle_locked(it);
    if (g_settled.size() < block) g_settled.resize(block);
    g_settled[block - 1] = true;
}

// Called with the cell's lock held (the read is still in the shadow), so a WAR found before the reading
// thread's CAS updated the cell is recorded before that block can end.
__attribute__((no_sanitize_thread)) inline void defer_war(const Deferred& d) {
    std::lock_guard<std::mutex> lk(g_validated_mutex);
    if (d.read.block - 1 < g_settled.size() && g_settled[d.read.block - 1]) {
        report_war(d);   // its block ended without validating it (a validating CAS clears the read)
        return;
    }
    g_pending[d.read.block].deferred.push_back(d);
    count_pending(sizeof(Deferred));
}

// A kernel's atomicCAS on a launch buffer: the thread's last plain read of that address is validated
// when the CAS checks its value (checks_value); a CAS of another value leaves it for the next one.
__attribute__((no_sanitize_thread)) inline bool validate_last_read(BlockState& bs, unsigned t, uintptr_t addr,
                                                                   unsigned size, unsigned long long compare,
                                                                   unsigned long long current) {
    if (t >= bs.last_read.size() || bs.last_read[t].addr != addr) return false;
    BlockState::LastRead& r = bs.last_read[t];
    if (r.size != size || !checks_value(false, r.value, current, compare)) return false;
    std::lock_guard<std::mutex> lk(g_validated_mutex);
    g_pending[bs.linear].validated.push_back(ReadKey{bs.linear, t, r.pc, r.clock});
    count_pending(sizeof(ReadKey));
    r.addr = 0;
    return true;
}

// The launch's end: the blocks that did not end (a stopped launch) are settled as they stand.
__attribute__((no_sanitize_thread)) inline void report_deferred() {
    std::lock_guard<std::mutex> lk(g_validated_mutex);
    while (!g_pending.empty()) settle_locked(g_pending.begin());
    g_settled.clear();
}

__attribute__((no_sanitize_thread)) inline unsigned clock_of(const Clock& vc, unsigned block) {
    auto it = std::lower_bound(vc.begin(), vc.end(), std::make_pair(block, 0u));
    return it != vc.end() && it->first == block ? it->second : 0u;
}

__attribute__((no_sanitize_thread)) inline void raise_to(Clock& vc, unsigned block, unsigned clock) {
    auto it = std::lower_bound(vc.begin(), vc.end(), std::make_pair(block, 0u));
    if (it != vc.end() && it->first == block) {
        if (it->second < clock) it->second = clock;
    } else {
        vc.insert(it, {block, clock});
    }
}

// A merge of the two sorted clocks, linear in their sizes: in a last-block reduction the counter's
// clock holds every block that counted itself in, and each later block acquires all of it.
__attribute__((no_sanitize_thread)) inline void join(Clock& into, const Clock& from) {
    if (from.empty()) return;
    Clock merged;
    merged.reserve(into.size() + from.size());
    size_t i = 0, j = 0;
    while (i < into.size() || j < from.size()) {
        if (j == from.size() || (i < into.size() && into[i].first < from[j].first)) merged.push_back(into[i++]);
        else if (i == into.size() || from[j].first < into[i].first) merged.push_back(from[j++]);
        else merged.push_back({into[i].first, std::max(into[i].second, from[j].second)}), ++i, ++j;
    }
    into.swap(merged);
}

// Two write slots: [0] the last write; [1], while [0] is an atomic, the latest atomic of another block
// beside it (atomics of several blocks on one address do not race with each other, but a later plain
// access must be checked against more than the latest of them: a block's own atomic in [0] would
// otherwise hide every other block's).
struct Cell {
    const void* w_pc[2];
    const void* r_pc[2];
    unsigned w_block[2], w_clock[2];        // block: linear index + 1 (0: none)
    unsigned r_block[2], r_clock[2];
    unsigned short w_tid[2], r_tid[2];
    unsigned char w_bits[2], r_bits[2];     // low 4 bits: the granule's bytes accessed; | kAtomic
};
constexpr unsigned char kAtomic = 0x10;   // by an atomic or a volatile access (PTX: relaxed, strong)
constexpr uintptr_t kGranule = 4;
constexpr size_t kPageBytes = 4096;                        // data bytes per shadow page
constexpr size_t kCellsPerPage = kPageBytes / kGranule;
constexpr size_t kShadowBudget = size_t(1) << 30;          // shadow bytes per launch
constexpr size_t kCellLocks = 4096, kSyncStripes = 64;

struct Buffer {
    uintptr_t lo, hi;
    Cell** pages;        // kPageBytes of data each, allocated on first touch
    size_t npages;
};
inline std::vector<Buffer> g_buffers;      // one per distinct root allocation of the launch
inline std::vector<int> g_buffer_of;       // argument index -> g_buffers index (-1: none)
inline size_t g_shadow_bytes = 0;
// Spin locks (critical sections of a few hundred instructions): reset at every launch, so that a
// thread the watchdog abandoned inside one cannot leave it held.
inline unsigned char g_cell_locks[kCellLocks];
inline unsigned char g_sync_locks[kSyncStripes];
inline std::vector<std::pair<uintptr_t, Clock>> g_published[kSyncStripes];   // per sync address

__attribute__((no_sanitize_thread)) inline void lock(unsigned char& l) {
    while (__atomic_exchange_n(&l, 1, __ATOMIC_ACQUIRE)) std::this_thread::yield();
}
__attribute__((no_sanitize_thread)) inline void unlock(unsigned char& l) { __atomic_store_n(&l, 0, __ATOMIC_RELEASE); }

__attribute__((no_sanitize_thread)) inline void release_shadow() {
    for (auto& b : g_buffers) {
        for (size_t i = 0; i < b.npages; ++i) std::free(b.pages[i]);
        delete[] b.pages;
    }
    g_buffers.clear();
    g_buffer_of.clear();
    g_shadow_bytes = 0;
    g_pending.clear();
    g_settled.clear();
    g_pending_bytes = 0;
    for (auto& p : g_published) p.clear();
    std::memset(g_cell_locks, 0, sizeof g_cell_locks);
    std::memset(g_sync_locks, 0, sizeof g_sync_locks);
}

__attribute__((no_sanitize_thread)) inline void begin_launch(const LaunchConfig* cfg) {
    release_shadow();
    g_pending_peak = 0;
    if (!(cfg->check & CHECK_RACE)) return;
    for (unsigned i = 0; i < cfg->nbuffers; ++i) {
        uintptr_t lo = uintptr_t(cfg->buffers[2 * i]), hi = uintptr_t(cfg->buffers[2 * i + 1]);
        int found = -1;
        if (hi > lo) {
            // arguments that are views of one allocation (an in-place op) share its shadow
            for (size_t k = 0; k < g_buffers.size(); ++k)
                if (g_buffers[k].lo == lo && g_buffers[k].hi == hi) found = int(k);
            if (found < 0) {
                size_t npages = (hi - lo + kPageBytes - 1) / kPageBytes;
                g_buffers.push_back(Buffer{lo, hi, new Cell*[npages](), npages});
                found = int(g_buffers.size()) - 1;
            }
        }
        g_buffer_of.push_back(found);
    }
}

__attribute__((no_sanitize_thread)) inline Cell* cell_at(const Buffer& b, uintptr_t granule) {
    size_t off = granule - b.lo, page = off / kPageBytes;
    Cell* cells = __atomic_load_n(&b.pages[page], __ATOMIC_ACQUIRE);
    if (cells == nullptr) {
        size_t bytes = kCellsPerPage * sizeof(Cell);
        if (__atomic_add_fetch(&g_shadow_bytes, bytes, __ATOMIC_RELAXED) > kShadowBudget) return nullptr;
        Cell* fresh = static_cast<Cell*>(std::calloc(kCellsPerPage, sizeof(Cell)));   // zero: no access yet
        if (fresh == nullptr) return nullptr;
        Cell* expected = nullptr;
        if (__atomic_compare_exchange_n(&b.pages[page], &expected, fresh, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            cells = fresh;
        } else {
            std::free(fresh);
            cells = expected;
        }
    }
    return cells + (off % kPageBytes) / kGranule;
}

__attribute__((no_sanitize_thread)) inline void block_xyz(unsigned linear1, unsigned* out) {
    unsigned b = linear1 - 1;
    out[0] = b % g_grid_dim.x;
    out[1] = (b / g_grid_dim.x) % g_grid_dim.y;
    out[2] = b / (g_grid_dim.x * g_grid_dim.y);
}

// One access of argument `arg` (a global buffer of the launch) against other blocks' accesses;
// `validating`: the access is the thread's atomicCAS that validated its last plain read.
__attribute__((no_sanitize_thread)) inline void check_access(Worker* w, Fiber* f, BlockState& bs, const Access& a,
                                                             int arg, bool validating) {
    if (arg < 0 || size_t(arg) >= g_buffer_of.size() || g_buffer_of[size_t(arg)] < 0) return;
    const Buffer& b = g_buffers[size_t(g_buffer_of[size_t(arg)])];
    uintptr_t p = uintptr_t(a.addr), end = p + a.size;
    bool write = a.flags & ACCESS_WRITE;
    unsigned char atomic = (a.flags & (ACCESS_ATOMIC | ACCESS_VOLATILE)) ? kAtomic : 0;   // strong: see AccessFlags
    unsigned me = bs.linear, t = unsigned(f->linear);
    for (uintptr_t g = b.lo + ((p - b.lo) & ~(kGranule - 1)); g < end; g += kGranule) {
        unsigned char mask = 0;
        for (uintptr_t k = 0; k < kGranule; ++k)
            if (g + k >= p && g + k < end) mask |= (unsigned char)(1u << k);
        Cell* c = cell_at(b, g);
        if (c == nullptr) return;
        // an earlier access by another block conflicts unless both are atomics or it was published
        // to this block
        auto unordered = [&](unsigned block, unsigned clock, unsigned char bits) {
            return block != 0 && block != me && (bits & mask & 0xF) && !(atomic && (bits & kAtomic)) &&
                   clock_of(bs.seen, block) < clock;
        };
        const char* kind = nullptr;
        const void* prev_pc = nullptr;
        unsigned prev_block = 0, prev_tid = 0;
        bool prev_atomic = false;
        unsigned prev_clock = 0;
        unsigned char& l = g_cell_locks[(g / kGranule) % kCellLocks];
        lock(l);
        for (int k = 0; k < 2 && kind == nullptr; ++k)
            if (unordered(c->w_block[k], c->w_clock[k], c->w_bits[k]))
                kind = write ? "WAW" : "RAW", prev_pc = c->w_pc[k], prev_block = c->w_block[k], prev_tid = c->w_tid[k],
                prev_atomic = c->w_bits[k] & kAtomic;
        // the thread's CAS that validated its plain read answers that read, whether the CAS wrote or
        // failed (a failed CAS is an atomic read, and the loop's next CAS no longer validates anything):
        // the read leaves the shadow, else another block's atomic after this block ends would find it there
        // and take it for a read never validated
        if (validating)
            for (int r = 0; r < 2; ++r)
                if (c->r_block[r] == me && c->r_tid[r] == t && !(c->r_bits[r] & kAtomic)) c->r_block[r] = 0;
        if (write) {
            for (int k = 0; k < 2 && kind == nullptr; ++k)
                if (unordered(c->r_block[k], c->r_clock[k], c->r_bits[k]))
                    kind = "WAR", prev_pc = c->r_pc[k], prev_block = c->r_block[k], prev_tid = c->r_tid[k],
                    prev_atomic = c->r_bits[k] & kAtomic, prev_clock = c->r_clock[k];
            // a plain write becomes the only write; an atomic beside another block's atomic in [0]
            // goes to [1] (the most recent such one is kept)
            // A block's own plain write stays the record when the block follows with an atomic on the same
            // bytes: other blocks' atomics race with that write (unless published to them), and an atomic
            // record would hide it from them, as two atomics never conflict.
            bool keep_own_plain = atomic && c->w_block[0] == me && !(c->w_bits[0] & kAtomic) &&
                                  (c->w_bits[0] & mask & 0xF) == (mask & 0xF);
            int k = 0;
            if (keep_own_plain) k = -1;
            else if (!atomic) c->w_block[1] = 0;
            else if (c->w_block[0] != 0 && c->w_block[0] != me && (c->w_bits[0] & kAtomic)) k = 1;
            else if (c->w_block[0] != 0 && c->w_block[0] != me) c->w_block[1] = 0;   // replaces a plain write
            if (k >= 0) {
                c->w_pc[k] = a.pc, c->w_block[k] = me, c->w_clock[k] = bs.clock, c->w_tid[k] = (unsigned short)t;
                c->w_bits[k] = (unsigned char)(mask | atomic);
            }
            // the reads it covers were checked against it, and a later access that conflicts with one
            // conflicts with it too; but an atomic stands for a plain read only when it is the reading
            // thread's CAS that validated it (above): another atomic would hide the read from other
            // blocks' atomics, and a settled block's reads left in the shadow are ones it never validated
            for (int r = 0; r < 2; ++r)
                if ((c->r_bits[r] & 0xF & ~mask) == 0 && (!atomic || (c->r_bits[r] & kAtomic)))
                    c->r_block[r] = 0;
        } else {
            if (!atomic) {
                unsigned long long value = 0;
                std::memcpy(&value, a.addr, a.size < 8 ? a.size : 8);
                bs.last_read[t] = BlockState::LastRead{p, a.pc, bs.clock, a.size, value};
            }
            int k = (c->r_block[0] == 0 || c->r_block[0] == me) ? 0 : 1;
            c->r_pc[k] = a.pc, c->r_block[k] = me, c->r_clock[k] = bs.clock, c->r_tid[k] = (unsigned short)t;
            c->r_bits[k] = (unsigned char)(mask | atomic);
        }
        // a WAR of an atomic against a plain read: the reader's CAS may yet validate the read
        bool deferred = kind != nullptr && std::strcmp(kind, "WAR") == 0 && !prev_atomic && (a.flags & ACCESS_ATOMIC);
        if (deferred) defer_war(Deferred{ReadKey{prev_block, prev_tid, prev_pc, prev_clock}, a.pc, p, me, t, a.size, arg});
        unlock(l);
        // the access's other granules still get their shadow update (a double spans two): returning here
        // left the reading thread's plain read in the next granule, where another block's atomic found
        // it after this block ended and took it for a read never validated
        if (deferred) continue;
        if (kind != nullptr) {
            char where[240];
            unsigned other[3];
            block_xyz(prev_block, other);
            describe_memory(where, sizeof where, nullptr, arg);
            if (!write && !atomic && prev_atomic &&
                hold_suspect(w, bs, a, kind, 1, 0, prev_pc, t, prev_tid, other, where))
                return;
            add_report(w, kind, 1, 0, a.pc, prev_pc, t, prev_tid, a.addr, a.size, write, where, other);
            return;   // one report per access
        }
    }
}

// An address whose atomics (and volatile accesses) order blocks: a launch buffer, or one of the
// library's __device__ variables (CUDA's threadFenceReduction sample counts its blocks in a
// `__device__ unsigned int`, not in an argument).
__attribute__((no_sanitize_thread)) inline bool is_sync_address(uintptr_t a) {
    for (const auto& b : g_buffers)
        if (a >= b.lo && a < b.hi) return true;
    for (int i = 0; i < g_nimage; ++i)
        if (a >= g_image_lo[i] && a < g_image_hi[i]) return true;
    return false;
}

__attribute__((no_sanitize_thread)) inline size_t stripe(uintptr_t a) { return (a / kGranule) % kSyncStripes; }

__attribute__((no_sanitize_thread)) inline void acquire(BlockState& bs, uintptr_t a) {
    for (auto& e : g_published[stripe(a)])
        if (e.first == a) join(bs.seen, e.second);
}

// A volatile load is strong, like an atomic read (PTX), so it acquires too: data handed over as
// "write; __threadfence(); volatile flag = 1" in one block and "while (volatile flag == 0); read" in
// another is ordered. Its hook runs before the load itself, so the acquisition waits for the block's
// next access, by when the load has happened: acquiring earlier could take a publication whose flag
// store the load did not see.
__attribute__((no_sanitize_thread)) inline void acquire_locked(BlockState& bs, uintptr_t a) {
    size_t s = stripe(a);
    lock(g_sync_locks[s]);
    acquire(bs, a);
    unlock(g_sync_locks[s]);
}

__attribute__((no_sanitize_thread)) inline void acquire_pending(BlockState& bs) {
    uintptr_t a = bs.pending_acquire;
    bs.pending_acquire = 0;
    acquire_locked(bs, a);
}

// An atomic is checked against other blocks' accesses with what it acquires already acquired: a
// block's "x = 0; __threadfence(); atomicAdd(&x, 1)" is ordered before another block's later atomic on
// x, as the rule says. Its hook runs just before on_atomic_begin, which acquires again under the lock
// (what is published in between comes before the atomic too, so acquiring early never orders more).
__attribute__((no_sanitize_thread)) inline void acquire_for_atomic(BlockState& bs, uintptr_t a) {
    if (is_sync_address(a)) acquire_locked(bs, a);
}

// An atomic on a launch buffer: acquire what was published through its address; after the memory
// operation, publish this block's accesses if it fenced since it last did. The stripe's lock is held
// from begin to end, so the clocks follow the order of the atomics themselves. A volatile store
// (ACCESS_VOLATILE | ACCESS_WRITE, notified just before the store) publishes as an atomic does and
// acquires nothing (a relaxed store); a volatile load acquires later (acquire_pending).
__attribute__((no_sanitize_thread)) inline void on_atomic_begin(Worker*, const void* addr, unsigned flags) {
    uintptr_t a = uintptr_t(addr);
    if (!(g_check & CHECK_RACE) || !is_sync_address(a)) return;
    if ((flags & ACCESS_VOLATILE) && !(flags & ACCESS_WRITE)) {
        tls_block->pending_acquire = a;
        return;
    }
    size_t s = stripe(a);
    lock(g_sync_locks[s]);
    if (!(flags & ACCESS_VOLATILE)) acquire(*tls_block, a);
}

__attribute__((no_sanitize_thread)) inline void on_atomic_end(Worker*, const void* addr, unsigned flags) {
    uintptr_t a = uintptr_t(addr);
    if (!(g_check & CHECK_RACE) || !is_sync_address(a)) return;
    if ((flags & ACCESS_VOLATILE) && !(flags & ACCESS_WRITE)) return;
    size_t s = stripe(a);
    BlockState& bs = *tls_block;
    if ((flags & ACCESS_WRITE) && bs.fenced) {
        Clock* published = nullptr;
        for (auto& e : g_published[s])
            if (e.first == a) published = &e.second;
        if (published == nullptr) {
            g_published[s].push_back({a, Clock{}});
            published = &g_published[s].back().second;
        }
        join(*published, bs.seen);
        raise_to(*published, bs.linear, bs.clock);
        ++bs.clock;
        bs.fenced = false;
    }
    unlock(g_sync_locks[s]);
}

__attribute__((no_sanitize_thread)) inline void on_fence(Worker*) {
    if (g_check & CHECK_RACE) tls_block->fenced = true;
}

// grid.sync() in a cooperative launch orders everything every block did before it before anything
// any block does after it: each arriving block publishes its accesses so far (and what it had
// acquired) into the sync's clock, and each departing block acquires all of it. The hooks run with
// the grid barrier's lock held, every arrival of a sync before any departure from it. Two clocks, by
// the sync's parity: a block may arrive at the next sync while a slower one has not yet departed
// from this one, but no block arrives at the one after before every block departed from this one,
// so the first arrival at a sync may clear its clock.
inline Clock g_grid_clock[2];

__attribute__((no_sanitize_thread)) inline void on_grid_arrive(Worker*, unsigned long long gen, bool first) {
    if (!(g_check & CHECK_RACE)) return;
    Clock& published = g_grid_clock[gen & 1];
    if (first) published.clear();
    BlockState& bs = *tls_block;
    join(published, bs.seen);
    raise_to(published, bs.linear, bs.clock);
    ++bs.clock;   // its accesses after the sync are not covered by this publication
}

__attribute__((no_sanitize_thread)) inline void on_grid_depart(Worker*, unsigned long long gen) {
    if (g_check & CHECK_RACE) join(tls_block->seen, g_grid_clock[gen & 1]);
}

}  // namespace between

__attribute__((no_sanitize_thread)) inline void on_access(Worker* w, Fiber* f, const Access& a) {
    unsigned bits = g_check & (CHECK_RACE | CHECK_MEMORY | CHECK_INIT);
    if (!bits) return;
    uintptr_t p = uintptr_t(a.addr), end = p + a.size;
    BlockState& bs = *tls_block;
    if ((bits & CHECK_RACE) && bs.pending_acquire) between::acquire_pending(bs);
    if ((bits & CHECK_RACE) && (a.flags & ACCESS_ATOMIC) && !(a.flags & ACCESS_VOLATILE))
        between::acquire_for_atomic(bs, p);
    bool validating = false;
    if ((bits & CHECK_RACE) && (a.flags & ACCESS_ATOMIC) && tls_cas_addr == a.addr) {   // the kernel's atomicCAS
        tls_cas_addr = nullptr;
        unsigned long long current = 0;
        std::memcpy(&current, a.addr, a.size < 8 ? a.size : 8);
        validate(bs, unsigned(f->linear), p, a.size, tls_cas_compare, current);
        validating = between::validate_last_read(bs, unsigned(f->linear), p, a.size, tls_cas_compare, current);
    }
    if (p - uintptr_t(f->stack) < f->stack_size) return;  // the thread's own local memory
    char where[240];
    if ((bits & CHECK_MEMORY) && (a.flags & ACCESS_MISALIGNED)) {
        std::snprintf(where, sizeof where, "misaligned: not a multiple of %u, the access's size (a GPU stops "
                      "the launch with 'misaligned address'; a vector type read through reinterpret_cast "
                      "needs an offset that is a multiple of its size)", a.size);
        add_report(w, "OOB", 2, 0, a.pc, nullptr, unsigned(f->linear), unsigned(f->linear), a.addr, a.size,
                   a.flags & ACCESS_WRITE, where);
        stop_launch(w);
    }
    SharedArea areas[64];
    int na = shared_areas(w, areas, 64);
    for (int i = 0; i < na; ++i) {
        const SharedArea& s = areas[i];
        uintptr_t lo = uintptr_t(s.lo), hi = uintptr_t(s.hi);
        if (p >= lo && end <= hi) {
            if (bits & (CHECK_RACE | CHECK_INIT)) {
                Region& r = region_for(bs, s.lo, size_t(hi - lo));
                check_cells(w, f, r.shadow.data() + (p - lo), a.size, a, 0, &s, -1);
            }
            return;
        }
    }
    if ((bits & CHECK_MEMORY) && p >= w->shared.window_lo() && p < w->shared.window_hi()) {
        // in the shared-memory window but in no array of this block (its guard bytes, another kernel's
        // array kept for this thread, or no array at all): named by the nearest, however far out
        nearest_shared(w, p, a.size, where, sizeof where);
        add_report(w, "OOB", 0, 0, a.pc, nullptr, unsigned(f->linear), unsigned(f->linear), a.addr, a.size,
                   a.flags & ACCESS_WRITE, where);
        stop_launch(w);
    }
    const LaunchConfig* cfg = w->cfg;
    for (unsigned i = 0; i < cfg->nbuffers; ++i) {
        uintptr_t lo = uintptr_t(cfg->buffers[2 * i]), hi = uintptr_t(cfg->buffers[2 * i + 1]);
        if (p >= lo && end <= hi) {
            if (bits & CHECK_RACE) {
                if (bs.global.empty()) bs.global.resize(kGlobalSlots);
                for (unsigned k = 0; k < a.size; ++k) {
                    Cell* c = global_cell(bs, p + k);
                    if (c == nullptr) break;
                    check_cells(w, f, c, 1, a, 1, nullptr, int(i));
                }
                between::check_access(w, f, bs, a, int(i), validating);
            }
            return;
        }
    }
    if (!(bits & CHECK_MEMORY)) return;
    for (int i = 0; i < g_nimage; ++i)
        if (p >= g_image_lo[i] && end <= g_image_hi[i]) return;
    if (heap_block(p, end)) return;   // the kernel's own malloc or new
    nearest(w, p, a.size, where, sizeof where);
    add_report(w, "OOB", 2, 0, a.pc, nullptr, unsigned(f->linear), unsigned(f->linear), a.addr, a.size,
               a.flags & ACCESS_WRITE, where);
    stop_launch(w);
}

__attribute__((no_sanitize_thread)) inline void on_launch_begin(const LaunchConfig* cfg) {
    std::lock_guard<std::mutex> lk(g_report_mutex);
    g_reports.clear();
    g_dropped = 0;
    ++g_launch;
    g_cfg = cfg;
    if (g_nimage < 0) find_image();
    between::begin_launch(cfg);
}

__attribute__((no_sanitize_thread)) inline void on_launch_end(LaunchResult*) {
    between::report_deferred();
    between::release_shadow();
}

__attribute__((no_sanitize_thread)) inline void on_block_begin(Worker* w) {
    if (tls_block == nullptr) tls_block = new BlockState();  // one per worker thread, kept for its life
    BlockState& bs = *tls_block;
    if (bs.launch != g_launch) {  // shared storage (and the dynamic area) may have moved
        bs.launch = g_launch;
        bs.regions.clear();
    }
    bs.serial = ++tls_serial;
    bs.epoch = bs.serial << 24;
    bs.linear = w->block_idx.x + g_grid_dim.x * (w->block_idx.y + g_grid_dim.y * w->block_idx.z) + 1;
    bs.clock = 1;
    bs.fenced = false;
    bs.seen.clear();
    bs.pending_acquire = 0;
    bs.suspects.clear();
    bs.global_used = 0;
    bs.gen.assign(size_t(w->nthreads), 0);
    bs.last_read.assign(size_t(w->nthreads), BlockState::LastRead{0, nullptr, 0, 0, 0});
    int nwarps = (w->nthreads + 31) / 32;
    bs.warp_events.assign(size_t(nwarps), 0);
    bs.history.assign(size_t(nwarps) * kHistory, Event{0, 0});
}

__attribute__((no_sanitize_thread)) inline void on_block_barrier(Worker* w) {
    BlockState& bs = *tls_block;
    if (!bs.suspects.empty()) report_suspects(w, bs);   // not validated before the barrier
    ++bs.epoch;
}

__attribute__((no_sanitize_thread)) inline void on_block_end(Worker* w) {
    if (tls_block && !tls_block->suspects.empty()) report_suspects(w, *tls_block);
    if (tls_block && (g_check & CHECK_RACE) && tls_block->linear) between::settle_block(tls_block->linear);
}

__attribute__((no_sanitize_thread)) inline void on_warp_sync(Worker*, int warp, unsigned lanes) {
    BlockState& bs = *tls_block;
    unsigned id = ++bs.warp_events[size_t(warp)];
    bs.history[size_t(warp) * kHistory + id % kHistory] = Event{id, lanes};
    for (unsigned m = lanes; m; m &= m - 1) bs.gen[size_t(warp) * 32 + __builtin_ctz(m)] = id;
}

inline const AccessObserver observer = {on_launch_begin, on_block_begin, on_access, on_block_barrier, on_warp_sync,
                                        on_block_end, on_launch_end, between::on_fence, between::on_atomic_begin,
                                        between::on_atomic_end, between::on_grid_arrive, between::on_grid_depart};
struct Register { Register() { add_observer(&observer); } };
inline Register registered;

}  // namespace check
}  // namespace llmcupy_sim

// The device heap's allocation functions (see "The device heap"), bound in by -Wl,--wrap=NAME where
// the library is linked with it (Linux: sim/compiler.py); elsewhere a kernel's heap is unknown to memcheck.
#if defined(__linux__)
extern "C" {
void* __real_malloc(size_t);
void* __real_calloc(size_t, size_t);
void* __real_realloc(void*, size_t);
void __real_free(void*);
void* __real__Znwm(size_t);
void* __real__Znam(size_t);
void __real__ZdlPv(void*);
void __real__ZdaPv(void*);
void __real__ZdlPvm(void*, size_t);
void __real__ZdaPvm(void*, size_t);
#define LLMCUPY_SIM_HEAP_FN __attribute__((no_sanitize_thread, used, visibility("default")))
#define LLMCUPY_SIM_HEAP_NEW(CALL, BYTES)                                                                   \
    bool kernel_ = llmcupy_sim::check::kernel_is_running();                                             \
    void* p_ = CALL;                                                                                    \
    if (kernel_) llmcupy_sim::check::heap_record(p_, BYTES);                                            \
    return p_
LLMCUPY_SIM_HEAP_FN void* __wrap_malloc(size_t n) { LLMCUPY_SIM_HEAP_NEW(__real_malloc(n), n); }
LLMCUPY_SIM_HEAP_FN void* __wrap_calloc(size_t k, size_t n) { LLMCUPY_SIM_HEAP_NEW(__real_calloc(k, n), k * n); }
LLMCUPY_SIM_HEAP_FN void* __wrap_realloc(void* old, size_t n) {
    llmcupy_sim::check::heap_forget(old);
    LLMCUPY_SIM_HEAP_NEW(__real_realloc(old, n), n);
}
LLMCUPY_SIM_HEAP_FN void* __wrap__Znwm(size_t n) { LLMCUPY_SIM_HEAP_NEW(__real__Znwm(n), n); }
LLMCUPY_SIM_HEAP_FN void* __wrap__Znam(size_t n) { LLMCUPY_SIM_HEAP_NEW(__real__Znam(n), n); }
LLMCUPY_SIM_HEAP_FN void __wrap_free(void* p) { llmcupy_sim::check::heap_forget(p); __real_free(p); }
LLMCUPY_SIM_HEAP_FN void __wrap__ZdlPv(void* p) { llmcupy_sim::check::heap_forget(p); __real__ZdlPv(p); }
LLMCUPY_SIM_HEAP_FN void __wrap__ZdaPv(void* p) { llmcupy_sim::check::heap_forget(p); __real__ZdaPv(p); }
LLMCUPY_SIM_HEAP_FN void __wrap__ZdlPvm(void* p, size_t n) { llmcupy_sim::check::heap_forget(p); __real__ZdlPvm(p, n); }
LLMCUPY_SIM_HEAP_FN void __wrap__ZdaPvm(void* p, size_t n) { llmcupy_sim::check::heap_forget(p); __real__ZdaPvm(p, n); }
#undef LLMCUPY_SIM_HEAP_NEW
}
#endif

// The most bytes the last checked launch held at once for the WARs it deferred and the reads it
// validated between blocks (racecheck; tests/test_sim_check.py bounds it for a large grid).
extern "C" LLMCUPY_SIM_EXPORT __attribute__((no_sanitize_thread)) unsigned long long
llmcupy_sim_check_deferred_peak_bytes() {
    return llmcupy_sim::check::between::g_pending_peak;
}

// The last launch's reports as text, one per line, tab-separated:
// kind space warp pc prev_pc bx by bz tid prev_tid addr size write count prev_bx prev_by prev_bz where
// then a last line "dropped N". Returns the length the whole text needs (copies at most n - 1 bytes).
extern "C" LLMCUPY_SIM_EXPORT __attribute__((no_sanitize_thread)) unsigned long long llmcupy_sim_check_reports(
    char* buf, unsigned long long n) {
    using namespace llmcupy_sim::check;
    std::lock_guard<std::mutex> lk(g_report_mutex);
    std::string text;
    char line[512];
    for (const auto& r : g_reports) {
        std::snprintf(line, sizeof line, "%s\t%d\t%d\t%llu\t%llu\t%u\t%u\t%u\t%u\t%u\t%llu\t%u\t%d\t%llu\t%u\t%u\t%u\t%s\n",
                      r.kind, r.space, r.warp, (unsigned long long)(uintptr_t)r.pc,
                      (unsigned long long)(uintptr_t)r.prev_pc, r.block[0], r.block[1], r.block[2], r.tid, r.prev_tid,
                      r.addr, r.size, r.write, r.count, r.prev_block[0], r.prev_block[1], r.prev_block[2], r.where);
        text += line;
    }
    std::snprintf(line, sizeof line, "dropped\t%llu\n", g_dropped);
    text += line;
    if (buf && n) {
        size_t k = std::min<size_t>(text.size(), size_t(n - 1));
        std::memcpy(buf, text.data(), k);
        buf[k] = 0;
    }
    return text.size();
}
