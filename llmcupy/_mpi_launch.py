"""A rank under mpirun/mpiexec that fails before it joined MPI: ending the job instead of hanging it.

The other ranks wait in MPI_Init for every rank (MPICH's launcher does not end the job when a
process exits without joining), forever and spinning, past any ``--dist-timeout``. A rank that
cannot start therefore joins MPI itself and calls MPI_Abort, which ends every rank.

Standard library only: this module must work when importing numpy, or llmcupy itself, is what
failed (a broken install on one node). ``llmcupy/__init__.py`` imports it first.
"""

from __future__ import annotations

import os
import sys

# the rank first (MPICH/Hydra, Open MPI, PMIx), then the only variable some launchers set
MPI_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID")
TRAINER = "llmcupy.train"   # the one CLI whose ranks all join MPI (llmcupy.distributed.init)
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
              "for it in MPI_Init: stop them (Ctrl-C, or cancel the job)", file=sys.stderr)


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
