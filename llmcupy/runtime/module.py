"""``llmcupy.RawModule``: ``cupy.RawModule``'s interface on both backends.

    mod = llmcupy.RawModule(code=src, options=("-std=c++17",), name_expressions=["k<float>"])
    k = mod.get_function("k<float>")
    k((grid,), (block,), (out, inp, np.int32(n)), shared_mem=0)

On ``cuda`` this is a thin wrapper over ``cupy.RawModule``; on ``sim`` the same source is built
by the emulator. Either way every launch checks its arguments against the kernel's C signature
(see ``signature.py``), so op code never branches on the backend and a user's own CuPy kernel runs
in the emulator by changing one import.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from ..sim import compiler as sim_compiler
from . import backend as _backend
from .signature import (POINTEE_TYPES, DeviceLimitError, KernelArgumentError, LaunchBoundsError, Param,
                        check_arguments, parse_compiled_signature, parse_signature)

_NULL = np.uint64(0)  # a null pointer argument on the cuda backend (see signature._check_pointer)

# llm.c compiles its kernels with these numerics.
DEFAULT_OPTIONS = ("--use_fast_math", "-std=c++17")


# Observers of the actual enqueue of each kernel (and cuBLAS call, see blas.py) on the GPU: the
# profiler records its CUDA events here, right around the launches, so the host's Python dispatch
# (argument checks, grid sizing) before an op's first launch is not charged to the op.
LAUNCH_OBSERVERS: list = []


def notify_launch(when: str) -> None:
    """Calls ``observer.before()`` or ``observer.after()`` on every launch observer."""
    for observer in LAUNCH_OBSERVERS:
        getattr(observer, when)()


def _dims(value, what: str, kernel: str) -> tuple[int, int, int]:
    if isinstance(value, (int, float, np.integer, np.floating)):
        value = (value,)
    try:
        whole = all(isinstance(v, (int, np.integer)) for v in value)
    except TypeError:
        raise KernelArgumentError(f"{kernel}: {what} must be an int or a tuple of 1-3 ints, got {value!r}") from None
    if not whole:
        # a float such as n / 256 would be truncated to fewer blocks than the data needs (CuPy
        # refuses it as well)
        raise KernelArgumentError(f"{kernel}: {what} must be ints, got {value!r}; for a count of blocks "
                                  "write (n + block - 1) // block")
    dims = tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise KernelArgumentError(f"{kernel}: {what} must be 1-3 positive ints, got {value!r}")
    return dims + (1,) * (3 - len(dims))


# CUDA's per-dimension limits (every GPU since compute capability 3.0): a launch beyond them fails
# on a GPU with "invalid argument", so the emulator refuses it too instead of running it
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
MAX_BLOCK_DIM = (1024, 1024, 64)


def _check_dim_limits(kernel: str, grid3: tuple, block3: tuple) -> None:
    for what, dims, limits in (("grid", grid3, MAX_GRID_DIM), ("block", block3, MAX_BLOCK_DIM)):
        for axis, d, limit in zip("xyz", dims, limits):
            if d > limit:
                raise KernelArgumentError(f"{kernel}: {what} {axis} = {d} exceeds CUDA's limit of {limit} "
                                          f"(max {what} {limits}); spread the work over another dimension "
                                          "or loop inside the kernel")


class _NestedFlag:
    """A process-wide switch for a ``with`` block: on while ``depth`` > 0, so blocks nest. The launch
    path reads the subclass's ``depth`` directly (a class attribute: no instance lookup per launch)."""

    depth = 0

    def __enter__(self):
        type(self).depth += 1
        return self

    def __exit__(self, *exc):
        type(self).depth -= 1
        return False


class _Trusted(_NestedFlag):
    """``with TRUSTED:`` launches skip the per-argument checks against the C signature.

    Only for callers that checked the same call before: ``Op.run`` replaying a launch plan (the
    arguments have the shapes, dtypes, layout and alignment that passed the checks). The vector
    pointees' alignment (``float4*``) is still checked, since it is a property of each address.
    """

    depth = 0   # its own count, not _NestedFlag's


TRUSTED = _Trusted()

# A launch plan being recorded (``ops._op``): the checked launches of one op call, appended by
# ``RawKernel.__call__`` after their arguments passed the checks. A stack, one per nested op call.
RECORDERS: list = []


class LaunchRecorder:
    """The kernel launches of one checked op call, as they were checked and enqueued, and the
    scratch buffers (``ops.scratch``) its launcher asked for, in order.

    ``valid`` turns False when something happened that a replay of the recorded launches would
    miss: a launch that skipped the checks (trusted) or a nested op call.
    """

    __slots__ = ("launches", "scratch", "valid")

    def __init__(self):
        self.launches: list = []
        self.scratch: list = []
        self.valid = True


# A NumPy array's address: ``a.ctypes.data`` costs 2-5 us (it builds the __array_interface__
# dict), ctypes' from_buffer reads the same pointer through the buffer protocol in a third of that.
# (Not cached per array: a cache must not keep arrays alive, and a weak reference would make NumPy
# refuse the caller's in-place ``resize``.)
_c_char_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


def array_address(a) -> int:
    """The address of an array's first element: a CuPy array's device pointer, a NumPy array's host address."""
    if type(a) is not np.ndarray:
        ptr = getattr(getattr(a, "data", None), "ptr", None)  # CuPy: a.data is a MemoryPointer
        return int(ptr) if ptr is not None else int(a.ctypes.data)
    try:
        return _addressof(_c_char_from_buffer(a))
    except (TypeError, ValueError, BufferError):   # read-only, empty or not contiguous
        return a.ctypes.data


# Kernel launches since the process started (every backend): the trainer's launches per step.
LAUNCHES = [0]


def launch_count() -> int:
    return LAUNCHES[0]


class _Stubbed(_NestedFlag):
    """``with STUBBED:`` every check and all the Python of a launch run, but not the kernel itself.

    For measuring the host cost of the launch path without a GPU (``python -m llmcupy.launchbench``);
    outputs are left as they were.
    """

    depth = 0   # its own count, not _NestedFlag's


STUBBED = _Stubbed()


def _pad3(dims) -> tuple:
    if type(dims) is tuple:
        n = len(dims)
        if n == 3:
            return dims
        if n == 2:
            return (dims[0], dims[1], 1)
        if n == 1:
            return (dims[0], 1, 1)
    return _dims(dims, "grid/block", "kernel")


def registers_per_warp(registers: int) -> int:
    """Registers a warp is given for ``registers`` per thread: allocated in units of 256 (compute
    capability 5.0 and later)."""
    return -(-max(registers, 1) * 32 // 256) * 256


def registers_limit(registers: int, per_block: int = 65536) -> int:
    """The largest block (a multiple of 32 threads, at most CUDA's 1024) whose registers fit
    ``per_block``."""
    return min(1024, per_block // registers_per_warp(registers) * 32)


_sim_launcher = None


def _sim_launch(entry, name, grid3, block3, args, shared_mem, stack_bytes, cooperative=False) -> None:
    global _sim_launcher
    if _sim_launcher is None:
        from ..sim import launcher as _sim_launcher_module

        _sim_launcher = _sim_launcher_module
    _sim_launcher.launch(entry, name, grid3, block3, args, shared_mem, stack_bytes, cooperative)


class RawKernel:
    """One kernel, called as ``kernel(grid, block, args, shared_mem=0)``.

    Built by :meth:`RawModule.get_function`, or directly with ``cupy.RawKernel``'s signature:
    ``llmcupy.RawKernel(code, name, options=())``. ``repr(kernel)`` shows its C signature.
    ``enable_cooperative_groups`` (its module's, as in CuPy) makes every launch cooperative: all blocks
    resident at once and ``cg::this_grid().sync()`` allowed (cuLaunchCooperativeKernel on a GPU).
    """

    def __init__(self, code, name: str, options=(), backend: str = "nvrtc", translate_cucomplex: bool = False, *,
                 enable_cooperative_groups: bool = False, jitify: bool = False, target: str | None = None):
        # `code` is named and placed as in cupy.RawKernel, so CuPy callers' keywords work; get_function
        # passes its RawModule there instead of source
        module = code
        if isinstance(code, str):
            module = RawModule(code=code, options=options, backend=backend,
                               translate_cucomplex=translate_cucomplex,
                               enable_cooperative_groups=enable_cooperative_groups, jitify=jitify,
                               name_expressions=[name], target=target)
        self.module = module
        self.name = name
        self.backend = module.backend
        self.enable_cooperative_groups = module.enable_cooperative_groups
        # per device: CuPy's kernel object loads on each device it runs on, and both the shared memory
        # opted into and the block limit are that device's (one process may drive several GPUs)
        self._opted_in: dict[int, int] = {}
        self._max_threads: dict[int, int] = {}
        self._static_shared: dict[int, int] = {}
        if self.backend == "cuda":
            try:
                self._kernel = module._cupy_module.get_function(name)
            except Exception as exc:
                unknown = module._unknown_kernel_error(name, exc)
                if unknown is None:
                    raise
                raise unknown from None
            params = parse_signature(module.code, name)
            if params is None:
                raise KernelArgumentError(
                    f"{name}: cannot find its __global__ declaration in the source, so its arguments cannot be checked"
                )
            self.params: list[Param] = params
        else:
            if name in module._undefined_kernels:
                raise module._undefined_kernel_error(name)
            self._entry = module._sim_library.launcher(name)
            parsed = parse_signature(module.code, name) or []
            compiled = parse_compiled_signature(module._sim_library.signature(name), parsed)
            self.params = compiled

    @property
    def max_threads_per_block(self) -> int:
        """The largest block this kernel can launch with. On a GPU, what the driver says for this
        device (its ``__launch_bounds__`` and the registers a block of that many threads needs;
        cuFuncGetAttribute, asked once); in the emulator, which has no registers to run out of, the
        source's ``__launch_bounds__``."""
        device = _backend.current_device()
        found = self._max_threads.get(device)
        if found is None:
            if self.backend == "cuda":
                found = int(self._kernel.max_threads_per_block)
            else:
                found = self.module._sim_library.max_threads(self.name)
            self._max_threads[device] = found
        return found

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        """The dynamic shared memory this kernel is opted into on the current device (0: none, CUDA's
        default: 48 KiB less the kernel's static shared memory, which needs no opt-in)."""
        return self._opted_in.get(_backend.current_device(), 0)

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, nbytes: int) -> None:
        # CuPy's spelling of the opt-in (kernel.max_dynamic_shared_size_bytes = n): done here on the
        # current device, checked against its limit; a launch past the default also does it by itself
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise KernelArgumentError(f"{self.name}: max_dynamic_shared_size_bytes must be a non-negative int, "
                                      f"got {nbytes!r}")
        if self.backend == "cuda":
            self._opt_in_shared(int(nbytes))
        else:   # the emulator has no device limit: refuse what every GPU does, as a launch does
            _refuse_past_any_gpu(self.name, nbytes)
            self._opted_in[_backend.current_device()] = int(nbytes)

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(p.describe() for p in self.params)})"

    def __repr__(self) -> str:
        return f"<llmcupy.RawKernel {self.signature} on {self.backend}>"

    def _aligned_params(self) -> list:
        # (index, alignment) of the pointer parameters whose pointee needs more than 4 bytes
        found = self.__dict__.get("_aligned")
        if found is None:
            found = self._aligned = [(i, POINTEE_TYPES[p.pointee][1]) for i, p in enumerate(self.params)
                                     if p.is_pointer and POINTEE_TYPES.get(p.pointee, (None, 1))[1] > 4]
        return found

    def _too_many_threads(self, threads: int) -> KernelArgumentError:
        """The error for a block larger than ``max_threads_per_block``, saying which limit it hits."""
        limit = self.max_threads_per_block
        bounds = LaunchBoundsError(f"{self.name}: a block of {threads} threads is more than its __launch_bounds__ "
                                   f"allow ({limit}); a GPU refuses this launch")
        if self.backend != "cuda":
            return bounds
        registers = int(self._kernel.num_regs)
        per_block = _backend.device_attribute("MaxRegistersPerBlock")
        if limit < registers_limit(registers, per_block):
            return bounds   # the registers would allow more: the limit is the kernel's own bound
        return DeviceLimitError(
            f"{self.name}: a block of {threads} threads needs {registers} registers per thread, more than the "
            f"{per_block} registers one block may have on {_backend.device_name()}: at most {limit} threads per "
            "block for this kernel here; use a smaller block size")

    def _needs_opt_in(self, dynamic: int) -> bool:
        """Whether a launch with ``dynamic`` bytes of dynamic shared memory must first raise this
        kernel's limit on the current device. CUDA's limit until an opt-in is 48 KiB *less the
        kernel's static shared memory* (with 16 KiB static, 40 KiB dynamic is refused), afterwards
        what was opted into."""
        device = _backend.current_device()
        limit = self._opted_in.get(device)
        if limit is None:
            static = self._static_shared.get(device)
            if static is None:   # a driver call each time CuPy is asked: asked once per device
                static = self._static_shared[device] = int(self._kernel.shared_size_bytes)
            limit = 48 * 1024 - static
        return dynamic > limit

    def _opt_in_shared(self, dynamic: int) -> None:
        """Past the default limit (:meth:`_needs_opt_in`) CUDA wants an explicit opt-in per kernel and
        device, up to the device's per-block limit less the kernel's static shared memory."""
        static = int(self._kernel.shared_size_bytes)
        optin = _backend.device_attribute("MaxSharedMemoryPerBlockOptin")
        if static + dynamic > optin:
            raise DeviceLimitError(
                f"{self.name}: {dynamic} bytes of dynamic shared memory (plus {static} static) are more than the "
                f"{optin} bytes one block may have on {_backend.device_name()}; use a smaller block size or "
                "another version")
        self._kernel.max_dynamic_shared_size_bytes = dynamic   # CuPy sets it for the current device
        self._opted_in[_backend.current_device()] = dynamic

    def _launch_trusted(self, grid, block, args, shared_mem: int, stream) -> None:
        LAUNCHES[0] += 1
        if RECORDERS:
            RECORDERS[-1].valid = False  # not checked here: a plan cannot replay it as checked
        if len(args) != len(self.params):
            raise KernelArgumentError(f"{self.name}: takes {len(self.params)} argument(s), {len(args)} were given")
        for i, align in self._aligned_params():
            a = args[i]
            if a is not None:
                address = array_address(a)
                if address % align:
                    raise KernelArgumentError(f"{self.name}: argument {i} ({self.params[i].describe()}): address "
                                              f"{address:#x} is not {align}-byte aligned")
        if _Stubbed.depth:
            return
        if self.backend == "cuda":
            prepared = tuple([_NULL if a is None else a for a in args])
            if shared_mem and self._needs_opt_in(shared_mem):
                self._opt_in_shared(int(shared_mem))
            if LAUNCH_OBSERVERS:
                notify_launch("before")  # the profiler's events, as around a checked launch
            if stream is None:
                self._kernel(_pad3(grid), _pad3(block), prepared, shared_mem=shared_mem)
            else:
                self._kernel(_pad3(grid), _pad3(block), prepared, shared_mem=shared_mem, stream=stream)
            if LAUNCH_OBSERVERS:
                notify_launch("after")
        else:
            _sim_launch(self._entry, self.name, _pad3(grid), _pad3(block), list(args), int(shared_mem),
                        self.module._sim_library.stack_bytes, self.enable_cooperative_groups)

    def _launch_replayed(self, grid3, block3, args: tuple, shared_mem: int) -> None:
        """A launch a plan recorded after ``__call__`` checked it: the same grid, block, shared memory
        and prepared arguments, with this call's arrays in the recorded places. Only the alignment of
        vector pointees is checked again (a property of each address)."""
        LAUNCHES[0] += 1
        for i, align in self._aligned_params():
            a = args[i]
            # a null pointer has no address to check: None in the emulator, on cuda the 8-byte zero
            # the checked launch prepared (a NumPy scalar, which array_address cannot read)
            if a is not None and not isinstance(a, np.generic) and array_address(a) % align:
                raise KernelArgumentError(f"{self.name}: argument {i} ({self.params[i].describe()}): address "
                                          f"{array_address(a):#x} is not {align}-byte aligned")
        if _Stubbed.depth:
            return
        if self.backend == "cuda":
            if shared_mem and self._needs_opt_in(shared_mem):
                self._opt_in_shared(shared_mem)  # (recorded while stubbed, the checked call did not opt in)
            if LAUNCH_OBSERVERS:
                notify_launch("before")
                self._kernel(grid3, block3, args, shared_mem=shared_mem)
                notify_launch("after")
            else:
                self._kernel(grid3, block3, args, shared_mem=shared_mem)
        else:
            _sim_launch(self._entry, self.name, grid3, block3, list(args), shared_mem,
                        self.module._sim_library.stack_bytes, self.enable_cooperative_groups)

    def __call__(self, grid, block, args, *, shared_mem: int = 0, stream=None):
        """Launches the kernel: ``grid`` and ``block`` are ints or tuples of 1-3 ints (blocks, and
        threads per block: at most 1024), ``args`` a tuple with one entry per kernel parameter,
        ``shared_mem`` the bytes of dynamic shared memory.

        Each argument is checked against the kernel's C signature: a pointer takes a C-contiguous
        array of its element type (``float*``: float32; a CuPy array on ``cuda``, a NumPy array in
        the emulator), a scalar the NumPy scalar of its C type (``int``: ``np.int32(n)``, ``float``:
        ``np.float32(a)``; a Python int or float is refused, CuPy would pass it as 64 bits). A
        mismatch raises ``KernelArgumentError`` naming the kernel, the argument and its C type.
        """
        if _Trusted.depth:
            return self._launch_trusted(grid, block, args, shared_mem, stream)
        LAUNCHES[0] += 1
        grid3 = _dims(grid, "grid", self.name)
        block3 = _dims(block, "block", self.name)
        threads = block3[0] * block3[1] * block3[2]
        if threads > 1024:
            raise KernelArgumentError(f"{self.name}: a block of {threads} threads exceeds CUDA's limit of 1024")
        if threads > self.max_threads_per_block:
            raise self._too_many_threads(threads)
        _check_dim_limits(self.name, grid3, block3)
        if not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise KernelArgumentError(f"{self.name}: shared_mem must be a non-negative int, got {shared_mem!r}")
        prepared = check_arguments(self.name, self.params, args, self.backend)
        if RECORDERS:
            RECORDERS[-1].launches.append((self, grid3, block3, tuple(prepared), int(shared_mem), stream))
        if _Stubbed.depth:
            return
        if self.backend == "cuda":
            if shared_mem and self._needs_opt_in(shared_mem):
                self._opt_in_shared(int(shared_mem))
            kwargs = {"shared_mem": int(shared_mem)}
            if stream is not None:
                kwargs["stream"] = stream
            if LAUNCH_OBSERVERS:
                notify_launch("before")
                self._kernel(grid3, block3, tuple(prepared), **kwargs)
                notify_launch("after")
            else:
                self._kernel(grid3, block3, tuple(prepared), **kwargs)
        else:
            _refuse_past_any_gpu(self.name, shared_mem)
            _sim_launch(self._entry, self.name, grid3, block3, prepared, int(shared_mem),
                        self.module._sim_library.stack_bytes, self.enable_cooperative_groups)


class RawModule:
    """Compiles CUDA C source for the current backend (``cupy.RawModule``'s signature)::

        mod = llmcupy.RawModule(code=r'''
        __global__ void scale(float* y, const float* x, float a, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = a * x[i];
        }''')
        k = mod.get_function("scale")
        k(((n + 255) // 256,), (256,), (y, x, np.float32(2.0), np.int32(n)))

    On ``cuda`` CuPy compiles it with NVRTC; in the emulator g++ builds it, and a compile error
    raises ``llmcupy.sim.SimCompileError`` with the compiler's messages. Template kernels are named
    with ``name_expressions=["k<float>"]``. ``target`` overrides the backend (``"cuda"`` or
    ``"sim"``) for this module only. In the emulator a plain launch does not check accesses to global
    memory (an overrun may corrupt the Python process's own memory): ``with
    llmcupy.sim.settings(check="all"):`` runs the launches inside under racecheck, memcheck and
    initcheck, which stop a bad access and name its line. ``enable_cooperative_groups=True`` makes
    every launch of the module's kernels cooperative (all blocks resident at once, so
    ``cg::this_grid().sync()`` works; in the emulator a grid too large for its device is refused with
    ``llmcupy.sim.SimCooperativeLaunchTooLargeError``).
    """

    def __init__(self, *, code: str | None = None, path: str | None = None, options=(), backend: str = "nvrtc",
                 translate_cucomplex: bool = False, enable_cooperative_groups: bool = False,
                 name_expressions=None, jitify: bool = False, target: str | None = None,
                 filename: str | None = None):
        if (code is None) == (path is None):
            raise ValueError("give exactly one of code= or path=")
        if path is not None:
            with open(path) as f:
                code = f.read()
            filename = filename or str(path).replace("\\", "/").rsplit("/", 1)[-1]
        self.code = code
        if isinstance(options, (str, bytes)):
            # tuple("-DN=4") is ('-', 'D', 'N', ...): the define would be lost without a word
            raise TypeError(f"options must be a tuple of strings, one per option, e.g. ({options!r},); got the "
                            f"string {options!r}")
        self.options = tuple(options)
        if backend != "nvrtc":
            # CuPy takes only NVRTC's mangled names for name expressions, through which every kernel is
            # found here: on a GPU CuPy would refuse the module, naming expressions the user never gave
            raise ValueError(f"backend={backend!r}: llmcupy compiles with NVRTC on a GPU (it finds every kernel "
                             "through NVRTC's name expressions) and with g++ in the emulator; leave backend= out")
        self.filename = filename or "kernel.cu"
        self.backend = target or _backend.get_backend()
        # as in CuPy, a property of the module: its kernels are launched cooperatively (in the
        # emulator: every block at once, grid.sync() allowed; see sim/launcher.py launch)
        self.enable_cooperative_groups = bool(enable_cooperative_groups)
        self.name_expressions = list(name_expressions or [])
        self._functions: dict[str, RawKernel] = {}
        if self.backend == "cuda":
            import cupy

            # Without name expressions CuPy looks a kernel up by its plain name, but a kernel that is
            # not extern "C" is in the cubin only under its C++ mangled name (_Z5scalePfPKffi for
            # `scale`): name every __global__ function of the source, plus the user's expressions.
            # as NVRTC will see the source: a kernel in a disabled #if branch would fail the compile
            expressions = sim_compiler.compiled_kernel_names(code, self.options, self.filename)
            expressions += [e for e in self.name_expressions if e not in expressions]
            self.cuda_name_expressions = expressions
            kwargs = {}
            if jitify:  # CuPy warns on every module given jitify=..., and v15 drops the argument
                kwargs["jitify"] = True
            # CuPy's compile cache (memory and disk) keys on the source and the options, not on the headers
            # found through -I: their hash as a define makes an edited header a new key, not a stale cubin
            options = self.options
            try:
                headers = sim_compiler.include_digest(code, self.options, self.filename)
            except sim_compiler.SimCompileError:
                headers = ""   # an option NVRTC refuses: CuPy's compile says so
            if headers:
                options += (f"-DLLMCUPY_INCLUDES={headers}",)
            self._cupy_module = cupy.RawModule(
                code=code, options=options, backend=backend, translate_cucomplex=translate_cucomplex,
                enable_cooperative_groups=enable_cooperative_groups,
                name_expressions=expressions or None, **kwargs,
            )
        elif self.backend == "sim":
            # kernels inside namespaces are found qualified ("ops::scale"), as name_expressions spell them
            # a kernel declared and never defined is no kernel of the module, as on a GPU (get_function says so)
            self._undefined_kernels = sim_compiler.undefined_kernel_names(code)
            names = [n for n in sim_compiler.global_kernel_names(code) if n not in self._undefined_kernels]
            for expr in self.name_expressions:
                if expr not in names and expr not in self._undefined_kernels:
                    names.append(expr)
            self.kernel_names = names
            self.variable_names = sim_compiler.device_variables(code)
            # the included headers' hash too: a header edited since the last build gives a new library;
            # and the file name, which the library's assert and fault messages name
            headers = sim_compiler.include_digest(code, self.options, self.filename)
            memo_key = (code, self.options, tuple(names), headers, self.filename, sim_compiler.build_environment())
            self._sim_library = _SIM_LIBRARIES.get(memo_key)
            if self._sim_library is None:
                from ..sim.launcher import SimLibrary

                try:
                    self._sim_library = SimLibrary(code, names, self.options, self.filename, self.variable_names)
                except sim_compiler.SimCompileError:
                    # a name expression naming no kernel fails the build inside generated code
                    # (RawKernel(code, "scal")); say which name instead
                    self._refuse_unknown_expressions(code)
                    raise
                _SIM_LIBRARIES[memo_key] = self._sim_library
            # as the compiler saw the source: a kernel or variable in a disabled #if branch is not there
            self.kernel_names = [n for n in names if n in self._sim_library.kernels]
            self.variable_names = list(self._sim_library.variables)
        else:
            raise ValueError(f"unknown target {self.backend!r}")

    def __repr__(self) -> str:
        # what a notebook shows for `mod`: which file, which backend, and what get_function can fetch
        names = getattr(self, "kernel_names", None) or getattr(self, "cuda_name_expressions", None) or []
        return (f"<llmcupy.RawModule {self.filename} on {self.backend}: kernels "
                f"{', '.join(names) or 'none'}>")

    def _refuse_unknown_expressions(self, code: str) -> None:
        declared = sim_compiler.global_function_names(code)
        for expr in self.name_expressions:
            base = expr.strip().lstrip("&").split("<", 1)[0].strip().split("::")[-1]
            if base not in declared:
                raise AttributeError(_no_kernel(expr, base, self.filename, declared))

    def compile(self, log_stream=None):
        if self.backend == "cuda":
            self._cupy_module.compile(log_stream)

    def get_global(self, name: str):
        """A ``__constant__`` or ``__device__`` variable's memory, as ``cupy.RawModule.get_global``:
        a ``cupy.cuda.MemoryPointer`` on ``cuda``; on ``sim`` an object with the same ``ptr``,
        ``size``, ``copy_from_host``, ``copy_to_host`` and ``memset``. :meth:`global_array` gives
        an array view on either backend."""
        if self.backend == "cuda":
            # not cupy.RawModule.get_global: (CuPy 14.2) it wraps the address with size 0, so
            # global_array could not size a view, and it looks up the plain name, which misses a
            # variable inside a namespace (its symbol is mangled)
            return _cuda_global(self._cupy_module, name, self.filename)
        if name not in self.variable_names:
            raise AttributeError(
                f"no __constant__ or __device__ variable {name!r} at file scope in {self.filename}; "
                f"variables: {', '.join(self.variable_names) or 'none'}"
            )
        ptr, size = self._sim_library.global_address(name)
        return SimGlobal(name, ptr, size)

    def global_array(self, name: str, dtype, shape=None):
        """The variable ``name`` as an ``xp`` array of ``dtype`` (``shape`` defaults to all of it),
        sharing its memory: write it before a launch to set a ``__constant__`` table (on the cuda
        backend with ``.set(host_array)``, a copy from the host as ``cudaMemcpyToSymbol`` makes: a
        kernel's store into constant memory, which ``[:] =`` would launch, is not defined to reach
        the constant cache)."""
        dtype = np.dtype(dtype)
        mem = self.get_global(name)
        size = mem.size if self.backend == "sim" else mem.mem.size
        count = size // dtype.itemsize
        shape = (count,) if shape is None else tuple(np.atleast_1d(shape))
        if int(np.prod(shape)) * dtype.itemsize > size:
            raise ValueError(f"{name}: {size} bytes cannot hold an array of shape {shape} and dtype {dtype}")
        if self.backend == "cuda":
            import cupy

            return cupy.ndarray(shape, dtype, memptr=mem)
        return mem.array(dtype, shape)

    def get_function(self, name: str) -> RawKernel:
        """The kernel ``name`` (a ``__global__`` function of the source, or one of the name
        expressions), ready to launch; an AttributeError lists the kernels if there is none."""
        kernel = self._functions.get(name)
        if kernel is None:
            if self.backend == "sim" and name in self._undefined_kernels:
                raise self._undefined_kernel_error(name)
            if self.backend == "sim" and name not in self.kernel_names:
                raise AttributeError(_no_kernel(name, name, self.filename, self.kernel_names)
                                     + " (template kernels need name_expressions=)")
            kernel = self._functions[name] = RawKernel(self, name)
        return kernel

    def _undefined_kernel_error(self, name: str) -> AttributeError:
        """In the emulator, for a kernel the source declares and never defines (where a GPU fails too)."""
        return AttributeError(
            f"kernel {name!r} of {self.filename} is declared but never defined (it has no body), so a GPU has no "
            "such kernel either: NVRTC compiles the source, and CuPy's get_function fails for it "
            "('CUDA_ERROR_NOT_FOUND: named symbol not found'); define it, or launch one of the kernels the source "
            f"defines: {', '.join(self.kernel_names) or 'none'}")

    def _unknown_kernel_error(self, name: str, exc: BaseException) -> AttributeError | None:
        """On a GPU, the emulator's AttributeError for a kernel name the source lacks, where CuPy's
        lookup of ``name`` failed with ``exc`` for that reason; None when it failed for another."""
        try:
            from cupy.cuda.compiler import CompileException
        except ImportError:
            CompileException = ()
        if isinstance(exc, CompileException):
            # CuPy compiles at the first lookup, and NVRTC refuses a name expression that names no
            # kernel ('identifier "scal" is undefined' in its name map), naming no kernel it has
            try:
                self._refuse_unknown_expressions(self.code)
            except AttributeError as unknown:
                return unknown
            return None
        if name not in self.cuda_name_expressions and "NOT_FOUND" in str(exc):
            # a name the module was not given (a typo) reaches the driver's lookup, whose
            # "CUDA_ERROR_NOT_FOUND: named symbol not found" says neither which name nor the choices
            return AttributeError(_no_kernel(name, name, self.filename, self.cuda_name_expressions)
                                  + " (template kernels need name_expressions=)")
        return None


ANY_GPU_SHARED_BYTES = 227 * 1024   # the most shared memory any GPU gives one block (sm_90, opted in)


def _refuse_past_any_gpu(name: str, nbytes: int) -> None:
    """In the emulator, which has no device limit: the shared memory no GPU would give a block."""
    if nbytes > ANY_GPU_SHARED_BYTES:
        raise KernelArgumentError(f"{name}: {nbytes} bytes of shared memory exceed any GPU's "
                                  f"{ANY_GPU_SHARED_BYTES // 1024} KiB")


def _no_kernel(asked: str, base: str, filename: str, kernels) -> str:
    """The error for a kernel name the source lacks: the kernels it has, and the one a typo most likely
    meant (in a catalogue file of nine kernels, '..._kernl9' is hard to spot by eye)."""
    import difflib

    kernels = list(kernels)
    close = difflib.get_close_matches(base, kernels, n=1, cutoff=0.8)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    return f"no kernel {asked!r} in {filename}{guess}; kernels: {', '.join(kernels) or 'none'}"


def mangled_variable_name(name: str) -> str:
    """The symbol of a ``__device__``/``__constant__`` variable as the cubin names it: a file-scope
    variable's own name, a namespaced one's Itanium mangling (``ops::gain`` -> ``_ZN3ops4gainE``)."""
    parts = name.split("::")
    if len(parts) == 1:
        return name
    if not all(p.isidentifier() for p in parts):
        raise AttributeError(f"{name!r}: only plain names and namespace::name variables can be looked up")
    return "_ZN" + "".join(f"{len(p)}{p}" for p in parts) + "E"


_LIBCUDA = []


def _cu_module_get_global(module_handle: int, symbol: str) -> tuple[int, int]:
    """(address, size in bytes) of a module's global through the driver's cuModuleGetGlobal_v2
    (CuPy's driver.moduleGetGlobal drops the size); raises AttributeError when it is not there."""
    if not _LIBCUDA:
        _LIBCUDA.append(ctypes.CDLL("libcuda.so.1"))  # already loaded by CuPy: this only finds it
    fn = _LIBCUDA[0].cuModuleGetGlobal_v2
    fn.restype = ctypes.c_int
    fn.argtypes = (ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
                   ctypes.c_char_p)
    ptr, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = fn(ctypes.byref(ptr), ctypes.byref(size), ctypes.c_void_p(module_handle), symbol.encode())
    if status != 0:  # CUDA_ERROR_NOT_FOUND (500) for a name that is not in the module
        raise AttributeError(f"CUDA error {status}")
    return int(ptr.value), int(size.value)


def _cuda_global(cupy_module, name: str, filename: str):
    """A ``cupy.cuda.MemoryPointer`` to the variable ``name`` of a compiled CuPy module, sized."""
    import cupy

    symbol = mangled_variable_name(name)
    module = cupy_module.module  # compiles on first use; cached per device by CuPy
    try:
        ptr, size = _cu_module_get_global(int(module.ptr), symbol)
    except AttributeError as exc:
        raise AttributeError(f"no __constant__ or __device__ variable {name!r} (symbol {symbol}) in {filename} "
                             f"({exc})") from None
    mem = cupy.cuda.UnownedMemory(ptr, size, module, cupy.cuda.runtime.getDevice())
    return cupy.cuda.MemoryPointer(mem, 0)


class SimGlobal:
    """A device variable of an emulator library: ``cupy.cuda.MemoryPointer``'s surface."""

    def __init__(self, name: str, ptr: int, size: int):
        self.name, self.ptr, self.size = name, ptr, size

    def _address(self, mem) -> int:
        import ctypes

        if isinstance(mem, np.ndarray):
            return mem.ctypes.data
        return mem.value if isinstance(mem, ctypes.c_void_p) else int(mem)

    def _check(self, size: int) -> int:
        if not 0 <= size <= self.size:
            raise ValueError(f"{self.name}: {size} bytes do not fit its {self.size} bytes")
        return size

    def copy_from_host(self, mem, size: int) -> None:
        import ctypes

        ctypes.memmove(self.ptr, self._address(mem), self._check(size))

    def copy_to_host(self, mem, size: int) -> None:
        import ctypes

        ctypes.memmove(self._address(mem), self.ptr, self._check(size))

    def memset(self, value: int, size: int) -> None:
        import ctypes

        ctypes.memset(self.ptr, value, self._check(size))

    def array(self, dtype=np.uint8, shape=None) -> np.ndarray:
        import ctypes

        dtype = np.dtype(dtype)
        buf = (ctypes.c_char * self.size).from_address(self.ptr)
        flat = np.frombuffer(buf, dtype=dtype, count=self.size // dtype.itemsize)
        return flat if shape is None else flat.reshape(shape)

    def __repr__(self) -> str:
        return f"<SimGlobal {self.name} at {self.ptr:#x}, {self.size} bytes>"


_SIM_LIBRARIES: dict = {}


def kernels_dir():
    """The folder of the catalogue's .cu files (installed as the package ``llmcupy.kernels_cu``)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llmcupy.kernels_cu")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            if (Path(loc) / "common.cuh").is_file():
                return Path(loc)
    here = Path(__file__).resolve().parents[2] / "kernels_cu"  # a source checkout on sys.path
    if (here / "common.cuh").is_file():
        return here
    raise FileNotFoundError("cannot find the kernels_cu folder of the llmcupy installation")


_FILE_MODULES: dict = {}


def _cupy_cuda_include_dir():
    """The CUDA header folder CuPy's NVRTC path adds last (CuPy 14: cuda-pathfinder's ``cudart``
    headers, NVIDIA's runtime wheel before a toolkit), or None when that cannot be told."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        return None
    try:
        found = find_nvidia_header_directory("cudart")
    except Exception:  # noqa: BLE001 - a lookup failure only means we cannot tell
        return None
    return Path(found) if found else None


def _crt_mma_candidates() -> list:
    """Folders that may hold ``crt/mma.h``: NVCC's CUDA 12 wheel (``nvidia/cuda_nvcc/include``: crt
    and two nvcc headers, so it shadows nothing), then a toolkit (``$CUDA_PATH``, ``/usr/local/cuda``).
    (CUDA 13's nvidia-cuda-crt wheel installs into the runtime wheel's own folder.)"""
    from .. import nvrtc

    return ([r / "nvidia" / "cuda_nvcc" / "include" for r in nvrtc._package_roots()]
            + [t / "include" for t in nvrtc._toolkit_roots()])


@functools.lru_cache(maxsize=None)
def mma_header_dir():
    """(folder to add with -I or None, problem or None) for a file that includes ``<mma.h>`` on cuda.

    ``<mma.h>`` includes ``crt/mma.h``, which NVIDIA's runtime wheels do not ship (CUDA 12: it is in
    the nvcc wheel's own folder; CUDA 13: in the nvidia-cuda-crt wheel). When the folder CuPy
    compiles against lacks it, another folder that has it is added for that file only, else the
    problem says what to install."""
    where = _cupy_cuda_include_dir()
    if where is None or (where / "crt" / "mma.h").is_file():
        return None, None
    for cand in _crt_mma_candidates():
        if (cand / "crt" / "mma.h").is_file():
            return cand, None
    return None, (f"<mma.h> needs crt/mma.h, which the CUDA headers CuPy compiles against ({where}) lack; "
                  "pip install nvidia-cuda-crt (CUDA 13) or nvidia-cuda-nvcc-cu12 (CUDA 12), or set CUDA_PATH "
                  "to a CUDA toolkit")


def _mma_options(code: str) -> tuple:
    if "<mma.h>" not in code:
        return ()
    extra, _ = mma_header_dir()
    return (f"-I{extra}",) if extra is not None else ()


def load_kernel_file(filename: str, name_expressions=()) -> RawModule:
    """The catalogue file ``kernels_cu/<filename>`` compiled for the current backend (cached).

    Every non-template kernel is named as a name expression, so its C++ (mangled) name resolves on
    the GPU without ``extern "C"``.
    """
    backend = _backend.get_backend()
    key = (filename, backend, tuple(name_expressions))
    mod = _FILE_MODULES.get(key)
    if mod is None:
        directory = kernels_dir()
        code = (directory / filename).read_text()
        names = sim_compiler.global_kernel_names(code) + [n for n in name_expressions]
        # RawModule adds the hash of the headers the file includes (common.cuh, ...) to the options on a
        # GPU, since CuPy's compile cache does not look at files found through -I
        options = DEFAULT_OPTIONS + (f"-I{directory}",)
        if backend == "cuda":
            options += _mma_options(code)
        mod = RawModule(code=code, options=options, name_expressions=names, filename=filename, target=backend)
        _FILE_MODULES[key] = mod
    return mod
