"""matmul_backward_bias: dbias += column sums of dout (B*T, OC), the bias gradient of a dense layer.

Call path: ``op(dbias, dout, version=N)`` returns dbias, updated in place (every version adds into
the existing gradient, as llm.c's kernels do; zero dbias first for a plain column sum).
"""

from __future__ import annotations

import functools

import numpy as np

from ..runtime import backend as _backend
from ._op import Bound, Op, Version, check_float32, kernel_of, kernels_only, misaligned, need, scratch

SOURCE = "matmul_backward_bias.cu"
BLOCK_SIZES = (32, 64, 128, 256, 512, 768, 1024)  # llm.c's sweep, 768 included


def reference(dbias, dout):
    # column sums in double (llm.c's CPU reference), added to the gradient already there
    oc = dout.shape[-1]
    total = dbias.astype(np.float64) + dout.reshape(-1, oc).astype(np.float64).sum(axis=0)
    return {"dbias": total.astype(np.float32)}


def make_inputs(rng, B, T, OC):
    # dout uniform in [-1, 1] as in the harness. The harness starts dbias at zero; here it starts
    # uniform in [-1, 1] so that the accumulation (dbias +=) is checked too.
    return {
        "dbias": rng.uniform(-1.0, 1.0, size=(OC,)).astype(np.float32),
        "dout": rng.uniform(-1.0, 1.0, size=(B, T, OC)).astype(np.float32),
    }


def validate(a):
    check_float32("matmul_backward_bias", dbias=a["dbias"], dout=a["dout"])
    need(a["dout"].ndim >= 2, f"matmul_backward_bias: dout must be (B, T, OC) or (N, OC), got shape {a['dout'].shape}")
    oc = a["dout"].shape[-1]
    need(a["dbias"] is not None and a["dbias"].shape == (oc,),
         f"matmul_backward_bias: dbias must have shape ({oc},) (dout's last dimension), got "
         f"{None if a['dbias'] is None else a['dbias'].shape}")


def allocate(xp, a):
    return {"dbias": a["dbias"]}  # accumulated in place


def _dims(a):
    oc = a["dout"].shape[-1]
    return a["dout"].size // oc, oc


def _kernel(name):
    return kernel_of("matmul_backward_bias", name)


@functools.lru_cache(maxsize=None)
def _resident_threads(backend: str) -> int:
    """Threads per SM * SMs: what versions 5, 7, 8 and 9 size gridDim.y from.

    The emulator pretends to be a device of 1024 resident threads: small grids, and at the largest
    block sizes gridDim.y == 1, so both of version 8's and 9's paths are exercised.
    """
    if backend != "cuda":
        return 1024
    # cached per device: getDeviceProperties on every launch cost ~1-1.7 ms each on H100/H200
    return _backend.device_attribute("MaxThreadsPerMultiProcessor") * _backend.device_attribute("MultiProcessorCount")


def _fill():
    return _resident_threads(_backend.get_backend())


def _cdiv(a, b):
    return (a + b - 1) // b


def _args(a):
    bt, oc = _dims(a)
    return (a["dbias"], a["dout"], np.int32(bt), np.int32(oc))


@kernels_only
def _launch_v1(a, bs):
    _, oc = _dims(a)
    p = 1 << (bs.bit_length() - 1)  # rounded down to a power of two for the tree (768 -> 512)
    _kernel("matmul_backward_bias_kernel1")((oc,), (p,), _args(a), shared_mem=4 * p)


@kernels_only
def _launch_v2(a, bs):
    _, oc = _dims(a)
    _kernel("matmul_backward_bias_kernel2")((_cdiv(32 * oc, bs),), (bs,), _args(a))


@kernels_only
def _launch_v3(a, bs):
    _, oc = _dims(a)
    _kernel("matmul_backward_bias_kernel3")((oc,), (bs,), _args(a))


@kernels_only
def _launch_v4(a, bs):
    _, oc = _dims(a)
    _kernel("matmul_backward_bias_kernel4")((oc // 32,), (bs,), _args(a), shared_mem=4 * bs)


@kernels_only
def _launch_v5(a, bs):
    _, oc = _dims(a)
    _kernel("matmul_backward_bias_kernel5")((_cdiv(oc, bs), max(1, _fill() // bs)), (bs,), _args(a))


def _add_aux(a, aux):
    _, oc = _dims(a)
    _kernel("matmul_backward_bias_add_kernel")((_cdiv(oc, 256),), (256,), (a["dbias"], aux, np.int32(oc)))


@kernels_only
def _launch_v7(a, bs):
    bt, oc = _dims(a)
    bs = max(bs, 256)  # 4 warps at least must read the shared sums back; llm.c raises it to 256
    grid_x = _cdiv(oc, 128)
    grid_y = max(1, _fill() // (bs * grid_x))
    # the global atomics accumulate into it (scratch: the workspace's buffer in a CUDA graph)
    aux = scratch("matmul_backward_bias", "aux", (oc,), fill=0.0)
    _kernel("matmul_backward_bias_kernel7")((grid_x, grid_y), (32, bs // 32),
                                            (aux, a["dout"], np.int32(bt), np.int32(oc)))
    _add_aux(a, aux)


def _grid_89(a, bs):
    _, oc = _dims(a)
    grid_x = _cdiv(oc, 32)  # 8 packets of 4 floats per block
    return grid_x, max(1, _fill() // (bs * grid_x))


@kernels_only
def _launch_v8(a, bs):
    bt, oc = _dims(a)
    grid_x, grid_y = _grid_89(a, bs)
    aux = scratch("matmul_backward_bias", "aux", (oc,), fill=0.0) if grid_y > 1 else None
    _kernel("matmul_backward_bias_kernel8")((grid_x, grid_y), (4, 8, bs // 32),
                                            (a["dbias"], aux, a["dout"], np.int32(bt), np.int32(oc)))
    if aux is not None:
        _add_aux(a, aux)


@kernels_only
def _launch_v9(a, bs):
    bt, oc = _dims(a)
    grid_x, grid_y = _grid_89(a, bs)
    # one partial row per grid row, every element written by the kernel: no memset
    aux = scratch("matmul_backward_bias", "partials", (grid_y * oc,)) if grid_y > 1 else None
    _kernel("matmul_backward_bias_kernel9")((grid_x, grid_y), (4, 8, bs // 32),
                                            (a["dbias"], aux, a["dout"], np.int32(bt), np.int32(oc)))
    if aux is not None:
        _kernel("matmul_backward_bias_reduce_kernel9")((_cdiv(oc, 256 * 4),), (256,),
                                                       (a["dbias"], aux, np.int32(grid_y), np.int32(oc)))


def _requires_oc32(a, bs):
    _, oc = _dims(a)
    return None if oc % 32 == 0 else f"OC = {oc} must be a multiple of 32 (a block owns 32 whole columns)"


def _requires_packets(a, bs):
    _, oc = _dims(a)
    problems = []
    if oc % 4:
        problems.append(f"OC = {oc} must be a multiple of 4 (float4 packets of columns)")
    if alignment := misaligned(a, ("dout", "dbias"), use="float4 access"):
        problems.append(alignment)
    return "; ".join(problems) or None


OP = Op(
    name="matmul_backward_bias",
    summary="bias gradient: dbias += column sums of dout (B*T, OC)",
    source=SOURCE,
    inputs=("dbias", "dout"),
    outputs=("dbias",),
    versions={
        1: Version(1, "block per channel, strided fp32 sums, shared tree (block rounded down to a power of two)",
                   _launch_v1, block_sizes=BLOCK_SIZES),
        2: Version(2, "warp per channel, cg::reduce", _launch_v2, block_sizes=BLOCK_SIZES),
        3: Version(3, "block per channel, warp shuffles + one shared slot per warp", _launch_v3,
                   block_sizes=BLOCK_SIZES),
        4: Version(4, "block per 32 columns, coalesced row segments, [warp][lane] partials (OC % 32)",
                   _launch_v4, block_sizes=BLOCK_SIZES, requires=_requires_oc32),
        5: Version(5, "thread per column, rows split over gridDim.y, global fp32 atomicAdd into dbias",
                   _launch_v5, block_sizes=BLOCK_SIZES, deterministic=False),
        7: Version(7, "float4 packets, permuted shared atomics, global atomics into a zeroed buffer + add kernel",
                   _launch_v7, block_sizes=BLOCK_SIZES, requires=_requires_packets, deterministic=False),
        8: Version(8, "block (4, 8, bs/32): width-4 shuffles + shared z-fold; atomics only if gridDim.y > 1",
                   _launch_v8, block_sizes=BLOCK_SIZES, requires=_requires_packets,
                   deterministic=False),   # when gridDim.y > 1, i.e. at the spec's sizes
        9: Version(9, "as 8, per-grid-row partial rows + a float4 reduce kernel: no atomics, deterministic",
                   _launch_v9, block_sizes=BLOCK_SIZES, requires=_requires_packets),
    },
    default_version=9,
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"B": 8, "T": 1024, "OC": 3072},
    sim_sizes={"B": 2, "T": 64, "OC": 96},
    test_shapes=[
        {"B": 1, "T": 1, "OC": 12},     # a single row; OC not a multiple of 32
        {"B": 2, "T": 37, "OC": 64},    # rows not a multiple of anything; every version runs
        {"B": 3, "T": 50, "OC": 100},   # partial column tiles for versions 7-9
        {"B": 1, "T": 5, "OC": 7},      # OC odd: versions 1, 2, 3, 5 only
        {"B": 4, "T": 64, "OC": 160},   # several 32-column tiles, a partial 128-column one for version 7
    ],
    tolerance={"dbias": (5e-3, float(np.finfo(np.float32).eps))},
    tolerance_note=(
        "llm.c's FP32-build tolerance, 5e-3 absolute plus one FP32 epsilon relative, against a double "
        "reference: a column sums B*T = 8192 values uniform in [-1, 1] (|sum| ~ 50) in FP32 partials of "
        "different orders; rounding grows like sqrt(n) * eps/2 * |partial sums| ~ 1e-4, atomics add a few "
        "more roundings, all well inside 5e-3."
    ),
    sizes_of=lambda a: dict(zip(("BT", "OC"), _dims(a))),
    bound=Bound("memory", bytes=lambda s: 4 * (s["BT"] * s["OC"] + 2 * s["OC"])),
    notes=("Every version adds into dbias (zero it for a plain column sum). Versions 5, 7 and 8 use fp32 atomics, "
           "so their summation order varies run to run; 9 is deterministic. The FP32 trainer uses version 4 "
           "with 1024 threads."),
)
