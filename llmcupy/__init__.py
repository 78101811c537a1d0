"""llmcupy: llm.c's CUDA kernel catalogue and FP32 GPT-2 trainer, driven from Python.

Kernels run on an NVIDIA GPU through CuPy (backend ``cuda``) or, without one, in a CPU emulator of
CUDA C (backend ``sim``); ``get_backend()`` says which, ``set_backend("sim")`` or the environment
variable ``LLMCUPY_BACKEND`` chooses. ``xp()`` is the matching array module (cupy or numpy)::

    import numpy as np
    import llmcupy

    op = llmcupy.ops["softmax_forward"]          # the catalogue: sorted(llmcupy.ops) lists the ops
    print(op.describe())                         # its kernel versions; help(op) for the rest
    x = llmcupy.xp().random.randn(64, 1000).astype(np.float32)
    y = op(x, version=5)                         # run kernel version 5
    err = abs(llmcupy.to_numpy(y) - op.reference(x)).max()

    mod = llmcupy.RawModule(code=cuda_source)    # your own kernels, as cupy.RawModule
    k = mod.get_function("scale")
    k((blocks,), (threads,), (out, x, np.float32(2.0), np.int32(n)))

Bad calls raise ``llmcupy.ops.OpError`` (an op) or ``KernelArgumentError`` (a kernel's arguments
against its C signature), naming what is wrong. The trainer is ``python -m llmcupy.train``; the
kernel CLI ``python -m llmcupy.kernel``.
"""

import importlib
import pkgutil

from ._mpi_launch import guard_trainer_start

# first: under mpirun, a rank whose imports below fail (numpy broken on its node) ends the job,
# where the other ranks would wait for it in MPI_Init forever
guard_trainer_start()

from .runtime import (BackendError, KernelArgumentError, RawKernel, RawModule, get_backend, set_backend, to_numpy,
                      xp)

from . import ops  # noqa: E402  (llmcupy.ops["name"])


def __getattr__(name):
    """The package's modules load on first use (``llmcupy.analyze.analyze_version``,
    ``llmcupy.model.activation_bytes``), so the README's dotted names work after ``import llmcupy``
    without making that import pay for the trainer or the analyzer."""
    if name in _submodules():
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _submodules() -> set[str]:
    return {info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")}


__version__ = "0.1.0"
__all__ = ["BackendError", "KernelArgumentError", "RawKernel", "RawModule", "get_backend", "ops", "set_backend", "to_numpy", "xp"]
