"""Shared by the flash_attention_forward / flash_attention_backward ops (kernels_cu/flash_attention.cu)."""

from __future__ import annotations

import math

import numpy as np

from ..runtime.module import load_kernel_file
from ._attention import split_qkv

SOURCE = "flash_attention.cu"
HSMAX_CHOICES = (16, 32, 64)   # the kernels' compile-time head-size bounds
ROWS = 64                           # FA_BR: rows (threads) per block
KERNELS = ("flash_attention_forward_kernel1", "flash_attention_backward_dq_kernel1",
           "flash_attention_backward_dkv_kernel1")
NAME_EXPRESSIONS = tuple(f"{k}<{h}>" for k in KERNELS for h in HSMAX_CHOICES)


def hsmax(HS: int) -> int | None:
    return next((h for h in HSMAX_CHOICES if HS <= h), None)


def head_size_problem(HS: int) -> str | None:
    if hsmax(HS) is None:
        return (f"head size C / NH = {HS} is over {HSMAX_CHOICES[-1]}, the largest the kernels keep in "
                "registers (use attention_forward / attention_backward)")
    return None


def kernel(name: str, HS: int):
    return load_kernel_file(SOURCE, name_expressions=NAME_EXPRESSIONS).get_function(f"{name}<{hsmax(HS)}>")


def grid(B: int, T: int, NH: int) -> tuple:
    return ((T + ROWS - 1) // ROWS, B * NH)


def scale(HS: int) -> np.float32:
    return np.float32(1.0 / math.sqrt(HS))


def probabilities(inp, NH: int):
    """Float64 q, k, v (B, NH, T, HS), the causal probabilities P and the row log-sum-exp."""
    q, k, v = (x.astype(np.float64) for x in split_qkv(inp, NH))
    T, HS = q.shape[2], q.shape[3]
    s = (q @ k.swapaxes(-1, -2)) / math.sqrt(HS)
    s = np.where(np.triu(np.ones((T, T), dtype=bool), 1), -np.inf, s)
    mx = s.max(axis=-1, keepdims=True)
    e = np.exp(s - mx)
    total = e.sum(axis=-1, keepdims=True)
    return q, k, v, e / total, (mx + np.log(total))[..., 0]
