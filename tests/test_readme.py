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


def _readme_command(marker: str) -> str:
    """The README's indented command line that contains ``marker``, exactly as printed."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = [line[4:] for line in text.splitlines() if line.startswith("    ") and marker in line]
    assert len(lines) == 1, f"expected one README command with {marker!r}, found {lines}"
    return lines[0]


def test_readme_asan_recipe_runs_as_printed():
    import os
    import shutil
    import subprocess

    import pytest

    if shutil.which("g++") is None:
        pytest.skip("the ASan recipe needs g++ (not installed here)")
    libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan):
        pytest.skip("this g++ has no AddressSanitizer runtime (libasan.so), which the recipe preloads")
    command = _readme_command("LLMCUPY_SIM_ASAN=1")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               LLMCUPY_BACKEND="sim")
    env.pop("ASAN_OPTIONS", None)   # the recipe must work without help from the environment
    proc = subprocess.run(["bash", "-c", command], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "PASS" in proc.stdout
    assert "LeakSanitizer" not in proc.stderr and "C++17 compiler" not in proc.stderr
