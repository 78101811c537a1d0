"""matmul_gelu_forward (the MLP up-projection with GELU in the GEMM epilogue) beyond the generic test:
the fused and unfused versions agree bit for bit, both outputs are written, bad inputs are refused."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError, check_outputs

OP = llmcupy.ops["matmul_gelu_forward"]


def _inputs(B=1, T=70, C=24, OC=140, has_bias=1, seed=9):
    return OP.make_inputs(np.random.default_rng(seed), B=B, T=T, C=C, OC=OC, has_bias=has_bias)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_fused_equals_unfused_exactly(order, no_hazards):
    # same GEMM, same GELU formula: the fusion changes where GELU runs, not what it computes
    from llmcupy import sim

    a = _inputs()
    with sim.settings(order=order):
        pre1, out1 = OP(a["inp"], a["weight"], a["bias"], version=1)
        pre2, out2 = OP(a["inp"], a["weight"], a["bias"], version=2)
    np.testing.assert_array_equal(pre1, pre2)
    np.testing.assert_array_equal(out1, out2)
    ref = OP.reference_fn(**a)
    for r in check_outputs(OP, ref, {"pre": pre2, "out": out2}):
        assert r["ok"], r


def test_fused_matches_matmul_forward_v5_and_gelu_forward():
    a = _inputs(T=33, C=20, OC=36)
    pre, out = OP(a["inp"], a["weight"], a["bias"], version=2)
    np.testing.assert_array_equal(pre, llmcupy.ops["matmul_forward"](a["inp"], a["weight"], a["bias"], version=5))
    np.testing.assert_array_equal(out, llmcupy.ops["gelu_forward"](pre, version=1))


def test_writes_both_dirty_buffers():
    a = _inputs(T=5, C=8, OC=12)
    pre = np.full((1, 5, 12), np.nan, np.float32)
    out = np.full((1, 5, 12), np.nan, np.float32)
    OP.run(2, dict(a), out={"pre": pre, "out": out})
    for r in check_outputs(OP, OP.reference_fn(**a), {"pre": pre, "out": out}):
        assert r["ok"], r


def test_bad_inputs_are_refused():
    a = _inputs(T=4, C=8, OC=8)
    with pytest.raises(OpError, match="columns"):
        OP(a["inp"], a["weight"][:, :-1].copy(), a["bias"], version=2)
