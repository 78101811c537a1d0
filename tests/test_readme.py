"""The README's Python API example runs as written (in the emulator)."""

import re
from pathlib import Path


def test_readme_python_example_runs():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(import numpy as np\n.*?)```", text, re.S)
    assert block, "the README's Python API example is missing"
    namespace = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    y, y_ref, out, x = namespace["y"], namespace["y_ref"], namespace["out"], namespace["x"]
    assert abs(y - y_ref).max() < 1e-4
    assert (out == 2 * x).all()


def _readme_kernel_source() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    m = re.search(r"llmcupy\.RawModule\(code=r'''(.*?)'''\)", text, re.S)
    assert m, "the README's RawModule example is missing"
    return m.group(1)


def test_readme_kernel_resolves_through_name_expressions_on_gpu(monkeypatch):
    """On a GPU, CuPy looks a kernel up by its plain name unless it is a name expression; the
    README's `scale` is not extern "C", so the cubin holds only its mangled name. The cuda path must
    hand CuPy every __global__ name of the source as a name expression (checked here with a
    stand-in for cupy.RawModule that resolves exactly as CuPy does: plain names are not found)."""
    import sys
    import types

    import llmcupy

    seen = {}

    class CupyRawModule:
        def __init__(self, code, options=(), backend="nvrtc", translate_cucomplex=False,
                     enable_cooperative_groups=False, name_expressions=None, **kwargs):
            seen.update(name_expressions=name_expressions, kwargs=kwargs)

        def get_function(self, name):
            if name not in (seen["name_expressions"] or ()):
                raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name})")
            return object()

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(RawModule=CupyRawModule))
    mod = llmcupy.RawModule(code=_readme_kernel_source(), target="cuda")
    k = mod.get_function("scale")
    assert seen["name_expressions"] == ["scale"]
    assert seen["kwargs"] == {}  # no jitify= unless asked (CuPy warns on every module given it)
    assert k.signature.startswith("scale(float* y, const float* x, float a, int n")
    # a user's template instantiation is added after the source's own names
    llmcupy.RawModule(code=_readme_kernel_source() + "template<int N> __global__ void t(float* x) {}",
                      name_expressions=["t<4>"], target="cuda")
    assert seen["name_expressions"] == ["scale", "t<4>"]


def test_readme_kernel_is_mangled_in_the_cubin():
    # why the name expression is needed: NVRTC emits `scale` under its C++ name
    import pytest

    from llmcupy import nvrtc

    try:
        nvrtc.find_nvrtc()
        nvrtc.cuda_include_dirs()
    except nvrtc.NvrtcNotFound as exc:
        pytest.skip(f"NVRTC is not installed: {exc}")
    res = nvrtc.compile_source(_readme_kernel_source(), 80)
    assert res.ok, res.log
    assert [k.mangled for k in res.kernels] == ["_Z5scalePfPKffi"]
