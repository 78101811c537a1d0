"""The kernel catalogue: every op module in this package that defines ``OP`` is registered.

``llmcupy.ops`` is itself a read-only mapping from op name to :class:`~llmcupy.ops._op.Op`::

    import llmcupy
    op = llmcupy.ops["softmax_forward"]
    sorted(llmcupy.ops)            # every op name
    "softmax_forward" in llmcupy.ops, len(llmcupy.ops), dict(llmcupy.ops)
    print(op.describe())           # its versions; help(op) says how to run them

``llmcupy.ops.softmax_forward`` (with a dot) is the op's Python module, whose docstring describes
the call in detail; the op itself is ``llmcupy.ops["softmax_forward"]`` (the module's ``OP``).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types

from ._op import (ALL_BLOCK_SIZES, Bound, GrowingTolerance, Op, OpDefinitionError, OpError, Version, add_hook, check_outputs, compare, current_phase,
                  phase, remove_hook)

_REGISTRY: dict[str, Op] = {}
# module name -> why that op module registered nothing (looking its name up says so, as --list does)
_UNREGISTERED: dict[str, str] = {}


def _discover() -> dict[str, Op]:
    if not _REGISTRY:
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
            if info.name.startswith("_"):
                continue   # helpers shared by several ops (_op, _elementwise...)
            module = importlib.import_module(f"{__name__}.{info.name}")
            op = getattr(module, "OP", None)
            where = f"llmcupy/ops/{info.name}.py"
            if not isinstance(op, Op):
                _UNREGISTERED[info.name] = (f"{where} defines no OP = Op(...), which is what registers an op" if op is None
                                            else f"{where}'s OP is a {type(op).__name__}, not an Op")
            elif op.name != info.name:
                # an op module copied from another and left with its name= would otherwise replace that op
                _UNREGISTERED[info.name] = (f"{where} names its OP {op.name!r}; an op's name is its module's: "
                                            f"name it {info.name!r} (or rename the file)")
            else:
                _REGISTRY[op.name] = op
    return _REGISTRY


def unregistered() -> dict[str, str]:
    """Op modules that registered nothing: module name -> what is wrong (empty when every one registered)."""
    _discover()
    return dict(_UNREGISTERED)


def get(name: str) -> Op:
    """The op named ``name``; an OpError listing every op if there is none."""
    ops = _discover()
    if not isinstance(name, str):
        raise OpError(f"ops are looked up by name (a str), got {type(name).__name__} {name!r}; ops: "
                      f"{', '.join(sorted(ops))}")
    if name not in ops:
        why = f" ({_UNREGISTERED[name]})" if name in _UNREGISTERED else ""
        raise OpError(f"unknown op {name!r}{why}; ops: {', '.join(sorted(ops))}")
    return ops[name]


def names() -> list[str]:
    return sorted(_discover())


class _OpsModule(types.ModuleType):
    """Lets the package be used as ``llmcupy.ops["name"]``, ``"name" in llmcupy.ops``, ``list(llmcupy.ops)``."""

    def __getitem__(self, name: str) -> Op:
        return get(name)

    def __contains__(self, name) -> bool:
        return name in _discover()

    def __iter__(self):
        return iter(names())

    def __len__(self) -> int:
        return len(_discover())

    def keys(self):
        return names()

    def values(self):
        return [get(n) for n in names()]

    def items(self):
        return [(n, get(n)) for n in names()]

    def _ipython_key_completions_(self):
        # IPython / Jupyter complete `llmcupy.ops["so<TAB>` from this (a module has no keys otherwise)
        return names()


sys.modules[__name__].__class__ = _OpsModule

__all__ = ["ALL_BLOCK_SIZES", "Bound", "GrowingTolerance", "Op", "OpDefinitionError", "OpError", "Version", "add_hook", "check_outputs", "compare",
           "current_phase", "get", "names", "phase", "remove_hook", "unregistered"]
