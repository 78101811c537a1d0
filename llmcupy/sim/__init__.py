"""The CPU emulator of CUDA C (backend ``sim``): see ``include/llmcupy_sim.h`` for what it models."""

from .launcher import (HAZARDS, SimDeadlockError, SimDeviceAssertError, SimLaunchError, SimSharedMemoryError,
                       SimTimeoutError, hazards, reset_hazards, settings)
from .compiler import SimCompileError, clear_cache

__all__ = ["HAZARDS", "SimCompileError", "SimDeadlockError", "SimDeviceAssertError", "SimLaunchError",
           "SimSharedMemoryError", "SimTimeoutError", "clear_cache", "hazards", "reset_hazards", "settings"]
