"""Backend selection, module loading and argument checking: the only layer that knows the backend."""

import importlib
import pkgutil

from .backend import (BackendError, asarray, compute_capability, device_name, get_backend, is_sim, set_backend,
                      synchronize, to_numpy, xp)
from .module import DEFAULT_OPTIONS, RawKernel, RawModule, kernels_dir, load_kernel_file
from .signature import DeviceLimitError, KernelArgumentError, LaunchBoundsError

__all__ = ["BackendError", "DEFAULT_OPTIONS", "DeviceLimitError", "KernelArgumentError", "LaunchBoundsError", "RawKernel", "RawModule", "asarray",
           "compute_capability", "device_name", "kernels_dir", "load_kernel_file", "get_backend", "is_sim", "set_backend", "synchronize", "to_numpy", "xp"]


def __getattr__(name):
    """blas and timing load on first use: ``llmcupy.runtime.blas.tf32(True)`` as the README writes it,
    after a plain ``import llmcupy``."""
    if name in {info.name for info in pkgutil.iter_modules(__path__)}:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
