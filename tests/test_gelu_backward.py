"""gelu_backward: in-place use (as the trainer does it) and the large-|x| tails."""

import numpy as np
import pytest

import llmcupy

OP = llmcupy.ops["gelu_backward"]


@pytest.mark.parametrize("version", [1, 2])
def test_in_place_on_dout(version, no_hazards):
    a = OP.make_inputs(np.random.default_rng(5), B=2, T=3, C=20)
    want = OP.reference(a["inp"], a["dout"])
    g = a["dout"].copy()
    out = OP.run(version, {"inp": a["inp"], "dout": g, "dinp": g}, 64)["dinp"]
    assert out is g
    np.testing.assert_allclose(g, want, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("version", [1, 2])
def test_tails_are_finite_and_saturate(version, no_hazards):
    # |u| up to ~1e6: coshf overflows to inf and the sech^2 term must become 0, not NaN
    x = np.array([-100.0, -30.0, -12.0, -6.0, 6.0, 12.0, 30.0, 100.0], dtype=np.float32)
    g = np.ones_like(x)
    got = OP(x, g, version=version)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, OP.reference(x, g), atol=1e-5, rtol=1e-6)
    np.testing.assert_allclose(got[x > 10], 1.0, atol=1e-6)
    np.testing.assert_allclose(got[x < -10], 0.0, atol=1e-6)
