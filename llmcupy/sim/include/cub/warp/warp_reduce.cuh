// Stand-in for <cub/warp/warp_reduce.cuh> in the CPU emulator: the supported subset is in llmcupy_sim_cub.h.
#pragma once
#include "../../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "../llmcupy_sim_cub.h"

// NVRTC's <cub/warp/warp_reduce.cuh> brings in what libcu++'s <cuda/std/cmath> defines
// (INFINITY, NAN, FLT_MAX, INT_MAX, ...: see there)
#include <cuda/std/cmath>  // the real libcu++'s wrapper, or the stand-in (sim/libcuxx.py)
#include "../../llmcupy_sim_nvrtc_names_on.h"
