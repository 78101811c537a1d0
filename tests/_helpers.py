"""Helpers shared by test files (imported as a plain module, like ``gen_inputs``)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout


def run_cli(main, argv):
    """(exit code, stdout, stderr) of one in-process CLI call (a module's ``main``); argparse's exits
    give their code. ``argv`` items may be paths or numbers: they are passed as strings."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:        # argparse's usage errors
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def stand_in_checkout(monkeypatch, root):
    """``root`` made a checkout of the project as :mod:`llmcupy.defaults` tells one (its ``pyproject.toml``
    beside ``bench/``), and the package's checkout from now on; returns ``root``."""
    from llmcupy import defaults

    (root / "bench").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "llmcupy"\n')
    monkeypatch.setattr(defaults, "repo_dir", lambda: root)
    return root


def run_train(argv):
    """:func:`run_cli` of the trainer (``llmcupy.train.main``)."""
    from llmcupy import train

    return run_cli(train.main, argv)


def ctrl_c_after(argv, marker: str, timeout: float = 300):
    """Runs ``python -m ...argv`` in its own process group, and once a line of its stdout contains
    ``marker``, sends SIGINT to the whole group, as Ctrl-C in a terminal does (the forked children
    get it too). Returns (exit code, stdout, stderr). SIGINT is set to its default in the child: a
    background job of a non-interactive shell would otherwise inherit it ignored."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if marker in line:
                os.killpg(proc.pid, signal.SIGINT)
                break
        out.append(proc.stdout.read())
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    return rc, "".join(out), "".join(err)


TRIAL_KERNELS = r"""
__global__ void neighbour_copy(float* out, const float* inp, int N, int C) {
    __shared__ float s[1024];
    int row = blockIdx.x, tid = threadIdx.x;
    s[tid] = inp[(size_t)row * C + tid];
    // no __syncthreads: the neighbour's slot may not be written yet (C == blockDim.x)
    out[(size_t)row * C + tid] = s[(tid + 1) % C];
}

__global__ void atomic_row_sums(float* out, const float* inp, int N, int C) {
    int row = blockIdx.x, tid = threadIdx.x;
    out[(size_t)row * C + tid] = 0.0f;
    __syncthreads();
    // every thread adds into the row's first entry: the order of the fp32 additions is the thread order
    atomicAdd(&out[(size_t)row * C], inp[(size_t)row * C + tid] * (1.0f + tid / 3.0f));
}
"""


def trial_op(monkeypatch, kernel_name):
    """softmax_forward's inputs with one trial version running ``kernel_name`` on (out, inp, N, C), one
    block of 64 threads per 64-wide row (the trial's sizes, in the tests and the emulator's CLI runs),
    registered under ``trial_<kernel_name>`` for the tests' helpers and the CLIs in this process."""
    import dataclasses

    import numpy as np

    import llmcupy
    from llmcupy.ops import _REGISTRY, Version

    kernel = llmcupy.RawModule(code=TRIAL_KERNELS).get_function(kernel_name)

    def launch(a, bs):
        n, c = a["inp"].shape
        kernel((n,), (bs,), (a["out"], a["inp"], np.int32(n), np.int32(c)))

    op = dataclasses.replace(llmcupy.ops["softmax_forward"], name=f"trial_{kernel_name}", default_version=1,
                             versions={1: Version(1, "trial", launch, block_sizes=(64,))},
                             test_shapes=[{"B": 1, "T": 3, "V": 64}], sim_sizes={"B": 1, "T": 3, "V": 64})
    monkeypatch.setitem(_REGISTRY, op.name, op)
    return op
