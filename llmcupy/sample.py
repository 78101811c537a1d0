"""python -m llmcupy.sample: generate text from a checkpoint and a prompt, the trainer's way.

    python -m llmcupy.sample -e gpt2_124M.bin --prompt "ROMEO:" -n 64
    python -m llmcupy.sample -e llmcupy_train_state.npz -n 64   # a model you trained (its training state)
    python -m llmcupy.sample --init d2 -n 16 --backend sim      # a random tiny model

Each new token runs a full forward pass over a (1, T) window (by default as long as the prompt and the
tokens to generate need, up to the model's context) and samples the last position's logits
with llm.c's rule (temperature 1, no top-k, xorshift RNG seeded 1337 by default); ``--stop-at-eot`` ends
the sample where the model emits <|endoftext|> (llm.c prints it and goes on). The prompt is
encoded with tiktoken's GPT-2 encoding (``--bpe FILE`` or ``LLMCUPY_GPT2_BPE`` offline); without a
prompt, generation starts from <|endoftext|> as in the trainer. Tokens are decoded as the trainer does:
``--tokenizer FILE`` (llm.c's gpt2_tokenizer.bin), else gpt2_tokenizer.bin in the working directory if
present, else the tiktoken encoding; with none of them (offline, no prompt) the token ids are printed.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from . import checkpoint as ckpt
from ._cli import fail, one_line_warnings
from .config import PRESETS, GPT2Config, init_params
from .fileio import FileFormatError
from .model import GPT2, ModelError
from .runtime import backend as _backend
from .sampling import XorShiftRNG, sample_mult
from .tokenizer import TokenizerError, Tokenizer, get_encoding, write_sample_piece

EOT = 50256


@one_line_warnings
def main(argv=None) -> int:
    from .sim.compiler import CompilerNotFound   # no g++ for the emulator: set-up, exit 2

    ap = argparse.ArgumentParser(prog="python -m llmcupy.sample", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("-e", "--checkpoint", default=None, help="llm.c model .bin or a training state .npz written by the trainer "
                     "(default gpt2_124M.bin)")
    src.add_argument("--init", choices=sorted(PRESETS), help="a random-init model of this shape")
    ap.add_argument("--prompt", default="", help="text to continue")
    ap.add_argument("-n", "--num-tokens", type=int, default=64, help="tokens to generate")
    ap.add_argument("-t", "--seq-len", type=int, default=None, help="context window (default: what the prompt and -n "
                    "tokens need, up to the model's context; the same logits as a longer window up to rounding, "
                    "sooner)")
    ap.add_argument("--seed", type=int, default=1337, help="xorshift RNG seed (llm.c: 1337)")
    ap.add_argument("--stop-at-eot", action="store_true", help="end the sample at <|endoftext|> (not printed), where the "
                    "model would start another document (llm.c prints it and goes on)")
    ap.add_argument("--bpe", default=None, help="gpt2.tiktoken file for offline tokenisation")
    ap.add_argument("--tokenizer", default=None, help="llm.c tokenizer .bin to decode with (default "
                    "gpt2_tokenizer.bin if present, else tiktoken's GPT-2 encoding; a prompt still needs tiktoken)")
    ap.add_argument("--backend", choices=_backend.CHOICES, default=None)
    args = ap.parse_args(argv)
    if args.num_tokens < 0:
        ap.error(f"-n/--num-tokens must not be negative (got {args.num_tokens})")
    if args.seed % 2**64 == 0:   # the RNG keeps 64 bits; xorshift's zero state is a fixed point
        ap.error(f"--seed {args.seed}: xorshift's state 0 never changes, so every token would be the "
                 "vocabulary's first; give a nonzero seed")
    if args.seq_len is not None and args.seq_len < 1:
        ap.error(f"-t/--seq-len must be positive (got {args.seq_len})")
    # bytes of argv that are not UTF-8 reach Python as surrogate escapes; tiktoken would encode each as U+FFFD
    bad = next((i for i, ch in enumerate(args.prompt) if "\udc80" <= ch <= "\udcff"), None)
    if bad is not None:
        ap.error(f"--prompt: byte {ord(args.prompt[bad]) - 0xdc00:#04x} at character {bad} is not UTF-8; give the "
                 "text in UTF-8 (a terminal or file in another encoding sends other bytes)")
    try:
        if args.backend:
            _backend.set_backend(args.backend)
        if args.init:
            cfg = GPT2Config.preset(args.init)
            params = init_params(cfg, seed=0)
        else:
            path = args.checkpoint or "gpt2_124M.bin"
            if not os.path.exists(path):
                from .train import missing_model_message

                raise FileNotFoundError(missing_model_message(path))
            cfg, params, _ = ckpt.read_model_any(path)
            ckpt.check_finite_params(path, cfg, params)
            from .train import check_vocab_has_eot

            check_vocab_has_eot(cfg, path, "this command samples GPT-2's vocabulary")
        # the prompt needs tiktoken's encoder; decoding only needs a token table, which may come
        # from llm.c's tokenizer file, so an offline run without a prompt still works
        enc = get_encoding(args.bpe) if args.prompt else None
        prompt = enc.encode(args.prompt, allowed_special={"<|endoftext|>"}) if enc else []
        tokenizer = decoding_tokenizer(args, enc)
        if tokenizer is not None and len(tokenizer) < cfg.vocab_size:
            raise TokenizerError(f"{args.tokenizer or 'the tokenizer'} has {len(tokenizer)} tokens, fewer than "
                                 f"the model's vocabulary of {cfg.vocab_size}: give the model's tokenizer")
        generate(cfg, params, [EOT] + prompt, args.num_tokens, args.seq_len, args.seed, tokenizer,
                 stop_at_eot=args.stop_at_eot)
        return 0
    except (ModelError, FileFormatError, OSError, TokenizerError, _backend.BackendError, CompilerNotFound) as exc:
        return fail(exc)   # bad or missing model file, tokenizer, shape: 2


def decoding_tokenizer(args, enc) -> Tokenizer | None:
    """The token table to print samples with, chosen as the trainer does. A file the user named must
    load (an error); without one, no table at all prints token ids, as llm.c does."""
    if args.tokenizer:
        return Tokenizer.load(args.tokenizer)
    if enc is not None or args.bpe:
        return Tokenizer.from_encoding(enc if enc is not None else get_encoding(args.bpe))
    try:
        from .train import DEFAULT_TOKENIZER   # llm.c's decoder table, where the trainer looks for it

        if os.path.exists(DEFAULT_TOKENIZER):
            return Tokenizer.load(DEFAULT_TOKENIZER)
        return Tokenizer.from_encoding(get_encoding())
    except (OSError, FileFormatError, TokenizerError) as exc:
        print(f"note: no tokenizer ({exc}); printing token ids", file=sys.stderr)
        return None


def generate(cfg: GPT2Config, params: np.ndarray, context: list[int], n: int, T: int | None, seed: int,
             tokenizer: Tokenizer | None, stop_at_eot: bool = False) -> list[int]:
    if T is None:
        # the longest window the run reads (the prompt and every token but the last), up to the model's
        # context: a forward pass costs T positions, and a causal model's logits at one position do not
        # depend on what fills the positions after it, so a shorter window samples the same tokens (GPT-2
        # 124M in the emulator: seconds a token for a short sample where the full 1024 took about 45).
        # Up to rounding: a GEMM library may pick another algorithm for another row count, and a logit's
        # last bit then differs, which changes a token only where the draw falls on that boundary
        needed = len(context) + max(n, 1) - 1
        T = min(cfg.max_seq_len, -(-needed // 4) * 4)
    if T > cfg.max_seq_len:
        raise ModelError(f"-t {T} is larger than the model's context (max_seq_len = {cfg.max_seq_len})")
    # the forward pass needs T % 4 == 0 for the attention softmax; keep the window a multiple of 4
    asked, T = T, max(4, T - T % 4)
    if T != asked:   # said, not done silently: the user chose the window
        print(f"note: -t {asked} is not a multiple of 4 (the default attention kernel needs one); the "
              f"context window is {T}", file=sys.stderr)
    if len(context) > T:   # the window slides over it as over the generated tokens: said, not done silently
        print(f"note: the prompt is {len(context)} tokens (with the leading <|endoftext|>), more than the context "
              f"window of {T}; the model sees only its last {T}", file=sys.stderr)
    model = GPT2(cfg, params)
    rng = XorShiftRNG(seed)
    tokens = list(context)
    if tokenizer is not None and len(tokens) > 1:
        sys.stdout.write(tokenizer.decode(tokens[1:]))
    out = []
    for _ in range(n):
        window = tokens[-T:]
        batch = np.full((1, T), EOT, dtype=np.int32)
        batch[0, : len(window)] = window
        model.forward(batch)
        logits = _backend.to_numpy(model.logits()[0, len(window) - 1]).astype(np.float32)
        nxt = sample_mult(logits, rng.random_f32())
        if stop_at_eot and nxt == EOT:
            sys.stdout.write("\n")
            sys.stdout.flush()
            print(f"note: <|endoftext|> after {len(out)} token{'s' * (len(out) != 1)}; stopped (--stop-at-eot)",
                  file=sys.stderr)
            return out
        tokens.append(nxt)
        out.append(nxt)
        write_sample_piece(nxt, tokenizer)
    sys.stdout.write("\n")
    return out


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
