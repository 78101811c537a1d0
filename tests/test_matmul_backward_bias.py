"""matmul_backward_bias beyond the generic test: accumulation across calls, constraints, bad inputs."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError

OP = llmcupy.ops["matmul_backward_bias"]
VERSIONS = [n for n, v in sorted(OP.versions.items()) if v.available]


@pytest.mark.parametrize("version", VERSIONS)
def test_two_calls_accumulate(version):
    a = OP.make_inputs(np.random.default_rng(2), B=2, T=21, OC=64)
    dbias = np.zeros(64, np.float32)
    OP(dbias, a["dout"], version=version, block_size=64)
    out = OP(dbias, a["dout"], version=version, block_size=1024)
    assert out is dbias
    want = 2 * a["dout"].reshape(-1, 64).astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(dbias, want, atol=1e-4)


def test_no_version_6():
    with pytest.raises(OpError, match="no version 6"):
        OP.version(6)


@pytest.mark.parametrize("version, oc, message", [
    (4, 48, "multiple of 32"),
    (7, 30, "multiple of 4"),
    (8, 30, "multiple of 4"),
    (9, 30, "multiple of 4"),
])
def test_constraints(version, oc, message):
    a = OP.make_inputs(np.random.default_rng(0), B=1, T=3, OC=oc)
    with pytest.raises(OpError, match=message):
        OP(a["dbias"], a["dout"], version=version)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(dbias=a["dbias"][:-1].copy()), "dbias must have shape"),
    (lambda a: a.update(dbias=None), "input 'dbias' is None; it needs a value"),   # named before validation
    (lambda a: a.update(dout=a["dout"].astype(np.float64)), "float32"),
])
def test_bad_inputs_are_refused(change, message):
    a = OP.make_inputs(np.random.default_rng(0), B=1, T=3, OC=8)
    change(a)
    with pytest.raises(OpError, match=message):
        OP(a["dbias"], a["dout"], version=1)
