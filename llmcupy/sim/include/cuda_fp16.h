// Stand-in for <cuda_fp16.h> in the CPU emulator: __half / __half2 (IEEE binary16) with CUDA's
// conversions, arithmetic, comparisons and common intrinsics (see llmcupy_sim_half.h).
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim_half.h"

LLMCUPY_SIM_HALF_TYPE(__half, __half2, f32_to_f16, f16_to_f32, 11, -14, 15)
LLMCUPY_SIM_ROUNDED_CONVERSIONS(__half, half, 11, -14, 15, f32_to_f16)
typedef __half half;
typedef __half2 half2;
struct __half_raw { unsigned short x; };
struct __half2_raw { unsigned short x, y; };

inline __half __float2half(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }   // rounded once, not through float
inline float __half2float(__half h) { return float(h); }
inline __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
inline __half2 __float22half2_rn(float2 f) { return __half2(__half(f.x), __half(f.y)); }
inline __half2 make_half2(__half x, __half y) { return __half2(x, y); }
inline int __half2int_rn(__half h) { return __float2int_rn(float(h)); }
inline int __half2int_rz(__half h) { return __float2int_rz(float(h)); }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __short_as_half(short s) { __half h; h.__x = (unsigned short)s; return h; }
inline __half __ushort_as_half(unsigned short s) { __half h; h.__x = s; return h; }
inline __half __hmax_nan(__half a, __half b) { return (__hisnan(a) || __hisnan(b)) ? __ushort_as_half(0x7fff) : __hmax(a, b); }
inline __half __hmin_nan(__half a, __half b) { return (__hisnan(a) || __hisnan(b)) ? __ushort_as_half(0x7fff) : __hmin(a, b); }
#define CUDART_INF_FP16 __ushort_as_half((unsigned short)0x7C00U)
#define CUDART_MAX_NORMAL_FP16 __ushort_as_half((unsigned short)0x7BFFU)
#define CUDART_ZERO_FP16 __ushort_as_half((unsigned short)0x0000U)
#define CUDART_ONE_FP16 __ushort_as_half((unsigned short)0x3C00U)
#include "llmcupy_sim_nvrtc_names_on.h"
