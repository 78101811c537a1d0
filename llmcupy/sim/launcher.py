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

``check`` turns the sanitizers on (default ``LLMCUPY_SIM_CHECK``; any subset of
``race,memory,init``, or ``all``; empty: off). Launches then run the library's instrumented build
(compiled once, cached) and raise :class:`SimSanitizerError` with structured reports; see
``include/llmcupy_sim_check.h`` for what each check reports.

Inside ``sim.metrics.collect()`` launches run the instrumented build with the memory-traffic
observer (``include/llmcupy_sim_metrics.h``) on and each leaves one metrics record there.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import re
import threading
import warnings
from dataclasses import dataclass

import numpy as np
from numpy.lib.array_utils import byte_bounds

from . import metrics as _metrics
from .compiler import build_library, built_names, stack_requirement

ORDERS = {"forward": 0, "reverse": 1, "random": 2}

# The emulator's stand-in device, where a kernel's launch depends on the device's size: grids sized
# to fill it (ops/global_norm.py) and the co-residency rule of cooperative launches. Small, so that
# grid-stride loops wrap at test sizes and a cooperative grid (one OS thread per block) stays small.
DEVICE_SMS = 2
DEVICE_MAX_THREADS_PER_SM = 2048
DEVICE_MAX_BLOCKS_PER_SM = 32      # resident blocks per SM on sm_80 (the emulator's __CUDA_ARCH__) and sm_90


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


class SimMemoryFaultError(SimLaunchError):
    """A thread faulted (SIGSEGV/SIGBUS: an address nothing is mapped at, or a fiber stack overflow;
    SIGFPE: INT_MIN / -1, which x86 traps on and a GPU does not);
    its block was abandoned, as a GPU reports cudaErrorIllegalAddress. Names kernel, block, thread and,
    where the emulator knows it, what the address was; ``--sanitize memory`` names the source line."""


class SimCooperativeLaunchTooLargeError(SimLaunchError):
    """A cooperative launch whose blocks cannot all be resident on the emulator's device at once
    (CUDA's cudaErrorCooperativeLaunchTooLarge); names the kernel, the grid and the limit."""


class SimSanitizerError(SimLaunchError):
    """racecheck, memcheck or initcheck found errors in a launch; ``reports`` holds them
    (:class:`SanitizerReport`), the message lists the first few, one per pair of source lines."""

    def __init__(self, message: str, reports: list):
        super().__init__(message)
        self.reports = reports


CHECKS = {"race": 1, "memory": 2, "init": 4}
CHECK_METRICS = 8  # the bit of the memory-traffic metrics (another observer)


def parse_check(value, source: str = "check") -> int:
    """``"race,memory"`` / ``"all"`` / ``""`` / an iterable of names -> the bit mask the launch passes."""
    if value is None or value is False:
        return 0
    if value is True:
        return sum(CHECKS.values())
    names = value.replace(" ", "").split(",") if isinstance(value, str) else list(value)
    bits = 0
    for name in names:
        if name in ("", "none", "0"):
            continue
        if name == "all":
            bits |= sum(CHECKS.values())
        elif name in CHECKS:
            bits |= CHECKS[name]
        else:
            raise ValueError(f"{source}: unknown sanitizer {name!r}; choose any of race, memory, init (comma-separated) "
                             "or all")
    return bits


def check_names(bits: int) -> list[str]:
    """The sanitizers a check mask turns on, as the tools call them: racecheck, memcheck, initcheck."""
    return [f"{name}check" if name != "memory" else "memcheck" for name, bit in CHECKS.items() if bits & bit]


@dataclass
class SanitizerReport:
    """One finding. ``kind``: RAW, WAR, WAW (racecheck), OOB (memcheck), UNINIT (initcheck).
    Threads are (x, y, z) in their blocks; ``line`` is where ``thread`` of ``block`` made the access
    that found it, ``prev_line`` where ``prev_thread`` of ``prev_block`` made the earlier conflicting
    access (races only; ``between_blocks`` when those are different blocks of the launch)."""
    kind: str
    kernel: str
    space: str                 # "shared", "global" or "unknown" (an address outside everything)
    line: str
    block: tuple
    thread: tuple
    address: int
    size: int
    write: bool
    where: str                 # the memory: shared array / argument, or the nearest buffer (OOB)
    prev_line: str = ""
    prev_thread: tuple = ()
    warp_synchronous: bool = False
    count: int = 1             # accesses that hit the same pair of source lines
    prev_block: tuple = ()

    @property
    def between_blocks(self) -> bool:
        return bool(self.prev_block) and self.prev_block != self.block

    @property
    def check(self) -> str:
        return {"OOB": "memcheck", "UNINIT": "initcheck"}.get(self.kind, "racecheck")

    def describe(self) -> str:
        t = "({},{},{})".format(*self.thread)
        b = "({},{},{})".format(*self.block)
        if self.kind == "OOB":
            return (f"memcheck: invalid {self.size}-byte {'write' if self.write else 'read'} at {self.address:#x} in "
                    f"kernel {self.kernel} at {self.line}, block {b}, thread {t}: {self.where} (stopped before it)")
        if self.kind == "UNINIT":
            return (f"initcheck: {self.size}-byte read of uninitialised shared memory in kernel {self.kernel} at "
                    f"{self.line}, block {b}, thread {t}: {self.where}, bytes no thread of the block wrote in this launch")
        p = "({},{},{})".format(*self.prev_thread)
        first, second = {"RAW": ("write", "read"), "WAR": ("read", "write"), "WAW": ("write", "write")}[self.kind]
        if self.between_blocks:
            pb = "({},{},{})".format(*self.prev_block)
            return (f"racecheck: {self.kind} hazard on {self.space} memory ({self.where}) in kernel {self.kernel} "
                    f"between blocks: {first} at {self.prev_line} by block {pb} thread {p}, {second} at {self.line} "
                    f"by block {b} thread {t}, not both atomic, with nothing ordering the two blocks (blocks of "
                    f"one launch are ordered only by a __threadfence() and an atomic in one, then an atomic on the "
                    f"same address in the other, or by a grid.sync() of a cooperative launch between them)")
        warp = (" [warp-synchronous: lanes of one warp with no __syncwarp or warp collective between the accesses,"
                " a race on Volta and later]" if self.warp_synchronous else "")
        return (f"racecheck: {self.kind} hazard on {self.space} memory ({self.where}) in kernel {self.kernel}, block {b}: "
                f"{first} at {self.prev_line} by thread {p}, {second} at {self.line} by thread {t} with no "
                f"__syncthreads between{warp}")


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
        ("check", ctypes.c_uint),
        ("nbuffers", ctypes.c_uint),
        ("buffers", ctypes.POINTER(ctypes.c_ulonglong)),
        ("cooperative", ctypes.c_int),
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
        ("sanitizer_stop", ctypes.c_int),
        ("memory_fault", ctypes.c_int),
    ]


HAZARDS = ("divergent_barriers", "barrier_after_exit", "exited_lane_reads")

# What each hazard means on a GPU, for the warning a launch that found one gives (the counters alone
# were seen only by the tests: a learner's kernel with a barrier inside `if (threadIdx.x < 16)` ran
# without a word)
_HAZARD_TEXT = {
    "divergent_barriers": "__syncthreads() released while threads of a block waited at different calls of it",
    "barrier_after_exit": "__syncthreads() that some threads of the block never reached (they had returned)",
    "exited_lane_reads": "warp collective(s) reading a lane that had exited or was not in the mask (an undefined "
                         "value on a GPU)",
}


class SimHazardWarning(RuntimeWarning):
    """A launch ran into one of the hazards :func:`hazards` counts: code whose result a GPU does not
    define (a barrier not reached by every thread of the block, a shuffle from an exited lane)."""


# -- the emulator's environment variables ------------------------------------------------------
#
# Read when first needed (never at import, so a bad value cannot break `import llmcupy`), each
# checked with a message naming the variable and its valid values: a ValueError from the Python API,
# one line and exit 2 from the CLIs, which call check_environment() before anything runs.

STACK_KB_MAX = 1024 * 1024   # 1 GiB per fiber: far past any kernel's need; mmap of more fails per thread


def _env_number(name: str, default, convert, valid, what: str):
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = convert(text.strip())
    except ValueError:
        value = None
    if value is None or value != value or not valid(value):   # (value != value: NaN)
        raise ValueError(f"{name}={text!r} is not valid: give {what}")
    return value


def _env_seconds(text: str) -> float:
    return 0.0 if text == "" else float(text)   # empty: no limit, as before


def env_timeout() -> float:
    """LLMCUPY_SIM_TIMEOUT: the watchdog's seconds per launch (default 120, 0 or empty: off)."""
    return _env_number("LLMCUPY_SIM_TIMEOUT", 120.0, _env_seconds, lambda v: 0 <= v < float("inf"),
                       "a number of seconds >= 0 (0: no time limit)")


def env_workers() -> int:
    """LLMCUPY_SIM_WORKERS: the worker threads a launch may use (default: the CPU count)."""
    return _env_number("LLMCUPY_SIM_WORKERS", os.cpu_count() or 1, int, lambda v: v >= 1,
                       "a whole number of worker threads >= 1")


def env_stack_kb() -> int | None:
    """LLMCUPY_SIM_STACK_KB (read by the emulator's C++ at its first launch): a fiber stack's KiB."""
    return _env_number("LLMCUPY_SIM_STACK_KB", None, int, lambda v: 1 <= v <= STACK_KB_MAX,
                       f"a whole number of KiB from 1 to {STACK_KB_MAX} (the emulator uses at least 16; "
                       "default 64)")


def check_environment() -> None:
    """Every emulator variable checked at once (the CLIs call it at start-up); raises ValueError."""
    env_timeout()
    env_workers()
    env_stack_kb()
    parse_check(os.environ.get("LLMCUPY_SIM_CHECK", ""), "LLMCUPY_SIM_CHECK")
    from .compiler import cache_dir, ensure_cache_dir

    ensure_cache_dir(cache_dir())


@dataclass
class _Settings:
    order: str = "forward"
    seed: int = 0
    workers: int | None = None    # None: from LLMCUPY_SIM_WORKERS at the first launch
    poison: bool = True
    timeout: float | None = None  # None: from LLMCUPY_SIM_TIMEOUT at the first launch
    check: int | None = None   # sanitizer bits; None: from LLMCUPY_SIM_CHECK at the first launch


_settings = _Settings()
_stack_kb_checked = False
_counters = {k: 0 for k in HAZARDS}
_counters_lock = threading.Lock()
_launches = 0


@contextlib.contextmanager
def settings(order: str | None = None, seed: int | None = None, workers: int | None = None, poison: bool | None = None,
             timeout: float | None = None, check=None):
    """Temporarily changes the thread order, seed, worker count, shared-memory poisoning, watchdog
    limit or sanitizers (``check="race,memory,init"``, any subset, ``"all"``; ``""`` turns them off)."""
    global _settings
    if order is not None and order not in ORDERS:
        raise ValueError(f"unknown thread order {order!r}; choose one of {', '.join(ORDERS)}")
    if check is not None:
        check = parse_check(check)
    saved = _Settings(**vars(_settings))
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: no limit), got {timeout!r}")
    # checked here, not at the next launch (a C-level conversion there: "invalid literal for int()")
    whole = (int, np.integer)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, whole)):
        raise ValueError(f"seed must be an int (the random thread order's seed), got {seed!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, whole) or workers < 1):
        raise ValueError(f"workers must be a whole number of worker threads >= 1, got {workers!r}")
    if poison is not None and not isinstance(poison, (bool, np.bool_)):
        raise ValueError(f"poison must be True or False (NaN in shared memory when each block starts), got {poison!r}")
    for key, value in (("order", order), ("seed", seed), ("workers", workers), ("poison", poison),
                       ("timeout", timeout), ("check", check)):
        if value is not None:
            setattr(_settings, key, value)
    try:
        yield _settings
    finally:
        _settings = saved


def _resolved_timeout() -> float:
    if _settings.timeout is None:
        _settings.timeout = env_timeout()
    return _settings.timeout


def _resolved_workers() -> int:
    if _settings.workers is None:
        _settings.workers = env_workers()
    return _settings.workers


def check_bits() -> int:
    """The check bits the next launch passes (sanitizers; LLMCUPY_SIM_CHECK unless settings() says)."""
    if _settings.check is None:
        _settings.check = parse_check(os.environ.get("LLMCUPY_SIM_CHECK", ""), "LLMCUPY_SIM_CHECK")
    return _settings.check


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

    def __init__(self, code: str, kernels: list[str], options=(), filename: str = "kernel.cu", variables=(),
                 instrument: bool = False):
        self._source = (code, list(kernels), options, filename, list(variables))
        self._checked: SimLibrary | None = None
        self.instrumented = instrument
        self.path = build_library(code, kernels, options, filename, list(variables), instrument=instrument)
        # those the preprocessor left: a kernel or variable inside a disabled #if has no entry point
        self.kernels, self.variables = built_names(self.path, kernels, variables)
        self._variables = {name: i for i, name in enumerate(self.variables)}
        self._lib = ctypes.CDLL(str(self.path))
        self._index = {name: i for i, name in enumerate(self.kernels)}
        self.stack_bytes = stack_requirement(self.path)

    def signature(self, name: str) -> str:
        fn = getattr(self._lib, f"llmcupy_sim_signature_{self._index[name]}")
        fn.restype = ctypes.c_char_p
        return fn().decode()

    def max_threads(self, name: str) -> int:
        """The block size the kernel's ``__launch_bounds__`` allows (1024 when it declares none)."""
        fn = getattr(self._lib, f"llmcupy_sim_max_threads_{self._index[name]}")
        fn.restype = ctypes.c_int
        return int(fn()) or 1024

    def global_address(self, name: str) -> tuple[int, int]:
        """Address and size in bytes of a ``__constant__`` / ``__device__`` variable."""
        fn = getattr(self._lib, f"llmcupy_sim_global_{self._variables[name]}")
        fn.restype = ctypes.c_void_p
        size = ctypes.c_ulonglong(0)
        ptr = fn(ctypes.byref(size))
        return int(ptr), int(size.value)

    def release_fibers(self) -> None:
        """Unmaps the fiber stacks this library's worker threads keep (its next launch maps them again)."""
        self._lib.llmcupy_sim_release_fibers()

    def checked(self) -> "SimLibrary":
        """The instrumented build of the same source (built on first use, then cached)."""
        if self.instrumented:
            return self
        if self._checked is None:
            code, kernels, options, filename, variables = self._source
            self._checked = SimLibrary(code, kernels, options, filename, variables, instrument=True)
        return self._checked

    def sync_variables(self, to_checked: bool) -> None:
        """The instrumented build is a second library with its own ``__constant__``/``__device__``
        variables: a checked launch copies the plain library's values in before and, for those the
        launch changed, back after, so ``get_global`` and the kernel see one set of variables
        whichever build runs (a variable changed through a pointer argument into the plain library
        is left as the kernel wrote it)."""
        if not self._variables or self._checked is None:
            return
        if to_checked:
            self._synced = {}
        for name in self._variables:
            (a, n), (b, m) = self.global_address(name), self._checked.global_address(name)
            n = min(n, m)
            if to_checked:
                ctypes.memmove(b, a, n)
                self._synced[name] = ctypes.string_at(b, n)
            elif ctypes.string_at(b, n) != self._synced.get(name):
                ctypes.memmove(a, b, n)

    def _entry_fn(self, name: str):
        fn = getattr(self._lib, f"llmcupy_sim_entry_{self._index[name]}")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(_LaunchResult)]
        return fn

    def launcher(self, name: str):
        return _Entry(self, name)

    def reports(self) -> list[tuple]:
        """The last launch's raw sanitizer reports (instrumented builds only)."""
        fn = self._lib.llmcupy_sim_check_reports
        fn.restype = ctypes.c_ulonglong
        fn.argtypes = [ctypes.c_char_p, ctypes.c_ulonglong]
        need = fn(None, 0)
        buf = ctypes.create_string_buffer(int(need) + 1)
        fn(buf, need + 1)
        return [line.split("\t") for line in buf.value.decode(errors="replace").splitlines()]


class _Entry:
    """A kernel's entry point: the plain build's, or with the sanitizers on the instrumented one's."""

    __slots__ = ("library", "name", "fn", "_checked_fn")

    def __init__(self, library: SimLibrary, name: str):
        self.library, self.name = library, name
        self.fn = library._entry_fn(name)
        self._checked_fn = None

    def checked(self):
        if self._checked_fn is None:
            self._checked_fn = self.library.checked()._entry_fn(self.name)
        return self._checked_fn

    def __call__(self, *args):
        return self.fn(*args)


def _root_extent(a: np.ndarray) -> tuple[int, int]:
    """[begin, end) of the allocation an array argument lives in: the root of its ``.base`` chain, so
    a view's neighbours inside one allocation are legitimate (as a GPU sees one cudaMalloc)."""
    lo, hi = byte_bounds(_root(a))
    return int(lo), int(hi)


# A plain launch runs on fenced copies of its array arguments: each allocation (the root of a view, as
# the sanitizers see it) is copied into a mapping of its own with an inaccessible page on either side,
# so that an index past an array's end faults at once (SimMemoryFaultError, naming the argument)
# instead of silently changing whatever memory followed it (another array: a wrong result elsewhere;
# the allocator's bookkeeping: glibc aborting the process later). The copy keeps the address modulo
# 16 (what float4 accesses need, and all the kernels' alignment tests ask), so it ends up to 15 bytes
# before the rear fence, and starts up to a page after the front one. That slack is filled with a
# canary byte and read back after the launch: a write there (``out[n]`` of an array whose size is no
# multiple of 16 bytes, ``out[-1]``) stops the launch as a fault would, naming argument and distance.
# Reads there are not seen (they give canary bytes); memcheck sees every access.
_PAGE = mmap.PAGESIZE
_ALIGN = 16
_CANARY = 0xA5
_CANARY_BYTE, _OTHER_BYTES = bytes([_CANARY]), bytes(b for b in range(256) if b != _CANARY)
# The copies cost about 0.12 ms per MB and launch (in and back; 2 ms on fresh pages), spent even on
# allocations a launch barely touches (a layer's slice of the trainer's parameter buffer, 26 MB at d2:
# fencing everything on fresh pages doubled its step). Every allocation of the catalogue at the
# emulator's sizes is below 1.3 MB; larger ones than this run in place, unfenced, as before.
FENCE_MAX_BYTES = 4 << 20
# fenced mappings kept for reuse by later launches, by length; at most this many (three entries of
# vm.max_map_count each) and bytes
FENCES_KEPT, FENCES_KEPT_BYTES = 256, 32 << 20
_kept_fences: dict = {}
_kept_bytes = 0
_fence_lock = threading.Lock()
_fenced_launch_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _libc():
    """The C library's mmap, mprotect and munmap; loaded when first needed, not at import: Windows has
    no C library to open this way, and `import llmcupy` must work there for the cuda backend (the
    emulator itself refuses to start there, see sim/platform.py)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return libc


_MAP_FAILED = ctypes.c_void_p(-1).value
_PROT_NONE = 0   # not in Python's mmap module


class _Fenced:
    """One allocation's fenced copy: [lo, hi) of this process's memory, copied to ``start`` inside the
    mapping [base, base + length), whose first and last pages are inaccessible."""

    __slots__ = ("lo", "hi", "writable", "members", "base", "length", "start", "mapped")

    def __init__(self, lo: int, hi: int, writable: bool, member: int):
        self.lo, self.hi, self.writable, self.members = lo, hi, writable, [member]
        self.base = self.length = self.start = 0
        self.mapped = False

    def map(self) -> None:
        size = self.hi - self.lo
        if size > FENCE_MAX_BYTES:
            self.start = self.lo   # used in place, unfenced
            return
        data_pages = (size + _ALIGN - 1 + _PAGE - 1) // _PAGE
        self.length = (data_pages + 2) * _PAGE
        global _kept_bytes
        with _fence_lock:
            kept = _kept_fences.get(self.length)
            base = kept.pop() if kept else None
            if base is not None:
                _kept_bytes -= self.length
        if base is None:
            base = _libc().mmap(None, self.length, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
            if base in (None, _MAP_FAILED):
                raise MemoryError(f"the emulator could not map {self.length} bytes for a launch's argument "
                                  f"({os.strerror(ctypes.get_errno())})")
            if _libc().mprotect(base + _PAGE, data_pages * _PAGE, mmap.PROT_READ | mmap.PROT_WRITE):
                _libc().munmap(base, self.length)
                raise MemoryError(f"the emulator could not fence a launch's argument "
                                  f"({os.strerror(ctypes.get_errno())})")
        self.base, self.mapped = base, True
        start = base + (data_pages + 1) * _PAGE - size   # ends at the rear fence
        self.start = start - (start - self.lo) % _ALIGN   # with the original address modulo 16
        ctypes.memmove(self.start, self.lo, size)
        for lo, hi in self._slack():
            ctypes.memset(lo, _CANARY, hi - lo)

    def _slack(self) -> tuple:
        """The two stretches of the mapping's accessible pages outside the copy: [lo, hi) before and after."""
        first, last = self.base + _PAGE, self.base + self.length - _PAGE
        end = self.start + (self.hi - self.lo)
        return (first, self.start), (end, last)

    def stray_write(self) -> int | None:
        """The address nearest the copy of a write into the slack around it (a canary byte changed), or
        None. Unfenced (large) allocations have no slack to look at."""
        if not self.mapped:
            return None
        (before_lo, before_hi), (after_lo, after_hi) = self._slack()
        after = ctypes.string_at(after_lo, after_hi - after_lo)
        from_first_write = len(after.lstrip(_CANARY_BYTE))   # bytes' own scans: a launch must not pay a Python loop
        if from_first_write:
            return after_lo + len(after) - from_first_write   # the first byte written past the end
        before = ctypes.string_at(before_lo, before_hi - before_lo).rstrip(_CANARY_BYTE)
        if not before:
            return None
        # the nearest write's first byte: back from the last byte written to the canary before it (out[-1]
        # is 4 bytes before)
        return before_lo + len(before.rstrip(_OTHER_BYTES))

    def unmap(self, copy_back: bool) -> None:
        global _kept_bytes
        if self.mapped:
            if copy_back and self.writable:
                ctypes.memmove(self.lo, self.start, self.hi - self.lo)
            self.mapped = False
            # kept for the next launch: a fresh mapping's syscalls and page faults cost more than the copy
            with _fence_lock:
                if _kept_bytes + self.length <= FENCES_KEPT_BYTES and _kept_count() < FENCES_KEPT:
                    _kept_fences.setdefault(self.length, []).append(self.base)
                    _kept_bytes += self.length
                    return
            _libc().munmap(self.base, self.length)


class _FencedArguments:
    """The fenced copies of one launch's array arguments (one per allocation: overlapping ones share
    it); ``address(a)`` is an argument's address in them, ``close()`` copies the writable ones back
    and unmaps them all."""

    def __init__(self, args: list):
        self.regions: list[_Fenced] = []
        extents = sorted((*_root_extent(a), _root(a).flags.writeable, i) for i, a in enumerate(args)
                         if isinstance(a, np.ndarray))
        for lo, hi, writable, i in extents:
            last = self.regions[-1] if self.regions else None
            if last is not None and lo < last.hi:   # two roots of one buffer: one copy, or they would diverge
                last.hi = max(last.hi, hi)
                last.writable = last.writable or writable
                last.members.append(i)
            else:
                self.regions.append(_Fenced(lo, hi, writable, i))
        try:
            for region in self.regions:
                region.map()
        except BaseException:
            self.close(copy_back=False)
            raise

    def address(self, index: int, a: np.ndarray) -> int:
        # by the region the argument was put in, not by its address: allocations may lie back to back
        # (two views of one PyTorch tensor's storage), where an address at one's end is the next one's start
        for r in self.regions:
            if index in r.members:
                return r.start + (a.ctypes.data - r.lo)
        raise AssertionError("an array argument outside every fenced allocation")

    def close(self, copy_back: bool = True) -> None:
        for region in self.regions:
            region.unmap(copy_back)

    def stray_write(self) -> str:
        """Where the launch wrote into a copy's slack, as :meth:`describe` says it ('' when nowhere)."""
        for region in self.regions:
            address = region.stray_write()
            if address is not None:
                return self.describe(address)
        return ""

    def describe(self, address: int) -> str:
        """Where a faulting address lies relative to the fenced arguments ('' when in no fence)."""
        for r in self.regions:
            if r.base <= address < r.base + r.length:
                # as memcheck names them: arguments counted from 0
                which = " and ".join(f"argument {i}" for i in sorted(r.members))
                allocation = f"(a {r.hi - r.lo}-byte allocation)"
                end = r.start + (r.hi - r.lo)
                if address >= end:
                    return f"{address - end} bytes past the end of {which} {allocation}"
                return f"{r.start - address} bytes before {which} {allocation}"
        return ""


def _fault_near_argument(message: str, fenced: _FencedArguments | None) -> str:
    """A fault's message with where its address lies relative to the arguments, if it hit a fence."""
    found = re.search(r"an out-of-bounds memory access at (0x[0-9a-f]+)", message)
    where = fenced.describe(int(found.group(1), 16)) if fenced is not None and found else ""
    return message.replace(found.group(0), f"{found.group(0)}, {where}") if where else message


def _kept_count() -> int:
    return sum(len(bases) for bases in _kept_fences.values())


def _asan_build() -> bool:
    return os.environ.get("LLMCUPY_SIM_ASAN", "") not in ("", "0")


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns a view's memory: the allocation, as a GPU's cudaMalloc."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _xyz(linear: int, block) -> tuple:
    return (linear % block[0], (linear // block[0]) % block[1], linear // (block[0] * block[1]))


def _sanitizer_error(library: SimLibrary, name: str, block, rows: list) -> SimSanitizerError | None:
    from . import symbols

    found = [r for r in rows if len(r) >= 18]
    dropped = next((int(r[1]) for r in rows if r and r[0] == "dropped" and len(r) > 1), 0)
    if not found:
        return None
    prefer = re.sub(r"[^\w.-]", "_", library._source[3])  # the kernel file's name in the line tables
    where = symbols.lines(str(library.path), [int(r[3]) for r in found] + [int(r[4]) for r in found], prefer)
    space = {"0": "shared", "1": "global", "2": "unknown"}
    reports = []
    for r in found:
        pc, prev = int(r[3]), int(r[4])
        reports.append(SanitizerReport(
            kind=r[0], kernel=name, space=space.get(r[1], "unknown"), warp_synchronous=r[2] == "1",
            line=where.get(pc, "??"), prev_line=where.get(prev, "") if prev else "",
            block=(int(r[5]), int(r[6]), int(r[7])), thread=_xyz(int(r[8]), block),
            prev_thread=_xyz(int(r[9]), block) if r[0] in ("RAW", "WAR", "WAW") else (),
            address=int(r[10]), size=int(r[11]), write=r[12] == "1", count=int(r[13]),
            prev_block=(int(r[14]), int(r[15]), int(r[16])) if r[0] in ("RAW", "WAR", "WAW") else (), where=r[17]))
    # one line per pair of source lines (several code addresses can share a line)
    seen, lines = set(), []
    for rep in reports:
        key = (rep.kind, rep.line, rep.prev_line)
        if key not in seen:
            seen.add(key)
            lines.append(rep.describe())
    shown = lines[:5]
    more = len(lines) - len(shown)
    message = f"{name}: the sanitizers found {len(lines)} problem(s):\n  " + "\n  ".join(shown)
    if more > 0:
        message += f"\n  ... and {more} more (SimSanitizerError.reports lists them all)"
    if dropped:
        message += f"\n  ({dropped} further distinct reports were not kept)"
    return SimSanitizerError(message, reports)


# Fiber stacks. Each library keeps, on each of its worker threads, a stack for every thread of the
# largest block it ran there, for the life of the process, so that a launch does not map stacks
# anew. A stack is two memory mappings (the stack and its guard page), and Linux caps the mappings
# of a process (vm.max_map_count, 65530 by default): a process that launches many libraries (the
# test suite, a notebook going through the catalogue), or a 1024-thread launch on many workers,
# would run out, and every later mmap of the process fails. So the stacks held at once stay within
# a budget of a quarter of that cap: a launch uses no more workers than fit it, and the libraries
# launched least recently give their stacks back first (a few ms to map again on their next launch).
def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


FIBER_BUDGET = _max_map_count() // 4   # stacks (two mappings each): half the cap, the rest is the process's
_fiber_holders: dict = {}              # library -> stacks it may hold (an upper bound), least recent first
_fiber_lock = threading.Lock()


def _reserve_fibers(library: "SimLibrary", threads: int, workers: int) -> int:
    """The workers a launch of ``threads``-thread blocks on ``library`` may use; gives back other
    libraries' stacks until its own fit the budget."""
    workers = max(1, min(workers, FIBER_BUDGET // threads))
    with _fiber_lock:
        need = max(_fiber_holders.pop(library, 0), threads * workers)
        while _fiber_holders and sum(_fiber_holders.values()) + need > FIBER_BUDGET:
            oldest = next(iter(_fiber_holders))
            del _fiber_holders[oldest]
            oldest.release_fibers()
        _fiber_holders[library] = need
    return workers


def cooperative_block_limit(threads: int) -> int:
    """The blocks of ``threads`` threads the emulator's device holds at once (what
    cudaOccupancyMaxActiveBlocksPerMultiprocessor times the SM count gives on a GPU, counting
    threads, in whole warps, and blocks per SM; registers and shared memory are not modelled)."""
    warps = -(-threads // 32)
    return DEVICE_SMS * min(DEVICE_MAX_BLOCKS_PER_SM, DEVICE_MAX_THREADS_PER_SM // (32 * warps))


def _check_cooperative(name: str, grid, block) -> int:
    """The number of blocks of a cooperative launch, or SimCooperativeLaunchTooLargeError before
    anything runs when they do not all fit the device at once (a GPU refuses such a launch)."""
    nblocks = int(np.prod(grid[:3], dtype=np.int64))
    threads = int(np.prod(block[:3], dtype=np.int64))
    limit = cooperative_block_limit(threads)
    if nblocks > limit:
        per_sm = limit // DEVICE_SMS
        raise SimCooperativeLaunchTooLargeError(
            f"{name}: a cooperative launch of grid {tuple(grid[:3])} ({nblocks} blocks of {threads} threads) does not "
            f"fit the emulator's device at once: at most {limit} blocks ({DEVICE_SMS} SMs x {per_sm} resident blocks "
            f"of {threads} threads, {DEVICE_MAX_THREADS_PER_SM} threads and {DEVICE_MAX_BLOCKS_PER_SM} blocks per SM); "
            "a GPU refuses it as well (cudaErrorCooperativeLaunchTooLarge). Launch at most that many blocks and let "
            "each cover several items (a grid-stride loop)")
    return nblocks


def launch(entry, name: str, grid, block, args: list, shared_mem: int = 0, stack_bytes: int = 0,
           cooperative: bool = False) -> None:
    """Runs ``entry`` (from :meth:`SimLibrary.launcher`) over ``grid`` x ``block``.

    ``args`` are already checked: NumPy arrays (passed by address), ``None`` (a null pointer) or
    NumPy scalars (passed by their bytes). ``cooperative``: every block runs at once, each on its own
    OS thread, and ``grid.sync()`` is allowed; the grid must fit the device (see
    :func:`cooperative_block_limit`), and the ``workers`` setting does not apply.
    """
    if cooperative:
        _check_cooperative(name, grid, block)
    global _launches, _stack_kb_checked
    if not _stack_kb_checked:
        env_stack_kb()   # the C++ reads it at its first launch: a negative value wraps to a huge stack
        _stack_kb_checked = True
    keep = []  # keeps every argument's storage alive during the call
    addresses = (ctypes.c_void_p * max(1, len(args)))()
    pointers = {}   # argument index -> the slot holding the pointer the kernel gets
    for i, a in enumerate(args):
        if a is None or isinstance(a, np.ndarray):
            slot = ctypes.c_void_p(None if a is None else a.ctypes.data)
            keep.append(slot)
            pointers[i] = slot
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
    cfg.workers = max(1, _resolved_workers())
    cfg.seed = _settings.seed
    cfg.poison = int(_settings.poison)
    cfg.stack_bytes = stack_bytes
    cfg.timeout_ms = int(round(_resolved_timeout() * 1000))
    cfg.cooperative = int(bool(cooperative))
    check = _settings.check if _settings.check is not None else check_bits()
    if _metrics.enabled():  # inside sim.metrics.collect(): the memory-traffic observer too
        check |= CHECK_METRICS
    library = None
    if check and isinstance(entry, _Entry):
        library = entry.library.checked()
        fn = entry.checked()
        cfg.stack_bytes = max(stack_bytes, library.stack_bytes)
        cfg.check = check
        if check & CHECK_METRICS:
            _metrics.prepare(library)
        extents = (ctypes.c_ulonglong * max(2, 2 * len(args)))()
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                extents[2 * i], extents[2 * i + 1] = _root_extent(a)
        cfg.nbuffers = len(args)
        cfg.buffers = extents
        keep.append(extents)
    else:
        fn = entry.fn if isinstance(entry, _Entry) else entry
    if isinstance(entry, _Entry):
        nblocks = int(np.prod(grid[:3], dtype=np.int64))
        threads = max(1, int(np.prod(block[:3], dtype=np.int64)))
        if cooperative:
            # one OS thread per block, all at once; their fiber stacks must fit the budget together
            cfg.workers = _reserve_fibers(library or entry.library, threads, nblocks)
            if cfg.workers < nblocks:
                raise SimCooperativeLaunchTooLargeError(
                    f"{name}: a cooperative launch of {nblocks} blocks of {threads} threads needs {nblocks * threads} "
                    f"fiber stacks at once, more than this process may map ({FIBER_BUDGET}, a quarter of "
                    "vm.max_map_count); launch fewer blocks")
        else:
            cfg.workers = _reserve_fibers(library or entry.library, threads, min(cfg.workers, max(1, nblocks)))
    res = _LaunchResult()
    fenced, stray = None, ""
    if library is not None:
        entry.library.sync_variables(to_checked=True)
        try:
            rc = fn(ctypes.byref(cfg), addresses, ctypes.byref(res))
        finally:
            entry.library.sync_variables(to_checked=False)
    else:
        # memcheck checks a checked launch's accesses, AddressSanitizer an ASan build's (which the copies
        # would hide); a plain one runs on fenced copies
        if _asan_build():
            rc = fn(ctypes.byref(cfg), addresses, ctypes.byref(res))
        else:
            # one fenced launch at a time: two launches from two threads would each copy a shared
            # allocation and copy it back whole, the later one undoing the other's writes (on a GPU,
            # kernels of two streams writing disjoint parts of one buffer both land)
            with _fenced_launch_lock:
                fenced = _FencedArguments(args)
                for i, slot in pointers.items():
                    if args[i] is not None:
                        slot.value = fenced.address(i, args[i])
                try:
                    rc = fn(ctypes.byref(cfg), addresses, ctypes.byref(res))
                    stray = fenced.stray_write()
                finally:
                    fenced.close()
    with _counters_lock:
        _launches += 1
        for k in HAZARDS:
            _counters[k] += getattr(res, k)
    for k in HAZARDS:
        if getattr(res, k):
            # once per kernel and hazard (Python's default filter shows each message once per place)
            warnings.warn(SimHazardWarning(
                f"{name}: {getattr(res, k)} {_HAZARD_TEXT[k]} ({k}): CUDA requires every thread of a block to reach "
                "each __syncthreads() and a collective's lanes to take part in it; a GPU may hang or give other "
                "results. llmcupy.sim.hazards() counts these"), stacklevel=4)
    if library is not None and check & CHECK_METRICS and not res.error:
        _metrics.record_launch(library._lib, str(library.path), name, grid, block, shared_mem, library._source[3])
    if library is not None:
        error = _sanitizer_error(library, name, block, library.reports())
        if error is None and res.sanitizer_stop:  # cannot happen (memcheck always keeps its report)
            error = SimSanitizerError(f"{name}: memcheck stopped the launch", [])
        if error is not None:
            raise error
    if res.error:
        raise SimLaunchError(f"{name}: {res.message.decode(errors='replace').rstrip()}")
    message = res.message.decode(errors="replace").rstrip()
    if res.assert_failed:
        raise SimDeviceAssertError(message)
    if res.timed_out:
        raise SimTimeoutError(message)
    if res.shared_overflow:
        raise SimSharedMemoryError(message)
    if res.memory_fault:
        raise SimMemoryFaultError(_fault_near_argument(message, fenced))
    if stray and rc == 0 and not res.deadlock:
        raise SimMemoryFaultError(
            f"kernel {name} wrote out of bounds, {stray}: the emulator found it after the launch, in the slack "
            "between the array's copy and its fences, and cannot say which thread (the launch again inside `with "
            'llmcupy.sim.settings(check="memory"):`, or with LLMCUPY_SIM_CHECK=memory, names the thread and line)')
    if rc == 2 or res.deadlock:
        raise SimDeadlockError(res.message.decode(errors="replace").rstrip())
