"""adamw_capturable: llm.c's AdamW step with its scalars and step counter in device memory (ours).

A CUDA graph replays its kernels with the arguments they had when it was captured, so the eager
``adamw`` op (scalars and host-computed bias corrections passed by value) would apply step 1's
corrections forever. This op keeps everything that changes per step on the device::

    state = AdamWDeviceState(lr=3e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, t=1)
    llmcupy.ops["adamw_capturable"](params, grads, m, v, **state.arrays(), version=2)

``hyper`` float32[8] = (lr, beta1, beta2, eps, weight_decay, c1, c2, unused); ``step`` int32[1], the
number of updates done so far; ``corrections`` float32 (2, L): c1 and c2 of steps t = 1..L exactly
as the eager path computes them (``adamw.bias_corrections``: host float32 powf), L long enough that
both have rounded to 1.0f at t = L (see :func:`correction_table`). Each call launches
``adamw_step_kernel`` (one thread: ``step += 1``, c1/c2 of that step copied into ``hyper``) and then
the update of version N of ``adamw`` reading its scalars from ``hyper``: the same per-element
arithmetic (one shared ``__device__`` function), hence bit-identical to ``adamw`` version N called
with t = step + 1. Not one of llm.c's numbered kernels: version N here means "adamw's version N,
capturable".
"""

from __future__ import annotations

import functools

import numpy as np

from ..runtime import backend as _backend
from . import adamw as _adamw
from ._op import Bound, Op, OpError, Version, check_float32, kernel_of, kernels_only, need

SOURCE = "adamw.cu"
NAME = "adamw_capturable"
BLOCK_SIZE = _adamw.BLOCK_SIZE

# slots of hyper (the constants ADAMW_* of kernels_cu/adamw.cu)
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, C1, C2 = range(7)
HYPER_SIZE = 8
# a table longer than this (betas within ~1.6e-5 of 1) is refused: the host builds it entry by entry
MAX_TABLE = 1 << 20


@functools.lru_cache(maxsize=8)
def _table(beta1: np.float32, beta2: np.float32, max_len: int) -> np.ndarray:
    c1s, c2s = [], []
    one = np.float32(1.0)
    for t in range(1, max_len + 1):
        c1, c2 = _adamw.bias_corrections(beta1, beta2, t)  # the eager path's own numbers
        c1s.append(c1)
        c2s.append(c2)
        if c1 == one and c2 == one:
            break
    else:
        raise OpError(
            f"{NAME}: the bias corrections 1 - beta^t of beta1={beta1}, beta2={beta2} do not reach 1.0f within "
            f"{max_len} steps (a beta too close to 1); use the eager adamw op")
    table = np.array([c1s, c2s], dtype=np.float32)
    table.setflags(write=False)
    return table


def correction_table(beta1, beta2, max_len: int = MAX_TABLE) -> np.ndarray:
    """(2, L) float32: c1 and c2 of t = 1..L as ``adamw.bias_corrections`` computes them.

    L is the first step at which both have rounded to 1.0f: beta^t only decreases with t, and once
    it is below 2^-25, 1 - beta^t rounds to 1.0f in float32, so the last entry holds for every t >= L
    (the kernel clamps to it). L = 17321 for the trainer's betas (0.9, 0.999).
    """
    return _table(_adamw._f32("beta1", beta1), _adamw._f32("beta2", beta2), int(max_len)).copy()


def hyper_values(lr, beta1, beta2, eps, weight_decay) -> np.ndarray:
    """The hyper array (c1, c2 left 0: the step kernel writes them), checked as ``adamw`` checks its scalars."""
    lr, b1, b2, eps, wd = (_adamw._f32(n, x) for n, x in zip(_adamw.SCALARS, (lr, beta1, beta2, eps, weight_decay)))
    for k, b in (("beta1", b1), ("beta2", b2)):
        need(0.0 <= b < 1.0, f"{NAME}: {k} must lie in [0, 1), got {b}")
    need(eps >= 0.0, f"{NAME}: eps must be >= 0, got {eps}")
    hyper = np.zeros(HYPER_SIZE, np.float32)
    hyper[[LR, BETA1, BETA2, EPS, WEIGHT_DECAY]] = (lr, b1, b2, eps, wd)
    return hyper


class AdamWDeviceState:
    """``hyper``, ``step`` and ``corrections`` on the current backend, for :data:`OP`.

    ``t`` is the 1-based step of the next update (the device counter starts at t - 1). The betas
    are fixed for the state's life (a captured graph holds the table's address); ``set`` changes
    lr, eps and weight_decay with a small host-to-device copy outside any graph.
    """

    def __init__(self, lr, beta1, beta2, eps, weight_decay, t: int = 1):
        t = _adamw._step(t)
        self._host = hyper_values(lr, beta1, beta2, eps, weight_decay)
        self.hyper = _backend.asarray(self._host.copy())
        self.step = _backend.asarray(np.array([t - 1], dtype=np.int32))
        self.corrections = _backend.asarray(correction_table(beta1, beta2))

    def arrays(self) -> dict:
        return {"hyper": self.hyper, "step": self.step, "corrections": self.corrections}

    def set(self, lr=None, eps=None, weight_decay=None) -> None:
        host = self._host.copy()
        for slot, value in ((LR, lr), (EPS, eps), (WEIGHT_DECAY, weight_decay)):
            if value is not None:
                host[slot] = value
        self._host = hyper_values(host[LR], host[BETA1], host[BETA2], host[EPS], host[WEIGHT_DECAY])
        self.hyper[:C1] = _backend.asarray(self._host[:C1])  # c1, c2 stay the step kernel's

    @property
    def t(self) -> int:
        """Updates done so far (reads the device counter: a synchronisation on a GPU)."""
        return int(_backend.to_numpy(self.step)[0])


def reference(params, grads, m, v, hyper, step, corrections):
    hyper = np.asarray(hyper, np.float32)
    t = int(np.asarray(step).reshape(-1)[0]) + 1
    out = _adamw.reference(params, grads, m, v, hyper[LR], hyper[BETA1], hyper[BETA2], hyper[EPS],
                           hyper[WEIGHT_DECAY], t)
    table = np.asarray(corrections, np.float32)
    i = min(t, table.shape[1]) - 1
    new_hyper = hyper.copy()
    new_hyper[C1], new_hyper[C2] = table[0, i], table[1, i]
    return {**out, "hyper": new_hyper, "step": np.array([t], dtype=np.int32)}


def make_inputs(rng, P, step=9, weight_decay=0.0):
    # adamw's harness (t = 10 by default: step = 9 updates done), plus the device state
    a = _adamw.make_inputs(rng, P)
    return {
        "params": a["params"], "grads": a["grads"], "m": a["m"], "v": a["v"],
        "hyper": hyper_values(a["lr"], a["beta1"], a["beta2"], a["eps"], weight_decay),
        "step": np.array([step], dtype=np.int32),
        "corrections": correction_table(a["beta1"], a["beta2"]),
    }


def validate(a):
    # shapes and dtypes only: reading hyper or step would be a host synchronisation
    for k in ("params", "grads", "m", "v", "hyper", "step", "corrections"):
        need(a[k] is not None, f"{NAME}: {k} is required")
    check_float32(NAME, params=a["params"], grads=a["grads"], m=a["m"], v=a["v"], hyper=a["hyper"],
                  corrections=a["corrections"])
    shape = tuple(a["params"].shape)
    for k in ("grads", "m", "v"):
        need(tuple(a[k].shape) == shape, f"{NAME}: {k} must have the shape of params {shape}, got {tuple(a[k].shape)}")
    need(a["params"].size >= 1, f"{NAME}: params is empty")
    need(tuple(a["hyper"].shape) == (HYPER_SIZE,),
         f"{NAME}: hyper must be float32 ({HYPER_SIZE},) = (lr, beta1, beta2, eps, weight_decay, c1, c2, 0), "
         f"got shape {tuple(a['hyper'].shape)}")
    need(getattr(a["step"], "dtype", None) == np.int32 and tuple(a["step"].shape) == (1,),
         f"{NAME}: step must be an int32 array of shape (1,), got {getattr(a['step'], 'dtype', None)} "
         f"{tuple(getattr(a['step'], 'shape', ()))}")
    c = a["corrections"]
    need(c.ndim == 2 and c.shape[0] == 2 and 1 <= c.shape[1] < 2**31,
         f"{NAME}: corrections must be (2, L) (correction_table(beta1, beta2)), got shape {tuple(c.shape)}")


def allocate(xp, a):
    return {"params": a["params"], "m": a["m"], "v": a["v"], "hyper": a["hyper"], "step": a["step"]}  # in place


def _sizes(a):
    return {"P": int(a["params"].size)}


def _launch(kernel_name):
    @kernels_only
    def launch(a, bs):
        n = int(a["params"].size)
        table_len = int(a["corrections"].shape[1])
        kernel_of(NAME, "adamw_step_kernel")((1,), (1,), (a["hyper"], a["step"], a["corrections"], np.int32(table_len)))
        kernel_of(NAME, kernel_name)(((n + bs - 1) // bs,), (bs,),
                                     (a["params"], a["grads"], a["m"], a["v"], np.int64(n), a["hyper"]))

    return launch


OP = Op(
    name=NAME,
    summary="AdamW for CUDA graphs (ours): scalars and step counter in device memory, adamw's arithmetic",
    source=SOURCE,
    inputs=("params", "grads", "m", "v", "hyper", "step", "corrections"),
    outputs=("params", "m", "v", "hyper", "step"),
    versions={
        1: Version(1, "adamw version 1's update, scalars read from hyper, step advanced on the device",
                   _launch("adamw_kernel1_capturable"), block_sizes=(BLOCK_SIZE,)),
        2: Version(2, "adamw version 2's update, scalars read from hyper, step advanced on the device (graphs)",
                   _launch("adamw_kernel2_capturable"), block_sizes=(BLOCK_SIZE,)),
    },
    default_version=2,
    default_note=("an op of llmcupy's own (the graph-capturable form of adamw): version N is adamw's version N, "
                  "and the default follows adamw's, 2"),
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    allocate_fn=allocate,
    validate_fn=validate,
    sizes={"P": 1_048_576},
    sim_sizes={"P": 20_000},
    # the last shape is past the table's end (t = 20001 > L = 17321): the clamp to c1 = c2 = 1
    test_shapes=[{"P": 1}, {"P": 513, "weight_decay": 0.1}, {"P": 5000}, {"P": 700, "step": 20000}],
    tolerance={**{k: _adamw.OP.tolerance[k] for k in ("params", "m", "v")}, "hyper": (0.0, 0.0), "step": (0.0, 0.0)},
    tolerance_note=(
        "params, m, v: adamw's (the same arithmetic: " + _adamw.OP.tolerance_note + ") hyper and step exactly: "
        "the step kernel adds 1 and copies two table entries, no arithmetic."
    ),
    sizes_of=_sizes,
    # as adamw: params, grads, m, v read; params, m, v written (hyper, step and 2 table entries are noise)
    bound=Bound("memory", bytes=lambda s: 28 * s["P"]),
    notes=("Ours, for CUDA graphs; the update is adamw's version N. Block size fixed at 512. The test that it "
           "equals adamw bit for bit over several steps is tests/test_cuda_graph.py."),
)
