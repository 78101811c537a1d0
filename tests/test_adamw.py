"""adamw beyond the generic test: several steps from zero moments, weight decay, scalar checks."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError, compare

OP = llmcupy.ops["adamw"]


@pytest.mark.parametrize("version", [1, 2])
def test_steps_from_zero_moments_with_weight_decay(version, no_hazards):
    rng = np.random.default_rng(0)
    n = 3000
    params = rng.uniform(-1, 1, n).astype(np.float32)
    m = np.zeros(n, np.float32)
    v = np.zeros(n, np.float32)
    ref_p, ref_m, ref_v = params.copy(), m.copy(), v.copy()
    for t in (1, 2, 3):
        grads = rng.uniform(-1, 1, n).astype(np.float32)
        # the trainer's scalars, with a non-zero decay (its default is 0.0) and Python numbers
        out = OP(params, grads, m, v, 3e-4, 0.9, 0.999, 1e-8, 0.1, t, version=version)
        assert out[0] is params and out[1] is m and out[2] is v  # in place
        ref_p, ref_m, ref_v = OP.reference(ref_p, grads, ref_m, ref_v, 3e-4, 0.9, 0.999, 1e-8, 0.1, t)
    for name, ref, got in (("params", ref_p, params), ("m", ref_m, m), ("v", ref_v, v)):
        assert compare(name, ref, got, *OP.tolerance[name])["ok"]


def test_bias_corrections_are_fp32_powf():
    from llmcupy.ops.adamw import bias_corrections

    c1, c2 = bias_corrections(0.9, 0.999, 10)
    assert c1.dtype == np.float32 and c2.dtype == np.float32
    assert c1 == np.float32(1) - np.float32(0.9) ** np.float32(10)


def test_bad_inputs():
    a = OP.make_inputs(np.random.default_rng(0), P=10)
    args = lambda **kw: {**a, **kw}  # noqa: E731
    with pytest.raises(OpError, match="t .*>= 1"):
        OP(**args(t=0))
    with pytest.raises(OpError, match="shape of params"):
        OP(**args(m=np.zeros(9, np.float32)))
    with pytest.raises(OpError, match="float32"):
        OP(**args(grads=np.zeros(10, np.float64)))
    with pytest.raises(OpError, match="beta1"):
        OP(**args(beta1=1.0))
    with pytest.raises(OpError, match="lr must be finite"):
        OP(**args(lr=float("nan")))
