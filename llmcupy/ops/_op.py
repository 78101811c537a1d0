"""What an op is: a NumPy reference, numbered kernel versions, sizes, tolerances and a bound.

An op module (``llmcupy/ops/<name>.py``) builds one :class:`Op` named ``OP``; the registry finds
it. The same object serves the CLI, the model, the tests, the benchmark and notebooks::

    op = llmcupy.ops["softmax_forward"]
    y = op(x, version=5)            # runs kernel version 5 on the current backend
    y_ref = op.reference(x)         # the NumPy reference
    op.versions                     # {1: Version(...), ...}
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..runtime import backend as _backend
from ..runtime.module import RECORDERS as _RECORDERS
from ..runtime.module import TRUSTED as _TRUSTED
from ..runtime.module import LaunchRecorder as _LaunchRecorder
from ..runtime.module import array_address as _raw_address
from ..runtime.signature import DeviceLimitError as _DeviceLimitError
from ..runtime.module import load_kernel_file

ALL_BLOCK_SIZES = (32, 64, 128, 256, 512, 1024)

# Observers of every op launch (the profiler): each is called as hook(op, version, block_size,
# arrays) and returns a context manager that wraps the launch.
_HOOKS: list = []
# The phase of a training step the model is in ("forward blocks", "optimizer", ...), for the profiler.
_PHASE = ["", ]


def add_hook(hook) -> None:
    _HOOKS.append(hook)


def remove_hook(hook) -> None:
    if hook in _HOOKS:
        _HOOKS.remove(hook)


class phase:
    """``with phase("backward blocks"): ...`` labels the launches inside for the profiler."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.previous = _PHASE[0]
        _PHASE[0] = self.name
        return self

    def __exit__(self, *exc):
        _PHASE[0] = self.previous
        return False


def current_phase() -> str:
    return _PHASE[0]


# -- graph-safe launches (CUDA graphs) --------------------------------------------------------------
#
# A CUDA graph capture records what is launched on a stream; it must not see a host
# synchronisation (any read of device values on the host) and should not allocate device memory
# (an address baked into the graph must stay the graph's). Two things in the ops do either:
#
# * host checks: validation that reads array *values*, e.g. that token ids lie in [0, V)
#   (``int(tokens.max())`` copies to the host). Validators guard them with
#   ``host_checks_enabled()``; a caller that has validated the values itself (the model checks
#   each batch on the host in ``set_batch``) turns them off with ``host_checks(False)`` or
#   ``Op.run(..., host_checks=False)``. Shape, dtype and constraint checks always run.
# * scratch: temporaries a launcher allocates (cuBLAS outputs, atomics targets). Launchers get
#   them from ``scratch(...)``: a fresh array normally, or inside ``graph_safe(workspace)`` the
#   workspace's buffer for that (op, name, shape, dtype), allocated on its first use (the eager
#   warm-up step) and reused afterwards, so a capture allocates nothing. A sealed workspace
#   (during capture) refuses to allocate, and an op that would allocate an output (no ``out=``)
#   is refused too.

_HOST_CHECKS = [True]
_WORKSPACE: list = [None]


def host_checks_enabled() -> bool:
    """False while a caller has said the values are validated (see ``host_checks``)."""
    return _HOST_CHECKS[0]


@contextlib.contextmanager
def host_checks(enabled: bool):
    """``with host_checks(False): ...``: validation skips the checks that read array values."""
    previous = _HOST_CHECKS[0]
    _HOST_CHECKS[0] = bool(enabled)
    try:
        yield
    finally:
        _HOST_CHECKS[0] = previous


class Workspace:
    """Scratch buffers that outlive a launch, so a captured graph's temporaries keep their addresses.

    Owned by whoever owns the graph (``model.StepGraph``): the buffers live as long as it does.
    ``sealed`` (set for the capture) makes a request for a buffer it does not hold an error
    instead of an allocation.
    """

    def __init__(self):
        self.buffers: dict = {}
        self.sealed = False

    def get(self, owner: str, name: str, shape, dtype):
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        key = (owner, name, shape, np.dtype(dtype).str)
        buf = self.buffers.get(key)
        if buf is None:
            if self.sealed:
                raise OpError(f"{owner}: scratch {name!r} {shape} {np.dtype(dtype).name} was not allocated by the "
                              "warm-up step; a captured graph cannot allocate it")
            buf = self.buffers[key] = _backend.xp().empty(shape, dtype=dtype)
        return buf

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self.buffers.values())

    def __len__(self) -> int:
        return len(self.buffers)


@contextlib.contextmanager
def graph_safe(workspace: Workspace):
    """Launches inside are capturable: host checks off, hooks skipped, scratch from ``workspace``."""
    previous = _WORKSPACE[0]
    _WORKSPACE[0] = workspace
    try:
        with host_checks(False):
            yield workspace
    finally:
        _WORKSPACE[0] = previous


def scratch(owner: str, name: str, shape, dtype=np.float32, fill=None, fill_count: int | None = None):
    """A temporary for one launch of op ``owner``: a new array, or the graph's workspace buffer.

    ``fill`` (e.g. 0.0, -inf) sets every element (the workspace's buffer holds the last call's
    values otherwise), or with ``fill_count`` the first ``fill_count`` (a counter ahead of slices
    every launch overwrites). Never return a scratch array to a caller: the next launch reuses it.
    """
    workspace = _WORKSPACE[0]
    if workspace is None:
        buf = _backend.xp().empty(shape, dtype=dtype)
    else:
        buf = workspace.get(owner, name, shape, dtype)
    if fill is not None:
        (buf if fill_count is None else buf.reshape(-1)[:fill_count]).fill(fill)
    if _RECORDERS:
        # a launch plan asks for the same buffer again on a replay (see _recorded_launches)
        recorder = _RECORDERS[-1]
        recorder.scratch.append(((owner, name, shape, dtype, fill, fill_count), buf, len(recorder.launches)))
    return buf


# -- the eager launch path: launch plans -------------------------------------------------------
#
# Checking a call (validate, requires, out= shapes, then every kernel argument against its C
# signature) costs tens of microseconds of Python, as much as a GPU kernel at GPT-2's sizes: a
# 124M step launches ~300 times. The checks depend only on the call's *plan key*: the device, the
# version and block size, each array's shape, dtype, contiguity and writability, the values of
# scalar inputs, and whether the run is graph-safe. So ``Op.run`` checks a call the first time its key is seen
# and records a ``_LaunchPlan``; later calls with the same key replay it: no validation (except
# host checks, which read values), no constraint checks, no kernel-argument checks (the launches
# run ``trusted``), outputs rebuilt from ``out=`` and the recorded aliases. Alignment is the one
# property a key cannot see without an address (and a NumPy address costs a microsecond), so the
# plan keeps the arrays whose addresses the checks looked at (``address()`` records them) and
# compares their alignment on every replay. Any change of shape, dtype, layout, alignment or
# version takes the checked path again and records a new plan.
#
# A version whose launcher is marked ``@kernels_only`` (it does nothing but launch kernels on the
# arrays it is given, grids and scalars computed from shapes, block size and scalar inputs) goes
# further: the plan also records the kernel launches of the checked call (kernel, grid, block,
# shared memory, the prepared arguments) and a replay re-issues them with this call's arrays in
# the recorded argument slots, without running the launcher's Python (no grid arithmetic, no
# np.int32(...) per scalar, no kernel lookup). A recording is dropped, and the launcher runs under
# ``trusted`` as for other versions, when a launch argument is an array that is not one of the
# call's own nor a ``scratch()`` buffer (which a replay asks for, and fills, again), nor a slice
# ``x[j]`` of one of those along its first axis (the q, k, v blocks of a qkvr buffer; any other
# view made in the launcher is its own; nor is a slice that lies in two of the call's arrays,
# which then overlap: which one it came from would be a guess), or when the launcher used a
# stream, cuBLAS or another op. An argument that was one array under several names (an in-place
# op given out=) replays only while a call's arrays under those names are again one array;
# otherwise the launcher runs.

_MAX_PLANS = 1024                # per op: a caller cycling through endless shapes stays bounded
_RECORDING = [False]             # True while a checked run records the arrays address() looks at
# id -> the alignment a plan must see again: what misaligned() required (and found), or 0 when a
# check read the address itself (address()), which keeps the array's whole alignment
_RECORDED_ADDRESSES: dict = {}


class _Unplannable(Exception):
    """An argument the plan key cannot describe (the call then always takes the checked path)."""


def _describe(a):
    if a is None:
        return None
    if type(a) is np.ndarray:
        # flags.num: contiguity and writability (and ownership, alignment) in one int, one attribute read
        return (a.shape, a.dtype, a.flags.num)
    if isinstance(a, (float, np.floating)):
        # a real scalar by its bits: 0.0 == -0.0, and a recorded launch replays the recorded value
        return (type(a), float(a).hex())
    if isinstance(a, (bool, int, str, np.generic)):
        return (type(a), a)  # a scalar input (NH, V): the checks may depend on its value
    # (after the scalars: a NumPy scalar has a shape and flags too, but its value is what matters)
    shape = getattr(a, "shape", None)
    if shape is not None and hasattr(a, "flags"):
        return (type(a), shape, a.dtype, a.flags.c_contiguous)
    raise _Unplannable


def _plan_key(number, block_size, graph_safe_run: bool, arrays: dict, out: dict | None):
    try:
        # the device too: a launcher may size its grid or pick a kernel by the device's SM count or
        # shared memory, and the checks of device limits ran for the device current at the time
        return (_backend.get_backend(), _backend.current_device(), number, block_size, graph_safe_run,
                tuple([(k, _describe(a)) for k, a in arrays.items()]),
                None if out is None else tuple([(k, _describe(a)) for k, a in out.items()]))
    except (_Unplannable, TypeError):  # TypeError: an unhashable scalar
        return None


def _alignment(x) -> int:
    """The largest power of two (up to 256) that divides x's address."""
    addr = _raw_address(x) & 255
    return addr & -addr if addr else 256


def kernels_only(launch):
    """Marks a Version launcher whose only effects are kernel launches on the arrays it is given and
    on ``scratch()`` buffers (filled, if at all, by scratch's ``fill``), or on their slices ``x[j]``
    along the first axis, grids and scalars computed from their shapes, the block size and scalar
    inputs (see the launch plans above): a launch plan may record and replay those launches. No
    cuBLAS, no other host work on the arrays."""
    launch.kernels_only = True
    return launch


def _leading_index(a, x):
    """j when ``a`` is the memory of ``x[j]`` (a slice along x's first axis, as ``qkvr[1]`` is k),
    else None. Both C-contiguous of one dtype, so the address and the shape settle it. (x at least
    2-D: a 1-D x[j] is a scalar, not the array the launch had.)"""
    if (type(a) is not type(x) or getattr(x, "ndim", 0) < 2 or a.dtype != x.dtype
            or tuple(a.shape) != tuple(x.shape[1:]) or not (a.flags.c_contiguous and x.flags.c_contiguous)
            or a.base is None):
        return None
    stride = x.strides[0]
    offset = _raw_address(a) - _raw_address(x)
    if stride <= 0 or offset % stride or not 0 <= offset // stride < x.shape[0]:
        return None
    return offset // stride


def _recorded_launches(recorder, arrays: dict, outputs: dict, out: dict | None):
    """The checked launches of a call as replayable templates, or None when they are not replayable.

    Each launch becomes (kernel, grid, block, shared_mem, constants, slots, scratch, views):
    ``constants`` the prepared argument tuple with the arrays blanked, ``slots`` (index, source,
    name) triples saying which array goes where: source 0 an input, 1 an output, 2 the launcher's
    name-th scratch buffer, asked for again (and filled again) on a replay just before the launch
    it preceded, as ``scratch`` lists; ``views`` (index, source, name, j) for an argument that was
    ``array[j]`` of such an array (the three q, k, v blocks of a qkvr buffer). An argument that
    was one array under several names (logits and dlogits of an in-place op given as out=) is
    taken from the first, and the plan's ``same`` pairs say which names must again be one array
    for the recording to apply. Returns (templates, same, scratch requests).
    """
    if recorder is None or not recorder.valid or not recorder.launches:
        return None, (), ()
    given = set(out or ())
    scratch_ids = {id(buf): i for i, (_, buf, _) in enumerate(recorder.scratch)}

    def names_of(a):
        names = [(0, k) for k, x in arrays.items() if x is a]
        # an output not given by the caller but identical to an input is rebuilt as that input
        # on every replay (aliases, allocate): no condition needed on it
        names += [(1, k) for k, x in outputs.items() if x is a and (k in given or not names)]
        if not names and id(a) in scratch_ids:
            names = [(2, scratch_ids[id(a)])]
        return names

    candidates = [x for x in (*arrays.values(), *outputs.values(), *(buf for _, buf, _ in recorder.scratch))
                  if getattr(x, "ndim", 0) >= 2]
    templates, same = [], []
    for j, (kernel, grid3, block3, args, shared_mem, stream) in enumerate(recorder.launches):
        if stream is not None:
            return None, (), ()   # a stream chosen by the launcher is state the key does not see
        constants, slots, views = list(args), [], []
        for i, a in enumerate(args):
            if a is None or isinstance(a, (np.generic, bool, int, float)):
                continue
            names, index = names_of(a), None
            if not names:
                found = [(x, j) for x, j in ((x, _leading_index(a, x)) for x in candidates) if j is not None]
                if len({id(x) for x, _ in found}) > 1:
                    # x[j] is also y[k] of another of the call's arrays (the two overlap): which one the
                    # launcher cut it from cannot be told, and a replay's arrays need not overlap alike
                    return None, (), ()
                if found:
                    x, index = found[0]
                    names = names_of(x)
            if not names:
                return None, (), ()   # a view or a temporary of its own: not one of the call's arrays
            if index is None:
                slots.append((i,) + names[0])
            else:
                views.append((i,) + names[0] + (index,))
            same += [(names[0], other) for other in names[1:] if (names[0], other) not in same]
            constants[i] = None
        before = tuple(k for k, (_, _, position) in enumerate(recorder.scratch) if position == j)
        templates.append((kernel, grid3, block3, shared_mem, tuple(constants), tuple(slots), before, tuple(views)))
    return tuple(templates), tuple(same), tuple(request for request, _, _ in recorder.scratch)


def _same_arrays(same, arrays: dict, outputs: dict) -> bool:
    """Whether the arrays the recorded launches took from one place are again one array."""
    for (first_source, first), (other_source, other) in same:
        if (outputs if first_source else arrays)[first] is not (outputs if other_source else arrays)[other]:
            return False
    return True


def _replay_launches(launches, scratch_requests, arrays: dict, outputs: dict) -> None:
    buffers = []
    sources = (arrays, outputs, buffers)
    for kernel, grid3, block3, shared_mem, constants, slots, before, views in launches:
        for k in before:   # in request order: buffers[k] is the k-th request's
            buffers.append(scratch(*scratch_requests[k]))
        args = list(constants)
        for i, source, name in slots:
            args[i] = sources[source][name]
        for i, source, name, index in views:
            args[i] = sources[source][name][index]
        kernel._launch_replayed(grid3, block3, tuple(args), shared_mem)


@dataclass
class _LaunchPlan:
    version: Version
    block_size: int | None
    aliases: tuple               # (output name, input name) pairs: outputs updated in place
    alignments: tuple            # (where, name, alignment): arrays whose addresses the checks read
    launches: tuple | None = None  # the checked call's kernel launches, for a kernels_only version
    same: tuple = ()               # ((source, name), (source, name)): one array when recorded
    scratch: tuple = ()            # the scratch() requests of the recorded launcher, in order

    @classmethod
    def record(cls, v: Version, block_size, arrays: dict, out: dict | None, aliases,
               launches=(None, (), ())) -> "_LaunchPlan":
        bs = v.default_block_size if block_size is None else int(block_size)
        seen = []
        for where, d in (("arrays", arrays), ("out", out or {})):
            for name, a in d.items():
                required = None if a is None else _RECORDED_ADDRESSES.get(id(a))
                if required is not None:
                    seen.append((where, name, required or _alignment(a)))
        return cls(v, bs, aliases, tuple(seen), *launches)

    def aligned_as_before(self, arrays: dict, out: dict | None) -> bool:
        # at least as aligned as the checked call was (its alignment, a power of two, divides the
        # address): the alignment checks would pass again
        for where, name, alignment in self.alignments:
            a = (arrays if where == "arrays" else out).get(name)
            if a is None or _raw_address(a) % alignment:
                return False
        return True


_PLANS_ENABLED = [True]


@contextlib.contextmanager
def launch_plans(enabled: bool):
    """``with launch_plans(False): ...`` checks every call in full (the launch benchmark's baseline)."""
    previous = _PLANS_ENABLED[0]
    _PLANS_ENABLED[0] = bool(enabled)
    try:
        yield
    finally:
        _PLANS_ENABLED[0] = previous


def plans_cached() -> int:
    """How many launch plans the ops hold (for tests and the launch benchmark)."""
    from . import _discover

    return sum(len(op._plans) for op in _discover().values())


def clear_plans() -> None:
    from . import _discover

    for op in _discover().values():
        op._plans.clear()


class _NoAllocation:
    """The array module a graph-safe ``Op.run`` hands ``allocate``: aliasing outputs pass, allocating fails."""

    def __init__(self, op_name: str):
        self.op_name = op_name

    def _refuse(self, *args, **kwargs):
        raise OpError(f"{self.op_name}: allocates an output inside a graph-safe (capturable) step; pass every "
                      "output it does not update in place with out=")

    empty = zeros = full = empty_like = zeros_like = ones = _refuse
    float32 = np.float32
    int32 = np.int32


class OpError(ValueError):
    """Bad input to an op: unknown version, wrong shape or dtype, a violated constraint."""


class OpDefinitionError(OpError):
    """A mistake in the op's own definition (its ``sim_sizes`` or ``sizes`` do not fit its ``make_inputs``):
    a failure of the op wherever it shows, never sizes a caller asked for that a run may skip."""


class UnknownVersionError(OpError, KeyError):
    """``op.versions[N]`` for a version the op does not have: an OpError that is also the KeyError a
    dict lookup raises, so code catching either keeps working."""

    def __str__(self) -> str:
        return str(self.args[0])   # KeyError would print the message as a quoted repr


class VersionTable(dict):
    """``op.versions``: a plain dict of number -> :class:`Version` whose failed lookup names the op and
    lists its versions (a notebook's ``op.versions[99]`` would otherwise say only ``KeyError: 99``)."""

    def __init__(self, versions=(), op_name: str = "the op"):
        # (versions first, as dict's: copy.copy, dataclasses.asdict and pickle rebuild it that way)
        super().__init__(versions)
        self.op_name = op_name

    def __missing__(self, number):
        listing = ", ".join(str(v) for v in sorted(self))
        raise UnknownVersionError(f"{self.op_name} has no version {number!r}; versions: {listing}")


@dataclass
class Version:
    """One numbered kernel version of an op.

    ``launch(arrays, block_size)`` launches the kernel(s) on ``arrays`` (inputs and outputs by
    name, already on the backend). ``requires(arrays, block_size)`` returns None when the version
    can run, else a sentence saying which constraint fails. A version with ``unavailable`` set is
    listed with that reason and refuses to run. ``deterministic=False`` marks a version whose
    result varies from run to run (fp32 atomics add in whatever order the threads arrive): it is
    flagged in ``describe()`` / ``--list`` and the trainer does not use it by default.
    """

    number: int
    summary: str
    launch: Callable | None = None
    block_sizes: tuple = ALL_BLOCK_SIZES
    default_block_size: int | None = None
    requires: Callable | None = None
    unavailable: str | None = None
    deterministic: bool = True
    kernels_only: bool | None = None   # None: as the launcher is marked (``@kernels_only``)

    def __post_init__(self):
        if self.default_block_size is None and self.block_sizes:
            self.default_block_size = 256 if 256 in self.block_sizes else self.block_sizes[-1]
        if self.kernels_only is None:
            self.kernels_only = bool(getattr(self.launch, "kernels_only", False))
        if isinstance(self.requires, _Requirement) and self.requires.number != self.number:
            self.requires = self.requires.fn   # dataclasses.replace(v, number=N): its mistakes name N
        if self.requires is not None and not isinstance(self.requires, _Requirement):
            self.requires = _Requirement(self.requires, self.number)

    @property
    def available(self) -> bool:
        return self.unavailable is None

    def __repr__(self) -> str:
        # the dataclass's repr shows the launcher's address; a notebook's op.versions shows this
        state = (f"; unavailable: {self.unavailable}" if self.unavailable else "") + (
            "; nondeterministic" if not self.deterministic else "")
        sizes = ", ".join(map(str, self.block_sizes))
        return (f"<version {self.number}: {self.summary}; block sizes {sizes} (default "
                f"{self.default_block_size}){state}>")


class _Requirement:
    """A version's ``requires``, holding its answer to the contract every caller reads: None, or the
    sentence a refusal prints. A predicate written the other way round (``lambda a, bs: C % 4 == 0``,
    True when the version *can* run) would otherwise run the version where it must not and refuse
    it, with the reason "True", where it can."""

    def __init__(self, fn: Callable, number: int):
        self.fn = fn
        self.number = number
        self.op_name = ""   # set by the Op that holds the version

    def __call__(self, arrays, block_size):
        answer = self.fn(arrays, block_size)
        if answer is None or (isinstance(answer, str) and answer):
            return answer
        who = f"{self.op_name} version {self.number}" if self.op_name else f"version {self.number}"
        raise TypeError(f"{who}: requires() returned {answer!r}; it must return None when the version can "
                        "run, else a sentence saying which constraint fails (\"C must be a multiple of 4\"), "
                        "which a refusal prints")


@dataclass
class Bound:
    """The upper bound a version's time is compared against.

    ``kind="memory"``: ``bytes(sizes)`` moved once (reads + writes), compared with the device's
    measured copy bandwidth. ``kind="flops"``: ``flops(sizes)``, compared with ``baseline(arrays)``
    (the cuBLAS computation of the same result) timed on the same inputs. ``tf32``: the op's kernels
    compute in TF32, so its baseline is timed with TF32 on (on sm_80+) whatever the run's setting, and
    the two times compare one precision.
    """

    kind: str
    bytes: Callable | None = None
    flops: Callable | None = None
    baseline: Callable | None = None
    tf32: bool = False


@dataclass(frozen=True)
class GrowingTolerance:
    """A tolerance for an error that is the sum of ``size`` independent rounding errors of random sign
    (a reduction over rounded terms, as a TF32 dot product): its standard deviation grows as
    sqrt(size), so a fixed atol is either loose at small sizes or exceeded at large ones.

    At the sizes of a run (``Op.sizes_of`` of its inputs): atol = sigmas * per_term * sqrt(sizes[size]),
    with ``per_term`` the standard deviation of one term's error, and a fixed rtol for the rest
    (FP32 accumulation, a bias added after the sum)."""

    size: str          # the key of Op.sizes_of that is the reduction's length
    per_term: float    # standard deviation of one term's error
    sigmas: float      # how far in the tail: 8 leaves ~1e-15 per element, nothing at 1e8 outputs
    rtol: float

    def at(self, sizes: dict) -> tuple:
        return (self.sigmas * self.per_term * float(sizes[self.size]) ** 0.5, self.rtol)

    def __str__(self) -> str:
        return f"{self.sigmas:g} * {self.per_term:.3g} * sqrt({self.size}) + {self.rtol:g}*|ref|"


@dataclass
class Op:
    """One op of the catalogue: a NumPy reference and numbered CUDA kernel versions of one computation.

    Get one with ``llmcupy.ops["softmax_forward"]``; ``repr(op)`` shows how it is called::

        op.describe()                  # its versions, one line each, the default marked *
        op.inputs, op.outputs          # argument names of op(...), names of what it returns
        x = llmcupy.xp().asarray(op.make_inputs()["inp"])   # an input of the right shape, on the backend
        y = op(x, version=5)           # run kernel version 5 (default: op.default_version)
        y_ref = op.reference(x)        # the NumPy reference
        op.tolerance                   # output -> (atol, rtol): |ref - out| <= atol + rtol * |ref|
        op.versions[5].summary         # what version 5 does; op.source_code() is its .cu file

    Arrays are NumPy arrays in the emulator and CuPy arrays on a GPU (``llmcupy.xp()`` is the
    matching module), or PyTorch tensors. A bad call (unknown version or input, wrong dtype or
    shape) raises :class:`OpError` naming the op and what is wrong.
    """

    name: str
    summary: str
    source: str                      # kernels_cu/<source>
    inputs: tuple                    # positional argument names of op(...)
    outputs: tuple                   # names of the returned arrays
    versions: dict
    default_version: int
    reference_fn: Callable           # reference(**inputs as NumPy) -> dict of outputs
    make_inputs_fn: Callable         # make_inputs(rng, **sizes) -> dict of NumPy inputs
    allocate_fn: Callable            # allocate(xp, arrays) -> dict of output arrays (may alias inputs)
    sizes: dict                      # the spec's benchmark sizes
    sim_sizes: dict                  # the emulator's default (small) sizes
    test_shapes: list                # awkward shapes the tests run every version at
    tolerance: dict                  # output -> (atol, rtol): |ref - out| <= atol + rtol * |ref|,
                                     # or a GrowingTolerance (atol that grows with a reduction's length)
    tolerance_note: str = ""         # why these tolerances
    # output -> (atol, rtol) for a run whose FP32 GEMMs went through cuBLAS with TF32 on (blas.tf32(True),
    # as the trainer and `bench --trainer-shapes` run them): TF32 rounds each GEMM input to a 10-bit mantissa,
    # an error FP32 tolerances rightly reject. Outputs not named keep ``tolerance``.
    tf32_tolerance: dict = field(default_factory=dict)
    tf32_tolerance_note: str = ""    # why these tolerances
    validate_fn: Callable | None = None  # validate(arrays) raises OpError on a shape/dtype mismatch
    sizes_of: Callable | None = None     # sizes_of(arrays) -> dict (for the bound)
    bound: Bound | None = None
    notes: str = ""
    extra: dict = field(default_factory=dict)
    # inputs a caller may leave out, with the value they then take (a scalar switch such as
    # matmul_backward's overwrite_dinp); they stay in ``inputs``, after the required ones
    input_defaults: dict = field(default_factory=dict)
    # inputs that may be None (matmul_forward's bias: the LM head has none); an input whose default
    # is None may be None too. None for any other input is refused by name.
    optional_inputs: tuple = ()
    # why the default is not llm.c's choice, where it is not (describe() and --list print it)
    default_note: str = ""
    _plans: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.versions, VersionTable):
            self.versions = VersionTable(self.versions, self.name)
        for v in self.versions.values():
            if isinstance(v.requires, _Requirement) and not v.requires.op_name:
                v.requires.op_name = self.name   # its refusals and mistakes name the op

    def __repr__(self) -> str:
        # the dataclass's repr lists every field (kilobytes of functions); a notebook shows this
        args = ", ".join(f"{k}=None" if k in self.input_defaults and self.input_defaults[k] is None
                         else f"{k}={self.input_defaults[k]!r}" if k in self.input_defaults else k
                         for k in self.inputs)
        returns = self.outputs[0] if len(self.outputs) == 1 else f"({', '.join(self.outputs)})"
        count = f"{len(self.versions)} version{'s' if len(self.versions) != 1 else ''}"
        return (f"<llmcupy op {self.name}({args}) -> {returns}: {count}, default "
                f"{self.default_version}; op.describe() lists them>")

    # -- discovery ------------------------------------------------------------------------------

    def version(self, number) -> Version:
        """The :class:`Version` numbered ``number``; an OpError listing the versions if there is none."""
        given = number
        try:
            if isinstance(number, (float, np.floating)) and not float(number).is_integer():
                raise ValueError(number)   # version=5.5 is no version, not version 5
            if isinstance(number, (bool, np.bool_)):
                raise ValueError(number)   # version=True is a mistake, not version 1
            number = int(number)
        except (TypeError, ValueError):
            number, given = None, repr(given)   # echo what was typed ("abc"), not None
        if number not in self.versions:
            listing = ", ".join(str(v) for v in sorted(self.versions))
            raise OpError(f"{self.name} has no version {given}; versions: {listing}"
                          f"{self._unregistered_hint(number) if number is not None else ''}")
        return self.versions[number]

    def _unregistered_hint(self, number: int) -> str:
        """For an unknown version: where the kernel file already has it (a header entry, a kernel named
        ``..._kernel<N>``) and no op on that file registers it, what is missing and where it goes."""
        try:
            mentions = kernel_file_versions(self.source_code()).get(number)
        except OSError:
            return ""
        if not mentions:
            return ""
        from . import _discover   # the registry imports the op modules, which import this one

        if any(op.source == self.source and number in op.versions for op in _discover().values()):
            return ""   # another op of the same file (matmul_forward.cu's matmul_gelu_forward) has it
        return (f"; kernels_cu/{self.source} has {' and '.join(mentions)}, but no Version({number}, ...) is "
                f"registered: add one to OP.versions in llmcupy/ops/{self.name}.py (DEVELOPERS.md, "
                "\"Adding a kernel version\")")

    def describe(self) -> str:
        """The op's summary and its versions, one line each: ``*`` marks the default, and unavailable
        or nondeterministic versions say so."""
        lines = [f"{self.name}: {self.summary} (kernels_cu/{self.source})"]
        for n in sorted(self.versions):
            v = self.versions[n]
            mark = "*" if n == self.default_version else " "
            state = f"  [unavailable: {v.unavailable}]" if v.unavailable else ""
            if not v.deterministic:
                state += "  [nondeterministic: fp32 atomics, results vary run to run]"
            lines.append(f" {mark}{n:>3}  {v.summary}{state}")
        if self.default_note:
            lines.append(f"       default {self.default_version}: {self.default_note}")
        lines.append(f"       tolerance: {self.tolerance_text()} (why: op.tolerance_note)")
        if self.bound is not None:
            lines.append("       upper bound on a GPU: " + (
                "the device's copy bandwidth for the bytes the op must move once (memory-bound)"
                if self.bound.kind == "memory" else "cuBLAS computing the same result at the same shapes"))
        return "\n".join(lines)

    def tolerance_text(self) -> str:
        """``op.tolerance`` as a learner reads it: the bound on |out - ref| of each output (outputs with
        the same bound grouped), and the TF32 ones; ``op.tolerance_note`` says why those numbers."""
        def grouped(tolerances: dict) -> str:
            groups: dict = {}
            for name, tol in tolerances.items():
                text = (f"within {tol.sigmas:g} * {tol.per_term:.3g} * sqrt({tol.size}) + {tol.rtol:.3g}*|ref|"
                        if isinstance(tol, GrowingTolerance) else
                        "exact" if tuple(tol) == (0, 0) else f"within {tol[0]:g} + {tol[1]:.3g}*|ref|")
                groups.setdefault(text, []).append(name)
            return "; ".join(f"{', '.join(names)} {text}" for text, names in groups.items())

        text = grouped(self.tolerance)
        if self.tf32_tolerance:
            text += f"; with TF32 GEMMs (the trainer's default): {grouped(self.tf32_tolerance)}"
        return text

    def source_code(self) -> str:
        """The text of the op's kernel file, ``kernels_cu/<op.source>`` (a header describing every
        version, then the kernels)."""
        from ..runtime.module import kernels_dir

        return (kernels_dir() / self.source).read_text()

    def module(self):
        """The kernel file compiled for the current backend, a :class:`llmcupy.RawModule` (cached)."""
        return load_kernel_file(self.source)

    def kernel(self, name: str):
        """The kernel ``name`` of the op's file, ready to launch as ``k(grid, block, args)``."""
        return self.module().get_function(name)

    # -- running --------------------------------------------------------------------------------

    def reference(self, *args, **kwargs):
        """The NumPy reference on the same arguments as ``op(...)``, as op(...) returns them (one
        array, or a tuple in the order of ``op.outputs``); inputs may be NumPy or CuPy arrays, and
        are checked as ``op(...)`` checks them (an OpError for a wrong dtype or shape)."""
        arrays = self._bind(args, kwargs, numpy=True)
        self._check_none(arrays)
        if self.validate_fn is not None:
            # the checks op(...) makes (dtype, shapes that agree): a float64 or mis-shaped input would
            # otherwise give a reference of another precision or shape, and a comparison against the
            # kernel's output would fail, or pass, for the wrong reason
            self.validate_fn(arrays)
        # copies (some references update in place, as their ops do); None stays None (an absent bias,
        # not a 0-d object array, which a reference would take for a value)
        out = self.reference_fn(**{k: None if v is None else np.array(v, copy=True) for k, v in arrays.items()})
        return self._unpack(out)

    def make_inputs(self, rng=None, **sizes) -> dict:
        """Inputs by name, as NumPy arrays drawn as llm.c's test harness draws them (``rng``: a
        ``np.random.Generator``, seed 0 by default), at the emulator's small ``sim_sizes`` or, on a GPU,
        the benchmark's ``sizes``; keyword sizes (``B=2, T=64``...) override them. Pass them to the op
        as ``op(**inputs)`` (moved to the GPU first on cuda: ``llmcupy.runtime.asarray``). An int
        ``rng`` is a seed, as the CLIs' ``--seed``."""
        import inspect

        if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
            rng = np.random.default_rng(0 if rng is None else int(rng))   # a negative seed: NumPy's ValueError
        elif not isinstance(rng, np.random.Generator):
            raise OpError(f"{self.name}.make_inputs: rng must be a np.random.Generator or an int seed, got "
                          f"{type(rng).__name__}")
        params = inspect.signature(self.make_inputs_fn).parameters
        takes = [k for k in params if k != "rng"]   # the sizes and any option (matmul_forward's has_bias)
        for name, value in sizes.items():
            if name not in params:
                raise OpError(f"{self.name}.make_inputs has no size {name!r}; it takes {', '.join(takes)}")
            if name in self.sizes and value is not None and (
                    isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
                raise OpError(f"{self.name}.make_inputs: {name} must be a positive int, got {value!r}")
        which = "sim_sizes" if _backend.is_sim() else "sizes"
        merged = dict(getattr(self, which))
        merged.update({k: v for k, v in sizes.items() if v is not None})
        problem = self.sizes_problem(merged, which)   # the call's names are checked above: the rest are the op's
        if problem is not None:
            # the op's own defaults are wrong (a new op's, or `sizes`, which only a GPU run reads): say where
            raise OpDefinitionError(f"{self.name}.make_inputs: {problem} (llmcupy/ops/{self.name}.py)")
        return self.make_inputs_fn(rng, **merged)

    def sizes_problem(self, sizes: dict, which: str = "sizes") -> str | None:
        """What ``make_inputs`` would refuse in ``sizes`` (``which`` names them: ``"sizes"`` or ``"sim_sizes"``):
        a size the op's ``make_inputs`` needs and they lack, or one it does not take. None when they fit."""
        import inspect

        params = inspect.signature(self.make_inputs_fn).parameters
        signature = ", ".join(k for k in params if k != "rng")
        unknown = [k for k in sizes if k not in params or k == "rng"]
        if unknown:
            return f"OP.{which} has {', '.join(unknown)}, which make_inputs(rng, {signature}) does not take"
        missing = [k for k, p in params.items() if k != "rng" and p.default is p.empty and k not in sizes]
        if missing:
            return (f"it needs {', '.join(missing)}, which neither the call nor OP.{which} gives: add "
                    f"{'it' if len(missing) == 1 else 'them'} to OP.{which}")
        return None

    def run(self, version: int | None, arrays: dict, block_size: int | None = None, out: dict | None = None,
            host_checks: bool | None = None) -> dict:
        """Runs a version on ``arrays`` (backend arrays by name); returns the outputs by name.

        ``out`` gives preallocated output arrays by name (the model writes into its activation
        buffers, and a CUDA graph needs fixed addresses); their shapes must match what the op
        allocates itself. ``host_checks=False`` skips the validation that reads array values on
        the host (a synchronisation; e.g. token ids in range) for a caller that has checked them;
        None follows ``host_checks_enabled()``. Inside ``graph_safe(...)`` the op may not allocate
        outputs, its scratch comes from the workspace and the launch hooks (profiler) are skipped.
        """
        if _RECORDERS:
            _RECORDERS[-1].valid = False  # an op inside another op's launcher: replay that launcher instead
        if self.input_defaults:
            arrays = self._with_defaults(arrays)
        graph_safe_run = _WORKSPACE[0] is not None
        number = self.default_version if version is None else version
        key = _plan_key(number, block_size, graph_safe_run, arrays, out) if _PLANS_ENABLED[0] else None
        plan = self._plans.get(key) if key is not None else None
        if plan is not None and plan.aligned_as_before(arrays, out):
            return self._replay(plan, arrays, out, host_checks, graph_safe_run)
        _RECORDED_ADDRESSES.clear()
        _RECORDING[0] = True
        v = self.versions.get(number) if type(number) is int else None
        recorder = _LaunchRecorder() if key is not None and v is not None and v.kernels_only else None
        if recorder is not None:
            _RECORDERS.append(recorder)
        try:
            outputs, aliases = self._checked_run(number, arrays, block_size, out, host_checks, graph_safe_run)
        finally:
            _RECORDING[0] = False
            if recorder is not None:
                _RECORDERS.pop()
        if key is not None and aliases is not None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()  # a caller cycling through endless shapes: keep memory bounded
            self._plans[key] = _LaunchPlan.record(self.versions[int(number)], block_size, arrays, out, aliases,
                                                  _recorded_launches(recorder, arrays, outputs, out))
        return outputs

    def _replay(self, plan, arrays, out, host_checks, graph_safe_run) -> dict:
        """The launch path of a call whose checks passed before for the same plan key (see ``_LaunchPlan``)."""
        v, bs = plan.version, plan.block_size
        if self.validate_fn is not None and (_HOST_CHECKS[0] if host_checks is None else host_checks):
            # host checks read array *values* (token ids), which the key does not cover: run them again
            if host_checks is None:
                self.validate_fn(arrays)
            else:
                with _host_checks_cm(host_checks):
                    self.validate_fn(arrays)
        if out is None:
            outputs = self.allocate_fn(_NoAllocation(self.name) if graph_safe_run else _backend.xp(), arrays)
        else:
            outputs = dict(out)
            for name, source in plan.aliases:
                outputs[name] = arrays[source]
        hooks = None if graph_safe_run else _HOOKS
        launches = plan.launches
        if launches is not None and (not plan.same or _same_arrays(plan.same, arrays, outputs)):
            if hooks or _backend.get_backend() == "cuda":
                self._launch_observed(v, bs, {**arrays, **outputs}, hooks or (),
                                      lambda: _replay_launches(launches, plan.scratch, arrays, outputs))
            else:
                _replay_launches(launches, plan.scratch, arrays, outputs)
            return outputs
        merged = {**arrays, **outputs}
        with _TRUSTED:
            if hooks or _backend.get_backend() == "cuda":
                self._launch_observed(v, bs, merged, hooks or ())
            else:
                v.launch(merged, bs)
        return outputs

    def _launch_observed(self, v, bs, merged, hooks, replay=None) -> None:
        with contextlib.ExitStack() as stack:
            if _backend.get_backend() == "cuda":
                # an NVTX range per op, so Nsight Systems shows the step op by op
                from cupyx.profiler import time_range

                stack.enter_context(time_range(f"{self.name} v{v.number}"))
            for hook in list(hooks):
                stack.enter_context(hook(self, v.number, bs, merged))
            if replay is None:
                v.launch(merged, bs)
            else:
                replay()

    def _checked_run(self, version, arrays, block_size, out, host_checks, graph_safe_run):
        """Every check, then the launch. Returns the outputs and, for a plan, which outputs alias
        which inputs (None when a replay could not rebuild the outputs: one was allocated)."""
        aliases = []
        v = self.version(version)
        if not v.available:
            raise OpError(f"{self.name} version {v.number} is unavailable: {v.unavailable}")
        if self.validate_fn is not None:
            if host_checks is None:
                self.validate_fn(arrays)
            else:
                with _host_checks_cm(host_checks):
                    self.validate_fn(arrays)
        bs = v.default_block_size if block_size is None else _as_block_size(self.name, v, block_size)
        if v.block_sizes and bs not in v.block_sizes:
            raise OpError(
                f"{self.name} version {v.number}: block size {bs} is not one of {', '.join(map(str, v.block_sizes))}"
            )
        if v.requires is not None:
            problem = v.requires(arrays, bs)
            if problem:
                raise OpError(f"{self.name} version {v.number}: {problem}")
        if out is None:
            outputs = self.allocate_fn(_NoAllocation(self.name) if graph_safe_run else _backend.xp(), arrays)
        else:
            unknown = [k for k in out if k not in self.outputs]
            if unknown:   # a misspelt name would otherwise be ignored and the result written elsewhere
                raise OpError(f"{self.name} has no output {', '.join(map(repr, unknown))}; outputs: "
                              f"{', '.join(self.outputs)}")
            outputs = dict(out)
            expected = self.allocate_fn(_ShapeOnly(), arrays)
            for name, like in expected.items():
                if name in outputs and like is not None and tuple(outputs[name].shape) != tuple(like.shape):
                    raise OpError(f"{self.name}: out[{name!r}] has shape {tuple(outputs[name].shape)}, "
                                  f"expected {tuple(like.shape)}")
                if (name in outputs and isinstance(like, _Meta) and outputs[name] is not None
                        and getattr(outputs[name], "dtype", like.dtype) != like.dtype):
                    raise OpError(f"{self.name}: out[{name!r}] has dtype {outputs[name].dtype}, expected "
                                  f"{like.dtype.name}")
                flags = getattr(outputs.get(name), "flags", None)
                if flags is not None:   # else the launch's argument check would name a kernel, not out=
                    if not flags.c_contiguous:
                        raise OpError(f"{self.name}: out[{name!r}] is not C-contiguous (strides "
                                      f"{tuple(outputs[name].strides)}); pass a C-ordered array")
                    if not getattr(flags, "writeable", True):
                        raise OpError(f"{self.name}: out[{name!r}] is read-only; pass a writable array")
                if name in outputs:
                    continue
                if not isinstance(like, _Meta):
                    outputs[name] = like  # an input updated in place
                    source = next((k for k, a in arrays.items() if a is like), None)
                    if source is None:
                        aliases = None
                    elif aliases is not None:
                        aliases.append((name, source))
                elif graph_safe_run:
                    _NoAllocation(self.name).empty()
                else:
                    # (only when missing: setdefault(name, xp.empty(...)) allocated a throwaway buffer per call)
                    outputs[name] = _backend.xp().empty(like.shape, like.dtype)
                    aliases = None
        merged = {**arrays, **outputs}
        hooks = [] if graph_safe_run else list(_HOOKS)
        try:
            if hooks or _backend.get_backend() == "cuda":
                self._launch_observed(v, bs, merged, hooks)
            else:
                v.launch(merged, bs)
        except _DeviceLimitError as exc:
            # the kernel's name alone does not say which op, version and block size to change
            raise _DeviceLimitError(f"{self.name} version {v.number} at block size {bs}: {exc}") from None
        except OverflowError as exc:
            # a launcher's np.int32(n) of a size past 2^31 - 1: NumPy's text names no op, and the
            # kernel's int could not have indexed it anyway (any other overflow is a bug: as it is)
            if "out of bounds for" not in str(exc):
                raise
            raise OpError(f"{self.name} version {v.number}: a size does not fit its kernels' C int arguments ({exc}); "
                          "use smaller sizes") from None
        return outputs, (tuple(aliases) if aliases is not None else None)

    def __call__(self, *args, version: int | None = None, block_size: int | None = None, out=None,
                 **kwargs):
        """Runs a version on CuPy arrays (GPU), NumPy arrays (emulator) or PyTorch tensors.

        The inputs are ``op.inputs``, by position or by name. ``version``: a number of
        ``op.versions`` (default ``op.default_version``); ``block_size``: one of that version's
        ``block_sizes`` (default its ``default_block_size``). Returns the output array, or for an op
        with several outputs a tuple in the order of ``op.outputs``.

        ``out`` gives the output arrays to write, as a dict by output name or, for an op with one
        output, that array; an unknown name, shape or dtype is refused. Inputs must be C-contiguous
        and non-empty. (flash_attention_backward has an input named ``out``: ``out=`` is that input
        unless it was given by position.)

        PyTorch tensors go through DLPack without a copy and the outputs come back as tensors, so a
        kernel version can be dropped into a PyTorch program.
        """
        if (out is not None and "out" in self.inputs and "out" not in kwargs
                and len(args) <= self.inputs.index("out")):
            # an input named "out" (flash_attention_backward: the forward's output) not given by
            # position: out= is that input, which the call could not do without
            kwargs, out = {**kwargs, "out": out}, None
        arrays = self._bind(args, kwargs, numpy=False)
        out = self._out_dict(out)
        self._check_none(arrays)
        torch_in = any(_is_torch(a) for a in arrays.values())
        if out and any(_is_torch(a) for a in out.values()):
            # a tensor's dtype is torch.float32, not a NumPy dtype: without this the out= check refused
            # it ("has dtype torch.float32, expected float32"). Written through in place, so no copy.
            for k, a in out.items():
                if _is_torch(a) and not a.is_contiguous():
                    raise OpError(f"{self.name}: out[{k!r}] is a non-contiguous PyTorch tensor, so the kernel "
                                  "would write a copy; pass a contiguous tensor")
            out = {k: (_from_torch(self.name, k, a, kind="output") if _is_torch(a) else a) for k, a in out.items()}
            torch_in = True
        if torch_in:
            copied = [k for k, a in arrays.items() if _is_torch(a) and not a.is_contiguous()]
            arrays = {k: (_from_torch(self.name, k, a) if _is_torch(a) else a) for k, a in arrays.items()}
            if copied:
                self._refuse_copied_in_place(copied, arrays)
        self._check_input_layout(arrays)
        result = self._unpack(self.run(version, arrays, block_size, out))
        if torch_in:
            import torch

            if isinstance(result, tuple):
                return tuple(None if r is None else torch.from_dlpack(r) for r in result)  # dbias=None
            return torch.from_dlpack(result)
        return result

    # -- helpers --------------------------------------------------------------------------------

    def _out_dict(self, out):
        """``out=`` as ``run`` takes it: a dict by output name, or for a single-output op the array itself."""
        if out is None:
            return out
        if not isinstance(out, dict) and len(self.outputs) == 1:
            out = {self.outputs[0]: out}
        if isinstance(out, dict):
            for k, a in out.items():
                if a is not None and getattr(a, "shape", None) is None:
                    raise OpError(f"{self.name}: out[{k!r}] must be an array, got {type(a).__name__}")
            return out
        raise OpError(f"{self.name} has {len(self.outputs)} outputs: give out= as a dict by name "
                      f"({', '.join(self.outputs)}), got {type(out).__name__}")

    def _check_none(self, arrays: dict) -> None:
        """Refuses None for an input the op needs: None stands only for an optional one (an absent bias)."""
        for k, a in arrays.items():
            if a is None and k not in self.optional_inputs and not (k in self.input_defaults
                                                                    and self.input_defaults[k] is None):
                raise OpError(f"{self.name}: input {k!r} is None; it needs a value (inputs: "
                              f"{', '.join(self.inputs)})")

    def _check_input_layout(self, arrays: dict) -> None:
        """The caller's arrays, named, before anything is allocated from them: an output allocated
        like a Fortran-ordered input would be Fortran-ordered too, and the launch would then blame
        the op's own output.

        Empty inputs are refused rather than answered with an empty result: the sizes an op derives
        from its inputs set launch grids (CUDA has no empty grid) and, for reductions (layernorm over
        C = 0, a mean over no rows, adamw over no parameters), have no meaningful result, so one rule
        for every op, as the CLIs refuse sizes below 1."""
        for k, a in arrays.items():
            flags = getattr(a, "flags", None)
            shape = getattr(a, "shape", None)
            if flags is None or shape is None:
                continue   # a scalar input (overwrite_dinp, a step count)
            if 0 in tuple(shape):
                raise OpError(f"{self.name}: input {k!r} is empty (shape {tuple(shape)}); every dimension must "
                              "be at least 1")
            if not flags.c_contiguous:
                raise OpError(f"{self.name}: input {k!r} is not C-contiguous (shape {tuple(shape)}, strides "
                              f"{tuple(a.strides)}); pass a C-ordered array (np.ascontiguousarray / "
                              "cupy.ascontiguousarray)")

    def _refuse_copied_in_place(self, copied, arrays) -> None:
        """A non-contiguous tensor reaches the kernel as a contiguous copy: an op that updates that
        input in place would update the copy and leave the caller's tensor unchanged."""
        aliased = {id(v) for v in self.allocate_fn(_ShapeOnly(), arrays).values() if not isinstance(v, _Meta)}
        for k in copied:
            if id(arrays[k]) in aliased:
                raise OpError(f"{self.name}: input {k!r} is updated in place, but the PyTorch tensor is not "
                              "contiguous, so the kernel would update a copy; pass a contiguous tensor "
                              "(t = t.contiguous()) and use that one")

    def _bind(self, args, kwargs, numpy: bool) -> dict:
        if len(args) > len(self.inputs):
            raise OpError(f"{self.name} takes {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(args)}")
        arrays = dict(zip(self.inputs, args))
        for k, v in kwargs.items():
            if k not in self.inputs:
                raise OpError(f"{self.name} has no input {k!r}; inputs: {', '.join(self.inputs)}")
            arrays[k] = v
        missing = [k for k in self.inputs if k not in arrays and k not in self.input_defaults]
        if missing:
            raise OpError(f"{self.name} is missing input(s) {', '.join(missing)}")
        arrays = self._with_defaults(arrays)
        if numpy:
            # arrays to NumPy; a scalar input (overwrite_dinp, a step count) stays the Python value
            # the op's validation expects
            return {k: (v if v is None or isinstance(v, (bool, int, float, np.generic)) else _backend.to_numpy(v))
                    for k, v in arrays.items()}
        return arrays

    def _with_defaults(self, arrays: dict) -> dict:
        missing = [k for k in self.input_defaults if k not in arrays]
        if not missing:
            return arrays
        return {**arrays, **{k: self.input_defaults[k] for k in missing}}

    def _unpack(self, out: dict):
        if len(self.outputs) == 1:
            return out[self.outputs[0]]
        return tuple(out[k] for k in self.outputs)


def _as_block_size(op_name: str, v: Version, block_size) -> int:
    """A block size as an int, or an OpError echoing what was given when it is not a whole number."""
    try:
        if isinstance(block_size, (float, np.floating)) and not float(block_size).is_integer():
            raise ValueError(block_size)   # 100.5 is no block size, not 100
        return int(block_size)
    except (TypeError, ValueError):
        sweep = f" (its block sizes: {', '.join(map(str, v.block_sizes))})" if v.block_sizes else ""
        raise OpError(f"{op_name} version {v.number}: block size {block_size!r} is not a whole number"
                      f"{sweep}") from None


def _is_torch(a) -> bool:
    return type(a).__module__.startswith("torch") and hasattr(a, "__dlpack__")


def _from_torch(op_name: str, name: str, t, kind: str = "input"):
    """A zero-copy view of a PyTorch tensor as the backend's array type (CuPy or NumPy); ``kind``
    ("input" or "output") names it in an error."""
    backend = _backend.get_backend()
    if backend == "cuda":
        if not t.is_cuda:
            raise OpError(f"{op_name}: {kind} {name!r} is a PyTorch CPU tensor; the cuda backend needs "
                          "a CUDA tensor (tensor.cuda())")
        import cupy

        return cupy.from_dlpack(t.detach().contiguous())
    if t.device.type != "cpu":
        raise OpError(f"{op_name}: {kind} {name!r} is a PyTorch {t.device.type} tensor; the emulator "
                      "runs on the CPU and needs a CPU tensor (tensor.cpu())")
    return np.from_dlpack(t.detach().contiguous())


_host_checks_cm = host_checks  # Op.run's parameter of the same name shadows the function


class _Meta:
    """A stand-in array with a shape and dtype only (for checking ``out=`` without allocating)."""

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)


class _ShapeOnly:
    """An array module whose allocators return :class:`_Meta` (shape checks for ``out=``)."""

    float32 = np.float32
    int32 = np.int32

    def empty(self, shape, dtype=np.float32, **_):
        return _Meta(shape if isinstance(shape, tuple) else (shape,) if np.isscalar(shape) else tuple(shape), dtype)

    zeros = empty
    full = lambda self, shape, fill, dtype=np.float32, **_: _Meta(shape, dtype)  # noqa: E731

    def empty_like(self, a, dtype=None, **_):
        return _Meta(a.shape, dtype or a.dtype)

    zeros_like = empty_like

    def __getattr__(self, name):
        return getattr(np, name)


def compare(name: str, ref: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> dict:
    """llm.c's check: |ref - got| <= atol + rtol * |ref| elementwise, non-finite references skipped."""
    ref = np.asarray(ref, dtype=np.float64)
    # entries a version leaves unwritten (trimat's upper triangle, from xp.empty) may hold signalling
    # NaN bit patterns, whose cast raises the FPU's invalid flag (a RuntimeWarning); non-finite values
    # are handled below, entry by entry
    with np.errstate(invalid="ignore"):
        got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        return {"name": name, "ok": False, "max_abs": float("inf"), "max_rel": float("inf"), "mismatches": ref.size,
                "first": f"shape {got.shape} != reference shape {ref.shape}"}
    finite = np.isfinite(ref)
    diff = np.where(finite, np.abs(ref - got), 0.0)
    diff = np.where(finite & ~np.isfinite(got), np.inf, diff)
    bad = diff > atol + rtol * np.abs(np.where(finite, ref, 0.0))
    rel = diff / np.maximum(np.abs(np.where(finite, ref, 0.0)), 1e-30)
    result = {
        "name": name,
        "ok": not bool(bad.any()),
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "max_rel": float(np.where(finite & (np.abs(ref) > atol), rel, 0.0).max()) if diff.size else 0.0,
        "mismatches": int(bad.sum()),
        "atol": atol,
        "rtol": rtol,
    }
    if bad.any():
        idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
        result["first"] = f"at {tuple(int(i) for i in idx)}: reference {ref[idx]!r}, got {got[idx]!r}"
    return result


def check_outputs(op: Op, ref: dict, got: dict, tf32: bool = False, inputs: dict | None = None) -> list:
    """Each output against the reference at the op's tolerance; ``tf32``: the run's GEMMs used TF32, so
    the outputs ``op.tf32_tolerance`` names are held to that instead. ``inputs`` (the run's arrays) size
    a ``GrowingTolerance``."""
    results = []
    for name in op.outputs:
        tolerance = op.tf32_tolerance.get(name, op.tolerance[name]) if tf32 else op.tolerance[name]
        if isinstance(tolerance, GrowingTolerance):
            if inputs is None:
                raise TypeError(f"check_outputs: {op.name}'s tolerance of {name} grows with its sizes; "
                                "pass the run's inputs")
            tolerance = tolerance.at(op.sizes_of(inputs))
        atol, rtol = tolerance
        results.append(compare(name, ref[name], _backend.to_numpy(got[name]), atol, rtol))
    return results


def need(condition: bool, message: str) -> None:
    """Shape/dtype validation helper for op modules."""
    if not condition:
        raise OpError(message)


def check_float32(op_name: str, **arrays) -> None:
    for k, a in arrays.items():
        if a is None:
            continue
        if getattr(a, "dtype", None) != np.float32:
            raise OpError(f"{op_name}: {k} must be float32, got {getattr(a, 'dtype', type(a).__name__)}")


def address(x) -> int:
    """The address of an array's first element: a CuPy array's device pointer, a NumPy array's host address.

    For alignment checks: a float4 (128-bit) load or store needs a 16-byte aligned address, and a
    view such as ``buf[1:]`` starts 4 bytes past its base.
    """
    if _RECORDING[0]:
        _RECORDED_ADDRESSES[id(x)] = 0  # a launch plan must re-check this array's alignment
    return _raw_address(x)


def misaligned(arrays: dict, names, align: int = 16, use: str = "float4 loads/stores") -> str | None:
    """For ``requires()``: None if every array in ``names`` starts on an ``align``-byte boundary.

    Otherwise the sentence "<name> must be 16-byte aligned for float4 loads/stores" for each
    misaligned one, joined with "; ". Names missing from ``arrays`` or set to None are skipped;
    ``use`` says what needs the alignment.
    """
    bad = []
    for k in names:
        a = arrays.get(k)
        if a is None:
            continue
        misses = _raw_address(a) % align
        if _RECORDING[0]:
            # a plan needs this alignment again, not the (possibly larger) one this address happens to have
            previous = _RECORDED_ADDRESSES.get(id(a), 1)
            if previous:
                _RECORDED_ADDRESSES[id(a)] = 0 if misses else max(previous, align)
        if misses:
            bad.append(k)
    return "; ".join(f"{k} must be {align}-byte aligned for {use}" for k in bad) or None


_HEADER_ENTRY = re.compile(r"(?m)^[ \t]*version (\d+):")
_NUMBERED_KERNEL = re.compile(r"__global__\b[^;{]*?\b(\w+_kernel(\d+))\s*\(")


def kernel_file_versions(code: str) -> dict:
    """The version numbers a kernel file speaks of, each with what names it: a ``version N:`` entry of
    the header comment the file starts with, and kernels named ``<...>_kernel<N>`` (DEVELOPERS.md,
    "Adding a kernel version")."""
    found: dict = {}
    text = code.lstrip()
    if text.startswith("/*") and "*/" in text:
        for n in _HEADER_ENTRY.findall(text[:text.index("*/")]):
            found.setdefault(int(n), []).append(f"a header entry 'version {n}:'")
    for name, n in _NUMBERED_KERNEL.findall(code):
        if f"kernel {name}" not in found.get(int(n), []):
            found.setdefault(int(n), []).append(f"kernel {name}")
    return found


def kernel_of(op_name: str, kernel_name: str):
    """The kernel ``kernel_name`` of op ``op_name``'s .cu file (compiled on first use), ready to launch."""
    # cached per backend: the registry, module and function lookups cost microseconds per launch
    key = (op_name, kernel_name, _backend.get_backend())
    kernel = _KERNELS.get(key)
    if kernel is None:
        from . import get  # imported here: the registry imports the op modules, which import this one

        kernel = _KERNELS[key] = get(op_name).kernel(kernel_name)
    return kernel


_KERNELS: dict = {}
