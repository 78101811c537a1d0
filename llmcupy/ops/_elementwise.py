"""Validation, launch and constraint helpers shared by the elementwise op modules (gelu_forward,
gelu_backward, residual_forward). Not an op itself: modules whose name starts with ``_`` are not registered.

Their kernels take ``(out, in_1, ..., in_k, N)``: version 1 runs one thread per element, version 2
one thread per float4 pack of 4 elements (N % 4 == 0, 16-byte aligned arrays).
"""

from __future__ import annotations

import numpy as np

from ._op import check_float32, kernel_of, kernels_only, misaligned, need

_INT_MAX = 2**31 - 1


def check_elementwise(op_name: str, a, out: str, inputs: tuple) -> None:
    """validate(): float32 arrays of one shape (``out`` too when given), at most 2^31 - 1 elements."""
    check_float32(op_name, **{k: a.get(k) for k in (*inputs, out)})
    first = a[inputs[0]]
    for k in inputs[1:]:
        need(a[k].shape == first.shape,
             f"{op_name}: {inputs[0]} and {k} must have the same shape, got {first.shape} and {a[k].shape}")
    need(first.size <= _INT_MAX, f"{op_name}: {first.size} elements exceed the kernels' int indexing")
    if a.get(out) is not None:
        need(a[out].shape == first.shape,
             f"{op_name}: {out} must have {inputs[0]}'s shape {first.shape}, got {a[out].shape}")


def elementwise_launch(op_name: str, kernel_name: str, per_thread: int, out: str, inputs: tuple):
    """A Version launch: kernel(out, *inputs, N) on a 1-D grid of ceil(N / (block * per_thread)) blocks.

    N is the element count of the first input; ``per_thread`` the elements one thread handles.
    """

    @kernels_only
    def launch(a, bs):
        n = a[inputs[0]].size
        grid = max(1, -(-n // (bs * per_thread)))
        kernel_of(op_name, kernel_name)((grid,), (bs,), (a[out], *(a[k] for k in inputs), np.int32(n)))

    return launch


def float4_problem(a, out: str, inputs: tuple) -> str | None:
    """requires() of a float4 version: N % 4 == 0 and every array 16-byte aligned, else a sentence."""
    n = a[inputs[0]].size
    if n % 4:
        return f"N = {n} elements must be a multiple of 4 (one float4 pack per thread, only its first index is checked)"
    return misaligned(a, (*inputs, out))
