// Stand-in for a CUDA runtime header in the CPU emulator: everything lives in llmcupy_sim.h.
#pragma once
#include "llmcupy_sim.h"
