"""Data parallelism: the process group, its collectives and the rendezvous.

One process per GPU (or per emulated device). How the processes find each other:

* **MPI** (``mpirun -np N python -m llmcupy.train ...`` / ``mpiexec``): detected from the launcher's
  environment (MPICH/Hydra ``PMI_RANK``, Open MPI ``OMPI_COMM_WORLD_RANK``, PMIx ``PMIX_RANK``);
  mpi4py gives the rank, the world size and the local rank (rank among the processes of its node).
* **Without MPI** (clusters with another launcher): ``--world-size N --rank R`` (or
  ``LLMCUPY_WORLD_SIZE`` / ``LLMCUPY_RANK``), optionally ``--gpus-per-node`` (local rank = rank mod
  it; default: the node's GPU count) and a rendezvous ``--rendezvous tcp://HOST:PORT`` (rank 0
  listens there) or ``file:///shared/path`` (rank 0 writes NCCL's unique id there, the others
  read it). GPUs only: the emulator's collectives need MPI.

The collectives (``allreduce_sum``, ``reduce_scatter_sum``, ``allgather``, ``broadcast``) take
the backend's arrays: on ``cuda`` they are NCCL calls (``cupy.cuda.nccl``) on CuPy's current
stream; in the emulator (``sim``) the same calls are MPI's on the host arrays. Every collective
waits with a timeout (``--dist-timeout``): a rank that died or hangs does not hang the others
forever; they stop with a :class:`PeerTimeout` naming the missing rank(s) (found by a short
exchange among the survivors over MPI, or through the rendezvous folder of a ``file://``
rendezvous; a ``tcp://`` rendezvous cannot name them).

:class:`SingleProcess` (world size 1, no launcher, no flags) has no collectives at all; the
trainer then runs its one-process step. ``mpiexec -n 1`` or ``--world-size 1`` run the
collective path with one rank (NCCL on a GPU), which is how one GPU tests it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
from urllib.parse import urlparse

import numpy as np

from ._mpi_launch import STARTUP_TIMEOUT, launched_by_mpi, watch_mpi_init
from .runtime import backend as _backend

DEFAULT_TIMEOUT = 600.0      # seconds; the emulator's first step compiles every kernel, minutes on a busy CPU
# STARTUP_TIMEOUT (from _mpi_launch, which needs it without numpy): the floor of every wait until the
# first step is through, the rendezvous and MPI_Init included
_DIAG_TAG = 7301             # MPI tag of the exchange that names missing ranks


RANK = 0                     # this process's rank once init() ran
ACTIVE = None                # the group of this process once init() made one (main() aborts it on errors)


class DistError(RuntimeError):
    """The processes cannot work together: a bad launch, mismatched flags, a failed rendezvous."""


class PeerTimeout(DistError):
    """A collective did not complete in time: a rank died, hangs or was stopped."""


def add_arguments(parser) -> None:
    g = parser.add_argument_group("processes (without MPI; under mpirun/mpiexec these come from MPI)")
    g.add_argument("-pn", "--world-size", type=int, default=None,
                   help="number of processes (env LLMCUPY_WORLD_SIZE)")
    g.add_argument("-pr", "--rank", type=int, default=None, help="this process's rank (env LLMCUPY_RANK)")
    g.add_argument("-pg", "--gpus-per-node", type=int, default=None,
                   help="local rank = rank mod this (default: the node's GPU count)")
    g.add_argument("--rendezvous", default=None, metavar="URL",
                   help="tcp://HOST:PORT (rank 0 listens) or file:///shared/path (env LLMCUPY_RENDEZVOUS)")
    g.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds a collective may wait for the other ranks (default {DEFAULT_TIMEOUT:.0f}; at least "
                        f"{STARTUP_TIMEOUT:.0f} until the first step is through)")


def _env_int(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise DistError(f"{name}={v!r} is not an integer") from None


# ---------------------------------------------------------------------------------------------
# groups


class SingleProcess:
    """World size 1 without collectives (the one-process trainer)."""

    rank, world_size, local_rank = 0, 1, 0
    collective = False
    kind = "single process"

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [data]

    def mean(self, x: float) -> float:
        return float(x)

    def barrier(self) -> None:
        pass

    def abort(self, code: int) -> None:
        pass

    def close(self) -> None:
        pass


class _Group:
    """Shared logic of the MPI and NCCL groups: scalars, bytes, timeouts, naming missing ranks."""

    collective = True

    def __init__(self, rank, world_size, local_rank, timeout, mpi_comm=None, rendezvous_dir=None):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.timeout = float(timeout)
        self.mpi = mpi_comm               # the control plane when launched by MPI
        self.rendezvous_dir = rendezvous_dir
        self.count = 0                    # collectives so far (the same sequence on every rank)
        self.started = False              # set by the trainer once the first step is through

    # -- waiting

    def _wait(self, done, what: str, on_timeout=None) -> None:
        """Polls ``done()`` until true; after the timeout names the missing ranks and raises."""
        self.count += 1
        limit = self.timeout if self.started else max(self.timeout, STARTUP_TIMEOUT)
        deadline = time.monotonic() + limit
        pause = 1e-5
        while not done():
            if time.monotonic() > deadline:
                who = self._missing_text()
                if on_timeout is not None:
                    on_timeout()
                raise PeerTimeout(
                    f"rank {self.rank}: {what} (collective #{self.count}) did not complete within "
                    f"{limit:g} s: {who} (died, hung or stopped); stopping. Resume from the last "
                    "checkpoint with -y 1; --dist-timeout sets the limit")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _missing_text(self) -> str:
        try:
            missing = self._missing_ranks()
        except Exception as exc:  # noqa: BLE001 - the diagnosis itself may fail on a broken world
            return f"the missing rank(s) could not be determined ({type(exc).__name__}: {exc})"
        if missing is None:
            return "the missing rank(s) cannot be named with this rendezvous"
        if missing:
            return f"rank(s) {', '.join(map(str, missing))} did not reach it"
        return "every rank answered, but the collective did not complete"

    def _missing_ranks(self):
        """After a timeout: the ranks that do not answer within a short grace period. Every
        surviving rank that is stuck in the same collective times out too and answers."""
        grace = min(10.0, max(2.0, self.timeout / 4))
        peers = [r for r in range(self.world_size) if r != self.rank]
        if self.mpi is not None:
            from mpi4py import MPI

            mine = np.array([self.count], dtype=np.int64)
            sends = [self.mpi.Isend(mine, dest=r, tag=_DIAG_TAG) for r in peers]
            bufs = {r: np.zeros(1, dtype=np.int64) for r in peers}
            recvs = {r: self.mpi.Irecv(bufs[r], source=r, tag=_DIAG_TAG) for r in peers}
            end = time.monotonic() + grace
            while time.monotonic() < end and not all(q.Test() for q in recvs.values()):
                time.sleep(0.01)
            missing = [r for r, q in recvs.items() if not q.Test()]
            for q in list(recvs.values()) + sends:   # nothing may stay posted on our buffers
                if not q.Test():
                    try:
                        q.Cancel()
                    except MPI.Exception:
                        pass
            return missing
        if self.rendezvous_dir is not None:
            mark = os.path.join(self.rendezvous_dir, f"alive.{self.count}.{self.rank}")
            with open(mark, "w"):
                pass
            end = time.monotonic() + grace
            while time.monotonic() < end:
                missing = [r for r in peers
                           if not os.path.exists(os.path.join(self.rendezvous_dir, f"alive.{self.count}.{r}"))]
                if not missing:
                    return []
                time.sleep(0.05)
            return missing
        return None

    # -- control plane on top of the collectives

    def mean(self, x: float) -> float:
        """The mean of a float over the ranks (loss, validation loss)."""
        xp = _backend.xp()
        buf = xp.asarray(np.array([x], dtype=np.float64))
        self.allreduce_sum(buf, "mean of a scalar")
        return float(_backend.to_numpy(buf)[0]) / self.world_size

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's bytes, in rank order (flags, checkpoint facts): lengths first, then the
        bytes padded to the longest."""
        xp = _backend.xp()
        n = self.world_size
        lengths = xp.zeros(n, dtype=np.int64)
        lengths[self.rank] = len(data)
        self.allgather(lengths, "allgather of lengths")
        lengths = [int(v) for v in _backend.to_numpy(lengths)]
        width = max(max(lengths), 1)
        buf = np.zeros(n * width, dtype=np.uint8)
        buf[self.rank * width: self.rank * width + len(data)] = np.frombuffer(data, dtype=np.uint8)
        dev = xp.asarray(buf)
        self.allgather(dev, "allgather of bytes")
        out = _backend.to_numpy(dev)
        return [out[r * width: r * width + lengths[r]].tobytes() for r in range(n)]

    def barrier(self) -> None:
        self.allgather_bytes(b"")


class MPIGroup(_Group):
    """Collectives over MPI on host (NumPy) arrays: the emulator's data plane."""

    kind = "MPI (host arrays)"
    host = True

    def __init__(self, comm, local_rank, timeout):
        super().__init__(comm.Get_rank(), comm.Get_size(), local_rank, timeout, mpi_comm=comm)
        from mpi4py import MPI

        self.MPI = MPI

    def _run(self, req, what):
        def done():
            try:
                return req.Test()
            except self.MPI.Exception as exc:   # a peer's death seen by MPI (errors return, see init)
                raise PeerTimeout(f"rank {self.rank}: {what} (collective #{self.count}) failed: {exc}; "
                                  f"{self._missing_text()}; stopping. Resume from the last checkpoint "
                                  "with -y 1") from exc
        self._wait(done, what)

    def allreduce_sum(self, buf, what="all-reduce") -> None:
        self._run(self.mpi.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM), what)

    def reduce_scatter_sum(self, send, recv, what="reduce-scatter") -> None:
        """recv (count c) = the sum over ranks of send[rank*c:(rank+1)*c]; send holds world*c."""
        self._run(self.mpi.Ireduce_scatter_block(send, recv, op=self.MPI.SUM), what)

    def allgather(self, buf, what="all-gather") -> None:
        """In place: buf holds world equal slots; slot ``rank`` is this rank's contribution."""
        self._run(self.mpi.Iallgather(self.MPI.IN_PLACE, buf), what)

    def broadcast(self, buf, root: int, what="broadcast") -> None:
        self._run(self.mpi.Ibcast(buf, root=root), what)

    def abort(self, code: int) -> None:
        if self.world_size > 1:
            self.mpi.Abort(code)

    def close(self) -> None:
        pass


class NCCLGroup(_Group):
    """Collectives through NCCL (``cupy.cuda.nccl``) on device arrays, on CuPy's current stream."""

    kind = "NCCL"
    host = False

    def __init__(self, rank, world_size, local_rank, timeout, unique_id, mpi_comm=None, rendezvous_dir=None):
        super().__init__(rank, world_size, local_rank, timeout, mpi_comm=mpi_comm, rendezvous_dir=rendezvous_dir)
        from cupy.cuda import nccl

        self.nccl = nccl
        self.comm = nccl.NcclCommunicator(world_size, unique_id, rank)

    def _types(self, buf):
        nccl = self.nccl
        kinds = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                 np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint8): nccl.NCCL_UINT8}
        try:
            return kinds[np.dtype(buf.dtype)]
        except KeyError:
            raise DistError(f"NCCL collective on a {buf.dtype} array is not supported here") from None

    def _run(self, what):
        import cupy

        stream = cupy.cuda.get_current_stream()
        event = stream.record()

        def done():
            try:
                self.comm.check_async_error()   # a network error NCCL already saw
            except self.nccl.NcclError as exc:
                raise PeerTimeout(f"rank {self.rank}: {what} (collective #{self.count}) failed in NCCL: {exc}; "
                                  f"{self._missing_text()}; stopping. Resume from the last checkpoint "
                                  "with -y 1") from exc
            return event.done

        self._wait(done, what, on_timeout=self.comm.abort)

    @staticmethod
    def _stream():
        import cupy

        return cupy.cuda.get_current_stream().ptr

    def allreduce_sum(self, buf, what="all-reduce") -> None:
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._types(buf), self.nccl.NCCL_SUM,
                            self._stream())
        self._run(what)

    def reduce_scatter_sum(self, send, recv, what="reduce-scatter") -> None:
        self.comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, self._types(send), self.nccl.NCCL_SUM,
                                self._stream())
        self._run(what)

    def allgather(self, buf, what="all-gather") -> None:
        count = buf.size // self.world_size
        send = buf.data.ptr + self.rank * count * buf.itemsize   # NCCL's in-place all-gather
        self.comm.allGather(send, buf.data.ptr, count, self._types(buf), self._stream())
        self._run(what)

    def broadcast(self, buf, root: int, what="broadcast") -> None:
        self.comm.broadcast(buf.data.ptr, buf.data.ptr, buf.size, self._types(buf), root, self._stream())
        self._run(what)

    def abort(self, code: int) -> None:
        try:
            self.comm.abort()
        except Exception:  # noqa: BLE001 - already aborted or destroyed
            pass
        if self.mpi is not None and self.world_size > 1:
            self.mpi.Abort(code)

    def close(self) -> None:
        try:
            self.comm.destroy()
        except Exception:  # noqa: BLE001
            pass


# ---------------------------------------------------------------------------------------------
# rendezvous of NCCL's unique id without MPI


def _nccl_id_bytes(uid) -> bytes:
    """NCCL's unique id as bytes: CuPy >= 14 returns bytes already, older CuPy a tuple of 128 C
    ``char`` values."""
    if isinstance(uid, (bytes, bytearray)):
        return bytes(uid)
    return bytes(v & 0xFF for v in uid)


def _nccl_comm_id(data: bytes, cupy_version: str | None = None):
    """The id in the form the installed CuPy's ``NcclCommunicator(ndev, commId, rank)`` takes.

    CuPy 14 changed ``commId`` to ``bytes`` (and ``get_unique_id`` to return bytes); a tuple there
    is a TypeError. CuPy 13 and older take a tuple of C ``char`` values, signed on x86, unsigned on
    Arm and POWER."""
    if cupy_version is None:
        import cupy

        cupy_version = cupy.__version__
    try:
        major = int(cupy_version.split(".")[0])
    except ValueError:
        major = 14
    if major >= 14:
        return bytes(data)
    import platform

    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        return tuple(v - 256 if v > 127 else v for v in data)
    return tuple(data)


def exchange_id(url: str, rank: int, world_size: int, make_id, timeout: float) -> bytes:
    """Rank 0 calls ``make_id()`` (bytes) and hands it to every other rank through ``url``
    (``tcp://HOST:PORT`` or ``file:///path``); every rank returns the same bytes."""
    check_rendezvous(url)
    u = urlparse(url)
    if u.scheme == "file":
        return _exchange_file(u.path, rank, world_size, make_id, timeout)
    return _exchange_tcp(u.hostname, u.port, rank, world_size, make_id, timeout)


def check_rendezvous(url: str) -> None:
    """A --rendezvous URL exchange_id can use, or a DistError saying what to give instead."""
    u = urlparse(url)
    if u.scheme == "file":
        # file://shared/rdv parses as host "shared", path "/rdv": it would have written /rdv
        if u.netloc not in ("", "localhost") or not u.path:
            raise DistError(f"--rendezvous {url!r}: expected file:///shared/path (three slashes: an absolute path)")
        if u.path.endswith("/") or os.path.isdir(u.path):
            # was "already exists ... remove it" (the user's shared folder), or a rename onto a folder
            raise DistError(f"--rendezvous {url!r} names a folder; name a file that does not exist yet in a folder "
                            f"every node sees, e.g. file://{u.path.rstrip('/')}/llmcupy-rendezvous")
        return
    if u.scheme == "tcp":
        try:
            port = u.port
        except ValueError:   # tcp://host:http or a port past 65535
            port = None
        if not u.hostname or not port:
            raise DistError(f"--rendezvous {url!r}: expected tcp://HOST:PORT")
        return
    raise DistError(f"--rendezvous {url!r}: expected tcp://HOST:PORT or file:///shared/path")


def _exchange_file(path, rank, world_size, make_id, timeout) -> bytes:
    header = f"llmcupy-rendezvous {world_size}\n".encode()
    if rank == 0:
        if os.path.exists(path):
            raise DistError(f"rendezvous file {path} already exists (left by an earlier run?); remove it "
                            "and start every rank again")
        data = make_id()
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:          # written aside and renamed: a reader never sees half of it
            f.write(header + data)
        os.replace(tmp, path)
        return data
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise DistError(f"rank {rank}: rank 0 did not write the rendezvous file {path} within {timeout:g} s")
        time.sleep(0.1)
    with open(path, "rb") as f:
        content = f.read()
    if not content.startswith(header):
        first = content.split(b"\n", 1)[0]
        raise DistError(f"rank {rank}: rendezvous file {path} is for another world size (expected "
                        f"{world_size}): {first!r}")
    return content[len(header):]


def _recv_exact(sock, n) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise DistError("rendezvous: connection closed early")
        data += chunk
    return data


def _exchange_tcp(host, port, rank, world_size, make_id, timeout) -> bytes:
    deadline = time.monotonic() + timeout
    if rank == 0:
        data = make_id()
        try:
            server = socket.create_server(("", port), reuse_port=False)
        except OSError as exc:   # was "[Errno 98] Address already in use", naming neither flag nor port
            raise DistError(f"rank 0: cannot listen on port {port} for --rendezvous tcp://{host}:{port} "
                            f"({exc.strerror}); choose a free port, the same for every rank") from None
        with server:
            server.settimeout(timeout)
            joined = set()
            while len(joined) < world_size - 1:
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    missing = sorted(set(range(1, world_size)) - joined)
                    raise DistError(f"rank 0: rank(s) {', '.join(map(str, missing))} did not join the "
                                    f"rendezvous on port {port} within {timeout:g} s") from None
                with conn:
                    conn.settimeout(timeout)
                    r, n = struct.unpack("<ii", _recv_exact(conn, 8))
                    if n != world_size or not 0 < r < world_size or r in joined:
                        conn.sendall(struct.pack("<i", -1))
                        raise DistError(f"rank 0: a process joined as rank {r} of {n}; this run has world size "
                                        f"{world_size} (ranks 1..{world_size - 1}, each once)")
                    conn.sendall(struct.pack("<i", len(data)) + data)
                    joined.add(r)
        return data
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(1.0, deadline - time.monotonic())) as s:
                s.sendall(struct.pack("<ii", rank, world_size))
                (n,) = struct.unpack("<i", _recv_exact(s, 4))
                if n < 0:
                    raise DistError(f"rank {rank}: rank 0 refused this rank (world size {world_size})")
                return _recv_exact(s, n)
        except socket.gaierror as exc:
            # a name no resolver knows (a typo) stays unknown: say so now, not after the whole timeout
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                raise DistError(f"rank {rank}: --rendezvous tcp://{host}:{port}: the host name {host!r} does not "
                                f"resolve ({exc.strerror}); give rank 0's host name or address") from None
            if time.monotonic() > deadline:
                raise DistError(f"rank {rank}: no rendezvous at tcp://{host}:{port} within {timeout:g} s "
                                f"({exc.strerror})") from None
            time.sleep(0.2)
        except OSError:
            if time.monotonic() > deadline:
                raise DistError(f"rank {rank}: no rendezvous at tcp://{host}:{port} within {timeout:g} s "
                                "(is rank 0 running, and the address reachable?)") from None
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# set-up


def init(args):
    """The process group this process belongs to (and its GPU selected), from MPI's environment or
    the flags; :class:`SingleProcess` when neither asks for one."""
    world = args.world_size if args.world_size is not None else _env_int("LLMCUPY_WORLD_SIZE")
    rank = args.rank if args.rank is not None else _env_int("LLMCUPY_RANK")
    url = args.rendezvous or os.environ.get("LLMCUPY_RENDEZVOUS")
    timeout = float(args.dist_timeout)
    if not timeout > 0:   # nan too: no deadline would ever pass, a hung rank would hang every rank
        raise DistError(f"--dist-timeout must be a positive number of seconds (got {timeout:g})")
    mpi = launched_by_mpi()
    sim = _backend.is_sim()
    if mpi:
        if world is not None or rank is not None or url:
            raise DistError("launched by MPI: the world size, rank and rendezvous come from MPI; drop "
                            "--world-size/--rank/--rendezvous (and LLMCUPY_WORLD_SIZE/RANK/RENDEZVOUS)")
        try:
            # ranks start minutes apart without a fault (a queue, a slow file system): the start-up floor
            with watch_mpi_init(max(timeout, STARTUP_TIMEOUT)):
                from mpi4py import MPI
        except ImportError as exc:
            raise DistError(f"launched by MPI but mpi4py is not importable ({exc}); "
                            "pip install 'llmcupy[mpi]'") from exc
        comm = MPI.COMM_WORLD
        # a dead peer raises (and we name it) instead of MPI aborting this process silently
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        if sim:
            return MPIGroup(comm, local, timeout)
        _select_device(local, comm.Get_rank())
        from cupy.cuda import nccl

        uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        uid = comm.bcast(uid, root=0)
        return NCCLGroup(comm.Get_rank(), comm.Get_size(), local, timeout, uid, mpi_comm=comm)
    if world is None and rank is None and not url:
        return SingleProcess()
    if world is None or rank is None:
        raise DistError("without MPI, give both --world-size and --rank (or LLMCUPY_WORLD_SIZE and LLMCUPY_RANK)")
    if world < 1:
        raise DistError(f"--world-size must be at least 1 (got {world})")
    if not 0 <= rank < world:
        raise DistError(f"--rank {rank} must lie in 0..{world - 1} (--world-size {world})")
    if sim:
        raise DistError("the emulator's collectives run over MPI: launch with mpiexec -n N python -m llmcupy.train "
                        "--backend sim ... (pip install 'llmcupy[mpi]')")
    if not url:
        if world > 1:
            raise DistError("without MPI, give a rendezvous: --rendezvous tcp://HOST:PORT or file:///shared/path")
        url = None
    else:
        check_rendezvous(url)   # before a GPU is touched
    gpn = args.gpus_per_node
    import cupy

    local = rank % (gpn if gpn else cupy.cuda.runtime.getDeviceCount())
    _select_device(local, rank)
    from cupy.cuda import nccl

    make = lambda: _nccl_id_bytes(nccl.get_unique_id())  # noqa: E731
    # ranks of one job start minutes apart (a queue, a slow file system) without a fault: the start-up
    # floor of the collectives applies to the rendezvous too (a short --dist-timeout catches hangs later)
    data = make() if url is None else exchange_id(url, rank, world, make, max(timeout, STARTUP_TIMEOUT))
    folder = None
    if url and urlparse(url).scheme == "file":
        folder = os.path.dirname(urlparse(url).path) or "."
    group = NCCLGroup(rank, world, local, timeout, _nccl_comm_id(data), rendezvous_dir=folder)
    if folder is not None:
        group.barrier()                      # every rank has read the id: the file can go
        if rank == 0:
            os.unlink(urlparse(url).path)
    return group


def _select_device(local_rank: int, rank: int) -> None:
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if local_rank >= count:
        raise DistError(f"rank {rank} is local rank {local_rank} on its node, but the node has {count} GPU(s); "
                        "start at most one process per GPU (or set --gpus-per-node)")
    cupy.cuda.Device(local_rank).use()


def abort_active(code: int) -> None:
    """After an error on this rank: stop the other ranks too (they would wait in the next collective
    until the timeout); MPI_Abort under MPI, NCCL's abort otherwise."""
    group = ACTIVE
    if group is not None and group.collective and group.world_size > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        group.abort(code)


def check_same_flags(group, flags: dict) -> None:
    """Every rank must run with the same flags; rank 0 names the differences, every rank stops."""
    if group.world_size == 1:
        return
    mine = json.dumps(flags, sort_keys=True, default=str).encode()
    everyone = group.allgather_bytes(mine)
    bad = [r for r, b in enumerate(everyone) if b != everyone[0]]
    if not bad:
        return
    ref = json.loads(everyone[0])
    lines = []
    for r in bad:
        theirs = json.loads(everyone[r])
        diff = sorted(k for k in set(ref) | set(theirs) if ref.get(k) != theirs.get(k))
        lines.append(f"rank {r}: " + ", ".join(f"{k}={theirs.get(k)!r} (rank 0: {ref.get(k)!r})" for k in diff))
    raise FlagMismatch("the ranks were started with different flags; every rank must get the same command "
                       "line. " + "; ".join(lines))


class FlagMismatch(DistError):
    pass
