"""GPU timing with ``cupyx.profiler.benchmark`` and the device's measured copy bandwidth.

Only meaningful on the ``cuda`` backend: the emulator never reports a time as if it were a GPU's.
"""

from __future__ import annotations

import functools

import numpy as np

from . import backend as _backend


class NoGPUTiming(RuntimeError):
    """Raised when asked for a GPU time on the emulator."""


def _require_cuda():
    if _backend.get_backend() != "cuda":
        raise NoGPUTiming("the emulator runs on the CPU and does not model GPU time; run on a CUDA device")


def benchmark_ms(fn, repeat: int = 50, warmup: int = 5) -> dict:
    """Mean, min and max device time of ``fn()`` in milliseconds (CUDA events per call)."""
    _require_cuda()
    from cupyx.profiler import benchmark

    result = benchmark(fn, n_repeat=repeat, n_warmup=warmup)
    gpu = np.asarray(result.gpu_times).reshape(-1) * 1e3
    return {"mean_ms": float(gpu.mean()), "min_ms": float(gpu.min()), "max_ms": float(gpu.max()), "repeat": repeat}


@functools.lru_cache(maxsize=None)
def copy_bandwidth_gbs(nbytes: int = 1 << 29) -> float:
    """Device-to-device copy bandwidth in GB/s, counting the bytes read plus the bytes written.

    This is the practical upper bound of a memory-bound kernel that reads and writes each byte once.
    """
    _require_cuda()
    import cupy

    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    t = benchmark_ms(lambda: cupy.copyto(dst, src), repeat=20, warmup=3)["min_ms"]
    del src, dst
    return 2 * nbytes / (t * 1e-3) / 1e9


def cuda_versions() -> dict:
    """CUDA runtime/driver and CuPy versions for benchmark records (empty in the emulator)."""
    if _backend.get_backend() != "cuda":
        return {}
    import cupy

    rt = cupy.cuda.runtime
    return {
        "cuda_runtime": rt.runtimeGetVersion(),
        "cuda_driver": rt.driverGetVersion(),
        "cupy": cupy.__version__,
    }
