// Closes a real libcu++ header in the CPU emulator: what llmcupy_sim_libcuxx_begin.h hid comes back.
#pragma pop_macro("__CUDACC__")
#pragma pop_macro("__CUDA_ARCH__")
#pragma pop_macro("__CUDACC_RTC__")
#pragma pop_macro("__CUDACC_VER_MAJOR__")
#pragma pop_macro("__CUDACC_VER_MINOR__")
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
