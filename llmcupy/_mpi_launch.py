"""A rank under mpirun/mpiexec that fails before it joined MPI: ending the job instead of hanging it.

The other ranks wait in MPI_Init for every rank (MPICH's launcher does not end the job when a
process exits without joining), spinning, past any ``--dist-timeout``. A rank that cannot start
therefore joins MPI itself and calls MPI_Abort, which ends every rank. A rank that cannot even do
that (llmcupy or mpi4py missing on its node) is caught by the others' watchdog of MPI_Init
(:func:`watch_mpi_init`), which ends them after their start-up limit.

Standard library only: this module must work when importing numpy, or llmcupy itself, is what
failed (a broken install on one node). ``llmcupy/__init__.py`` imports it first.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

# the rank first (MPICH/Hydra, Open MPI, PMIx), then the only variable some launchers set
MPI_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")
TRAINER = "llmcupy.train"   # the one CLI whose ranks all join MPI (llmcupy.distributed.init)
# Until the first step is through, ranks can be far apart for reasons that are not faults: one
# compiles the kernels while another finds them cached, token files are scanned, a tokenizer loads.
# A short --dist-timeout (set to catch hung ranks quickly) must not fire then (llmcupy.distributed).
STARTUP_TIMEOUT = 300.0
# the exception abort_unjoined_after reported (traceback and cause) without ending the job: the
# trainer's main() reports before it re-raises, and the excepthook then sees the same exception
_REPORTED: list = [None]


def launched_by_mpi() -> bool:
    return any(k in os.environ for k in MPI_ENV)


def _joined() -> bool:
    return "mpi4py.MPI" in sys.modules


def abort_unjoined(code) -> None:
    """After an error before this rank joined MPI (a bad flag on one rank only, an input file missing
    on one node): under mpirun, the others wait in MPI_Init for this rank, forever. Joining now and
    aborting ends them. Nothing to do without MPI, or once llmcupy.distributed.init imported mpi4py
    (the group's own paths then)."""
    if launched_by_mpi() and not _joined():
        _join_and_abort(code)


def _join_and_abort(code) -> ImportError | None:
    """MPI_Abort of the whole job, once joined; returns only alone in it (None), or with the
    ImportError when mpi4py cannot be imported here."""
    mpi = _join()
    if isinstance(mpi, ImportError):
        return mpi
    if mpi.COMM_WORLD.Get_size() > 1:
        mpi.COMM_WORLD.Abort(code if isinstance(code, int) and code else 1)
    return None


def _join():
    """mpi4py's MPI module, this rank joined to the job (MPI_Init), or the ImportError of mpi4py."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        from mpi4py import MPI
    except ImportError as exc:
        return exc
    return MPI


# The watchdog of MPI_Init: a separate process, because MPI_Init holds the GIL while it waits (no
# Python thread, signal handler or timer of this process runs until it returns). It waits for its
# stdin to close (MPI_Init returned, or this process died) or for the time limit.
_INIT_WATCHDOG = """
import os, select, signal, sys
pid, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if not ready:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    try:
        os.kill(pid, signal.SIGKILL)   # stuck in C: no handler would run for a gentler signal
    except ProcessLookupError:
        pass
"""


@contextlib.contextmanager
def watch_mpi_init(seconds: float):
    """Around this rank's MPI_Init (the import of mpi4py.MPI): a rank that never joins (its node lacks
    llmcupy or mpi4py, so Python stopped before any of this code ran, or the launcher never started
    it) leaves every other rank in MPI_Init, spinning, past any --dist-timeout. After ``seconds``
    the watchdog says so and ends this rank, and the launcher then ends the job."""
    message = (f"error: {_rank_text()}: MPI did not start within {seconds:.0f} s. MPI_Init waits for every "
               "rank of the job, and at least one never joined: a rank whose Python stopped before llmcupy "
               "ran (llmcupy or mpi4py not installed on its node: see that rank's error above) or that the "
               "launcher did not start. Ending this rank so that the launcher ends the job.")
    try:
        # -I: the user's PYTHONPATH and site packages have no say in a few lines of the standard library
        watchdog = subprocess.Popen([sys.executable, "-I", "-c", _INIT_WATCHDOG, str(os.getpid()), str(seconds),
                                     message], stdin=subprocess.PIPE)
    except OSError:   # no watchdog: MPI_Init as before, without a limit
        watchdog = None
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.stdin.close()   # MPI_Init returned (or raised): the watchdog exits
            watchdog.wait()


def _rank_text() -> str:
    for name in MPI_ENV[:3]:
        if os.environ.get(name, "").isdigit():
            return f"rank {os.environ[name]}"
    return "a rank"


def _launcher_world_size() -> int | None:
    """The number of ranks, from the launcher's environment (MPICH/Hydra, Open MPI); None if unsaid."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def abort_unjoined_after(exc: BaseException, traceback_shown: bool = False) -> None:
    """An exception (not an exit whose message is printed already) before this rank joined MPI: its
    traceback, one line naming the rank and the cause, then MPI_Abort. In that order: MPI_Abort ends
    this process at once, and MPICH's own line ("Abort(1) on node 1") names no cause. Alone
    (mpiexec -n 1) nothing waits: Python reports the exception as usual."""
    if not launched_by_mpi() or _joined() or _launcher_world_size() == 1:
        return
    mpi = None
    if _launcher_world_size() is None:
        # a launcher that names the rank but not the size (PMIx: srun --mpi=pmix, prterun): joining
        # tells. Alone, nothing waits and nothing is ended: Python reports the exception as usual
        mpi = _join()
        if not isinstance(mpi, ImportError) and mpi.COMM_WORLD.Get_size() == 1:
            return
    if not traceback_shown:
        import traceback

        traceback.print_exception(exc)
    # the last line: numpy's ImportError is twenty lines of advice ending in "Original error was: ..."
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    cause = f"{type(exc).__name__}: {lines[-1]}" if lines else type(exc).__name__
    who = _rank_text()
    print(f"error: {who} failed while starting ({cause}); ending every rank of the job", file=sys.stderr)
    _REPORTED[0] = exc
    why = mpi if isinstance(mpi, ImportError) else _join_and_abort(1)
    if why is not None:   # nothing else can tell the launcher: say so rather than leave a silent hang
        print(f"error: {who} cannot end the job: mpi4py does not import here ({why}); the other ranks wait "
              f"for it in MPI_Init until their start-up limit ends them (--dist-timeout, at least "
              f"{STARTUP_TIMEOUT:.0f} s), or "
              "stop them (Ctrl-C, or cancel the job)", file=sys.stderr)


def _running_as_trainer() -> bool:
    """Whether this process is ``python [options] -m llmcupy.train ...`` importing its package now.
    While runpy imports the package of a ``-m`` module, sys.argv[0] is "-m" and sys.argv[1:] are
    the module's arguments; sys.orig_argv is the whole command line, the module's name just before
    those arguments (alone, or joined to the option: ``-mllmcupy.train``, ``-um...``)."""
    if sys.argv[:1] != ["-m"]:
        return False
    argv = list(getattr(sys, "orig_argv", ()))
    before_arguments = len(argv) - (len(sys.argv) - 1)
    if before_arguments < 2:
        return False
    name = argv[before_arguments - 1]
    return name == TRAINER or (name.startswith("-") and name.endswith("m" + TRAINER))


def guard_trainer_start() -> None:
    """Under mpirun, for ``python -m llmcupy.train`` only: an exception that ends this process before
    it joined MPI (an ImportError of numpy while llmcupy is imported, before the trainer's main()
    can catch anything) ends the whole job too, saying which rank and why. Other programs that
    import llmcupy are left alone: their other ranks may never join MPI, and joining would hang."""
    if not launched_by_mpi() or not _running_as_trainer():
        return
    previous = sys.excepthook

    def end_the_job(kind, exc, tb):
        if exc is _REPORTED[0]:
            return   # main() printed its traceback and cause, and why it could not end the job
        previous(kind, exc, tb)                 # the traceback, as Python prints it
        if issubclass(kind, Exception):         # Ctrl-C reaches every rank: none waits for this one
            abort_unjoined_after(exc, traceback_shown=True)

    sys.excepthook = end_the_job
