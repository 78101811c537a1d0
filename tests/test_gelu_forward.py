"""gelu_forward: the large-|x| tails of tanh computed from the exponential (common.cuh's tanh_from_exp)."""

import numpy as np
import pytest

import llmcupy

OP = llmcupy.ops["gelu_forward"]


@pytest.mark.parametrize("version", [1, 2])
def test_tails_saturate(version, no_hazards):
    # e^(2u) overflows to inf for u > 44 (the quotient must become 0, tanh 1, not NaN) and
    # underflows to 0 for very negative u (tanh -1): GELU(x) -> x and -> 0
    x = np.array([-100.0, -30.0, -12.0, -6.0, -0.5, 0.0, 0.5, 6.0, 12.0, 30.0, 100.0, 1e30], dtype=np.float32)
    got = OP(x, version=version)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, OP.reference(x), atol=1e-5, rtol=float(np.finfo(np.float32).eps))
    np.testing.assert_array_equal(got[x >= 12], x[x >= 12])
    np.testing.assert_allclose(got[x <= -12], 0.0, atol=1e-30)
