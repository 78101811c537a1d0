"""Which backend runs kernels: ``cuda`` (CuPy on an NVIDIA GPU) or ``sim`` (the CPU emulator).

Chosen, in order of precedence, by ``set_backend()`` (what every CLI's ``--backend`` calls), the
``LLMCUPY_BACKEND`` environment variable, and ``auto``: ``cuda`` when CuPy sees a device, else
``sim``, saying so once on stderr. This is the only module that decides; everything else asks it.
"""

from __future__ import annotations

import os
import sys

import numpy as np

CHOICES = ("auto", "cuda", "sim")

_backend: str | None = None
_announced = False


class BackendError(RuntimeError):
    """The requested backend cannot run here."""


def cuda_unavailable_reason() -> str | None:
    """None when CuPy can see a CUDA device, else a sentence saying why not."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return explain_cuda_error(exc)
    if count == 0:
        return "CuPy found no CUDA device"
    return None


def explain_cuda_error(exc: BaseException) -> str:
    """CuPy's error when it cannot reach a GPU, in words a user can act on."""
    text = f"{type(exc).__name__}: {exc}"
    if "InsufficientDriver" in text or "driver version is insufficient" in text:
        # cudaErrorInsufficientDriver is also what the CUDA runtime reports when there is no
        # NVIDIA driver at all (a machine without a GPU), not only an old one
        return ("no usable NVIDIA GPU: the CUDA runtime found no NVIDIA driver, or one older than the CUDA "
                f"version CuPy was built for ({text}); on a machine without a GPU this is expected, "
                "otherwise update the driver or install the CuPy package for your CUDA version")
    if "NoDevice" in text or "no CUDA-capable device" in text:
        return f"no CUDA device is visible ({text}); check nvidia-smi and CUDA_VISIBLE_DEVICES"
    return f"CuPy found no usable CUDA driver or device ({text})"


def set_backend(name: str) -> str:
    """Selects ``auto``, ``cuda`` or ``sim`` for this process and returns the resolved name."""
    global _backend
    if name not in CHOICES:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(CHOICES)}")
    _backend = _resolve(name)
    return _backend


def get_backend() -> str:
    """The backend in use, resolving ``LLMCUPY_BACKEND`` (default ``auto``) on first call."""
    global _backend
    if _backend is None:
        requested = os.environ.get("LLMCUPY_BACKEND", "auto").strip().lower() or "auto"
        if requested not in CHOICES:
            raise BackendError(f"LLMCUPY_BACKEND={requested!r} is not one of {', '.join(CHOICES)}")
        _backend = _resolve(requested)
    return _backend


def _resolve(name: str) -> str:
    global _announced
    if name == "sim":
        return "sim"
    reason = cuda_unavailable_reason()
    if name == "cuda":
        if reason:
            raise BackendError(f"backend 'cuda' was requested but {reason}. Use --backend sim for the CPU emulator.")
        return "cuda"
    if reason is None:
        return "cuda"
    if not _announced:
        print(f"llmcupy: {reason}; running kernels in the CPU emulator (backend 'sim').", file=sys.stderr)
        _announced = True
    return "sim"


def is_sim() -> bool:
    return get_backend() == "sim"


def xp():
    """The array module that matches the backend: cupy on ``cuda``, numpy on ``sim``."""
    if get_backend() == "cuda":
        import cupy

        return cupy
    return np


def to_numpy(a):
    """A NumPy copy of a device array (or the array itself when it is already NumPy)."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)
    if get is not None:
        return get()
    return np.asarray(a)


def asarray(a, dtype=None):
    """Moves a NumPy array to the backend's memory (a copy on ``cuda``, a contiguous view on ``sim``)."""
    mod = xp()
    return mod.ascontiguousarray(mod.asarray(a, dtype=dtype))


def synchronize() -> None:
    if get_backend() == "cuda":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def device_name() -> str:
    if get_backend() == "cuda":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return "CPU emulator (sim)"


def compute_capability() -> int | None:
    """e.g. 90 for an H100; None in the emulator."""
    if get_backend() != "cuda":
        return None
    import cupy

    return int(cupy.cuda.Device().compute_capability)


def set_tf32(enabled: bool) -> bool:
    """Lets cuBLAS use TF32 tensor cores for FP32 matmuls (as llm.c does on sm_80+).

    Returns whether TF32 is now in use: never in the emulator or below compute capability 8.0.
    """
    if get_backend() != "cuda":
        return False
    cc = compute_capability() or 0
    enabled = bool(enabled) and cc >= 80
    from cupy._core import _routines_linalg as linalg

    mode = linalg.COMPUTE_TYPE_TF32 if enabled else linalg.COMPUTE_TYPE_DEFAULT
    try:
        linalg.set_compute_type(np.dtype(np.float32), mode)
    except TypeError:  # older CuPy: one global compute type
        linalg.set_compute_type(mode)
    return enabled
