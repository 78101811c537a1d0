// The emulator's assert: a failing device assert() raises a Python exception naming the kernel,
// line, block and thread (llmcupy_sim.h), instead of aborting the process.
#include "llmcupy_sim.h"
