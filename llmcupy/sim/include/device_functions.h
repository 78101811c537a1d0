// Stand-in for a CUDA runtime header in the CPU emulator: everything lives in llmcupy_sim.h.
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim.h"
#include "llmcupy_sim_nvrtc_names_on.h"
