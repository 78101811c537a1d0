"""python -m llmcupy.nvrtc: compile every ``kernels_cu/*.cu`` through NVRTC for real architectures, without a GPU.

The emulator runs the catalogue with g++, which accepts things NVRTC does not (host-only math
macros, libstdc++ headers, ...). This module compiles the very same files the way
``llmcupy.RawModule`` does on a GPU (CuPy's NVRTC path: our ``DEFAULT_OPTIONS``, ``-I`` the
kernels folder, CuPy's CCCL include dirs, ``--device-as-default-execution-space``, every
non-template kernel as a name expression) down to SASS for ``sm_XX`` with ``-Xptxas=-v``, so it
also reports each kernel's registers, spills and static shared memory.

No GPU, driver or CUDA toolkit is needed: NVRTC is a plain shared library, loaded with ctypes.
Where things are found (first hit wins):

* NVRTC: ``$LLMCUPY_NVRTC`` (a path to the library), the ``nvidia-cuda-nvrtc-cu12`` wheel
  (``site-packages/nvidia/cuda_nvrtc/lib``), a CUDA toolkit (``$CUDA_PATH``, ``$CUDA_HOME``,
  ``/usr/local/cuda``), then the system loader.
* CUDA headers (``cuda_runtime.h``, ``cooperative_groups.h``): the ``nvidia-cuda-runtime-cu12``
  wheel (``nvidia/cuda_runtime/include``) or the toolkit's ``include``.
* CCCL headers (``nv/target``, ``cuda/std``, which cooperative groups need): the copy CuPy
  bundles (``cupy/_core/include/cupy/_cccl``), the ``nvidia-cuda-cccl-cu12`` wheel, or the toolkit.

``pip install -e .[test]`` installs all three wheels. Usage::

    python -m llmcupy.nvrtc                      # every file, sm_75 sm_80 sm_90
    python -m llmcupy.nvrtc --arch 80 softmax_forward
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib.util
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_ARCHS = (75, 80, 90)

INSTALL_HINT = (
    "install NVIDIA's NVRTC and CUDA header wheels and CuPy (for the CCCL headers): "
    "`pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 cupy-cuda12x` "
    "(`pip install -e .[test]` brings them), or point LLMCUPY_NVRTC at libnvrtc / CUDA_PATH at a CUDA toolkit"
)


class NvrtcNotFound(RuntimeError):
    """NVRTC or the headers it needs are not installed."""


# ----------------------------------------------------------------------------------------------
# locating NVRTC and the headers


def _package_roots() -> list[Path]:
    """Every folder that may hold ``nvidia/...`` or ``cupy/`` (site-packages, user site, sys.path)."""
    roots: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p).parent for p in spec.submodule_search_locations]
    try:
        import site

        roots += [Path(p) for p in site.getsitepackages()]
        roots.append(Path(site.getusersitepackages()))
    except (AttributeError, ImportError):  # some embedded / virtualenv builds lack these
        pass
    roots += [Path(p) for p in sys.path if p]
    seen, out = set(), []
    for r in roots:
        key = str(r)
        if key not in seen and r.is_dir():
            seen.add(key)
            out.append(r)
    return out


def _toolkit_roots() -> list[Path]:
    roots = [os.environ.get(v) for v in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT")] + ["/usr/local/cuda", "/opt/cuda"]
    return [Path(r) for r in roots if r and Path(r).is_dir()]


def _library_candidates() -> list[Path]:
    found: list[Path] = []
    if sys.platform.startswith("win"):
        patterns = ["nvidia/cuda_nvrtc/bin/nvrtc64_*.dll", "nvidia/cu*/bin/nvrtc64_*.dll", "nvidia/cu*/bin/x86_64/nvrtc64_*.dll"]
        tk_patterns = ["bin/nvrtc64_*.dll", "bin/x64/nvrtc64_*.dll"]
    else:
        # The ".alt" build is the same API with a different libstdc++ linkage; prefer the plain one.
        patterns = ["nvidia/cuda_nvrtc/lib/libnvrtc.so*", "nvidia/cu*/lib/libnvrtc.so*"]
        tk_patterns = ["lib64/libnvrtc.so*", "lib/libnvrtc.so*", "targets/*/lib/libnvrtc.so*"]
    for root in _package_roots():
        for pat in patterns:
            found += sorted(Path(p) for p in glob.glob(str(root / pat)) if ".alt." not in p and "builtins" not in p)
    for root in _toolkit_roots():
        for pat in tk_patterns:
            found += sorted(Path(p) for p in glob.glob(str(root / pat)) if ".alt." not in p and "builtins" not in p)
    return found


@functools.lru_cache(maxsize=None)
def _load_library(path: str | None) -> tuple[ctypes.CDLL, str]:
    tried: list[str] = []
    if path:
        candidates = [Path(path)]
    else:
        candidates = _library_candidates()
    for cand in candidates:
        if not cand.is_file():
            tried.append(f"{cand} (no such file)")
            continue
        try:
            if sys.platform.startswith("win"):
                os.add_dll_directory(str(cand.parent))
            return ctypes.CDLL(str(cand)), str(cand)
        except OSError as exc:
            tried.append(f"{cand} ({exc})")
    if not path:
        name = ctypes.util.find_library("nvrtc")
        if name:
            try:
                return ctypes.CDLL(name), name
            except OSError as exc:
                tried.append(f"{name} ({exc})")
    where = f"; tried: {', '.join(tried)}" if tried else ""
    if path:
        raise NvrtcNotFound(f"cannot load NVRTC from LLMCUPY_NVRTC={path}{where}")
    raise NvrtcNotFound(f"cannot find NVRTC (libnvrtc){where}. To compile without a GPU, {INSTALL_HINT}")


class _Nvrtc:
    """The few NVRTC C API calls we need, typed."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib, self.path = lib, path
        P, c, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
        sig = {
            "nvrtcVersion": [ctypes.POINTER(i), ctypes.POINTER(i)],
            "nvrtcCreateProgram": [ctypes.POINTER(P), c, c, i, ctypes.POINTER(c), ctypes.POINTER(c)],
            "nvrtcDestroyProgram": [ctypes.POINTER(P)],
            "nvrtcAddNameExpression": [P, c],
            "nvrtcCompileProgram": [P, i, ctypes.POINTER(c)],
            "nvrtcGetProgramLogSize": [P, ctypes.POINTER(sz)],
            "nvrtcGetProgramLog": [P, ctypes.c_char_p],
            "nvrtcGetCUBINSize": [P, ctypes.POINTER(sz)],
            "nvrtcGetCUBIN": [P, ctypes.c_char_p],
            "nvrtcGetPTXSize": [P, ctypes.POINTER(sz)],
            "nvrtcGetPTX": [P, ctypes.c_char_p],
            "nvrtcGetLoweredName": [P, c, ctypes.POINTER(c)],
            "nvrtcGetNumSupportedArchs": [ctypes.POINTER(i)],
            "nvrtcGetSupportedArchs": [ctypes.POINTER(i)],
        }
        for name, args in sig.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed: {self.lib.nvrtcGetErrorString(result).decode()}")

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return major.value, minor.value

    def supported_archs(self) -> list[int]:
        n = ctypes.c_int()
        self.check(self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
        arr = (ctypes.c_int * n.value)()
        self.check(self.lib.nvrtcGetSupportedArchs(arr), "nvrtcGetSupportedArchs")
        return list(arr)


def find_nvrtc() -> _Nvrtc:
    """The loaded NVRTC library; raises :class:`NvrtcNotFound` saying what to install."""
    lib, path = _load_library(os.environ.get("LLMCUPY_NVRTC") or None)
    return _Nvrtc(lib, path)


def _first_dir(candidates) -> Path | None:
    for c in candidates:
        if c.is_dir():
            return c
    return None


def cuda_include_dirs() -> list[Path]:
    """Include dirs for the CUDA headers and CCCL, the way CuPy's NVRTC path sets them up."""
    roots = _package_roots()
    dirs: list[Path] = []

    # cuda_runtime.h, cooperative_groups.h: $LLMCUPY_CUDA_INCLUDE (e.g. an older runtime wheel's
    # include folder, for the oldest-headers check), the runtime wheel (CUDA 12 or 13 layout) or a toolkit.
    override = os.environ.get("LLMCUPY_CUDA_INCLUDE")
    if override and not (Path(override) / "cooperative_groups.h").is_file():
        raise NvrtcNotFound(f"LLMCUPY_CUDA_INCLUDE={override} holds no cooperative_groups.h")
    runtime = _first_dir(
        ([Path(override)] if override else [])
        + [r / "nvidia" / "cuda_runtime" / "include" for r in roots]
        + [Path(p) for r in roots for p in sorted(glob.glob(str(r / "nvidia" / "cu*" / "include")))]
        + [t / "include" for t in _toolkit_roots()]
    )
    runtime = runtime if runtime is not None and (runtime / "cooperative_groups.h").is_file() else None
    if runtime is None:
        raise NvrtcNotFound(f"cannot find the CUDA headers (cooperative_groups.h). To compile without a GPU, {INSTALL_HINT}")

    # CCCL (nv/target, cuda/std/...): CuPy's bundle (what RawModule uses on a GPU), the cccl wheel,
    # then whatever the toolkit / runtime include ships (CUDA 12 puts it in include/, 13 in include/cccl).
    cupy_root = None
    spec = importlib.util.find_spec("cupy")
    if spec is not None and spec.submodule_search_locations:
        cupy_root = Path(list(spec.submodule_search_locations)[0])
    if cupy_root is not None and (cupy_root / "_core" / "include" / "cupy" / "_cccl" / "libcudacxx" / "nv").is_dir():
        inc = cupy_root / "_core" / "include"
        dirs += [inc] + [inc / "cupy" / "_cccl" / d for d in ("cub", "thrust", "libcudacxx")]
    else:
        cccl = _first_dir(
            [r / "nvidia" / "cuda_cccl" / "include" for r in roots]
            + [runtime / "cccl", runtime]
            + [t / "include" / "cccl" for t in _toolkit_roots()]
        )
        if cccl is None or not (cccl / "nv" / "target").is_file():
            raise NvrtcNotFound(f"cannot find the CCCL headers (nv/target). To compile without a GPU, {INSTALL_HINT}")
        if cccl != runtime:
            dirs.append(cccl)
    dirs.append(runtime)
    # crt/mma.h (behind <mma.h>, the wmma API) ships with nvcc, not with the runtime wheel
    nvcc = _first_dir([r / "nvidia" / "cuda_nvcc" / "include" for r in roots])
    if nvcc is not None and (nvcc / "crt" / "mma.h").is_file() and not (runtime / "crt" / "mma.h").is_file():
        dirs.append(nvcc)
    return dirs


def default_kernels_dir() -> Path:
    from .runtime.module import kernels_dir

    return kernels_dir()


def compile_options(arch: int, kernels_dir: Path | None = None, extra=()) -> list[str]:
    """NVRTC options for one architecture (ours + CuPy's + SASS for ``sm_<arch>`` + ptxas -v)."""
    from .runtime.module import DEFAULT_OPTIONS

    kdir = Path(kernels_dir) if kernels_dir is not None else default_kernels_dir()
    opts = list(DEFAULT_OPTIONS) + [f"-I{kdir}"]
    opts += [f"-I{d}" for d in cuda_include_dirs()]
    opts += ["--device-as-default-execution-space", f"--gpu-architecture=sm_{int(arch)}", "-Xptxas=-v"]
    return opts + list(extra)


def module_options(arch: int, options=()) -> list[str]:
    """The NVRTC options of ``llmcupy.RawModule(code=..., options=options)`` on a GPU, as CuPy 14 gives
    them (``assemble_cupy_compiler_options``, then its NVRTC path): the CCCL folders first, the user's
    options, ``--std=c++17`` unless they set one, CuPy's and the CUDA headers, ``-ftz=true``, the
    architecture and ``--device-as-default-execution-space``. What a user's kernel source is compiled
    with, where :func:`compile_options` is what the catalogue's files are."""
    dirs = cuda_include_dirs()
    runtime = next(d for d in dirs if (d / "cooperative_groups.h").is_file())
    cccl = [d for d in dirs if d.parent.name == "_cccl" or (d / "nv" / "target").is_file()]
    cupy_include = [d for d in dirs if (d / "cupy" / "complex.cuh").is_file()]
    options = list(options)
    std = [] if any("-std=" in o for o in options) else ["--std=c++17"]
    return ([f"-I{d}" for d in cccl if d != runtime] + options + std + [f"-I{d}" for d in cupy_include]
            + [f"-I{runtime}", "-ftz=true", f"-arch=sm_{int(arch)}", "--device-as-default-execution-space"])


# ----------------------------------------------------------------------------------------------
# ptxas -v log parsing


@dataclass
class KernelStats:
    kernel: str          # the source name (demangled)
    mangled: str         # the symbol in the cubin / ptxas log
    registers: int | None = None
    spill_stores: int | None = None  # bytes
    spill_loads: int | None = None   # bytes
    shared_bytes: int = 0            # static shared memory (dynamic shared memory is a launch parameter)
    stack_bytes: int | None = None
    barriers: int | None = None


def demangle(name: str) -> str:
    """A small Itanium demangler for kernel names: the identifier (with namespaces), plus ``<...>``
    for template instances. ``_Z23softmax_forward_kernel1PfPKfii`` -> ``softmax_forward_kernel1``.
    Unmangled (``extern "C"``) names come back unchanged."""
    if not name.startswith("_Z"):
        return name
    s, i = name, 2

    def ident(i):
        m = re.compile(r"\d+").match(s, i)
        if not m:
            return None, i
        n = int(m.group())
        return s[m.end():m.end() + n], m.end() + n

    parts = []
    if s.startswith("N", i):
        i += 1
        while i < len(s) and s[i] != "E" and s[i] != "I":
            if s[i] == "L":  # internal linkage marker
                i += 1
                continue
            part, j = ident(i)
            if part is None:
                break
            parts.append(part)
            i = j
    else:
        part, i = ident(i)
        if part is None:
            return name
        parts.append(part)
    if not parts:
        return name
    out = "::".join(parts)
    if i < len(s) and s[i] == "I":
        out += "<...>"
    return out


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+\w*)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")
_PTXAS_INFO = re.compile(r"ptxas\s+(info\b|\.)")


def parse_ptxas_log(log: str, names: dict[str, str] | None = None) -> list[KernelStats]:
    """Per-kernel resource usage from a ``ptxas -v`` log (NVRTC's program log with ``-Xptxas=-v``).

    ``names`` maps mangled names to source names (from ``nvrtcGetLoweredName``); others are
    demangled with :func:`demangle`. Kernels come out in source order (ptxas lists them reversed).
    """
    names = names or {}
    stats: dict[str, KernelStats] = {}
    current: KernelStats | None = None  # the entry whose lines follow
    props_for: str | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            mangled = m.group(1)
            current = stats.setdefault(mangled, KernelStats(names.get(mangled) or demangle(mangled), mangled))
            props_for = None
            continue
        m = _PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _FRAME.search(line)
        if m and current is not None and props_for == current.mangled:
            current.stack_bytes, current.spill_stores, current.spill_loads = (int(g) for g in m.groups())
            continue
        m = _USED.search(line)
        if m and current is not None:
            current.registers = int(m.group(1))
            s = _SMEM.search(line)
            current.shared_bytes = int(s.group(1)) if s else 0
            b = _BARRIERS.search(line)
            current.barriers = int(b.group(1)) if b else None
            current = None
    return list(reversed(list(stats.values())))


# ----------------------------------------------------------------------------------------------
# compiling


@dataclass
class CompileResult:
    file: str
    arch: int
    ok: bool
    log: str
    kernels: list[KernelStats] = field(default_factory=list)
    cubin_bytes: int = 0

    @property
    def diagnostics(self) -> str:
        """The compiler's errors and warnings (the log without ptxas' resource lines)."""
        return diagnostics(self.log)

    @property
    def warnings(self) -> int:
        return count_warnings(self.log)


def diagnostics(log: str) -> str:
    """A compile log without ptxas' ``info`` lines (resource usage): errors and warnings only."""
    return "\n".join(l for l in log.splitlines() if not _PTXAS_INFO.match(l)).strip()


def count_warnings(log: str) -> int:
    return sum(1 for l in diagnostics(log).splitlines() if re.search(r"\bwarning\b", l, re.IGNORECASE))


def compile_source(code: str, arch: int, *, filename: str = "kernel.cu", kernels_dir: Path | None = None,
                   name_expressions=None, options=None) -> CompileResult:
    """Compiles CUDA C++ source to SASS for ``sm_<arch>``; never raises for compile errors
    (``ok`` is False and ``log`` says why), only for a missing NVRTC."""
    nv = find_nvrtc()
    arch = int(arch)
    opts = compile_options(arch, kernels_dir) if options is None else list(options)
    if name_expressions is None:
        from .sim.compiler import compiled_kernel_names

        # a kernel in a disabled #if branch is no name expression: NVRTC would refuse it
        name_expressions = compiled_kernel_names(code, opts, filename)
    supported = nv.supported_archs()
    if arch not in supported:
        major, minor = nv.version()
        return CompileResult(filename, arch, False, f"NVRTC {major}.{minor} cannot target sm_{arch} "
                             f"(supported: {', '.join(f'sm_{a}' for a in supported)})")

    prog = ctypes.c_void_p()
    nv.check(nv.lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), filename.encode(), 0, None, None),
             "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            nv.check(nv.lib.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        result = nv.lib.nvrtcCompileProgram(prog, len(opts), copts)
        size = ctypes.c_size_t()
        nv.check(nv.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value)
        nv.check(nv.lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace")
        if result != 0:
            err = nv.lib.nvrtcGetErrorString(result).decode()
            return CompileResult(filename, arch, False, (log.rstrip() + f"\n({err})").strip())
        nv.check(nv.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        lowered: dict[str, str] = {}
        for expr in name_expressions:
            ptr = ctypes.c_char_p()
            if nv.lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(ptr)) == 0 and ptr.value:
                lowered[ptr.value.decode()] = expr
        kernels = parse_ptxas_log(log, lowered)
        return CompileResult(filename, arch, True, log, kernels, size.value)
    finally:
        nv.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def file_ptx(path, arch: int, kernels_dir: Path | None = None) -> str:
    """The PTX of a kernel file for ``compute_<arch>``, compiled with the options the GPU path uses
    (``--use_fast_math`` included): what the instructions are, where the cubin only says how many
    registers they need. A compile error raises RuntimeError with NVRTC's log."""
    nv = find_nvrtc()
    path = Path(path)
    opts = [o for o in compile_options(arch, kernels_dir) if not o.startswith(("--gpu-architecture", "-Xptxas"))]
    opts.append(f"--gpu-architecture=compute_{int(arch)}")
    prog = ctypes.c_void_p()
    code = path.read_text()
    nv.check(nv.lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), path.name.encode(), 0, None,
                                       None), "nvrtcCreateProgram")
    try:
        from .sim.compiler import global_kernel_names

        # the template kernels the ops instantiate (flash_attention.cu's are all templates): without
        # their name expressions NVRTC emits no code for them and the PTX has none of their entries
        for expr in global_kernel_names(code) + template_instantiations(path.name):
            nv.check(nv.lib.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        if nv.lib.nvrtcCompileProgram(prog, len(opts), copts) != 0:
            size = ctypes.c_size_t()
            nv.check(nv.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            log = ctypes.create_string_buffer(size.value)
            nv.check(nv.lib.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            raise RuntimeError(f"{path.name} does not compile for compute_{arch}:\n{log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        nv.check(nv.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        nv.check(nv.lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.value.decode()
    finally:
        nv.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def resolve_files(files=None, kernels_dir: Path | None = None) -> list[Path]:
    """``None`` -> every ``kernels_cu/*.cu``; else each entry is a path or an op name / file name in
    the kernels folder (``softmax_forward``, ``softmax_forward.cu``)."""
    kdir = Path(kernels_dir) if kernels_dir is not None else default_kernels_dir()
    if kernels_dir is not None and not kdir.is_dir():
        raise FileNotFoundError(f"--kernels-dir {kdir}: no such folder")
    if files is None:
        found = sorted(kdir.glob("*.cu"))
        if not found:   # an empty report would read "0/0 compilations ok"
            raise FileNotFoundError(f"no .cu files in {kdir}")
        return found
    if isinstance(files, (str, Path)):
        files = [files]
    out = []
    for f in files:
        p = Path(f)
        if p.is_file():
            out.append(p)
            continue
        name = p.name if p.suffix in (".cu", ".cuh") else p.name + ".cu"
        if (kdir / name).is_file():
            out.append(kdir / name)
            continue
        source = _op_source(str(f))   # an op whose kernels live in another op's file (flash_attention_forward)
        if source is not None and (kdir / source).is_file():
            out.append(kdir / source)
        else:
            raise FileNotFoundError(f"no kernel file {f!r} (looked for {p} and {kdir / name})")
    return out


def _op_source(name: str) -> str | None:
    """The kernel file of the op ``name`` (``matmul_gelu_forward`` -> ``matmul_forward.cu``), or None."""
    from . import ops

    return ops.get(name).source if name in ops else None


def compile_file(path, arch: int, kernels_dir: Path | None = None) -> CompileResult:
    """One catalogue file compiled as ``load_kernel_file`` would on a GPU, for ``sm_<arch>``."""
    path = Path(path)
    kdir = Path(kernels_dir) if kernels_dir is not None else default_kernels_dir()
    code = path.read_text()
    from .sim.compiler import global_kernel_names

    names = global_kernel_names(code) + [n for n in template_instantiations(path.name)]
    return compile_source(code, arch, filename=path.name, kernels_dir=kdir, name_expressions=names)


def template_instantiations(filename: str) -> list[str]:
    """The template kernels an op module instantiates from ``filename`` (its ``NAME_EXPRESSIONS``),
    so the compile check covers what the GPU will actually compile."""
    import importlib

    from . import ops as ops_registry

    names = []
    for op_name in ops_registry.names():
        op = ops_registry.get(op_name)
        if op.source != filename:
            continue
        module = importlib.import_module(op.make_inputs_fn.__module__)
        for expr in getattr(module, "NAME_EXPRESSIONS", ()):
            if expr not in names:
                names.append(expr)
    return names


# ----------------------------------------------------------------------------------------------
# the report


def compile_report(files=None, archs=DEFAULT_ARCHS, kernels_dir: Path | None = None) -> list[dict]:
    """One row per (file, arch, kernel): registers, spill bytes, static shared memory, ok, log.

    A file that fails to compile for an arch gives one row with ``kernel=None`` and ``ok=False``.
    """
    rows = []
    paths = resolve_files(files, kernels_dir)   # a bad folder or op name first, as before
    # registers and spills change from one NVRTC release to the next: every row says which compiled it
    release = "{}.{}".format(*find_nvrtc().version())
    for path in paths:
        for arch in archs:
            res = compile_file(path, arch, kernels_dir)
            base = {"file": res.file, "arch": res.arch, "nvrtc": release, "ok": res.ok, "log": res.log,
                    "warnings": res.warnings}
            if not res.ok or not res.kernels:
                rows.append({**base, "kernel": None, "mangled": None, "registers": None, "spill_stores": None,
                             "spill_loads": None, "shared_bytes": None, "stack_bytes": None, "barriers": None})
            for k in res.kernels:
                rows.append({**base, **asdict(k)})
    return rows


def _fmt(v) -> str:
    return "-" if v is None else str(v)


def format_report(rows: list[dict]) -> str:
    """An aligned table of :func:`compile_report` rows, then the diagnostics of failed files
    (and warnings of compiled ones), once per distinct message."""
    header = ["file", "arch", "kernel", "regs", "spill st", "spill ld", "static smem", "stack", "status"]
    table = [header]
    for r in rows:
        status = "ok" if r["ok"] else "FAILED"
        if r["ok"] and r.get("warnings"):
            status += f" ({r['warnings']} warning{'s' if r['warnings'] > 1 else ''})"
        if r["ok"] and (r.get("spill_stores") or r.get("spill_loads")):
            status += " spills"
        table.append([r["file"], f"sm_{r['arch']}", _fmt(r["kernel"]), _fmt(r["registers"]),
                      _fmt(r["spill_stores"]), _fmt(r["spill_loads"]), _fmt(r["shared_bytes"]),
                      _fmt(r.get("stack_bytes")), status])
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    numeric = {3, 4, 5, 6, 7}
    releases = sorted({r["nvrtc"] for r in rows if r.get("nvrtc")})
    lines = [f"NVRTC {', '.join(releases)} (registers and spills change between releases)"] if releases else []
    for n, row in enumerate(table):
        cells = [cell.rjust(widths[c]) if c in numeric and n else cell.ljust(widths[c]) for c, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))

    # Diagnostics: the same message for several archs is shown once, naming them.
    messages: dict[tuple[str, str, bool], list[int]] = {}
    seen = set()
    for r in rows:
        key = (r["file"], r["arch"])
        if key in seen:
            continue
        seen.add(key)
        diag = diagnostics(r["log"])
        if diag:
            messages.setdefault((r["file"], diag, r["ok"]), []).append(r["arch"])
    for (file, diag, ok), archs in messages.items():
        what = "warnings" if ok else "FAILED"
        lines += ["", f"{file} [{', '.join(f'sm_{a}' for a in archs)}] {what}:"]
        lines += ["    " + l for l in diag.splitlines()]
    failed = sorted({(r["file"], r["arch"]) for r in rows if not r["ok"]})
    total = len({(r["file"], r["arch"]) for r in rows})
    lines += ["", f"{total - len(failed)}/{total} compilations ok" + (
        f"; failed: {', '.join(f'{f} sm_{a}' for f, a in failed)}" if failed else "")]
    return "\n".join(lines)


def check_all(archs=DEFAULT_ARCHS, files=None, kernels_dir: Path | None = None) -> tuple[bool, list[str]]:
    """Compiles every file for every arch; ``(all ok, ["file sm_XX: first error", ...])``."""
    failures = []
    for path in resolve_files(files, kernels_dir):
        for arch in archs:
            res = compile_file(path, arch, kernels_dir)
            if not res.ok:
                first = next((l for l in res.log.splitlines() if "error" in l), res.log.strip().splitlines()[0]
                             if res.log.strip() else "failed")
                failures.append(f"{res.file} sm_{arch}: {first.strip()}")
    return not failures, failures


def describe_setup() -> str:
    nv = find_nvrtc()
    major, minor = nv.version()
    incs = "\n".join(f"  -I{d}" for d in cuda_include_dirs())
    return f"NVRTC {major}.{minor} from {nv.path}\nheaders:\n{incs}"


def parse_arch(text) -> int:
    """A compute capability as users write it: ``80``, ``sm_80``, ``compute_80`` or ``8.0`` -> 80."""
    norm = str(text).strip().lower().removeprefix("sm_").removeprefix("compute_").replace(".", "")
    if not norm.isdigit() or int(norm) < 10:
        raise ValueError(f"{text!r} is not a compute capability (e.g. 80, sm_80 or 8.0)")
    return int(norm)


def check_archs(archs) -> None:
    """Refuses, before anything compiles, a compute capability the installed NVRTC cannot target
    (``--arch sm_99``): a ValueError listing the ones it can, rather than one failed compile per file."""
    nv = find_nvrtc()
    supported = nv.supported_archs()
    unknown = [a for a in archs if int(a) not in supported]
    if unknown:
        major, minor = nv.version()
        raise ValueError(f"--arch {', '.join(f'sm_{a}' for a in unknown)}: NVRTC {major}.{minor} cannot target "
                         f"{'it' if len(unknown) == 1 else 'them'}; choose from "
                         f"{', '.join(f'sm_{a}' for a in supported)}")


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m llmcupy.nvrtc",
                                 description="Compile kernels_cu/*.cu with NVRTC (no GPU needed) and report "
                                             "registers / spills / static shared memory per kernel.")
    ap.add_argument("files", nargs="*", help="op names or .cu paths (default: every kernels_cu/*.cu)")
    ap.add_argument("--arch", nargs="+", default=None,
                    help="compute capabilities (default: 75 80 90); sm_80 / 8.0 are accepted too")
    ap.add_argument("--kernels-dir", type=Path, default=None,
                    help="the folder of the .cu files and common.cuh (default: the installed kernels_cu)")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print where NVRTC and the headers came from")
    ap.add_argument("--ptx", action="store_true",
                    help="print the PTX of one file for one architecture (default 80) instead of the report: the "
                         "instructions, where the report only counts registers; e.g. softmax_forward --ptx")
    args = ap.parse_args(argv)
    # `--arch 80 softmax_forward`: --arch is greedy, so non-numbers after it are files.
    archs, files = [], list(args.files)
    # --ptx prints one architecture: sm_80's unless --arch names another
    for a in args.arch if args.arch is not None else ["80"] if args.ptx else [str(a) for a in DEFAULT_ARCHS]:
        try:
            archs.append(parse_arch(a))
        except ValueError:
            files.append(a)
    if not archs:
        ap.error("--arch needs at least one compute capability, e.g. --arch 80")
    try:
        if args.arch is not None:
            check_archs(archs)
        if args.verbose:
            print(describe_setup(), end="\n\n")
        if args.ptx:
            if len(files) != 1 or len(archs) != 1:
                raise ValueError(f"--ptx prints one file for one architecture (got {len(files)} file(s) and "
                                 f"{len(archs)} arch(s)); e.g. python -m llmcupy.nvrtc softmax_forward --ptx --arch 80")
            try:
                print(file_ptx(resolve_files(files, args.kernels_dir)[0], archs[0], args.kernels_dir), end="")
            except RuntimeError as exc:   # NVRTC's log of a file that does not compile
                print(f"error: {exc}", file=sys.stderr)
                return 1
            return 0
        rows = compile_report(files or None, tuple(archs), args.kernels_dir)
    except (NvrtcNotFound, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(rows))
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
