// Stand-in for <cub/thread/thread_operators.cuh> in the CPU emulator: the supported subset is in llmcupy_sim_cub.h.
#pragma once
#include "../llmcupy_sim_cub.h"
