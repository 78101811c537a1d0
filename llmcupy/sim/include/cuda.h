// Stand-in for <cuda.h> in the CPU emulator: everything lives in llmcupy_sim.h.
#pragma once
#include "llmcupy_sim.h"
