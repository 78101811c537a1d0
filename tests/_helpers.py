"""Helpers shared by test files (imported as a plain module, like ``gen_inputs``)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout


def run_train(argv):
    """(exit code, stdout, stderr) of one in-process trainer run (``llmcupy.train.main``); argparse's
    exits give their code. ``argv`` items may be paths or numbers: they are passed as strings."""
    from llmcupy import train

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = train.main([str(a) for a in argv])
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()
