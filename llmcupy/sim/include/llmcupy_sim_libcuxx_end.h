// Closes a real libcu++ header in the CPU emulator: what llmcupy_sim_libcuxx_begin.h hid comes back.
#pragma pop_macro("__CUDACC__")
#pragma pop_macro("__CUDA_ARCH__")
#pragma pop_macro("__CUDACC_RTC__")
#pragma pop_macro("__CUDACC_VER_MAJOR__")
#pragma pop_macro("__CUDACC_VER_MINOR__")
#pragma pop_macro("__CUDACC_VER_BUILD__")
#pragma pop_macro("CUDART_VERSION")
#pragma pop_macro("__CUDART_API_VERSION")
#pragma pop_macro("__CUDA_ARCH_LIST__")
#pragma pop_macro("assert")
#pragma pop_macro("uint")
#pragma pop_macro("ushort")
#pragma pop_macro("ulong")
#pragma pop_macro("exit")
#pragma pop_macro("LLMCUPY_SIM_HOST_HEADERS")
#pragma pop_macro("_GLIBCXX_INCLUDE_NEXT_C_HEADERS")
#pragma pop_macro("LLMCUPY_SIM_NVRTC_HAS_STDINT")
#pragma pop_macro("cudaGetLastError")
#pragma pop_macro("cudaPeekAtLastError")
#pragma pop_macro("cudaGetErrorString")
#pragma pop_macro("cudaGetErrorName")
#pragma pop_macro("cudaGetSymbolAddress")
#pragma pop_macro("__atomic_load")
#pragma pop_macro("__atomic_compare_exchange")
#pragma pop_macro("__atomic_exchange")
#pragma pop_macro("__atomic_fetch_add")
#pragma pop_macro("__atomic_fetch_sub")
#pragma pop_macro("__atomic_fetch_or")
#pragma pop_macro("__atomic_fetch_xor")
// `std` in the kernel's source is __llmcupy_sim_nvrtc_std (llmcupy_sim_nvrtc_names.h), so its cuda::std is
// cuda::__llmcupy_sim_nvrtc_std: here the real one (the stand-ins alias it to the host's std instead)
#ifndef LLMCUPY_SIM_LIBCUXX_ALIASED
#define LLMCUPY_SIM_LIBCUXX_ALIASED 1
// (declared here too: nv/target, read first, opens no namespace)
namespace cuda { namespace std {} namespace __llmcupy_sim_nvrtc_std = ::cuda::std; }
#endif
// libcu++ declares std::tuple_size and std::tuple_element (for structured bindings) where it declares its
// tuple-like types: in NVRTC's std, so in the kernel's here (the host's std has them from <utility>)
#if defined(_LIBCUDACXX___TUPLE_STRUCTURED_BINDINGS_H) && !defined(LLMCUPY_SIM_LIBCUXX_TUPLE_SIZE)
#define LLMCUPY_SIM_LIBCUXX_TUPLE_SIZE 1
namespace __llmcupy_sim_nvrtc_std { using ::std::tuple_size; using ::std::tuple_element; }
#endif
// The wrapper goes on with what NVRTC's header defines besides (the C library's macros, uint32_t, ...) and then
// llmcupy_sim_nvrtc_names_on.h.
// libcu++'s FP_NAN, FP_INFINITE, ... are defined under NVRTC where its fpclassify is (<cuda/std/cmath>, <cuda/cmath>,
// ...): llmcupy_sim_nvrtc_names_on.h defines them once this is set, and a kernel reads no more of glibc's
#if defined(_LIBCUDACXX___CMATH_FPCLASSIFY_H) && !defined(LLMCUPY_SIM_NVRTC_HAS_FP_CATEGORIES)
#define LLMCUPY_SIM_NVRTC_HAS_FP_CATEGORIES 1
#endif
// The kernel's isgreater, ... are llmcupy_nvrtc_no_NAME (NVRTC has no C comparison macros), its cuda::std::isgreater
// too: libcu++'s under that name, where it declares them
#if defined(_LIBCUDACXX___CMATH_TRAITS_H) && !defined(LLMCUPY_SIM_LIBCUXX_COMPARISONS)
#define LLMCUPY_SIM_LIBCUXX_COMPARISONS 1
namespace cuda { namespace std {
template <class A, class B> inline auto llmcupy_nvrtc_no_isgreater(A x, B y) -> decltype(::cuda::std::isgreater(x, y)) { return ::cuda::std::isgreater(x, y); }
template <class A, class B> inline auto llmcupy_nvrtc_no_isgreaterequal(A x, B y) -> decltype(::cuda::std::isgreaterequal(x, y)) { return ::cuda::std::isgreaterequal(x, y); }
template <class A, class B> inline auto llmcupy_nvrtc_no_isless(A x, B y) -> decltype(::cuda::std::isless(x, y)) { return ::cuda::std::isless(x, y); }
template <class A, class B> inline auto llmcupy_nvrtc_no_islessequal(A x, B y) -> decltype(::cuda::std::islessequal(x, y)) { return ::cuda::std::islessequal(x, y); }
template <class A, class B> inline auto llmcupy_nvrtc_no_islessgreater(A x, B y) -> decltype(::cuda::std::islessgreater(x, y)) { return ::cuda::std::islessgreater(x, y); }
} }
#endif
