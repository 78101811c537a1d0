"""global_norm beyond the generic test: squared norm, zeroed accumulator, any SM count for v4."""

import numpy as np
import pytest

import llmcupy
from llmcupy.ops import OpError
from llmcupy.ops import global_norm as gn

OP = llmcupy.ops["global_norm"]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_returns_the_squared_norm(version, no_hazards):
    out = OP(np.array([3.0, 4.0], dtype=np.float32), version=version)
    assert out.shape == (1,) and out[0] == np.float32(25.0)  # not 5: the caller takes the sqrt


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_launcher_zeroes_the_atomic_accumulator(version, no_hazards):
    # versions 1-3 add into out (the launcher zeroes it); version 4's aggregate must overwrite it,
    # not add to it: the generic test's out comes from np.zeros, so only a stale one tells them apart
    data = np.ones(1000, dtype=np.float32)
    out = np.full(1, 7.0, dtype=np.float32)  # stale value, e.g. a reused pool buffer
    for _ in range(2):
        OP.versions[version].launch({"data": data, "out": out}, 256)
        assert out[0] == np.float32(1000.0)


def test_v4_grid_is_capped_on_132_sm_parts(monkeypatch, no_hazards):
    # an H100/H200 has 132 SMs x 2048 threads: llm.c's formula gives 2112 blocks of 128 threads,
    # which fails its grid < 1024 assertion; ours caps the grid and stays correct
    monkeypatch.setattr(gn, "SIM_NUM_SMS", 132)
    count = 1024 * 128 + 4097
    assert gn.grid_size(10**8, 128) == 2112
    assert gn.grid_size(10**8, 128, cap=gn.AGGREGATE_THREADS) == 1024
    data = np.random.default_rng(0).uniform(-1, 1, count).astype(np.float32)
    ref = OP.reference(data)
    for bs in (32, 256):  # 32 is promoted to 128
        got = OP(data, version=4, block_size=bs)
        assert abs(float(got[0]) - float(ref[0])) <= 2e-4 * float(ref[0])


def test_v4_is_deterministic(no_hazards):
    # the same bits whichever block finishes first: two workers run the blocks concurrently, in every
    # thread order (the atomic version 3 gives several different sums this way). Two calls at the
    # default settings on 20,000 floats gave the atomic launcher the same bits too: it could not fail.
    from llmcupy import sim

    data = np.random.default_rng(1).uniform(-1, 1, 200_000).astype(np.float32)
    seen = set()
    for order in ("forward", "reverse", "random"):
        for seed in range(3):
            with sim.settings(order=order, seed=seed, workers=2):
                seen.add(OP(data, version=4, block_size=32).tobytes())
    assert len(seen) == 1


def test_v4_takes_its_partials_from_a_graph_workspace(no_hazards):
    # a CUDA graph capture must not allocate: version 4's per-block partials come from scratch(), so
    # the warm-up step allocates them in the step's workspace and the sealed capture reuses them
    from llmcupy.ops._op import Workspace, graph_safe

    data = np.random.default_rng(2).uniform(-1, 1, 5000).astype(np.float32)
    workspace = Workspace()
    out = np.zeros(1, np.float32)
    with graph_safe(workspace):
        OP.run(4, {"data": data}, out={"out": out})
    assert len(workspace) == 1
    workspace.sealed = True
    again = np.zeros(1, np.float32)
    with graph_safe(workspace):
        OP.run(4, {"data": data}, out={"out": again})
    assert again[0] == out[0] and abs(float(out[0]) - float(OP.reference(data)[0])) <= 2e-4 * float(out[0])


def test_bad_inputs():
    with pytest.raises(OpError, match="float32"):
        OP(np.ones(4, dtype=np.float64))
    with pytest.raises(OpError, match="empty"):
        OP(np.ones(0, dtype=np.float32))
