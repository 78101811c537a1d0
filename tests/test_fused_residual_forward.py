"""fused_residual_forward: preallocated outputs, 2-D inputs, v6's persistent grid, bad shapes."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError, check_outputs

OP = llmcupy.ops["fused_residual_forward"]


def test_preallocated_outputs_and_2d_rows(no_hazards):
    a = OP.make_inputs(np.random.default_rng(7), B=1, T=9, C=24)
    a["residual"] = a["residual"].reshape(9, 24)
    a["inp"] = a["inp"].reshape(9, 24)
    ref = OP.reference_fn(**a)
    outs = {"residual_out": np.empty((9, 24), np.float32), "normed": np.empty((9, 24), np.float32),
            "mean": np.empty(9, np.float32), "rstd": np.empty(9, np.float32)}
    got = OP.run(6, {**a, **outs}, 128)
    for k in outs:
        assert got[k] is outs[k]
    assert all(r["ok"] for r in check_outputs(OP, ref, got))


@pytest.mark.parametrize("block_size", [32, 256, 1024])
def test_v6_grid_stride_over_many_tokens(block_size, no_hazards):
    # the emulator pretends 512 resident threads: several token groups per block, a ragged last one
    a = OP.make_inputs(np.random.default_rng(8), B=5, T=13, C=8)
    ref = OP.reference_fn(**a)
    got = OP.run(6, {k: v.copy() for k, v in a.items()}, block_size)
    assert all(r["ok"] for r in check_outputs(OP, ref, got))


def test_bad_shapes_are_refused():
    a = OP.make_inputs(np.random.default_rng(9), B=1, T=2, C=8)
    with pytest.raises(OpError, match="weight and bias"):
        OP(a["residual"], a["inp"], a["weight"][:4].copy(), a["bias"])
    with pytest.raises(OpError, match="inp must have residual's shape"):
        OP(a["residual"], a["inp"][:, :1].copy(), a["weight"], a["bias"])
    with pytest.raises(OpError, match="multiple of 4"):
        b = OP.make_inputs(np.random.default_rng(9), B=1, T=2, C=6)
        OP(b["residual"], b["inp"], b["weight"], b["bias"], version=5)
