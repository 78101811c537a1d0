"""Helpers shared by the attention-layout op modules (attention_forward, trimat_forward, permute's
attention kernels). Not an op itself: modules whose name starts with ``_`` are not registered.

Layout conventions (B batch, T time, C channels, NH heads, HS = C / NH):
  packed QKV ``inp``     (B, T, 3C) = (B, T, 3, NH, HS): [query | key | value] per position
  ``qkvr``               (3, B, NH, T, HS): q, k, v back to back, each (B, NH, T, HS)
  attention maps         (B, NH, T, T): row t (query), column t2 (key)
  attention output       (B, T, C) = (B, T, NH, HS)
"""

from __future__ import annotations

import numpy as np

from ._op import OpError, check_float32, need


def as_int(value, what: str) -> int:
    """A Python int, a NumPy integer or a 0-d integer array (the tests copy inputs with np.array)."""
    if isinstance(value, (bool, np.bool_)):
        raise OpError(f"{what} must be an integer, got a bool")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if getattr(value, "ndim", None) == 0 and np.issubdtype(getattr(value, "dtype", np.float32), np.integer):
        return int(value)
    raise OpError(f"{what} must be an integer (a Python int), got {type(value).__name__}"
                  + (f" of dtype {value.dtype} and shape {value.shape}" if hasattr(value, "dtype") else ""))


def check_packed_qkv(op_name: str, inp, NH) -> tuple[int, int, int, int]:
    """Validates a packed (B, T, 3C) QKV tensor and the head count; returns (B, T, C, NH)."""
    check_float32(op_name, inp=inp)
    need(getattr(inp, "ndim", None) == 3,
         f"{op_name}: inp must be 3-D (B, T, 3C), got shape {getattr(inp, 'shape', None)}")
    B, T, C3 = inp.shape
    need(C3 % 3 == 0, f"{op_name}: inp's last axis must be 3C (query | key | value), got {C3}")
    C = C3 // 3
    nh = as_int(NH, f"{op_name}: NH")
    need(nh >= 1, f"{op_name}: NH must be at least 1, got {nh}")
    need(C % nh == 0, f"{op_name}: C = {C} must be a multiple of NH = {nh} (head size C / NH)")
    need(B >= 1 and T >= 1 and C >= 1, f"{op_name}: B, T and C must be positive, got shape {inp.shape}")
    return B, T, C, nh


def packed_qkv(rng, B, T, C):
    """llm.c's harness input: uniform in [-1, 1]."""
    return rng.uniform(-1.0, 1.0, size=(B, T, 3 * C)).astype(np.float32)


def split_qkv(inp: np.ndarray, NH: int):
    """(B, T, 3C) -> q, k, v views, each (B, NH, T, HS)."""
    B, T, C3 = inp.shape
    C = C3 // 3
    x = inp.reshape(B, T, 3, NH, C // NH)
    return x[:, :, 0].transpose(0, 2, 1, 3), x[:, :, 1].transpose(0, 2, 1, 3), x[:, :, 2].transpose(0, 2, 1, 3)


def elementwise(kernel, n: int, bs: int, args) -> None:
    """One thread per element: grid ceil(n / bs)."""
    kernel(((n + bs - 1) // bs,), (bs,), args)


INT_MAX = 2**31 - 1


def int_index_problem(B: int, NH: int, T: int, version: int) -> str | None:
    """requires() text of a version whose kernels index the (B, NH, T, T) scores with a C int (llm.c's
    naive and flash versions): past 2^31 - 1 elements ``B * NH * T * T`` wraps negative in the kernel and
    no thread writes, silently (reachable on an 80 GB GPU: B = 175 at NH = 12, T = 1024)."""
    n = B * NH * T * T
    if n <= INT_MAX:
        return None
    return (f"B*NH*T*T = {n} score elements: more than version {version}'s int indices reach (2^31 - 1); "
            "use a smaller B or T, or version 4")


def causal_flops(s: dict, products: int) -> int:
    """FLOPs of ``products`` HS-long dot products for every causal pair (t, t2 <= t) of every head:
    2 * HS each (a multiply and an add), over the B * NH * T * (T + 1) / 2 pairs."""
    HS = s["C"] // s["NH"]
    return products * 2 * s["B"] * s["NH"] * HS * s["T"] * (s["T"] + 1) // 2
