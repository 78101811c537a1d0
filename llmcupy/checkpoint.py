"""Model, debug-state and training-state files.

**Model file** (llm.c's ``gpt2_124M.bin``): a 1024-byte header of 256 little-endian int32
(0: magic 20240326, 1: version, 2: maxT, 3: V, 4: L, 5: NH, 6: C, 7: Vp, rest 0), then every
parameter in :data:`PARAM_NAMES` order, flat. Version 3 stores fp32; version 5 stores bf16 (the
top 16 bits of each fp32), which :func:`read_model` widens to fp32 exactly (with a warning: the
weights carry only bf16 precision). The file must be exactly 1024 + P·4 (or P·2) bytes.

**Debug state** (llm.c's ``gpt2_124M_debug_state.bin``, the reference for ``test_gpt2``): header
(0: magic 20240327, 1: version 2, 2: B, 3: T), then x int32[B·T], y int32[B·T], logits fp32[B·T·V]
(unpadded V), loss fp32[1], parameter gradients fp32[P] in model layout.

**Training state** (ours, for resuming a run): an uncompressed NumPy ``.npz`` archive (a zip file,
readable with ``numpy.load``) holding

* ``meta``: UTF-8 JSON as a uint8 array: ``{"format": "llmcupy-train-state", "version": 1,
  "config": {GPT2Config fields}, "step": int, "rng": ..., "loaders": {...}, "extra": {...}}``;
  arrays inside ``rng``/``loaders``/``extra`` are stored as archive members and referenced from
  the JSON as ``{"__array__": "<member name>"}``;
* ``params``: fp32[P], the flat parameters in model layout;
* ``adam_m``, ``adam_v``: fp32[P] AdamW moments (absent before the first update).

The model shape (:class:`llmcupy.config.GPT2Config`) and the parameter layout (``param_shapes``,
``split_params``) come from :mod:`llmcupy.config` and are re-exported here.

All writers are atomic (see :func:`llmcupy.fileio.atomic_write`): an error or Ctrl-C during a save
leaves the previous file intact.
"""

from __future__ import annotations

import json
import os
import tokenize
import warnings
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .config import PARAM_NAMES, GPT2Config, num_parameters, param_shapes, split_params  # noqa: F401 (re-exported)
from .fileio import (FileFormatError, atomic_write, check_magic_version, check_size, file_size,
                     make_header, read_array, read_header, write_array)

MODEL_MAGIC = 20240326
MODEL_VERSION_FP32 = 3
MODEL_VERSION_BF16 = 5
DEBUG_MAGIC = 20240327
DEBUG_VERSION = 2
TRAIN_STATE_FORMAT = "llmcupy-train-state"
TRAIN_STATE_VERSION = 1
RANK_STATE_FORMAT = "llmcupy-rank-state"   # one rank's optimizer state in a -o DIR checkpoint (llmcupy.mainline)

_REEXPORT_HINT = "re-export the weights with python -m llmcupy.convert"


# what reading a damaged .npz archive raises; NumPy parses each member's .npy header as Python, so
# one damaged byte there fails in the tokenizer or the parser
NPZ_READ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, SyntaxError, tokenize.TokenError)


class CheckpointError(FileFormatError):
    """A model, debug-state or training-state file is malformed or does not fit the model."""


def param_sizes(config: GPT2Config) -> list[int]:
    """Element counts of the 16 tensors in llm.c's order."""
    return [int(np.prod(shape)) for shape in param_shapes(config).values()]


def join_params(config: GPT2Config, tensors: dict) -> np.ndarray:
    """The flat fp32 buffer of 16 named tensors (shapes checked)."""
    shapes = param_shapes(config)
    if set(tensors) != set(shapes):
        missing, extra = set(shapes) - set(tensors), set(tensors) - set(shapes)
        raise ValueError(f"parameter names differ: missing {sorted(missing)}, unexpected {sorted(extra)}")
    parts = []
    for name, shape in shapes.items():
        t = np.asarray(tensors[name])
        if t.shape != shape:
            raise ValueError(f"parameter {name} has shape {t.shape}, expected {shape}")
        parts.append(t.astype(np.float32, copy=False).reshape(-1))
    return np.concatenate(parts)


def _config_from_header(header, path) -> GPT2Config:
    fields = dict(max_seq_len=int(header[2]), vocab_size=int(header[3]), num_layers=int(header[4]),
                  num_heads=int(header[5]), channels=int(header[6]), padded_vocab_size=int(header[7]))
    try:
        return GPT2Config(**fields)
    except ValueError as e:
        raise CheckpointError(f"{path}: bad model header: {e}") from e


# ---------------------------------------------------------------------------------------------
# bf16


def bf16_to_fp32(u16) -> np.ndarray:
    """bf16 bit patterns (uint16) -> fp32, exactly."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def fp32_to_bf16(x) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), round to nearest even; NaNs stay NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    if nan.any():
        rounded[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return rounded


# ---------------------------------------------------------------------------------------------
# model file


def read_model_header(path) -> tuple[GPT2Config, int]:
    """The (config, version) of a model file, header only (the size is checked too)."""
    what = "llm.c model file"
    with open(path, "rb") as f:
        header = read_header(f, path, what)
        version = check_magic_version(header, path, what, MODEL_MAGIC,
                                      (MODEL_VERSION_FP32, MODEL_VERSION_BF16), _REEXPORT_HINT)
        config = _config_from_header(header, path)
        n = num_parameters(config)
        width = 4 if version == MODEL_VERSION_FP32 else 2
        check_size(path, what, file_size(f), 1024 + width * n,
                   f"1024-byte header + {n} {'fp32' if width == 4 else 'bf16'} parameters")
    return config, version


def read_model(path) -> tuple[GPT2Config, np.ndarray]:
    """Reads a model file: returns (config, flat fp32 parameters). Version 5 (bf16) is widened to
    fp32 with a warning."""
    config, version = read_model_header(path)
    n = num_parameters(config)
    with open(path, "rb") as f:
        f.seek(1024)
        try:
            if version == MODEL_VERSION_FP32:
                params = read_array(f, np.float32, n)
            else:
                params = bf16_to_fp32(read_array(f, np.uint16, n))
        except EOFError as e:  # the size was checked; only a file changing under us gets here
            raise CheckpointError(f"{path}: truncated model file: {e}") from e
    if version == MODEL_VERSION_BF16:
        warnings.warn(f"{path}: model file version 5 holds bf16 parameters; converted to fp32 "
                      f"(the values keep bf16 precision)", stacklevel=2)
    return config, params


def is_training_state(path) -> bool:
    """True when ``path`` is a zip archive (our ``.npz`` training state), by its first bytes."""
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


# torch.save's legacy (pre-zip) format opens with pickle protocol 2 and its magic number 0x1950a86a20f9469cfc6c
_LEGACY_TORCH_PREFIX = bytes.fromhex("80028a0a6cfc9c46f9206aa85019")


def pytorch_checkpoint_error(path) -> CheckpointError:
    return CheckpointError(f"{path}: it is a PyTorch checkpoint (torch.save, like Hugging Face's pytorch_model.bin), "
                           "which llmcupy does not read; convert the model's model.safetensors instead (transformers' "
                           "save_pretrained writes one)")


def refuse_safetensors(path) -> None:
    """Hugging Face weights given where an llm.c model file is read: their 8-byte header length
    was read as the magic number ("bad magic number 2688"). The layout: that length, then its JSON."""
    with open(path, "rb") as f:
        head = f.read(9)
        size = file_size(f)
    if len(head) == 9 and head[8:] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= min(size - 8, 100 << 20):
        raise CheckpointError(f"{path}: it is a safetensors file (Hugging Face weights), not an llm.c model file; "
                              f"convert it first: python -m llmcupy.convert {path} -o model.bin, then give model.bin")


def refuse_legacy_pytorch_checkpoint(path) -> None:
    """A pickle-format torch.save file is otherwise "bad magic number" or an unreadable safetensors
    header; the zip format is recognised by :func:`load_training_state`."""
    with open(path, "rb") as f:
        if f.read(len(_LEGACY_TORCH_PREFIX)) == _LEGACY_TORCH_PREFIX:
            raise pytorch_checkpoint_error(path)


def check_readable_file(path, what: str) -> None:
    """A missing path or a folder given where a file is expected: one clear error naming it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file (expected {what})")
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a folder, not a file; expected {what}")


def read_model_any(path) -> tuple[GPT2Config, np.ndarray, str]:
    """The weights of an llm.c model file *or* of a training state written by the trainer
    (``--save-every``): returns (config, flat fp32 parameters, a short description). This is what
    the CLIs' ``-e`` reads, so a model you trained can be sampled, gated and profiled."""
    check_readable_file(path, "an llm.c model .bin or a training state .npz")
    refuse_legacy_pytorch_checkpoint(path)
    refuse_safetensors(path)
    if is_training_state(path):
        state = load_training_state(path)
        return state.config, state.params, f"{path} (training state at step {state.step})"
    config, params = read_model(path)
    return config, params, str(path)


def check_finite_params(path, config: GPT2Config, params) -> None:
    """Raises :class:`CheckpointError` when parameters are NaN or infinite (a diverged run's weights):
    such a model cannot be trained, and sampling it prints the vocabulary's last token every time
    (NaN logits select none). Names the file, the count and the first tensor that holds one."""
    finite = np.isfinite(params)
    bad = int(finite.size - np.count_nonzero(finite))
    if not bad:
        return
    first, start = int(np.argmin(finite)), 0
    for name, size in zip(param_shapes(config), param_sizes(config)):
        if first < start + size:
            break
        start += size
    raise CheckpointError(f"{path}: {bad} of its parameters are NaN or infinite (the first in {name}); it cannot "
                          "be trained or sampled. Start from an earlier checkpoint or from --init")


def write_model(path, config: GPT2Config, params, *, dtype: str = "fp32") -> None:
    """Writes a model file atomically: version 3 (``dtype="fp32"``) or 5 (``"bf16"``)."""
    params = np.asarray(params)
    n = num_parameters(config)
    if params.shape != (n,):
        raise ValueError(f"params has shape {params.shape}; the config needs a flat buffer of {n}")
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be 'fp32' or 'bf16', got {dtype!r}")
    version = MODEL_VERSION_FP32 if dtype == "fp32" else MODEL_VERSION_BF16
    c = config
    header = make_header(MODEL_MAGIC, version, c.max_seq_len, c.vocab_size, c.num_layers,
                         c.num_heads, c.channels, c.padded_vocab_size)
    with atomic_write(path) as f:
        f.write(header)
        if dtype == "fp32":
            write_array(f, params, np.float32)
        else:
            write_array(f, fp32_to_bf16(params), np.uint16)


# ---------------------------------------------------------------------------------------------
# debug state


@dataclass
class DebugState:
    """The reference batch of ``test_gpt2``: inputs, targets, logits (B, T, V), loss, gradients."""
    x: np.ndarray
    y: np.ndarray
    logits: np.ndarray
    loss: float
    grads: np.ndarray

    @property
    def B(self) -> int:
        return int(self.x.shape[0])

    @property
    def T(self) -> int:
        return int(self.x.shape[1])


def debug_state_size(config: GPT2Config, B: int, T: int) -> int:
    return 1024 + 4 * (2 * B * T + B * T * config.vocab_size + 1 + num_parameters(config))


def read_debug_state(path, config: GPT2Config) -> DebugState:
    """Reads llm.c's debug-state file for a model of ``config``."""
    what = "llm.c debug-state file"
    with open(path, "rb") as f:
        header = read_header(f, path, what)
        check_magic_version(header, path, what, DEBUG_MAGIC, (DEBUG_VERSION,))
        B, T = int(header[2]), int(header[3])
        if B <= 0 or T <= 0:
            raise CheckpointError(f"{path}: bad debug-state header: B={B}, T={T} must be positive")
        if T > config.max_seq_len:
            raise CheckpointError(f"{path}: debug state has T={T}, more than the model's "
                                  f"max_seq_len {config.max_seq_len}")
        BT, V, P = B * T, config.vocab_size, num_parameters(config)
        try:
            check_size(path, what, file_size(f), debug_state_size(config, B, T),
                       f"B={B}, T={T}, V={V}, {P} parameters")
        except FileFormatError as e:   # the expected size comes from the model given, as much as from the file
            raise CheckpointError(f"{e}; or it was written for another model than the one given") from None
        x = read_array(f, np.int32, BT).reshape(B, T)
        y = read_array(f, np.int32, BT).reshape(B, T)
        logits = read_array(f, np.float32, BT * V).reshape(B, T, V)
        loss = float(read_array(f, np.float32, 1)[0])
        grads = read_array(f, np.float32, P)
    return DebugState(x=x, y=y, logits=logits, loss=loss, grads=grads)


def write_debug_state(path, x, y, logits, loss: float, grads) -> None:
    """Writes a debug-state file atomically: x, y int (B, T); logits (B, T, V) with the unpadded
    V; the loss; grads the flat gradient buffer in model layout (wte rows padded to Vp)."""
    x, y, logits, grads = np.asarray(x), np.asarray(y), np.asarray(logits), np.asarray(grads)
    if x.ndim != 2 or y.shape != x.shape:
        raise ValueError(f"x and y must both be (B, T); got {x.shape} and {y.shape}")
    B, T = x.shape
    if logits.ndim != 3 or logits.shape[:2] != (B, T):
        raise ValueError(f"logits must be (B, T, V) = ({B}, {T}, V) with the unpadded V; got {logits.shape}")
    if grads.ndim != 1:
        raise ValueError(f"grads must be a flat buffer; got shape {grads.shape}")
    with atomic_write(path) as f:
        f.write(make_header(DEBUG_MAGIC, DEBUG_VERSION, B, T))
        write_array(f, x, np.int32)
        write_array(f, y, np.int32)
        write_array(f, logits, np.float32)
        write_array(f, np.array([loss]), np.float32)
        write_array(f, grads, np.float32)


# ---------------------------------------------------------------------------------------------
# training state (ours)


@dataclass
class TrainingState:
    config: GPT2Config
    params: np.ndarray
    step: int
    m: np.ndarray | None = None
    v: np.ndarray | None = None
    loaders: dict = field(default_factory=dict)   # name -> DataLoader.state_dict()
    rng: dict | None = None                       # XorShiftRNG.state_dict()
    extra: dict = field(default_factory=dict)     # anything JSON-able (+ arrays)


def _encode(obj, arrays: dict, key: str):
    if isinstance(obj, np.ndarray):
        name = key
        arrays[name] = obj
        return {"__array__": name}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"training-state keys must be strings; got {k!r} under {key}")
            out[k] = _encode(v, arrays, f"{key}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode(v, arrays, f"{key}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {key} in a training state")


def _decode(obj, arrays):
    if isinstance(obj, dict):
        if set(obj) == {"__array__"}:
            return arrays[obj["__array__"]]
        return {k: _decode(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    return obj


def save_training_state(path, state: TrainingState) -> None:
    """Writes a training state (format in the module docstring) atomically."""
    n = num_parameters(state.config)
    arrays: dict[str, np.ndarray] = {}
    for name, a in (("params", state.params), ("adam_m", state.m), ("adam_v", state.v)):
        if a is None:
            continue
        a = np.asarray(a)
        if a.shape != (n,):
            raise ValueError(f"{name} has shape {a.shape}; the model has {n} parameters")
        arrays[name] = np.ascontiguousarray(a, dtype=np.float32)
    if "params" not in arrays:
        raise ValueError("a training state needs params")
    meta = {
        "format": TRAIN_STATE_FORMAT, "version": TRAIN_STATE_VERSION,
        "config": asdict(state.config), "step": int(state.step),
        "rng": _encode(state.rng, arrays, "rng"),
        "loaders": _encode(dict(state.loaders), arrays, "loaders"),
        "extra": _encode(dict(state.extra), arrays, "extra"),
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic_write(path) as f:
        np.savez(f, **arrays)


def _has_magic(path, magic: int) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and int(np.frombuffer(head, "<i4")[0]) == magic


def load_training_state(path) -> TrainingState:
    """Reads a training state written by :func:`save_training_state`, checking its format."""
    path = Path(path)
    what = "llmcupy training-state file"
    check_readable_file(path, f"an {what} (.npz, written by the trainer's --save-every)")
    if not is_training_state(path):
        refuse_legacy_pytorch_checkpoint(path)
        # np.load would try a .npy or even a pickle here; say what the file is not instead
        with open(path, "rb") as f:
            head = f.read(6)
        if _has_magic(path, MODEL_MAGIC):
            kind = "an llm.c model file: start from it with -e, not --resume"
        elif head == b"\x93NUMPY":
            kind = "a single .npy array, not an .npz archive"
        else:
            kind = "not a zip archive"
        raise CheckpointError(f"{path}: not an {what} ({kind}); --resume expects the .npz that "
                              f"--save-every writes")
    with open(path, "rb") as f:  # our handle: np.load leaks its own when a zip is corrupt
        try:
            archive = np.load(f, allow_pickle=False)
        except NPZ_READ_ERRORS as e:
            raise CheckpointError(f"{path}: not a readable {what} (truncated or corrupt?): {e}") from e
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise CheckpointError(f"{path}: not an {what} (a single .npy array, not an .npz archive)")
        try:
            with archive:
                if "meta" not in archive.files:
                    if any(name.endswith("/data.pkl") for name in archive.files):   # torch.save's zip format
                        raise pytorch_checkpoint_error(path)
                    raise CheckpointError(f"{path}: not an {what}: no 'meta' member")
                arrays = {name: archive[name] for name in archive.files}
        except CheckpointError:
            raise
        except NPZ_READ_ERRORS as e:
            raise CheckpointError(f"{path}: corrupt {what}: {type(e).__name__}: {e}") from e
    try:
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt {what}: unreadable metadata ({e})") from e
    if isinstance(meta, dict) and meta.get("format") == RANK_STATE_FORMAT and isinstance(meta.get("step"), int):
        # written by -o DIR checkpoints (llmcupy.mainline) beside the step's model file
        folder = path.parent
        model = folder / f"model_{meta['step']:08d}.bin"
        raise CheckpointError(f"{path}: it is one rank's optimizer state of a -o DIR checkpoint, not a training "
                              f"state; the model is {model} (-e takes it), and -o {folder} -y 1 continues that run")
    if not isinstance(meta, dict) or meta.get("format") != TRAIN_STATE_FORMAT:
        raise CheckpointError(f"{path}: not an {what} (format tag {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != TRAIN_STATE_VERSION:
        raise CheckpointError(f"{path}: unsupported {what} version {meta.get('version')!r} "
                              f"(supported: {TRAIN_STATE_VERSION})")
    try:
        config = GPT2Config(**meta["config"])
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: bad model config in {what}: {e}") from e
    n = num_parameters(config)
    for name in ("params", "adam_m", "adam_v"):
        a = arrays.get(name)
        if a is None:
            if name == "params":
                raise CheckpointError(f"{path}: {what} has no params")
            continue
        if a.dtype != np.float32 or a.shape != (n,):
            raise CheckpointError(f"{path}: {name} is {a.dtype}{list(a.shape)}; the model needs float32[{n}]")
    step = _checked_step(path, what, meta, arrays)
    try:
        return TrainingState(config=config, params=arrays["params"], step=step,
                             m=arrays.get("adam_m"), v=arrays.get("adam_v"),
                             loaders=_decode(meta.get("loaders") or {}, arrays),
                             rng=_decode(meta.get("rng"), arrays),
                             extra=_decode(meta.get("extra") or {}, arrays))
    except KeyError as e:
        raise CheckpointError(f"{path}: corrupt {what}: missing {e}") from e


def _checked_step(path, what: str, meta: dict, arrays: dict) -> int:
    """The state's step, checked against its AdamW moments: resuming past step 0 without both
    moments would restart AdamW from zero moments silently (or fail inside the update)."""
    if "step" not in meta:
        raise CheckpointError(f"{path}: corrupt {what}: no step in its metadata")
    step = meta["step"]
    # JSON gives int, float, bool, str...: only a whole number >= 0 is a step count (bool is an int)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{path}: corrupt {what}: step {step!r} in its metadata is not a "
                              "non-negative whole number")
    missing = [name for name in ("adam_m", "adam_v") if name not in arrays]
    if len(missing) == 1:
        raise CheckpointError(f"{path}: corrupt {what}: it has {'adam_v' if missing == ['adam_m'] else 'adam_m'} "
                              f"but no {missing[0]} (AdamW needs both moments)")
    if missing and step > 0:
        raise CheckpointError(f"{path}: corrupt {what}: it is at step {step} but has no AdamW moments "
                              "(adam_m, adam_v); only a state at step 0 may leave them out")
    return step
