"""llm.c mainline's training controls on top of the FP32 trainer: data parallel over processes,
gradient accumulation, learning-rate schedule, clipping, ZeRO-1, checkpoint folders and resume.

Flags (llm.c's letters where it has them):

* ``-d`` total batch size in tokens: ``micro_steps = d / (B * T * world_size)`` forward/backward
  passes per step, their gradients summed (must divide evenly);
* ``-x`` max steps (``--steps``; -1: one epoch), ``-u`` warm-up steps, ``-q`` final learning-rate
  fraction, ``-k`` schedule (cosine, linear, constant, wsd; see :mod:`llmcupy.schedule`);
* ``-c`` weight decay on the 2-D weights only (wte, wpe, qkvw, attprojw, fcw, fcprojw), as mainline;
  the FP32 trainer's ``--weight-decay`` applies to every parameter (the two are exclusive);
* ``--grad-clip F``: clip the gradients' global norm to F (mainline: 1.0; the FP32 trainer: 0, off);
  the norm (op ``global_norm``) is printed per step whenever these controls are on;
* ``-z 0|1`` ZeRO stage: 1 shards AdamW's m and v and the update over the ranks
  (reduce-scatter of the gradients, update of the own shard, all-gather of the parameters);
* ``-o DIR -n N``: a checkpoint every N steps into DIR: ``model_%08d.bin`` (llm.c model file,
  readable with ``-e``), one ``state_%08d_%05d.npz`` per rank (its m/v or their shard, its data
  loader and sampling RNG), then ``DONE_%08d`` once every rank has written (each file atomic, so a
  checkpoint without its DONE is ignored); ``-nk K`` keeps the last K (0: all); ``-y 1`` resumes
  from the newest complete checkpoint in DIR (starts fresh if there is none); without ``-y 1``,
  ``-n`` into a folder holding complete checkpoints is refused (it would overwrite them).

**The ``-o`` rule.** ``-o PATH`` names the log file (the FP32 trainer's meaning) unless PATH is a
directory: an existing directory, a path ending in ``/``, or any path when ``-n`` or ``-y`` is
given. In directory mode the log is ``PATH/main.log`` and checkpoints go to PATH. ``-n``/``-y``
with an existing regular file as PATH, or without ``-o``, are refused.

Loss and norm are averaged over the ranks before printing; rank 0 prints and logs.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import sys
import time

import numpy as np

from . import checkpoint as ckpt
from . import distributed as dist
from ._cli import OneValue
from .config import param_shapes
from .fileio import atomic_write
from .runtime import backend as _backend
from .schedule import SCHEDULES, LRSchedule, ScheduleError

DECAYED = ("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw")   # mainline's 2-D weights
STATE_FORMAT = ckpt.RANK_STATE_FORMAT
STATE_VERSION = 1
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


class RunError(dist.DistError):
    """A bad combination of flags, found the same way on every rank (rank 0 reports it)."""


def add_arguments(parser) -> None:
    g = parser.add_argument_group("llm.c mainline's controls (the README's section on several GPUs)")
    # an alias of --steps (the same dest): giving both with different values is refused
    g.add_argument("-x", dest="steps", type=int, default=None, action=OneValue,
                   help="max steps (same as --steps; -1: one epoch)")
    g.add_argument("-d", dest="total_batch_size", type=int, default=-1,
                   help="total batch size in tokens per step (gradient accumulation; -1: B*T*ranks)")
    g.add_argument("-u", dest="warmup_iters", type=int, default=0, help="learning-rate warm-up steps")
    g.add_argument("-q", dest="final_lr_frac", type=float, default=1.0, help="final learning rate / peak")
    g.add_argument("-k", dest="lr_schedule", default="cosine", choices=SCHEDULES, help="learning-rate schedule")
    g.add_argument("-c", dest="weight_decay_2d", type=float, default=None,
                   help="weight decay of the 2-D weights only (mainline's rule)")
    g.add_argument("--grad-clip", type=float, default=0.0, help="clip the gradient norm to this (0: off)")
    g.add_argument("-z", dest="zero_stage", type=int, choices=(0, 1), default=0, help="ZeRO stage")
    g.add_argument("-n", dest="checkpoint_every", type=int, default=0, help="checkpoint every N steps into -o DIR")
    g.add_argument("-nk", dest="checkpoints_keep", type=int, default=0, help="keep the last K checkpoints (0: all)")
    g.add_argument("-y", dest="resume_latest", type=int, choices=(0, 1), default=0,
                   help="1: resume from the newest checkpoint in -o DIR")
    dist.add_arguments(parser)


def output_dir(args) -> str | None:
    """The ``-o`` rule (module docstring): the folder, or None when -o is a log file or absent."""
    o = args.log
    wants_dir = args.checkpoint_every > 0 or args.resume_latest == 1
    if o is None:
        if wants_dir:
            raise RunError("-n (checkpoints) and -y 1 (resume) need an output folder: -o DIR")
        return None
    if os.path.isdir(o):
        return o
    if o.endswith(("/", os.sep)) or wants_dir:
        # not `exists` alone: another rank may create the folder between the isdir above and here,
        # and every rank must reach the same verdict (a refusal is said by rank 0 for all)
        if os.path.exists(o) and not os.path.isdir(o):
            raise RunError(f"-o {o}: a file exists there, but -n/-y need a folder for the log and checkpoints; "
                           "name a folder (or drop -n/-y to use -o as the log file)")
        return o
    return None


class Run:
    """The controls of one run on one rank (``setup`` makes it, train.py calls its hooks)."""

    def __init__(self, args, group):
        self.args, self.group = args, group
        self.rank, self.world = group.rank, group.world_size
        B, T = args.batch_size, args.seq_len
        if args.steps == -1:
            args.steps = None
        per_pass = B * T * self.world
        total = args.total_batch_size
        if total == -1:
            total = per_pass
        if total <= 0 or total % per_pass:
            raise RunError(f"-d {total}: the total batch size must be a positive multiple of B*T*ranks = "
                           f"{B}*{T}*{self.world} = {per_pass} tokens")
        self.micro_steps = total // per_pass
        self.tokens_per_step = total
        if args.weight_decay_2d is not None and args.weight_decay:
            raise RunError("give either -c (weight decay of the 2-D weights, mainline) or --weight-decay "
                           "(every parameter, the FP32 trainer), not both")
        if args.grad_clip < 0:
            raise RunError(f"--grad-clip must not be negative (got {args.grad_clip:g})")
        if args.checkpoint_every < 0 or args.checkpoints_keep < 0:
            raise RunError("-n and -nk must not be negative")
        try:
            LRSchedule(args.lr_schedule, args.lr, args.warmup_iters, 1, args.final_lr_frac)
        except ScheduleError as exc:
            raise RunError(str(exc)) from None
        self.out_dir = output_dir(args)
        if self.out_dir is not None:
            os.makedirs(self.out_dir, exist_ok=True)
            args.log = os.path.join(self.out_dir, "main.log")
        if self.rank != 0:
            args.log = None                        # rank 0 logs
        self.mainline = bool(group.collective or self.micro_steps > 1 or args.zero_stage or args.grad_clip
                             or args.weight_decay_2d or args.checkpoint_every or args.resume_latest
                             or args.warmup_iters or args.final_lr_frac != 1.0)
        if self.mainline and (args.save_every or args.save_path is not None or args.resume):
            raise RunError("--save-every/--resume write one process's state file; with the mainline controls "
                           "use -o DIR -n N and -y 1")
        if self.mainline and args.cuda_graph:
            raise RunError("--cuda-graph captures the FP32 trainer's one-process step; it does not combine with "
                           "several ranks or the mainline controls (-d, -z, -k/-u/-q, -c, --grad-clip, -n, -y)")
        if self.mainline and args.benchmark and self.micro_steps > 1:
            raise RunError("--benchmark runs one fixed batch per step; drop -d")
        self.schedule = None
        self.resumed = False
        self.m = self.v = self.gshard = self.acc = None
        self.last_norm = None
        self.last_lr = args.lr

    # -- data

    def loader_kwargs(self, train: bool) -> dict:
        return dict(process_rank=self.rank, num_processes=self.world,
                    micro_steps=self.micro_steps if train else 1)

    def start(self, train_num_batches: int) -> None:
        a = self.args
        self.schedule = LRSchedule(a.lr_schedule, a.lr, a.warmup_iters, train_num_batches, a.final_lr_frac)

    def table_rows(self) -> list:
        a = self.args
        if not self.mainline:
            return []
        rows = [("processes", f"{self.world} ({self.group.kind})"), ("rank", self.rank),
                ("total batch (tokens)", self.tokens_per_step), ("micro-steps", self.micro_steps)]
        rows += [("lr schedule", f"{a.lr_schedule}, warm-up {a.warmup_iters}, final x{a.final_lr_frac:g}"),
                 ("weight decay", f"{a.weight_decay_2d:g} on 2-D weights" if a.weight_decay_2d is not None
                      else f"{a.weight_decay:g} on every parameter"),
                 ("grad clip", a.grad_clip or "off"), ("ZeRO stage", a.zero_stage),
                 ("output folder", self.out_dir or "none")]
        return rows

    # -- shards

    def _shard_bounds(self, P: int) -> tuple[int, int, int]:
        """(S, start, end): equal slots of S = P // world, the tail P - world*S on the last rank."""
        if not self.args.zero_stage:
            return P, 0, P
        S = P // self.world
        start = self.rank * S
        end = P if self.rank == self.world - 1 else start + S
        return S, start, end

    def _runs(self, model, start: int, end: int) -> list:
        """[(a, b, weight decay)] pieces of [start, end) in flat coordinates, one weight decay each."""
        a = self.args
        if a.weight_decay_2d is None:
            return [(start, end, a.weight_decay)]
        runs, offset = [], 0
        for name, shape in param_shapes(model.config).items():
            size = int(np.prod(shape))
            lo, hi = max(offset, start), min(offset + size, end)
            if lo < hi:
                wd = a.weight_decay_2d if name in DECAYED else 0.0
                if runs and runs[-1][2] == wd and runs[-1][1] == lo:
                    runs[-1] = (runs[-1][0], hi, wd)
                else:
                    runs.append((lo, hi, wd))
            offset += size
        return runs

    def _allocate(self, model) -> None:
        if self.m is not None:
            return
        xp = _backend.xp()
        P = model.num_parameters()
        S, start, end = self._shard_bounds(P)
        self.m = xp.zeros(end - start, np.float32)
        self.v = xp.zeros(end - start, np.float32)
        if self.args.zero_stage:
            self.gshard = xp.zeros(end - start, np.float32)

    # -- the step

    def step(self, model, loader, x, y, step: int) -> float:
        """One training step (0-based ``step``) on this rank's first micro-batch (x, y) and the
        loader's next ``micro_steps - 1``: forward/backward each, then the gradients' mean over
        micro-steps and ranks, the norm and clipping, the update at the schedule's learning rate.
        Returns the loss averaged over micro-steps and ranks."""
        A, g = self.micro_steps, self.group
        total = 0.0
        for i in range(A):
            if i:
                x, y = loader.next_batch()
            total += model.forward(x, y)
            model.zero_grad()
            model.backward()
            if A > 1:
                # summed in a buffer of our own: the model's backward overwrites the bias gradients
                # (matmul_backward writes dbias, as llm.c's kernels do), so they cannot accumulate there
                if self.acc is None:
                    self.acc = _backend.xp().zeros_like(model.grads)
                if i == 0:
                    self.acc[...] = model.grads
                else:
                    self.acc += model.grads
        loss = total / A
        self._allocate(model)
        grads, params = (self.acc if A > 1 else model.grads), model.params
        P = model.num_parameters()
        S, start, end = self._shard_bounds(P)
        N = self.world
        if self.args.zero_stage:
            if g.collective:
                g.reduce_scatter_sum(grads[: N * S], self.gshard[:S], "reduce-scatter of the gradients")
                if N * S < P:
                    g.allreduce_sum(grads[N * S:], "all-reduce of the gradients' tail")
                    if self.rank == N - 1:
                        self.gshard[S:] = grads[N * S:]
            else:
                self.gshard[...] = grads
            shard = self.gshard
        else:
            if g.collective:
                g.allreduce_sum(grads, "all-reduce of the gradients")
            shard = grads
        if N * A > 1:
            shard *= np.float32(1.0 / (N * A))
        # the norm (printed at every step) of the mean gradient: of the own shard, summed over ranks
        sq = model.call("global_norm", {"data": shard})["out"]
        sq = np.array([float(_backend.to_numpy(sq)[0])], dtype=np.float64)
        if self.args.zero_stage and g.collective:
            sq = _backend.xp().asarray(sq)
            g.allreduce_sum(sq, "all-reduce of the gradient norm")
        norm = math.sqrt(float(_backend.to_numpy(sq)[0]))
        clip = self.args.grad_clip
        if clip and norm > clip:
            shard *= np.float32(clip / norm)
        lr = self.schedule(step) if self.schedule is not None else self.args.lr
        for a, b, wd in self._runs(model, start, end):
            model.call("adamw", {"params": params[a:b], "grads": shard[a - start:b - start],
                                 "m": self.m[a - start:b - start], "v": self.v[a - start:b - start],
                                 "lr": lr, "beta1": BETA1, "beta2": BETA2, "eps": EPS, "weight_decay": wd,
                                 "t": step + 1})
        if self.args.zero_stage and g.collective:
            g.allgather(params[: N * S], "all-gather of the parameters")
            if N * S < P:
                g.broadcast(params[N * S:], N - 1, "broadcast of the parameters' tail")
        self.last_norm, self.last_lr = norm, lr
        loss = g.mean(loss) if g.collective else loss
        g.started = True   # every rank is through its start-up: --dist-timeout alone from here on
        return loss

    def suffix(self) -> str:
        """What the step line adds: the norm and the learning rate."""
        if not self.mainline or self.last_norm is None:
            return ""
        return f" norm {self.last_norm:.4f} lr {self.last_lr:.4e}"

    def mean(self, x: float) -> float:
        return self.group.mean(x) if self.group.collective else x

    def sync_params(self, model) -> None:
        """Rank 0's initial parameters on every rank (a model file that differs between nodes
        would otherwise make the ranks train different models)."""
        if self.group.collective and self.world > 1:
            self.group.broadcast(model.params, 0, "broadcast of the initial parameters")

    # -- checkpoints

    def _paths(self, step: int, rank: int | None = None):
        d = self.out_dir
        return (os.path.join(d, f"model_{step:08d}.bin"),
                os.path.join(d, f"state_{step:08d}_{self.rank if rank is None else rank:05d}.npz"),
                os.path.join(d, f"DONE_{step:08d}"))

    def kept_text(self, step: int) -> str:
        """Where a stopped run (non-finite loss, Ctrl-C) continues from: the checkpoint at ``step``."""
        return f"the newest checkpoint is in {self.out_dir}, at step {step}: -y 1 resumes from it"

    def maybe_checkpoint(self, model, loader, rng, step: int, kept: str | None = None) -> bool:
        """After step ``step`` (1-based count of steps done): a checkpoint every ``-n`` steps.
        True when one was written; ``kept`` says which earlier one is left (for the refusal)."""
        n = self.args.checkpoint_every
        if not n or step % n:
            return False
        params = model.params_numpy()
        if not np.isfinite(params).all():
            raise FloatingPointError(f"the parameters are not finite after step {step}; not saving a checkpoint "
                                     f"({kept or 'no checkpoint was saved by this run'})")
        model_path, state_path, done_path = self._paths(step)
        P = model.num_parameters()
        S, start, end = self._shard_bounds(P)
        arrays = {"adam_m": _backend.to_numpy(self.m).astype(np.float32),
                  "adam_v": _backend.to_numpy(self.v).astype(np.float32)}
        meta = {"format": STATE_FORMAT, "version": STATE_VERSION, "step": step, "rank": self.rank,
                "world_size": self.world, "zero_stage": self.args.zero_stage, "shard": [start, end],
                "num_parameters": P, "micro_steps": self.micro_steps,
                "B": self.args.batch_size, "T": self.args.seq_len,
                "loader": ckpt._encode(loader.state_dict(), arrays, "loader"),
                "rng": ckpt._encode(rng.state_dict(), arrays, "rng")}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        if self.rank == 0:
            ckpt.write_model(model_path, model.config, params)
        with atomic_write(state_path) as f:
            np.savez(f, **arrays)
        self.group.barrier()                     # every rank's files are complete
        if self.rank == 0:
            with atomic_write(done_path) as f:
                f.write(f"{self.world}\n".encode())
            print(f"saved checkpoint at step {step} to {self.out_dir}")
            self._prune()
        return True

    def _done_steps(self) -> list[int]:
        steps = []
        for p in glob.glob(os.path.join(glob.escape(self.out_dir), "DONE_*")):
            m = re.fullmatch(r"DONE_(\d{8})", os.path.basename(p))
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def _prune(self) -> None:
        keep = self.args.checkpoints_keep
        if not keep:
            return
        for step in self._done_steps()[:-keep]:
            model_path, _, done_path = self._paths(step)
            os.unlink(done_path)                 # first: the checkpoint stops counting as complete
            for p in [model_path] + glob.glob(os.path.join(glob.escape(self.out_dir), f"state_{step:08d}_*.npz")):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass

    def resume(self, model, loader, rng) -> int:
        """-y 1: loads the newest complete checkpoint of -o DIR; returns its step (0: none).
        Without -y 1, a run that will checkpoint (-n) into a folder holding complete checkpoints
        is refused: it would overwrite them, and a later -y 1 could continue the earlier run's."""
        if not self.args.resume_latest and not self.args.checkpoint_every:
            return 0
        if self.rank == 0:
            self._remove_stale_temporaries()
        self._check_shared()
        steps = self._done_steps()
        latest = steps[-1] if steps else 0
        seen = self.group.allgather_bytes(str(latest).encode()) if self.group.collective else [b"%d" % latest]
        if len(set(seen)) != 1:
            raise dist.DistError(f"the ranks see different newest checkpoints in {self.out_dir} "
                                 f"({', '.join(s.decode() for s in seen)}): is -o on a folder every node shares?")
        if not self.args.resume_latest:
            if latest:   # the same verdict on every rank (seen agrees): rank 0 says it for all
                raise RunError(f"-o {self.out_dir} holds the checkpoints of an earlier run (the newest at step "
                               f"{latest}); continue it with -y 1, or give another folder (this run's checkpoints "
                               "would overwrite them)")
            return 0
        if not latest:
            print(f"-y 1: no complete checkpoint in {self.out_dir}; starting from the beginning")
            return 0
        model_path, state_path, done_path = self._paths(latest)
        # a damaged file of a complete checkpoint: say so in one line, and how to fall back to the one before
        fall_back = f"remove {done_path} to resume from the checkpoint before it"
        try:
            cfg, params = ckpt.read_model(model_path)
        except ckpt.FileFormatError as exc:
            raise ckpt.CheckpointError(f"{exc}; {fall_back}") from exc
        if cfg != model.config:
            raise ckpt.CheckpointError(f"{model_path} holds a model {cfg}; this run's model is {model.config}")
        if not os.path.exists(state_path):
            writers = self._done_world(done_path)
            if writers == self.world:   # was "written by 0 rank(s)": a deleted file, not another world size
                raise ckpt.CheckpointError(f"{state_path} is missing from the complete checkpoint at step {latest} "
                                           f"(deleted?); {fall_back}")
            raise ckpt.CheckpointError(
                f"{state_path} is missing: the checkpoint at step {latest} was written by "
                f"{writers if writers is not None else self._writers(latest)} rank(s), this run has {self.world}")
        try:
            with open(state_path, "rb") as f, np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads(arrays.pop("meta").tobytes().decode())   # JSON and UTF-8 errors are ValueErrors
            if not isinstance(meta, dict) or not {"adam_m", "adam_v"} <= set(arrays):
                raise ValueError("no metadata or AdamW moments in it")
        except ckpt.NPZ_READ_ERRORS as exc:
            # was a traceback (zipfile.BadZipFile: File is not a zip file; tokenize.TokenError)
            raise ckpt.CheckpointError(f"{state_path}: not a readable checkpoint state (truncated or corrupt?): "
                                       f"{exc}; {fall_back}") from exc
        if meta.get("format") != STATE_FORMAT or meta.get("version") != STATE_VERSION:
            raise ckpt.CheckpointError(f"{state_path}: not a {STATE_FORMAT} version {STATE_VERSION} file")
        P = model.num_parameters()
        _, start, end = self._shard_bounds(P)
        if meta["world_size"] != self.world:
            raise ckpt.CheckpointError(
                f"{self.out_dir}: the checkpoint at step {latest} was written by {meta['world_size']} rank(s); this "
                f"run has {self.world}. Resume with {meta['world_size']} ranks: each rank's data loader position"
                + (" and its ZeRO-1 shard of the AdamW state are" if meta["zero_stage"] else " is")
                + " stored for that world size")
        mine = {"zero_stage": self.args.zero_stage, "shard": [start, end], "num_parameters": P,
                "micro_steps": self.micro_steps, "B": self.args.batch_size, "T": self.args.seq_len}
        for key, value in mine.items():
            if meta.get(key) != value:
                raise ckpt.CheckpointError(f"{state_path}: written with {key} = {meta.get(key)!r}; this run has "
                                           f"{value!r} (-z, -b, -t and -d must match the interrupted run)")
        model.params[...] = _backend.asarray(params)
        self.m = _backend.asarray(arrays["adam_m"]).copy()
        self.v = _backend.asarray(arrays["adam_v"]).copy()
        if self.args.zero_stage:
            self.gshard = _backend.xp().zeros(end - start, np.float32)
        try:
            loader.load_state_dict(ckpt._decode(meta["loader"], arrays))
            rng.load_state_dict(ckpt._decode(meta["rng"], arrays))
        except (KeyError, TypeError, ValueError) as exc:
            raise ckpt.CheckpointError(f"{state_path}: cannot resume from it ({exc})") from exc
        self.resumed = True
        return latest

    def _check_shared(self) -> None:
        """Every rank must write into the same folder: rank 0 writes the model and DONE there, each
        rank its state file. A folder local to each node trained on without complaint and failed
        only at -y 1, after the fault, with the ranks seeing different checkpoints. Rank 0 makes a
        file of a fresh name; every rank looks for it (a name never looked up before is not in an
        NFS client's negative cache, and a few seconds cover slower file systems)."""
        g = self.group
        if not g.collective or self.world == 1:
            return
        token = os.urandom(8).hex() if self.rank == 0 else ""
        probe = None
        if self.rank == 0:
            probe = os.path.join(self.out_dir, f".llmcupy-shared-{token}")
            with open(probe, "w"):
                pass
        try:
            token = g.allgather_bytes(token.encode())[0].decode()
            name = f".llmcupy-shared-{token}"
            deadline = time.monotonic() + 5.0
            while not (seen := os.path.exists(os.path.join(self.out_dir, name))) and time.monotonic() < deadline:
                time.sleep(0.2)
            answers = g.allgather_bytes(b"1" if seen else b"0")
        finally:
            if probe is not None:
                os.unlink(probe)
        blind = [r for r, a in enumerate(answers) if a != b"1"]
        if blind:   # every rank has the same answers: rank 0 says it for all
            raise RunError(f"-o {self.out_dir} is not one folder for every rank: rank(s) {', '.join(map(str, blind))} "
                           "do not see the files rank 0 writes there (a folder local to each node, or a relative "
                           "path from different working folders?); checkpoints and -y 1 need a folder every "
                           "rank shares")

    def _remove_stale_temporaries(self) -> None:
        """Deletes the hidden temporaries (see :func:`llmcupy.fileio.atomic_write`) that a run killed
        mid-save (SIGTERM, SIGKILL, a lost node) left in the folder: as big as a model or a rank's
        AdamW state each, and never reused. No rank writes a checkpoint before the first step, which
        needs rank 0, so none of them is being written now."""
        from .fileio import remove_stale_temporaries

        d = glob.escape(self.out_dir)
        remove_stale_temporaries(os.path.join(d, p) for p in (".model_*.bin.*.tmp", ".state_*.npz.*.tmp",
                                                               ".DONE_*.*.tmp"))

    @staticmethod
    def _done_world(done_path: str) -> int | None:
        """The world size a DONE file records (maybe_checkpoint writes it), or None if unreadable."""
        try:
            with open(done_path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def _writers(self, step: int) -> int:
        return len(glob.glob(os.path.join(glob.escape(self.out_dir), f"state_{step:08d}_*.npz")))

    def close(self) -> None:
        self.group.close()


def setup(args) -> Run:
    """The process group (GPU selected, flags checked equal on every rank) and this rank's Run;
    ranks other than 0 print nothing to stdout."""
    group = dist.init(args)
    dist.ACTIVE, dist.RANK = group, group.rank
    if group.rank != 0:
        sys.stdout = open(os.devnull, "w")
    flags = {k: v for k, v in vars(args).items() if k not in ("rank", "gpus_per_node")}
    dist.check_same_flags(group, flags)
    return Run(args, group)
