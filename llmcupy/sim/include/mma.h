// Stand-in for <mma.h> (nvcuda::wmma) in the CPU emulator: the TF32 tensor-core shape m16n16k8
// with FP32 accumulators, as warp collectives.
//
// A fragment's element-to-lane mapping is unspecified in CUDA (a kernel may only apply the same
// operation to every element, e.g. TF32 rounding); here lane L holds elements L*n .. L*n + n - 1
// of the tile in row-major order (n = num_elements). load_matrix_sync / store_matrix_sync /
// fill_fragment touch only the lane's own elements, so they need no exchange, but they are warp
// collectives in CUDA and are modelled as such (__syncwarp: all 32 lanes must arrive). mma_sync
// gathers every lane's A and B elements (one 32-byte exchange) and computes its own accumulators.
//
// Rounding, as the hardware does it: __float_to_tf32 rounds to the nearest TF32 value (10-bit
// mantissa, ties away from zero: cvt.rna.tf32.f32); mma_sync reads only the TF32 bits of its
// inputs (the low 13 mantissa bits of an unrounded input are ignored, i.e. truncated) and
// accumulates in FP32, over k in order (the GPU's summation order inside an MMA is not IEEE-
// specified; results agree to FP32 rounding).
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim.h"

#pragma push_macro("LLMCUPY_SIM_HOST_HEADERS")  // the host's own header, not the user's (HOST_HEADERS in sim/compiler.py)
#define LLMCUPY_SIM_HOST_HEADERS 1
#include <cstdint>
#include <cstring>
#pragma pop_macro("LLMCUPY_SIM_HOST_HEADERS")

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <typename Use, int M, int N, int K> struct tile;
template <int M, int N, int K> struct tile<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct tile<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct tile<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };

inline float tf32_truncate(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u &= 0xFFFFE000u;
    std::memcpy(&x, &u, 4);
    return x;
}
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
    static_assert(M == 16 && N == 16 && K == 8,
                  "the emulator implements the TF32 shape m16n16k8 only (add others in sim/include/mma.h)");

  public:
    using tile = detail::tile<Use, M, N, K>;
    static constexpr int num_elements = tile::rows * tile::cols / 32;
    float x[num_elements];
};

inline float __float_to_tf32(float in) {
    uint32_t u;
    std::memcpy(&u, &in, 4);
    if ((u & 0x7F800000u) != 0x7F800000u) {  // finite: round half away from zero at bit 13
        u = (u + 0x1000u) & 0xFFFFE000u;
    }
    std::memcpy(&in, &u, 4);
    return in;
}

namespace detail {
template <typename Frag>
inline void rc(int lane, int e, int& r, int& c) {
    int f = lane * Frag::num_elements + e;
    r = f / Frag::tile::cols;
    c = f % Frag::tile::cols;
}

template <typename Frag>
inline void load(Frag& a, const float* p, unsigned ldm, bool col, int line) {
    __syncwarp(0xffffffffu, line);
    int lane = llmcupy_sim::current_lane();
    for (int e = 0; e < Frag::num_elements; e++) {
        int r, c;
        rc<Frag>(lane, e, r, c);
        a.x[e] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}
}  // namespace detail

template <typename T>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 8, precision::tf32, row_major>& a, const T* p, unsigned ldm,
                             int line = __builtin_LINE()) {
    detail::load(a, p, ldm, false, line);
}
template <typename T>
inline void load_matrix_sync(fragment<matrix_a, 16, 16, 8, precision::tf32, col_major>& a, const T* p, unsigned ldm,
                             int line = __builtin_LINE()) {
    detail::load(a, p, ldm, true, line);
}
template <typename T>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 8, precision::tf32, row_major>& b, const T* p, unsigned ldm,
                             int line = __builtin_LINE()) {
    detail::load(b, p, ldm, false, line);
}
template <typename T>
inline void load_matrix_sync(fragment<matrix_b, 16, 16, 8, precision::tf32, col_major>& b, const T* p, unsigned ldm,
                             int line = __builtin_LINE()) {
    detail::load(b, p, ldm, true, line);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 8, float>& c, const float* p, unsigned ldm, layout_t layout,
                             int line = __builtin_LINE()) {
    detail::load(c, p, ldm, layout == mem_col_major, line);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 8, float>& c, unsigned ldm,
                              layout_t layout, int line = __builtin_LINE()) {
    __syncwarp(0xffffffffu, line);
    int lane = llmcupy_sim::current_lane();
    for (int e = 0; e < c.num_elements; e++) {
        int r, col;
        detail::rc<fragment<accumulator, 16, 16, 8, float>>(lane, e, r, col);
        if (layout == mem_col_major) p[(size_t)col * ldm + r] = c.x[e];
        else p[(size_t)r * ldm + col] = c.x[e];
    }
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float v, int line = __builtin_LINE()) {
    __syncwarp(0xffffffffu, line);
    for (int e = 0; e < f.num_elements; e++) f.x[e] = v;
}

template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 8, float>& d, const fragment<matrix_a, 16, 16, 8, precision::tf32, LA>& a,
                     const fragment<matrix_b, 16, 16, 8, precision::tf32, LB>& b,
                     const fragment<accumulator, 16, 16, 8, float>& c, int line = __builtin_LINE()) {
    float post[8];
    for (int e = 0; e < 4; e++) {
        post[e] = a.x[e];
        post[4 + e] = b.x[e];
    }
    const auto& g = llmcupy_sim::warp_exchange(0xffffffffu, post, sizeof(post), line, "wmma::mma_sync");
    int lane = llmcupy_sim::current_lane();
    float A[16][8], B[8][16];
    for (int src = 0; src < 32; src++) {
        float v[8];
        if (!(g.valid & (1u << src))) {  // a lane that exited: CUDA's result is undefined
            llmcupy_sim::tls_worker->counters.exited_lane_reads++;
            std::memset(v, 0, sizeof(v));
        } else {
            std::memcpy(v, g.value[src], sizeof(v));
        }
        for (int e = 0; e < 4; e++) {
            int f = src * 4 + e;
            A[f / 8][f % 8] = detail::tf32_truncate(v[e]);
            B[f / 16][f % 16] = detail::tf32_truncate(v[4 + e]);
        }
    }
    float out[8];
    for (int e = 0; e < 8; e++) {
        int r, col;
        detail::rc<fragment<accumulator, 16, 16, 8, float>>(lane, e, r, col);
        float s = c.x[e];
        for (int k = 0; k < 8; k++) s = fmaf(A[r][k], B[k][col], s);
        out[e] = s;
    }
    for (int e = 0; e < 8; e++) d.x[e] = out[e];
}

}  // namespace wmma
}  // namespace nvcuda
#include "llmcupy_sim_nvrtc_names_on.h"
