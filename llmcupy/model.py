"""GPT-2 (FP32) as an ordered list of kernel calls, each op at the version chosen for it.

Parameters live in one flat FP32 buffer in llm.c's order (see config.py); activations and their
gradients are named buffers allocated once for a (B, T). The forward and backward passes below
read like llm.c's ``gpt2_forward`` / ``gpt2_backward``; every call goes through ``self.call(op)``,
which runs the version of that op given by :class:`KernelChoice` and writes into preallocated
buffers (fixed addresses, so a CUDA graph can capture a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import ops as ops_registry
from .config import GPT2Config, num_parameters, split_params
from .ops import phase
from .ops._op import Workspace, graph_safe
from .runtime import backend as _backend
from .runtime import blas

# The ops one training step uses, in the order they first run, and the CLI flag of each.
# The fusions come last: each replaces unfused ops of the step, and is used only when selected
# (``KernelChoice.set(op, n)``, ``--kernel OP=N`` or the trainer's ``--fused``):
#   fused_residual_forward  a residual add and the LayerNorm after it (residual_forward + layernorm_forward)
#   matmul_gelu_forward     the MLP up-projection and its GELU (matmul_forward + gelu_forward)
#   flash_attention_*       attention without the (B, NH, T, T) matrices (attention_forward/backward);
#                           selecting either of the two selects both
STEP_OPS = (
    "encoder_forward", "layernorm_forward", "matmul_forward", "attention_forward", "residual_forward",
    "gelu_forward", "classifier_fused", "matmul_backward", "matmul_backward_bias", "layernorm_backward",
    "gelu_backward", "attention_backward", "encoder_backward", "adamw",
    "fused_residual_forward", "matmul_gelu_forward", "flash_attention_forward", "flash_attention_backward",
)
FUSION_OPS = ("fused_residual_forward", "matmul_gelu_forward", "flash_attention_forward", "flash_attention_backward")
# what each fusion replaces, for the version table
_REPLACED_BY = {
    "fused_residual_forward": ("residual_forward",),
    "matmul_gelu_forward": ("gelu_forward",),
    "flash_attention_forward": ("attention_forward", "attention_backward"),
}


class ModelError(ValueError):
    """Bad input to the model: T larger than its context, a token id out of range, ..."""


@dataclass
class KernelChoice:
    """Which version (and block size) of every op the model runs. Unlisted ops use their default:
    the measured one (``use_measured``: ``bench/defaults.json``'s entry for this GPU) or the catalogue's."""

    versions: dict = field(default_factory=dict)
    block_sizes: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)   # op -> (version, block size) measured on ``measured_on``
    measured_on: str | None = None

    def version(self, op: str) -> int:
        n = self.versions.get(op)
        if n is None:
            m = self.measured.get(op)
            n = m[0] if m is not None else ops_registry.get(op).default_version
        return int(n)

    def block_size(self, op: str):
        bs = self.block_sizes.get(op)
        if bs is None and op in self.measured and self.version(op) == self.measured[op][0]:
            return self.measured[op][1]   # the block size the measured version was fastest at
        return bs

    def use_measured(self, device: str, path=None) -> bool:
        """Takes the defaults measured on ``device`` from ``bench/defaults.json`` (or ``path``); False if
        it names no such GPU (the catalogue's defaults stay). A measured version this catalogue cannot
        run is an error naming the file, not a silent fallback."""
        from . import defaults

        entry = defaults.for_device(device, path)
        if entry is None:
            return False
        where = defaults.display_path(path)
        measured = {}
        for op, c in entry["ops"].items():
            if op not in STEP_OPS:
                continue
            v = ops_registry.get(op).versions.get(c["version"])
            if v is None or not v.available or not v.deterministic:
                why = ("is not in this catalogue" if v is None else f"is unavailable ({v.unavailable})"
                       if not v.available else "is nondeterministic")
                raise defaults.DefaultsError(
                    f"{where}: {op} version {c['version']}, measured on {device}, {why}; regenerate the file with "
                    "python -m llmcupy.bench defaults, or train with --kernel-defaults catalogue")
            measured[op] = (v.number, c.get("block_size"))
        self.measured, self.measured_on = measured, device
        return True

    def origin(self, op: str) -> str:
        """Why ``op`` runs its version: "chosen" (a flag), "measured" (on ``measured_on``) or "llm.c"."""
        if op in self.measured and self.version(op) == self.measured[op][0]:
            return "measured"
        return "chosen" if op in self.versions else "llm.c"

    def set(self, op: str, version: int, block_size: int | None = None) -> None:
        """Selects a version, checking that the op exists, the number is valid and it can run."""
        o = ops_registry.get(op)
        v = o.version(version)
        if not v.available:
            raise ops_registry.OpError(f"{op} version {version} is unavailable: {v.unavailable}")
        self.versions[op] = v.number
        if block_size is not None:
            self.block_sizes[op] = int(block_size)

    def uses(self, op: str) -> bool:
        """Whether the step runs ``op``: every unfused op unless a fusion replaces it; a fusion if selected."""
        if op in FUSION_OPS:
            if op.startswith("flash_attention"):
                return self.flash
            return op in self.versions
        return self.replaced_by(op) is None

    def replaced_by(self, op: str) -> str | None:
        """The selected fusion that runs instead of ``op``, or None when the step runs ``op`` itself."""
        for fusion, replaced in _REPLACED_BY.items():
            if op in replaced and self.uses(fusion):
                return fusion
        return None

    @property
    def flash(self) -> bool:
        return "flash_attention_forward" in self.versions or "flash_attention_backward" in self.versions

    @property
    def fused_residual(self) -> bool:
        return "fused_residual_forward" in self.versions

    @property
    def fused_mlp(self) -> bool:
        return "matmul_gelu_forward" in self.versions

    def select_fusions(self) -> None:
        """Turns every fusion on at its default version (the trainer's ``--fused``), keeping explicit choices."""
        for op in FUSION_OPS:
            if op not in self.versions:
                self.set(op, self.version(op))

    def table(self) -> list[tuple[str, int, str]]:
        """(op, version, summary) of every op the step runs (fusions only when selected)."""
        rows = []
        for op in STEP_OPS:
            if not self.uses(op):
                continue
            n = self.version(op)
            rows.append((op, n, ops_registry.get(op).versions[n].summary))
        return rows


def activation_shapes(cfg: GPT2Config, B: int, T: int, flash: bool = False) -> dict:
    """The forward's buffers; with ``flash`` the (B, NH, T, T) ones give way to a (L, B, NH, T) lse."""
    L, C, NH, Vp = cfg.num_layers, cfg.channels, cfg.num_heads, cfg.padded_vocab_size
    shapes = {
        "encoded": (B, T, C),
        "ln1": (L, B, T, C), "ln1_mean": (L, B, T), "ln1_rstd": (L, B, T),
        "qkv": (L, B, T, 3 * C),          # the QKV projection (attention_backward's input)
        "atty": (L, B, T, C),
        "att": (L, B, NH, T, T),
        "attproj": (L, B, T, C),
        "residual2": (L, B, T, C),
        "ln2": (L, B, T, C), "ln2_mean": (L, B, T), "ln2_rstd": (L, B, T),
        "fch": (L, B, T, 4 * C),
        "fch_gelu": (L, B, T, 4 * C),
        "fcproj": (L, B, T, C),
        "residual3": (L, B, T, C),
        "lnf": (B, T, C), "lnf_mean": (B, T), "lnf_rstd": (B, T),
        "losses": (B, T),
        "logits": (B, T, Vp),             # logits, then (training) dlogits in place
        # scratch shared by the layers
        "qkvr": (3, B, NH, T, C // NH),
        "preatt": (B, NH, T, T),
    }
    if flash:
        for k in ("att", "qkvr", "preatt"):
            del shapes[k]
        shapes["att_lse"] = (L, B, NH, T)   # the row log-sum-exp: all the flash backward keeps
    return shapes


def grad_activation_shapes(cfg: GPT2Config, B: int, T: int, flash: bool = False) -> dict:
    C, NH = cfg.channels, cfg.num_heads
    shapes = {
        "dres": (B, T, C),                # the residual stream's gradient (layernorm backward adds into it)
        "dbtc": (B, T, C),
        "dqkv": (B, T, 3 * C),
        "dfch": (B, T, 4 * C),
        "datt": (B, NH, T, T),
        "dpreatt": (B, NH, T, T),
    }
    if flash:
        del shapes["datt"], shapes["dpreatt"]
    return shapes


def activation_bytes(cfg: GPT2Config, B: int, T: int, flash: bool = False) -> dict:
    """Bytes of the forward activations and of the backward's activation gradients (FP32)."""
    count = lambda shapes: sum(int(np.prod(s)) for s in shapes.values())  # noqa: E731
    return {"activations": 4 * count(activation_shapes(cfg, B, T, flash)),
            "activation_grads": 4 * count(grad_activation_shapes(cfg, B, T, flash))}


class GPT2:
    """One GPT-2 on the current backend. ``forward`` / ``backward`` / ``update`` as in llm.c."""

    def __init__(self, config: GPT2Config, params: np.ndarray, kernels: KernelChoice | None = None):
        if params.dtype != np.float32 or params.size != num_parameters(config):
            raise ModelError(f"parameters must be {num_parameters(config)} float32 values, got "
                             f"{params.size} {params.dtype}")
        self.config = config
        self.kernels = kernels or KernelChoice()
        self.xp = _backend.xp()
        # a copy on both backends: update() must not change the caller's array
        try:
            self.params = self.xp.array(params, dtype=np.float32, copy=True)
        except Exception as exc:  # cupy's OutOfMemoryError
            if not ("OutOfMemory" in type(exc).__name__ or isinstance(exc, MemoryError)):
                raise
            # before any activation exists: a smaller -b/-t (the usual advice) cannot help here
            raise ModelError(f"out of memory allocating the model's {params.size:,} parameters "
                             f"({params.nbytes / 2**20:.0f} MiB) ({exc}); the model alone does not fit in the "
                             "free GPU memory: use a smaller model, or free the GPU of other processes") from exc
        self.p = split_params(self.params, config)
        self.grads = None
        self.g = None
        self.m = self.v = None          # AdamW moments, allocated on the first update
        self.B = self.T = None
        self.acts = self.dacts = None
        self.mean_loss = None
        self.has_targets = False

    # -- buffers --------------------------------------------------------------------------------

    def num_parameters(self) -> int:
        return int(self.params.size)

    def allocate(self, B: int, T: int) -> None:
        """Activations for (B, T); fixed for the life of the model, as in llm.c."""
        cfg = self.config
        if T > cfg.max_seq_len:
            raise ModelError(f"T={T} is larger than the model's context (max_seq_len={cfg.max_seq_len})")
        if self.B is not None:
            if (B, T) != (self.B, self.T):
                raise ModelError(f"the model's buffers are sized for B={self.B}, T={self.T}; got B={B}, T={T}")
            return
        xp = self.xp
        try:
            # zeros, not empty: att's upper triangle and the padded logit columns must hold zeros
            self.acts = {k: xp.zeros(s, np.float32)
                         for k, s in activation_shapes(cfg, B, T, self.kernels.flash).items()}
            # every position's loss weighs 1/(B*T) in the mean (classifier versions take it as an array)
            self.dlosses = xp.full((B, T), 1.0 / (B * T), dtype=np.float32)
            self.tokens = xp.zeros((B, T), np.int32)
            self.targets = xp.zeros((B, T), np.int32)
        except Exception as exc:  # cupy.cuda.memory.OutOfMemoryError
            raise _out_of_memory(exc, "activations", B, T) from exc
        self.B, self.T = B, T

    def _allocate_grads(self) -> None:
        if self.grads is not None:
            return
        xp = self.xp
        try:
            self.grads = xp.zeros_like(self.params)
            self.g = split_params(self.grads, self.config)
            self.dacts = {k: xp.zeros(s, np.float32)
                          for k, s in grad_activation_shapes(self.config, self.B, self.T, self.kernels.flash).items()}
        except Exception as exc:
            raise _out_of_memory(exc, "gradients", self.B, self.T) from exc

    # -- kernels --------------------------------------------------------------------------------

    def call(self, op: str, arrays: dict, out: dict | None = None) -> dict:
        # set_batch checked every token and target id on the host, so the ops need not read them
        # back from the device again (a host synchronisation per launch on a GPU)
        o = ops_registry.get(op)
        return o.run(self.kernels.version(op), arrays, self.kernels.block_size(op), out, host_checks=False)

    # -- forward --------------------------------------------------------------------------------

    def set_batch(self, tokens, targets=None) -> None:
        """Copies a batch into the model's input buffers, checking ids are in [0, V)."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ModelError(f"tokens must be (B, T), got shape {tokens.shape}")
        B, T = tokens.shape
        self.allocate(B, T)
        V = self.config.vocab_size
        for what, arr in (("input", tokens), ("target", targets)):
            if arr is None:
                continue
            arr = np.asarray(arr)
            if arr.shape != (B, T):
                raise ModelError(f"{what} tokens must have shape {(B, T)}, got {arr.shape}")
            bad = (arr < 0) | (arr >= V)
            if bad.any():
                i = tuple(int(j) for j in np.argwhere(bad)[0])
                raise ModelError(f"{what} token id {int(arr[i])} at {i} is outside the vocabulary [0, {V})")
        self.tokens[...] = self.xp.asarray(tokens.astype(np.int32))
        self.has_targets = targets is not None
        if targets is not None:
            self.targets[...] = self.xp.asarray(np.asarray(targets).astype(np.int32))

    def forward(self, tokens=None, targets=None):
        """Runs the forward pass; returns the mean loss (a float) with targets, else None.

        With ``tokens=None`` the batch already in the model's buffers is used (a captured graph).
        """
        if tokens is not None:
            self.set_batch(tokens, targets)
        self.forward_on_device()
        if self.has_targets:
            self.mean_loss = float(self.acts["losses"].mean())
            return self.mean_loss
        self.mean_loss = None
        return None

    def forward_on_device(self) -> None:
        """The forward pass proper: kernel launches only, no host synchronisation."""
        p, a = self.p, self.acts
        with phase("encoder"):
            self.call("encoder_forward", {"tokens": self.tokens, "wte": p["wte"], "wpe": p["wpe"]},
                      out={"out": a["encoded"]})
        with phase("forward blocks"):
            self._forward_blocks()
        with phase("classifier"):
            self._forward_classifier()

    def _forward_blocks(self) -> None:
        cfg, p, a = self.config, self.p, self.acts
        L, NH = cfg.num_layers, cfg.num_heads
        k = self.kernels
        for l in range(L):
            res = a["encoded"] if l == 0 else a["residual3"][l - 1]
            if l == 0 or not k.fused_residual:  # fused: the previous layer's residual add wrote ln1
                self.call("layernorm_forward", {"inp": res, "weight": p["ln1w"][l], "bias": p["ln1b"][l]},
                          out={"out": a["ln1"][l], "mean": a["ln1_mean"][l], "rstd": a["ln1_rstd"][l]})
            self.call("matmul_forward", {"inp": a["ln1"][l], "weight": p["qkvw"][l], "bias": p["qkvb"][l]},
                      out={"out": a["qkv"][l]})
            if k.flash:
                self.call("flash_attention_forward", {"inp": a["qkv"][l], "NH": NH},
                          out={"out": a["atty"][l], "lse": a["att_lse"][l]})
            else:
                self.call("attention_forward", {"inp": a["qkv"][l], "NH": NH, "preatt": a["preatt"]},
                          out={"out": a["atty"][l], "att": a["att"][l], "qkvr": a["qkvr"]})
            self.call("matmul_forward", {"inp": a["atty"][l], "weight": p["attprojw"][l], "bias": p["attprojb"][l]},
                      out={"out": a["attproj"][l]})
            self._residual_layernorm(res, a["attproj"][l], a["residual2"][l], p["ln2w"][l], p["ln2b"][l],
                                     a["ln2"][l], a["ln2_mean"][l], a["ln2_rstd"][l])
            if k.fused_mlp:
                self.call("matmul_gelu_forward", {"inp": a["ln2"][l], "weight": p["fcw"][l], "bias": p["fcb"][l]},
                          out={"pre": a["fch"][l], "out": a["fch_gelu"][l]})
            else:
                self.call("matmul_forward", {"inp": a["ln2"][l], "weight": p["fcw"][l], "bias": p["fcb"][l]},
                          out={"out": a["fch"][l]})
                self.call("gelu_forward", {"inp": a["fch"][l]}, out={"out": a["fch_gelu"][l]})
            self.call("matmul_forward", {"inp": a["fch_gelu"][l], "weight": p["fcprojw"][l], "bias": p["fcprojb"][l]},
                      out={"out": a["fcproj"][l]})
            if k.fused_residual:
                # the residual add of the MLP and the LayerNorm that follows it: the next layer's ln1,
                # or after the last layer the final lnf
                last = l == L - 1
                self._residual_layernorm(
                    a["residual2"][l], a["fcproj"][l], a["residual3"][l],
                    p["lnfw"] if last else p["ln1w"][l + 1], p["lnfb"] if last else p["ln1b"][l + 1],
                    a["lnf"] if last else a["ln1"][l + 1], a["lnf_mean"] if last else a["ln1_mean"][l + 1],
                    a["lnf_rstd"] if last else a["ln1_rstd"][l + 1])
            else:
                self.call("residual_forward", {"inp1": a["residual2"][l], "inp2": a["fcproj"][l]},
                          out={"out": a["residual3"][l]})

    def _residual_layernorm(self, residual, inp, residual_out, weight, bias, normed, mean, rstd) -> None:
        """residual_out = residual + inp, then normed = LayerNorm(residual_out): fused or two ops."""
        if self.kernels.fused_residual:
            self.call("fused_residual_forward", {"residual": residual, "inp": inp, "weight": weight, "bias": bias},
                      out={"residual_out": residual_out, "normed": normed, "mean": mean, "rstd": rstd})
            return
        self.call("residual_forward", {"inp1": residual, "inp2": inp}, out={"out": residual_out})
        self.call("layernorm_forward", {"inp": residual_out, "weight": weight, "bias": bias},
                  out={"out": normed, "mean": mean, "rstd": rstd})

    def _forward_classifier(self) -> None:
        cfg, p, a = self.config, self.p, self.acts
        L, V = cfg.num_layers, cfg.vocab_size
        if not self.kernels.fused_residual:  # fused: the last layer's residual add wrote lnf
            self.call("layernorm_forward", {"inp": a["residual3"][L - 1], "weight": p["lnfw"], "bias": p["lnfb"]},
                      out={"out": a["lnf"], "mean": a["lnf_mean"], "rstd": a["lnf_rstd"]})
        self.call("matmul_forward", {"inp": a["lnf"], "weight": p["wte"], "bias": None}, out={"out": a["logits"]})
        if self.has_targets:
            # softmax + loss + dlogits, in place: the logits become dlogits (llm.c's fused classifier)
            self.call("classifier_fused", {"logits": a["logits"], "targets": self.targets, "dlosses": self.dlosses, "V": V},
                      out={"losses": a["losses"], "dlogits": a["logits"]})

    def logits(self):
        """The logits of the last forward without targets, (B, T, V) on the backend."""
        return self.acts["logits"][..., : self.config.vocab_size]

    # -- backward -------------------------------------------------------------------------------

    def zero_grad(self) -> None:
        # the parameter gradients accumulate (dW += ..., layernorm's dweight += ...), and so does the
        # residual stream's gradient (every layernorm backward adds into dres); every other activation
        # gradient is overwritten before it is read (matmul_backward with overwrite_dinp, attention
        # backward's outputs): zeroing them too would write ~0.5 GB per 124M step (B=4, T=1024) for nothing
        self._allocate_grads()
        self.grads.fill(0)
        self.dacts["dres"].fill(0)

    def backward(self) -> None:
        if self.acts is None or not self.has_targets:
            raise ModelError("backward needs a forward pass with targets first")
        self._allocate_grads()
        cfg, p, g, a, d = self.config, self.p, self.g, self.acts, self.dacts
        L = cfg.num_layers
        dres, dbtc = d["dres"], d["dbtc"]
        with phase("classifier"):
            # LM head: dlogits (in a["logits"]) -> d(lnf) and dwte
            self._linear_backward(dbtc, g["wte"], None, a["logits"], a["lnf"], p["wte"])
            self.call("layernorm_backward", {"dinp": dres, "dweight": g["lnfw"], "dbias": g["lnfb"], "dout": dbtc,
                                             "inp": a["residual3"][L - 1], "weight": p["lnfw"],
                                             "mean": a["lnf_mean"], "rstd": a["lnf_rstd"]})
        with phase("backward blocks"):
            self._backward_blocks()
        with phase("encoder"):
            self.call("encoder_backward", {"dwte": g["wte"], "dwpe": g["wpe"], "dout": dres, "tokens": self.tokens})

    def _backward_blocks(self) -> None:
        cfg, p, g, a, d = self.config, self.p, self.g, self.acts, self.dacts
        L, NH = cfg.num_layers, cfg.num_heads
        dres, dbtc = d["dres"], d["dbtc"]
        for l in reversed(range(L)):
            res = a["encoded"] if l == 0 else a["residual3"][l - 1]
            # MLP: fcproj, GELU, fc
            dfch = d["dfch"]
            self._linear_backward(dfch, g["fcprojw"][l], g["fcprojb"][l], dres, a["fch_gelu"][l], p["fcprojw"][l])
            self.call("gelu_backward", {"inp": a["fch"][l], "dout": dfch}, out={"dinp": dfch})
            self._linear_backward(dbtc, g["fcw"][l], g["fcb"][l], dfch, a["ln2"][l], p["fcw"][l])
            self.call("layernorm_backward", {"dinp": dres, "dweight": g["ln2w"][l], "dbias": g["ln2b"][l],
                                             "dout": dbtc, "inp": a["residual2"][l], "weight": p["ln2w"][l],
                                             "mean": a["ln2_mean"][l], "rstd": a["ln2_rstd"][l]})
            # attention: projection, then attention itself, then the QKV projection
            self._linear_backward(dbtc, g["attprojw"][l], g["attprojb"][l], dres, a["atty"][l], p["attprojw"][l])
            if self.kernels.flash:
                self.call("flash_attention_backward", {"dout": dbtc, "inp": a["qkv"][l], "out": a["atty"][l],
                                                       "lse": a["att_lse"][l], "NH": NH},
                          out={"dinp": d["dqkv"]})
            else:
                self.call("attention_backward", {"dout": dbtc, "inp": a["qkv"][l], "att": a["att"][l], "NH": NH},
                          out={"dinp": d["dqkv"], "datt": d["datt"], "dpreatt": d["dpreatt"]})
            self._linear_backward(dbtc, g["qkvw"][l], g["qkvb"][l], d["dqkv"], a["ln1"][l], p["qkvw"][l])
            self.call("layernorm_backward", {"dinp": dres, "dweight": g["ln1w"][l], "dbias": g["ln1b"][l],
                                             "dout": dbtc, "inp": res, "weight": p["ln1w"][l],
                                             "mean": a["ln1_mean"][l], "rstd": a["ln1_rstd"][l]})

    def _linear_backward(self, dinp, dweight, dbias, dout, inp, weight) -> None:
        """llm.c's FP32 trainer's matmul_backward: dinp = dout @ W (overwritten, never read),
        dW += dout^T @ inp, and dbias += column sums of dout by its own kernel (None: no bias), so
        the step runs any matmul_backward_bias version (the catalogue's default 9 is deterministic)."""
        self.call("matmul_backward", {"dinp": dinp, "dweight": dweight, "dbias": None, "dout": dout, "inp": inp,
                                      "weight": weight, "overwrite_dinp": True})
        if dbias is not None:
            self.call("matmul_backward_bias", {"dbias": dbias, "dout": dout})

    # -- optimizer ------------------------------------------------------------------------------

    def _allocate_moments(self) -> None:
        if self.m is None:
            try:
                self.m = self.xp.zeros_like(self.params)
                self.v = self.xp.zeros_like(self.params)
            except Exception as exc:  # cupy's OutOfMemoryError
                raise _out_of_memory(exc, "AdamW moments m and v", self.B, self.T) from exc

    def update(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, t: int) -> None:
        """AdamW with llm.c's rule (weight decay on every parameter), step t (1-based)."""
        self._allocate_moments()
        with phase("optimizer"):
            self.call("adamw", {"params": self.params, "grads": self.grads, "m": self.m, "v": self.v, "lr": lr,
                                "beta1": beta1, "beta2": beta2, "eps": eps, "weight_decay": weight_decay,
                                "t": t})

    def train_step(self, tokens, targets, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                   t: int) -> float:
        """One eager training step (forward, zero_grad, backward, AdamW step t) on this batch; returns the
        mean loss, read on the host once, after the update. Reading it between forward and backward
        (``forward()`` does) would drain the GPU's queue mid-step, so backward's launches would start
        with the GPU idle; the caller's NaN check sees the same number afterwards."""
        self.set_batch(tokens, targets)
        if not self.has_targets:
            raise ModelError("a training step needs targets")
        self.forward_on_device()
        self.zero_grad()
        self.backward()
        self.update(lr, beta1, beta2, eps, weight_decay, t)
        self.mean_loss = float(self.acts["losses"].mean())  # the step's one host read
        return self.mean_loss

    def update_on_device(self, state) -> None:
        """The same AdamW update with its scalars and step in device memory (``state``: an
        ``adamw_capturable.AdamWDeviceState``): op adamw_capturable at the version chosen for adamw,
        bit-identical to ``update`` at t = the device step + 1, and capturable in a CUDA graph."""
        self._allocate_moments()
        with phase("optimizer"):
            ops_registry.get("adamw_capturable").run(
                self.kernels.version("adamw"),
                {"params": self.params, "grads": self.grads, "m": self.m, "v": self.v, **state.arrays()},
                self.kernels.block_size("adamw"))

    # -- CUDA graphs ----------------------------------------------------------------------------

    def train_step_on_device(self, state) -> None:
        """One training step as kernel launches only (no host synchronisation): forward with the
        targets already in the buffers, zero_grad, backward, AdamW from ``state``. What a
        :class:`StepGraph` captures."""
        if self.acts is None or not self.has_targets:
            raise ModelError("a training step needs a batch with targets first: set_batch(tokens, targets)")
        self.forward_on_device()
        self.zero_grad()
        self.backward()
        self.update_on_device(state)

    def step_graph(self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                   t: int = 1) -> "StepGraph":
        """A :class:`StepGraph` whose first update is step ``t`` (1-based), for the current (B, T)."""
        return StepGraph(self, lr, beta1, beta2, eps, weight_decay, t)

    # -- state ----------------------------------------------------------------------------------

    def params_numpy(self) -> np.ndarray:
        return _backend.to_numpy(self.params).astype(np.float32, copy=True)

    def grads_numpy(self) -> np.ndarray:
        return _backend.to_numpy(self.grads).astype(np.float32, copy=True)


class StepGraph:
    """A training step captured once as a CUDA graph and replayed: forward (with targets),
    zero_grad, backward and the AdamW update::

        graph = model.step_graph(lr, 0.9, 0.999, 1e-8, weight_decay, t=1)
        for x, y in batches:
            model.set_batch(x, y)      # ids checked on the host, copied into the fixed input buffers
            loss = graph.step()        # the first call runs capture(), later calls replay()

    ``capture()`` runs one real training step eagerly (the warm-up: it compiles every kernel, creates
    cuBLAS's state on the graph's stream and allocates the ops' scratch buffers in ``workspace``)
    and returns its loss, then captures the same step on a non-blocking stream without running it.
    ``replay()`` launches the graph and returns the step's mean loss (the one read-back). Inside the
    captured region nothing reads device values on the host (the ops' value checks are off: the
    model checked the batch in ``set_batch``) and nothing allocates: activations, gradients and
    moments are the model's fixed buffers, the ops' temporaries come from ``workspace`` (sealed
    during the capture), and AdamW reads lr, betas, eps, weight decay and its step counter from
    device memory (op adamw_capturable), the counter advanced by a kernel inside the graph. The
    capture runs in CUDA's thread-local mode, which refuses host synchronisation and driver
    allocations; if that fails (CuPy or cuBLAS needing an allocation), it is captured again in
    relaxed mode and ``capture_mode`` says why. Whatever CuPy allocates during the capture stays
    allocated for the graph's life (``capture_allocations``).

    The graph replays on its own stream, ordered after earlier work on the current stream and
    before later work (events), so set_batch, eager forwards (validation, sampling) and replays
    mix freely. The model's (B, T) and kernel versions are fixed by the capture; ``set_lr`` changes
    the learning rate for later replays.

    In the CPU emulator there are no graphs: ``capture()`` runs the warm-up step and ``replay()``
    runs the same step eagerly through the same graph-safe code path (sealed workspace, no host
    checks, device-resident AdamW state); ``emulated`` is True.
    """

    def __init__(self, model: GPT2, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                 t: int = 1):
        from .ops.adamw_capturable import AdamWDeviceState

        self.model = model
        self.optimizer = AdamWDeviceState(lr, beta1, beta2, eps, weight_decay, t)
        self.workspace = Workspace()
        self.emulated = _backend.get_backend() != "cuda"
        self.graph = None
        self.stream = None
        self.capture_mode = None
        self.capture_allocations: list = []
        self.warmed_up = False
        self.replays = 0

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def step(self) -> float:
        """One training step on the batch in the model's buffers; returns its mean loss."""
        return self.replay() if self.warmed_up else self.capture()

    def set_lr(self, lr: float) -> None:
        self.optimizer.set(lr=lr)

    @property
    def t(self) -> int:
        """Updates done so far (the device counter; reading it synchronises)."""
        return self.optimizer.t

    def _check_batch(self) -> None:
        m = self.model
        if m.acts is None or not m.has_targets:
            raise ModelError("a graph step needs a batch with targets: call model.set_batch(tokens, targets) first")

    def _mean_loss(self) -> float:
        self.model.mean_loss = float(self.model.acts["losses"].mean())
        return self.model.mean_loss

    def capture(self) -> float:
        """The warm-up step (a real training step, eager) and the capture; returns the warm-up's loss."""
        if self.warmed_up:
            raise ModelError("this step graph is already captured; call replay()")
        self._check_batch()
        if self.emulated:
            with graph_safe(self.workspace):
                self.model.train_step_on_device(self.optimizer)
            self.workspace.sealed = True
            self.warmed_up = True
            self.capture_mode = "emulated (CPU emulator: no CUDA graph; steps run eagerly)"
            return self._mean_loss()

        import cupy

        self.stream = cupy.cuda.Stream(non_blocking=True)
        current = cupy.cuda.get_current_stream()
        self.stream.wait_event(current.record())
        with self.stream:
            with graph_safe(self.workspace):
                self.model.train_step_on_device(self.optimizer)
            loss = self._mean_loss()  # synchronises: the warm-up's work is done before the capture
            self.workspace.sealed = True
            try:
                self.graph = self._capture(cupy, cupy.cuda.runtime.streamCaptureModeThreadLocal)
                self.capture_mode = "thread-local"
            except Exception as exc:  # noqa: BLE001 - retried in relaxed mode, the reason kept
                self.graph = self._capture(cupy, cupy.cuda.runtime.streamCaptureModeRelaxed)
                self.capture_mode = f"relaxed (thread-local capture failed: {type(exc).__name__}: {exc})"
        # (if both captures raised, the warm-up step is done and a later step() warms up again)
        self.warmed_up = True
        current.wait_event(self.stream.record())
        return loss

    def _capture(self, cupy, mode):
        kept = []
        allocate = cupy.cuda.get_allocator()

        def keeping_allocator(size):
            mem = allocate(size)
            kept.append(mem)  # the graph holds the address: never back to the pool while it lives
            return mem

        stream = self.stream
        # cuBLAS's handle onto the capturing stream now: binding a stream resets cuBLAS's workspace,
        # which may not happen inside the capture (the warm-up already ran on this stream)
        blas.bind_stream(stream)
        with cupy.cuda.using_allocator(keeping_allocator), graph_safe(self.workspace):
            stream.begin_capture(mode)
            try:
                self.model.train_step_on_device(self.optimizer)
            except BaseException:
                try:
                    stream.end_capture()  # leave capture mode; the partial graph is dropped
                except Exception:  # noqa: BLE001 - an invalidated capture also raises here
                    pass
                raise
            graph = stream.end_capture()
        self.capture_allocations = kept
        return graph

    @property
    def capture_bytes(self) -> int:
        """Device bytes allocated during the capture and held for the graph's life (0 when the
        step allocates nothing in capture, as it should: every buffer is the model's or the workspace's)."""
        return sum(int(m.mem.size) if hasattr(m, "mem") else 0 for m in self.capture_allocations)

    def replay(self) -> float:
        """One step by replaying the graph (eagerly in the emulator); returns the mean loss."""
        if not self.warmed_up:
            raise ModelError("capture() the step graph first (or call step())")
        self._check_batch()
        if self.emulated:
            with graph_safe(self.workspace):
                self.model.train_step_on_device(self.optimizer)
        else:
            import cupy

            current = cupy.cuda.get_current_stream()
            self.stream.wait_event(current.record())  # after set_batch's copies
            self.graph.launch(self.stream)
            current.wait_event(self.stream.record())  # the loss (and anything later) after the step
        self.replays += 1
        return self._mean_loss()


def _out_of_memory(exc: Exception, what: str, B: int, T: int) -> Exception:
    name = type(exc).__name__
    if "OutOfMemory" in name or isinstance(exc, MemoryError):
        return ModelError(f"out of memory allocating the {what} for B={B}, T={T} ({exc}); "
                          "try a smaller batch (-b) or sequence length (-t)")
    return exc

