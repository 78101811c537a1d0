// The emulator's 16-bit floating-point types, shared by cuda_fp16.h (__half, IEEE binary16) and
// cuda_bf16.h (__nv_bfloat16): 16-bit storage, conversions rounding to nearest even, and
// arithmetic done in float then rounded back, which for one +, -, *, / or fma is what the GPU's
// 16-bit instructions give (float holds the exact result's rounding information).
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim.h"

namespace llmcupy_sim {
// The compiler's _Float16 where it has one (__FLT16_MANT_DIG__: GCC 12+ on x86-64, GCC and clang on
// aarch64, clang 15+ on x86-64); elsewhere (clang 14 on x86-64, GCC 11) the same conversions in
// integer arithmetic. LLMCUPY_SIM_SOFT_HALF picks the latter anywhere (the tests compare both).
#if defined(__FLT16_MANT_DIG__) && !defined(LLMCUPY_SIM_SOFT_HALF)
inline unsigned short f32_to_f16(float f) {
    _Float16 h = (_Float16)f;  // correctly rounded, NaN and infinities kept
    unsigned short b;
    std::memcpy(&b, &h, 2);
    return b;
}
inline float f16_to_f32(unsigned short b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return float(h);
}
#else
inline unsigned short f32_to_f16(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
    unsigned int a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | (unsigned short)((a >> 13) & 0x3ffu);  // NaN, made quiet
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to infinity
    if (a >= 0x38800000u) {                        // a normal half (2^-14 and up): rebias the exponent
        unsigned int r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);            // round to nearest even (a carry moves the exponent)
        return sign | (unsigned short)(r >> 13);
    }
    // a subnormal half or zero: the significand in units of 2^-24, rounded to nearest even
    unsigned int shift = 126u - (a >> 23);
    if (shift > 24u) return sign;                  // below 2^-25: zero
    unsigned int m = (a & 0x7fffffu) | 0x800000u, q = m >> shift;
    unsigned int rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;   // 1024 is the smallest normal: still right
    return sign | (unsigned short)q;
}
inline float f16_to_f32(unsigned short b) {
    unsigned int sign = (unsigned int)(b & 0x8000u) << 16, e = (b >> 10) & 0x1fu, m = b & 0x3ffu, u;
    if (e == 0x1fu) u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);  // infinity, NaN (quiet)
    else if (e != 0) u = sign | ((e + 112u) << 23) | (m << 13);
    else {
        float f = float(m) * 0x1p-24f;             // zero or a subnormal half: exact in float
        return sign ? -f : f;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
#endif
inline unsigned short f32_to_bf16(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return (unsigned short)(u >> 16);
}
inline float bf16_to_f32(unsigned short b) {
    unsigned int u = (unsigned int)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
}  // namespace llmcupy_sim

#define LLMCUPY_SIM_HALF_TYPE(T, T2, TO, FROM)                                                          \
    struct alignas(2) T {                                                                              \
        unsigned short __x;                                                                            \
        T() = default;                                                                                 \
        T(float f) : __x(llmcupy_sim::TO(f)) {}                                                        \
        T(double f) : __x(llmcupy_sim::TO(float(f))) {}                                                \
        T(int i) : __x(llmcupy_sim::TO(float(i))) {}                                                   \
        T(unsigned int i) : __x(llmcupy_sim::TO(float(i))) {}                                          \
        T(long long i) : __x(llmcupy_sim::TO(float(i))) {}                                             \
        T(unsigned long long i) : __x(llmcupy_sim::TO(float(i))) {}                                    \
        T(short i) : __x(llmcupy_sim::TO(float(i))) {}                                                 \
        T(unsigned short i) : __x(llmcupy_sim::TO(float(i))) {}                                        \
        operator float() const { return llmcupy_sim::FROM(__x); }                                      \
        T& operator=(float f) { __x = llmcupy_sim::TO(f); return *this; }                              \
        T& operator+=(T o) { *this = T(float(*this) + float(o)); return *this; }                      \
        T& operator-=(T o) { *this = T(float(*this) - float(o)); return *this; }                      \
        T& operator*=(T o) { *this = T(float(*this) * float(o)); return *this; }                      \
        T& operator/=(T o) { *this = T(float(*this) / float(o)); return *this; }                      \
    };                                                                                                 \
    struct alignas(4) T2 {                                                                             \
        T x, y;                                                                                        \
        T2() = default;                                                                                \
        T2(T a, T b) : x(a), y(b) {}                                                                   \
        T2& operator+=(T2 o) { x += o.x; y += o.y; return *this; }                                     \
        T2& operator*=(T2 o) { x *= o.x; y *= o.y; return *this; }                                     \
    };                                                                                                 \
    inline T operator+(T a, T b) { return T(float(a) + float(b)); }                                    \
    inline T operator-(T a, T b) { return T(float(a) - float(b)); }                                    \
    inline T operator*(T a, T b) { return T(float(a) * float(b)); }                                    \
    inline T operator/(T a, T b) { return T(float(a) / float(b)); }                                    \
    inline T operator-(T a) { T r = a; r.__x ^= 0x8000u; return r; }                                   \
    inline T operator+(T a) { return a; }                                                              \
    inline bool operator==(T a, T b) { return float(a) == float(b); }                                  \
    inline bool operator!=(T a, T b) { return float(a) != float(b); }                                  \
    inline bool operator<(T a, T b) { return float(a) < float(b); }                                    \
    inline bool operator>(T a, T b) { return float(a) > float(b); }                                    \
    inline bool operator<=(T a, T b) { return float(a) <= float(b); }                                  \
    inline bool operator>=(T a, T b) { return float(a) >= float(b); }                                  \
    inline T2 operator+(T2 a, T2 b) { return T2(a.x + b.x, a.y + b.y); }                               \
    inline T2 operator-(T2 a, T2 b) { return T2(a.x - b.x, a.y - b.y); }                               \
    inline T2 operator*(T2 a, T2 b) { return T2(a.x * b.x, a.y * b.y); }                               \
    inline T2 operator/(T2 a, T2 b) { return T2(a.x / b.x, a.y / b.y); }                               \
    inline T __hadd(T a, T b) { return a + b; }                                                        \
    inline T __hsub(T a, T b) { return a - b; }                                                        \
    inline T __hmul(T a, T b) { return a * b; }                                                        \
    inline T __hdiv(T a, T b) { return a / b; }                                                        \
    inline T __hneg(T a) { return -a; }                                                                \
    inline T __habs(T a) { T r = a; r.__x &= 0x7fffu; return r; }                                      \
    inline T __hfma(T a, T b, T c) { return T(std::fma(float(a), float(b), float(c))); }               \
    inline T __hmax(T a, T b) { return T(std::fmax(float(a), float(b))); }                             \
    inline T __hmin(T a, T b) { return T(std::fmin(float(a), float(b))); }                             \
    inline bool __heq(T a, T b) { return a == b; }                                                     \
    inline bool __hne(T a, T b) { return a != b; }                                                     \
    inline bool __hlt(T a, T b) { return a < b; }                                                      \
    inline bool __hle(T a, T b) { return a <= b; }                                                     \
    inline bool __hgt(T a, T b) { return a > b; }                                                      \
    inline bool __hge(T a, T b) { return a >= b; }                                                     \
    inline bool __hisnan(T a) { return std::isnan(float(a)); }                                        \
    inline int __hisinf(T a) { float f = float(a); return std::isinf(f) ? (f > 0 ? 1 : -1) : 0; }      \
    inline T2 __hadd2(T2 a, T2 b) { return a + b; }                                                    \
    inline T2 __hsub2(T2 a, T2 b) { return a - b; }                                                    \
    inline T2 __hmul2(T2 a, T2 b) { return a * b; }                                                    \
    inline T2 __h2div(T2 a, T2 b) { return a / b; }                                                    \
    inline T2 __hfma2(T2 a, T2 b, T2 c) { return T2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }   \
    inline T2 __hmax2(T2 a, T2 b) { return T2(__hmax(a.x, b.x), __hmax(a.y, b.y)); }                   \
    inline T2 __hmin2(T2 a, T2 b) { return T2(__hmin(a.x, b.x), __hmin(a.y, b.y)); }                   \
    inline T2 __hneg2(T2 a) { return T2(-a.x, -a.y); }                                                 \
    inline T2 __habs2(T2 a) { return T2(__habs(a.x), __habs(a.y)); }                                   \
    inline float __low2float(T2 a) { return float(a.x); }                                              \
    inline float __high2float(T2 a) { return float(a.y); }                                             \
    inline T __low2half(T2 a) { return a.x; }                                                          \
    inline T __high2half(T2 a) { return a.y; }                                                         \
    inline T2 __halves2half2(T a, T b) { return T2(a, b); }                                            \
    inline T2 __half2half2(T a) { return T2(a, a); }                                                   \
    inline T2 __lowhigh2highlow(T2 a) { return T2(a.y, a.x); }                                         \
    inline float2 __half22float2(T2 a) { return make_float2(float(a.x), float(a.y)); }                 \
    inline T hexp(T a) { return T(std::exp(float(a))); }                                               \
    inline T hexp2(T a) { return T(std::exp2(float(a))); }                                             \
    inline T hlog(T a) { return T(std::log(float(a))); }                                               \
    inline T hlog2(T a) { return T(std::log2(float(a))); }                                             \
    inline T hsqrt(T a) { return T(std::sqrt(float(a))); }                                             \
    inline T hrsqrt(T a) { return T(1.0f / std::sqrt(float(a))); }                                    \
    inline T hrcp(T a) { return T(1.0f / float(a)); }                                                  \
    inline T hsin(T a) { return T(std::sin(float(a))); }                                               \
    inline T hcos(T a) { return T(std::cos(float(a))); }                                               \
    inline T htanh(T a) { return T(std::tanh(float(a))); }                                             \
    inline T hfloor(T a) { return T(std::floor(float(a))); }                                           \
    inline T hceil(T a) { return T(std::ceil(float(a))); }                                             \
    inline T htrunc(T a) { return T(std::trunc(float(a))); }                                           \
    inline T hrint(T a) { return T(std::nearbyint(float(a))); }                                        \
    inline T2 h2exp(T2 a) { return T2(hexp(a.x), hexp(a.y)); }                                         \
    inline T2 h2sqrt(T2 a) { return T2(hsqrt(a.x), hsqrt(a.y)); }                                     \
    /* spelt in the kernel's exported signature, so a launch can check an argument's dtype */          \
    namespace llmcupy_sim {                                                                            \
    template <> struct type_name<T> { static const char* get() { return #T; } };                       \
    template <> struct type_name<T2> { static const char* get() { return #T2; } };                     \
    template <> struct shuffle_value<T> : std::true_type {};                                           \
    template <> struct shuffle_value<T2> : std::true_type {};                                          \
    }
#include "llmcupy_sim_nvrtc_names_on.h"
