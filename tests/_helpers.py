"""Helpers shared by test files (imported as a plain module, like ``gen_inputs``)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout


def run_cli(main, argv):
    """(exit code, stdout, stderr) of one in-process CLI call (a module's ``main``); argparse's exits
    give their code. ``argv`` items may be paths or numbers: they are passed as strings."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:        # argparse's usage errors
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def run_train(argv):
    """:func:`run_cli` of the trainer (``llmcupy.train.main``)."""
    from llmcupy import train

    return run_cli(train.main, argv)


def ctrl_c_after(argv, marker: str, timeout: float = 300):
    """Runs ``python -m ...argv`` in its own process group, and once a line of its stdout contains
    ``marker``, sends SIGINT to the whole group, as Ctrl-C in a terminal does (the forked children
    get it too). Returns (exit code, stdout, stderr). SIGINT is set to its default in the child: a
    background job of a non-interactive shell would otherwise inherit it ignored."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if marker in line:
                os.killpg(proc.pid, signal.SIGINT)
                break
        out.append(proc.stdout.read())
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    return rc, "".join(out), "".join(err)
