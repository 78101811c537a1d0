"""The names the GPU path uses exist in the installed CuPy, nvmath-python and cuda-python.

The ``cuda`` backend's code runs only on a GPU, which CI does not have, so a misspelt or renamed
attribute there (``cupy.cuda.runtime.streamCaptureModeThreadlocal``, a device attribute CuPy does
not define) would first fail in a GPU session, where minutes are scarce. These packages import
without a GPU, so every dotted name the package takes from them is looked up here:

* attribute chains rooted at an imported module (``cupy.cuda.runtime.memcpyAsync``) or at a local
  name bound to one (``rt = cupy.cuda.runtime`` ... ``rt.deviceGetAttribute``);
* ``from X import Y`` of those packages;
* the names given to ``backend.device_attribute("...")``, which it turns into
  ``cupy.cuda.runtime.cudaDevAttr<name>`` at run time.

Names reached through an object a call returned (``cupy.cuda.Device().id``) are not followed: only
running on a GPU checks those (``pytest -m gpu``). Nor are the names of a CuPy wrapper whose library
is absent here (without libnccl, ``cupy.cuda.nccl`` imports empty: ``available`` is False), nor those
of a namespace package's part that is not installed (``cuda.pathfinder``).
"""

import ast
import importlib
import types
import warnings
from pathlib import Path

import pytest

import llmcupy

PACKAGE = Path(llmcupy.__file__).parent
ROOTS = ("cupy", "cupyx", "nvmath", "cuda")   # cuda: cuda-python's cuda.bindings / cuda.pathfinder


def _chain(node):
    """``a.b.c`` as ("a", ["b", "c"]), or None when it does not start at a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, parts[::-1]) if isinstance(node, ast.Name) else None


def _used_names():
    """(dotted name, where) for every name the package takes from ROOTS."""
    used = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = lambda node: f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"  # noqa: E731
        # module aliases, per file: `import cupy`, `import cupy as cp`, `from cupy import cuda`,
        # `rt = cupy.cuda.runtime` (a local alias of a module path)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in ROOTS:
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in ROOTS:
                for a in node.names:
                    used.append((f"{node.module}.{a.name}", where(node)))
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and (c := _chain(node.value)) and c[0] in aliases):
                aliases[node.targets[0].id] = ".".join([aliases[c[0]], *c[1]])
        # the outermost attribute chains (a.b.c, not also its a.b)
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                c = _chain(node)
                if c and c[0] in aliases:
                    used.append((".".join([aliases[c[0]], *c[1]]), where(node)))
            if (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                    and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "device_attribute"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                used.append((f"cupy.cuda.runtime.cudaDevAttr{node.args[0].value}", where(node)))
    return used


class _Unavailable(Exception):
    """A CuPy library wrapper imported without its library: nothing in it can be looked up here."""


def _resolve(dotted: str):
    """The object a dotted name stands for, importing submodules on the way (``cupy.cuda.nccl``)."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=2):
        if isinstance(obj, types.ModuleType) and getattr(obj, "available", True) is False:
            raise _Unavailable(obj.__name__)
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError as exc:
                if i == 2 and exc.name == ".".join(parts[:i]):
                    # a distribution of a namespace package that is not installed here (cuda.pathfinder
                    # of cuda-python): the package imports it under `try`, so there is nothing to check
                    raise _Unavailable(exc.name) from None
                if exc.name == ".".join(parts[:i]):   # neither an attribute nor a submodule
                    raise AttributeError(f"{'.'.join(parts[:i - 1])} has no attribute {part!r}") from None
                raise
    return obj


def test_the_scan_finds_the_gpu_paths_names():
    # the scan itself: it must see what the cuda backend is known to use, or the test below could
    # pass by finding nothing
    names = {name for name, _ in _used_names()}
    for expected in ("cupy.cuda.runtime.streamCaptureModeThreadLocal", "cupy.cuda.runtime.deviceGetAttribute",
                     "cupy.cuda.runtime.cudaDevAttrMultiProcessorCount", "cupy.cuda.get_current_stream",
                     "nvmath.bindings.cublasLt"):
        assert expected in names, f"{expected} not found by the scan"


@pytest.mark.parametrize("root", ROOTS)
def test_every_name_the_gpu_path_uses_exists(root):
    pytest.importorskip(root, reason=f"{root} is not installed here")
    missing, checked = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # cupy.cuda.nccl warns when libnccl is absent; the names are there
        for name, where in _used_names():
            if name.split(".")[0] != root:
                continue
            try:
                _resolve(name)
                checked += 1
            except _Unavailable:
                pass
            except (AttributeError, ImportError) as exc:
                missing.append(f"{where}: {name} ({type(exc).__name__}: {exc})")
    assert checked, f"no name from {root} was checked"
    assert not missing, "names the GPU path uses that the installed packages lack:\n" + "\n".join(missing)
