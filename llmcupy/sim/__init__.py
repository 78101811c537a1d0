"""The CPU emulator of CUDA C (backend ``sim``): see ``include/llmcupy_sim.h`` for what it models."""

from .launcher import (HAZARDS, SimCooperativeLaunchTooLargeError, SimDeadlockError, SimDeviceAssertError, SimHazardWarning, SimLaunchError,
                       SimMemoryFaultError,
                       SimSanitizerError, SimSharedMemoryError, SimTimeoutError, SanitizerReport, hazards,
                       reset_hazards, settings)
from .compiler import SimCompileError, clear_cache
from .platform import SimPlatformWarning

__all__ = ["HAZARDS", "SimCompileError", "SimCooperativeLaunchTooLargeError", "SimDeadlockError", "SimDeviceAssertError", "SimHazardWarning", "SimLaunchError",
           "SimMemoryFaultError", "SimPlatformWarning", "SimSanitizerError", "SanitizerReport", "SimSharedMemoryError", "SimTimeoutError", "clear_cache", "hazards", "reset_hazards", "settings"]
