"""Backend selection, module loading and argument checking: the only layer that knows the backend."""

from .backend import (BackendError, asarray, compute_capability, device_name, get_backend, is_sim, set_backend,
                      synchronize, to_numpy, xp)
from .module import DEFAULT_OPTIONS, RawKernel, RawModule, kernels_dir, load_kernel_file
from .signature import DeviceLimitError, KernelArgumentError, LaunchBoundsError

__all__ = ["BackendError", "DEFAULT_OPTIONS", "DeviceLimitError", "KernelArgumentError", "LaunchBoundsError", "RawKernel", "RawModule", "asarray",
           "compute_capability", "device_name", "kernels_dir", "load_kernel_file", "get_backend", "is_sim", "set_backend", "synchronize", "to_numpy", "xp"]
