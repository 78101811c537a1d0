"""The example notebooks run top to bottom (in the emulator unless LLMCUPY_BACKEND says otherwise).

Each notebook is executed with nbclient in a fresh ``python3`` kernel. The training notebook runs offline
on inputs the test makes (generated text and a GPT-2-shaped BPE rank file, ``gen_inputs``), passed
through the environment variables the notebook documents. The notebooks are stored without outputs.
"""

import json
import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat (pip install nbformat)")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient (pip install nbclient)")
pytest.importorskip("ipykernel", reason="the notebook tests need a python3 kernel (pip install ipykernel)")
pytest.importorskip("matplotlib", reason="the notebooks plot with matplotlib (pip install matplotlib)")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NOTEBOOKS = ["explore_kernels.ipynb", "train_and_plot.ipynb"]
CELL_TIMEOUT = 600


def execute(name: str, tmp_path: Path, monkeypatch, **env) -> "nbformat.NotebookNode":
    """Runs examples/<name> in a fresh kernel (cwd examples/, env passed down); returns it with outputs."""
    # the kernel is a child process: it sees this process's environment
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("LLMCUPY_NB_WORKDIR", str(tmp_path / "work"))
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()
    nbformat.write(nb, tmp_path / name)  # executed copy, for a look when a test fails
    return nb


def stdout_of(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream")


def images_of(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_stored_without_outputs(name):
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, \
                f"{name}: clear the outputs before committing (jupyter nbconvert --clear-output --inplace)"


def test_explore_kernels(tmp_path, monkeypatch):
    # a timed GPU record for the notebook's "runs recorded on a GPU" cell
    from test_bench import synthetic_gpu_record

    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu.json").write_text(json.dumps(synthetic_gpu_record()))
    # what else a GPU session leaves there: before, the start-up record stopped the cell with "not a
    # benchmark record", and a run whose name sorts last was plotted as the newest whatever its date
    (results / "startup-h100-20250102T000000Z.json").write_text(json.dumps(
        {"schema": "llmcupy.startup/1", "backend": "cuda", "device": "NVIDIA H100 80GB HBM3",
         "date": "2025-01-02T00:00:00Z", "cold": {"seconds": 30.0}, "warm": {"seconds": 8.0}}))
    (results / "older.json").write_text(json.dumps(synthetic_gpu_record(date="2024-12-01T00:00:00Z")))
    nb = execute("explore_kernels.ipynb", tmp_path, monkeypatch, LLMCUPY_BENCH_RESULTS=results)
    out = stdout_of(nb)
    assert "softmax_forward: row-wise softmax" in out           # the catalogue listing
    assert "v7 (block 256): out: max abs" in out and "FAIL" not in out
    assert "why this tolerance: llm.c's tolerance" in out       # the reason, not only the numbers
    assert "kernels_cu/softmax_forward.cu:" in out              # the source
    assert "softmax_forward_kernel7" in out                     # compile report (or its skip line)
    assert "compilations ok" in out or "skipped: NVRTC is not available" in out
    assert "gpu.json: NVIDIA H100 80GB HBM3" in out
    assert images_of(nb) == 2                                   # the emulator sweep and the GPU record
    assert (tmp_path / "work" / "sweep_softmax_forward.png").stat().st_size > 10_000


def test_train_and_plot(tmp_path, monkeypatch):
    # offline, on inputs made here: generated Shakespeare-like text and a GPT-2-shaped BPE (gen_inputs)
    import gen_inputs

    text = tmp_path / "generated.txt"
    text.write_text(gen_inputs.make_text(n_sections=1700, seed=5))
    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    nb = execute("train_and_plot.ipynb", tmp_path, monkeypatch, LLMCUPY_TINYSHAKESPEARE=text,
                 LLMCUPY_GPT2_BPE=bpe, LLMCUPY_NB_STEPS=8)
    out = stdout_of(nb)
    assert "wrote 32,768 tokens" in out and re.search(r"wrote [0-9,]+ tokens to .*tiny_shakespeare_train.bin", out)
    assert "step    8/8: train loss" in out
    assert "generating:" in out
    log = (tmp_path / "work" / "train_d2.log").read_text().split()
    assert "s:0" in log and any(w.startswith("trl:") for w in log) and any(w.startswith("tel:") for w in log)
    assert images_of(nb) == 1
    assert (tmp_path / "work" / "train_d2_loss.png").stat().st_size > 5_000


@pytest.mark.parametrize("op_name", ["matmul_forward_tf32", "flash_attention_backward", "classifier_fused"])
def test_explore_kernels_checks_every_version_of_any_op(op_name, tmp_path, monkeypatch, capsys):
    """LLMCUPY_OP explores another op: the version check handles a tolerance that grows with the sizes
    (matmul_forward_tf32), an input named ``out`` (flash_attention_backward) and several outputs. Its
    setup and version-check cells run here in-process (the whole notebook runs in test_explore_kernels)."""
    monkeypatch.setenv("LLMCUPY_OP", op_name)
    monkeypatch.setenv("LLMCUPY_NB_WORKDIR", str(tmp_path / "work"))
    monkeypatch.chdir(EXAMPLES)
    cells = [c.source for c in nbformat.read(EXAMPLES / "explore_kernels.ipynb", as_version=4).cells
             if c.cell_type == "code"]
    setup = next(c for c in cells if "OP_NAME = " in c)
    check = next(c for c in cells if "op.reference(" in c)
    namespace = {}
    exec(compile(setup, "setup cell", "exec"), namespace)
    exec(compile(check, "version-check cell", "exec"), namespace)
    out = capsys.readouterr().out
    op = namespace["op"]
    for n, v in op.versions.items():
        if v.available:
            assert re.search(rf"^v{n} \(block \d+\): ", out, re.M), out
    assert "PASS" in out and "FAIL" not in out, out
