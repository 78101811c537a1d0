"""python -m llmcupy.test_gpt2's output when its reader goes away (``| head``)."""

import subprocess
import sys

import pytest


def test_gate_output_piped_into_head_ends_quietly(tmp_path):
    pytest.importorskip("torch")   # torch_gpt2 writes the gate's inputs
    from llmcupy import torch_gpt2

    model, state = tmp_path / "model.bin", tmp_path / "state.bin"
    assert torch_gpt2.main(["--init", "d1", "--B", "2", "--T", "8", "--out-model", str(model),
                            "--out-state", str(state)]) == 0
    # the gate prints a line per kernel and per tensor; the write after head left was "error: Broken
    # pipe" and exit 2, the code for a bad input file
    proc = subprocess.Popen([sys.executable, "-m", "llmcupy.test_gpt2", "--checkpoint", str(model),
                             "--debug-state", str(state), "--backend", "sim"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("[GPT-2] ")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and err == "", err
