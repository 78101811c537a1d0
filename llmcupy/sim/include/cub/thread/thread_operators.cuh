// Stand-in for <cub/thread/thread_operators.cuh> in the CPU emulator: the supported subset is in llmcupy_sim_cub.h.
#pragma once
#include "../../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "../llmcupy_sim_cub.h"
#include "../../llmcupy_sim_nvrtc_names_on.h"
