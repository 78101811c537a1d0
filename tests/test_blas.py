"""llmcupy.runtime.blas: the GEMM entry point of every op (cuBLAS on a GPU, the same call in NumPy)."""

import numpy as np
import pytest

from llmcupy.runtime import backend, blas

# FP32 SGEMM against a float64 reference: operands uniform in [-1, 1], K <= 70, so the accumulated
# rounding is below K * eps * max|partial sum| ~ 70 * 1.2e-7 * 5 = 4e-5; 1e-4 leaves room for
# alpha/beta scaling without hiding a wrong element (those are O(1) off).
ATOL = 1e-4


@pytest.fixture
def cuda():
    """The cuda backend for one test, the emulator again after it (the suite's default)."""
    backend.set_backend("cuda")
    yield
    backend.set_backend("sim")


def _ref(a, b, out, trans_a, trans_b, alpha, beta, bias):
    A = np.swapaxes(a, -1, -2) if trans_a else a
    B = np.swapaxes(b, -1, -2) if trans_b else b
    r = alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * out.astype(np.float64)
    if bias is not None:
        r = r + bias
    return r


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_matches_reference(batch, trans_a, trans_b):
    rng = np.random.default_rng(1)
    M, N, K = 7, 13, 70
    u = lambda *s: rng.uniform(-1, 1, size=s).astype(np.float32)  # noqa: E731
    a = u(*batch, *((K, M) if trans_a else (M, K)))
    b = u(*batch, *((N, K) if trans_b else (K, N)))
    for alpha, beta in ((1.0, 0.0), (0.5, 1.0), (1.0, 1.0)):
        out = u(*batch, M, N)
        expected = _ref(a, b, out, trans_a, trans_b, alpha, beta, None)
        blas.gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        np.testing.assert_allclose(out, expected, atol=ATOL, rtol=0)


def test_row_stride_larger_than_the_row_and_slices_of_a_stack():
    # a column slice keeps unit stride along the row with a larger leading dimension, and
    # qkvr[1] of a (3, B, NH, T, HS) stack is a batch with its own offset: both are read in place
    rng = np.random.default_rng(2)
    wide = rng.uniform(-1, 1, size=(9, 40)).astype(np.float32)
    a = wide[:, 3:20]                       # 9 x 17, ld 40
    b = rng.uniform(-1, 1, size=(11, 17)).astype(np.float32)
    out_wide = np.zeros((9, 30), np.float32)
    out = out_wide[:, 5:16]                 # 9 x 11, ld 30
    blas.gemm(a, b, out, trans_b=True)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.T.astype(np.float64), atol=ATOL, rtol=0)
    assert not out_wide[:, :5].any() and not out_wide[:, 16:].any()  # nothing written outside the view
    qkvr = rng.uniform(-1, 1, size=(3, 2, 3, 8, 4)).astype(np.float32)
    preatt = np.empty((2, 3, 8, 8), np.float32)
    blas.gemm(qkvr[0], qkvr[1], preatt, trans_b=True)
    np.testing.assert_allclose(preatt, np.einsum("bhtd,bhsd->bhts", qkvr[0].astype(np.float64), qkvr[1]),
                               atol=ATOL, rtol=0)


def test_bias_epilogue():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(10, 24)).astype(np.float32)
    w = rng.uniform(-1, 1, size=(6, 24)).astype(np.float32)
    bias = rng.uniform(-1, 1, size=6).astype(np.float32)
    out = np.full((10, 6), np.nan, np.float32)  # beta = 0: the old contents are never read
    blas.gemm(x, w, out, trans_b=True, bias=bias)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T + bias, atol=ATOL, rtol=0)


def test_call_description_is_column_major_transpose():
    # out (M x N) = a (M x K) @ b^T: cuBLAS gets A = b (transposed), B = a, m = N, n = M
    a = np.zeros((5, 3), np.float32)
    b = np.zeros((4, 3), np.float32)
    c = blas.describe(a, b, np.zeros((5, 4), np.float32), trans_b=True)
    assert (c.transa, c.transb, c.m, c.n, c.k, c.lda, c.ldb, c.ldc, c.batch) == (True, False, 4, 5, 3, 3, 3, 4, 1)
    q = np.zeros((2, 3, 8, 4), np.float32)
    c = blas.describe(q, q, np.zeros((2, 3, 8, 8), np.float32), trans_b=True)
    assert (c.batch, c.stride_a, c.stride_b, c.stride_c) == (6, 32, 32, 64)


@pytest.mark.parametrize("case, message", [
    ("swapaxes", "unit stride along its last axis"),
    ("shape", r"op\(a\) is 5 x 3"),
    ("dtype", "must be float32"),
    ("batch", "batch dimensions differ"),
    ("bias_beta", "beta = 0"),
])
def test_bad_operands_are_refused(case, message):
    a = np.zeros((5, 3), np.float32)
    b = np.zeros((3, 4), np.float32)
    out = np.zeros((5, 4), np.float32)
    kwargs = {}
    if case == "swapaxes":
        b = np.zeros((4, 3), np.float32).T  # a transposed view: must be passed with trans_b instead
    elif case == "shape":
        b = np.zeros((4, 4), np.float32)
    elif case == "dtype":
        out = out.astype(np.float64)
    elif case == "batch":
        a = np.zeros((2, 5, 3), np.float32)
    elif case == "bias_beta":
        kwargs = {"bias": np.zeros(4, np.float32), "beta": 1.0}
    with pytest.raises(blas.GemmError, match=message):
        blas.gemm(a, b, out, **kwargs)


def test_tf32_is_scoped():
    assert not blas.tf32_enabled()
    with blas.tf32(True) as used:
        # never in the emulator (no tensor cores); on a GPU only from sm_80
        expected = backend.get_backend() == "cuda" and (backend.compute_capability() or 0) >= 80
        assert used is expected and blas.tf32_enabled() is expected
        with blas.tf32(False):
            assert not blas.tf32_enabled()
        assert blas.tf32_enabled() is expected
    assert not blas.tf32_enabled()


@pytest.mark.gpu
def test_gemm_on_gpu_matches_numpy(cuda):
    import cupy

    rng = np.random.default_rng(4)
    for trans_a, trans_b, batch in ((False, True, ()), (True, False, (4,)), (False, False, (2, 3))):
        M, N, K = 33, 65, 100
        a = rng.uniform(-1, 1, size=(*batch, *((K, M) if trans_a else (M, K)))).astype(np.float32)
        b = rng.uniform(-1, 1, size=(*batch, *((N, K) if trans_b else (K, N)))).astype(np.float32)
        out = rng.uniform(-1, 1, size=(*batch, M, N)).astype(np.float32)
        expected = _ref(a, b, out, trans_a, trans_b, 1.0, 1.0, None)
        d_out = cupy.asarray(out)
        blas.gemm(cupy.asarray(a), cupy.asarray(b), d_out, trans_a=trans_a, trans_b=trans_b, beta=1.0)
        np.testing.assert_allclose(d_out.get(), expected, atol=1e-3, rtol=0)
    x = cupy.asarray(rng.uniform(-1, 1, size=(128, 64)).astype(np.float32))
    w = cupy.asarray(rng.uniform(-1, 1, size=(96, 64)).astype(np.float32))
    bias = cupy.asarray(rng.uniform(-1, 1, size=96).astype(np.float32))
    out = cupy.empty((128, 96), cupy.float32)
    blas.gemm(x, w, out, trans_b=True, bias=bias)
    np.testing.assert_allclose(out.get(), x.get().astype(np.float64) @ w.get().T + bias.get(), atol=1e-3, rtol=0)


@pytest.mark.gpu
def test_gemm_is_capturable_in_thread_local_mode(cuda):
    # CuPy's own cuBLAS wrappers refuse to run during capture; ours must record into the graph
    import cupy

    rng = np.random.default_rng(5)
    a = cupy.asarray(rng.uniform(-1, 1, size=(4, 32, 16)).astype(np.float32))
    b = cupy.asarray(rng.uniform(-1, 1, size=(4, 32, 16)).astype(np.float32))
    out = cupy.zeros((4, 32, 32), cupy.float32)
    x = cupy.asarray(rng.uniform(-1, 1, size=(32, 16)).astype(np.float32))
    bias = cupy.asarray(rng.uniform(-1, 1, size=32).astype(np.float32))
    y = cupy.zeros((32, 32), cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        blas.gemm(a, b, out, trans_b=True)  # warm-up: handle, workspace and Lt plan exist before capture
        blas.gemm(x, x, y, trans_b=True, bias=bias)
        blas.bind_stream(stream)
        out.fill(0)
        y.fill(0)
        stream.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        blas.gemm(a, b, out, trans_b=True)
        blas.gemm(x, x, y, trans_b=True, bias=bias)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_allclose(out.get(), np.einsum("bik,bjk->bij", a.get().astype(np.float64), b.get()), atol=1e-3)
    np.testing.assert_allclose(y.get(), x.get().astype(np.float64) @ x.get().T + bias.get(), atol=1e-3)


@pytest.mark.gpu
def test_tf32_reaches_the_batched_gemms_on_gpu(cuda):
    # CuPy's batched matmul ignored the TF32 setting; ours passes the compute type to every call.
    # TF32 keeps 10 mantissa bits: a length-256 dot product of values in [-1, 1] is off by ~1e-3
    # relative, 100x FP32's rounding, so the two settings give measurably different errors.
    import cupy

    if (backend.compute_capability() or 0) < 80:
        pytest.skip("TF32 needs compute capability 8.0 or newer")
    rng = np.random.default_rng(6)
    a = rng.uniform(-1, 1, size=(8, 64, 256)).astype(np.float32)
    b = rng.uniform(-1, 1, size=(8, 64, 256)).astype(np.float32)
    exact = np.einsum("bik,bjk->bij", a.astype(np.float64), b.astype(np.float64))
    d_a, d_b = cupy.asarray(a), cupy.asarray(b)
    errors = {}
    for use in (False, True):
        out = cupy.empty((8, 64, 64), cupy.float32)
        with blas.tf32(use):
            blas.gemm(d_a, d_b, out, trans_b=True)
        errors[use] = float(np.abs(out.get() - exact).max())
    assert errors[True] > 10 * errors[False], errors


# -- the cuBLAS / cuBLASLt calls against nvmath-python's real signatures (no GPU) -----------------
#
# _CudaBlas runs with a stand-in for CuPy and with nvmath's binding modules wrapped: every C call
# (a function documented "See `cublas...`") is checked against the parameter list the installed
# nvmath-python states for it (count, and every argument an int as its C parameters need), then
# recorded by parameter name, so the assertions below say which value reaches which parameter.


def _c_params(fn) -> list[str]:
    """Parameter names of an nvmath binding from its signature line, e.g. ``gemm_ex(intptr_t handle,
    int transa, ...)``."""
    import re

    first = fn.__doc__.strip().splitlines()[0]
    m = re.match(r"\w+\((.*)\)", first)
    assert m, f"unexpected nvmath signature line {first!r}"
    return [p.split()[-1] for p in m.group(1).split(",") if p.strip()]


class _CheckedBindings:
    """One nvmath binding module whose C calls are checked and recorded, everything else real."""

    def __init__(self, real, calls: list, results: dict):
        self._real, self._calls, self._results = real, calls, results

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if isinstance(attr, type) or not callable(attr) or "See `cublas" not in (attr.__doc__ or ""):
            return attr  # enums, dtypes and the attribute-dtype helpers: nvmath's own
        params = _c_params(attr)

        def call(*args):
            assert len(args) == len(params), f"{name}: {len(args)} arguments for {params}"
            for p, v in zip(params, args):
                assert isinstance(v, int), f"{name}: parameter {p} got {type(v).__name__} {v!r}"
            bound = dict(zip(params, (int(v) for v in args)))
            self._calls.append((name, bound))
            result = self._results.get(name, 0)
            return result(bound) if callable(result) else result

        return call


def _read(address: int, dtype):
    import ctypes

    dtype = np.dtype(dtype)
    return np.frombuffer((ctypes.c_char * dtype.itemsize).from_address(address), dtype=dtype)[0]


class _DeviceArray:
    """What _CudaBlas reads of a CuPy array: ``.data.ptr``."""

    def __init__(self, ptr: int):
        self.data = type("MemoryPointer", (), {"ptr": ptr})()


@pytest.fixture
def checked_blas(monkeypatch):
    import ctypes
    import sys
    import types

    nvmath = pytest.importorskip("nvmath")
    from nvmath import bindings
    from nvmath.bindings import cublas, cublasLt

    calls: list = []
    algo_bytes = np.arange(64, dtype=np.uint8)

    def heuristic(b):  # one algorithm found: its 64 bytes, and the count
        results = np.zeros(1, dtype=cublasLt.matmul_heuristic_result_dtype)
        results["algo"]["data_"][0] = algo_bytes.view(np.uint64)
        ctypes.memmove(b["heuristic_results_array"], results.ctypes.data, results.nbytes)
        ctypes.c_int32.from_address(b["return_algo_count"]).value = 1
        return None

    monkeypatch.setattr(bindings, "cublas", _CheckedBindings(cublas, calls, {"create": 0x11}))
    def read_desc_value(b):  # cuBLASLt copies the value at the call: read it now, as it does
        b["value"] = int(_read(b["buf"], cublasLt.get_matmul_desc_attribute_dtype(b["attr"])))
        return None

    def read_pref_value(b):
        b["value"] = int(_read(b["buf"], cublasLt.get_matmul_preference_attribute_dtype(b["attr"])))
        return None

    monkeypatch.setattr(bindings, "cublasLt", _CheckedBindings(cublasLt, calls, {
        "matmul_desc_set_attribute": read_desc_value, "matmul_preference_set_attribute": read_pref_value,
        "create": 0x22, "matmul_desc_create": 0x33, "matmul_preference_create": 0x44,
        "matrix_layout_create": lambda b: 0x100 + b["rows"] * 1000 + b["cols"],
        "matmul_algo_get_heuristic": heuristic}))
    stream = types.SimpleNamespace(ptr=0x5000)
    fake_cupy = types.SimpleNamespace(
        uint8=np.uint8, empty=lambda n, dtype=None: _DeviceArray(0x9000),
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0), get_current_stream=lambda: stream,
                                   runtime=types.SimpleNamespace(streamIsCapturing=lambda ptr: False)))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    return blas._CudaBlas(), calls, cublas, cublasLt, int(nvmath.CudaDataType.CUDA_R_32F), algo_bytes


def _calls_named(calls, name):
    return [b for n, b in calls if n == name]


def test_cublas_calls_match_nvmaths_signatures(checked_blas, monkeypatch):
    cb, calls, cublas, _, r32f, _ = checked_blas
    a, b = np.zeros((5, 7), np.float32), np.zeros((3, 7), np.float32)
    call = blas.describe(a, b, np.zeros((5, 3), np.float32), trans_b=True)
    cb.run(call, _DeviceArray(0xA000), _DeviceArray(0xB000), _DeviceArray(0xC000), 2.0, 0.5, None)
    # the stream first, then our workspace again (cublasSetStream resets it), then the GEMM
    assert [n for n, _ in calls] == ["create", "create", "set_stream", "set_workspace", "gemm_ex"]
    (s,), (w,) = _calls_named(calls, "set_stream"), _calls_named(calls, "set_workspace")
    assert s == {"handle": 0x11, "stream_id": 0x5000}
    assert w == {"handle": 0x11, "workspace": 0x9000, "workspace_size_in_bytes": blas.WORKSPACE_BYTES}
    (g,) = _calls_named(calls, "gemm_ex")
    # column-major: cuBLAS's A is our b (transposed), its B our a; m = N, n = M
    assert (g["transa"], g["transb"]) == (cublas.Operation.T, cublas.Operation.N)
    assert (g["m"], g["n"], g["k"], g["lda"], g["ldb"], g["ldc"]) == (3, 5, 7, 7, 7, 3)
    assert (g["a"], g["b"], g["c"]) == (0xB000, 0xA000, 0xC000)
    assert g["atype"] == g["btype"] == g["ctype"] == r32f
    assert g["compute_type"] == cublas.ComputeType.COMPUTE_32F and g["algo"] == cublas.GemmAlgo.DEFAULT
    assert (_read(g["alpha"], np.float32), _read(g["beta"], np.float32)) == (2.0, 0.5)  # host pointer mode

    calls.clear()
    monkeypatch.setattr(blas, "_TF32", [True])
    a3, b3, o3 = np.zeros((4, 6, 8), np.float32), np.zeros((4, 8, 5), np.float32), np.zeros((4, 6, 5), np.float32)
    call = blas.describe(a3, b3, o3)
    cb.run(call, _DeviceArray(0xA000), _DeviceArray(0xB000), _DeviceArray(0xC000), 1.0, 0.0, None)
    assert [n for n, _ in calls] == ["gemm_strided_batched_ex"]  # the stream is bound already
    (g,) = _calls_named(calls, "gemm_strided_batched_ex")
    assert (g["m"], g["n"], g["k"], g["batch_count"]) == (5, 6, 8, 4)
    assert (g["stride_a"], g["stride_b"], g["stride_c"]) == (40, 48, 30)
    assert g["compute_type"] == cublas.ComputeType.COMPUTE_32F_FAST_TF32


def test_cublaslt_bias_epilogue_calls_match_nvmaths_signatures(checked_blas):
    cb, calls, cublas, lt, r32f, algo_bytes = checked_blas
    x, w = np.zeros((6, 4), np.float32), np.zeros((9, 4), np.float32)
    call = blas.describe(x, w, np.zeros((6, 9), np.float32), trans_b=True)
    for bias_ptr in (0xD000, 0xE000):  # the plan is made once; the bias pointer is set per call
        cb.run(call, _DeviceArray(0xA000), _DeviceArray(0xB000), _DeviceArray(0xC000), 1.0, 0.0,
               _DeviceArray(bias_ptr))
    assert len(_calls_named(calls, "matmul_desc_create")) == 1
    (d,) = _calls_named(calls, "matmul_desc_create")
    assert d == {"compute_type": cublas.ComputeType.COMPUTE_32F, "scale_type": r32f}
    attrs = {}
    for b in _calls_named(calls, "matmul_desc_set_attribute"):
        dtype = lt.get_matmul_desc_attribute_dtype(b["attr"])
        assert b["size_in_bytes"] == np.dtype(dtype).itemsize and b["matmul_desc"] == 0x33
        attrs.setdefault(lt.MatmulDescAttribute(b["attr"]), []).append(b["value"])
    assert attrs[lt.MatmulDescAttribute.TRANSA] == [cublas.Operation.T]
    assert attrs[lt.MatmulDescAttribute.TRANSB] == [cublas.Operation.N]
    assert attrs[lt.MatmulDescAttribute.EPILOGUE] == [lt.Epilogue.BIAS]
    assert attrs[lt.MatmulDescAttribute.BIAS_POINTER] == [0xD000, 0xE000]
    layouts = _calls_named(calls, "matrix_layout_create")
    # A = w stored 9 x 4 row-major = column-major 4 x 9 (k x m, transposed), B = x (k x n), C m x n
    assert [(b["type"], b["rows"], b["cols"], b["ld"]) for b in layouts] == \
        [(r32f, 4, 9, 4), (r32f, 4, 6, 4), (r32f, 9, 6, 9)]
    P = lt.MatmulPreferenceAttribute
    set_prefs = _calls_named(calls, "matmul_preference_set_attribute")
    assert {b["pref"] for b in set_prefs} == {0x44}
    assert {P(b["attr"]): b["value"] for b in set_prefs} == {
        P.MAX_WORKSPACE_BYTES: blas.WORKSPACE_BYTES, P.MIN_ALIGNMENT_A_BYTES: 256, P.MIN_ALIGNMENT_B_BYTES: 256,
        P.MIN_ALIGNMENT_C_BYTES: 256, P.MIN_ALIGNMENT_D_BYTES: 256}  # fake addresses 0x...000: 256-aligned
    (h,) = _calls_named(calls, "matmul_algo_get_heuristic")
    assert (h["light_handle"], h["operation_desc"], h["requested_algo_count"]) == (0x22, 0x33, 1)
    la, lb, lc = (0x100 + 4 * 1000 + 9, 0x100 + 4 * 1000 + 6, 0x100 + 9 * 1000 + 6)
    assert (h["adesc"], h["bdesc"], h["cdesc"], h["ddesc"]) == (la, lb, lc, lc)
    m = _calls_named(calls, "matmul")[-1]
    assert (m["light_handle"], m["compute_desc"], m["a"], m["b"], m["c"], m["d"]) == \
        (0x22, 0x33, 0xB000, 0xA000, 0xC000, 0xC000)
    assert (m["adesc"], m["bdesc"], m["cdesc"], m["ddesc"]) == (la, lb, lc, lc)
    assert (_read(m["alpha"], np.float32), _read(m["beta"], np.float32)) == (1.0, 0.0)
    assert (m["workspace"], m["workspace_size_in_bytes"], m["stream"]) == (0x9000, blas.WORKSPACE_BYTES, 0x5000)
    import ctypes

    assert bytes((ctypes.c_char * 64).from_address(m["algo"])) == algo_bytes.tobytes()  # the heuristic's pick


def test_cublaslt_without_an_algorithm_is_a_gemm_error_naming_the_shapes(checked_blas, monkeypatch):
    # cuBLASLt reports "no algorithm" as CUBLAS_STATUS_NOT_SUPPORTED from the heuristic query itself
    # (nvmath raises it), not as a count of 0: the user gets a GemmError naming the call and shapes
    cb, calls, _, lt, _, _ = checked_blas
    not_supported = lt.cuBLASLtError.__new__(lt.cuBLASLtError)  # its __init__ needs the library
    not_supported.args = ("CUBLAS_STATUS_NOT_SUPPORTED (15)",)

    def no_algorithm(b):
        raise not_supported

    from nvmath import bindings

    bindings.cublasLt._results["matmul_algo_get_heuristic"] = no_algorithm  # the fixture's checked module
    x, w = np.zeros((6, 4), np.float32), np.zeros((9, 4), np.float32)
    call = blas.describe(x, w, np.zeros((6, 9), np.float32), trans_b=True)
    with pytest.raises(blas.GemmError, match=r"no algorithm for the bias epilogue on .*"
                                             r"cublasLtMatmulAlgoGetHeuristic: CUBLAS_STATUS_NOT_SUPPORTED"):
        cb.run(call, _DeviceArray(0xA000), _DeviceArray(0xB000), _DeviceArray(0xC000), 1.0, 0.0, _DeviceArray(0xD000))
    assert len(_calls_named(calls, "matmul_preference_destroy")) == 1  # nothing leaked on the way out


def test_cublaslt_plan_follows_the_operands_alignment(checked_blas):
    # cuBLASLt's heuristic assumes 256-byte aligned matrices unless told: a less aligned operand (a
    # row slice, say) gets its own plan, made with the alignment it has
    cb, calls, _, lt, _, _ = checked_blas
    x, w = np.zeros((6, 4), np.float32), np.zeros((9, 4), np.float32)
    call = blas.describe(x, w, np.zeros((6, 9), np.float32), trans_b=True)
    cb.run(call, _DeviceArray(0xA000), _DeviceArray(0xB000), _DeviceArray(0xC000), 1.0, 0.0, _DeviceArray(0xD000))
    cb.run(call, _DeviceArray(0xA010), _DeviceArray(0xB000), _DeviceArray(0xC004), 1.0, 0.0, _DeviceArray(0xD000))
    cb.run(call, _DeviceArray(0xA010), _DeviceArray(0xB000), _DeviceArray(0xC004), 1.0, 0.0, _DeviceArray(0xD000))
    assert len(_calls_named(calls, "matmul_algo_get_heuristic")) == 2  # one plan per alignment, then reused
    P = lt.MatmulPreferenceAttribute
    last = {P(b["attr"]): b["value"] for b in _calls_named(calls, "matmul_preference_set_attribute")[-5:]}
    # cuBLAS's A is our w (0xB000), its B our x (0xA010: 16-byte aligned), C and D our out (0xC004: 4)
    assert (last[P.MIN_ALIGNMENT_A_BYTES], last[P.MIN_ALIGNMENT_B_BYTES], last[P.MIN_ALIGNMENT_C_BYTES],
            last[P.MIN_ALIGNMENT_D_BYTES]) == (256, 16, 4, 4)


def test_bias_epilogue_refuses_a_bias_that_is_not_16_byte_aligned():
    # cuBLASLt's epilogue loads the bias 16 bytes at a time and its heuristic cannot be told less
    # (llm.c asserts the same): a row of a packed buffer one float off would fault or be refused on
    # the GPU, so both backends refuse it up front, naming the alignment
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=(10, 24)).astype(np.float32)
    w = rng.uniform(-1, 1, size=(6, 24)).astype(np.float32)
    packed = np.zeros(12, np.float32)
    start = (-packed.ctypes.data % 16) // 4          # the first 16-byte aligned float of the buffer
    out = np.empty((10, 6), np.float32)
    with pytest.raises(blas.GemmError, match="needs the bias 16-byte aligned"):
        blas.gemm(x, w, out, trans_b=True, bias=packed[start + 1:start + 7])
    bias = packed[start:start + 6]
    bias[:] = rng.uniform(-1, 1, size=6)
    blas.gemm(x, w, out, trans_b=True, bias=bias)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T + bias, atol=ATOL, rtol=0)


def test_matmul_forward_v3_lists_a_misaligned_bias_as_unsupported():
    from llmcupy import ops
    from llmcupy.ops._op import OpError

    rng = np.random.default_rng(8)
    inp = rng.uniform(-1, 1, size=(2, 3, 8)).astype(np.float32)
    weight = rng.uniform(-1, 1, size=(5, 8)).astype(np.float32)
    packed = np.zeros(12, np.float32)
    start = (-packed.ctypes.data % 16) // 4
    with pytest.raises(OpError, match="bias must be 16-byte aligned for cuBLASLt's bias epilogue"):
        ops["matmul_forward"](inp, weight, packed[start + 1:start + 6], version=3)
    out = ops["matmul_forward"](inp, weight, packed[start:start + 5], version=3)
    np.testing.assert_allclose(out, inp.astype(np.float64) @ weight.T, atol=ATOL, rtol=0)


@pytest.mark.gpu
def test_bias_epilogue_on_gpu_with_a_16_byte_aligned_row_of_a_stack(cuda):
    # the model's biases are rows of a packed (L, OC) stack: 16-byte aligned (C % 4 == 0) but not
    # 256, the alignment cuBLASLt assumes unless told; the epilogue must run on them, and the
    # operands one float off 256 (a row slice of inp) get their own plan
    import cupy

    rng = np.random.default_rng(9)
    x = cupy.asarray(rng.uniform(-1, 1, size=(65, 36)).astype(np.float32))
    w = cupy.asarray(rng.uniform(-1, 1, size=(36, 36)).astype(np.float32))
    stack = cupy.asarray(rng.uniform(-1, 1, size=(3, 36)).astype(np.float32))
    bias = stack[1]
    assert bias.data.ptr % 16 == 0 and bias.data.ptr % 256 != 0
    out = cupy.empty((64, 36), cupy.float32)
    blas.gemm(x[1:], w, out, trans_b=True, bias=bias)
    expected = x.get()[1:].astype(np.float64) @ w.get().T + bias.get()
    np.testing.assert_allclose(out.get(), expected, atol=1e-3, rtol=0)


def test_an_overflowing_gemm_gives_inf_without_numpy_warnings():
    # a diverging run (-l 1e30) printed NumPy's "overflow encountered in matmul" and "invalid value"
    # warnings before the trainer's one-line non-finite-loss stop; cuBLAS says nothing, neither do we
    import warnings

    a = np.full((2, 3), 3e38, np.float32)
    b = np.full((3, 2), 3e38, np.float32)
    b[0, 0] = np.nan
    out = np.empty((2, 2), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        blas.gemm(a, b, out)
        assert np.isinf(out[:, 1]).all() and np.isnan(out[:, 0]).all()
        acc = np.full((2, 2), -np.inf, np.float32)
        blas.gemm(a, b, acc, beta=1.0)      # -inf + inf accumulated: NaN, silently
    assert np.isnan(acc).all()
