"""Data parallel training and llm.c mainline's controls (issue: training past one GPU).

In the emulator the collectives are MPI's on host arrays, the same code path as NCCL's on GPUs, so
these tests run ``mpiexec -n 2 python -m llmcupy.train --backend sim ...`` on one CPU machine:

* 2 ranks at ``-b 2`` print the losses of one process at ``-b 4`` (same total batch), to 1e-5
  (the sums of the gradients differ only in their order); with ``-z 1`` (ZeRO-1) the same;
* gradient accumulation ``-b 2 -d 128`` (2 micro-steps at T = 32) equals ``-b 4`` in one step;
* a hung rank (SIGSTOP) makes the other stop after ``--dist-timeout`` plus a grace of at most
  10 s, naming the missing rank; resuming from the last checkpoint (``-y 1``) continues bit for
  bit: the same losses and a byte-identical model file as an uninterrupted run;
* a killed rank (SIGKILL) ends the job at once (MPI's launcher tears it down), and so does a rank
  that fails before it joined MPI (a bad flag, a broken import on its node), naming itself and why;
  one whose Python never ran llmcupy ends the others after their start-up limit (MPI_Init's watchdog);
* mismatched flags across ranks, a world size that does not divide the total batch, resuming
  with another world size under ZeRO-1, and ambiguous ``-o`` uses are refused with clear errors.

Sizes are the smallest that exercise everything (model d2, T = 32, 2-3 steps): the emulator
spends about a second per step of B*T = 128 tokens.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from llmcupy import distributed
from llmcupy._mpi_launch import MPI_ENV
from llmcupy.data import DataLoader, write_tokens
from llmcupy.schedule import LRSchedule, ScheduleError

from _helpers import run_train

REPO = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^step +(\d+)/(\d+): train loss ([0-9.]+) \(", re.M)


def _have_mpi() -> str | None:
    if shutil.which("mpiexec") is None:
        return "mpiexec not found (pip install '.[mpi]')"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py not installed (pip install '.[mpi]')"
    return None


needs_mpi = pytest.mark.skipif(_have_mpi() is not None, reason=str(_have_mpi()))


def _losses(text: str) -> list[float]:
    return [float(m.group(3)) for m in STEP.finditer(text)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Random token files: 40 train batches of 4 x 32, validation for 2."""
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    write_tokens(d / "train.bin", rng.integers(0, 50257, 40 * 128 + 1))
    write_tokens(d / "val.bin", rng.integers(0, 50257, 2 * 128 + 1))
    return ["-i", str(d / "train.bin"), "-j", str(d / "val.bin")]


def _args(data, *extra):
    return ["--backend", "sim", "--init", "d2", "-t", "32", "-v", "0", "-s", "0", *data, *map(str, extra)]


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", LLMCUPY_BACKEND="sim")
    for k in MPI_ENV + ("LLMCUPY_WORLD_SIZE", "LLMCUPY_RANK", "LLMCUPY_RENDEZVOUS"):
        env.pop(k, None)
    return env


def _mpi(n, argv, cwd, timeout=300, ranks=None):
    """mpiexec -n n python -m llmcupy.train argv; ranks: MPMD, a list of per-rank argv."""
    cmd = ["mpiexec"]
    if ranks is None:
        cmd += ["-n", str(n), sys.executable, "-m", "llmcupy.train", *argv]
    else:
        for i, a in enumerate(ranks):
            cmd += ([":"] if i else []) + ["-n", "1", sys.executable, "-m", "llmcupy.train", *a]
    p = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# ---------------------------------------------------------------------------------------------
# pieces without processes


def test_schedules():
    cos = LRSchedule("cosine", 1.0, warmup=2, total=10, final_frac=0.1)
    assert [cos(s) for s in (0, 1)] == [0.5, 1.0]
    assert cos(2) == pytest.approx(1.0) and cos(6) == pytest.approx(0.55) and cos(10) == pytest.approx(0.1)
    lin = LRSchedule("linear", 1.0, warmup=0, total=10, final_frac=0.0)
    assert lin(5) == pytest.approx(0.5)
    wsd = LRSchedule("wsd", 1.0, warmup=0, total=10, final_frac=0.0)
    assert wsd(7) == 1.0 and wsd(8) == 1.0 and wsd(9) == pytest.approx(1 - 0.5 ** 0.5)
    assert LRSchedule("constant", 3e-4, warmup=5, total=10, final_frac=0.0)(0) == 3e-4
    assert LRSchedule("cosine", 3e-4, 0, 10, 1.0).constant      # the defaults: the FP32 trainer's lr
    with pytest.raises(ScheduleError, match="-q"):
        LRSchedule("cosine", 1.0, 0, 10, 1.5)


def test_loader_slices_of_ranks_and_micro_steps_make_the_one_process_batch(tmp_path):
    """With shuffling on: ranks x micro-steps read disjoint slices whose union, in order, is the
    batch of one process with the whole batch size (every rank shuffles with the same seed)."""
    rng = np.random.default_rng(1)
    write_tokens(tmp_path / "t.bin", rng.integers(0, 50257, 25 * 8 * 4 + 1))
    B, T = 2, 4
    one = DataLoader(str(tmp_path / "t.bin"), 4 * B, T, shuffle=True)
    parts = [DataLoader(str(tmp_path / "t.bin"), B, T, shuffle=True, process_rank=r, num_processes=2,
                        micro_steps=2) for r in range(2)]
    for _ in range(30):                  # past the end of the epoch: the reshuffle agrees too
        x, y = one.next_batch()
        got = [[None, None], [None, None]]
        for i in range(2):
            for r in range(2):
                got[i][r] = parts[r].next_batch()
        xs = np.concatenate([got[i][r][0] for i in range(2) for r in range(2)])
        ys = np.concatenate([got[i][r][1] for i in range(2) for r in range(2)])
        assert (xs == x).all() and (ys == y).all()
    state = parts[1].state_dict()
    parts[1].next_batch()
    again = DataLoader(str(tmp_path / "t.bin"), B, T, shuffle=True, process_rank=1, num_processes=2, micro_steps=2)
    again.load_state_dict(state)
    assert (again.next_batch()[0] == parts[1].inputs).all()


@pytest.mark.parametrize("scheme", ["file", "tcp"])
def test_rendezvous_hands_rank_0s_id_to_every_rank(tmp_path, scheme):
    if scheme == "file":
        url = f"file://{tmp_path}/rdv/id"
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"tcp://127.0.0.1:{port}"
    secret = os.urandom(128)
    got, errors = {}, []

    def rank(r):
        try:
            got[r] = distributed.exchange_id(url, r, 3, lambda: secret, timeout=20)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and got == {0: secret, 1: secret, 2: secret}
    if scheme == "file":   # a file left behind is refused, not silently reused
        with pytest.raises(distributed.DistError, match="already exists"):
            distributed.exchange_id(url, 0, 3, lambda: secret, timeout=1)
    with pytest.raises(distributed.DistError, match="rank 0 did not|no rendezvous"):
        distributed.exchange_id(url.replace("/id", "/other") if scheme == "file" else "tcp://127.0.0.1:1",
                                1, 3, lambda: secret, timeout=0.5)


def test_rendezvous_urls_that_cannot_work_are_refused_before_anything_is_written(tmp_path):
    # a folder was "already exists ... remove it" (the user's shared folder), a new one with a
    # trailing / a NotADirectoryError with a temporary left in it; file://shared/rdv wrote /rdv;
    # tcp://host:abc a ValueError traceback
    (tmp_path / "shared").mkdir()
    cases = [(f"file://{tmp_path}/shared", "names a folder; name a file that does not exist yet"),
             (f"file://{tmp_path}/new/", "names a folder"),
             ("file://shared/rdv", "expected file:///shared/path"),
             ("tcp://node1:abc", "expected tcp://HOST:PORT"), ("tcp://node1", "expected tcp://HOST:PORT")]
    for url, message in cases:
        for rank in (0, 1):
            with pytest.raises(distributed.DistError, match=re.escape(message)):
                distributed.exchange_id(url, rank, 2, lambda: b"id", timeout=0.5)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["shared"]


def test_tcp_rendezvous_host_that_does_not_resolve_is_said_at_once():
    # a misspelt host was retried until the timeout (at least 300 s), then "no rendezvous ... within"
    import socket

    try:
        socket.getaddrinfo("node1.invalid", 29500)
        pytest.skip("this resolver answers for .invalid names")
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:
            pytest.skip(f"no resolver to say the name is unknown here ({exc})")
    t0 = time.monotonic()
    with pytest.raises(distributed.DistError, match="the host name 'node1.invalid' does not resolve"):
        distributed.exchange_id("tcp://node1.invalid:29500", 1, 2, lambda: b"id", timeout=60)
    assert time.monotonic() - t0 < 30


def test_tcp_rendezvous_port_in_use_is_named():
    import socket

    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(distributed.DistError, match=f"rank 0: cannot listen on port {port} for --rendezvous "
                                                        f"tcp://127.0.0.1:{port} .*choose a free port"):
            distributed.exchange_id(f"tcp://127.0.0.1:{port}", 0, 2, lambda: b"id", timeout=5)


def test_rendezvous_waits_the_start_up_floor_not_a_short_dist_timeout(monkeypatch):
    # --dist-timeout 10 (to catch hung ranks quickly) gave a rank that started 11 s after rank 0
    # "no rendezvous ... within 10 s", although collectives wait at least STARTUP_TIMEOUT until step 1
    import argparse

    waited = []

    class Seen(Exception):
        pass

    def exchange(url, rank, world_size, make_id, timeout):
        waited.append(timeout)
        raise Seen

    monkeypatch.setattr(distributed, "exchange_id", exchange)
    monkeypatch.setattr(distributed, "_select_device", lambda local, rank: None)
    monkeypatch.setattr(distributed._backend, "is_sim", lambda: False)
    # the cuda path imports CuPy's NCCL module, whose import warns where libnccl is missing (CI): a
    # stand-in, since the exchange above stops before any NCCL call
    import types

    import cupy.cuda

    stand_in = types.ModuleType("cupy.cuda.nccl")
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", stand_in)
    monkeypatch.setattr(cupy.cuda, "nccl", stand_in, raising=False)
    for k in MPI_ENV:
        monkeypatch.delenv(k, raising=False)
    args = argparse.Namespace(world_size=2, rank=1, rendezvous="tcp://127.0.0.1:29500", dist_timeout=10.0,
                              gpus_per_node=1)
    with pytest.raises(Seen):
        distributed.init(args)
    assert waited == [distributed.STARTUP_TIMEOUT]


# (the command line, sys.argv while runpy imports a -m module's package: "-m" and its arguments)
@pytest.mark.parametrize("mpi, orig_argv, argv, guarded", [
    (True, ["python", "-m", "llmcupy.train", "-b", "2"], ["-m", "-b", "2"], True),
    (True, ["python", "-X", "importtime", "-u", "-m", "llmcupy.train", "-b", "2"], ["-m", "-b", "2"], True),
    (True, ["python", "-umllmcupy.train", "-b", "2"], ["-m", "-b", "2"], True),
    (False, ["python", "-m", "llmcupy.train", "-b", "2"], ["-m", "-b", "2"], False),   # one process
    (True, ["python", "-m", "llmcupy.bench", "llmcupy.train"], ["-m", "llmcupy.train"], False),   # another CLI
    (True, ["python", "job.py", "-m", "llmcupy.train"], ["job.py", "-m", "llmcupy.train"], False),  # a program
])
def test_only_the_trainer_under_mpi_ends_the_job_when_its_imports_fail(monkeypatch, mpi, orig_argv, argv, guarded):
    # what `import llmcupy` runs first. Only the trainer's ranks all join MPI; another program's
    # might never, and joining MPI to abort would hang this rank. Without MPI: Python's own report
    from llmcupy import _mpi_launch

    for k in MPI_ENV:
        monkeypatch.delenv(k, raising=False)
    if mpi:
        monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    _mpi_launch.guard_trainer_start()
    assert (sys.excepthook is not sys.__excepthook__) == guarded


def test_a_start_up_failure_that_cannot_end_the_job_is_reported_once(monkeypatch, capsys):
    # An import that fails inside the trainer's main() (tiktoken) on a node where mpi4py does not import
    # either: main() printed the traceback and both error lines, then Python's excepthook (the guard
    # `import llmcupy` installs) printed all three again. Run here as Python would: main(), then the hook.
    from llmcupy import _mpi_launch, train

    for k in MPI_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)   # not joined
    monkeypatch.setitem(sys.modules, "mpi4py", None)                 # and `from mpi4py import MPI` fails
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "llmcupy.train", "-b", "2"])
    monkeypatch.setattr(sys, "argv", ["-m", "-b", "2"])
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    _mpi_launch.guard_trainer_start()

    def broken_import(argv):
        raise ImportError("tiktoken is broken on this node (a stand-in)")

    monkeypatch.setattr(train, "_main", broken_import)
    with pytest.raises(ImportError) as raised:
        train.main(["-b", "2"])
    sys.excepthook(raised.type, raised.value, raised.tb)
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert err.count("error: rank 1 failed while starting (ImportError: tiktoken is broken on this node (a "
                     "stand-in)); ending every rank of the job") == 1, err
    assert err.count("error: rank 1 cannot end the job: mpi4py does not import here") == 1, err


class _StandInMPI:
    """mpi4py's MPI module as abort_unjoined_after uses it: a world of ``size`` ranks; Abort recorded."""

    def __init__(self, size):
        self.size, self.aborted = size, []
        self.COMM_WORLD = self

    def Get_size(self):
        return self.size

    def Abort(self, code):
        self.aborted.append(code)


@pytest.mark.parametrize("size", [1, 2])
def test_a_launcher_that_does_not_say_the_size_is_asked_through_mpi(monkeypatch, capsys, size):
    # PMIx launchers (srun --mpi=pmix, prterun) set PMIX_RANK and no size. Alone in such a job the rank
    # printed "ending every rank of the job", and there was no job to end; with others, the abort is due
    from llmcupy import _mpi_launch

    for k in MPI_ENV + ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PMIX_RANK", "0")
    mpi = _StandInMPI(size)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)   # not joined yet
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))
    _mpi_launch.abort_unjoined_after(ImportError("numpy is broken on this node (a stand-in)"))
    err = capsys.readouterr().err
    if size == 1:
        assert err == "" and mpi.aborted == []     # Python reports the exception itself, as without MPI
    else:
        assert "error: rank 0 failed while starting (ImportError: numpy is broken on this node (a stand-in)); " \
               "ending every rank of the job" in err, err
        assert mpi.aborted == [1]


def test_progress_bars_are_rank_0s(tmp_path, monkeypatch):
    # on a terminal every rank drew its own "checking token files" and "validation" bars
    import io

    from llmcupy import train

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    rng = np.random.default_rng(2)
    for i in range(2):
        write_tokens(tmp_path / f"t{i}.bin", rng.integers(0, 50257, 65))
    drawn = {}
    for rank in (0, 1):
        term = Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        monkeypatch.setattr(distributed, "RANK", rank)
        DataLoader(str(tmp_path / "t*.bin"), 2, 4, vocab_size=50257, process_rank=rank, num_processes=2)
        list(train.progress(range(3), "validation"))
        drawn[rank] = term.getvalue()
    assert "checking token files" in drawn[0] and "validation" in drawn[0]
    assert drawn[1] == ""


@pytest.mark.parametrize("world, rank, timeout, message", [
    (0, 0, 600.0, "--world-size must be at least 1 (got 0)"),        # was "--rank 0 must lie in 0..-1"
    (2, 2, 600.0, "--rank 2 must lie in 0..1"),
    (2, 0, float("nan"), "--dist-timeout must be a positive number"),  # nan was accepted: no deadline
    (2, 0, -1.0, "--dist-timeout must be a positive number"),
])
def test_world_rank_and_timeout_misuse(monkeypatch, world, rank, timeout, message):
    import argparse

    for k in MPI_ENV:
        monkeypatch.delenv(k, raising=False)
    args = argparse.Namespace(world_size=world, rank=rank, rendezvous=None, dist_timeout=timeout, gpus_per_node=None)
    with pytest.raises(distributed.DistError, match=re.escape(message)):
        distributed.init(args)


def test_output_rule_and_bad_combinations(data, tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("old")
    cases = [
        (["-n", "2"], "need an output folder: -o DIR"),
        (["-o", log, "-y", "1"], "a file exists there"),
        (["-b", "2", "-d", "100"], "multiple of B\\*T\\*ranks = 2\\*32\\*1 = 64"),
        (["-c", "0.1", "--weight-decay", "0.1"], "not both"),
        (["-z", "1", "--cuda-graph"], "--cuda-graph"),
        (["-z", "1", "--save-every", "2"], "--save-every"),
        (["--world-size", "2", "--rank", "0"], "emulator's collectives run over MPI"),
    ]
    for extra, message in cases:
        rc, out, err = run_train(_args(data, "-b", "4", "-x", "1", *extra))
        assert rc == 2 and re.search(message, err), (extra, err)
    assert log.read_text() == "old"


def test_output_folder_holds_the_log_and_checkpoints(data, tmp_path):
    out = tmp_path / "run"
    rc, stdout, err = run_train(_args(data, "-b", "4", "-x", "2", "-n", "1", "-nk", "1", "-o", out, "-u", "1",
                                      "--grad-clip", "1.0"))
    assert rc == 0, err
    assert (out / "main.log").read_text().splitlines() == [f"s:{s} trl:{v:.4f}" for s, v in
                                                           enumerate(_losses(stdout))]
    # -nk 1: only the newest checkpoint stays
    assert sorted(p.name for p in out.iterdir()) == ["DONE_00000002", "main.log", "model_00000002.bin",
                                                      "state_00000002_00000.npz"]
    assert re.search(r"norm [0-9.]+ lr 3\.0000e-04$", stdout, re.M)   # warm-up: step 1 at lr/1, step 2 at lr
    # the same command again without -y 1 overwrote them, and a later -y 1 could continue either run
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, stdout, err = run_train(_args(data, "-b", "4", "-x", "3", "-n", "1", "-o", out, "-l", "1e-3"))
    assert rc == 2 and (f"-o {out} holds the checkpoints of an earlier run (the newest at step 2); continue it "
                        "with -y 1, or give another folder") in err, stdout + err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_damaged_checkpoint_is_one_line_saying_how_to_fall_back(data, tmp_path):
    # a truncated state_*.npz of a complete checkpoint stopped -y 1 with a traceback (BadZipFile)
    out = tmp_path / "run"
    rc, _, err = run_train(_args(data, "-b", "4", "-x", "2", "-n", "1", "-o", out, "-u", "1"))
    assert rc == 0, err
    state = out / "state_00000002_00000.npz"
    good = state.read_bytes()
    # one damaged byte in a member's .npy header (an unterminated quote) was a tokenize.TokenError traceback
    state.write_bytes(good.replace(b"{'descr'", b"\"'descr'", 1))
    rc, stdout, err = run_train(_args(data, "-b", "4", "-x", "3", "-o", out, "-u", "1", "-y", "1"))
    assert rc == 2 and f"{state}: not a readable checkpoint state (truncated or corrupt?)" in err, stdout + err
    assert len(err.strip().splitlines()) == 1, err
    state.write_bytes(good[:3000])
    rc, stdout, err = run_train(_args(data, "-b", "4", "-x", "3", "-o", out, "-u", "1", "-y", "1"))
    assert rc == 2, stdout + err
    assert (f"{state}: not a readable checkpoint state (truncated or corrupt?)" in err
            and f"remove {out / 'DONE_00000002'} to resume from the checkpoint before it" in err), err
    assert len(err.strip().splitlines()) == 1, err
    # a deleted state file of the same world size was "written by 0 rank(s), this run has 1"
    state.unlink()
    rc, stdout, err = run_train(_args(data, "-b", "4", "-x", "3", "-o", out, "-u", "1", "-y", "1"))
    assert rc == 2 and (f"{state} is missing from the complete checkpoint at step 2 (deleted?); remove "
                        f"{out / 'DONE_00000002'} to resume from the checkpoint before it") in err, stdout + err
    # as it says: without that DONE file, the checkpoint at step 1 is the newest complete one
    (out / "DONE_00000002").unlink()
    # the temporaries of a run killed mid-save (SIGTERM) stayed in the folder for good
    stale = [out / ".model_00000003.bin.k1ll3d.tmp", out / ".state_00000003_00000.npz.k1ll3d.tmp"]
    for p in stale:
        p.write_bytes(b"half")
    rc, stdout, err = run_train(_args(data, "-b", "4", "-x", "3", "-o", out, "-u", "1", "-y", "1"))
    assert rc == 0 and "resumed from" in stdout and "at step 1" in stdout, stdout + err
    assert not any(p.exists() for p in stale) and f"removed {stale[0]} (0.0 MiB), left by an interrupted save" in stdout


def test_a_non_finite_loss_names_the_newest_checkpoint(data, tmp_path):
    # said "no training state was saved by this run" although -n had saved a checkpoint at step 1
    out = tmp_path / "run"
    rc, stdout, err = run_train(_args(data, "-b", "4", "-x", "3", "-n", "1", "-o", out, "-l", "1e30"))
    assert rc == 3, stdout + err
    assert (f"train loss is nan at step 2; stopping (the newest checkpoint is in {out}, at step 1: -y 1 resumes "
            "from it)") in err, err


# ---------------------------------------------------------------------------------------------
# several processes (MPI)


@needs_mpi
def test_two_ranks_equal_one_process_and_zero1_and_accumulation(data, tmp_path):
    val = ["-v", "2", "-m", "1"]    # validation at steps 0 and 2: each rank its slice, averaged
    rc, out, err = run_train(_args(data, "-b", "4", "-x", "2", *val))
    assert rc == 0, err
    ref = _losses(out)
    assert len(ref) == 2
    rc, out2, err = _mpi(2, _args(data, "-b", "2", "-x", "2", "--dist-timeout", "120", *val), tmp_path)
    assert rc == 0, out2[-2000:] + err[-2000:]
    assert "| processes             | 2 (MPI (host arrays))" in out2
    two = _losses(out2)
    rc, out3, err = _mpi(2, _args(data, "-b", "2", "-x", "2", "-z", "1", "--dist-timeout", "120"), tmp_path)
    assert rc == 0, out3[-2000:] + err[-2000:]
    zero1 = _losses(out3)
    rc, out4, err = run_train(_args(data, "-b", "2", "-x", "2", "-d", "128"))
    assert rc == 0, err
    accum = _losses(out4)
    assert "| micro-steps           | 2 " in out4
    np.testing.assert_allclose(two, ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(zero1, ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(accum, ref, rtol=0, atol=1e-5)
    vals = [[float(v) for v in re.findall(r"^val loss ([0-9.]+)$", o, re.M)] for o in (out, out2)]
    assert len(vals[0]) == 2
    np.testing.assert_allclose(vals[1], vals[0], rtol=0, atol=1e-5)
    # the norms are averaged over the ranks too: those printed agree
    norms = [re.findall(r"norm ([0-9.]+)", o) for o in (out2, out3, out4)]
    # two step lines each: an empty match (a changed step line) compared three empty lists
    assert [len(n) for n in norms] == [2, 2, 2], norms
    np.testing.assert_allclose(np.array(norms, dtype=float), np.array(norms[:1] * 3, dtype=float), atol=1e-4)


@needs_mpi
def test_mismatched_flags_and_batch_not_divisible_are_refused(data, tmp_path):
    base = _args(data, "-b", "2", "-x", "1")
    rc, out, err = _mpi(2, None, tmp_path, timeout=120, ranks=[base + ["-l", "3e-4"], base + ["-l", "1e-3"]])
    assert rc != 0
    assert "ranks were started with different flags" in err and "lr=0.001 (rank 0: 0.0003)" in err
    assert err.count("different flags") == 1          # rank 0 says it, once
    rc, out, err = _mpi(2, base + ["-d", "192"], tmp_path, timeout=120)
    assert rc != 0 and "-d 192: the total batch size must be a positive multiple of B*T*ranks = 2*32*2 = 128" in err


@needs_mpi
def test_checkpoint_folder_that_is_not_shared_is_refused_at_start(data, tmp_path):
    # a folder local to each node (here: a relative -o from different working folders) trained on
    # and failed only at -y 1, after the fault ("the ranks see different newest checkpoints")
    argv = _args(data, "-b", "2", "-x", "2", "-n", "1", "-o", "ck", "--dist-timeout", "120")
    cmd = ["mpiexec"]
    for r in range(2):
        (tmp_path / f"node{r}").mkdir()
        cmd += ([":"] if r else []) + ["-n", "1", "-wdir", str(tmp_path / f"node{r}"), sys.executable, "-m",
                                       "llmcupy.train", *argv]
    p = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert ("error: -o ck is not one folder for every rank: rank(s) 1 do not see the files rank 0 writes there"
            in p.stderr and p.stderr.count("not one folder") == 1), p.stderr
    assert "step " not in p.stdout and not list(tmp_path.rglob("*.npz"))


def _job(cmd, cwd, hung: str):
    """Runs an mpiexec job (its own session) to its end within 120 s: (exit status, stdout, stderr);
    a job still running then is killed, mpiexec and every rank, and the test fails with ``hung``."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # mpiexec and the ranks it started
        proc.communicate()
        pytest.fail(hung)
    return proc.returncode, out, err


@needs_mpi
def test_a_rank_that_fails_before_joining_ends_the_job(data, tmp_path):
    # one rank's bad flag (or a file missing on its node) ended it before MPI_Init; the others
    # waited in MPI_Init for it, forever and spinning, past any --dist-timeout
    argv = _args(data, "-b", "2", "-x", "1", "--dist-timeout", "20")
    cmd = ["mpiexec", "-n", "1", sys.executable, "-m", "llmcupy.train", *argv,
           ":", "-n", "1", sys.executable, "-m", "llmcupy.train", *argv, "-b", "x"]
    rc, out, err = _job(cmd, tmp_path, "the job hung after one rank failed before joining MPI")
    assert rc == 2 and "error: argument -b/--batch-size: invalid int value: 'x'" in err, err


@needs_mpi
@pytest.mark.parametrize("broken", ["numpy", "tiktoken"])
def test_a_rank_whose_imports_fail_ends_the_job_naming_it(data, tmp_path, broken):
    # a broken install on one node, here a stand-in package in rank 1's working folder (which
    # python -m puts first on sys.path). numpy fails during `import llmcupy`, before the trainer's
    # main() ran: rank 0 waited in MPI_Init for rank 1 forever, spinning, with no message. tiktoken
    # fails inside main(): the job ended, but MPI_Abort came before Python printed the error, so
    # the only line was MPICH's "Abort(1) on node 1", no cause
    argv = _args(data, "-b", "2", "-x", "1", "--dist-timeout", "20")
    cause = f"ImportError: {broken} is broken on this node (a stand-in)"
    cmd = ["mpiexec"]
    for r in range(2):
        (tmp_path / f"node{r}").mkdir()
        cmd += ([":"] if r else []) + ["-n", "1", "-wdir", str(tmp_path / f"node{r}"), sys.executable, "-m",
                                       "llmcupy.train", *argv]
    (tmp_path / "node1" / broken).mkdir()
    (tmp_path / "node1" / broken / "__init__.py").write_text(
        f'raise ImportError("{broken} is broken on this node (a stand-in)")\n')
    rc, out, err = _job(cmd, tmp_path, f"the job hung after rank 1 failed to import {broken}")
    assert rc != 0 and "step " not in out, out[-2000:] + err[-2000:]
    # the traceback says where; the last line of rank 1's report says who and why
    assert "Traceback (most recent call last)" in err, err
    assert f"error: rank 1 failed while starting ({cause}); ending every rank of the job" in err, err


@needs_mpi
def test_a_rank_that_cannot_import_mpi4py_either_says_it_cannot_end_the_job(data, tmp_path):
    # without mpi4py a rank cannot join MPI to abort: the others still wait in MPI_Init (nothing
    # else tells MPICH's launcher), but the failing rank says so instead of leaving a silent hang
    argv = _args(data, "-b", "2", "-x", "1", "--dist-timeout", "20")
    cmd = ["mpiexec"]
    for r in range(2):
        (tmp_path / f"node{r}").mkdir()
        cmd += ([":"] if r else []) + ["-n", "1", "-wdir", str(tmp_path / f"node{r}"), sys.executable, "-m",
                                       "llmcupy.train", *argv]
    for broken in ("numpy", "mpi4py"):
        (tmp_path / "node1" / broken).mkdir()
        (tmp_path / "node1" / broken / "__init__.py").write_text(f'raise ImportError("{broken} is broken here")\n')
    errf = tmp_path / "err.txt"
    with open(errf, "w") as err:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
    said = ("error: rank 1 cannot end the job: mpi4py does not import here (mpi4py is broken here); the other "
            "ranks wait for it in MPI_Init until their start-up limit ends them (--dist-timeout, at least 300 s), "
            "or stop them (Ctrl-C, or cancel the job)")
    try:
        assert _wait_for(lambda: said in errf.read_text(), proc, limit=120), errf.read_text()
        assert ("error: rank 1 failed while starting (ImportError: numpy is broken here); ending every rank of the "
                "job") in errf.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # mpiexec and the ranks it started
        proc.wait()


def _watched(seconds: float, body: str) -> subprocess.CompletedProcess:
    code = f"import time\nfrom llmcupy import _mpi_launch\nwith _mpi_launch.watch_mpi_init({seconds}):\n    {body}\n" \
           "print('through')"
    return subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)


def test_the_watchdog_of_mpi_init_ends_a_rank_still_waiting():
    # MPI_Init holds the GIL while it waits: a stand-in that does not return (time.sleep) is ended
    # from outside, after the limit, with the reason
    start = time.monotonic()
    p = _watched(1.0, "time.sleep(60)")
    assert p.returncode == -signal.SIGKILL and "through" not in p.stdout, (p.returncode, p.stdout, p.stderr)
    assert time.monotonic() - start < 30
    assert p.stderr.startswith("error: a rank: MPI did not start within 1 s. MPI_Init waits for every rank of the "
                               "job, and at least one never joined"), p.stderr


def test_the_watchdog_of_mpi_init_leaves_a_quick_start_alone():
    start = time.monotonic()
    p = _watched(60.0, "pass")
    assert p.returncode == 0 and p.stdout == "through\n" and p.stderr == "", (p.stdout, p.stderr)
    assert time.monotonic() - start < 30   # the watchdog ended when MPI_Init returned, not after 60 s


@needs_mpi
def test_a_rank_whose_python_never_ran_llmcupy_does_not_hang_the_job(tmp_path):
    # llmcupy missing on a node: that rank's Python stops at `-m llmcupy.train` before any of our
    # code runs, and the others waited in MPI_Init forever, spinning. Now distributed.init's watchdog
    # ends them after the start-up limit (here 2 s instead of 300) and the launcher ends the job
    init = ("import types\nfrom llmcupy import distributed\ndistributed.STARTUP_TIMEOUT = 2.0\n"
            "distributed.init(types.SimpleNamespace(world_size=None, rank=None, rendezvous=None, dist_timeout=1.0, "
            "gpus_per_node=None))\nprint('joined')")
    cmd = ["mpiexec", "-n", "1", sys.executable, "-c", init,
           ":", "-n", "1", sys.executable, "-c", "import llmcupy_is_not_installed_here"]
    rc, out, err = _job(cmd, tmp_path, "the job hung after rank 1's Python stopped before llmcupy ran")
    assert rc != 0 and "joined" not in out, out + err
    assert "ModuleNotFoundError: No module named 'llmcupy_is_not_installed_here'" in err, err
    assert "error: rank 0: MPI did not start within 2 s. MPI_Init waits for every rank" in err, err


@needs_mpi
def test_benchmark_counts_every_ranks_tokens(data, tmp_path):
    # 2 ranks at -b 2 -t 32 train 128 tokens a step; --benchmark counted one rank's 64 (half the
    # throughput the training loop's step line and llm.c report)
    rc, out, err = _mpi(2, _args(data, "-b", "2", "-x", "1", "--benchmark", "--warmup", "0", "--dist-timeout", "120"),
                        tmp_path)
    assert rc == 0, out[-2000:] + err[-2000:]
    ms, tps = re.search(r"^step +1/1: train loss [0-9.]+ \(([0-9.]+) ms, (\d+) tok/s\)$", out, re.M).groups()
    assert int(tps) == int(128 / (float(ms) / 1e3))
    mean, total = re.search(r"^benchmark: B=2 T=32 on each of 2 ranks, 1 steps after 0 warm-up: mean ([0-9.]+) "
                            r"ms/step, .* ([0-9]+) tok/s$", out, re.M).groups()
    assert abs(int(total) - 128 / (float(mean) / 1e3)) <= 1


def _rank_pid(mpiexec_pid: int, rank: int) -> int | None:
    """The pid of MPI rank ``rank`` among the descendants of our mpiexec (MPICH's PMI_RANK)."""
    def parent(pid):
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None

    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            cmdline = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() not in env or b"llmcupy.train" not in cmdline:
            continue
        pid = int(p.name)
        for _ in range(4):           # rank -> (hydra proxy ->) mpiexec
            pid = parent(pid)
            if pid == mpiexec_pid:
                return int(p.name)
            if pid is None:
                break
    return None


def _start(argv, cwd, n=2):
    out = open(cwd / "out.txt", "w+")
    err = open(cwd / "err.txt", "w+")
    proc = subprocess.Popen(["mpiexec", "-n", str(n), sys.executable, "-m", "llmcupy.train", *argv], cwd=cwd,
                            env=_env(), stdout=out, stderr=err, text=True)
    return proc, cwd / "out.txt", cwd / "err.txt"


def _wait_for(predicate, proc, limit=300):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


@needs_mpi
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the ranks' pids through /proc")
def test_hung_rank_times_out_by_name_and_resume_is_bit_for_bit(data, tmp_path):
    timeout = 6
    common = _args(data, "-b", "2", "-x", "3", "-z", "1", "-n", "1", "--dist-timeout", timeout, "-u", "2",
                   "--grad-clip", "1.0", "-c", "0.1")
    (tmp_path / "a").mkdir()
    rc, full, err = _mpi(2, common + ["-o", tmp_path / "a" / "ck"], tmp_path / "a")
    assert rc == 0, full[-2000:] + err[-2000:]
    ref = _losses(full)
    assert len(ref) == 3

    (tmp_path / "b").mkdir()
    ck = tmp_path / "b" / "ck"
    proc, out, errf = _start(common + ["-o", ck], tmp_path / "b")
    try:
        assert _wait_for(lambda: (ck / "DONE_00000001").exists(), proc), errf.read_text()[-2000:]
        pid = _rank_pid(proc.pid, 1)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)                   # hung: alive, never reaches the next collective
        stopped = time.monotonic()
        rc = proc.wait(timeout=timeout + 10 + 60)      # the limit, the naming grace, a step of slack
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    err = errf.read_text()
    assert rc != 0 and took < timeout + 10 + 60
    assert re.search(rf"rank 0: .* did not complete within {timeout} s: rank\(s\) 1 did not reach it", err), err
    # rank 1 was stopped in step 2, or, when this test got no CPU for the second or two between step
    # 1's checkpoint and step 2's, in step 3: the newest complete checkpoint (with its DONE, written
    # after every rank's part) is where it stopped, and the resume starts after it
    done = max(int(p.name.split("_")[1]) for p in ck.glob("DONE_*"))
    assert done in (1, 2), f"rank 1 was stopped after the last step's checkpoint (DONE_{done:08d})"

    # files of a checkpoint that never got its DONE (as if a rank died while writing) are ignored
    (ck / f"model_{done + 1:08d}.bin").write_bytes(b"torn")
    (ck / f"state_{done + 1:08d}_00000.npz").write_bytes(b"torn")
    rc, resumed, err = _mpi(2, common + ["-o", ck, "-y", "1"], tmp_path / "b")
    assert rc == 0, resumed[-2000:] + err[-2000:]
    assert "resumed from" in resumed
    assert [int(m.group(1)) for m in STEP.finditer(resumed)] == list(range(done + 1, 4))
    assert _losses(resumed) == ref[done:]
    assert (ck / "model_00000003.bin").read_bytes() == (tmp_path / "a" / "ck" / "model_00000003.bin").read_bytes()
    for r in range(2):
        a = np.load(tmp_path / "a" / "ck" / f"state_00000003_{r:05d}.npz")
        b = np.load(ck / f"state_00000003_{r:05d}.npz")
        assert (a["adam_m"] == b["adam_m"]).all() and (a["adam_v"] == b["adam_v"]).all()

    # another world size under ZeRO-1: refused with the reason
    i = common.index("-x")   # a second -x with another value would be refused as a contradiction
    rc, out, err = run_train(common[:i] + ["-x", "6"] + common[i + 2:] + ["-o", ck, "-y", "1"])
    assert rc == 2 and "written by 2 rank(s); this run has 1" in err and "ZeRO-1 shard" in err


@needs_mpi
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the ranks' pids through /proc")
def test_killed_rank_ends_the_job(data, tmp_path):
    proc, out, errf = _start(_args(data, "-b", "2", "-x", "30", "--dist-timeout", "6"), tmp_path)
    try:
        assert _wait_for(lambda: "step    1/" in out.read_text(), proc), errf.read_text()[-2000:]
        pid = _rank_pid(proc.pid, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        rc = proc.wait(timeout=6 + 10 + 60)
        assert rc != 0 and time.monotonic() - killed < 6 + 10 + 60
    finally:
        if proc.poll() is None:
            proc.kill()


# ---------------------------------------------------------------------------------------------
# GPU: the NCCL path at world size 1


@pytest.mark.gpu
def test_nccl_world_size_1_is_the_collective_path(data, tmp_path):
    pytest.importorskip("cupy.cuda.nccl")
    from cupy.cuda import nccl

    if not nccl.available:
        pytest.skip("NCCL is not loadable (pip install '.[cuda12]' brings nvidia-nccl-cu12)")
    gpu = ["--backend", "cuda", "--init", "d2", "-t", "64", "-v", "0", "-s", "0", *data, "-b", "4", "--tf32", "0",
           "--grad-clip", "1.0"]
    nccl1 = ["--world-size", "1", "--rank", "0"]
    rc, plain, err = run_train(gpu + ["-x", "4"])
    assert rc == 0, err
    rc, nccl_out, err = run_train(gpu + ["-x", "4"] + nccl1)
    assert rc == 0, err
    assert "| processes             | 1 (NCCL)" in nccl_out
    np.testing.assert_allclose(_losses(nccl_out), _losses(plain), rtol=0, atol=1e-5)
    rc, z1, err = run_train(gpu + ["-x", "4", "-z", "1"] + nccl1)
    assert rc == 0, err
    np.testing.assert_allclose(_losses(z1), _losses(plain), rtol=0, atol=1e-5)
    # ms/step with and without NCCL (printed for the record, never asserted)
    for extra in ([], nccl1):
        rc, out, err = run_train(gpu + ["--benchmark", "-x", "20"] + extra)
        assert rc == 0, err
        print("NCCL world size 1:" if extra else "no collectives:", out.strip().splitlines()[-1])


def test_weight_decay_runs_cover_the_shard_with_mainline_rule():
    """-c decays wte, wpe and the four matmul weights only; under ZeRO-1 the pieces are cut at the
    rank's shard, and the shards of all ranks tile the parameters."""
    from types import SimpleNamespace

    from llmcupy import mainline, train
    from llmcupy.config import GPT2Config, num_parameters, param_shapes

    cfg = GPT2Config.preset("d2")
    P = num_parameters(cfg)
    model = SimpleNamespace(config=cfg, num_parameters=lambda: P)
    offsets, o = {}, 0
    for name, shape in param_shapes(cfg).items():
        offsets[name] = (o, o + int(np.prod(shape)))
        o = offsets[name][1]
    pieces = []
    for rank in range(3):
        args = train.build_parser().parse_args(["-b", "4", "-t", "32", "-c", "0.1", "-z", "1"])
        group = SimpleNamespace(rank=rank, world_size=3, collective=True, kind="test")
        run = mainline.Run(args, group)
        S, start, end = run._shard_bounds(P)
        assert S == P // 3 and start == rank * S and end == (P if rank == 2 else start + S)
        pieces += run._runs(model, start, end)
    assert pieces[0][0] == 0 and pieces[-1][1] == P
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    for a, b, wd in pieces:
        names = [n for n, (lo, hi) in offsets.items() if lo < b and a < hi]
        assert {n in mainline.DECAYED for n in names} == {wd == 0.1}, (a, b, wd, names)


def test_nccl_unique_id_in_the_form_the_installed_cupy_takes():
    """CuPy 14 changed NCCL's id to bytes: ``get_unique_id()`` returns bytes and
    ``NcclCommunicator(int ndev, bytes commId, int rank)`` rejects a tuple (cupy_backends/cuda/libs/
    nccl.pyx at v14.2.0); CuPy 13 took a tuple of C chars. The id read from a rendezvous must come
    out as the installed CuPy's type, else the first NCCL group on the GPU fails with a TypeError."""
    from llmcupy.distributed import _nccl_comm_id, _nccl_id_bytes

    raw = bytes(range(256))[:128]
    assert _nccl_id_bytes(raw) == raw                       # CuPy 14's own form passes through
    signed = tuple(v - 256 if v > 127 else v for v in raw)  # CuPy 13's on x86
    assert _nccl_id_bytes(signed) == raw
    new = _nccl_comm_id(raw, "14.2.0")
    assert type(new) is bytes and new == raw
    old = _nccl_comm_id(raw, "13.6.0")
    assert type(old) is tuple and len(old) == 128 and _nccl_id_bytes(old) == raw
    import cupy

    if int(cupy.__version__.split(".")[0]) >= 14:          # what the GPU machine has (14.2)
        assert type(_nccl_comm_id(raw)) is bytes
