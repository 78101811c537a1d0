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
