"""Source lines of code addresses inside a loaded emulator library (for sanitizer and metrics reports).

The access hooks report ``pc``, a return address inside the kernel's code. :func:`lines` subtracts
the library's load base (from ``/proc/self/maps``) and asks ``addr2line`` (binutils) for all the
addresses of one library in a single call; results are cached per library and address. The
instrumented build has line tables (``-g1``) and its kernel source is compiled under the .cu file's
own name (``#line 1 "softmax_forward.cu"``), so a line reads ``softmax_forward.cu:42``. An address
inside an emulator helper inlined into the kernel (``__ldg``, a cooperative-groups call) is given
the kernel line that called it (addr2line's inline chain), not the helper's line in the header.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache

_CACHE: dict[tuple[str, int], str] = {}
# frames in these files are the emulator's or the C++ library's, not the kernel's
_EMULATOR_FILES = ("/sim/include/", "/usr/")


def load_base(path: str) -> int | None:
    """The address at which ``path`` is mapped in this process (its first mapping), or None."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6 and fields[5] == real and int(fields[2], 16) == 0:
                    return int(fields[0].split("-")[0], 16)
    except OSError:
        return None
    return None


@lru_cache(maxsize=1)
def _addr2line() -> str | None:
    return shutil.which("addr2line")


def _pick(frames: list[str], prefer: str | None) -> str:
    """From addr2line's inline chain (innermost first): the first frame in the kernel's own file
    (``prefer``), else the first outside the emulator's headers (a helper of an included .cuh)."""
    chosen = next((loc for loc in frames if prefer and os.path.basename(loc.rpartition(":")[0]) == prefer), None)
    chosen = chosen or next((loc for loc in frames if not loc.startswith("??") and
                             not any(marker in loc for marker in _EMULATOR_FILES)), frames[0] if frames else "??")
    file, _, line = chosen.rpartition(":")
    return f"{os.path.basename(file)}:{line}" if file else chosen


def lines(path: str, pcs, prefer: str | None = None) -> dict[int, str]:
    """``{pc: "file.cu:LINE"}`` for absolute addresses inside the library at ``path`` ("??" if unknown);
    ``prefer``: the kernel's file name, whose line wins over an inlined helper's."""
    pcs = [int(p) for p in pcs if p]
    out = {p: _CACHE[(path, p)] for p in pcs if (path, p) in _CACHE}
    todo = sorted({p for p in pcs if p not in out})
    if not todo:
        return out
    base, tool = load_base(path), _addr2line()
    if base is None or tool is None:
        for p in todo:
            out[p] = f"{os.path.basename(path)}+{p - (base or 0):#x}"  # no binutils: at least an offset
        return out
    # The return address is the instruction after the call; pc - 1 lies inside the call itself.
    args = [tool, "-i", "-a", "-e", path] + [f"{p - base - 1:#x}" for p in todo]
    try:
        text = subprocess.run(args, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    chains: list[list[str]] = []
    for row in text.splitlines():
        row = row.strip()
        if row.startswith("0x"):
            chains.append([])
        elif chains:
            loc = row.split(" (discriminator")[0]
            file, _, line = loc.rpartition(":")
            chains[-1].append(loc)
    for p, chain in zip(todo, chains + [[]] * (len(todo) - len(chains))):
        out[p] = _CACHE[(path, p)] = _pick(chain, prefer)
    return out
