"""Validate a kernel version against its reference and time it: what the kernel CLI and the
benchmark share.

``sweep(op, number, sizes)`` builds inputs at ``sizes``, runs the NumPy reference once, then the
version at each requested block size, and compares every output with the op's tolerance. On a GPU
it also times each block size and relates it to the op's upper bound: the device's measured copy
bandwidth for memory-bound ops, cuBLAS on the same shapes for GEMM-shaped ones. ``runner`` runs
versions one after another in child processes, so that one that crashes fails only itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import traceback

import numpy as np

from . import ops as ops_registry
from .ops import OpDefinitionError, OpError, check_outputs
from .runtime import backend as _backend
from .runtime import blas
from .runtime import timing
from .runtime.signature import DeviceLimitError


def _copy_to_backend(inputs: dict) -> dict:
    out = {}
    for k, v in inputs.items():
        # a fresh copy per run: in-place and accumulating ops must not see a previous run's result
        out[k] = _backend.xp().array(v, copy=True) if isinstance(v, np.ndarray) else v
    return out


def block_sizes_for(version, pinned: int | None):
    sizes = tuple(version.block_sizes) or (None,)
    if pinned is None:
        return sizes
    if version.block_sizes and pinned not in version.block_sizes:
        raise OpError(
            f"block size {pinned} is not in this version's sweep ({', '.join(map(str, version.block_sizes))})"
        )
    return (pinned,)


def sweep(op, number: int, sizes: dict | None = None, block_size: int | None = None, seed: int = 0,
          time_it: bool | None = None, repeat: int = 50) -> dict:
    """Validates (and on a GPU times) one version at every block size of its sweep. ``op``: an Op or its
    name."""
    if isinstance(op, str):
        op = ops_registry.get(op)   # an unknown name: the OpError listing the ops
    version = op.version(number)
    backend = _backend.get_backend()
    time_it = (backend == "cuda") if time_it is None else time_it
    result = {"op": op.name, "version": number, "summary": version.summary, "backend": backend,
              "device": _backend.device_name(), "blocks": []}
    if not version.available:
        result.update(ok=None, skipped=f"unavailable: {version.unavailable}")
        return result
    if block_size is not None and version.block_sizes and block_size not in version.block_sizes:
        # `--all --block-size N` over versions with different sweeps: a version that does not offer N
        # cannot run at it, which (like a size it refuses) is a skip, not a failure
        result.update(ok=None, skipped=f"block size {block_size} is not in this version's sweep "
                                       f"({', '.join(map(str, version.block_sizes))})")
        return result
    merged = _default_sizes(op)
    merged.update({k: v for k, v in (sizes or {}).items() if v is not None})
    try:
        try:
            inputs = op.make_inputs(np.random.default_rng(seed), **merged)
            result["sizes"] = {k: int(v) for k, v in merged.items()}
            if op.validate_fn is not None:
                # sizes the op itself refuses (C not a multiple of NH): its OpError, not the
                # reference's NumPy error ("cannot reshape array of size 6144 into shape (1,32,3,5,12)")
                op.validate_fn(inputs)
        except OpError as exc:
            if isinstance(exc, OpDefinitionError):
                raise   # the op's own sizes are wrong: a failure, not sizes this run may skip
            result.update(ok=None, skipped=f"the sizes do not fit the op: {exc}")
            return result
        ref = op.reference_fn(**{k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
                                 for k, v in inputs.items()})
    except MemoryError as exc:
        # sizes too large for this machine's memory (the NumPy inputs or reference): the sizes asked
        # for cannot run here, like sizes a version refuses -- not a failure of the kernel
        sizes_text = " ".join(f"{k}={v}" for k, v in merged.items())
        result.update(ok=None, skipped=f"out of host memory for the inputs at {sizes_text} ({exc}); give smaller "
                                       "sizes")
        return result
    bound = None
    if time_it and op.bound is not None:
        bound = _bound(op, inputs, repeat)
        result["bound"] = bound
    all_ok = True
    for bs in block_sizes_for(version, block_size):
        entry = {"block_size": bs}
        if version.requires is not None:
            problem = version.requires(inputs, bs)
            if problem:
                entry.update(ok=None, skipped=problem)
                result["blocks"].append(entry)
                continue
        arrays = _copy_to_backend(inputs)
        try:
            with blas.recorded_gemms() as gemms:
                got = op.run(number, arrays, bs)
        except DeviceLimitError as exc:
            # e.g. a register-hungry kernel at 1024 threads on a GPU with fewer registers per block:
            # this device cannot run the block size at all, which is not a wrong result
            entry.update(ok=None, skipped=f"this device cannot launch it: {exc}")
            result["blocks"].append(entry)
            continue
        # TF32 (blas.tf32(True), as the trainer runs) changes only what cuBLAS computes: a version that
        # called it is held to the op's TF32 tolerance, a hand-written FP32 kernel still to the FP32 one
        tf32 = bool(gemms) and blas.tf32_enabled()
        checks = check_outputs(op, ref, got, tf32=tf32, inputs=inputs)
        if tf32:
            entry["tolerance"] = "tf32"
        entry["checks"] = checks
        entry["ok"] = all(c["ok"] for c in checks)
        all_ok &= entry["ok"]
        if time_it and entry["ok"]:
            launch_arrays = {**arrays, **got}
            t = timing.benchmark_ms(lambda: version.launch(launch_arrays, bs), repeat=repeat)
            entry.update(t)
            if bound:
                entry.update(_relate(bound, t["mean_ms"]))
        result["blocks"].append(entry)
    ran = [b for b in result["blocks"] if b.get("ok") is not None]
    result["ok"] = bool(ran) and all_ok
    if not ran:
        reasons = list(dict.fromkeys(b["skipped"] for b in result["blocks"]))
        more = f" (and {len(reasons) - 1} other reason(s), per block size above)" if len(reasons) > 1 else ""
        result["skipped"] = f"no block size of the sweep can run at these sizes: {reasons[0]}{more}"
        result["ok"] = None
    return result


def _default_sizes(op) -> dict:
    return dict(op.sim_sizes if _backend.is_sim() else op.sizes)


def _bound(op, inputs: dict, repeat: int) -> dict:
    arrays = _copy_to_backend(inputs)
    s = op.sizes_of(arrays) if op.sizes_of else {}
    b = op.bound
    if b.kind == "memory":
        copy = timing.copy_bandwidth()  # the best of cudaMemcpyAsync and a float4 copy kernel
        return {"kind": "memory", "bytes": int(b.bytes(s)), "copy_gbs": copy["gbs"], "copy_method": copy["method"]}
    flops = int(b.flops(s))
    out = {"kind": "flops", "flops": flops}
    if b.baseline is not None:
        # the trainer-shapes runs measure it with TF32 on: a hand-written FP32 kernel's fraction is then of
        # tensor-core cuBLAS, which the record and the reports must say. A TF32 op's bound (b.tf32) is
        # TF32 cuBLAS in every run: FP32 SGEMM is several times slower than its kernel's precision allows
        setting = blas.tf32(True) if b.tf32 else contextlib.nullcontext(blas.tf32_enabled())
        with setting as tf32_in_effect:
            t = timing.benchmark_ms(lambda: b.baseline(arrays), repeat=repeat)
        out.update(cublas_ms=t["mean_ms"], cublas_tflops=flops / (t["mean_ms"] * 1e-3) / 1e12,
                   tf32=tf32_in_effect)
    return out


def _relate(bound: dict, ms: float) -> dict:
    if bound["kind"] == "memory":
        gbs = bound["bytes"] / (ms * 1e-3) / 1e9
        return {"gbs": gbs, "fraction_of_bound": gbs / bound["copy_gbs"]}
    tflops = bound["flops"] / (ms * 1e-3) / 1e12
    out = {"tflops": tflops}
    if "cublas_ms" in bound:
        out["fraction_of_bound"] = bound["cublas_ms"] / ms
    return out


def format_sweep(result: dict) -> str:
    lines = [f"{result['op']} version {result['version']}: {result['summary']}"]
    if result.get("skipped") and not result["blocks"]:
        lines.append(f"  SKIP ({result['skipped']})")
        return "\n".join(lines)
    sizes = " ".join(f"{k}={v}" for k, v in result.get("sizes", {}).items())
    lines.append(f"  backend {result['backend']} ({result['device']}), sizes {sizes}")
    if result["op"] in ops_registry.names():
        # the bound the errors below are held to: a large "rel" on a tiny reference value still passes
        lines.append(f"  PASS when every element is within tolerance: {ops_registry.get(result['op']).tolerance_text()}")
    bound = result.get("bound")
    if bound:
        if bound["kind"] == "memory":
            lines.append(f"  upper bound: measured copy bandwidth {bound['copy_gbs']:.0f} GB/s")
        elif "cublas_ms" in bound:
            lines.append(f"  upper bound: cuBLAS{' with TF32' if bound.get('tf32') else ''} {bound['cublas_ms']:.3f} ms "
                         f"({bound['cublas_tflops']:.2f} TFLOP/s)")
    for b in result["blocks"]:
        bs = "-" if b["block_size"] is None else b["block_size"]
        if b.get("ok") is None:
            lines.append(f"  block {bs:>5}: skipped ({b.get('skipped')})")
            continue
        errs = "  ".join(f"{c['name']}: max abs {c['max_abs']:.2e} rel {c['max_rel']:.2e}" for c in b["checks"])
        if b.get("tolerance") == "tf32":
            errs += "  (TF32 tolerance)"
        line = f"  block {bs:>5}: {errs}  {'PASS' if b['ok'] else 'FAIL'}"
        if "mean_ms" in b:
            line += f"  {b['mean_ms']:.4f} ms"
            if "gbs" in b:
                line += f"  {b['gbs']:.0f} GB/s"
            if "tflops" in b:
                line += f"  {b['tflops']:.2f} TFLOP/s"
            if "fraction_of_bound" in b:
                line += f"  {100 * b['fraction_of_bound']:.0f}% of bound"
        lines.append(line)
        for c in b["checks"]:
            if not c["ok"]:
                lines.append(f"      {c['name']}: {c['mismatches']} mismatches, first {c.get('first')}"
                             f" (tolerance {c['atol']:g} + {c['rtol']:g}*|ref|)")
    if result["backend"] == "sim":
        lines.append("  no timings: the emulator runs on the CPU and does not model GPU time")
    verdict = "PASS" if result["ok"] else ("SKIP" if result["ok"] is None else "FAIL")
    lines.append(verdict)
    return "\n".join(lines)


def run_isolated(fn, *args, start: str = "fork", **kwargs):
    """Runs ``fn`` in a child process so that a kernel crashing the emulator, or a device fault that
    poisons a CUDA context, fails only itself.

    Returns ``fn``'s (JSON-serialisable) result, or a dict with ``ok=False`` and ``error`` when the
    child died or raised. ``start="fork"`` (the emulator: cheap, the compiled libraries are shared)
    forks; without fork (not POSIX) it simply calls ``fn``. ``start="spawn"`` starts a fresh
    interpreter (the cuda backend: a CUDA context cannot be used in a child forked after CUDA
    was initialised); ``fn`` and its arguments must then be picklable (a module-level function).
    """
    if start not in ("fork", "spawn"):
        raise ValueError(f"run_isolated: start must be 'fork' or 'spawn', got {start!r}")
    with runner(start) as r:
        return r.call(fn, *args, **kwargs)


def emulator_start() -> str:
    """How the emulator isolates a version: a forked child (cheap, the compiled libraries are shared),
    except on macOS, whose system libraries are not safe in a child forked from a process with threads
    (the emulator's workers are threads; Python's multiprocessing spawns there for the same reason)."""
    return "spawn" if sys.platform == "darwin" else "fork"


def runner(start: str | None, env: dict | None = None):
    """What runs the versions of a catalogue or benchmark run, one ``call(fn, *args)`` each:
    ``"fork"`` a forked child per call (``ForkedRunner``), ``"spawn"`` one long-lived spawned child
    replaced after a failed call (``SpawnedRunner``; ``env`` is set in it), None this process."""
    if start == "spawn":
        return SpawnedRunner(env)
    if start == "fork":
        return ForkedRunner()
    if start is None:
        return _InProcessRunner()
    raise ValueError(f"runner: start must be 'fork', 'spawn' or None, got {start!r}")


class _Runner:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        pass


class _InProcessRunner(_Runner):
    def call(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


class ForkedRunner(_Runner):
    """A forked child per call (the emulator's isolation: a fork is cheap and shares the compiled
    libraries); without fork (not POSIX) the call runs in this process."""

    def call(self, fn, *args, **kwargs):
        if not hasattr(os, "fork"):
            return fn(*args, **kwargs)
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # child: whatever happens, it ends here and never returns into the parent's code
            code = INTERRUPTED
            try:
                os.close(read_fd)
                payload, code = _call_in_child(fn, args, kwargs)
                if code != INTERRUPTED:   # Ctrl-C: the parent stops the run, nothing to report
                    with os.fdopen(write_fd, "w") as f:
                        json.dump(payload, f, default=str)
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:   # the parent is gone, or Ctrl-C while reporting: no traceback
                pass
            finally:
                os._exit(code)
        os.close(write_fd)
        try:
            with os.fdopen(read_fd) as f:
                data = f.read()
            _, status = os.waitpid(pid, 0)
        except KeyboardInterrupt:
            _kill_child(pid)
            raise
        if not data and os.WIFEXITED(status) and os.WEXITSTATUS(status) == INTERRUPTED:
            raise KeyboardInterrupt   # the child was interrupted: the run stops, not only this version
        if data:
            payload = json.loads(data)
            if "value" in payload:
                return payload["value"]
            return {"ok": False, "error": payload["error"]}
        if os.WIFSIGNALED(status):
            return died_by_signal(os.WTERMSIG(status), _runs_emulator({}))
        return {"ok": False, "error": f"the child exited with status {os.WEXITSTATUS(status)}"}


def died_by_signal(number: int, emulator: bool, op: str = "OP", version="VERSION") -> dict:
    """The failed result of a child killed by signal ``number``, with ``signal`` set to it. In the
    emulator the usual cause is a kernel's write outside its arrays corrupting the process's memory
    (glibc's abort, SIGABRT, or a later SIGSEGV far from the write) where a plain run's fences do not
    reach (an allocation over 4 MiB, or far past an array's end):
    the message gives the command that runs the version under memcheck. A runner does not know which
    version it ran (``OP VERSION`` stand for it); a caller that does calls this again with them."""
    if not emulator:
        error = f"the child process died with signal {_signal_text(number)} (see stderr)"
    else:
        error = (f"the emulator process died with signal {_signal_text(number)} (see stderr); a kernel's "
                 f"out-of-bounds write can do this: python -m llmcupy.kernel {op} {version} --sanitize runs it "
                 "under memcheck, which names the access")
    return {"ok": False, "error": error, "signal": number}


def _runs_emulator(env: dict) -> bool:
    """Whether a child started with ``env`` added to this process's environment runs the emulator."""
    if env.get("LLMCUPY_BACKEND") in ("sim", "cuda"):
        return env["LLMCUPY_BACKEND"] == "sim"
    try:
        return _backend.is_sim()   # the child resolves the backend as this process does
    except _backend.BackendError:
        return False


def _signal_text(number: int) -> str:
    """'6 (SIGABRT)': the number as the shell reports it, the name for those who do not know it."""
    try:
        return f"{number} ({signal.Signals(number).name})"
    except ValueError:
        return str(number)


# a child's exit status after Ctrl-C (the shell's 128 + SIGINT): the parent then stops the whole run
INTERRUPTED = 130


def _kill_child(pid: int) -> None:
    """Ctrl-C in the parent: the child (interrupted too, or not: a SIGINT sent to the parent alone)
    must not run on unseen; it holds no file of the run's, so it is killed and reaped."""
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _call_in_child(fn, args, kwargs) -> tuple[dict, int]:
    """A child's run of fn: ({"value": ...}, 0), or ({"error": ..., "trace": ...}, 1) if it raised,
    ({"error": "interrupted"}, INTERRUPTED) on Ctrl-C."""
    try:
        return {"value": fn(*args, **kwargs)}, 0
    except KeyboardInterrupt:
        return {"error": "interrupted"}, INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}, 1


class SpawnedRunner(_Runner):
    """Runs calls one after another in a long-lived spawned child, restarting it only after a call
    that failed: the cuda backend's isolation for ``kernel --all`` and ``bench``.

    A spawned interpreter costs seconds to start (Python, CuPy, a CUDA context), which a child per
    version would pay about a hundred times for the catalogue. One child runs every version until
    one goes wrong: it raised (the child then exits: a device fault leaves its CUDA context
    unusable), died, or returned a result with ``ok`` False (wrong outputs may come from a stray
    write); that call's result says why, and the next call starts a fresh child. ``fn`` and its
    arguments must be picklable (module-level functions). Results are as ``run_isolated``'s.
    """

    def __init__(self, env: dict | None = None):
        self._proc = None
        self._conn = None
        self._env = dict(env or {})  # set in each child before its first call (e.g. LLMCUPY_BACKEND)
        self.starts = 0  # children started so far (the tests count them)

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._proc = ctx.Process(target=_worker_main, args=(child, self._env), daemon=True)
        self._proc.start()
        child.close()  # the child holds the only other end: EOF once it is gone
        self._conn = parent
        self.starts += 1

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send(None)  # "no more calls": the child exits by itself
        except (BrokenPipeError, OSError):
            pass
        self._conn.close()
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._proc = self._conn = None

    def _kill(self) -> None:
        """Ctrl-C: the child stops now (it may be in a long kernel, or idle and interrupted too)."""
        if self._proc is None:
            return
        self._proc.kill()
        self._proc.join()
        self._conn.close()
        self._proc = self._conn = None

    def call(self, fn, *args, **kwargs):
        if self._proc is None:
            self._start()
        data = None
        try:
            self._conn.send((fn, args, kwargs))
            data = self._conn.recv()
        except (EOFError, BrokenPipeError, OSError):  # the child died during the call
            pass
        except KeyboardInterrupt:
            self._kill()
            raise
        if data is not None:
            payload = json.loads(data)
            if payload.get("error") == "interrupted" and "trace" not in payload:
                self._kill()
                raise KeyboardInterrupt
            if "value" in payload:
                value = payload["value"]
                if isinstance(value, dict) and value.get("ok") is False:
                    self.close()  # wrong outputs may come from a stray write: a fresh process next
                return value
            self.close()  # it raised: the child has exited (its CUDA context may be poisoned)
            return {"ok": False, "error": payload["error"]}
        proc = self._proc
        proc.join()
        self._conn.close()
        self._proc = self._conn = None
        if proc.exitcode == INTERRUPTED:
            raise KeyboardInterrupt
        if proc.exitcode is not None and proc.exitcode < 0:
            return died_by_signal(-proc.exitcode, _runs_emulator(self._env))
        return {"ok": False, "error": f"the child exited with status {proc.exitcode} without a result"}


def _worker_main(conn, env: dict) -> None:
    """SpawnedRunner's child: runs calls until told to stop; after a call that raised, sends the
    error and exits, so that nothing runs in a process a fault may have left unusable."""
    os.environ.update(env)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        except KeyboardInterrupt:   # Ctrl-C between calls: the parent stops the run
            os._exit(INTERRUPTED)
        if message is None:
            break
        fn, args, kwargs = message
        payload, code = _call_in_child(fn, args, kwargs)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send(json.dumps(payload, default=str))
        except (OSError, KeyboardInterrupt):   # the parent is gone or stopping: no traceback here
            os._exit(code or INTERRUPTED)
        if code != 0:
            conn.close()
            os._exit(code)
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
