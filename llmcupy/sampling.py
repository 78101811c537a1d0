"""llm.c's sampling RNG (xorshift64*) and its multinomial sampler.

The FP32 trainer seeds one :class:`XorShiftRNG` with 1337 at start-up and draws one ``coin`` per
generated token from it for the whole run. :func:`sample_mult` picks a token from raw logits the
way the trainer does.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
XORSHIFT_MULT = 0x2545F4914F6CDD1D
DEFAULT_SEED = 1337


def xorshift_step(state: int) -> tuple[int, int]:
    """One xorshift64* draw from ``state``: returns (u32, new state). The state keeps x, not the
    product."""
    x = state & MASK64
    x ^= x >> 12
    x ^= (x << 25) & MASK64
    x ^= x >> 27
    return ((x * XORSHIFT_MULT) & MASK64) >> 32, x


def u32_to_f32(u: int) -> float:
    """24 random bits -> a float in [0, 1); exactly representable in fp32."""
    return (u >> 8) / 16777216.0


class XorShiftRNG:
    """llm.c's sampling RNG: 64-bit xorshift* state, 32-bit outputs."""

    def __init__(self, seed: int = DEFAULT_SEED):
        self.state = int(seed) & MASK64

    def random_u32(self) -> int:
        u, self.state = xorshift_step(self.state)
        return u

    def random_f32(self) -> float:
        return u32_to_f32(self.random_u32())

    # state for checkpoints (a plain int; JSON-friendly)
    def state_dict(self) -> dict:
        return {"kind": "xorshift64*", "state": self.state}

    def load_state_dict(self, d: dict) -> None:
        if d.get("kind") != "xorshift64*":
            raise ValueError(f"not a xorshift64* RNG state: {d!r}")
        self.state = int(d["state"]) & MASK64


def sample_mult(logits, coin: float) -> int:
    """The FP32 trainer's sampler on raw logits (temperature 1, no top-k).

    ``Z = sum_i exp(l_i)`` with each exponential in fp32 and the sum in double (sequential, no max
    subtraction); ``threshold = coin * Z`` rounded to fp32; then the first i whose running fp32
    sum of exponentials exceeds the threshold; ``len(logits) - 1`` if rounding leaves none.
    Pass only the real vocabulary (the first V logits), not the padding.
    """
    l = np.asarray(logits, dtype=np.float32).reshape(-1)
    if l.size == 0:
        raise ValueError("sample_mult needs at least one logit")
    # exp in double then rounded: the correctly rounded fp32 exp (what glibc's expf returns)
    with np.errstate(over="ignore", invalid="ignore"):  # raw logits may overflow, as in llm.c
        e = np.exp(l.astype(np.float64)).astype(np.float32)
        z = np.cumsum(e, dtype=np.float64)[-1]          # sequential double sum, like the C loop
        threshold = np.float32(float(coin) * float(z))
        cdf = np.cumsum(e, dtype=np.float32)            # sequential fp32 running sum
        hits = np.flatnonzero(threshold < cdf)
    return int(hits[0]) if hits.size else l.size - 1

