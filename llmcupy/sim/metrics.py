"""Memory-traffic metrics of emulator launches (the observer in ``include/llmcupy_sim_metrics.h``).

    from llmcupy.sim import metrics
    with metrics.collect() as launches:       # launches inside run the instrumented build
        op(x, version=1)
    launches[0]["sites"]                      # per access site: line, kind, requests, sectors, ...

Each launch inside :func:`collect` runs the kernel's instrumented build with the metrics bit of the
launch's check mask set; the C++ observer aggregates every load and store per access site while
the launch runs (nothing per access reaches Python), and afterwards this module reads the site
table and the launch totals and maps each site's address to ``file:line`` (``symbols.py``). One
record per launch::

    {"kernel", "grid", "block", "shared_mem",
     "totals": {"unique_read_bytes", "unique_written_bytes", "untracked_global", "local_accesses",
                "buffer_bytes"},
     "sites": [{"line", "kind", "width", "requests", "lane_accesses", "bytes", "sectors",
                "wavefronts", "ideal_wavefronts"}, ...]}

``kind`` is one of :data:`KINDS`. Several sites on one source line stay separate rows here (one
per instruction); ``llmcupy.analyze`` sums them per line.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import threading

KINDS = ("global load", "global store", "global atomic", "shared load", "shared store", "shared atomic")
CHECK_METRICS = 8  # the launch's check mask bit (CHECK_METRICS in llmcupy_sim.h)


class _SiteStats(ctypes.Structure):
    _fields_ = [("pc", ctypes.c_ulonglong), ("kind", ctypes.c_uint), ("max_size", ctypes.c_uint),
                ("requests", ctypes.c_ulonglong), ("lane_accesses", ctypes.c_ulonglong), ("bytes", ctypes.c_ulonglong),
                ("sectors", ctypes.c_ulonglong), ("wavefronts", ctypes.c_ulonglong),
                ("ideal_wavefronts", ctypes.c_ulonglong)]


class _LaunchTotals(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in
                ("unique_read_bytes", "unique_written_bytes", "untracked_global", "local_accesses", "sites",
                 "buffer_bytes")]


_local = threading.local()


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def enabled() -> bool:
    """Is a :func:`collect` block active in this thread (launches then run instrumented)?"""
    return bool(getattr(_local, "stack", None))


@contextlib.contextmanager
def collect():
    """Collects one metrics record per emulator launch inside the block (see the module docstring).

    Nested blocks each get every launch made inside them."""
    records: list = []
    _stack().append(records)
    try:
        yield records
    finally:
        _stack().remove(records)


def read(cdll, path: str, filename: str | None = None) -> tuple[dict, list]:
    """The totals and the site rows the last launch of the library ``cdll`` (loaded from ``path``)
    left. Lines are given in ``filename`` (the kernel's source file) where a helper was inlined."""
    from . import symbols

    totals = _LaunchTotals()
    cdll.llmcupy_sim_metrics_totals(ctypes.byref(totals))
    n = int(totals.sites)
    rows = (_SiteStats * max(1, n))()
    fetch = cdll.llmcupy_sim_metrics_sites
    fetch.restype = ctypes.c_ulonglong
    fetch.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
    n = int(fetch(ctypes.addressof(rows), n))
    # the unit is compiled under the file's name with odd characters replaced (compiler.py)
    prefer = re.sub(r"[^\w.-]", "_", filename) if filename else None
    lines = symbols.lines(path, [rows[i].pc for i in range(n)], prefer=prefer)
    sites = []
    for i in range(n):
        r = rows[i]
        sites.append({"line": lines.get(int(r.pc), "??"), "kind": KINDS[r.kind], "width": int(r.max_size),
                      "requests": int(r.requests), "lane_accesses": int(r.lane_accesses), "bytes": int(r.bytes),
                      "sectors": int(r.sectors), "wavefronts": int(r.wavefronts),
                      "ideal_wavefronts": int(r.ideal_wavefronts)})
    out = {k: int(getattr(totals, k)) for k, _ in _LaunchTotals._fields_ if k != "sites"}
    return out, sites


def line_table(path: str) -> tuple[list, list]:
    """(code offsets, line ids) from the library's DWARF line table (``objdump --dwarf=decodedline``):
    where each source line's code starts, sorted; id 0 ends a sequence. Empty without binutils."""
    import shutil
    import subprocess

    tool = shutil.which("objdump")
    if tool is None:
        return [], []
    try:
        text = subprocess.run([tool, "--dwarf=decodedline", path], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return [], []
    ids: dict = {}
    rows = []
    for row in text.splitlines():
        fields = row.split()
        if len(fields) < 3 or not fields[2].startswith("0x"):
            continue
        line = fields[1]
        ident = ids.setdefault((fields[0], line), len(ids) + 1) if line.isdigit() else 0
        rows.append((int(fields[2], 16), ident))
    rows.sort(key=lambda r: r[0])
    return [r[0] for r in rows], [r[1] for r in rows]


def prepare(library) -> None:
    """Hands the instrumented ``library`` (a ``launcher.SimLibrary``) its line table, once: the
    observer joins the scalar moves g++ makes of one float4 copy only within one source line."""
    if getattr(library, "_metrics_lines", False):
        return
    from . import symbols

    library._metrics_lines = True
    starts, ids = line_table(str(library.path))
    base = symbols.load_base(str(library.path))
    if not starts or base is None:
        return
    fn = library._lib.llmcupy_sim_metrics_set_lines
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_ulonglong]
    a = (ctypes.c_ulonglong * len(starts))(*starts)
    b = (ctypes.c_uint * len(ids))(*ids)
    fn(ctypes.addressof(a), ctypes.addressof(b), len(starts), base)


def record_launch(cdll, path: str, name: str, grid, block, shared_mem: int, filename: str | None = None) -> None:
    """Called by the launcher after a launch made with :data:`CHECK_METRICS`: reads the tables and
    hands the record to every active :func:`collect` block."""
    totals, sites = read(cdll, path, filename)
    record = {"kernel": name, "file": filename, "grid": [int(g) for g in grid], "block": [int(b) for b in block],
              "shared_mem": int(shared_mem), "totals": totals, "sites": sites}
    for records in _stack():
        records.append(record)
