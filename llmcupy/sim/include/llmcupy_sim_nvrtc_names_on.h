// The end of llmcupy_sim_nvrtc_names_off.h's span: the renames of the kernel's source are back, less the names a
// header included so far declares under NVRTC as well. No include guard: every header includes it.
#pragma pop_macro("islessgreater")
#pragma pop_macro("islessequal")
#pragma pop_macro("isless")
#pragma pop_macro("isgreaterequal")
#pragma pop_macro("isgreater")
#pragma pop_macro("FP_NORMAL")
#pragma pop_macro("FP_SUBNORMAL")
#pragma pop_macro("FP_ZERO")
#pragma pop_macro("FP_INFINITE")
#pragma pop_macro("FP_NAN")
#pragma pop_macro("stdin")
#pragma pop_macro("realloc")
#pragma pop_macro("calloc")
#pragma pop_macro("memcmp")
#pragma pop_macro("strlen")
#pragma pop_macro("strcmp")
#pragma pop_macro("strncpy")
#pragma pop_macro("strcpy")
#pragma pop_macro("qsort")
#pragma pop_macro("getenv")
#pragma pop_macro("strtol")
#pragma pop_macro("atof")
#pragma pop_macro("atoi")
#pragma pop_macro("fflush")
#pragma pop_macro("fopen")
#pragma pop_macro("stdout")
#pragma pop_macro("stderr")
#pragma pop_macro("snprintf")
#pragma pop_macro("sprintf")
#pragma pop_macro("fprintf")
#pragma pop_macro("putchar")
#pragma pop_macro("puts")
#pragma pop_macro("time")
#pragma pop_macro("srand")
#pragma pop_macro("rand")
#pragma pop_macro("atexit")
#pragma pop_macro("abort")
#pragma pop_macro("exit")
#pragma pop_macro("uintptr_t")
#pragma pop_macro("intptr_t")
#pragma pop_macro("uintmax_t")
#pragma pop_macro("intmax_t")
#pragma pop_macro("uint_fast64_t")
#pragma pop_macro("uint_fast32_t")
#pragma pop_macro("uint_fast16_t")
#pragma pop_macro("uint_fast8_t")
#pragma pop_macro("uint_least64_t")
#pragma pop_macro("uint_least32_t")
#pragma pop_macro("uint_least16_t")
#pragma pop_macro("uint_least8_t")
#pragma pop_macro("uint64_t")
#pragma pop_macro("uint32_t")
#pragma pop_macro("uint16_t")
#pragma pop_macro("uint8_t")
#pragma pop_macro("int_fast64_t")
#pragma pop_macro("int_fast32_t")
#pragma pop_macro("int_fast16_t")
#pragma pop_macro("int_fast8_t")
#pragma pop_macro("int_least64_t")
#pragma pop_macro("int_least32_t")
#pragma pop_macro("int_least16_t")
#pragma pop_macro("int_least8_t")
#pragma pop_macro("int64_t")
#pragma pop_macro("int32_t")
#pragma pop_macro("int16_t")
#pragma pop_macro("int8_t")
#pragma pop_macro("std")
// <cstdint>'s types: NVRTC's <cuda/std/cstdint> declares them, and each libcu++ header that includes it
// (cuda/std/cstdint sets LLMCUPY_SIM_NVRTC_HAS_STDINT), and <cooperative_groups.h> under NVRTC 12.9 and 13.5
#ifdef LLMCUPY_SIM_NVRTC_HAS_STDINT
#undef int8_t
#undef int16_t
#undef int32_t
#undef int64_t
#undef int_least8_t
#undef int_least16_t
#undef int_least32_t
#undef int_least64_t
#undef int_fast8_t
#undef int_fast16_t
#undef int_fast32_t
#undef int_fast64_t
#undef uint8_t
#undef uint16_t
#undef uint32_t
#undef uint64_t
#undef uint_least8_t
#undef uint_least16_t
#undef uint_least32_t
#undef uint_least64_t
#undef uint_fast8_t
#undef uint_fast16_t
#undef uint_fast32_t
#undef uint_fast64_t
#undef intmax_t
#undef uintmax_t
#undef intptr_t
#undef uintptr_t
#endif
// NVRTC's <cuda_pipeline.h> declares these four (and <cooperative_groups/memcpy_async.h> under 12.4, which
// includes it there)
#ifdef LLMCUPY_SIM_NVRTC_HAS_PIPELINE_INTEGERS
#undef uint16_t
#undef uint32_t
#undef uint64_t
#undef uintptr_t
#endif
// FP_NAN, FP_INFINITE, FP_ZERO, FP_SUBNORMAL and FP_NORMAL: libcu++'s <cuda/std/cmath> defines them under NVRTC
// (and <cuda/std/complex>, <cuda/cmath>, CUB's reductions, which include it), with glibc's values
#ifdef LLMCUPY_SIM_NVRTC_HAS_FP_CATEGORIES
#undef FP_NAN
#define FP_NAN 0
#undef FP_INFINITE
#define FP_INFINITE 1
#undef FP_ZERO
#define FP_ZERO 2
#undef FP_SUBNORMAL
#define FP_SUBNORMAL 3
#undef FP_NORMAL
#define FP_NORMAL 4
#endif
// the outermost header closes: the kernel's predefined macros again (llmcupy_sim_nvrtc_names_off.h)
#ifdef LLMCUPY_SIM_KERNEL_MACROS
#pragma pop_macro("LLMCUPY_SIM_HEADER_DEPTH")
#ifndef LLMCUPY_SIM_HEADER_DEPTH
#include LLMCUPY_SIM_KERNEL_MACROS
#endif
#endif
