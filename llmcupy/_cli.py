"""What every CLI does with an error: one line on stderr and one exit-code rule. The CLIs return
the codes as numbers; this table is where their meaning is written down.

    0    success
    1    an internal error (a bug: the traceback is printed) or, for validating CLIs, a FAIL
    2    bad input: arguments, missing/unreadable/malformed files, a shape a version refuses,
         no GPU or compiler for what was asked
    3    a run stopped by a non-finite loss
    130  interrupted (Ctrl-C)
    141  stdout closed before the output ended (``| head``), as a process killed by SIGPIPE
         (every CLI's ``__main__`` goes through :func:`run_main`)
"""

from __future__ import annotations

import argparse
import functools
import sys
import warnings


def run_main(main) -> int:
    """``sys.exit(run_main(main))`` in a CLI's ``__main__``: ``main()``'s exit code, or quietly 141
    when the reader of stdout went away (``--list | head``) instead of a BrokenPipeError traceback."""
    import os

    try:
        code = main()
        sys.stdout.flush()   # inside the try: what is still buffered may meet the closed pipe
        return code
    except BrokenPipeError:
        # Python's recipe: stdout points at /dev/null, so the flush at interpreter exit cannot fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=file or sys.stderr)


def one_line_warnings(main):
    """Decorates a CLI's ``main(argv)``: a warning (a bf16 model widened to fp32, an unreadable
    config.json) prints as ``warning: <message>``, not as Python's two lines naming llmcupy's source
    file and line. The previous warning settings are restored when ``main`` returns."""

    @functools.wraps(main)
    def wrapped(argv=None):
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return main(argv)

    return wrapped


def os_error_message(exc: OSError) -> str:
    """``path: reason`` for an OSError (no errno prefix), with what to do for the common cases."""
    name = exc.filename if exc.filename is not None else ""
    reason = exc.strerror or str(exc)
    if isinstance(exc, IsADirectoryError):
        return f"{name} is a folder; give a file"
    if isinstance(exc, FileNotFoundError) and exc.strerror:
        return f"{name}: no such file"
    return f"{name}: {reason}" if name else reason


def message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return os_error_message(exc)
    return str(exc) or type(exc).__name__


def fail(exc: BaseException, code: int = 2) -> int:
    """Prints ``error: <message>`` and returns ``code`` (2 unless told: bad input). A BrokenPipeError
    from stdout's reader going away (``| head``) is no bad input: it is raised again, for
    :func:`run_main` to end quietly with 141 (the CLIs hand every OSError here)."""
    if isinstance(exc, BrokenPipeError) and stdout_reader_gone():
        raise exc
    print(f"error: {message(exc)}", file=sys.stderr)
    return code


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it: poll() reports an error on it. Tells a
    closed ``| head`` from a broken pipe elsewhere (a peer's socket), which is a real error."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):   # no poll() (Windows), no real stdout (a notebook)
        return False


class BadPath(ValueError):
    """An output path a CLI cannot write (the message names the flag and the path)."""


def check_output_file(path, flag: str) -> None:
    """At start-up, before any work: ``path`` can be written as a file (its folder exists and takes
    files; it is not a folder; see :func:`llmcupy.fileio.output_path_problem`). Raises
    :class:`BadPath` naming the flag and the path. An existing file is left as it is."""
    import os

    from .fileio import output_path_problem

    problem = output_path_problem(path, renamed_over=True)   # the writers are atomic_write: /dev/null, as root
    if problem is not None:
        raise BadPath(f"{flag} {os.fspath(path)}: {problem}")


def check_output_folder(path, flag: str) -> None:
    """At start-up: ``path`` is (or can be made) a folder that takes files. Creates it (as the write
    would); raises :class:`BadPath`."""
    import os

    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise BadPath(f"{flag} {path} is a file; give a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise BadPath(f"{flag} {path}: cannot create the folder ({exc.strerror or exc})") from None
    from .fileio import output_path_problem

    problem = output_path_problem(os.path.join(path, "new-file"))  # the folder takes a new file
    if problem is not None:
        raise BadPath(f"{flag} {path}: {problem}")


def int_at_least(low: int):
    """An argparse ``type``: an int >= ``low``, else argparse's one-line usage error (exit 2) instead
    of a traceback deep in the run (a negative seed in NumPy, zero timed samples in a mean)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"needs an integer >= {low}, got {value}")
        return value

    parse.__name__ = "int"   # argparse names the type in some messages
    return parse


class OneValue(argparse.Action):
    """A flag that may be repeated with the same value but not changed by a later occurrence or by
    an alias (-x for --steps): argparse would keep the last value silently."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_given_flags", None)
        if given is None:
            given = {}
            setattr(namespace, "_given_flags", given)
        if self.dest in given and given[self.dest][1] != values:
            flag, value = given[self.dest]
            parser.error(f"{flag} {value} and {option_string} {values} contradict each other; give one")
        given[self.dest] = (option_string, values)
        setattr(namespace, self.dest, values)
