"""llmcupy: llm.c's CUDA kernel catalogue and FP32 GPT-2 trainer, driven from Python."""

from .runtime import (BackendError, KernelArgumentError, RawKernel, RawModule, get_backend, set_backend, to_numpy,
                      xp)

from . import ops  # noqa: E402  (llmcupy.ops["name"])

__version__ = "0.1.0"
__all__ = ["BackendError", "KernelArgumentError", "RawKernel", "RawModule", "get_backend", "ops", "set_backend", "to_numpy", "xp"]
