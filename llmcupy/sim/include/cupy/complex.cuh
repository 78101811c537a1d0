// Stand-in for CuPy's <cupy/complex.cuh> in the CPU emulator: complex<T> (as in CuPy's kernels,
// also thrust::complex) is the host's std::complex, with the same operators and functions.
#pragma once
#include "../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "../llmcupy_sim.h"
#pragma push_macro("LLMCUPY_SIM_HOST_HEADERS")  // the host's own header, not the user's (HOST_HEADERS in sim/compiler.py)
#define LLMCUPY_SIM_HOST_HEADERS 1
#include <complex>
#pragma pop_macro("LLMCUPY_SIM_HOST_HEADERS")
namespace thrust {
using std::complex;
using std::abs; using std::arg; using std::conj; using std::exp; using std::log; using std::norm;
using std::polar; using std::pow; using std::sqrt; using std::sin; using std::cos; using std::tanh;
}
using thrust::complex;
#include "../llmcupy_sim_nvrtc_names_on.h"
