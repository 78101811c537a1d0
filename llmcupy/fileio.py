"""Helpers shared by llm.c's binary file formats: 1024-byte headers, exact sizes, atomic writes.

Every llm.c file (model, debug state, tokenizer, token shards) starts with a header of 256
little-endian 4-byte integers; field 0 is a magic number, field 1 a version. Readers here check
those and the exact file size, and raise :class:`FileFormatError` with a message that names the
file and what is wrong. Writers go through :func:`atomic_write`: the bytes go to a temporary file
in the destination's folder, are flushed and fsync'ed, and only then renamed over the destination
(``os.replace``), so an interrupted save (an error, Ctrl-C) leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import tempfile
from pathlib import Path

import numpy as np

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


class FileFormatError(ValueError):
    """A file is not what its reader expects (bad magic, unsupported version, wrong size...)."""


def read_header(f, path, what: str, *, unsigned: bool = False) -> np.ndarray:
    """Reads the 1024-byte header of an open binary file; raises if the file is shorter."""
    raw = f.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise FileFormatError(f"{path}: truncated {what}: the header needs {HEADER_BYTES} bytes, "
                              f"the file has only {len(raw)}")
    return np.frombuffer(raw, dtype="<u4" if unsigned else "<i4").copy()


# llm.c's other file kinds, named when one is given in place of another (-e train.bin)
KNOWN_MAGICS = {20240326: "an llm.c model file", 20240327: "an llm.c debug-state file",
                20240328: "an llm.c tokenizer file", 20240520: "an llm.c token (data) file"}


def check_magic_version(header, path, what: str, magic: int, versions, hint: str = "") -> int:
    """Checks header[0] (magic) and header[1] (version in ``versions``); returns the version. ``what``
    names the kind of file after "an" ("llm.c model file")."""
    hint = f" ({hint})" if hint else ""
    if int(header[0]) != magic:
        kind = KNOWN_MAGICS.get(int(header[0]))
        if kind is not None:   # another llm.c file given in the wrong place: say which it is
            raise FileFormatError(f"{path}: bad magic number {int(header[0])} (expected {magic}): it is {kind}, "
                                  f"not an {what}; check which file this flag takes")
        raise FileFormatError(f"{path}: bad magic number {int(header[0])} (expected {magic}): "
                              f"not an {what}{hint}")
    version = int(header[1])
    if version not in versions:
        ok = " or ".join(str(v) for v in versions)
        raise FileFormatError(f"{path}: unsupported {what} version {version} (supported: {ok}){hint}")
    return version


def check_size(path, what: str, actual: int, expected: int, detail: str = "") -> None:
    """Raises when a file's size is not exactly ``expected`` bytes (truncated or trailing data)."""
    detail = f" ({detail})" if detail else ""
    if actual < expected:
        raise FileFormatError(f"{path}: truncated {what}: expected {expected} bytes{detail}, "
                              f"the file has {actual} ({expected - actual} missing)")
    if actual > expected:
        raise FileFormatError(f"{path}: size mismatch in {what}: expected {expected} bytes{detail}, "
                              f"the file has {actual} ({actual - expected} unexpected trailing bytes)")


def file_size(f) -> int:
    return os.fstat(f.fileno()).st_size


def make_header(*fields: int, unsigned: bool = False) -> bytes:
    """A 1024-byte header holding ``fields`` at indices 0.. and zeros after."""
    if len(fields) > HEADER_INTS:
        raise ValueError("too many header fields")
    header = np.zeros(HEADER_INTS, dtype="<u4" if unsigned else "<i4")
    header[:len(fields)] = fields
    return header.tobytes()


def write_array(f, array, dtype) -> None:
    """Writes ``array`` to ``f`` as contiguous little-endian ``dtype`` without an extra copy when
    it already has that layout."""
    a = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<"))
    f.write(memoryview(a.reshape(-1)).cast("B"))


def read_array(f, dtype, count: int) -> np.ndarray:
    """Reads ``count`` items of little-endian ``dtype`` from the current position (native order)."""
    dt = np.dtype(dtype).newbyteorder("<")
    out = np.empty(count, dtype=dt)
    view = memoryview(out).cast("B")
    got = f.readinto(view)
    while got is not None and got < len(view):  # readinto may return short reads on some streams
        more = f.readinto(view[got:])
        if not more:
            break
        got += more
    if got != len(view):
        raise EOFError(f"needed {len(view)} bytes, got {got}")
    return out.astype(np.dtype(dtype).newbyteorder("="), copy=False)


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temporaries_of(path) -> str:
    """The glob pattern of the hidden temporaries :func:`atomic_write` makes for ``path`` (a save
    killed by SIGKILL or a lost node leaves one behind, as big as the file)."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(glob.escape(folder), glob.escape(f".{name}.") + "*.tmp")


def remove_stale_temporaries(patterns) -> None:
    """Deletes the files the glob ``patterns`` match (temporaries an interrupted save left), saying
    what each one was. Call only while no save of this run can be under way."""
    for pattern in patterns:
        for tmp in glob.glob(pattern):
            try:
                size = os.path.getsize(tmp)
                os.unlink(tmp)
                print(f"removed {tmp} ({size / 2**20:.1f} MiB), left by an interrupted save")
            except OSError:
                pass


@contextlib.contextmanager
def atomic_write(path):
    """Context manager yielding a binary file that replaces ``path`` only when the block succeeds.

    The temporary file sits in the same folder (so the rename is atomic), is fsync'ed before the
    rename, and is removed if the block raises anything, KeyboardInterrupt included; the previous
    ``path`` (if any) is then untouched. A SIGTERM (Python's default unwinds nothing) or SIGKILL
    leaves the temporary: the trainer's next run removes those beside its state, checkpoints and log
    (:func:`remove_stale_temporaries`). An OSError that names no file (a full disk) is raised again
    naming ``path``. Missing parent folders are created.
    """
    path = Path(path)
    # the rename replaces whatever the name holds: a folder failed naming the hidden temporary file,
    # and a device or FIFO (--save-path /dev/null, as root) would be replaced by a regular file
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if path.exists() and not path.is_file():
        raise OSError(errno.EEXIST, "exists and is not a regular file (a device, FIFO or socket), which the save "
                      "would replace; give a file name", str(path))
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file private (0600); give it the permissions a plain open() would.
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # a failed write or fsync (a full disk) names no file, so a CLI printed only "No space
            # left on device": name the file being saved (left as it was)
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (not possible everywhere)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def output_path_problem(path, *, makes_folders: bool = False, renamed_over: bool = False) -> str | None:
    """Why ``path`` cannot be written, or None when it can: checked at start-up, so that a run does
    not compute for hours and then fail at its first write (naming a temporary file the user never
    chose). ``makes_folders``: the writer creates missing parent folders (:func:`atomic_write` does),
    so the nearest existing one must take a new file; otherwise the parent itself must exist.
    ``renamed_over``: the writer is :func:`atomic_write` (implied by ``makes_folders``), so the name
    must not hold a device, FIFO or socket."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        return "it is a folder; give a file name"
    if (makes_folders or renamed_over) and os.path.exists(target) and not os.path.isfile(target):
        # atomic_write renames over the name: a device or FIFO would be replaced (and atomic_write refuses)
        return "it exists and is not a regular file (a device, FIFO or socket); give a file name"
    folder = os.path.dirname(target)
    if makes_folders:
        while not os.path.exists(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
    if not os.path.exists(folder):
        return f"the folder {folder} does not exist"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    # a real probe: os.access answers yes to root everywhere, /proc and read-only mounts included
    try:
        fd, probe = tempfile.mkstemp(prefix=".llmcupy-write-check.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot create a file in {folder} ({exc.strerror or exc})"
    if os.path.exists(target) and not makes_folders and not os.access(target, os.W_OK):
        return "the file exists and is not writable"   # atomic_write replaces the file: only the folder counts
    return None


def output_folder_problem(path) -> str | None:
    """Why files cannot be written into the folder ``path`` (made if missing), or None: an existing
    file there (or on the way there) was reported as a bare "File exists" from mkdir."""
    if os.path.isfile(path):
        return "it is a file; give a folder"
    return output_path_problem(os.path.join(path, "file"), makes_folders=True)
