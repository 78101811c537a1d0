// Stand-in for <cub/cub.cuh> in the CPU emulator. Under NVRTC the umbrella header does not compile:
// it pulls in CUB's device-wide algorithms, which are host code ("A function explicitly marked as a
// __host__ function is not allowed in JIT mode"), so it is refused here too. The supported subset
// is in llmcupy_sim_cub.h, reached through the headers a kernel includes on a GPU as well.
#pragma once
#include "../llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#error "<cub/cub.cuh> does not compile under NVRTC (its device-wide algorithms are host code: 'A function explicitly marked as a __host__ function is not allowed in JIT mode'); include what the kernel uses, <cub/block/block_reduce.cuh> or <cub/warp/warp_reduce.cuh>, which compile on both backends"
#include "../llmcupy_sim_nvrtc_names_on.h"
