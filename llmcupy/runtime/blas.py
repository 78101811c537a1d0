"""Every GEMM of the ops, one entry point: cuBLAS / cuBLASLt on ``cuda``, NumPy on ``sim``.

    blas.gemm(a, b, out, trans_b=True)                   # out = a @ b^T
    blas.gemm(dout, w, dinp, beta=1.0)                   # dinp += dout @ w
    blas.gemm(q, k, preatt, trans_b=True)                # batched: (B, NH, T, HS) x (B, NH, T, HS)^T
    blas.gemm(x, w, out, trans_b=True, bias=b)           # cuBLASLt, bias added in the epilogue

``a``, ``b`` and ``out`` are float32 arrays stored row-major with unit stride along the last axis
(a row stride larger than the row is fine). A transposed operand is passed as it is stored, with
``trans_a``/``trans_b``, never as a ``swapaxes`` view: cuBLAS reads it transposed, so nothing is
copied. Arrays of more than two dimensions are a batch of matrices (strided-batched GEMM); their
leading dimensions must be equal and collapse into one batch stride.

Why not ``cupy.matmul`` (issue "First GPU run"):

* CuPy refuses any cuBLAS call while a stream is capturing (its ``setStream`` raises), so a step
  that calls ``cupy.matmul`` can never become a CUDA graph. Here the handle is ours (created through
  nvmath-python's low-level bindings), its workspace is set once, and the stream is bound before a
  capture begins (:func:`bind_stream`); during capture nothing but the GEMMs themselves is enqueued.
* batched ``cupy.matmul`` copies every non-contiguous operand (``ascontiguousarray`` on K^T, V^T,
  att^T, dpreatt^T) and ignores the TF32 setting; here transposes are flags and the compute type is
  ``CUBLAS_COMPUTE_32F_FAST_TF32`` whenever TF32 is on, batched or not.
* ``beta`` is exposed, so accumulating gradients (``dinp += ...``) needs no scratch GEMM and add.

The emulator runs the very same cuBLAS call description (column-major m, n, k, leading dimensions,
transpose flags, batch strides) through NumPy on strided views of the buffers, so the parameter
mapping the GPU receives is what the CPU tests check.

TF32 is a scoped setting: ``with blas.tf32(True): ...`` (restored on exit; the trainer wraps its run
in it); ``tf32_enabled()`` reads it. It also sets CuPy's own matmul compute type for code that still
calls CuPy (the benchmark baselines), and restores it.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np

from . import backend as _backend

# cuBLAS recommends a 32 MiB workspace on Hopper (4 MiB elsewhere); one per handle, set once.
WORKSPACE_BYTES = 32 * 1024 * 1024
# cuBLASLt's bias epilogue: the bias vector's alignment in bytes (see gemm)
BIAS_ALIGN = 16


class GemmError(ValueError):
    """An operand that the GEMM cannot read as a (batch of) row-major float32 matrices."""


# -- the call description (backend independent) ---------------------------------------------------

@dataclass(frozen=True)
class _Matrix:
    rows: int
    cols: int
    ld: int          # elements between consecutive rows (row-major)
    batch: int
    stride: int      # elements between consecutive matrices of the batch (0 when batch == 1)


def _matrix(x, name: str) -> _Matrix:
    if getattr(x, "dtype", None) != np.float32:
        raise GemmError(f"gemm: {name} must be float32, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim < 2:
        raise GemmError(f"gemm: {name} must have at least 2 dimensions (a matrix), got shape {tuple(x.shape)}")
    item = x.itemsize
    shape, strides = tuple(x.shape), tuple(s // item for s in x.strides)
    if any(s * item != st for s, st in zip(strides, x.strides)):
        raise GemmError(f"gemm: {name}'s strides {x.strides} are not whole float32 elements")
    rows, cols = shape[-2], shape[-1]
    col_stride = strides[-1] if cols > 1 else 1
    ld = strides[-2] if rows > 1 else max(cols, 1)
    if col_stride != 1 or ld < cols:
        raise GemmError(f"gemm: {name} (shape {shape}, strides {x.strides}) must be row-major with unit stride along "
                        "its last axis; pass a transposed operand as stored with trans_a/trans_b, not as a view")
    batch, stride = 1, 0
    lead = [(n, s) for n, s in zip(shape[:-2], strides[:-2]) if n != 1]
    if lead:
        batch = int(np.prod([n for n, _ in lead]))
        stride = lead[-1][1]
        expected = stride
        for n, s in reversed(lead):
            if s != expected:
                raise GemmError(f"gemm: {name}'s leading dimensions {shape[:-2]} (strides {x.strides[:-2]}) do not "
                                "collapse into one batch stride")
            expected = s * n
        if stride < rows * ld - (ld - cols):
            raise GemmError(f"gemm: {name}'s matrices overlap (batch stride {stride} elements, {rows} x {ld})")
    return _Matrix(rows, cols, ld, batch, stride)


@dataclass(frozen=True)
class GemmCall:
    """One cuBLAS call, column-major (what ``cublasGemmStridedBatchedEx`` receives).

    The row-major product out = op(a) @ op(b) is computed as its transpose, out^T = op(b)^T op(a)^T:
    a row-major matrix is its column-major transpose with the same leading dimension, so cuBLAS's A
    is our ``b``, its B is our ``a``, m = N (out's columns) and n = M (out's rows).
    """

    transa: bool
    transb: bool
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int
    batch: int


def describe(a, b, out, trans_a: bool = False, trans_b: bool = False) -> GemmCall:
    """Checks the shapes and returns the cuBLAS call for out = op(a) @ op(b)."""
    ma, mb, mo = _matrix(a, "a"), _matrix(b, "b"), _matrix(out, "out")
    M, K = (ma.cols, ma.rows) if trans_a else (ma.rows, ma.cols)
    Kb, N = (mb.cols, mb.rows) if trans_b else (mb.rows, mb.cols)
    if K != Kb or (mo.rows, mo.cols) != (M, N):
        raise GemmError(f"gemm: op(a) is {M} x {K}, op(b) is {Kb} x {N}, out is {mo.rows} x {mo.cols} "
                        f"(shapes a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}, "
                        f"trans_a={trans_a}, trans_b={trans_b})")
    if not (a.ndim == b.ndim == out.ndim and tuple(a.shape[:-2]) == tuple(b.shape[:-2]) == tuple(out.shape[:-2])):
        raise GemmError(f"gemm: batch dimensions differ: a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)}")
    batch = mo.batch
    return GemmCall(transa=bool(trans_b), transb=bool(trans_a), m=N, n=M, k=K, lda=mb.ld, ldb=ma.ld, ldc=mo.ld,
                    stride_a=mb.stride if mb.batch > 1 else 0, stride_b=ma.stride if ma.batch > 1 else 0,
                    stride_c=mo.stride, batch=batch)


# -- the scoped TF32 setting ---------------------------------------------------------------------

_TF32 = [False]


def tf32_enabled() -> bool:
    """Whether FP32 GEMMs may use TF32 tensor cores now (never in the emulator)."""
    return _TF32[0]


def _cupy_compute_type(enabled: bool | None):
    """Sets CuPy's FP32 matmul compute type (TF32 or default) and returns the previous one."""
    from cupy._core import _routines_linalg as linalg

    previous = linalg.get_compute_type(np.dtype(np.float32))
    if enabled is not None:
        mode = linalg.COMPUTE_TYPE_TF32 if enabled else linalg.COMPUTE_TYPE_DEFAULT
        linalg.set_compute_type(np.dtype(np.float32), mode)
    return previous


def _tf32_capable() -> bool:
    """TF32 tensor cores exist: a GPU of compute capability 8.0 or newer (never the emulator)."""
    return _backend.get_backend() == "cuda" and (_backend.compute_capability() or 0) >= 80


@contextlib.contextmanager
def tf32(enabled: bool):
    """``with tf32(True): ...``: TF32 for FP32 GEMMs inside (on sm_80+ only), the previous setting after.

    Yields whether TF32 is in use. Scoped, so a trainer run in-process cannot leave it on for what
    runs next (a test with FP32 tolerances, say).
    """
    use = bool(enabled) and _tf32_capable()
    previous = _TF32[0]
    previous_cupy = None
    if _backend.get_backend() == "cuda":
        previous_cupy = _cupy_compute_type(use)
    _TF32[0] = use
    try:
        yield use
    finally:
        _TF32[0] = previous
        if previous_cupy is not None:
            from cupy._core import _routines_linalg as linalg

            linalg.set_compute_type(np.dtype(np.float32), previous_cupy)


# -- entry points --------------------------------------------------------------------------------

# Every gemm call appends (GemmCall, bias is not None) here when not None (tests set it; recorded_gemms()).
RECORD: list | None = None


@contextlib.contextmanager
def recorded_gemms():
    """``with recorded_gemms() as calls:`` the GEMMs made inside, as RECORD entries; an outer recording
    (a test's) still receives them."""
    global RECORD
    previous, calls = RECORD, []
    RECORD = calls
    try:
        yield calls
    finally:
        RECORD = previous
        if previous is not None:
            previous.extend(calls)


def gemm(a, b, out, *, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0,
         bias=None) -> None:
    """out = alpha * op(a) @ op(b) + beta * out (+ bias along out's rows, cuBLASLt's epilogue).

    ``bias`` (a float32 vector of out's column count) needs 2-D operands and beta = 0.
    """
    call = describe(a, b, out, trans_a, trans_b)
    if bias is not None:
        if call.batch != 1 or beta != 0.0:
            raise GemmError("gemm: the bias epilogue takes 2-D operands and beta = 0")
        if getattr(bias, "dtype", None) != np.float32 or bias.shape != (call.m,) or \
                (bias.strides[0] != 4 and call.m > 1):
            raise GemmError(f"gemm: bias must be a contiguous float32 vector of {call.m} (out's columns), got "
                            f"{getattr(bias, 'dtype', None)} {tuple(getattr(bias, 'shape', ()))}")
        # cuBLASLt's epilogue reads the bias with 16-byte vector loads, and its heuristic has no way to
        # be told a lesser alignment (as it has for A, B, C): a row of a packed buffer at an odd float
        # offset could fault on the GPU (a sticky misaligned-address error that ends the process's CUDA
        # context) or be refused; llm.c asserts the same. Refused on both backends alike.
        from .module import array_address

        if array_address(bias) % BIAS_ALIGN:
            raise GemmError(f"gemm: the bias epilogue (cuBLASLt) needs the bias {BIAS_ALIGN}-byte aligned, its "
                            f"address {array_address(bias):#x} is not; pass an aligned copy, or add the bias "
                            "separately (matmul_forward version 2)")
    if RECORD is not None:
        RECORD.append((call, bias is not None))
    from .module import RECORDERS

    if RECORDERS:
        RECORDERS[-1].valid = False  # a launch plan replays kernel launches only, never this call
    if call.m == 0 or call.n == 0 or call.batch == 0:
        return
    if _backend.get_backend() == "cuda":
        from .module import LAUNCH_OBSERVERS, notify_launch

        if LAUNCH_OBSERVERS:
            notify_launch("before")
        _cuda().run(call, a, b, out, float(alpha), float(beta), bias)
        if LAUNCH_OBSERVERS:
            notify_launch("after")
    else:
        _numpy_gemm(call, a, b, out, float(alpha), float(beta), bias)


def bind_stream(stream=None) -> None:
    """Binds cuBLAS's handle to ``stream`` (default: the current one). Call before a capture begins:
    binding a stream resets cuBLAS's workspace, which must not happen inside a capture."""
    if _backend.get_backend() != "cuda":
        return
    import cupy

    _cuda().bind(int((stream or cupy.cuda.get_current_stream()).ptr))


# -- the emulator: the same call through NumPy ---------------------------------------------------

_np_matmul = np.matmul  # bound at import: a test that patches numpy.matmul sees only the ops' own calls


def _colmajor(x, rows: int, cols: int, ld: int, batch: int, stride: int, writeable: bool = False):
    """The column-major (rows x cols, leading dimension ld) matrices starting at x's first element."""
    item = x.itemsize
    return np.lib.stride_tricks.as_strided(x, shape=(batch, rows, cols), strides=(stride * item, item, ld * item),
                                           writeable=writeable)


def _numpy_gemm(call: GemmCall, a, b, out, alpha: float, beta: float, bias) -> None:
    c = call
    ar, ac = (c.k, c.m) if c.transa else (c.m, c.k)
    br, bc = (c.n, c.k) if c.transb else (c.k, c.n)
    A = _colmajor(b, ar, ac, c.lda, c.batch, c.stride_a)
    B = _colmajor(a, br, bc, c.ldb, c.batch, c.stride_b)
    C = _colmajor(out, c.m, c.n, c.ldc, c.batch, c.stride_c, writeable=True)
    opA = A.swapaxes(1, 2) if c.transa else A
    opB = B.swapaxes(1, 2) if c.transb else B
    # the product goes to a kept buffer, not a fresh array: like cuBLAS, a GEMM here allocates
    # nothing once warm (the graph tests measure that a replayed step allocates nothing)
    product = _np_product_buffer((c.batch, c.m, c.n))
    # Overflow and NaN propagate silently, as in cuBLAS: a diverging run is reported once, by the
    # trainer's non-finite loss check, not by NumPy warnings on stderr before it
    with np.errstate(over="ignore", invalid="ignore"):
        _np_matmul(opA, opB, out=product)  # FP32 products and sums, as SGEMM
        if alpha != 1.0:
            product *= np.float32(alpha)
        if beta == 0.0:
            C[...] = product
        else:
            if beta != 1.0:
                C *= np.float32(beta)
            C += product
        if bias is not None:
            C += bias.reshape(1, -1, 1)  # length m, down every column (cuBLASLt's BIAS epilogue)


_NP_BUFFERS: dict = {}


def _np_product_buffer(shape):
    buf = _NP_BUFFERS.pop(shape, None)
    if buf is None:
        buf = np.empty(shape, np.float32)
        while len(_NP_BUFFERS) >= 16:  # the step uses a handful of shapes; a sweep does not grow without bound
            _NP_BUFFERS.pop(next(iter(_NP_BUFFERS)))
    _NP_BUFFERS[shape] = buf  # most recently used last
    return buf


# -- the GPU: nvmath-python's cuBLAS / cuBLASLt bindings -----------------------------------------

class _CudaBlas:
    """Our cuBLAS and cuBLASLt handles for one device, with the workspace and the bound stream."""

    def __init__(self):
        import cupy

        try:
            from nvmath.bindings import cublas, cublasLt
        except ImportError as exc:
            raise _backend.BackendError(
                f"the cuda backend needs nvmath-python for cuBLAS ({exc}); install llmcupy's GPU extra: "
                "pip install -e '.[cuda12]' (or .[cuda13])") from None
        self.cublas, self.lt = cublas, cublasLt
        import nvmath

        self.r32f = int(nvmath.CudaDataType.CUDA_R_32F)
        self.device = cupy.cuda.Device().id
        self.handle = cublas.create()
        self.lt_handle = cublasLt.create()
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)  # kept for the handles' lifetime
        self.stream = None
        self.scalars: dict = {}   # host alpha/beta (cuBLAS reads them when a call is enqueued)
        self.lt_plans: dict = {}  # (call, tf32, bias) -> descriptors and the chosen algorithm

    def _scalar(self, value: float) -> int:
        arr = self.scalars.get(value)
        if arr is None:
            arr = self.scalars[value] = np.array([value], dtype=np.float32)
        return arr.ctypes.data

    def bind(self, stream_ptr: int) -> None:
        if self.stream == stream_ptr:
            return
        import cupy

        if cupy.cuda.runtime.streamIsCapturing(stream_ptr):
            raise GemmError("gemm: the stream is being captured but cuBLAS is not bound to it; call "
                            "llmcupy.runtime.blas.bind_stream(stream) before begin_capture")
        self.cublas.set_stream(self.handle, stream_ptr)
        # cublasSetStream resets the workspace to cuBLAS's own pool: hand ours back right away
        self.cublas.set_workspace(self.handle, self.workspace.data.ptr, WORKSPACE_BYTES)
        self.stream = stream_ptr

    def run(self, c: GemmCall, a, b, out, alpha: float, beta: float, bias) -> None:
        import cupy

        stream = int(cupy.cuda.get_current_stream().ptr)
        self.bind(stream)
        compute = (self.cublas.ComputeType.COMPUTE_32F_FAST_TF32 if _TF32[0] else self.cublas.ComputeType.COMPUTE_32F)
        op = self.cublas.Operation
        ta, tb = (op.T if c.transa else op.N), (op.T if c.transb else op.N)
        A, B, C = int(b.data.ptr), int(a.data.ptr), int(out.data.ptr)
        if bias is not None:
            self._lt_bias(c, A, B, C, int(bias.data.ptr), alpha, stream, compute)
        elif c.batch == 1:
            self.cublas.gemm_ex(self.handle, ta, tb, c.m, c.n, c.k, self._scalar(alpha), A, self.r32f, c.lda,
                                B, self.r32f, c.ldb, self._scalar(beta), C, self.r32f, c.ldc, compute,
                                self.cublas.GemmAlgo.DEFAULT)
        else:
            self.cublas.gemm_strided_batched_ex(
                self.handle, ta, tb, c.m, c.n, c.k, self._scalar(alpha), A, self.r32f, c.lda, c.stride_a,
                B, self.r32f, c.ldb, c.stride_b, self._scalar(beta), C, self.r32f, c.ldc, c.stride_c, c.batch,
                compute, self.cublas.GemmAlgo.DEFAULT)

    def _lt_bias(self, c: GemmCall, A: int, B: int, C: int, bias_ptr: int, alpha: float, stream: int,
                 compute) -> None:
        lt = self.lt
        # cuBLASLt's heuristic assumes 256-byte aligned matrices unless told otherwise, and an
        # algorithm it picks that way may not run on less aligned ones (a row slice of a stack, say):
        # the plan is made for the alignment these addresses actually have
        aligns = tuple(min(256, p & -p) if p else 256 for p in (A, B, C))
        key = (c, int(compute), aligns)
        plan = self.lt_plans.get(key)
        if plan is None:
            plan = self.lt_plans[key] = self._lt_plan(c, compute, aligns)
        desc, la, lb, lc, algo = plan
        attr = lt.MatmulDescAttribute.BIAS_POINTER
        ptr = np.array([bias_ptr], dtype=lt.get_matmul_desc_attribute_dtype(attr))
        lt.matmul_desc_set_attribute(desc, attr, ptr.ctypes.data, ptr.nbytes)
        lt.matmul(self.lt_handle, desc, self._scalar(alpha), A, la, B, lb, self._scalar(0.0), C, lc, C, lc,
                  algo.ctypes.data, self.workspace.data.ptr, WORKSPACE_BYTES, stream)

    def _lt_plan(self, c: GemmCall, compute, aligns):
        lt = self.lt
        desc = lt.matmul_desc_create(int(compute), self.r32f)

        def set_attr(attr, value):
            v = np.array([value], dtype=lt.get_matmul_desc_attribute_dtype(attr))
            lt.matmul_desc_set_attribute(desc, attr, v.ctypes.data, v.nbytes)

        op = self.cublas.Operation
        set_attr(lt.MatmulDescAttribute.TRANSA, int(op.T if c.transa else op.N))
        set_attr(lt.MatmulDescAttribute.TRANSB, int(op.T if c.transb else op.N))
        set_attr(lt.MatmulDescAttribute.EPILOGUE, int(lt.Epilogue.BIAS))
        la = lt.matrix_layout_create(self.r32f, *((c.k, c.m) if c.transa else (c.m, c.k)), c.lda)
        lb = lt.matrix_layout_create(self.r32f, *((c.n, c.k) if c.transb else (c.k, c.n)), c.ldb)
        lc = lt.matrix_layout_create(self.r32f, c.m, c.n, c.ldc)
        pref = lt.matmul_preference_create()

        def set_pref(attr, value):
            v = np.array([value], dtype=lt.get_matmul_preference_attribute_dtype(attr))
            lt.matmul_preference_set_attribute(pref, attr, v.ctypes.data, v.nbytes)

        P = lt.MatmulPreferenceAttribute
        set_pref(P.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES)
        align_a, align_b, align_c = aligns
        for attr, value in ((P.MIN_ALIGNMENT_A_BYTES, align_a), (P.MIN_ALIGNMENT_B_BYTES, align_b),
                            (P.MIN_ALIGNMENT_C_BYTES, align_c), (P.MIN_ALIGNMENT_D_BYTES, align_c)):
            set_pref(attr, value)
        results = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
        count = np.zeros(1, dtype=np.int32)
        try:
            lt.matmul_algo_get_heuristic(self.lt_handle, desc, la, lb, lc, lc, pref, 1, results.ctypes.data,
                                         count.ctypes.data)
        except lt.cuBLASLtError as exc:
            # cuBLASLt answers "no algorithm" with CUBLAS_STATUS_NOT_SUPPORTED rather than a count of 0
            raise GemmError(f"gemm: cuBLASLt has no algorithm for the bias epilogue on {c} "
                            f"(cublasLtMatmulAlgoGetHeuristic: {exc})") from exc
        finally:
            lt.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise GemmError(f"gemm: cuBLASLt has no algorithm for the bias epilogue on {c}")
        algo = np.ascontiguousarray(results["algo"]["data_"][0])  # the 64-byte cublasLtMatmulAlgo_t
        return desc, la, lb, lc, algo


_CUDA: dict = {}
_LOCK = threading.Lock()


def _cuda() -> _CudaBlas:
    import cupy

    dev = cupy.cuda.Device().id
    blas = _CUDA.get(dev)
    if blas is None:
        with _LOCK:
            blas = _CUDA.get(dev)
            if blas is None:
                blas = _CUDA[dev] = _CudaBlas()
    return blas
