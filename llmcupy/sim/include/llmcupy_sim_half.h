// The emulator's 16-bit floating-point types, shared by cuda_fp16.h (__half, IEEE binary16) and
// cuda_bf16.h (__nv_bfloat16): 16-bit storage, conversions rounding to nearest even, and
// arithmetic done in float then rounded back, which for one +, -, *, / or fma is what the GPU's
// 16-bit instructions give (float holds the exact result's rounding information).
#pragma once
#include "llmcupy_sim.h"

namespace llmcupy_sim {
inline unsigned short f32_to_f16(float f) {
    _Float16 h = (_Float16)f;  // GCC: correctly rounded, NaN and infinities kept
    unsigned short b;
    std::memcpy(&b, &h, 2);
    return b;
}
inline float f16_to_f32(unsigned short b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return float(h);
}
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
