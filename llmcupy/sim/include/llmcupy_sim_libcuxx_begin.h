// Opens a real libcu++ (CCCL) header in the CPU emulator; llmcupy_sim_libcuxx_end.h closes it. No include
// guard: every wrapper of sim/libcuxx.py includes both around the real header.
//
// libcu++ is compiled as a host C++ library here: the emulator's __CUDACC__, __CUDA_ARCH__ and __CUDACC_RTC__
// (llmcupy_sim.h) would make it take its device branches, whose inline PTX, NVVM builtins and __cvta_* calls
// g++ cannot compile. Hidden while the header is read, its templates are host code wherever a kernel
// instantiates them later (the preprocessor has already chosen the branches).
// The renames of the kernel's source (std, uint32_t, exit, ...: llmcupy_sim_nvrtc_names_off.h) are off, as in
// the emulator's other headers: libcu++ names the host's std:: in host mode.
// assert: libcu++ includes the host's <assert.h>, which would redefine assert() as the host's (an abort of
// the Python process) instead of the emulator's device assert. uint, ushort, ulong: llmcupy_sim.h's renames
// break libcu++'s tuple interface for CUDA's vector types (ushort1, ...).
// exit: libcu++'s host cuda::std::terminate() (an empty optional's value(), a bad variant access, ...) calls
// ::exit(-1), which would end the Python process; on a GPU it is __trap(), a failed launch.
// LLMCUPY_SIM_NVRTC_HAS_STDINT: what the libcu++ headers included inside say is dropped at the end; the
// wrapper says what its header declares under NVRTC (sim/libcuxx.py, _WITHOUT_STDINT).
// libcu++ includes <math.h>: libstdc++'s would put std::abs, ... in the global namespace, next to CUDA's
// abs(float), ... of llmcupy_sim.h ("conflicts with a previous declaration"); _GLIBCXX_INCLUDE_NEXT_C_HEADERS
// takes the C library's <math.h> alone, as libstdc++'s <cmath> does.
// The host's own headers that libcu++ includes in host mode (<cstdint>, <cmath>, <atomic>, ...) are allowed
// inside (LLMCUPY_SIM_HOST_HEADERS); most are already included by llmcupy_sim.h, so their macros, which the
// emulator #undef-s where the kernel's source starts, are not defined again by them (the wrappers of
// cuda/std/cfloat, climits, cstdint and cmath define them, as NVRTC's do).
#include "llmcupy_sim_nvrtc_names_off.h"
#include "llmcupy_sim.h"
#pragma push_macro("__CUDACC__")
#pragma push_macro("__CUDA_ARCH__")
#pragma push_macro("__CUDACC_RTC__")
#pragma push_macro("__CUDACC_VER_MAJOR__")
#pragma push_macro("__CUDACC_VER_MINOR__")
#pragma push_macro("__CUDACC_VER_BUILD__")
#pragma push_macro("CUDART_VERSION")
#pragma push_macro("__CUDART_API_VERSION")
#pragma push_macro("__CUDA_ARCH_LIST__")
#pragma push_macro("assert")
#pragma push_macro("uint")
#pragma push_macro("ushort")
#pragma push_macro("ulong")
#pragma push_macro("exit")
#pragma push_macro("LLMCUPY_SIM_HOST_HEADERS")
#pragma push_macro("_GLIBCXX_INCLUDE_NEXT_C_HEADERS")
#pragma push_macro("LLMCUPY_SIM_NVRTC_HAS_STDINT")
#undef __CUDACC__
#undef __CUDA_ARCH__
#undef __CUDACC_RTC__
#undef __CUDACC_VER_MAJOR__
#undef __CUDACC_VER_MINOR__
// the toolkit's version as a host compile without one sees it (libcu++ reads CUDART_VERSION for the CUDA toolkit
// whose runtime API it may call; the emulator has only the few functions of llmcupy_sim_libcuxx_cudart.h)
#undef __CUDACC_VER_BUILD__
#undef CUDART_VERSION
#undef __CUDART_API_VERSION
#undef __CUDA_ARCH_LIST__
#undef uint
#undef ushort
#undef ulong
#define exit(status) llmcupy_sim::device_trap(__FILE__, __LINE__)
#define LLMCUPY_SIM_HOST_HEADERS 1
#define _GLIBCXX_INCLUDE_NEXT_C_HEADERS 1
// The CUDA runtime's functions libcu++'s host code calls (llmcupy_sim_libcuxx_cudart.h) have other names, which the
// kernel's source does not reach: NVRTC has none of them ("identifier is undefined")
#pragma push_macro("cudaGetLastError")
#define cudaGetLastError llmcupy_sim_libcuxx_cudaGetLastError
#pragma push_macro("cudaPeekAtLastError")
#define cudaPeekAtLastError llmcupy_sim_libcuxx_cudaPeekAtLastError
#pragma push_macro("cudaGetErrorString")
#define cudaGetErrorString llmcupy_sim_libcuxx_cudaGetErrorString
#pragma push_macro("cudaGetErrorName")
#define cudaGetErrorName llmcupy_sim_libcuxx_cudaGetErrorName
#pragma push_macro("cudaGetSymbolAddress")
#define cudaGetSymbolAddress llmcupy_sim_libcuxx_cudaGetSymbolAddress
#include "llmcupy_sim_libcuxx_cudart.h"
// long double: under NVRTC (a CUDA compiler) libcu++ has none (_CCCL_HAS_LONG_DOUBLE() 0: no
// numeric_limits<long double> specialisation, no long double overloads), read as host code it has one. The
// emulator reads libcu++'s configuration first and turns it off, so a kernel meets what NVRTC gives it
// ('numeric_limits<long double>' has no member 'max').
#if !defined(LLMCUPY_SIM_LIBCUXX_NO_LONG_DOUBLE) && __has_include(<cuda/std/__cccl/extended_data_types.h>)
#define LLMCUPY_SIM_LIBCUXX_NO_LONG_DOUBLE 1
#include <cuda/std/__cccl/extended_data_types.h>
#undef _CCCL_HAS_LONG_DOUBLE
#define _CCCL_HAS_LONG_DOUBLE() 0
#endif
// libcu++'s host atomics call GCC's __atomic builtins, which never yield: inside its headers they go through
// llmcupy_sim.h's libcuxx_atomic_* instead, so a spin on a cuda::atomic_ref lets the other threads run
#pragma push_macro("__atomic_load")
#define __atomic_load(a, ret, order) ::llmcupy_sim::libcuxx_atomic_load(a, ret, order)
#pragma push_macro("__atomic_compare_exchange")
#define __atomic_compare_exchange(a, expected, desired, weak, success, failure) \
    ::llmcupy_sim::libcuxx_atomic_compare_exchange(a, expected, desired, weak, success, failure)
#pragma push_macro("__atomic_exchange")
#define __atomic_exchange(a, value, ret, order) ::llmcupy_sim::libcuxx_atomic_exchange(a, value, ret, order)
#pragma push_macro("__atomic_fetch_add")
#define __atomic_fetch_add(a, v, order) ::llmcupy_sim::libcuxx_atomic_fetch_add(a, v, order)
#pragma push_macro("__atomic_fetch_sub")
#define __atomic_fetch_sub(a, v, order) ::llmcupy_sim::libcuxx_atomic_fetch_sub(a, v, order)
#pragma push_macro("__atomic_fetch_or")
#define __atomic_fetch_or(a, v, order) ::llmcupy_sim::libcuxx_atomic_fetch_or(a, v, order)
#pragma push_macro("__atomic_fetch_xor")
#define __atomic_fetch_xor(a, v, order) ::llmcupy_sim::libcuxx_atomic_fetch_xor(a, v, order)
