// Stand-in for <cuda_bf16.h> in the CPU emulator: __nv_bfloat16 / __nv_bfloat162 with CUDA's
// conversions, arithmetic, comparisons and common intrinsics (see llmcupy_sim_half.h).
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim_half.h"

LLMCUPY_SIM_HALF_TYPE(__nv_bfloat16, __nv_bfloat162, f32_to_bf16, bf16_to_f32, 8, -126, 127)
LLMCUPY_SIM_ROUNDED_CONVERSIONS(__nv_bfloat16, bfloat16, 8, -126, 127, f32_to_bf16)
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;
struct __nv_bfloat16_raw { unsigned short x; };

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }   // rounded once, not through float
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return __nv_bfloat162(__nv_bfloat16(f), __nv_bfloat16(f)); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b)); }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __nv_bfloat162(__nv_bfloat16(f.x), __nv_bfloat16(f.y)); }
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return __nv_bfloat162(x, y); }
inline float2 __bfloat1622float2(__nv_bfloat162 b) { return make_float2(float(b.x), float(b.y)); }
inline int __bfloat162int_rn(__nv_bfloat16 b) { return __float2int_rn(float(b)); }
inline short __bfloat16_as_short(__nv_bfloat16 b) { return (short)b.__x; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __short_as_bfloat16(short s) { __nv_bfloat16 b; b.__x = (unsigned short)s; return b; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short s) { __nv_bfloat16 b; b.__x = s; return b; }
#include "llmcupy_sim_nvrtc_names_on.h"
