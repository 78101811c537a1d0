"""Builds a CUDA C source into a shared library the emulator can launch.

The source is compiled unchanged except for two line-preserving rewrites (so compiler errors and
deadlock reports point at the right lines of the .cu file):

* ``__shared__ T name[dims];`` becomes a reference to per-block storage that is poisoned with
  0xFF bytes (NaN for floats) when each block starts;
* ``extern __shared__ T name[];`` becomes a pointer to the launch's dynamic shared memory.

For every kernel an ``extern "C"`` entry point is appended; it unpacks a ``void**`` argument array
into the kernel's own parameter types (the compiler checks them) and exports the parameter types
as C spellings, which the runtime uses to check arguments exactly.

Libraries are cached by the hash of everything that goes into them (source, included files, the
emulator's headers, flags, compiler version), under ``$LLMCUPY_CACHE_DIR/sim`` (default
``~/.cache/llmcupy/sim``). A build writes to a temporary name and renames it into place, so two
processes compiling the same source at once both end up with a complete library.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

INCLUDE_DIR = Path(__file__).resolve().parent / "include"

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)?"
    r"(?P<type>[A-Za-z_][\w:]*(?:\s*\*)?)\s+"
    r"(?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)?(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*;"
)
_STATIC_SHARED = re.compile(
    r"(?<![\w])__shared__\s+(?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)?"
    r"(?P<type>(?:const\s+)?[A-Za-z_][\w:]*(?:\s*<[^;<>]*>)?)\s+"
    r"(?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)?(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]\n]+\]\s*)*);"
)
_GLOBAL_FN = re.compile(
    r"(?P<template>template\s*<[^{};]*?>\s*)?"
    r"(?:extern\s+\"C\"\s+)?__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(?P<name>[A-Za-z_]\w*)\s*\("
)
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


class SimCompileError(RuntimeError):
    """g++ rejected the source; the message carries the compiler's diagnostics."""


def strip_comments(code: str) -> str:
    """Replaces comments by the same number of newlines, so line numbers survive."""
    return _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n") or " ", code)


def rewrite_shared(code: str) -> str:
    """Line-preserving rewrite of ``__shared__`` declarations (see the module docstring)."""
    code = _EXTERN_SHARED.sub(
        lambda m: f"{m['type']}* {m['name']} = llmcupy_sim::dynamic_shared<{m['type']}>();", code
    )
    counter = iter(range(1_000_000))

    def static(m: re.Match) -> str:
        dims = re.sub(r"\s+", "", m["dims"])
        return f"auto& {m['name']} = llmcupy_sim::shared_var<{m['type']}{dims}, {next(counter)}>();"

    return _STATIC_SHARED.sub(static, code)


def global_kernel_names(code: str) -> list[str]:
    """Names of the non-template ``__global__`` functions (templates need name expressions)."""
    names = []
    for m in _GLOBAL_FN.finditer(strip_comments(code)):
        if not m["template"] and m["name"] not in names:
            names.append(m["name"])
    return names


def _included_files(code: str, include_dirs: list[Path], seen: set[Path]) -> list[Path]:
    found = []
    for rel in _QUOTED_INCLUDE.findall(code):
        for d in include_dirs:
            p = (d / rel).resolve()
            if p.is_file() and p not in seen:
                seen.add(p)
                found.append(p)
                found += _included_files(p.read_text(), include_dirs + [p.parent], seen)
                break
    return found


def _compiler_env() -> dict:
    """The environment for g++: without LD_PRELOAD. The ASan recipe preloads libasan into Python;
    inherited by g++ it makes LeakSanitizer fail the compiler's own run (exit 1 and pages of leak
    reports), which would read as "no compiler"."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


class CompilerNotFound(SimCompileError):
    """No working C++ compiler: the machine's set-up, not the kernel (the CLIs exit 2)."""


@functools.lru_cache(maxsize=None)
def compiler_identity(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True,
                              env=_compiler_env()).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CompilerNotFound(
            f"the emulator needs a C++17 compiler ({cxx!r} did not run: {exc}). "
            "Install g++ (e.g. `apt-get install g++`) or set CXX."
        ) from exc


def cache_dir() -> Path:
    root = os.environ.get("LLMCUPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "llmcupy")
    return Path(root) / "sim"


def translate_options(options) -> tuple[list[str], list[Path]]:
    """Maps NVRTC options onto g++: -I, -D and -std carry over; GPU-only options are dropped."""
    flags, include_dirs = [], []
    it = iter(options or ())
    for opt in it:
        if opt in ("-I", "--include-path"):
            include_dirs.append(Path(next(it)))
        elif opt.startswith("--include-path="):
            include_dirs.append(Path(opt.split("=", 1)[1]))
        elif opt.startswith("-I"):
            include_dirs.append(Path(opt[2:]))
        elif opt.startswith(("-D", "--define-macro=")):
            flags.append("-D" + opt.split("=", 1)[1] if opt.startswith("--define") else opt)
        elif opt.startswith(("-std=", "--std=")):
            flags.append("-std=" + opt.split("=", 1)[1])
        # --use_fast_math, -arch, --gpu-architecture, -lineinfo ...: no meaning on a CPU.
    return flags, include_dirs


def build_library(code: str, kernels: list[str], options=(), filename: str = "kernel.cu") -> Path:
    """Compiles ``code`` with one entry point per name in ``kernels``; returns the .so path."""
    flags, include_dirs = translate_options(options)
    if not any(f.startswith("-std=") for f in flags):
        flags.append("-std=c++17")
    asan = os.environ.get("LLMCUPY_SIM_ASAN", "") not in ("", "0")
    cxx = os.environ.get("CXX", "g++")
    # Hidden visibility and no GNU-unique symbols: every library keeps its own copy of the
    # emulator's state (workers, pools, shared-memory storage), even when several libraries built
    # with different options are loaded in one process.
    base_flags = ["-O2", "-g0", "-fPIC", "-shared", "-fno-strict-aliasing", "-pthread", "-w",
                  "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-fno-gnu-unique"]
    if asan:
        base_flags += ["-fsanitize=address", "-fno-omit-frame-pointer"]

    body = rewrite_shared(code)
    entries = []
    for i, name in enumerate(kernels):
        entries.append(
            f'extern "C" LLMCUPY_SIM_EXPORT int llmcupy_sim_entry_{i}(const llmcupy_sim::LaunchConfig* c, void** a, '
            f"llmcupy_sim::LaunchResult* r) {{ return llmcupy_sim::launch(&{name}, \"{name}\", c, a, r); }}\n"
            f'extern "C" LLMCUPY_SIM_EXPORT const char* llmcupy_sim_signature_{i}() {{ return llmcupy_sim::signature(&{name}); }}\n'
        )
    safe_name = re.sub(r"[^\w.-]", "_", filename)
    unit = (
        '#include "llmcupy_sim.h"\n'
        f'#line 1 "{safe_name}"\n'
        f"{body}\n"
        '#line 1 "llmcupy_sim_entries"\n'
        + "".join(entries)
    )

    digest = hashlib.sha256()
    for part in (unit, " ".join(flags + base_flags), compiler_identity(cxx)):
        digest.update(part.encode())
    for p in sorted(INCLUDE_DIR.rglob("*.h")):
        digest.update(p.read_bytes())
    for p in _included_files(code, include_dirs, set()):
        digest.update(p.read_bytes())
    key = digest.hexdigest()[:24]
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{Path(safe_name).stem}-{key}{'-asan' if asan else ''}.so"
    if lib.exists():
        return lib

    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
        src = Path(tmp) / "unit.cpp"
        src.write_text(unit)
        tmp_lib = Path(tmp) / "lib.so"
        cmd = [cxx, *base_flags, *flags, f"-I{INCLUDE_DIR}", *[f"-I{d}" for d in include_dirs], str(src), "-o", str(tmp_lib)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_compiler_env())
        if proc.returncode != 0:
            raise SimCompileError(f"the emulator could not compile {filename}:\n{proc.stderr.strip()}")
        # Atomic publish: a concurrent reader sees either no library or a complete one.
        os.replace(tmp_lib, lib)
    return lib


def clear_cache() -> None:
    shutil.rmtree(cache_dir(), ignore_errors=True)
