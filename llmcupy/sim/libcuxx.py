"""libcu++ (CCCL) in the CPU emulator: the real headers, compiled by the host compiler as a host library.

A kernel's ``#include <cuda/std/optional>`` finds a generated wrapper (wrapper_dir, in the compile cache),
which hides the emulator's CUDA macros and its renames of the kernel's source (llmcupy_sim_libcuxx_begin.h),
includes the real header and defines again the C-library macros NVRTC's version brings in. The real headers
are CuPy's bundled CCCL, what the GPU path compiles against (CuPy puts it on NVRTC's -I), found without
importing CuPy; LLMCUPY_SIM_LIBCUDACXX names another libcudacxx include folder, or ``none`` for the
emulator's own stand-ins (include/cuda/std/*: cuda::std as the host's std, about twenty headers), which are
also what a machine without CuPy gets.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path

ENV_VAR = "LLMCUPY_SIM_LIBCUDACXX"
# where CuPy keeps its bundled libcu++, under its package folder
_CUPY_LIBCUDACXX = Path("_core", "include", "cupy", "_cccl", "libcudacxx")
_VERSION_H = Path("cuda", "std", "__cccl", "version.h")


class LibcudacxxSettingError(ValueError):
    """LLMCUPY_SIM_LIBCUDACXX names no libcu++: the machine's set-up, not the kernel."""


def _package_dir(name: str) -> Path | None:
    """The folder of an installed package, found without importing it (CuPy's import takes seconds and
    wants a CUDA driver)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or spec.origin in ("namespace", "built-in"):
        return None
    return Path(spec.origin).parent


@functools.lru_cache(maxsize=None)
def _find(setting: str) -> Path | None:
    if setting.lower() == "none":
        return None
    if setting:
        root = Path(setting).expanduser()
        if not (root / _VERSION_H).is_file():
            raise LibcudacxxSettingError(
                f"{ENV_VAR}={setting} holds no libcu++ (no {_VERSION_H.as_posix()} there): set it to a libcudacxx "
                f"include folder (CuPy's is cupy/{_CUPY_LIBCUDACXX.as_posix()}), to 'none' for the emulator's "
                "stand-ins, or unset it")
        return root.resolve()
    cupy = _package_dir("cupy")
    if cupy is not None and (cupy / _CUPY_LIBCUDACXX / _VERSION_H).is_file():
        return (cupy / _CUPY_LIBCUDACXX).resolve()
    return None


def libcudacxx_dir() -> Path | None:
    """The folder holding cuda/std/... and nv/target of the libcu++ the emulator compiles against, or None
    for the emulator's stand-ins."""
    return _find(os.environ.get(ENV_VAR, "").strip())


def cccl_version(root: Path) -> str:
    m = re.search(r"#define\s+CCCL_VERSION\s+(\d+)", (root / _VERSION_H).read_text())
    return m[1] if m else "unknown"


# The C-library macros NVRTC's libcu++ headers define (the emulator #undef-s the host's where the
# kernel's source starts: MACROS_NVRTC_LACKS in sim/compiler.py); the other headers get them by including
# these, as under NVRTC. The values are the compiler's predefined macros, as in the stand-ins.
_FLOAT = """FLT_MAX __FLT_MAX__
FLT_MIN __FLT_MIN__
FLT_EPSILON __FLT_EPSILON__
FLT_TRUE_MIN __FLT_DENORM_MIN__
FLT_DIG __FLT_DIG__
FLT_MANT_DIG __FLT_MANT_DIG__
FLT_MAX_EXP __FLT_MAX_EXP__
FLT_MIN_EXP __FLT_MIN_EXP__
FLT_RADIX __FLT_RADIX__
DBL_MAX __DBL_MAX__
DBL_MIN __DBL_MIN__
DBL_EPSILON __DBL_EPSILON__
DBL_TRUE_MIN __DBL_DENORM_MIN__
DBL_DIG __DBL_DIG__
DBL_MANT_DIG __DBL_MANT_DIG__
DBL_MAX_EXP __DBL_MAX_EXP__
DBL_MIN_EXP __DBL_MIN_EXP__"""
_LIMITS = """CHAR_BIT __CHAR_BIT__
SCHAR_MAX __SCHAR_MAX__
SCHAR_MIN (-SCHAR_MAX - 1)
UCHAR_MAX (SCHAR_MAX * 2 + 1)
SHRT_MAX __SHRT_MAX__
SHRT_MIN (-SHRT_MAX - 1)
USHRT_MAX (SHRT_MAX * 2 + 1)
INT_MAX __INT_MAX__
INT_MIN (-INT_MAX - 1)
UINT_MAX (INT_MAX * 2U + 1U)
LONG_MAX __LONG_MAX__
LONG_MIN (-LONG_MAX - 1L)
ULONG_MAX (LONG_MAX * 2UL + 1UL)
LLONG_MAX __LONG_LONG_MAX__
LLONG_MIN (-LLONG_MAX - 1LL)
ULLONG_MAX (LLONG_MAX * 2ULL + 1ULL)"""
_CHAR = """#ifdef __CHAR_UNSIGNED__
#define CHAR_MIN 0
#define CHAR_MAX UCHAR_MAX
#else
#define CHAR_MIN SCHAR_MIN
#define CHAR_MAX SCHAR_MAX
#endif
"""
_STDINT = """INT8_MAX __INT8_MAX__
INT8_MIN (-INT8_MAX - 1)
UINT8_MAX __UINT8_MAX__
INT16_MAX __INT16_MAX__
INT16_MIN (-INT16_MAX - 1)
UINT16_MAX __UINT16_MAX__
INT32_MAX __INT32_MAX__
INT32_MIN (-INT32_MAX - 1)
UINT32_MAX __UINT32_MAX__
INT64_MAX __INT64_MAX__
INT64_MIN (-INT64_MAX - 1)
UINT64_MAX __UINT64_MAX__
SIZE_MAX __SIZE_MAX__"""
_MATH = """INFINITY __builtin_inff()
NAN __builtin_nanf("")"""


def _defines(table: str) -> str:
    return "".join("#define {} {}\n".format(*line.split(" ", 1)) for line in table.splitlines())


# What a wrapper adds after the real header: NVRTC's <cuda/std/cstdint> includes <cuda/std/climits>, the
# host build the host's <cstdint> instead; <cuda/std/ctime> includes <cuda/std/cstdint> under NVRTC only
_AFTER = {
    "cuda/std/cfloat": _defines(_FLOAT),
    "cuda/std/climits": _defines(_LIMITS) + _CHAR,
    "cuda/std/cstdint": "#include <cuda/std/climits>\n" + _defines(_STDINT),
    "cuda/std/cmath": _defines(_MATH),
    "cuda/std/ctime": "#include <cuda/std/cstdint>\n",
}
# The kernel's strlen, memcmp and calloc are renamed to llmcupy_nvrtc_no_NAME (NVRTC lacks the C library's), its
# cuda::std::strlen too: libcu++'s under that name
_AFTER["cuda/std/cstring"] = ("namespace cuda { namespace std {\n"
                              "constexpr auto& llmcupy_nvrtc_no_strlen = ::cuda::std::strlen;\n"
                              "constexpr auto& llmcupy_nvrtc_no_memcmp = ::cuda::std::memcmp;\n} }\n")
_AFTER["cuda/std/cstdlib"] = ("namespace cuda { namespace std {\n"
                              "constexpr auto& llmcupy_nvrtc_no_calloc = ::cuda::std::calloc;\n} }\n")

# The headers after which uint32_t, int64_t, ... are still undeclared under NVRTC (CCCL 3.1, NVRTC 12.4 to 13.5):
# the others include <cuda/std/cstdint>. The emulator's renames of these names stay on after them
# (llmcupy_sim_nvrtc_names_on.h), whatever the host build of the header included.
_WITHOUT_STDINT = {"nv/target", "cuda/algorithm", "cuda/version", "cuda/std/cassert", "cuda/std/cfloat",
                   "cuda/std/climits", "cuda/std/concepts", "cuda/std/cstddef", "cuda/std/execution",
                   "cuda/std/initializer_list", "cuda/std/iterator", "cuda/std/version"}

# libcu++'s waits (barrier, latch, semaphore, pipeline) spin or sleep on the OS thread in host code, while
# the threads they wait for are fibers of that same OS thread: a hang until the watchdog. Refused, as
# before, with what to use instead; <cuda/barrier> keeps cuda::aligned_size_t (cg::memcpy_async's size type).
_NOT_EMULATED = ("libcu++'s cuda::barrier, cuda::pipeline and cuda::memcpy_async (and cuda::std::barrier, latch and "
                 "semaphore) are not emulated: copy with cooperative_groups' cg::memcpy_async and cg::wait, or with "
                 "__pipeline_memcpy_async")
REFUSED = {
    **dict.fromkeys(("cuda/pipeline", "cuda/latch", "cuda/semaphore", "cuda/std/barrier", "cuda/std/latch",
                     "cuda/std/semaphore"), _NOT_EMULATED),
    **dict.fromkeys(("cuda/stream", "cuda/stream_ref", "cuda/devices", "cuda/memory_resource", "cuda/work_stealing"),
                    "CUDA's host-side API (streams, devices, memory resources) is host code, which a RawModule "
                    "source does not hold (NVRTC compiles device code only)"),
    # device-only in libcu++: a host build reads an empty header ("'warp_shuffle_idx' is not a member of ...")
    "cuda/warp": ("libcu++'s cuda::device::warp_shuffle_* and warp_match_all are not emulated: use __shfl_sync, "
                  "__shfl_xor_sync and __match_all_sync"),
    # its host_device_accessor asks the CUDA driver (cuPointerGetAttribute, through cuGetProcAddress) where a
    # pointer's memory is
    "cuda/mdspan": ("libcu++'s cuda::host_mdspan, device_mdspan and managed_mdspan ask the CUDA driver where the "
                    "memory is, which the emulator has no driver for: use cuda::std::mdspan from <cuda/std/mdspan>"),
    "cuda/ptx": "cuda::ptx:: wraps PTX instructions, which the emulator does not run (inline PTX is not emulated)",
}
# <cuda/barrier>: only cuda::aligned_size_t, as the stand-in
_INSTEAD = {"cuda/barrier": "cuda/__barrier/aligned_size.h"}


# The host C library's macros NVRTC lacks are #undef-ed where the kernel's source starts (MACROS_NVRTC_LACKS in
# sim/compiler.py). Those NVRTC's <cuda/std/cfloat>, <cuda/std/cstdint> and <cuda/std/cstddef> define are pushed
# there first, and their wrappers take them back (#pragma pop_macro: the host's definitions), as the stand-ins do.
def _kept_after(name: str) -> str:
    from . import compiler   # imports this module: the lists are read when a wrapper is made

    kept = {"cuda/std/cfloat": compiler._FLOAT_MACROS_KEPT, "cuda/std/cstdint": compiler._STDINT_MACROS_KEPT}.get(name, ())
    if name not in _WITHOUT_OFFSETOF:
        kept = (*kept, "offsetof")
    return "".join(f'#pragma pop_macro("{macro}")\n' for macro in kept)


# The headers after which offsetof is still undefined under NVRTC (CCCL 3.1, NVRTC 12.4 and 12.9; the others bring
# in libcu++'s <cuda/std/cstddef>, whose offsetof the host build takes from the host's <stddef.h>)
_WITHOUT_OFFSETOF = {"nv/target", "cuda/algorithm", "cuda/version", "cuda/std/cassert", "cuda/std/cfloat",
                     "cuda/std/climits", "cuda/std/cstdint", "cuda/std/initializer_list", "cuda/std/ratio",
                     "cuda/std/source_location", "cuda/std/version"}


# Macros libcu++'s own host code uses that no NVRTC header defines (numeric_limits<long double>, the pthread
# sleep's EINTR loop): pushed where the kernel's source starts too (sim/compiler.py), defined again while the
# outermost wrapper reads its real header, and undefined after it, so the kernel never sees them.
HOST_MACROS_LIBCUXX_USES = ("LDBL_DIG", "LDBL_EPSILON", "LDBL_MANT_DIG", "LDBL_MAX", "LDBL_MAX_10_EXP",
                            "LDBL_MAX_EXP", "LDBL_MIN", "LDBL_MIN_10_EXP", "LDBL_MIN_EXP", "LDBL_TRUE_MIN",
                            "LDBL_DECIMAL_DIG", "LDBL_HAS_SUBNORM", "errno", "EINTR")


def _host_macros(name: str, on: bool) -> str:
    outer = "LLMCUPY_SIM_LIBCUXX_OUTER_" + re.sub(r"\W", "_", name)
    if on:
        return ("#ifndef LLMCUPY_SIM_LIBCUXX_READING\n#define LLMCUPY_SIM_LIBCUXX_READING 1\n"
                f"#define {outer} 1\n"
                + "".join(f'#pragma pop_macro("{m}")\n#pragma push_macro("{m}")\n' for m in HOST_MACROS_LIBCUXX_USES)
                + f'#ifdef _NV__TARGET_MACROS\n#include "{NV_TARGET_HOST}"\n#endif\n'
                + "#endif\n")
    return (f"#ifdef {outer}\n#undef {outer}\n#undef LLMCUPY_SIM_LIBCUXX_READING\n"
            + "".join(f"#undef {m}\n" for m in HOST_MACROS_LIBCUXX_USES)
            + f'#ifdef _NV__TARGET_MACROS\n#include "{NV_TARGET_DEVICE}"\n#endif\n' + "#endif\n")


# <nv/target>'s NV_IF_TARGET(NV_IS_DEVICE, ...), NV_PROVIDES_SM_80, ... are decided (as _NV_TARGET_BOOL_* macros)
# when nv/detail/__target_macros is read. Read as host code here, it gave a kernel's own NV_IF_TARGET the host
# branch, where NVRTC takes the device one. After the outermost wrapper the kernel sees NVRTC's device values for
# the emulator's __CUDA_ARCH__ (800, or -arch's); while a later wrapper reads libcu++, the host values come back.
NV_TARGET_DEVICE, NV_TARGET_HOST = "llmcupy_sim_nv_target_device.h", "llmcupy_sim_nv_target_host.h"


def _nv_target_modes(root: Path) -> tuple[str, str]:
    """(device, host): the #define-s of the two modes, for the queries the real header defines."""
    macros = root / "nv" / "detail" / "__target_macros"
    text = macros.read_text(errors="replace") if macros.is_file() else ""
    queries = {kind: sorted(set(re.findall(rf"_NV_TARGET_BOOL___NV_{kind}_SM_(\d+)\b", text)), key=int)
               for kind in ("PROVIDES", "IS_EXACTLY")}

    def define(name, value):
        return f"#undef {name}\n#define {name} {value}\n"

    def by_arch(name, test):
        return f"#undef {name}\n#if {test}\n#define {name} 1\n#else\n#define {name} 0\n#endif\n"

    device = define("_NV_TARGET_BOOL___NV_IS_HOST", 0) + define("_NV_TARGET_BOOL___NV_IS_DEVICE", 1)
    host = define("_NV_TARGET_BOOL___NV_IS_HOST", 1) + define("_NV_TARGET_BOOL___NV_IS_DEVICE", 0)
    for kind, op in (("PROVIDES", ">="), ("IS_EXACTLY", "==")):
        for sm in queries[kind]:
            name = f"_NV_TARGET_BOOL___NV_{kind}_SM_{sm}"
            device += by_arch(name, f"__CUDA_ARCH__ {op} _NV_TARGET_VAL_SM_{sm}")
            host += define(name, 0)
    # what nv/target defines besides for a device compile (NVRTC's __CUDA_MINIMUM_ARCH__ is its -arch)
    minimum = {"NV_TARGET_MINIMUM_SM_SELECTOR": "_NV_CONCAT_EVAL(_NV_TARGET_ARCH_TO_SELECTOR_, __CUDA_ARCH__)",
               "NV_TARGET_MINIMUM_SM_INTEGER": "_NV_CONCAT_EVAL(_NV_TARGET_ARCH_TO_SM_, __CUDA_ARCH__)",
               "__CUDA_MINIMUM_ARCH__": "__CUDA_ARCH__"}
    device += "".join(define(name, value) for name, value in minimum.items())
    host += "".join(f"#undef {name}\n" for name in minimum)
    head = "// generated by llmcupy/sim/libcuxx.py: <nv/target>'s queries as {} (see there)\n"
    return (head.format("NVRTC answers them for the emulated GPU") + device,
            head.format("libcu++'s host code reads them") + host)


def _wrapper(name: str, root: Path) -> str:
    head = (f"// The emulator's wrapper of libcu++'s <{name}> (generated by llmcupy/sim/libcuxx.py): the real\n"
            "// header, read as host code (llmcupy_sim_libcuxx_begin.h says why).\n#pragma once\n")
    if name in REFUSED:
        return head + f'#error "\'{name}\': {REFUSED[name]}"\n'
    real = root / _INSTEAD.get(name, name)
    stdint = "" if name in _WITHOUT_STDINT else "#define LLMCUPY_SIM_NVRTC_HAS_STDINT 1\n"
    return (head + _host_macros(name, on=True) + '#include "llmcupy_sim_libcuxx_begin.h"\n'
            f'#include "{real.as_posix()}"\n'
            '#include "llmcupy_sim_libcuxx_end.h"\n' + _host_macros(name, on=False) + _AFTER.get(name, "")
            + _kept_after(name) + stdint + '#include "llmcupy_sim_nvrtc_names_on.h"\n')


def public_headers(root: Path) -> list[str]:
    """The headers a kernel includes by name: cuda/std/*, cuda/* and nv/target (not the __detail ones)."""
    names = ["nv/target"]
    for sub in ("cuda", "cuda/std"):
        for p in sorted((root / sub).iterdir()):
            if p.is_file() and not p.name.startswith("_") and "." not in p.name:
                names.append(f"{sub}/{p.name}")
    return names


@functools.lru_cache(maxsize=None)
def _wrappers(root: Path) -> tuple[dict, str]:
    files = {name: _wrapper(name, root) for name in public_headers(root)}
    files[NV_TARGET_DEVICE], files[NV_TARGET_HOST] = _nv_target_modes(root)
    digest = hashlib.sha256(f"{root}\0{cccl_version(root)}\0".encode())
    for name, text in files.items():
        digest.update(f"{name}\0{text}\0".encode())
    return files, digest.hexdigest()[:16]


def wrapper_dir(cache_root: Path, root: Path) -> Path:
    """The folder of wrappers for the libcu++ at ``root``, written once under ``cache_root`` (whole or not at
    all: made in a temporary folder, then renamed)."""
    files, key = _wrappers(root)
    folder = Path(cache_root) / f"libcuxx-{key}"
    if (folder / ".complete").is_file():
        return folder
    tmp = Path(tempfile.mkdtemp(dir=cache_root, prefix=".libcuxx-"))
    try:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
        (tmp / ".complete").write_text("")
        os.rename(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / ".complete").is_file():   # not another process's, made meanwhile
            raise
    return folder


def include_flags(cache_root: Path) -> tuple[list[str], list[str]]:
    """The -I flags for libcu++: (before the emulator's include folder, after it). The wrappers go first,
    so that they, not the stand-ins, answer <cuda/std/...>; the real headers' own folder after."""
    root = libcudacxx_dir()
    if root is None:
        return [], []
    return [f"-I{wrapper_dir(cache_root, root)}"], [f"-I{root}"]


def fingerprint() -> bytes:
    """Which libcu++ a build compiled against (path, version and the wrappers' text), for the cache key of a
    source that reaches cuda/ or cub/ headers; b"" for the stand-ins (hashed with the emulator's headers)."""
    root = libcudacxx_dir()
    if root is None:
        return b""
    return _wrappers(root)[1].encode()


_STAND_INS = ("array, atomic, bit, cassert, cfloat, climits, cmath, complex, cstddef, cstdint, cstdlib, cstring, "
              "functional, initializer_list, limits, ratio, tuple, type_traits and utility")


def missing_header_hint() -> str:
    """Why a libcu++ header is not found here, and what to do, for the emulator's stand-ins."""
    if os.environ.get(ENV_VAR, "").strip().lower() == "none":
        chose = f"{ENV_VAR}=none chose the emulator's stand-ins"
    else:
        chose = "the emulator compiles against CuPy's libcu++, and CuPy is not installed here, so it has its stand-ins"
    return (f"{chose}, which hold only cuda/std/{_STAND_INS} (and cuda::aligned_size_t of cuda/barrier): install "
            f"CuPy (pip install cupy-cuda12x, or llmcupy's [cuda12] extra), or set {ENV_VAR} to a libcudacxx include "
            "folder, to compile against the real libcu++")
