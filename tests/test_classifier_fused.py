"""classifier_fused beyond the generic test: in-place contract, padding, dloss = 1/N, bad inputs."""

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.ops import OpError, compare
from llmcupy.runtime.module import DEFAULT_OPTIONS, kernels_dir

OP = llmcupy.ops["classifier_fused"]
TOL = OP.tolerance


def _inputs(seed=0, B=2, T=3, V=1001, P=1024):
    return OP.make_inputs(np.random.default_rng(seed), B=B, T=T, V=V, P=P)


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_in_place_and_padding_untouched(version, no_hazards):
    a = _inputs()
    logits = a["logits"]
    # distinct padding bit patterns: NaNs with payloads and finite values; none may change
    pad = logits[..., 1001:].view(np.uint32)
    pad[...] = np.arange(pad.size, dtype=np.uint32).reshape(pad.shape) | np.uint32(0x7FC00000)
    pad[..., ::3] = np.float32(12345.0).view(np.uint32)
    before = logits[..., 1001:].copy()
    ref = OP.reference(logits, a["targets"], a["dlosses"], a["V"])
    with sim.settings(order="reverse"):
        losses, dlogits = OP(logits, a["targets"], a["dlosses"], a["V"], version=version, block_size=128)
    assert dlogits is logits, "the gradient is written over the logits buffer"
    assert np.array_equal(logits[..., 1001:].view(np.uint32), before.view(np.uint32)), "padding was written"
    assert compare("losses", ref[0], losses, *TOL["losses"])["ok"]
    assert compare("dlogits", ref[1][..., :1001], dlogits[..., :1001], *TOL["dlogits"])["ok"]


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_null_dlosses_means_mean_loss(version, no_hazards):
    a = _inputs(seed=3, B=1, T=5, V=300, P=320)
    ref_losses, ref_dlogits = OP.reference(a["logits"], a["targets"], None, a["V"])
    losses, dlogits = OP(a["logits"], a["targets"], None, 300, version=version, block_size=64)
    assert compare("losses", ref_losses, losses, *TOL["losses"])["ok"]
    assert compare("dlogits", ref_dlogits, dlogits, *TOL["dlogits"])["ok"]
    # the gradient of the mean loss: every row sums to 0 (was: the sum over all rows, which rows of
    # opposite error passed); the target entry, (p - 1) / N, is in the reference comparison above
    assert np.abs(dlogits[..., :300].sum(axis=-1)).max() < 1e-6


def test_version1_needs_dlosses():
    a = _inputs()
    with pytest.raises(OpError, match="dlosses"):
        OP(a["logits"], a["targets"], None, a["V"], version=1)


def test_packet_versions_refuse_unaligned_stride():
    a = _inputs(V=37, P=37)
    for version in (2, 4, 5):
        with pytest.raises(OpError, match="P % 4"):
            OP(a["logits"], a["targets"], a["dlosses"], a["V"], version=version)


def test_bad_inputs():
    a = _inputs()
    with pytest.raises(OpError, match="int32"):
        OP(a["logits"], a["targets"].astype(np.int64), a["dlosses"], a["V"])
    bad = a["targets"].copy()
    bad[1, 2] = 1001  # a padding column is not a token
    with pytest.raises(OpError, match=r"\[0, V=1001\).*1001"):
        OP(a["logits"], bad, a["dlosses"], a["V"])
    bad[1, 2] = -1
    with pytest.raises(OpError, match="-1"):
        OP(a["logits"], bad, a["dlosses"], a["V"])
    with pytest.raises(OpError, match="V must lie"):
        OP(a["logits"], a["targets"], a["dlosses"], 1025)
    with pytest.raises(OpError, match="dlosses must have shape"):
        OP(a["logits"], a["targets"], a["dlosses"][:1], a["V"])
    with pytest.raises(OpError, match="targets must have shape"):
        OP(a["logits"], a["targets"][:1], a["dlosses"], a["V"])


def test_llmc_in_place_race_is_exposed_by_reverse_order():
    """llm.c's version 3 reads the target logit after the reductions; in place, threads running
    before thread 0 have already overwritten it. The emulator's reverse order shows it; ours is fixed."""
    src = (kernels_dir() / "classifier_fused.cu").read_text()
    start = src.index("__global__ void classifier_fused_kernel3")
    fixed = "float prob = expf(x_target - s.offset) * s.scale;"
    assert fixed in src[start:]
    racy = src[:start] + src[start:].replace(fixed, "float prob = expf(x[target] - s.offset) * s.scale;", 1)
    mod = llmcupy.RawModule(code=racy, options=DEFAULT_OPTIONS + (f"-I{kernels_dir()}",))
    kernel = mod.get_function("classifier_fused_kernel3")
    a = _inputs()
    ref_losses = OP.reference(a["logits"], a["targets"], a["dlosses"], a["V"])[0]
    results = {}
    for order in ("forward", "reverse"):
        logits = a["logits"].copy()
        losses = np.empty(a["targets"].shape, np.float32)
        with sim.settings(order=order):
            kernel((6,), (256,), (logits, losses, None, logits, a["dlosses"], a["targets"],
                                  np.int32(6), np.int32(1001), np.int32(1024)))
        results[order] = compare("losses", ref_losses, losses, *TOL["losses"])["ok"]
    assert results == {"forward": True, "reverse": False}
