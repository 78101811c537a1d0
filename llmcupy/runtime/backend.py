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
_cupy_checked = False


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
        _check_cupy_version()
        return "cuda"
    if reason is None:
        _check_cupy_version()
        return "cuda"
    if not _announced:
        print(f"llmcupy: {reason}; running kernels in the CPU emulator (backend 'sim').", file=sys.stderr)
        _announced = True
    return "sim"


def _check_cupy_version() -> None:
    """Says once that a CuPy older than 14.2 recompiles every kernel at every start: before 14.2
    CuPy skips its disk cache for modules with name expressions, which every catalogue file has
    (~20 s of NVRTC for a training step's kernels)."""
    global _cupy_checked
    if _cupy_checked:
        return
    _cupy_checked = True
    import cupy

    try:
        major, minor = (int(p) for p in cupy.__version__.split(".")[:2])
    except ValueError:
        return
    if (major, minor) < (14, 2):
        print(f"llmcupy: CuPy {cupy.__version__} does not cache kernels compiled with name expressions on disk, "
              "so every start recompiles them; install cupy>=14.2 (pip install -e '.[cuda12]')", file=sys.stderr)


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


_GET_DEVICE: list = [None]


def current_device() -> int:
    """The id of the CUDA device calls go to now (CuPy's current device); 0 in the emulator, which
    has one. Cheap (one cudaGetDevice): the launch plans ask on every op call."""
    if get_backend() != "cuda":
        return 0
    get = _GET_DEVICE[0]
    if get is None:
        import cupy

        get = _GET_DEVICE[0] = cupy.cuda.runtime.getDevice
    return get()


_ATTRIBUTES: dict = {}


def device_attribute(name: str) -> int:
    """A CUDA device attribute of the current device by its cudaDevAttr name without the prefix
    (``"MultiProcessorCount"``, ``"MaxThreadsPerMultiProcessor"``, ``"MaxSharedMemoryPerBlockOptin"``),
    queried once per device and cached: launchers that size grids from the device call this on every
    launch, and a query per launch (getDeviceProperties especially: ~1 ms) would dominate small kernels."""
    if get_backend() != "cuda":
        raise BackendError(f"device_attribute({name!r}): the emulator has no CUDA device")
    import cupy

    key = (cupy.cuda.Device().id, name)
    value = _ATTRIBUTES.get(key)
    if value is None:
        rt = cupy.cuda.runtime
        value = _ATTRIBUTES[key] = int(rt.deviceGetAttribute(getattr(rt, "cudaDevAttr" + name), key[0]))
    return value


def compute_capability() -> int | None:
    """e.g. 90 for an H100; None in the emulator."""
    if get_backend() != "cuda":
        return None
    import cupy

    return int(cupy.cuda.Device().compute_capability)
