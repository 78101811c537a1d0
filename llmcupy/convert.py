"""python -m llmcupy.convert: Hugging Face GPT-2 weights (``model.safetensors``) to llm.c's model file, and back.

CLI::

    python -m llmcupy.convert model.safetensors [-o gpt2_124M.bin] [--num-heads N] [--bf16]
    python -m llmcupy.convert llmcupy_train_state.npz -o trained.bin --safetensors trained.safetensors

The input may also be a model you trained: the trainer's training state (``.npz``) or an llm.c
model ``.bin``; ``-o`` writes llm.c's model file and ``--safetensors`` a Hugging Face GPT-2
export (``GPT2Model`` tensor names, Conv1D layout, unpadded wte, plus ``config.json`` beside it),
which ``GPT2LMHeadModel.from_pretrained(folder)`` loads. A checkpoint that transformers saved in
shards (``model-00001-of-00002.safetensors``, ...) converts from its ``model.safetensors.index.json``.

What changes on the way (as llm.c's exporter does it):

* OpenAI's ``Conv1D`` layers store their weights as (in, out); llm.c wants (out, in), so
  ``attn.c_attn``, ``attn.c_proj``, ``mlp.c_fc`` and ``mlp.c_proj`` weights are transposed;
* per-layer tensors ``h.<l>.*`` are stacked into (L, ...) tensors;
* wte (V, C) is padded with zero rows to Vp = V rounded up to a multiple of 128.

Keys may carry the ``transformer.`` prefix of ``GPT2LMHeadModel`` checkpoints; the causal-mask
buffers (``attn.bias``, ``attn.masked_bias``) are ignored and an ``lm_head.weight`` must equal wte
(the LM head is tied; a file holding only ``lm_head.weight``, as ``safetensors.torch.save_model``
writes one, gives wte from it). The number of heads is not in the weights: ``--num-heads``, else
``n_head`` from a ``config.json`` beside the weights, else C / 64 (GPT-2's head size; the CLI says
so). Without ``-o`` the CLI names the model file by its size as llm.c does (``gpt2_124M.bin`` for
GPT-2 124M, the trainer's default ``-e``; ``gpt2_350M.bin``, ...), and refuses to replace an existing
one unless named with ``-o``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np

from .checkpoint import check_finite_params, write_model
from .config import GPT2Config, num_parameters, split_params
from .fileio import KNOWN_MAGICS, FileFormatError
from ._cli import one_line_warnings

# llm.c's names for the released GPT-2 sizes (d24 has 355M parameters but is called 350M)
RELEASED_MODEL_FILES = {"d12": "gpt2_124M.bin", "d24": "gpt2_350M.bin", "d36": "gpt2_774M.bin",
                        "d48": "gpt2_1558M.bin"}
SHARD_INDEX = "model.safetensors.index.json"
_SHARD_NAME = re.compile(r"-\d+-of-\d+\.safetensors$")
HEAD_SIZE = 64
_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")
# llm.c tensor -> (Hugging Face per-layer key, transposed?)
_LAYER_KEYS = {
    "ln1w": ("ln_1.weight", False), "ln1b": ("ln_1.bias", False),
    "qkvw": ("attn.c_attn.weight", True), "qkvb": ("attn.c_attn.bias", False),
    "attprojw": ("attn.c_proj.weight", True), "attprojb": ("attn.c_proj.bias", False),
    "ln2w": ("ln_2.weight", False), "ln2b": ("ln_2.bias", False),
    "fcw": ("mlp.c_fc.weight", True), "fcb": ("mlp.c_fc.bias", False),
    "fcprojw": ("mlp.c_proj.weight", True), "fcprojb": ("mlp.c_proj.bias", False),
}


class ConvertError(ValueError):
    """The weights are not a GPT-2 checkpoint this converter understands."""


def _strip(tensors: dict) -> dict:
    out = {}
    for k, v in tensors.items():
        out[k[len("transformer."):] if k.startswith("transformer.") else k] = v
    return out


def hf_to_llmc(tensors: dict, num_heads: int | None = None) -> tuple[GPT2Config, np.ndarray]:
    """Converts Hugging Face GPT-2 tensors (name -> array) into (config, flat fp32 parameters)."""
    t = _strip(tensors)
    if "wte.weight" not in t and "lm_head.weight" in t:
        # tied, so one name was saved: safetensors.torch.save_model keeps the first in sorted order
        t["wte.weight"] = t.pop("lm_head.weight")
    for key in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
        if key not in t:
            raise ConvertError(f"missing tensor {key!r}: not a GPT-2 checkpoint")
    wte, wpe = (_floating(key, np.asarray(t[key])) for key in ("wte.weight", "wpe.weight"))
    if wte.ndim != 2 or wpe.ndim != 2 or wte.shape[1] != wpe.shape[1]:
        raise ConvertError(f"wte {wte.shape} and wpe {wpe.shape} must be 2-D with the same width")
    V, C = wte.shape
    maxT = wpe.shape[0]
    layers = sorted({int(m.group(1)) for k in t if (m := re.match(r"^h\.(\d+)\.", k))})
    L = len(layers)
    if L == 0 or layers != list(range(L)):
        raise ConvertError(f"transformer blocks h.<l> must be numbered 0..L-1; found {layers}")
    if num_heads is None:
        if C % HEAD_SIZE:
            raise ConvertError(f"cannot infer the number of heads for C={C} (not a multiple of "
                               f"{HEAD_SIZE}); pass --num-heads")
        num_heads = C // HEAD_SIZE
    try:
        config = GPT2Config(max_seq_len=maxT, vocab_size=V, num_layers=L, num_heads=int(num_heads), channels=C)
    except ValueError as e:
        raise ConvertError(str(e)) from e

    flat = np.zeros(num_parameters(config), dtype=np.float32)
    p = split_params(flat, config)
    p["wte"][:V] = wte          # rows V..Vp-1 stay zero
    p["wpe"][:] = wpe
    p["lnfw"][:] = _get(t, "ln_f.weight", (C,))
    p["lnfb"][:] = _get(t, "ln_f.bias", (C,))
    used = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}
    for name, (suffix, transpose) in _LAYER_KEYS.items():
        shape = p[name].shape[1:]
        for l in range(L):
            key = f"h.{l}.{suffix}"
            hf_shape = shape[::-1] if transpose else shape
            w = _get(t, key, hf_shape)
            p[name][l] = w.T if transpose else w
            used.add(key)
    if "lm_head.weight" in t:
        head = np.asarray(t["lm_head.weight"])
        if head.shape != wte.shape or not np.array_equal(head, wte):
            raise ConvertError("lm_head.weight differs from wte.weight; llm.c's GPT-2 ties them")
        used.add("lm_head.weight")
    unknown = sorted(k for k in t if k not in used and not _IGNORED.match(k))
    if unknown:
        raise ConvertError(f"unexpected tensors (not GPT-2?): {', '.join(unknown[:8])}"
                           f"{' ...' if len(unknown) > 8 else ''}")
    return config, flat


def llmc_to_hf(config: GPT2Config, flat) -> dict:
    """The inverse of :func:`hf_to_llmc`: Hugging Face GPT-2 tensors (fp32, contiguous) from the
    flat llm.c parameters (wte without its padding rows; Conv1D weights transposed back)."""
    p = split_params(np.asarray(flat, dtype=np.float32), config)
    out = {"wte.weight": p["wte"][:config.vocab_size], "wpe.weight": p["wpe"],
           "ln_f.weight": p["lnfw"], "ln_f.bias": p["lnfb"]}
    for name, (suffix, transpose) in _LAYER_KEYS.items():
        for l in range(config.num_layers):
            w = p[name][l]
            out[f"h.{l}.{suffix}"] = w.T if transpose else w
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def hf_config(config: GPT2Config) -> dict:
    """A ``config.json`` for transformers' GPT2LMHeadModel of this shape."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
            "n_positions": config.max_seq_len, "n_ctx": config.max_seq_len, "n_embd": config.channels,
            "n_layer": config.num_layers, "n_head": config.num_heads, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256}


def write_safetensors(path, config: GPT2Config, flat) -> None:
    """Writes the Hugging Face export atomically, and its ``config.json`` beside it."""
    from safetensors.numpy import save

    from .fileio import atomic_write

    path = Path(path)
    with atomic_write(path) as f:
        f.write(save(llmc_to_hf(config, flat), metadata={"format": "pt"}))
    with atomic_write(path.with_name("config.json")) as f:
        f.write(json.dumps(hf_config(config), indent=2).encode())


def _floating(key: str, a: np.ndarray) -> np.ndarray:
    if not np.issubdtype(a.dtype, np.floating):   # a cast would turn it into weights without a word
        raise ConvertError(f"tensor {key!r} holds {a.dtype} values; GPT-2 weights are floating point")
    return a


def _get(t: dict, key: str, shape) -> np.ndarray:
    if key not in t:
        raise ConvertError(f"missing tensor {key!r}")
    a = _floating(key, np.asarray(t[key]))
    if a.shape != tuple(shape):
        raise ConvertError(f"tensor {key!r} has shape {a.shape}, expected {tuple(shape)} (Hugging Face layout)")
    return a.astype(np.float32, copy=False)


def load_safetensors(path) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, ValueError, TypeError) as e:
        if "bfloat16" in str(e):   # NumPy has no bfloat16: safetensors.numpy refuses bf16 exports
            return _load_bf16_safetensors(path)
        needed, actual = _safetensors_sizes(path)
        if needed is not None and actual < needed:   # a partial download: the library's words do not say so
            raise ConvertError(f"{path}: truncated safetensors file: its header needs {needed} bytes, the file has "
                               f"{actual} ({needed - actual} missing); download it again") from None
        raise ConvertError(f"{path}: cannot read safetensors file: {e}") from e


def _safetensors_sizes(path) -> tuple[int | None, int]:
    """(the size a safetensors file's header declares, or None if unreadable; the file's size). The
    layout: an 8-byte little-endian header length, the JSON header (data_offsets per tensor), the data."""
    actual = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= min(actual, 100 << 20):
                return None, actual
            header = json.loads(f.read(n))
        ends = [int(info["data_offsets"][1]) for name, info in header.items() if name != "__metadata__"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None, actual
    return 8 + n + max(ends, default=0), actual


# safetensors' dtype names that NumPy holds; BF16 is read as its 16 raw bits and widened
_SAFETENSORS_DTYPES = {"BF16": "<u2", "F16": "<f2", "F32": "<f4", "F64": "<f8", "BOOL": "?", "U8": "u1", "I8": "i1",
                       "U16": "<u2", "I16": "<i2", "U32": "<u4", "I32": "<i4", "U64": "<u8", "I64": "<i8"}


def _load_bf16_safetensors(path) -> dict:
    """A safetensors file holding BF16 tensors, read from its documented layout (an 8-byte
    little-endian header length, a JSON header of dtype, shape and data_offsets, the data); BF16 is
    widened to fp32 exactly, as a version-5 model file is. Other dtypes keep theirs, as
    safetensors.numpy gives them: the causal-mask buffers transformers saves as BOOL or U8 are
    ignored later, and an integer weight is refused by name (:func:`_get`)."""
    from .checkpoint import bf16_to_fp32

    dtypes = {name: np.dtype(code) for name, code in _SAFETENSORS_DTYPES.items()}
    raw = Path(path).read_bytes()
    try:
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        base, out = 8 + n, {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, (start, end) = dtypes.get(info["dtype"]), tuple(info["shape"]), info["data_offsets"]
            if dtype is None:
                raise ConvertError(f"{path}: tensor {name!r} is {info['dtype']}; GPT-2 weights must be F32, F16 or BF16")
            a = np.frombuffer(raw, dtype=dtype, count=(end - start) // dtype.itemsize, offset=base + start)
            if info["dtype"] == "BF16":
                a = bf16_to_fp32(a)
            out[name] = a.reshape(shape)
    except ConvertError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"{path}: cannot read safetensors file: {e}") from e
    warnings.warn(f"{path}: BF16 weights, widened to fp32 (the values keep bf16 precision)", stacklevel=3)
    return out


def _num_heads_from_config(path: Path) -> int | None:
    cfg = path.with_name("config.json")
    if not cfg.is_file():
        return None
    try:
        config = json.loads(cfg.read_text())
        if not isinstance(config, dict):
            raise ValueError(f"not a JSON object but a {type(config).__name__}")
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring unreadable {cfg}: {e}")
        return None
    n = config.get("n_head")
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:   # int() made 2.7 a 2, "twelve" a traceback
        raise ConvertError(f"{cfg}: n_head is {n!r}, not a positive whole number; correct it, or pass --num-heads N")
    return n


def convert(safetensors_path, out_path, *, num_heads: int | None = None, dtype: str = "fp32") -> GPT2Config:
    """Converts a Hugging Face GPT-2 ``model.safetensors`` into llm.c's model file."""
    src = Path(safetensors_path)
    if num_heads is None:
        num_heads = _num_heads_from_config(src)
    config, flat = _convert_file(src, num_heads)
    write_model(out_path, config, flat, dtype=dtype)
    return config


def _convert_file(path, num_heads: int | None) -> tuple[GPT2Config, np.ndarray]:
    """:func:`hf_to_llmc` of a safetensors file or of a sharded checkpoint's index, its errors naming
    the file."""
    path = Path(path)
    tensors = load_sharded_safetensors(path) if path.name.endswith(".json") else load_safetensors(path)
    try:
        return hf_to_llmc(tensors, num_heads=num_heads)
    except ConvertError as e:
        index = path.with_name(SHARD_INDEX)
        hint = (f"; it is one shard of a sharded checkpoint: give its index, {index}"
                if _SHARD_NAME.search(path.name) and index.is_file() else "")
        raise ConvertError(f"{path}: {e}{hint}") from e


def load_sharded_safetensors(index_path) -> dict:
    """The tensors of a checkpoint that transformers' save_pretrained split into shards
    (``model-0000N-of-0000M.safetensors``), read from each shard its index names
    (``model.safetensors.index.json``: ``{"weight_map": {tensor: shard file}}``) beside it."""
    index_path = Path(index_path)
    try:
        weight_map = json.loads(index_path.read_text()).get("weight_map")
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise ConvertError(f"{index_path}: not a safetensors index ({SHARD_INDEX}): {e}") from e
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConvertError(f"{index_path}: not a safetensors index ({SHARD_INDEX}): it has no weight_map")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = index_path.parent / shard
        if not shard_path.is_file():
            raise ConvertError(f"{index_path}: its shard {shard} is not beside it; download every shard the index names")
        tensors.update(load_safetensors(shard_path))   # its own errors name the shard
    return tensors


def read_any(path, num_heads: int | None = None) -> tuple[GPT2Config, np.ndarray]:
    """(config, flat fp32 parameters) of a safetensors file, a training state or an llm.c .bin."""
    from .checkpoint import check_readable_file, read_model_any, refuse_legacy_pytorch_checkpoint

    check_readable_file(path, "a model.safetensors, a training state .npz or an llm.c model .bin")
    refuse_legacy_pytorch_checkpoint(path)
    with open(path, "rb") as f:
        head = f.read(4)
    magic = int(np.frombuffer(head, "<i4")[0]) if len(head) == 4 else None
    if head == b"PK\x03\x04" or magic == 20240326:
        config, flat, _ = read_model_any(path)
        return config, flat
    if magic in KNOWN_MAGICS:   # another llm.c file (token data, tokenizer): not "cannot read safetensors"
        raise ConvertError(f"{path}: it is {KNOWN_MAGICS[magic]}, not GPT-2 weights; give a model.safetensors, "
                           "a training state .npz or an llm.c model .bin")
    if num_heads is None:
        num_heads = _num_heads_from_config(Path(path))
    return _convert_file(path, num_heads)


def default_model_file(c: GPT2Config) -> str:
    """The CLI's output without ``-o``: llm.c's file name for a released size, else the parameter count
    in millions in the same pattern. Before, every size was written as gpt2_124M.bin, the trainer's
    default ``-e``, so a converted GPT-2 medium was trained or sampled as if it were the 124M model."""
    from .config import PRESETS

    for name, file_name in RELEASED_MODEL_FILES.items():
        if PRESETS[name] == c:
            return file_name
    millions = num_parameters(c) / 1e6
    return f"gpt2_{millions:.0f}M.bin" if millions >= 100 else f"gpt2_{millions:.3g}M.bin"   # 7.3M, 0.14M


def heads_note(c: GPT2Config) -> str:
    """What the CLI says of a head count taken as C / 64: a fact for the shapes OpenAI released (the
    README's `download gpt2` fetches no config.json, and a worry there would be a false alarm), a guess
    to check for any other."""
    from .config import PRESETS

    for name in ("d12", "d24", "d36", "d48"):
        p = PRESETS[name]
        if (p.num_layers, p.channels, p.num_heads) == (c.num_layers, c.channels, c.num_heads):
            return (f"NH = {c.num_heads}, as GPT-2's release of L = {c.num_layers}, C = {c.channels} ({name}) "
                    "has it")
    return (f"guessed NH = C/{HEAD_SIZE} = {c.num_heads} (GPT-2's head size); pass --num-heads N if it "
            "differs")


def _heads_were_guessed(path: Path) -> bool:
    """True for a safetensors input without a config.json naming n_head: hf_to_llmc took C / 64."""
    with open(path, "rb") as f:
        head = f.read(4)
    llmcupy_file = head == b"PK\x03\x04" or (len(head) == 4 and int(np.frombuffer(head, "<i4")[0]) == 20240326)
    return not llmcupy_file and _num_heads_from_config(path) is None


def _output_problem(args) -> str | None:
    """Why an output cannot be written, checked before the input is read: a folder or a path under
    a file was reported naming a temporary file (or "File exists"), ``-o`` naming the input
    replaced it (a training state's AdamW moments and data position lost to a model file), and an
    output named config.json beside ``--safetensors`` was replaced by the export's config.json."""
    from .fileio import output_path_problem

    outputs = [(flag, path) for flag, path in (("-o", args.out), ("--safetensors", args.safetensors)) if path]
    if len(outputs) == 2 and os.path.abspath(args.out) == os.path.abspath(args.safetensors):
        return f"-o and --safetensors both name {args.out}; give them different files"
    for flag, path in outputs:
        problem = output_path_problem(path, makes_folders=True)   # atomic_write makes missing folders
        if problem:
            return f"{flag} {path}: {problem}"
        try:
            same = os.path.samefile(path, args.weights)
        except OSError:   # one of them does not exist: no clash
            same = False
        if same:
            return (f"{flag} {path} is the input file; writing there would replace {args.weights}. Give "
                    f"{flag} another file")
    if args.safetensors:   # write_safetensors also writes config.json beside the export
        config_json = Path(args.safetensors).with_name("config.json")
        if Path(args.safetensors).name == config_json.name:
            return (f"--safetensors {args.safetensors}: convert writes the export's config.json under that name beside "
                    "it; name the weights e.g. model.safetensors")
        if args.out and os.path.abspath(args.out) == os.path.abspath(config_json):
            return f"-o {args.out} is the config.json written beside --safetensors; give -o another file"
        problem = output_path_problem(config_json, makes_folders=True)
        if problem:
            return f"--safetensors {args.safetensors}: the config.json beside it: {problem}"
    return None


@one_line_warnings
def main(argv=None) -> int:
    from ._cli import fail

    parser = argparse.ArgumentParser(
        prog="python -m llmcupy.convert",
        description="Convert GPT-2 weights between Hugging Face safetensors, llm.c's model file and the trainer's "
                    "training state.")
    parser.add_argument("weights", help="model.safetensors (F32, F16 or BF16; e.g. data/gpt2/model.safetensors from python -m "
                        "llmcupy.download gpt2) or a sharded one's model.safetensors.index.json, a training state "
                        ".npz, or an llm.c model .bin")
    parser.add_argument("-o", "--out", default=None,
                        help="output llm.c model file (default, when --safetensors is not given: named by the "
                             "model's size as llm.c does, gpt2_124M.bin for GPT-2 124M; an existing one is "
                             "replaced only when named with -o)")
    parser.add_argument("--safetensors", default=None, metavar="OUT",
                        help="also (or only) write a Hugging Face GPT-2 export here, with config.json beside it")
    parser.add_argument("--num-heads", type=int, help="attention heads (default: config.json beside the weights, else C/64)")
    parser.add_argument("--bf16", action="store_true", help="write bf16 parameters (version 5) instead of fp32 (version 3)")
    args = parser.parse_args(argv)
    named_by_size = args.out is None and args.safetensors is None   # the name needs the model's shape
    problem = _output_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        c, flat = read_any(args.weights, args.num_heads)
        if named_by_size:
            args.out = default_model_file(c)
            # an existing model is replaced only when the user names it: -o says "this file"
            if os.path.exists(args.out):
                print(f"error: {args.out} exists; pass -o {args.out} to replace it, or -o another file",
                      file=sys.stderr)
                return 2
            problem = _output_problem(args)
            if problem:
                print(f"error: {problem}", file=sys.stderr)
                return 2
        check_finite_params(args.weights, c, flat)   # the output would be refused by train and sample
        if args.num_heads is not None and args.num_heads != c.num_heads:   # a .bin or .npz names its own
            raise ConvertError(f"--num-heads {args.num_heads}: {args.weights} holds a model with NH = "
                               f"{c.num_heads} (--num-heads applies to safetensors input only)")
        if args.num_heads is None and _heads_were_guessed(Path(args.weights)):
            print(f"note: no config.json beside {args.weights} gives the number of heads; {heads_note(c)}")
        if args.safetensors:
            write_safetensors(args.safetensors, c, flat)
            print(f"wrote {args.safetensors} (and config.json beside it): Hugging Face GPT-2 tensors")
        if args.out:
            write_model(args.out, c, flat, dtype="bf16" if args.bf16 else "fp32")
    except (ConvertError, FileFormatError, OSError) as e:
        return fail(e)   # bad or missing input, unwritable output: 2
    if not args.out:
        return 0
    print(f"wrote {args.out}: maxT={c.max_seq_len} V={c.vocab_size} Vp={c.padded_vocab_size} L={c.num_layers} "
          f"NH={c.num_heads} C={c.channels}, {num_parameters(c):,} parameters "
          f"({'bf16, version 5' if args.bf16 else 'fp32, version 3'})")
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
