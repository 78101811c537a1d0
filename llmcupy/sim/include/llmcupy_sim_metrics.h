// Memory-traffic metrics for the emulator (instrumented builds only: LLMCUPY_SIM_ACCESS_HOOKS).
//
// An AccessObserver (see "Access hooks" in llmcupy_sim.h) that turns the kernel's loads and stores
// into the figures Nsight Compute's memory workload analysis reports on a GPU, aggregated here in
// C++ per launch and per access site (the instruction's address, `pc`); Python maps sites to
// source lines (sim/symbols.py) and reads the tables through the llmcupy_sim_metrics_* entry points
// at the end of this file. It does nothing unless the launch's check mask has CHECK_METRICS (8).
//
// * A warp-level *request* is the k-th execution of one access site by each lane of a warp between
//   two synchronisation points (a block barrier, or a warp collective / __syncwarp releasing those
//   lanes): lanes of a warp run in lock-step on a GPU, so their k-th executions of one instruction
//   are one instruction. The emulator runs lanes one after another, so the lanes' accesses are
//   recorded per warp and grouped when the warp synchronises (or the block ends). g++ copies a
//   float4 as several scalar moves; those are joined back into one vector access (see Pending).
// * Global memory (the launch's buffers, LaunchConfig::buffers): the 32-byte sectors
//   a request touches (the unit DRAM and L2 move), bytes requested (the lanes' access sizes, summed)
//   against bytes in those sectors, and per launch the unique bytes read (before the launch wrote
//   them) and written: a lower bound of DRAM traffic, as if every cache were infinite. Other addresses (a __device__ variable, the
//   emulator's own records) are only counted (`untracked_global`).
// * Shared memory: 32 banks of 4 bytes. A request is served in wavefronts; in one wavefront each bank
//   delivers one 4-byte word, so a request needs, per phase, as many wavefronts as the most distinct
//   words any one bank holds among its lanes (the same word read by several lanes is a broadcast,
//   not a conflict). Accesses wider than 4 bytes are served in phases as on the hardware: 8-byte
//   accesses per half-warp, 16-byte ones per quarter-warp. Conflict ways = wavefronts / phases.
// * Local memory (the fiber's stack) is only counted: the emulator's stack holds what a GPU would
//   keep in registers, so its accesses say nothing about a GPU's local memory traffic.
#pragma once

#ifdef LLMCUPY_SIM_ACCESS_HOOKS
#include <cstdlib>
#include <cstring>

// Everything here is called from the access hooks, inside an instrumented translation unit: a call
// to any function compiled with the instrumentation (the C++ library's inline templates included:
// std::vector, std::sort, std::atomic, std::mutex, even std::min) would report the observer's own
// bookkeeping as kernel accesses and re-enter the hook. So this file uses only functions marked
// LLMCUPY_SIM_NOSAN_FN, __atomic builtins and libc (malloc, memset), never the C++ library.
namespace llmcupy_sim {
namespace metrics {

enum Kind : unsigned { GLOBAL_LOAD = 0, GLOBAL_STORE = 1, GLOBAL_ATOMIC = 2, SHARED_LOAD = 3, SHARED_STORE = 4,
                       SHARED_ATOMIC = 5 };

// One access site of one kind, summed over the launch. ctypes mirrors it (sim/metrics.py).
struct SiteStats {
    unsigned long long pc;
    unsigned kind;
    unsigned max_size;                    // widest access seen (bytes per lane)
    unsigned long long requests;          // warp-level requests
    unsigned long long lane_accesses;     // thread-level accesses
    unsigned long long bytes;             // bytes requested: every lane's access size, summed
    unsigned long long sectors;           // global: distinct 32-byte sectors per request, summed
    unsigned long long wavefronts;        // shared: wavefronts needed, summed
    unsigned long long ideal_wavefronts;  // shared: phases (the wavefronts without bank conflicts), summed
};

// Launch-wide figures. ctypes mirrors it (sim/metrics.py).
struct LaunchTotals {
    unsigned long long unique_read_bytes;     // distinct bytes of the launch's buffers read before it wrote them
    unsigned long long unique_written_bytes;  // distinct bytes of the launch's buffers written (atomics too)
    unsigned long long untracked_global;      // global accesses outside every buffer (__device__ data ...)
    unsigned long long local_accesses;        // accesses to the thread's own stack
    unsigned long long sites;                 // rows available from llmcupy_sim_metrics_sites
    unsigned long long buffer_bytes;          // the buffers' total size (what the bitmaps cover)
};

// A growable array of trivially copyable T on malloc (see the note above: no std::vector).
template <typename T>
struct Array {
    T* data;
    size_t size, cap;
    LLMCUPY_SIM_NOSAN_FN void reserve(size_t n) {
        if (n <= cap) return;
        size_t c = cap ? cap : 64;
        while (c < n) c *= 2;
        T* p = static_cast<T*>(std::realloc(data, c * sizeof(T)));
        if (p == nullptr) std::abort();
        data = p;
        cap = c;
    }
    LLMCUPY_SIM_NOSAN_FN void push(const T& v) {
        if (size == cap) reserve(size + 1);
        data[size++] = v;
    }
    LLMCUPY_SIM_NOSAN_FN void release() {
        std::free(data);
        data = nullptr;
        size = cap = 0;
    }
};

// A recorded access, until its warp synchronises. key = site << 40 | k << 8 | lane: sorting by key
// puts the lanes of each request (one site, one k) next to each other.
struct Rec {
    unsigned long long key;
    unsigned long long addr;
    unsigned long long size;
};

LLMCUPY_SIM_NOSAN_FN inline unsigned long long key_of(const Rec& r) { return r.key; }
LLMCUPY_SIM_NOSAN_FN inline unsigned long long key_of(unsigned long long v) { return v; }

// Stable bottom-up merge sort by key_of (n log n, no recursion, one scratch buffer).
template <typename T>
LLMCUPY_SIM_NOSAN_FN inline void sort(T* a, size_t n, Array<T>& scratch) {
    if (n < 2) return;
    if (n <= 24) {  // insertion sort: most requests have at most 32 lanes' worth of entries
        for (size_t i = 1; i < n; ++i) {
            T v = a[i];
            size_t j = i;
            while (j > 0 && key_of(a[j - 1]) > key_of(v)) a[j] = a[j - 1], --j;
            a[j] = v;
        }
        return;
    }
    scratch.reserve(n);
    T* src = a;
    T* dst = scratch.data;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) dst[o++] = key_of(src[j]) < key_of(src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[o++] = src[i++];
            while (j < hi) dst[o++] = src[j++];
        }
        T* t = src;
        src = dst;
        dst = t;
    }
    if (src != a) std::memcpy(a, src, n * sizeof(T));
}

LLMCUPY_SIM_NOSAN_FN inline size_t unique_count(const unsigned long long* v, size_t n) {
    size_t u = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) u += v[i] != v[i - 1];
    return u;
}

// A tracked buffer: one bit per byte for "read" and one for "written".
struct Buffer {
    unsigned long long begin, end;
    unsigned long long* read;
    unsigned long long* written;
};

struct Launch {
    int lock;                    // a spin lock (__atomic builtins: std::mutex is instrumented code)
    int active;
    Array<Buffer> buffers;       // sorted by begin, non-overlapping
    Array<SiteStats> sites;      // merged from the workers at each block's end
    unsigned long long untracked, local;
    LaunchTotals totals;
};
inline Launch g_launch;

// A thread's latest accesses, held back while the next one may extend them: the CPU compiler copies
// a float4 or float2 as several scalar moves, where the GPU issues one 16- or 8-byte access.
// Contiguous accesses of one kind by one thread, from distinct instructions of the same source line
// (the line table Python hands over, llmcupy_sim_metrics_set_lines; without one: at most kMaxPcGap
// bytes of code apart), that together fill an aligned 8- or 16-byte vector count as one vector
// access at the first instruction's site. Anything else counts access by access: the same
// instruction again (a loop walking an array), or two statements reading neighbouring floats
// (separate instructions on a GPU too).
constexpr unsigned long long kMaxPcGap = 48;

// The library's line table: code offsets (sorted) and a source-line id from each on (0: none).
struct LineTable {
    unsigned long long* starts;
    unsigned* ids;
    unsigned long long n, base;
};
inline LineTable g_lines;

LLMCUPY_SIM_NOSAN_FN inline unsigned line_of(unsigned long long pc) {
    const LineTable& t = g_lines;
    unsigned long long rel = pc - 1 - t.base;  // the return address follows the hook's call
    size_t lo = 0, hi = size_t(t.n);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t.starts[mid] <= rel) lo = mid + 1;
        else hi = mid;
    }
    return lo ? t.ids[lo - 1] : 0u;
}

LLMCUPY_SIM_NOSAN_FN inline bool same_statement(unsigned long long a, unsigned long long b) {
    if (g_lines.n == 0) return (a > b ? a - b : b - a) <= kMaxPcGap;
    unsigned la = line_of(a);
    return la != 0 && la == line_of(b);
}
struct Pending {
    unsigned long long pcs[4], addrs[4], sizes[4];
    unsigned long long lo, hi;   // the parts' union
    unsigned kind, count;        // count 0: nothing pending
};

// Per OS thread (a block runs on one), reset at each block's start. Plain zero-initialised data.
struct BlockState {
    int active;
    // site interning: (pc << 3 | kind) -> local id, open addressing; stats per local id
    unsigned long long* slot_key;
    int* slot_id;
    size_t slot_cap;
    Array<SiteStats> stats;
    unsigned* counts;            // [thread][site]: executions since the thread's last sync
    size_t count_stride, count_threads;
    Pending* pending;            // [thread]
    Array<Rec> recs[kMaxThreads / 32];
    Array<Rec> mine, rec_scratch;
    Array<unsigned long long> tmp, tmp_scratch;
    unsigned long long untracked, local;
};
inline thread_local BlockState tls_state;

LLMCUPY_SIM_NOSAN_FN inline void lock() {
    while (__atomic_exchange_n(&g_launch.lock, 1, __ATOMIC_ACQUIRE)) {}
}
LLMCUPY_SIM_NOSAN_FN inline void unlock() { __atomic_store_n(&g_launch.lock, 0, __ATOMIC_RELEASE); }

LLMCUPY_SIM_NOSAN_FN inline size_t slot_of(unsigned long long key, size_t cap) {
    return size_t((key * 0x9E3779B97F4A7C15ull) >> 24) & (cap - 1);
}

LLMCUPY_SIM_NOSAN_FN inline void grow_counts(BlockState& s, size_t stride) {
    size_t n = s.count_threads;
    unsigned* c = static_cast<unsigned*>(std::calloc(n * stride, sizeof(unsigned)));
    if (c == nullptr) std::abort();
    for (size_t t = 0; t < n && s.counts; ++t) std::memcpy(c + t * stride, s.counts + t * s.count_stride, s.count_stride * sizeof(unsigned));
    std::free(s.counts);
    s.counts = c;
    s.count_stride = stride;
}

LLMCUPY_SIM_NOSAN_FN inline int intern(BlockState& s, unsigned long long key, const void* pc, unsigned kind) {
    if (s.stats.size * 2 + 2 > s.slot_cap) {  // grow and rehash at half load
        size_t ncap = s.slot_cap ? s.slot_cap * 2 : 64;
        unsigned long long* keys = static_cast<unsigned long long*>(std::malloc(ncap * sizeof(unsigned long long)));
        int* ids = static_cast<int*>(std::malloc(ncap * sizeof(int)));
        if (keys == nullptr || ids == nullptr) std::abort();
        for (size_t i = 0; i < ncap; ++i) ids[i] = -1;
        for (size_t i = 0; i < s.slot_cap; ++i) {
            if (s.slot_id[i] < 0) continue;
            size_t j = slot_of(s.slot_key[i], ncap);
            while (ids[j] >= 0) j = (j + 1) & (ncap - 1);
            keys[j] = s.slot_key[i];
            ids[j] = s.slot_id[i];
        }
        std::free(s.slot_key);
        std::free(s.slot_id);
        s.slot_key = keys;
        s.slot_id = ids;
        s.slot_cap = ncap;
    }
    size_t j = slot_of(key, s.slot_cap);
    while (s.slot_id[j] >= 0) {
        if (s.slot_key[j] == key) return s.slot_id[j];
        j = (j + 1) & (s.slot_cap - 1);
    }
    int id = int(s.stats.size);
    s.slot_key[j] = key;
    s.slot_id[j] = id;
    SiteStats st;
    std::memset(&st, 0, sizeof st);
    st.pc = (unsigned long long)(uintptr_t)pc;
    st.kind = kind;
    s.stats.push(st);
    if (s.stats.size > s.count_stride) grow_counts(s, s.count_stride ? s.count_stride * 2 : 16);
    return id;
}

// The figures of one request: the lanes' records [b, e), all of one site and one k.
LLMCUPY_SIM_NOSAN_FN inline void account(BlockState& s, const Rec* b, const Rec* e) {
    SiteStats& st = s.stats.data[b->key >> 40];
    st.requests++;
    Array<unsigned long long>& tmp = s.tmp;
    tmp.size = 0;
    unsigned width = 0;
    for (const Rec* r = b; r != e; ++r) {
        st.lane_accesses++;
        st.bytes += r->size;
        if (r->size > width) width = unsigned(r->size);
    }
    if (width > st.max_size) st.max_size = width;
    if (st.kind <= GLOBAL_ATOMIC) {
        for (const Rec* r = b; r != e; ++r)
            for (unsigned long long sec = r->addr >> 5, last = (r->addr + r->size - 1) >> 5; sec <= last; ++sec) tmp.push(sec);
        sort(tmp.data, tmp.size, s.tmp_scratch);
        st.sectors += unique_count(tmp.data, tmp.size);
        return;
    }
    // Shared memory: entries phase << 40 | bank << 32 | word; per phase the most distinct words in one bank.
    unsigned lanes_per_phase = width <= 4 ? 32 : width <= 8 ? 16 : 8;
    for (const Rec* r = b; r != e; ++r) {
        unsigned long long phase = (r->key & 0xff) / lanes_per_phase;
        for (unsigned long long word = r->addr >> 2, last = (r->addr + r->size - 1) >> 2; word <= last; ++word)
            tmp.push(phase << 40 | (word & 31) << 32 | (word & 0xffffffffull));
    }
    sort(tmp.data, tmp.size, s.tmp_scratch);
    unsigned long long wavefronts = 0, phases = 0;
    size_t i = 0, n = tmp.size;
    const unsigned long long* v = tmp.data;
    while (i < n) {
        unsigned long long phase = v[i] >> 40, worst = 0;
        ++phases;
        while (i < n && (v[i] >> 40) == phase) {
            unsigned long long bank = v[i] >> 32, words = 0;
            while (i < n && (v[i] >> 32) == bank) {
                words += i == 0 || v[i] != v[i - 1];  // the same word again: a broadcast
                ++i;
            }
            if (words > worst) worst = words;
        }
        wavefronts += worst;
    }
    st.wavefronts += wavefronts;
    st.ideal_wavefronts += phases;
}

// Records thread t's pending access: its site, its execution count k since the last sync.
LLMCUPY_SIM_NOSAN_FN inline void record(BlockState& s, size_t t, unsigned long long pc, unsigned kind,
                                        unsigned long long addr, unsigned long long size) {
    int id = intern(s, pc << 3 | kind, (const void*)(uintptr_t)pc, kind);
    unsigned k = s.counts[t * s.count_stride + size_t(id)]++;
    s.recs[t / 32].push(Rec{(unsigned long long)id << 40 | (unsigned long long)k << 8 | (t % 32), addr, size});
}

LLMCUPY_SIM_NOSAN_FN inline void commit(BlockState& s, size_t t) {
    Pending& p = s.pending[t];
    unsigned n = p.count;
    if (n == 0) return;
    p.count = 0;
    unsigned long long size = p.hi - p.lo;
    if (n > 1 && (size == 8 || size == 16) && p.lo % size == 0) {
        record(s, t, p.pcs[0], p.kind, p.lo, size);
        return;
    }
    for (unsigned i = 0; i < n; ++i) record(s, t, p.pcs[i], p.kind, p.addrs[i], p.sizes[i]);
}

// Groups the recorded accesses of `lanes` of warp `warp` into requests and resets their counts.
LLMCUPY_SIM_NOSAN_FN inline void flush(BlockState& s, int warp, unsigned lanes) {
    for (unsigned m = lanes; m; m &= m - 1) {
        size_t t = size_t(warp) * 32 + size_t(__builtin_ctz(m));
        if (t < s.count_threads) commit(s, t);
    }
    Array<Rec>& recs = s.recs[warp];
    Array<Rec>& mine = s.mine;
    mine.size = 0;
    size_t keep = 0;
    for (size_t i = 0; i < recs.size; ++i) {
        if (lanes >> (recs.data[i].key & 31) & 1) mine.push(recs.data[i]);
        else recs.data[keep++] = recs.data[i];
    }
    recs.size = keep;
    sort(mine.data, mine.size, s.rec_scratch);
    for (size_t i = 0; i < mine.size;) {
        size_t j = i + 1;
        while (j < mine.size && (mine.data[j].key >> 8) == (mine.data[i].key >> 8)) ++j;
        account(s, mine.data + i, mine.data + j);
        i = j;
    }
    for (unsigned m = lanes; m; m &= m - 1) {
        size_t t = size_t(warp) * 32 + size_t(__builtin_ctz(m));
        if (t < s.count_threads && s.counts) std::memset(s.counts + t * s.count_stride, 0, s.count_stride * sizeof(unsigned));
    }
}

// Sets the bits of bytes [off, off + n) in `bits`, except those already set in `unless` (if given).
LLMCUPY_SIM_NOSAN_FN inline void mark(unsigned long long* bits, unsigned long long off, unsigned long long n,
                                      const unsigned long long* unless = nullptr) {
    for (unsigned long long i = off, end = off + n; i < end;) {
        unsigned long long word = i >> 6, bit = i & 63, take = 64 - bit < end - i ? 64 - bit : end - i;
        unsigned long long m = (take == 64 ? ~0ull : ((1ull << take) - 1)) << bit;
        if (unless) m &= ~__atomic_load_n(&unless[word], __ATOMIC_RELAXED);
        // most accesses revisit marked bytes: look first, write only what is new
        if ((__atomic_load_n(&bits[word], __ATOMIC_RELAXED) & m) != m) __atomic_fetch_or(&bits[word], m, __ATOMIC_RELAXED);
        i += take;
    }
}

LLMCUPY_SIM_NOSAN_FN inline void on_launch_begin(const LaunchConfig* cfg) {
    Launch& L = g_launch;
    for (size_t i = 0; i < L.buffers.size; ++i) std::free(L.buffers.data[i].read), std::free(L.buffers.data[i].written);
    L.buffers.size = 0;
    L.sites.size = 0;
    L.untracked = L.local = 0;
    std::memset(&L.totals, 0, sizeof L.totals);
    L.active = (cfg->check & CHECK_METRICS) != 0;
    if (!L.active) return;
    // the buffers, sorted and merged where two arguments share memory (an in-place op passes one
    // array twice, a view shares its root allocation)
    Array<unsigned long long> ends{};
    for (unsigned i = 0; i < cfg->nbuffers; ++i) {
        unsigned long long b = cfg->buffers[2 * i], e = cfg->buffers[2 * i + 1];
        if (e > b) ends.push(b), ends.push(e);
    }
    size_t n = ends.size / 2;
    for (size_t i = 1; i < n; ++i)  // insertion sort of (begin, end) pairs: a launch has few buffers
        for (size_t j = i; j > 0 && ends.data[2 * j - 2] > ends.data[2 * j]; --j) {
            unsigned long long b = ends.data[2 * j], e = ends.data[2 * j + 1];
            ends.data[2 * j] = ends.data[2 * j - 2], ends.data[2 * j + 1] = ends.data[2 * j - 1];
            ends.data[2 * j - 2] = b, ends.data[2 * j - 1] = e;
        }
    for (size_t i = 0; i < n; ++i) {
        unsigned long long b = ends.data[2 * i], e = ends.data[2 * i + 1];
        if (L.buffers.size && b <= L.buffers.data[L.buffers.size - 1].end) {
            Buffer& last = L.buffers.data[L.buffers.size - 1];
            if (e > last.end) last.end = e;
            continue;
        }
        L.buffers.push(Buffer{b, e, nullptr, nullptr});
    }
    ends.release();
    for (size_t i = 0; i < L.buffers.size; ++i) {
        Buffer& buf = L.buffers.data[i];
        size_t words = size_t((buf.end - buf.begin + 63) / 64);
        buf.read = static_cast<unsigned long long*>(std::calloc(words, 8));
        buf.written = static_cast<unsigned long long*>(std::calloc(words, 8));
        if (buf.read == nullptr || buf.written == nullptr) std::abort();
        L.totals.buffer_bytes += buf.end - buf.begin;
    }
}

LLMCUPY_SIM_NOSAN_FN inline void on_block_begin(Worker* w) {
    BlockState& s = tls_state;
    s.active = g_launch.active;
    if (!s.active) return;
    s.stats.size = 0;
    for (size_t i = 0; i < s.slot_cap; ++i) s.slot_id[i] = -1;
    size_t threads = size_t(w->nthreads);
    if (threads > s.count_threads) {
        std::free(s.counts);
        s.counts = nullptr;
        s.count_threads = threads;
        grow_counts(s, s.count_stride ? s.count_stride : 16);
        std::free(s.pending);
        s.pending = static_cast<Pending*>(std::calloc(threads, sizeof(Pending)));
        if (s.pending == nullptr) std::abort();
    }
    std::memset(s.pending, 0, s.count_threads * sizeof(Pending));
    std::memset(s.counts, 0, s.count_threads * s.count_stride * sizeof(unsigned));
    for (auto& r : s.recs) r.size = 0;
    s.untracked = s.local = 0;
}

// Addresses as a GPU would have them. A global address becomes (buffer + 1) << 40 | offset in the
// buffer: cudaMalloc aligns every allocation to 256 bytes, NumPy only to 16, and sectors must be
// counted as the GPU would cut them. A shared address becomes (array + 1) << 40 | offset in its
// storage: only its place modulo 128 bytes matters for banks, and one array's offsets keep that.
constexpr unsigned long long kSpace = 1ull << 40;

// The shared array (or dynamic shared memory) holding `a`, as a device address; 0 if none.
LLMCUPY_SIM_NOSAN_FN inline unsigned long long shared_address(Worker* w, unsigned long long a) {
    // Reading the Worker's vectors calls instrumented std::vector members; their accesses are to the
    // Worker itself, which dispatch_access never passes on.
    unsigned long long d = (unsigned long long)(uintptr_t)w->shared.dynamic();
    if (a - d < w->shared.dynamic_size()) return kSpace + (a - d);
    const Worker::SharedGuard* g = w->guards.data();
    size_t n = w->guards.size();
    for (size_t i = 0; i < n; ++i) {
        unsigned long long lo = (unsigned long long)(uintptr_t)g[i].lo, hi = (unsigned long long)(uintptr_t)g[i].hi;
        if (a - lo < hi - lo + kGuardBytes) return (i + 2) * kSpace + (a - lo);
    }
    return 0;
}

LLMCUPY_SIM_NOSAN_FN inline void on_access(Worker* w, Fiber* f, const Access& acc) {
    BlockState& s = tls_state;
    if (!s.active || f == nullptr) return;
    unsigned long long a = (unsigned long long)(uintptr_t)acc.addr;
    if (a - (unsigned long long)(uintptr_t)f->stack < f->stack_size) {
        ++s.local;
        return;
    }
    bool write = acc.flags & ACCESS_WRITE, atomic = acc.flags & ACCESS_ATOMIC;
    unsigned long long size = acc.size ? acc.size : 1;
    unsigned kind;
    unsigned long long device = shared_address(w, a);
    if (device) {
        kind = atomic ? SHARED_ATOMIC : write ? SHARED_STORE : SHARED_LOAD;
    } else {
        kind = atomic ? GLOBAL_ATOMIC : write ? GLOBAL_STORE : GLOBAL_LOAD;
        Launch& L = g_launch;
        size_t lo = 0, hi = L.buffers.size;  // the last buffer that begins at or below a
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (L.buffers.data[mid].begin <= a) lo = mid + 1;
            else hi = mid;
        }
        if (lo > 0 && a < L.buffers.data[lo - 1].end) {
            Buffer& buf = L.buffers.data[lo - 1];
            unsigned long long n = size < buf.end - a ? size : buf.end - a;
            // A byte read after this launch wrote it needs no DRAM read (an infinite cache holds it):
            // only reads of bytes not yet written count. An atomic reads, then writes.
            if (!write || atomic) mark(buf.read, a - buf.begin, n, buf.written);
            if (write) mark(buf.written, a - buf.begin, n);
            device = lo * kSpace + (a - buf.begin);
        } else {
            // not the launch's memory: a __device__ variable, or the emulator's own bookkeeping
            // reached through instrumented C++ library code; counted, kept out of the tables
            ++s.untracked;
            return;
        }
    }
    a = device;
    unsigned long long pc = (unsigned long long)(uintptr_t)acc.pc;
    Pending& p = s.pending[size_t(f->linear)];
    if (p.count && p.count < 4 && p.kind == kind && (a == p.hi || a + size == p.lo)) {
        unsigned long long lo = a < p.lo ? a : p.lo, hi = a + size > p.hi ? a + size : p.hi;
        bool seen = false;
        for (unsigned i = 0; i < p.count; ++i) seen |= p.pcs[i] == pc;
        if (!seen && lo / 16 == (hi - 1) / 16 && same_statement(pc, p.pcs[p.count - 1])) {
            p.pcs[p.count] = pc;
            p.addrs[p.count] = a;
            p.sizes[p.count] = size;
            ++p.count;
            p.lo = lo;
            p.hi = hi;
            return;
        }
    }
    commit(s, size_t(f->linear));
    p.pcs[0] = pc;
    p.addrs[0] = p.lo = a;
    p.sizes[0] = size;
    p.hi = a + size;
    p.kind = kind;
    p.count = 1;
}

LLMCUPY_SIM_NOSAN_FN inline void on_block_barrier(Worker* w) {
    if (!tls_state.active) return;
    for (int warp = 0; warp < (w->nthreads + 31) / 32; ++warp) flush(tls_state, warp, 0xffffffffu);
}

LLMCUPY_SIM_NOSAN_FN inline void on_warp_sync(Worker*, int warp, unsigned lanes) {
    if (!tls_state.active) return;
    flush(tls_state, warp, lanes);
}

LLMCUPY_SIM_NOSAN_FN inline void on_block_end(Worker* w) {
    BlockState& s = tls_state;
    if (!s.active) return;
    for (int warp = 0; warp < (w->nthreads + 31) / 32; ++warp) flush(s, warp, 0xffffffffu);
    s.active = 0;
    Launch& L = g_launch;
    lock();
    L.untracked += s.untracked;
    L.local += s.local;
    for (size_t i = 0; i < s.stats.size; ++i) {
        const SiteStats& st = s.stats.data[i];
        size_t j = 0;
        while (j < L.sites.size && !(L.sites.data[j].pc == st.pc && L.sites.data[j].kind == st.kind)) ++j;
        if (j == L.sites.size) {
            L.sites.push(st);
            continue;
        }
        SiteStats& t = L.sites.data[j];
        if (st.max_size > t.max_size) t.max_size = st.max_size;
        t.requests += st.requests;
        t.lane_accesses += st.lane_accesses;
        t.bytes += st.bytes;
        t.sectors += st.sectors;
        t.wavefronts += st.wavefronts;
        t.ideal_wavefronts += st.ideal_wavefronts;
    }
    unlock();
}

LLMCUPY_SIM_NOSAN_FN inline void on_launch_end(LaunchResult*) {
    Launch& L = g_launch;
    if (!L.active) return;
    for (size_t i = 0; i < L.buffers.size; ++i) {
        Buffer& b = L.buffers.data[i];
        size_t words = size_t((b.end - b.begin + 63) / 64);
        for (size_t k = 0; k < words; ++k) {
            L.totals.unique_read_bytes += (unsigned long long)__builtin_popcountll(b.read[k]);
            L.totals.unique_written_bytes += (unsigned long long)__builtin_popcountll(b.written[k]);
        }
        std::free(b.read);  // the bitmaps can be large; the totals are kept
        std::free(b.written);
    }
    L.buffers.size = 0;
    L.totals.untracked_global = L.untracked;
    L.totals.local_accesses = L.local;
    L.totals.sites = L.sites.size;
    L.active = 0;
}

inline const AccessObserver kObserver{&on_launch_begin, &on_block_begin, &on_access, &on_block_barrier,
                                      &on_warp_sync, &on_block_end, &on_launch_end};
struct Register {
    LLMCUPY_SIM_NOSAN_FN Register() { add_observer(&kObserver); }
};
inline Register g_register;

}  // namespace metrics
}  // namespace llmcupy_sim

// Read by sim/metrics.py after a launch with CHECK_METRICS; valid until the next launch of this library.
extern "C" LLMCUPY_SIM_EXPORT LLMCUPY_SIM_NOSAN_FN void llmcupy_sim_metrics_totals(llmcupy_sim::metrics::LaunchTotals* out) {
    *out = llmcupy_sim::metrics::g_launch.totals;
}
// The line table (see Pending): n code offsets from the library's load address `base`, sorted, and
// the source-line id that starts at each. Copied; called by sim/metrics.py before the first launch.
extern "C" LLMCUPY_SIM_EXPORT LLMCUPY_SIM_NOSAN_FN void llmcupy_sim_metrics_set_lines(
    const unsigned long long* starts, const unsigned* ids, unsigned long long n, unsigned long long base) {
    llmcupy_sim::metrics::LineTable& t = llmcupy_sim::metrics::g_lines;
    std::free(t.starts);
    std::free(t.ids);
    t.starts = static_cast<unsigned long long*>(std::malloc((n ? n : 1) * sizeof(unsigned long long)));
    t.ids = static_cast<unsigned*>(std::malloc((n ? n : 1) * sizeof(unsigned)));
    if (t.starts == nullptr || t.ids == nullptr) std::abort();
    std::memcpy(t.starts, starts, n * sizeof(unsigned long long));
    std::memcpy(t.ids, ids, n * sizeof(unsigned));
    t.base = base;
    t.n = n;
}
extern "C" LLMCUPY_SIM_EXPORT LLMCUPY_SIM_NOSAN_FN unsigned long long llmcupy_sim_metrics_sites(
    llmcupy_sim::metrics::SiteStats* out, unsigned long long capacity) {
    const auto& sites = llmcupy_sim::metrics::g_launch.sites;
    unsigned long long n = capacity < sites.size ? capacity : sites.size;
    for (unsigned long long i = 0; i < n; ++i) out[i] = sites.data[i];
    return n;
}
#endif  // LLMCUPY_SIM_ACCESS_HOOKS
