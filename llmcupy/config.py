"""GPT-2 configuration and llm.c's parameter layout: one flat FP32 buffer, 16 tensors in order."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PARAM_NAMES = (
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
)


@dataclass(frozen=True)
class GPT2Config:
    max_seq_len: int = 1024      # maxT: rows of wpe
    vocab_size: int = 50257      # V: the real vocabulary
    num_layers: int = 12         # L
    num_heads: int = 12          # NH
    channels: int = 768          # C
    padded_vocab_size: int | None = None  # Vp: V rounded up to a multiple of 128 (rows V..Vp-1 of wte are zero)

    def __post_init__(self):
        if self.padded_vocab_size is None:
            object.__setattr__(self, "padded_vocab_size", _pad(self.vocab_size))
        problems = []
        for name in ("max_seq_len", "vocab_size", "num_layers", "num_heads", "channels", "padded_vocab_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"bad GPT-2 config: {name} must be a positive integer, got {v!r}")
        if self.channels % self.num_heads:
            problems.append(f"channels {self.channels} must be divisible by num_heads {self.num_heads}")
        if self.channels % 4:
            problems.append(f"channels {self.channels} must be a multiple of 4 (float4 kernels)")
        if self.padded_vocab_size < self.vocab_size:
            problems.append(f"padded_vocab_size {self.padded_vocab_size} < vocab_size {self.vocab_size}")
        if problems:
            raise ValueError("bad GPT-2 config: " + "; ".join(problems))

    @classmethod
    def preset(cls, name: str) -> "GPT2Config":
        """A named shape from :data:`PRESETS`: ``d12`` is GPT-2 124M (also d24, d36, d48); ``d1``,
        ``d2`` and ``d4`` are narrow models with the real vocabulary, small enough for the emulator."""
        if name not in PRESETS:
            raise ValueError(f"unknown --init {name!r}; choose one of {', '.join(PRESETS)} or a model .bin file")
        return PRESETS[name]


def _pad(v: int, multiple: int = 128) -> int:
    return (v + multiple - 1) // multiple * multiple


PRESETS = {
    # Small models for the emulator: the real GPT-2 vocabulary, narrow and shallow. d2 and d4 have
    # C = 128, so every matmul (OC = 3C, C, 4C, Vp) also suits matmul_forward version 4's 128-wide tiles.
    "d1": GPT2Config(max_seq_len=256, num_layers=1, num_heads=2, channels=64),
    "d2": GPT2Config(max_seq_len=256, num_layers=2, num_heads=4, channels=128),
    "d4": GPT2Config(max_seq_len=512, num_layers=4, num_heads=4, channels=128),
    # GPT-2 124M, 350M, 774M, 1558M
    "d12": GPT2Config(num_layers=12, num_heads=12, channels=768),
    "d24": GPT2Config(num_layers=24, num_heads=16, channels=1024),
    "d36": GPT2Config(num_layers=36, num_heads=20, channels=1280),
    "d48": GPT2Config(num_layers=48, num_heads=25, channels=1600),
}


def param_shapes(cfg: GPT2Config) -> dict[str, tuple]:
    L, C, Vp, maxT = cfg.num_layers, cfg.channels, cfg.padded_vocab_size, cfg.max_seq_len
    return {
        "wte": (Vp, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


def num_parameters(cfg: GPT2Config) -> int:
    # Python integers: np.prod's int64 wraps for a corrupt header's huge sizes (negative byte counts)
    return sum(math.prod(s) for s in param_shapes(cfg).values())


def split_params(flat, cfg: GPT2Config) -> dict:
    """Views of the 16 tensors inside the flat buffer (NumPy or CuPy), in llm.c's order."""
    expected = num_parameters(cfg)
    if flat.size != expected:
        raise ValueError(f"parameter buffer has {flat.size} floats, the config needs {expected}")
    views, offset = {}, 0
    for name, shape in param_shapes(cfg).items():
        n = int(np.prod(shape))
        views[name] = flat[offset:offset + n].reshape(shape)
        offset += n
    return views


def init_params(cfg: GPT2Config, seed: int = 0) -> np.ndarray:
    """GPT-2's initialisation: weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
    biases 0, LayerNorm gains 1; the padded rows of wte stay zero."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(num_parameters(cfg), dtype=np.float32)
    p = split_params(flat, cfg)
    std = 0.02
    residual_std = std / np.sqrt(2 * cfg.num_layers)
    p["wte"][: cfg.vocab_size] = rng.normal(0, std, (cfg.vocab_size, cfg.channels))
    p["wpe"][:] = rng.normal(0, std, p["wpe"].shape)
    p["qkvw"][:] = rng.normal(0, std, p["qkvw"].shape)
    p["fcw"][:] = rng.normal(0, std, p["fcw"].shape)
    p["attprojw"][:] = rng.normal(0, residual_std, p["attprojw"].shape)
    p["fcprojw"][:] = rng.normal(0, residual_std, p["fcprojw"].shape)
    for name in ("ln1w", "ln2w", "lnfw"):
        p[name][:] = 1.0
    return flat
