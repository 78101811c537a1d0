"""python -m llmcupy.torch_gpt2: GPT-2 in PyTorch (CPU, FP32) over llm.c's flat parameter layout, the trainer's oracle.

It computes what llm.c's PyTorch script computes: logits over the padded vocabulary, the mean
cross-entropy over the V real columns, and gradients laid out like the parameters; and it writes
the correctness gate's inputs (a model .bin and a debug-state .bin) for any config and seed::

    python -m llmcupy.torch_gpt2 --init d2 --B 4 --T 64 --out-model m.bin --out-state s.bin \\
        [--data data/tinyshakespeare/tiny_shakespeare_val.bin] [--seed 0]

Needs ``torch`` (the optional ``torch`` extra; the CPU build is enough).
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from .config import GPT2Config, init_params, param_shapes
from ._cli import one_line_warnings


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError("this needs PyTorch: pip install 'llmcupy[torch]' (the CPU build is enough)") from exc
    return torch


def _views(flat, cfg: GPT2Config) -> dict:
    out, offset = {}, 0
    for name, shape in param_shapes(cfg).items():
        n = int(np.prod(shape))
        out[name] = flat[offset:offset + n].view(*shape)
        offset += n
    return out


def forward(flat, cfg: GPT2Config, idx, targets=None):
    """Logits (B, T, Vp) and, with targets, the mean loss; ``flat`` is a torch tensor of parameters."""
    torch = _torch()
    F = torch.nn.functional
    p = _views(flat, cfg)
    B, T = idx.shape
    C, NH = cfg.channels, cfg.num_heads
    hs = C // NH
    x = p["wte"][idx] + p["wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(cfg.num_layers):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + (y @ p["attprojw"][l].T + p["attprojb"][l])
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + (h @ p["fcprojw"][l].T + p["fcprojb"][l])
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = x @ p["wte"].T
    loss = None
    if targets is not None:
        V = cfg.vocab_size
        loss = F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))
    return logits, loss


def forward_backward(params: np.ndarray, cfg: GPT2Config, x: np.ndarray, y: np.ndarray):
    """(logits (B,T,Vp), loss, grads like params) as NumPy, from one forward/backward in FP32."""
    torch = _torch()
    flat = torch.tensor(params, dtype=torch.float32, requires_grad=True)
    logits, loss = forward(flat, cfg, torch.tensor(x, dtype=torch.long), torch.tensor(y, dtype=torch.long))
    loss.backward()
    return logits.detach().numpy(), float(loss.item()), flat.grad.numpy().copy()


def adamw_losses(params: np.ndarray, cfg: GPT2Config, x, y, steps=10, lr=1e-4, beta1=0.9, beta2=0.999,
                 eps=1e-8, weight_decay=0.01):
    """Losses of ``steps`` AdamW steps on one batch with torch.optim.AdamW (llm.c's update rule:
    decoupled weight decay on every parameter), and the final parameters."""
    torch = _torch()
    flat = torch.tensor(params, dtype=torch.float32, requires_grad=True)
    opt = torch.optim.AdamW([flat], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    xt, yt = torch.tensor(x, dtype=torch.long), torch.tensor(y, dtype=torch.long)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        _, loss = forward(flat, cfg, xt, yt)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, flat.detach().numpy().copy()


@one_line_warnings
def main(argv=None) -> int:
    from .config import PRESETS

    ap = argparse.ArgumentParser(prog="python -m llmcupy.torch_gpt2",
                                 description="Write the correctness gate's inputs from PyTorch (FP32, CPU).")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--init", default="d2", choices=list(PRESETS), help="a preset for a random-init model")
    src.add_argument("--model", help="an llm.c model .bin to start from instead")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--data", help="llm.c token file; the first B*T+1 tokens form the batch (default: random tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-model", required=True)
    ap.add_argument("--out-state", required=True)
    ap.add_argument("--out-losses", help="also write the losses of 10 torch.optim.AdamW steps (the gate's "
                    "settings) as JSON, for test_gpt2 --expected-losses")
    args = ap.parse_args(argv)
    if args.B < 1 or args.T < 1:
        ap.error(f"--B and --T must be positive (got {args.B}, {args.T})")
    # --seed -1 would stop in NumPy's seeding with a traceback
    problem = f"--seed must be >= 0 (got {args.seed})" if args.seed < 0 else _output_problem(args)
    if problem:   # before PyTorch runs the model
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from .fileio import FileFormatError

    try:
        return _write_gate_inputs(args)
    except (FileFormatError, OSError) as exc:   # a bad, missing or unreadable --model or --data file
        from ._cli import fail

        return fail(exc)


def _output_problem(args) -> str | None:
    """Why an output cannot be written: a folder (reported as a hidden temporary file), a path under a
    file, two outputs on one file, or an output on an input (--out-model on --data replaced the
    token file by a model file)."""
    import os

    from .fileio import output_path_problem

    outputs = [("--out-model", args.out_model), ("--out-state", args.out_state), ("--out-losses", args.out_losses)]
    inputs = [(flag, path) for flag, path in (("--model", args.model), ("--data", args.data)) if path]
    seen = {}
    for flag, path in outputs:
        if not path:
            continue
        key = os.path.abspath(path)
        if key in seen:
            return f"{seen[key]} and {flag} both name {path}; give different files"
        seen[key] = flag
        why = output_path_problem(path, makes_folders=True)   # atomic writes, which make missing folders
        if why:
            return f"{flag} {path}: {why}"
        for source, read in inputs:
            if os.path.exists(path) and os.path.exists(read) and os.path.samefile(path, read):
                return f"{flag} {path} is the file {source} reads; writing there would replace it. Give another file"
    return None


def _write_gate_inputs(args) -> int:
    from . import checkpoint

    if args.model:
        cfg, params, _ = checkpoint.read_model_any(args.model)
    else:
        cfg = GPT2Config.preset(args.init)
        params = init_params(cfg, seed=args.seed)
    if args.T > cfg.max_seq_len:
        print(f"error: T={args.T} is larger than the model's context {cfg.max_seq_len}", file=sys.stderr)
        return 2
    n = args.B * args.T + 1
    if args.data:
        from .data import read_tokens

        tokens = read_tokens(args.data)[:n].astype(np.int32)
        if tokens.size < n:
            print(f"error: {args.data} has {tokens.size} tokens, the batch needs {n}", file=sys.stderr)
            return 2
        if tokens.max() >= cfg.vocab_size:
            print(f"error: {args.data} holds token id {int(tokens.max())}, outside the model's vocabulary "
                  f"[0, {cfg.vocab_size})", file=sys.stderr)
            return 2
    else:
        tokens = np.random.default_rng(args.seed).integers(0, cfg.vocab_size, n).astype(np.int32)
    x = tokens[:-1].reshape(args.B, args.T)
    y = tokens[1:].reshape(args.B, args.T)
    logits, loss, grads = forward_backward(params, cfg, x, y)
    checkpoint.write_model(args.out_model, cfg, params)
    checkpoint.write_debug_state(args.out_state, x, y, logits[..., : cfg.vocab_size], loss, grads)
    if args.out_losses:
        import json

        from .fileio import atomic_write

        losses, _ = adamw_losses(params, cfg, x, y)
        with atomic_write(args.out_losses) as f:
            f.write(json.dumps(losses).encode())
    print(f"wrote {args.out_model} ({cfg.num_layers} layers, C={cfg.channels}) and {args.out_state} "
          f"(B={args.B}, T={args.T}, loss {loss:.6f})")
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
