"""encoder_backward: accumulation semantics, determinism of version 2, token-id validation."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError

OP = llmcupy.ops["encoder_backward"]


def _inputs(B=2, T=5, C=12, V=4, maxT=None):
    return OP.make_inputs(np.random.default_rng(3), B=B, T=T, C=C, V=V, maxT=maxT)


def _sequential_fp32(a):
    """llm.c's CPU loop in fp32, token after token: what version 2 does in the same order."""
    dwte, dwpe = a["dwte"].copy(), a["dwpe"].copy()
    B, T, C = a["dout"].shape
    for b in range(B):
        for t in range(T):
            ix = a["tokens"][b, t]
            for c in range(C):
                dwte[ix, c] = np.float32(dwte[ix, c] + a["dout"][b, t, c])
                dwpe[t, c] = np.float32(dwpe[t, c] + a["dout"][b, t, c])
    return dwte, dwpe


def test_accumulates_in_place_and_returns_the_same_arrays(no_hazards):
    a = _inputs()
    dwte, dwpe = a["dwte"], a["dwpe"]
    ref = OP.reference(**a)
    got = OP(dwte, dwpe, a["dout"], a["tokens"], version=1)
    assert got[0] is dwte and got[1] is dwpe
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-6)


def test_version2_is_the_sequential_fp32_loop_bit_for_bit(no_hazards):
    a = _inputs(maxT=8)
    want_wte, want_wpe = _sequential_fp32(a)
    dwte, dwpe = OP(a["dwte"].copy(), a["dwpe"].copy(), a["dout"], a["tokens"], version=2, block_size=32)
    np.testing.assert_array_equal(dwte, want_wte)
    np.testing.assert_array_equal(dwpe, want_wpe)  # rows T..maxT-1 untouched


@pytest.mark.parametrize("version", [1, 2])
def test_zero_gradients_give_the_plain_sums(version, no_hazards):
    # V = 20 > B*T = 12 ids: some rows of wte are never used (with V = 6 every row was, and the
    # "unused rows stay zero" check looked at an empty selection)
    a = _inputs(B=3, T=4, C=8, V=20)
    unused = np.setdiff1d(np.arange(20), a["tokens"])
    assert unused.size, "the test needs unused rows"
    dwte = np.zeros_like(a["dwte"])
    dwpe = np.zeros_like(a["dwpe"])
    OP(dwte, dwpe, a["dout"], a["tokens"], version=version)
    np.testing.assert_allclose(dwpe, a["dout"].sum(axis=0), atol=1e-6)
    want = np.zeros(dwte.shape, np.float64)
    np.add.at(want, a["tokens"].reshape(-1), a["dout"].reshape(-1, 8).astype(np.float64))
    np.testing.assert_allclose(dwte, want, atol=1e-6)   # each used row: the sum of its tokens' rows
    assert not dwte[unused].any()                        # unused rows stay zero


def test_bad_tokens_are_refused():
    a = _inputs(V=4)
    a["tokens"][0, 0] = 4
    with pytest.raises(OpError, match=r"token id 4 is out of range \[0, 4\)"):
        OP(a["dwte"], a["dwpe"], a["dout"], a["tokens"])
    with pytest.raises(OpError, match="int32"):
        OP(a["dwte"], a["dwpe"], a["dout"], a["tokens"].astype(np.int64))
    b = _inputs()
    with pytest.raises(OpError, match="tokens must have shape"):
        OP(b["dwte"], b["dwpe"], b["dout"], b["tokens"][:, :3].copy())
