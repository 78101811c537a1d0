"""Loads an emulator library and launches its kernels through ctypes.

Settings that change how the emulator schedules threads are process-wide and can be changed for
a block of code with :func:`settings`::

    with llmcupy.sim.settings(order="reverse"):
        op(x, version=4)
    print(llmcupy.sim.hazards())   # accumulated hazard counters

``order`` is ``forward``, ``reverse`` or ``random`` (reshuffled at every release, seeded by
``seed``). Tests run every kernel in at least two orders and assert the counters stay zero.

``timeout`` (seconds, default ``LLMCUPY_SIM_TIMEOUT`` or 120; 0 turns it off) is the watchdog's
limit per launch: a launch that runs longer (a thread spinning on a flag nobody sets) is stopped
with :class:`SimTimeoutError` naming the kernel and where its threads were last seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from .compiler import build_library, stack_requirement

ORDERS = {"forward": 0, "reverse": 1, "random": 2}


class SimDeadlockError(RuntimeError):
    """No thread of a block could make progress; the message names the source lines."""


class SimLaunchError(RuntimeError):
    """The emulator refused a launch configuration, or the launch failed on the device side."""


class SimDeviceAssertError(SimLaunchError):
    """A device-side ``assert()`` failed (a GPU reports cudaErrorAssert); names kernel, line, block, thread."""


class SimTimeoutError(SimLaunchError):
    """The watchdog stopped a launch that ran past the time limit; names where threads were last seen."""


class SimSharedMemoryError(SimLaunchError):
    """A write landed just outside a shared-memory array (an out-of-bounds index)."""


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_ulonglong),
        ("order", ctypes.c_int),
        ("workers", ctypes.c_int),
        ("seed", ctypes.c_ulonglong),
        ("poison", ctypes.c_int),
        ("stack_bytes", ctypes.c_ulonglong),
        ("timeout_ms", ctypes.c_ulonglong),
    ]


class _LaunchResult(ctypes.Structure):
    _fields_ = [
        ("divergent_barriers", ctypes.c_ulonglong),
        ("barrier_after_exit", ctypes.c_ulonglong),
        ("exited_lane_reads", ctypes.c_ulonglong),
        ("deadlock", ctypes.c_int),
        ("error", ctypes.c_int),
        ("message", ctypes.c_char * 2048),
        ("assert_failed", ctypes.c_int),
        ("timed_out", ctypes.c_int),
        ("shared_overflow", ctypes.c_int),
    ]


HAZARDS = ("divergent_barriers", "barrier_after_exit", "exited_lane_reads")


@dataclass
class _Settings:
    order: str = "forward"
    seed: int = 0
    workers: int = field(default_factory=lambda: int(os.environ.get("LLMCUPY_SIM_WORKERS", os.cpu_count() or 1)))
    poison: bool = True
    timeout: float = field(default_factory=lambda: float(os.environ.get("LLMCUPY_SIM_TIMEOUT", "120") or 0))


_settings = _Settings()
_counters = {k: 0 for k in HAZARDS}
_counters_lock = threading.Lock()
_launches = 0


@contextlib.contextmanager
def settings(order: str | None = None, seed: int | None = None, workers: int | None = None, poison: bool | None = None,
             timeout: float | None = None):
    """Temporarily changes the thread order, seed, worker count, shared-memory poisoning or watchdog limit."""
    global _settings
    if order is not None and order not in ORDERS:
        raise ValueError(f"unknown thread order {order!r}; choose one of {', '.join(ORDERS)}")
    saved = _Settings(**vars(_settings))
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: no limit), got {timeout!r}")
    for key, value in (("order", order), ("seed", seed), ("workers", workers), ("poison", poison),
                       ("timeout", timeout)):
        if value is not None:
            setattr(_settings, key, value)
    try:
        yield _settings
    finally:
        _settings = saved


def hazards() -> dict:
    """Hazard counters accumulated over all launches since the last :func:`reset_hazards`."""
    with _counters_lock:
        return dict(_counters, launches=_launches)


def reset_hazards() -> None:
    global _launches
    with _counters_lock:
        for k in _counters:
            _counters[k] = 0
        _launches = 0


class SimLibrary:
    """A compiled source: one entry point and one signature per kernel name."""

    def __init__(self, code: str, kernels: list[str], options=(), filename: str = "kernel.cu", variables=()):
        self.path = build_library(code, kernels, options, filename, list(variables))
        self._variables = {name: i for i, name in enumerate(variables)}
        self._lib = ctypes.CDLL(str(self.path))
        self._index = {name: i for i, name in enumerate(kernels)}
        self.stack_bytes = stack_requirement(self.path)

    def signature(self, name: str) -> str:
        fn = getattr(self._lib, f"llmcupy_sim_signature_{self._index[name]}")
        fn.restype = ctypes.c_char_p
        return fn().decode()

    def global_address(self, name: str) -> tuple[int, int]:
        """Address and size in bytes of a ``__constant__`` / ``__device__`` variable."""
        fn = getattr(self._lib, f"llmcupy_sim_global_{self._variables[name]}")
        fn.restype = ctypes.c_void_p
        size = ctypes.c_ulonglong(0)
        ptr = fn(ctypes.byref(size))
        return int(ptr), int(size.value)

    def launcher(self, name: str):
        fn = getattr(self._lib, f"llmcupy_sim_entry_{self._index[name]}")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(_LaunchResult)]
        return fn


def launch(entry, name: str, grid, block, args: list, shared_mem: int = 0, stack_bytes: int = 0) -> None:
    """Runs ``entry`` (from :meth:`SimLibrary.launcher`) over ``grid`` x ``block``.

    ``args`` are already checked: NumPy arrays (passed by address), ``None`` (a null pointer) or
    NumPy scalars (passed by their bytes).
    """
    global _launches
    keep = []  # keeps every argument's storage alive during the call
    addresses = (ctypes.c_void_p * max(1, len(args)))()
    for i, a in enumerate(args):
        if a is None or isinstance(a, np.ndarray):
            slot = ctypes.c_void_p(None if a is None else a.ctypes.data)
            keep.append(slot)
            addresses[i] = ctypes.addressof(slot)
        else:
            value = np.array(a)  # a 0-d array owns the scalar's bytes
            keep.append(value)
            addresses[i] = value.ctypes.data
    cfg = _LaunchConfig()
    for i in range(3):
        cfg.grid[i] = grid[i]
        cfg.block[i] = block[i]
    cfg.shared_mem = shared_mem
    cfg.order = ORDERS[_settings.order]
    cfg.workers = max(1, _settings.workers)
    cfg.seed = _settings.seed
    cfg.poison = int(_settings.poison)
    cfg.stack_bytes = stack_bytes
    cfg.timeout_ms = int(round(_settings.timeout * 1000))
    res = _LaunchResult()
    rc = entry(ctypes.byref(cfg), addresses, ctypes.byref(res))
    with _counters_lock:
        _launches += 1
        for k in HAZARDS:
            _counters[k] += getattr(res, k)
    if res.error:
        raise SimLaunchError(f"{name}: {res.message.decode(errors='replace')}")
    message = res.message.decode(errors="replace").rstrip()
    if res.assert_failed:
        raise SimDeviceAssertError(message)
    if res.timed_out:
        raise SimTimeoutError(message)
    if res.shared_overflow:
        raise SimSharedMemoryError(message)
    if rc == 2 or res.deadlock:
        raise SimDeadlockError(res.message.decode(errors="replace").rstrip())
