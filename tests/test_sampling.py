"""llm.c's xorshift64* sampling RNG and multinomial sampler."""

import math

import numpy as np
import pytest

from llmcupy.sampling import XorShiftRNG, sample_mult, u32_to_f32, xorshift_step


def test_reference_u32_from_seed_1337():
    rng = XorShiftRNG()  # seed 1337 by default
    assert [rng.random_u32() for _ in range(5)] == [989205090, 818269915, 1335155955, 3876892996, 2941700015]


def test_reference_f32_from_seed_1337():
    rng = XorShiftRNG(1337)
    got = [rng.random_f32() for _ in range(5)]
    want = [0.23031723, 0.19051826, 0.31086516, 0.90265948, 0.68491787]
    assert got == pytest.approx(want, abs=5e-9)
    for g in got:  # 24 random bits: exactly representable in fp32, inside [0, 1)
        assert float(np.float32(g)) == g and 0.0 <= g < 1.0


def test_state_keeps_x_not_the_product():
    u, state = xorshift_step(1337)
    x = 1337
    x ^= x >> 12
    x ^= (x << 25) & (2**64 - 1)
    x ^= x >> 27
    assert state == x and u == ((x * 0x2545F4914F6CDD1D) % 2**64) >> 32
    assert u32_to_f32(0xFFFFFFFF) == (2**24 - 1) / 2**24 and u32_to_f32(255) == 0.0


def test_state_dict_resumes_the_stream():
    a = XorShiftRNG()
    for _ in range(3):
        a.random_u32()
    b = XorShiftRNG(0)
    b.load_state_dict(a.state_dict())
    assert [a.random_u32() for _ in range(4)] == [b.random_u32() for _ in range(4)]
    with pytest.raises(ValueError, match=r"not a xorshift64\* RNG state"):
        b.load_state_dict({"kind": "mt19937"})


def test_sample_mult_small_cases():
    logits = np.array([0.0, math.log(3.0)], dtype=np.float32)  # exps 1, 3: Z = 4
    assert sample_mult(logits, 0.0) == 0
    assert sample_mult(logits, 0.2) == 0      # threshold 0.8 < 1
    assert sample_mult(logits, 0.3) == 1      # threshold 1.2 >= 1
    assert sample_mult(logits, 0.99) == 1
    # coin 1: threshold == Z == final cdf, "threshold < cdf" never holds -> fallback V-1
    assert sample_mult(np.zeros(3, np.float32), 1.0) == 2
    assert sample_mult(np.zeros(1, np.float32), 0.5) == 0
    with pytest.raises(ValueError, match="sample_mult needs at least one logit"):
        sample_mult(np.zeros(0, np.float32), 0.5)


def test_sample_mult_uses_raw_logits():
    # No max subtraction: exp overflows to inf, Z = inf, no finite cdf exceeds it -> V-1,
    # exactly what the trainer does.
    assert sample_mult(np.array([100.0, 0.0, 0.0], np.float32), 0.1) == 2
    # Adding a constant to all logits does not change the pick when nothing overflows.
    l = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    for coin in (0.01, 0.5, 0.97):
        assert sample_mult(l, coin) == sample_mult(l + np.float32(3), coin)


def _walk_reference(logits, coin):
    """The rule written as the scalar loop it describes."""
    e = [np.float32(math.exp(float(x))) for x in logits]
    z = 0.0
    for v in e:
        z += float(v)
    threshold = np.float32(coin * z)
    cdf = np.float32(0.0)
    for i, v in enumerate(e):
        cdf = np.float32(cdf + v)
        if threshold < cdf:
            return i
    return len(e) - 1


def test_sample_mult_matches_scalar_walk():
    gen = np.random.default_rng(1)
    rng = XorShiftRNG()
    for trial in range(20):
        l = (gen.normal(size=600) * 3).astype(np.float32)
        coin = rng.random_f32()
        assert sample_mult(l, coin) == _walk_reference(l, coin), trial


def test_sample_mult_frequencies():
    p = np.array([0.1, 0.6, 0.3])
    l = np.log(p).astype(np.float32)
    rng = XorShiftRNG()
    counts = np.bincount([sample_mult(l, rng.random_f32()) for _ in range(4000)], minlength=3)
    assert np.allclose(counts / 4000, p, atol=0.03)
