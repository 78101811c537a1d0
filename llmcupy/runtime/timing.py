"""GPU timing of a launch (or a few) and the device's copy-bandwidth bound.

Only meaningful on the ``cuda`` backend: the emulator never reports a time as if it were a GPU's
(:func:`benchmark_ms` raises :class:`NoGPUTiming` there).

The method (:func:`measure`), per sample::

    [flush L2] -> [delay kernel] -> start event -> fn() -> end event

* **Delay kernel before the start event.** With the GPU idle, an event pair around ``fn()`` would
  time the host too: the start event completes at once, then the GPU waits for Python to dispatch
  the launch (tens of microseconds of argument checks and CuPy's own dispatch), which dominates
  memory-bound kernels of 5-30 us. A kernel that spins for longer than the host takes to enqueue the
  start event, ``fn``'s launches and the end event keeps the GPU busy meanwhile, so the window holds
  only ``fn``'s kernels, back to back. The spin is calibrated from ``fn``'s host dispatch time
  measured in the warm-up (2x plus 50 us), and a sample whose enqueue took longer than its spin is
  measured again with the spin doubled.
* **L2 flush.** Repeats of a kernel whose working set fits in L2 (50 MB on an H100) would read from
  L2 and report more than the DRAM copy bound. Before each sample a buffer of twice the L2 size is
  written, outside the timed window.
* **One launch per window.** Together these make each sample one cold-cache run of ``fn``, timed by
  the GPU alone; the result is the mean, min and max over ``repeat`` samples.

:func:`measure` takes a clock: :class:`CudaClock` (events, the spin kernel, a memset) on a GPU;
:class:`HostClock`, for the tests without a GPU, follows the same steps with the host's clock (what
they check: order, calibration, the retry); nothing else uses it, so it never stands in for GPU time.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from . import backend as _backend


class NoGPUTiming(RuntimeError):
    """Raised when asked for a GPU time on the emulator."""


def _require_cuda():
    if _backend.get_backend() != "cuda":
        raise NoGPUTiming("the emulator runs on the CPU and does not model GPU time; run on a CUDA device")


# spin at least this long, and 2x the measured host dispatch time of fn
MIN_DELAY_MS = 0.05
MAX_DELAY_MS = 200.0
RETRIES = 3
# Samples stop early once they add up to this much GPU time (at least MIN_SAMPLES of them): a naive
# kernel of 50 ms at the catalogue's sizes would otherwise take 50 samples x 50 ms per block size,
# minutes of a 30-minute GPU session for one version, while a fast kernel never reaches it.
BUDGET_MS = 1000.0
MIN_SAMPLES = 5


class HostClock:
    """The method's steps on the host: markers are perf_counter readings, the delay and the flush
    are recorded but cost nothing. For the tests of :func:`measure` without a GPU; not a GPU time
    (the emulator times nothing: :func:`benchmark_ms` refuses it)."""

    timing = "host (emulator code path, not GPU time)"

    def __init__(self):
        self.delays: list[float] = []
        self.flushes = 0

    def flush_l2(self) -> None:
        self.flushes += 1

    def delay(self, ms: float) -> None:
        self.delays.append(ms)

    def record(self):
        return time.perf_counter()

    def elapsed_ms(self, start, end) -> float:
        return (end - start) * 1e3

    def synchronize(self) -> None:
        pass


_DELAY_SRC = r'''
extern "C" __global__ void llmcupy_delay_kernel(unsigned long long ns) {
    // spin on the global nanosecond timer: keeps the GPU busy while the host enqueues what follows
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
'''


class CudaClock:
    """CUDA events on the current stream, the spin kernel and an L2-sized memset."""

    timing = "gpu-events (delay kernel before the start event, L2 flushed)"

    def __init__(self, flush: bool = True):
        import cupy

        self.cupy = cupy
        self.flush_buffer = _flush_buffer(cupy.cuda.Device().id) if flush else None
        self.delay_kernel = _delay_kernel()

    def flush_l2(self) -> None:
        if self.flush_buffer is not None:
            self.flush_buffer.fill(0)

    def delay(self, ms: float) -> None:
        self.delay_kernel((1,), (1,), (np.uint64(int(ms * 1e6)),))

    def record(self):
        ev = self.cupy.cuda.Event()
        ev.record()
        return ev

    def elapsed_ms(self, start, end) -> float:
        end.synchronize()
        return float(self.cupy.cuda.get_elapsed_time(start, end))

    def synchronize(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()


@functools.lru_cache(maxsize=None)
def _flush_buffer(device: int):
    import cupy

    return cupy.empty(max(2 * _backend.device_attribute("L2CacheSize"), 1 << 20), dtype=cupy.uint8)


@functools.lru_cache(maxsize=None)
def _delay_kernel():
    import cupy

    return cupy.RawKernel(_DELAY_SRC, "llmcupy_delay_kernel")


def measure(fn, clock, repeat: int = 20, warmup: int = 3, flush_l2: bool = True,
            budget_ms: float | None = BUDGET_MS) -> dict:
    """Mean/min/max time of one ``fn()`` per sample, by the method in the module docstring.

    At most ``repeat`` samples; fewer (never under MIN_SAMPLES) once they add up to ``budget_ms`` of
    measured time (None: no budget). The result's ``repeat`` is the number taken, ``repeat_asked``
    the number asked for."""
    host = []
    for _ in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        clock.synchronize()
    # the first call may compile (seconds of NVRTC, or a disk-cache load), so it is left out whenever
    # another call follows: with warmup=2 (copy_bandwidth) host[-2:] still held it, and every sample
    # then spun for MAX_DELAY_MS (200 ms x 10 samples x 2 methods of GPU time per process)
    host_ms = max(host[1:]) if len(host) > 1 else host[0]
    delay_ms = min(max(2 * host_ms + MIN_DELAY_MS, MIN_DELAY_MS), MAX_DELAY_MS)
    times, retried = [], 0
    for _ in range(repeat):
        for attempt in range(RETRIES + 1):
            if flush_l2:
                clock.flush_l2()
            clock.delay(delay_ms)
            t0 = time.perf_counter()
            start = clock.record()
            fn()
            end = clock.record()
            enqueue_ms = (time.perf_counter() - t0) * 1e3
            ms = clock.elapsed_ms(start, end)
            if enqueue_ms <= delay_ms or attempt == RETRIES or delay_ms >= MAX_DELAY_MS:
                break
            # the GPU may have run dry while the host was still enqueueing: spin longer, measure again
            retried += 1
            delay_ms = min(2 * max(delay_ms, enqueue_ms), MAX_DELAY_MS)
        times.append(ms)
        if budget_ms is not None and len(times) >= MIN_SAMPLES and sum(times) >= budget_ms:
            break
    t = np.asarray(times)
    return {"mean_ms": float(t.mean()), "min_ms": float(t.min()), "max_ms": float(t.max()), "repeat": len(times),
            "repeat_asked": repeat,
            "host_dispatch_ms": host_ms, "delay_ms": delay_ms, "retried": retried, "l2_flushed": bool(flush_l2),
            "timing": clock.timing}


def benchmark_ms(fn, repeat: int = 20, warmup: int = 3, flush_l2: bool = True,
                 budget_ms: float | None = BUDGET_MS) -> dict:
    """Mean, min and max GPU time of ``fn()`` in milliseconds (see the module docstring and
    :func:`measure` for the time budget)."""
    _require_cuda()
    return measure(fn, CudaClock(flush=flush_l2), repeat=repeat, warmup=warmup, flush_l2=flush_l2,
                   budget_ms=budget_ms)


@functools.lru_cache(maxsize=None)
def copy_bandwidth(nbytes: int = 1 << 29) -> dict:
    """Device-to-device copy bandwidth in GB/s (bytes read plus bytes written): the best of
    ``cudaMemcpyAsync`` and a vectorised (float4, grid-stride) copy kernel, and which one won.

    The practical upper bound of a memory-bound kernel that reads and writes each byte once; a
    copy kernel can beat the copy engine path, so the bound is the best of both (a fraction of the
    bound above 1 would otherwise be possible).
    """
    _require_cuda()
    import cupy

    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    stream = cupy.cuda.get_current_stream()

    def memcpy():
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, cupy.cuda.runtime.memcpyDeviceToDevice,
                                      stream.ptr)

    kernel = _copy_kernel()
    n4 = nbytes // 16
    sms = _backend.device_attribute("MultiProcessorCount")

    def copy_kernel():
        kernel((sms * 8,), (256,), (dst, src, np.int64(n4)))

    results = {}
    for name, fn in (("cudaMemcpyAsync", memcpy), ("float4 copy kernel", copy_kernel)):
        ms = benchmark_ms(fn, repeat=10, warmup=2, flush_l2=False)["min_ms"]  # 512 MiB: far beyond any L2
        results[name] = 2 * nbytes / (ms * 1e-3) / 1e9
    del src, dst
    best = max(results, key=results.get)
    return {"gbs": results[best], "method": best, "all_gbs": results}


def copy_bandwidth_gbs(nbytes: int = 1 << 29) -> float:
    """The best copy bandwidth in GB/s (see :func:`copy_bandwidth`)."""
    return copy_bandwidth(nbytes)["gbs"]


_COPY_SRC = r'''
extern "C" __global__ void llmcupy_copy_kernel(float4* __restrict__ dst, const float4* __restrict__ src, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}
'''


@functools.lru_cache(maxsize=None)
def _copy_kernel():
    import cupy

    return cupy.RawKernel(_COPY_SRC, "llmcupy_copy_kernel")


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
