"""encoder_forward: token-id validation and the float4 version's constraints."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError

OP = llmcupy.ops["encoder_forward"]


def _inputs(B=2, T=3, C=8, V=5, maxT=None):
    return OP.make_inputs(np.random.default_rng(1), B=B, T=T, C=C, V=V, maxT=maxT)


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.uint32])
def test_tokens_must_be_int32(dtype):
    a = _inputs()
    with pytest.raises(OpError, match="int32"):
        OP(a["tokens"].astype(dtype), a["wte"], a["wpe"])


@pytest.mark.parametrize("bad", [-1, 5, 1000])
def test_out_of_range_ids_are_refused(bad):
    a = _inputs(V=5)
    a["tokens"][1, 2] = bad
    with pytest.raises(OpError, match=rf"token id {bad} is out of range \[0, 5\)"):
        OP(a["tokens"], a["wte"], a["wpe"])


def test_shapes_are_checked():
    a = _inputs(T=3)
    with pytest.raises(OpError, match="exceeds the 2 rows of wpe"):
        OP(a["tokens"], a["wte"], a["wpe"][:2])
    with pytest.raises(OpError, match="same C"):
        OP(a["tokens"], a["wte"], a["wpe"][:, :4].copy())
    with pytest.raises(OpError, match="2-D"):
        OP(a["tokens"].reshape(-1), a["wte"], a["wpe"])


def test_float4_version_refuses_misaligned_or_ragged_tables(no_hazards):
    a = _inputs(C=8)
    flat = np.zeros(a["wpe"].size + 1, dtype=np.float32)
    wpe = flat[1:].reshape(a["wpe"].shape)  # 4 bytes past a 16-byte boundary
    wpe[...] = a["wpe"]
    with pytest.raises(OpError, match="16-byte aligned"):
        OP(a["tokens"], a["wte"], wpe, version=3)
    # the scalar versions do not care
    np.testing.assert_array_equal(OP(a["tokens"], a["wte"], wpe, version=2), OP.reference(a["tokens"], a["wte"], wpe))
    b = _inputs(C=6)
    with pytest.raises(OpError, match="multiple of 4"):
        OP(b["tokens"], b["wte"], b["wpe"], version=3)


def test_longer_position_table_uses_its_first_rows(no_hazards):
    a = _inputs(B=2, T=3, C=8, V=5, maxT=7)
    for version in (1, 2, 3):
        out = OP(a["tokens"], a["wte"], a["wpe"], version=version)
        np.testing.assert_array_equal(out, a["wte"][a["tokens"]] + a["wpe"][:3][None])
