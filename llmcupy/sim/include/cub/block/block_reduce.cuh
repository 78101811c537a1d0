// Stand-in for <cub/block/block_reduce.cuh> in the CPU emulator: the supported subset is in llmcupy_sim_cub.h.
#pragma once
#include "../llmcupy_sim_cub.h"
