"""python -m llmcupy.train: llm.c's FP32 GPT-2 trainer, with every kernel selectable by number.

    python -m llmcupy.train                                  # what ./train_gpt2fp32cu does
    python -m llmcupy.train --init d2 -b 4 -t 64 --steps 20  # a tiny model from scratch (emulator-sized)
    python -m llmcupy.train --matmul-kernel 4                # the hand-written matmul instead of cuBLAS
    python -m llmcupy.train --kernel attention_backward=7 --benchmark

Prints the configuration and the version of every op, then per step
``step %4d/%d: train loss %f (%f ms, %d tok/s)``; validation loss every ``-v`` steps, a sample every
``-s`` steps; llm.c's log lines (``s:N trl:X``, ``s:N tel:X``) go to ``-o``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import sys
import time

import numpy as np

from . import checkpoint as ckpt
from . import _mpi_launch, distributed, mainline
from . import ops as ops_registry
from ._cli import OneValue, one_line_warnings
from .config import GPT2Config, PRESETS, init_params
from .fileio import FileFormatError, atomic_write
from .model import GPT2, STEP_OPS, KernelChoice, ModelError
from .runtime import blas
from .runtime.module import launch_count
from .runtime import backend as _backend
from .runtime.signature import DeviceLimitError

DEFAULT_B, DEFAULT_T = 4, 1024   # llm.c's train_gpt2_fp32.cu
DEFAULT_TRAIN = "data/tinyshakespeare/tiny_shakespeare_train.bin"
DEFAULT_VAL = "data/tinyshakespeare/tiny_shakespeare_val.bin"
DEFAULT_MODEL = "gpt2_124M.bin"
DEFAULT_TOKENIZER = "gpt2_tokenizer.bin"
DEFAULT_SAVE_PATH = "llmcupy_train_state.npz"
EOT = 50256


def kernel_flag(op: str) -> str:
    """--matmul-kernel is matmul_forward's flag (llm.c's MATMUL_FORWARD_KERNEL); others follow the op name."""
    if op == "matmul_forward":
        return "--matmul-kernel"
    return "--" + op.replace("_", "-") + "-kernel"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llmcupy.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("llm.c's flags")
    g.add_argument("-i", "--train-data", default=DEFAULT_TRAIN, help="train token files (glob)")
    g.add_argument("-j", "--val-data", default=DEFAULT_VAL, help="validation token files (glob)")
    g.add_argument("-o", "--log", default=None,
                   help="log file (llm.c's s:N trl:X / tel:X lines); a folder (existing, ending in /, or with "
                        "-n/-y) holds main.log and the checkpoints")
    g.add_argument("-b", "--batch-size", type=int, default=None,
                   help=f"batch size B (default {DEFAULT_B}, or the resumed state's)")
    g.add_argument("-t", "--seq-len", type=int, default=None,
                   help=f"sequence length T (default {DEFAULT_T}, or the resumed state's)")
    g.add_argument("-l", "--lr", type=float, default=3e-4, help="learning rate")
    g.add_argument("-v", "--val-every", type=int, default=20,
                   help="validation loss every N steps (0: no validation, no val file needed)")
    g.add_argument("-m", "--val-max-steps", type=int, default=20, help="at most N validation batches")
    g.add_argument("-s", "--sample-every", type=int, default=20, help="generate a sample every N steps (0: no samples)")
    g.add_argument("-g", "--gen-len", type=int, default=64, help="generation length, start token included")
    m = p.add_argument_group("model")
    m.add_argument("-e", "--checkpoint", default=None,
                   help=f"llm.c model .bin, or a training state .npz (its model only), to start from (default "
                        f"{DEFAULT_MODEL} when --init and --resume are not given)")
    m.add_argument("--init", choices=sorted(PRESETS), help="start from scratch with this shape (d12 = GPT-2 124M)")
    m.add_argument("--seed", type=int, default=0, help="seed of --init")
    m.add_argument("--tokenizer", default=None, help=f"llm.c tokenizer .bin (default {DEFAULT_TOKENIZER} if present, "
                   "else tiktoken's GPT-2 encoding)")
    m.add_argument("--bpe", default=None, metavar="FILE",
                   help="gpt2.tiktoken BPE rank file for the samples' decoder offline (or $LLMCUPY_GPT2_BPE)")
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=int, default=None, action=OneValue,
                   help="train steps (default: one epoch of the train data); -x is the same flag")
    r.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (llm.c: 0)")
    r.add_argument("--tf32", type=int, choices=(0, 1), default=1, help="TF32 for cuBLAS on sm_80+ (llm.c: on)")
    r.add_argument("--backend", choices=_backend.CHOICES, default=None)
    r.add_argument("--benchmark", action="store_true",
                   help="one fixed batch, no validation or sampling: warm-up, then mean/min ms per step and tok/s "
                        "over --steps steps (default 10)")
    r.add_argument("--warmup", type=int, default=3, help="--benchmark: untimed steps first")
    r.add_argument("--cuda-graph", action="store_true",
                   help="capture the training step (forward, backward, AdamW) once as a CUDA graph and replay it "
                        "every step; same results (in the emulator: the same step code, run eagerly)")
    r.add_argument("--save-every", type=int, default=0, help="save the training state every N steps")
    r.add_argument("--save-path", default=None,
                   help=f"where --save-every writes (default {DEFAULT_SAVE_PATH}); given without --save-every, "
                        "the state after the last step is saved there once, at the end")
    r.add_argument("--resume", default=None,
                   help="resume from a training state written by --save-every (it holds the model: -e/--init "
                        "are not needed, must agree with it if given, and their weights are not used)")
    k = p.add_argument_group("kernel versions (python -m llmcupy.kernel --list shows them)")
    for op in STEP_OPS:
        k.add_argument(kernel_flag(op), dest=f"kernel_{op}", type=int, metavar="N", action=OneValue,
                       help=f"{op} version")
    k.add_argument("--fused", action="store_true",
                   help="use every fusion (fused residual + LayerNorm, matmul with GELU epilogue, flash attention) "
                        "at its default version unless chosen above")
    k.add_argument("--kernel", action="append", default=[], metavar="OP=N[:BLOCK]",
                   help="any step op's version (and block size), e.g. --kernel attention_backward=7 or "
                        "--kernel layernorm_forward=3:512; repeatable")
    k.add_argument("--kernel-defaults", choices=("measured", "catalogue"), default="measured",
                   help="versions of the ops no flag chooses: 'measured' (default) takes bench/defaults.json's "
                        "fastest versions measured on this GPU, when it names this GPU (python -m llmcupy.bench "
                        "defaults writes it; python -m llmcupy.kernel --list says which GPUs it names); "
                        "otherwise, and with 'catalogue', the catalogue's defaults (llm.c's choices, but where "
                        "kernel --list says why not)")
    mainline.add_arguments(p)
    return p


def kernel_choice(args) -> KernelChoice:
    choice = KernelChoice()
    if getattr(args, "kernel_defaults", "catalogue") == "measured":
        choice.use_measured(_backend.device_name())   # flags below override what it sets
    # op -> (the flag that chose it, version, block size): a second flag may repeat a choice, not change it
    chosen = {}
    for op in STEP_OPS:
        n = getattr(args, f"kernel_{op}")
        if n is not None:
            choice.set(op, n)
            chosen[op] = (f"{kernel_flag(op)} {n}", n, None)
    for spec in args.kernel:
        if "=" not in spec:
            raise ops_registry.OpError(f"--kernel {spec!r}: expected OP=N or OP=N:BLOCK")
        op, value = spec.split("=", 1)
        block = None
        if ":" in value:
            value, block = value.split(":", 1)
        if op not in STEP_OPS:
            raise ops_registry.OpError(f"--kernel {op}: not an op of the training step; those are: {', '.join(STEP_OPS)}")
        try:
            number, block = int(value), (int(block) if block else None)
        except ValueError:
            raise ops_registry.OpError(f"--kernel {spec!r}: N and BLOCK must be integers") from None
        if op in chosen:
            flag, previous, previous_block = chosen[op]
            if previous != number or (block is not None and previous_block is not None and block != previous_block):
                raise ops_registry.OpError(f"{flag} and --kernel {spec} choose {op} differently; give one")
            block = block if block is not None else previous_block
        choice.set(op, number, block)   # outside the try: its OpError (a ValueError) says what is wrong
        if block is not None:   # checked here, before anything is allocated, not at the op's first launch
            sizes = ops_registry.get(op).versions[choice.version(op)].block_sizes
            if sizes and block not in sizes:
                raise ops_registry.OpError(f"--kernel {spec}: {op} version {number} runs at block sizes "
                                           f"{', '.join(map(str, sizes))}, not {block}")
        chosen[op] = (f"--kernel {spec}", number, block)
    if getattr(args, "fused", False):
        choice.select_fusions()
    for op, (flag, _, _) in chosen.items():
        fusion = choice.replaced_by(op)
        if fusion is not None:   # the version chosen would never run
            by = chosen[fusion][0] if fusion in chosen else "--fused"
            raise ops_registry.OpError(f"{flag} chooses a version of {op}, but {fusion} ({by}) runs instead of "
                                       f"{op}; drop one of them")
    return choice


def load_model(args, state=None) -> tuple[GPT2Config, np.ndarray, str]:
    """The starting model: --init, -e (an llm.c model .bin or a training state .npz), or the
    resumed training ``state`` (which holds the model; -e/--init given with it must agree)."""
    if args.init and args.checkpoint:
        raise SystemExit("error: give either --init or -e/--checkpoint, not both")
    if state is not None:
        resume = args.resume
        if args.init or args.checkpoint:
            flag = f"--init {args.init}" if args.init else f"-e {args.checkpoint}"
            other = (GPT2Config.preset(args.init) if args.init
                     else ckpt.read_model_any(args.checkpoint)[0])
            if other != state.config:
                raise ckpt.CheckpointError(
                    f"--resume {resume} holds a model {state.config}, but {flag} gives {other}; they must "
                    f"agree (or leave out {flag.split()[0]}: the training state holds the model)")
            # the common case (the original command with --resume added): agreeing, yet not what the run
            # trains on, which nothing else would say
            print(f"note: the weights come from --resume {resume} (step {state.step}); {flag} is not used")
        return state.config, state.params, f"{resume} (training state)"
    if args.init:
        cfg = GPT2Config.preset(args.init)
        return cfg, init_params(cfg, seed=args.seed), f"random init {args.init} (seed {args.seed})"
    path = args.checkpoint or DEFAULT_MODEL
    if not os.path.exists(path):
        raise SystemExit(f"error: {missing_model_message(path)}")
    cfg, params, source = ckpt.read_model_any(path)
    ckpt.check_finite_params(path, cfg, params)
    return cfg, params, source


def missing_model_message(path) -> str:
    if str(path).endswith(".npz"):   # a training state: only the trainer writes one, download gives a .bin
        arg = shlex.quote(str(path))
        return (f"no training state {str(path)!r}. The trainer writes one: add --save-path {arg} (saved after "
                "the last step) or --save-every N to a run, e.g. python -m llmcupy.train --init d2 -b 4 -t 64 "
                f"--steps 20 --save-path {arg}")
    return (f"no model file {str(path)!r}. Start from scratch with --init d12 (or d2 for the emulator), or "
            "get GPT-2 124M: python -m llmcupy.download gpt2 && python -m llmcupy.convert "
            f"data/gpt2/model.safetensors -o {DEFAULT_MODEL}")


def load_tokenizer(args):
    from . import tokenizer as tok

    # A file the user named (--tokenizer, --bpe) must load: an error, not a note
    if args.tokenizer:
        return tok.Tokenizer.load(args.tokenizer)
    if getattr(args, "bpe", None):
        return tok.Tokenizer.from_encoding(tok.get_encoding(args.bpe))
    path = DEFAULT_TOKENIZER if os.path.exists(DEFAULT_TOKENIZER) else None
    try:
        if path:
            return tok.Tokenizer.load(path)
        return tok.Tokenizer.from_encoding(tok.get_encoding())
    except Exception as exc:  # no tokenizer: llm.c prints token ids instead
        print(f"(no tokenizer: {exc}; samples print token ids)")
        return None


def check_tokenizer_covers(tokenizer, vocab_size: int, name: str) -> None:
    """A tokenizer with fewer tokens than the model's vocabulary cannot decode every sampled id: the
    first sample stopped the run with a traceback (ValueError: invalid token id) after training."""
    from .tokenizer import TokenizerError

    if len(tokenizer) < vocab_size:
        raise TokenizerError(f"{name}: the tokenizer has {len(tokenizer)} tokens, fewer than the model's "
                             f"vocabulary of {vocab_size}; give the model's tokenizer (or -s 0: no samples)")


def check_vocab_has_eot(cfg: GPT2Config, name, off: str) -> None:
    """Samples start from <|endoftext|> (llm.c's EOT, id 50256): a model with fewer tokens trained and
    then stopped at its first sample, on an out-of-vocabulary input id. ``off`` says how to do without."""
    if cfg.vocab_size <= EOT:
        raise ckpt.CheckpointError(f"{name}: the model's vocabulary has {cfg.vocab_size} tokens, without "
                                   f"<|endoftext|> (id {EOT}), which starts every sample; {off}")


class Logger:
    def __init__(self, path, resume_step: int | None = None):
        # llm.c truncates the log at start-up. A run resumed at step S keeps the interrupted run's
        # lines before S and drops the later ones (the resumed run writes them again), so the log
        # continues without a gap or a repeat.
        self.f = None
        if not path:
            return
        # A run killed while it rewrote the log below (SIGTERM, SIGKILL: no unwinding removes the
        # temporary) left a hidden file beside it that nothing reuses. Only rank 0 writes the log,
        # once, here, so no rewrite of it is under way now.
        remove_stale_temporaries(os.path.realpath(path))
        if resume_step is None or not os.path.isfile(path):
            self.f = open(path, "w")
            return
        kept = []
        with open(path, errors="replace") as old:
            for line in old:
                head = line.split(" ", 1)[0]
                if head.startswith("s:") and head[2:].isdigit() and int(head[2:]) < resume_step:
                    kept.append(line if line.endswith("\n") else line + "\n")
        # the kept lines replace the log in one rename: a Ctrl-C, kill or full disk before it leaves the
        # interrupted run's log whole (a truncating open lost it). The real path: a symlink stays one.
        with atomic_write(os.path.realpath(path)) as f:
            f.write("".join(kept).encode())
        self.f = open(path, "a")

    def log(self, step: int, kind: str, value: float) -> None:
        if self.f:
            # flushed per line (they are small): a killed run loses none of the lines it printed
            self.f.write(f"s:{step} {kind}:{value:.4f}\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


def print_table(rows) -> None:
    print("+-----------------------+----------------------------------------------------+")
    print("| Parameter             | Value                                              |")
    print("+-----------------------+----------------------------------------------------+")
    for k, v in rows:
        if k is None:
            print("+-----------------------+----------------------------------------------------+")
            continue
        print(f"| {k:<21} | {str(v):<50} |")
    print("+-----------------------+----------------------------------------------------+")


def generate(model: GPT2, rng, tokenizer, gen_len: int) -> list[int]:
    """llm.c's sampling: all positions EOT, then one full forward per new token of row 0."""
    from .sampling import sample_mult
    from .tokenizer import write_sample_piece

    B, T = model.B, model.T
    V = model.config.vocab_size
    tokens = np.full((B, T), EOT, dtype=np.int32)
    out = []
    print("generating:\n---")
    for t in range(1, min(gen_len, T)):
        model.forward(tokens)
        logits = _backend.to_numpy(model.logits()[0, t - 1]).astype(np.float32)
        nxt = sample_mult(logits[:V], rng.random_f32())
        tokens[0, t] = nxt
        out.append(nxt)
        write_sample_piece(nxt, tokenizer)
    print("\n---")
    return out


def check_loss(loss: float, step: int, what: str, kept: str | None = None) -> None:
    """``kept`` says which saved state is left as it was (None: this run saved none)."""
    if not math.isfinite(loss):
        where = kept or "no training state was saved by this run"
        raise FloatingPointError(f"{what} loss is {loss} at step {step}; stopping ({where})")


def resolve_save_path(args) -> None:
    """--save-path alone saves once, at the end (a user who names a file expects it written);
    --save-every without it writes to the default path."""
    if args.save_every < 0:
        raise SystemExit(f"error: --save-every must not be negative (got {args.save_every})")
    args.save_at_end = args.save_path is not None and not args.save_every
    if args.save_path is None and args.save_every:
        args.save_path = DEFAULT_SAVE_PATH
    if args.benchmark and args.save_path is not None:
        raise SystemExit("error: --benchmark saves no training state; drop --save-every/--save-path")


def check_counts(args) -> None:
    """Counts that would otherwise end in a traceback (--seed -1 in NumPy's seeding, --benchmark
    --steps 0 in an empty minimum) or in a made-up number (-m 0 printed "val loss 0.000000")."""
    if args.seed < 0:
        raise SystemExit(f"error: --seed must be >= 0 (got {args.seed})")
    for flag, value in (("-v/--val-every", args.val_every), ("-m/--val-max-steps", args.val_max_steps),
                        ("-s/--sample-every", args.sample_every), ("-g/--gen-len", args.gen_len),
                        ("--warmup", args.warmup)):
        if value < 0:
            raise SystemExit(f"error: {flag} must not be negative (got {value})")
    if args.benchmark:
        if args.steps is not None and args.steps < 1:
            raise SystemExit(f"error: --benchmark needs --steps >= 1 timed steps (got {args.steps})")
        return   # no validation or sampling: -v/-m/-s/-g do not apply
    if args.val_every > 0 and args.val_max_steps == 0:
        raise SystemExit("error: -m 0 leaves no validation batch to average; give -m 1 or more, or turn "
                         "validation off with -v 0")
    if args.sample_every > 0 and args.gen_len < 2:
        raise SystemExit(f"error: -g {args.gen_len} generates no token (the start token counts); give -g 2 or "
                         "more, or turn samples off with -s 0")


def check_outputs(args, run) -> None:
    """Every file the run will write must be writable before any work is done (exit 2 naming the
    flag and the user's path), not after the model is allocated or the first steps are trained."""
    from .fileio import output_path_problem

    if args.benchmark and args.log:   # (it used to be accepted and silently left unwritten)
        raise SystemExit("error: --benchmark writes no log (one fixed batch, timed; no validation); drop -o")
    resolve_save_path(args)
    if args.save_path is not None:   # written by atomic_write, which makes missing folders
        problem = output_path_problem(args.save_path, makes_folders=True)
        if problem:
            raise SystemExit(f"error: --save-path {args.save_path}: {problem}")
    if args.log and not args.benchmark:   # the log is opened after the model is allocated
        problem = output_path_problem(args.log)
        if problem:
            # in folder mode (-o DIR) the user named the folder, which mainline has made already
            named = run.out_dir if getattr(run, "out_dir", None) else args.log
            raise SystemExit(f"error: -o {named}: {problem}")
    check_outputs_spare_inputs(args)


def input_files(args) -> list[tuple[str, str]]:
    """(flag, path) of every existing file the run may read: the token files (-i/-j globs), the
    model (-e, or its default), the resumed state and the tokenizer files."""
    import glob as _glob

    found = []
    for flag, pattern in (("-i", args.train_data), ("-j", args.val_data)):
        found += [(flag, p) for p in sorted(_glob.glob(str(pattern)))] if pattern else []
    model = args.checkpoint or (None if args.init or args.resume else DEFAULT_MODEL)
    tokenizer = args.tokenizer or DEFAULT_TOKENIZER
    for flag, path in (("-e", model), ("--resume", args.resume), ("--tokenizer", tokenizer),
                       ("--bpe", getattr(args, "bpe", None))):
        if path and os.path.isfile(path):
            found.append((flag, path))
    return found


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)   # symbolic and hard links to one file count as the same
    except OSError:
        return False


def check_outputs_spare_inputs(args) -> None:
    """The log (opened with truncation) and the saved state (replaced) must not be a file the run
    reads: ``-o train.bin`` would wipe the training data before the first batch is read, and
    ``--save-path`` over the -e model would replace the user's model by a training state. Only
    --resume's state may be saved over (that is how a run continues)."""
    log = args.log if args.log and not args.benchmark else None
    if log and args.save_path and os.path.abspath(log) == os.path.abspath(args.save_path):
        raise SystemExit(f"error: -o and --save-path both name {log}; give them different files")
    for flag, path in input_files(args):
        if log and _same_file(log, path):
            raise SystemExit(f"error: -o {log} is the file {flag} reads ({path}); the log would overwrite it. "
                             "Give -o another file")
        if args.save_path and flag != "--resume" and _same_file(args.save_path, path):
            raise SystemExit(f"error: --save-path {args.save_path} is the file {flag} reads ({path}); saving "
                             "would replace it. Give --save-path another file")


def check_attention_shape(kernels: KernelChoice, cfg: GPT2Config, B: int, T: int) -> None:
    """A T the chosen attention_forward version cannot run (version 4, the default, needs a multiple
    of 4) is refused before anything is allocated, with the versions that run it instead."""
    if not kernels.uses("attention_forward"):
        return
    op = ops_registry.get("attention_forward")
    # the versions' requires() read the shapes only: a broadcast zero stands in for the (B, T, 3C) input
    shaped = {"inp": np.broadcast_to(np.float32(0), (B, T, 3 * cfg.channels)), "NH": cfg.num_heads}

    def problem(number):
        version = op.versions[number]
        if version.requires is None:
            return None
        try:
            return version.requires(shaped, None)
        except Exception:   # a check this stand-in cannot answer: the launch checks again
            return None

    chosen = kernels.version("attention_forward")
    why = problem(chosen)
    if why is None:
        return
    others = [str(n) for n, v in op.versions.items() if n != chosen and v.available and problem(n) is None]
    instead = f"--attention-forward-kernel {' or '.join(others)}, " if others else ""
    raise SystemExit(f"error: attention_forward version {chosen}: {why}; change -t to suit it, or use "
                     f"{instead}or flash attention (--fused)")


def train(args) -> int:
    """One run of the trainer; TF32 (``--tf32``) is on for this run only and restored on return."""
    with contextlib.ExitStack() as scope:
        return _train(args, scope)


def batch_shape(args, state=None) -> tuple[int, int]:
    """B and T: as given; else, when resuming, the state's (its data position counts batches of
    that shape, so ``--resume STATE`` alone continues the run); else llm.c's defaults."""
    saved = None
    if state is not None:
        saved = state.loaders.get("train") if isinstance(state.loaders, dict) else None
        shape = [saved.get(key) if isinstance(saved, dict) else None for key in ("B", "T")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
            raise ckpt.CheckpointError(f"{args.resume}: cannot resume from it: its data position (loaders.train) has "
                                       f"no batch shape (B={shape[0]!r}, T={shape[1]!r}); damaged?")
        # the data position counts batches of the saved shape: another shape cannot continue it
        given = [f"{flag} {getattr(args, name)}" for flag, name, key in (("-b", "batch_size", "B"), ("-t", "seq_len", "T"))
                 if getattr(args, name) is not None and getattr(args, name) != saved[key]]
        if given:
            raise SystemExit(f"error: --resume {args.resume} continues a run at -b {saved['B']} -t {saved['T']}, "
                             f"not {' '.join(given)}: leave out -b and -t (a resumed run keeps the state's batch shape)")
    for name, key, default in (("batch_size", "B", DEFAULT_B), ("seq_len", "T", DEFAULT_T)):
        if getattr(args, name) is None:
            setattr(args, name, saved[key] if saved is not None else default)
    return args.batch_size, args.seq_len


def _train(args, scope: contextlib.ExitStack) -> int:
    if args.backend:
        _backend.set_backend(args.backend)
    state = ckpt.load_training_state(args.resume) if args.resume else None
    B, T = batch_shape(args, state)
    if B < 1 or T < 1:
        raise SystemExit(f"error: -b and -t must be positive (got {B}, {T})")
    run = mainline.setup(args)   # processes, -d/-x/-o...; ranks other than 0 print nothing
    if args.steps is not None and args.steps < 0:
        raise SystemExit(f"error: --steps must not be negative (got {args.steps})")
    if not math.isfinite(args.lr) or args.lr < 0:
        raise SystemExit(f"error: -l/--lr must be a finite number >= 0 (got {args.lr:g})")
    check_counts(args)
    check_outputs(args, run)
    kernels = kernel_choice(args)
    cfg, params, source = load_model(args, state)
    if T > cfg.max_seq_len:
        raise SystemExit(f"error: -t {T} is larger than the model's context (max_seq_len = {cfg.max_seq_len})")
    check_attention_shape(kernels, cfg, B, T)
    tf32 = scope.enter_context(blas.tf32(bool(args.tf32)))  # scoped: a later test or run starts with it off

    from .data import DataLoader
    from .sampling import XorShiftRNG

    # every token file is scanned once here: an id outside the vocabulary is named by file and offset
    V = cfg.vocab_size
    try:
        train_loader = DataLoader(args.train_data, B, T, shuffle=True, vocab_size=V, **run.loader_kwargs(train=True))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}; prepare Tiny Shakespeare (python -m llmcupy.data tinyshakespeare) "
                                "or give your token files with -i") from None
    validate = not args.benchmark and args.val_every > 0
    try:
        val_loader = (DataLoader(args.val_data, B, T, shuffle=False, vocab_size=V, **run.loader_kwargs(train=False))
                      if validate else None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc} (the validation data); give it with -j, or train without validation: "
                                "-v 0") from None
    train_num_batches = args.steps if args.steps is not None else train_loader.num_tokens // run.tokens_per_step
    val_num_batches = 0 if val_loader is None else min(val_loader.num_tokens // (B * T * run.world),
                                                       args.val_max_steps)
    # a tokenizer the user named must load before any work is done
    tokenizer = None if args.sample_every <= 0 or args.benchmark else load_tokenizer(args)
    if args.sample_every > 0 and not args.benchmark:
        check_vocab_has_eot(cfg, source, "turn samples off with -s 0")
    if tokenizer is not None:
        check_tokenizer_covers(tokenizer, V, args.tokenizer or getattr(args, "bpe", None) or (
            DEFAULT_TOKENIZER if os.path.exists(DEFAULT_TOKENIZER) else "tiktoken's GPT-2 encoding"))

    if args.sample_every > 0 and not args.benchmark and args.gen_len > T:
        # generate() fills one row of the B x T batch, as llm.c does: T tokens, the start token included
        print(f"note: -g {args.gen_len} is longer than -t {T}: each sample stops at {T} tokens (the start "
              f"token and {T - 1} generated)")
    model = GPT2(cfg, params, kernels)
    run.sync_params(model)
    run.start(train_num_batches)
    rng = XorShiftRNG(1337)
    start_step = 0
    kept = None   # which saved state is left as it was, for the message of a non-finite loss or Ctrl-C
    if state is not None:
        try:
            train_loader.load_state_dict(state.loaders["train"])
            if state.rng:
                rng.load_state_dict(state.rng)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:   # damaged metadata
            raise ckpt.CheckpointError(f"{args.resume}: cannot resume this run from it ({type(exc).__name__}: "
                                       f"{exc})") from exc
        if state.m is not None:
            model.m, model.v = _backend.asarray(state.m).copy(), _backend.asarray(state.v).copy()
        start_step = state.step
        if start_step > train_num_batches:
            raise SystemExit(f"error: {args.resume} is at step {start_step}, past this run's last step "
                             f"{train_num_batches}; give a larger --steps")
        source = f"resumed from {args.resume} at step {start_step}"
    if args.resume_latest or args.checkpoint_every:
        start_step = run.resume(model, train_loader, rng)
        if start_step > train_num_batches:
            raise SystemExit(f"error: the newest checkpoint in {run.out_dir} is at step {start_step}, past this "
                             f"run's last step {train_num_batches}; give a larger -x")
        if run.resumed:
            source = f"{source}, resumed from {run.out_dir} at step {start_step}"
            kept = run.kept_text(start_step)

    print_table([
        ("train data", args.train_data), ("val data", args.val_data), ("log file", args.log or "NULL"),
        ("batch size B", B), ("sequence length T", T), ("learning rate", args.lr),
        ("val_loss_every", args.val_every), ("val_max_steps", args.val_max_steps),
        ("sample_every", args.sample_every), ("genT", args.gen_len),
        ("backend", _backend.get_backend()), ("device", _backend.device_name()),
        ("TF32", "enabled" if tf32 else "disabled"), (None, None),
        ("model", source), ("max_seq_len", cfg.max_seq_len), ("vocab_size V", cfg.vocab_size),
        ("padded_vocab_size Vp", cfg.padded_vocab_size), ("num_layers L", cfg.num_layers),
        ("num_heads NH", cfg.num_heads), ("channels C", cfg.channels),
        ("num_parameters", model.num_parameters()), (None, None),
        ("train_num_batches", train_num_batches), ("val_num_batches", val_num_batches),
        *run.table_rows(),
    ])
    print("kernel versions:")
    for op, n, summary in kernels.table():
        print(f"  {op:<20} {n:>3}  {summary}" + ("  [measured]" if kernels.origin(op) == "measured" else ""))
    print(f"kernel defaults: {defaults_note(kernels, args)}")
    precompile(kernels)
    if args.cuda_graph:
        print("CUDA graph: the training step is captured at the first step and replayed after it"
              + (" (CPU emulator: no graphs; the same graph-safe step runs eagerly)" if _backend.is_sim() else ""))
    model.allocate(B, T)
    print(f"allocated {model.num_parameters() * 4 / 2**20:.0f} MiB for model parameters")
    acts = sum(a.size for a in model.acts.values())
    print(f"allocated {acts * 4 / 2**20:.0f} MiB for activations")

    if args.benchmark:
        return benchmark(model, train_loader, args, run)

    if args.save_path is not None:
        remove_stale_temporaries(args.save_path)
    resumed = state is not None or run.resumed
    logger = Logger(args.log, resume_step=start_step if resumed else None)
    if state is not None:
        kept = f"the state resumed from, {args.resume} at step {start_step}, is unchanged"
    total_ms = 0.0
    timed_steps = 0
    graph = None
    step = start_step   # named by an interrupt's message
    try:
        for step in range(start_step, train_num_batches + 1):
            last = step == train_num_batches
            if val_loader is not None and args.val_every > 0 and (step % args.val_every == 0 or last):
                val_loader.reset()
                val_loss = 0.0
                for _ in progress(range(val_num_batches), "validation"):
                    x, y = val_loader.next_batch()
                    val_loss += model.forward(x, y)
                val_loss /= max(val_num_batches, 1)
                val_loss = run.mean(val_loss)
                check_loss(val_loss, step, "validation", kept)
                print(f"val loss {val_loss:f}")
                logger.log(step, "tel", val_loss)
            if args.sample_every > 0 and ((step > 0 and step % args.sample_every == 0) or last):
                generate(model, rng, tokenizer, args.gen_len)
            if last:
                if args.save_at_end:
                    save_state(model, train_loader, rng, step, args.save_path, kept)
                break
            t0 = time.perf_counter()
            x, y = train_loader.next_batch()
            if run.mainline:  # micro-steps, collectives, norm and clipping, scheduled update
                loss = run.step(model, train_loader, x, y, step)
                check_loss(loss, step + 1, "train", kept)
            elif args.cuda_graph:  # the loss is read after the whole step (the update included)
                loss, graph = graph_step(model, graph, x, y, args, step + 1)
                check_loss(loss, step + 1, "train", kept)
            else:  # the loss is read once, after the update: no synchronisation inside the step
                loss = model.train_step(x, y, args.lr, 0.9, 0.999, 1e-8, args.weight_decay, step + 1)
                check_loss(loss, step + 1, "train", kept)   # the number its step line would have
            _backend.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            total_ms += ms
            timed_steps += 1
            print(f"step {step + 1:4d}/{train_num_batches}: train loss {loss:f} ({ms:f} ms, "
                  f"{int(run.tokens_per_step / (ms / 1e3))} tok/s){run.suffix()}")
            logger.log(step, "trl", loss)
            if args.save_every and (step + 1) % args.save_every == 0:
                save_state(model, train_loader, rng, step + 1, args.save_path, kept)
                kept = f"the last state saved is in {args.save_path}, at step {step + 1}"
            if run.maybe_checkpoint(model, train_loader, rng, step + 1, kept):
                kept = run.kept_text(step + 1)
    except KeyboardInterrupt as exc:
        if exc.args:   # raised by save_state after a completed save: its message says so
            raise
        # as for a non-finite loss: say which saved state a --resume would continue from
        raise KeyboardInterrupt(f"during step {step + 1} ({kept or 'no training state was saved by this run'})") from None
    finally:
        logger.close()
    if timed_steps:
        # llm.c's FP32 trainer averages over every step, the first included (mainline leaves it out)
        print(f"total average iteration time: {total_ms / timed_steps:f} ms")
    if _backend.is_sim():
        print("(times are the CPU emulator's, not a GPU's)")
    return 0


def save_state(model: GPT2, loader, rng, step: int, path: str, kept: str | None = None) -> None:
    """Saves atomically; ``kept`` says which earlier state is left as it was (for a failed write's
    message, as for a non-finite loss)."""
    params = model.params_numpy()
    if not np.isfinite(params).all():
        # the update diverged (the gradients overflowed) although the loss was still finite
        raise FloatingPointError(f"the parameters are not finite after step {step}; not saving them "
                                 f"({path} is left as it was)")
    state = ckpt.TrainingState(
        config=model.config,
        params=params, step=step,
        m=None if model.m is None else _backend.to_numpy(model.m),
        v=None if model.v is None else _backend.to_numpy(model.v),
        loaders={"train": loader.state_dict()}, rng=rng.state_dict())
    # A Ctrl-C during the write must neither tear the file nor be lost: the write is atomic, and a
    # SIGINT that arrives meanwhile is recorded and acted on (KeyboardInterrupt: exit 130) once
    # the complete file is in place.
    pending = []
    previous = None
    if _in_main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        ckpt.save_training_state(path, state)
    except OSError as exc:
        # a write error (a full disk) names no file: say which save failed and what is left
        from ._cli import message

        where = kept or "no earlier state was saved by this run"
        # atomic_write names the file it saves; this message names it already
        names_path = exc.filename is not None and os.path.abspath(exc.filename) == os.path.abspath(path)
        reason = exc.strerror if names_path and exc.strerror else message(exc)
        raise OSError(f"--save-path {path}: saving the training state at step {step} failed "
                      f"({reason}); {where}") from exc
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    print(f"saved the training state at step {step} to {path}", flush=True)
    if pending:
        raise KeyboardInterrupt(f"while saving step {step} (the save completed: --resume {path} continues "
                                f"the run)")


def remove_stale_temporaries(path: str) -> None:
    """Deletes the hidden temporaries an earlier run killed mid-save left beside ``path`` (as big
    as the state itself; see :func:`llmcupy.fileio.atomic_write` for their names)."""
    from .fileio import remove_stale_temporaries as remove, temporaries_of

    remove([temporaries_of(path)])


def progress(iterable, desc: str):
    """A progress bar on a terminal (tqdm's disable=None: none when stderr is not a TTY, so logs
    get no \\r clutter), on rank 0 only (ranks sharing a terminal would draw over one another);
    the plain iterable otherwise."""
    if distributed.RANK != 0:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, leave=False, disable=None, file=sys.stderr)


def defaults_note(kernels: KernelChoice, args) -> str:
    """Where the versions no flag chose come from: measurements on this GPU, or llm.c's choices."""
    from . import defaults

    if kernels.measured_on is not None:
        return (f"[measured] = the fastest version measured on {kernels.measured_on} ({defaults.display_path()}); "
                "the others are chosen by a flag or are the catalogue's defaults (llm.c's choices but where "
                "python -m llmcupy.kernel --list says why not)")
    if getattr(args, "kernel_defaults", "catalogue") == "catalogue":
        return "the catalogue's (llm.c's choices but where --list says why not), as --kernel-defaults catalogue asks"
    return (f"the catalogue's (llm.c's choices but where --list says why not; not measured): "
            f"{defaults.display_path()} has no measurement for {_backend.device_name()}")


def precompile(kernels: KernelChoice) -> None:
    """Builds every kernel file the step uses before the first step, so that no step's time
    includes a compile; says so while it happens (minutes in the emulator on a first run)."""
    from .runtime.module import load_kernel_file

    files = {}
    for op in STEP_OPS:
        if not kernels.uses(op):   # a fusion not selected, or an op a selected fusion replaces
            continue
        # with the template instances the op launches (its NAME_EXPRESSIONS, as the NVRTC check reads
        # them): the module the launches will look up, not a second build of the same file
        source = ops_registry.get(op).source   # imports the op's module if it is not yet
        names = tuple(getattr(sys.modules.get(f"{ops_registry.__name__}.{op}"), "NAME_EXPRESSIONS", ()))
        files[(source, names)] = None
    print("compiling kernels (first run, cached afterwards)...", flush=True)
    t0 = time.perf_counter()
    for source, names in progress(list(files), "compiling"):
        load_kernel_file(source, name_expressions=names).compile()
    print(f"kernels ready ({time.perf_counter() - t0:.1f} s)", flush=True)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def graph_step(model: GPT2, graph, x, y, args, t: int):
    """--cuda-graph: step t (1-based) by the step graph, made and captured at the first call
    (that step runs eagerly as the capture's warm-up), replayed after. Returns (loss, graph)."""
    if graph is None:
        graph = model.step_graph(args.lr, 0.9, 0.999, 1e-8, args.weight_decay, t=t)
    model.set_batch(x, y)
    return graph.step(), graph


def benchmark(model: GPT2, loader, args, run=None) -> int:
    """One fixed batch, no validation or sampling: warm-up steps, then timed steps."""
    B, T = model.B, model.T
    # every rank's tokens, as the training loop's step line and llm.c count them (not this rank's B*T)
    tokens = run.tokens_per_step if run is not None else B * T
    world = run.world if run is not None else 1
    x, y = loader.next_batch()
    steps = args.steps if args.steps is not None else 10
    times = []
    graph = None
    launches = []
    for i in range(args.warmup + steps):
        launches_before = launch_count()
        t0 = time.perf_counter()
        if args.cuda_graph:  # the first step captures (a warm-up step unless --warmup 0), then replays
            loss, graph = graph_step(model, graph, x, y, args, i + 1)
            check_loss(loss, i + 1, "train")
        elif run is not None and run.mainline:   # e.g. through NCCL at world size 1
            loss = run.step(model, loader, x, y, i)
            check_loss(loss, i + 1, "train")
        else:
            loss = model.train_step(x, y, args.lr, 0.9, 0.999, 1e-8, args.weight_decay, i + 1)
            check_loss(loss, i + 1, "train")
        _backend.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if i >= args.warmup:
            times.append(ms)
            launches.append(launch_count() - launches_before)
            print(f"step {i - args.warmup + 1:4d}/{steps}: train loss {loss:f} ({ms:f} ms, {int(tokens / (ms / 1e3))} tok/s)")
    mean, best = float(np.mean(times)), float(np.min(times))
    print(f"benchmark: B={B} T={T}" + (f" on each of {world} ranks" if world > 1 else "")
          + f", {steps} steps after {args.warmup} warm-up: mean {mean:.3f} ms/step, "
          f"min {best:.3f} ms/step, {tokens / (mean / 1e3):.0f} tok/s"
          + (" with the CUDA graph" + (" (emulated: eager launches)" if graph.emulated else "")
             if args.cuda_graph else ""))
    replayed = args.cuda_graph and graph is not None and not graph.emulated
    print(f"launches per step: {max(launches)} kernel launches"
          + (" from the host (the graph replay launches the captured kernels itself)" if replayed
             else " (catalogue kernels; cuBLAS calls not included)"))
    if _backend.is_sim():
        print("(times are the CPU emulator's, not a GPU's)")
    return 0


@one_line_warnings
def main(argv=None) -> int:
    try:
        rc = _main(argv)
    except BaseException as exc:
        if distributed.ACTIVE is not None and distributed.ACTIVE.world_size > 1:
            import traceback

            traceback.print_exc()          # before MPI_Abort ends this process
            distributed.abort_active(1)
        elif isinstance(exc, SystemExit):
            if exc.code:                   # argparse has said why
                _mpi_launch.abort_unjoined(exc.code)
        else:                              # a broken import (tiktoken) or a bug: the traceback, then the abort
            _mpi_launch.abort_unjoined_after(exc)
        raise
    if rc:
        distributed.abort_active(rc)   # the other ranks would wait for this one until the timeout
        _mpi_launch.abort_unjoined(rc)
    return rc


def _main(argv=None) -> int:
    from .sim.compiler import CompilerNotFound   # no g++ for the emulator: set-up, exit 2

    from ._cli import fail
    from .tokenizer import TokenizerError

    args = build_parser().parse_args(argv)
    try:
        return train(args)
    except (ops_registry.OpError, ModelError, FileFormatError, OSError, TokenizerError,
            _backend.BackendError, CompilerNotFound) as exc:
        return fail(exc)   # FileFormatError: bad model, state, token or tokenizer files; OSError: unreadable
    except DeviceLimitError as exc:   # a block size this GPU cannot hold for one of the step's kernels
        print(f"error: {exc} (with --kernel OP=VERSION:BLOCK_SIZE)", file=sys.stderr)
        return 2
    except SystemExit as exc:
        if isinstance(exc.code, str):   # an "error: ..." about the arguments: exit 2, as argparse does
            print(exc.code, file=sys.stderr)
            return 2
        raise
    except FloatingPointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except distributed.PeerTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4
    except distributed.DistError as exc:
        if isinstance(exc, (mainline.RunError, distributed.FlagMismatch)):
            # found the same way by every rank (flags, -d, -o): rank 0 says it, every rank exits by itself
            distributed.ACTIVE = None
            if _rank() != 0:
                return 2
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted {exc}".rstrip(), file=sys.stderr)
        return 130
    except Exception as exc:
        if "OutOfMemory" not in type(exc).__name__:
            raise
        # a scratch buffer inside an op (the model's own buffers already say which they are)
        print(f"error: out of GPU memory during a step ({exc}); try a smaller batch (-b) or sequence "
              "length (-t)", file=sys.stderr)
        return 2


def _rank() -> int:
    return distributed.RANK


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
