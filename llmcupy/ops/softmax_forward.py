"""softmax_forward: row-wise softmax of an (N, C) matrix, the probabilities over the vocabulary."""

from __future__ import annotations

import numpy as np

from ._op import ALL_BLOCK_SIZES, Bound, Op, Version, check_float32, kernel_of, kernels_only, need

SOURCE = "softmax_forward.cu"


def reference(inp):
    # llm.c's CPU reference: fp32 exponentials, summed in double, one fp32 reciprocal per row.
    x = inp.astype(np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    s = e.sum(axis=-1, dtype=np.float64, keepdims=True)
    return {"out": (e * (1.0 / s).astype(np.float32)).astype(np.float32)}


def make_inputs(rng, B, T, V):
    n = B * T
    x = rng.uniform(-1.0, 1.0, size=(n, V)).astype(np.float32)
    # as in llm.c's harness: three columns per row scaled by 20, so every row has a clear peak
    cols = rng.integers(0, V, size=(n, 3))
    np.multiply.at(x, (np.arange(n)[:, None], cols), 20.0)
    return {"inp": x}


def validate(a):
    check_float32("softmax_forward", inp=a["inp"])
    need(a["inp"].ndim == 2, f"softmax_forward: inp must be 2-D (N, C), got shape {a['inp'].shape}")


def allocate(xp, a):
    return {"out": xp.empty_like(a["inp"])}


def _nc(a):
    n, c = a["inp"].shape
    return n, c


def _args(a):
    n, c = _nc(a)
    return (a["out"], a["inp"], np.int32(n), np.int32(c))


def _kernel(name):
    return kernel_of("softmax_forward", name)


def _thread_per_row(name):
    @kernels_only
    def launch(a, bs):
        n, _ = _nc(a)
        _kernel(name)(((n + bs - 1) // bs,), (bs,), _args(a))

    return launch


def _block_per_row(name, smem_floats):
    @kernels_only
    def launch(a, bs):
        n, _ = _nc(a)
        _kernel(name)((n,), (bs,), _args(a), shared_mem=4 * smem_floats(bs))

    return launch


def _warp_per_row(name):
    @kernels_only
    def launch(a, bs):
        n, _ = _nc(a)
        _kernel(name)(((n * 32 + bs - 1) // bs,), (bs,), _args(a))

    return launch


@kernels_only
def _launch_v3(a, bs):
    n, _ = _nc(a)
    _kernel("softmax_forward_kernel3")((n,), (32,), _args(a))


def _power_of_two(a, bs):
    return None if bs & (bs - 1) == 0 else f"block size {bs} must be a power of two (tree reduction)"


OP = Op(
    name="softmax_forward",
    summary="row-wise softmax over (N, C); the vocabulary softmax",
    source=SOURCE,
    inputs=("inp",),
    outputs=("out",),
    versions={
        1: Version(1, "naive: one thread per row, max / exp+sum (double) / divide passes",
                   _thread_per_row("softmax_forward_kernel1")),
        2: Version(2, "one block per row, shared-memory tree reductions (power-of-two blocks)",
                   _block_per_row("softmax_forward_kernel2", lambda bs: bs), requires=_power_of_two),
        3: Version(3, "one warp per row (blocks of 32): shuffle-down max, xor-butterfly sum", _launch_v3,
                   block_sizes=(32,)),
        4: Version(4, "one block per row: warp shuffles + one shared float per warp (race fixed)",
                   _block_per_row("softmax_forward_kernel4", lambda bs: 2 * (bs // 32))),
        5: Version(5, "online softmax, one thread per row (double sum)",
                   _thread_per_row("softmax_forward_online_kernel5")),
        6: Version(6, "online softmax, warp per row, one cg::reduce over (max, sum) pairs, streaming stores",
                   _warp_per_row("softmax_forward_online_kernel6")),
        7: Version(7, "block per row, 8 clamped loads in flight per thread, for very large C",
                   _block_per_row("softmax_forward_kernel7", lambda bs: 2 * (bs // 32))),
        8: Version(8, "online softmax, warp per row, raw shuffles merging (max, sum)",
                   _warp_per_row("softmax_forward_online_kernel8")),
    },
    default_version=7,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "V": 50257},
    sim_sizes={"B": 2, "T": 8, "V": 2053},
    test_shapes=[{"B": 1, "T": 1, "V": 7}, {"B": 1, "T": 5, "V": 37}, {"B": 3, "T": 11, "V": 1000},
                 {"B": 1, "T": 2, "V": 5001}],
    tolerance={"out": (1e-4, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's tolerance: probabilities are at most 1, so fp32 exp (a few ulp) and an fp32 sum of up to "
        "50,257 terms stay far inside 1e-4 absolute; the relative term is one fp32 epsilon."
    ),
    sizes_of=lambda a: {"N": a["inp"].shape[0], "C": a["inp"].shape[1]},
    bound=Bound("memory", bytes=lambda s: 2 * s["N"] * s["C"] * 4),
)
assert set(OP.versions[1].block_sizes) <= set(ALL_BLOCK_SIZES)
