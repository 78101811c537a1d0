// The few CUDA runtime API names libcu++'s host code refers to (cuda::get_device_address, the cuda_error
// reporting of <cuda/functional>, cuda::annotated_ptr's access properties): libcu++ takes the emulator's
// <cuda_runtime_api.h> for a CUDA toolkit and then expects them. The emulator's device memory is the
// process's memory, so a symbol's device address is its address; it has no cache to give hints to. The functions
// are renamed while libcu++ is read (llmcupy_sim_libcuxx_begin.h). The types they take and return (cudaError_t,
// cudaAccessProperty) NVRTC declares in every kernel: llmcupy_sim_cudart_types.h, which llmcupy_sim.h includes.
#pragma once
#include "llmcupy_sim_cudart_types.h"
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "invalid argument"; }
inline const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorInvalidValue"; }
inline cudaError_t cudaGetSymbolAddress(void** address, const void* symbol) { *address = const_cast<void*>(symbol); return cudaSuccess; }
template <class T>
inline cudaError_t cudaGetSymbolAddress(void** address, const T& symbol) { *address = (void*)&symbol; return cudaSuccess; }
// libcu++'s host code compares with ::isgreater, ..., which libstdc++'s <math.h> would declare (the C macros made
// functions) and its <cmath> leaves undeclared; _GLIBCXX_INCLUDE_NEXT_C_HEADERS (llmcupy_sim_libcuxx_begin.h) keeps
// that <math.h> out, so they are declared here. NVRTC has none of them in the global namespace: a kernel that
// calls one bare compiles here only (cuda::std::isgreater compiles on both).
using ::std::isgreater;
using ::std::isgreaterequal;
using ::std::isless;
using ::std::islessequal;
using ::std::islessgreater;
