"""crossentropy_forward / crossentropy_softmax_backward: target validation and accumulation."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError, compare

FWD = llmcupy.ops["crossentropy_forward"]
BWD = llmcupy.ops["crossentropy_softmax_backward"]


def test_forward_bad_targets():
    a = FWD.make_inputs(np.random.default_rng(0), B=2, T=3, V=11)
    with pytest.raises(OpError, match="int32"):
        FWD(a["probs"], a["targets"].astype(np.int64))
    bad = a["targets"].copy()
    bad[0, 1] = 11
    with pytest.raises(OpError, match=r"\[0, V=11\).*11 at flat index 1"):
        FWD(a["probs"], bad)
    with pytest.raises(OpError, match="targets must have shape"):
        FWD(a["probs"], a["targets"][0])


def test_forward_accepts_2d(no_hazards):
    a = FWD.make_inputs(np.random.default_rng(1), B=1, T=9, V=13)
    probs, targets = a["probs"][0], a["targets"][0]
    got = FWD(probs, targets)
    assert compare("losses", FWD.reference(probs, targets), got, *FWD.tolerance["losses"])["ok"]


def test_backward_accumulates_twice(no_hazards):
    a = BWD.make_inputs(np.random.default_rng(2), B=2, T=3, V=50)
    dlogits = a["dlogits"].copy()
    ref = a["dlogits"]
    for _ in range(2):
        out = BWD(a["probs"], a["targets"], a["dlosses"], dlogits)
        assert out is dlogits
        ref = BWD.reference(a["probs"], a["targets"], a["dlosses"], ref)
    assert compare("dlogits", ref, dlogits, *BWD.tolerance["dlogits"])["ok"]


def test_backward_bad_inputs():
    a = BWD.make_inputs(np.random.default_rng(0), B=2, T=3, V=11)
    bad = a["targets"].copy()
    bad[1, 0] = -3
    with pytest.raises(OpError, match="-3"):
        BWD(a["probs"], bad, a["dlosses"], a["dlogits"])
    with pytest.raises(OpError, match="dlosses must have shape"):
        BWD(a["probs"], a["targets"], a["dlosses"][:1], a["dlogits"])
    with pytest.raises(OpError, match="dlogits must have the shape"):
        BWD(a["probs"], a["targets"], a["dlosses"], a["dlogits"][:1])
