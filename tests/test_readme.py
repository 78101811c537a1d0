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
