"""What a person learning GPU programming meets in a notebook and at the command line: every wrong
name or number answered with the choices, not a bare Python error (emulator, small sizes)."""

from __future__ import annotations

import os

import pytest

import llmcupy
from llmcupy.ops import OpError
from _helpers import run_cli


def test_an_unknown_version_in_op_versions_lists_the_versions():
    # op.versions[99] in a notebook used to raise a bare `KeyError: 99`
    op = llmcupy.ops["softmax_forward"]
    listing = ", ".join(map(str, sorted(op.versions)))   # not written out: a new version would break it
    with pytest.raises(OpError, match=rf"softmax_forward has no version 99; versions: {listing}$"):
        op.versions[99]
    with pytest.raises(KeyError):   # still the KeyError a dict lookup raises, for code that catches it
        op.versions[99]
    assert op.versions.get(99) is None and 99 not in op.versions and op.versions[5].number == 5


_call = run_cli   # (exit code, stdout, stderr) of an in-process CLI call


def _need_nvrtc():
    # conftest's have_nvrtc rule, for checks that need NVRTC halfway through a test: skip here
    # without it, fail on CI (these tests used to skip there too)
    from llmcupy import nvrtc

    try:
        nvrtc.find_nvrtc()
    except nvrtc.NvrtcNotFound as exc:
        if os.environ.get("CI") or os.environ.get("LLMCUPY_REQUIRE_NVRTC"):
            pytest.fail(f"the NVRTC checks must run on CI: {exc}")
        pytest.skip(f"NVRTC is not installed: {exc}")


@pytest.mark.parametrize("cli,argv", [
    ("kernel", ["--compile-report", "softmax_forward", "--arch", "sm_99"]),
    ("kernel", ["--compile-report", "--arch", "80", "sm_99", "softmax_forward"]),
    ("nvrtc", ["softmax_forward", "--arch", "99", "80"]),
])
def test_an_arch_nvrtc_cannot_target_is_refused_with_the_choices(cli, argv):
    # it used to compile the file, print a FAILED row and exit 1, as if the kernel were broken
    _need_nvrtc()
    import importlib

    rc, out, err = _call(importlib.import_module(f"llmcupy.{cli}").main, argv)
    assert rc == 2 and out == "", out + err
    assert err.count("\n") == 1 and "--arch sm_99: NVRTC" in err and "choose from" in err and "sm_80" in err, err


def test_describe_says_what_a_version_must_meet_and_what_it_is_timed_against():
    # describe() / --list used to show versions only: the tolerance, its reason and the upper bound
    # were attributes a learner had to know about
    text = llmcupy.ops["softmax_forward"].describe()
    assert "tolerance: out within 0.0001 + 1.19e-07*|ref| (why: op.tolerance_note)" in text, text
    assert "upper bound on a GPU: the device's copy bandwidth" in text, text
    text = llmcupy.ops["matmul_forward"].describe()
    assert "upper bound on a GPU: cuBLAS" in text and "with TF32 GEMMs (the trainer's default): out within 0.1" in text
    assert "hyper, step exact" in llmcupy.ops["adamw_capturable"].describe()
    assert "sqrt(C)" in llmcupy.ops["matmul_forward_tf32"].describe()   # a tolerance that grows with C


def test_list_of_one_op_prints_why_its_tolerance_and_why_a_default_is_not_llmcs(monkeypatch):
    import dataclasses
    import re

    from llmcupy import kernel
    from llmcupy.ops import _REGISTRY

    # a new op of our own says why its default is not llm.c's (DEVELOPERS.md, "Adding an op"): the footer
    # names it beside the others, where this test once asserted the footer's exact list and failed
    ours = dataclasses.replace(llmcupy.ops["residual_forward"], name="zz_ours", default_note="ours: llm.c has none")
    monkeypatch.setitem(_REGISTRY, "zz_ours", ours)
    rc, out, err = _call(kernel.main, ["--list", "encoder_backward"])
    assert rc == 0, err
    assert "why this tolerance: llm.c's fp32 tolerance" in out
    # the footer said every * was llm.c's choice; encoder_backward's is not, and now says why
    assert "default 2: not llm.c's 1" in out
    excepted = re.search(r" -- except ([\w, ]+), whose --list says why", out).group(1).split(", ")
    assert {"encoder_backward", "matmul_forward", "zz_ours"} <= set(excepted), excepted
    # the ops of our own, past llm.c's catalogue: their * is no llm.c choice, which the footer claimed
    ours = {"adamw_capturable", "flash_attention_forward", "flash_attention_backward", "matmul_gelu_forward",
            "matmul_forward_tf32"}
    assert ours <= set(excepted), ours - set(excepted)
    assert all("llmcupy's own" in llmcupy.ops[name].default_note for name in ours)
    # matmul_forward's * is neither llm.c's FP32 trainer's 4 nor its file's fastest, 3
    assert "default 2: not llm.c's choices" in llmcupy.ops["matmul_forward"].describe()
    for name in llmcupy.ops:   # every op's tolerance has a written reason to print
        assert llmcupy.ops[name].tolerance_note, name


def test_nvrtc_prints_a_files_ptx_for_a_learner_to_read():
    # the compile report counted registers and spills, but no CLI showed the instructions themselves
    _need_nvrtc()
    from llmcupy import nvrtc

    rc, out, err = _call(nvrtc.main, ["softmax_forward", "--ptx"])
    assert rc == 0, err
    assert ".target sm_80" in out and out.count(".entry") == 8 and "shfl.sync.bfly" in out   # v3's butterfly
    rc, out, err = _call(nvrtc.main, ["softmax_forward", "--ptx", "--arch", "90"])
    assert rc == 0 and ".target sm_90" in out, err
    rc, out, err = _call(nvrtc.main, ["--ptx"])
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--ptx prints one file" in err, err


def test_readmes_register_example_matches_the_compile_report():
    # the README said NVRTC 12.9 compiles fused_residual_forward 6 to 66 registers for sm_75 (so at most
    # 896 threads on a T4); the kernel's __launch_bounds__(1024) holds it to 64, which fits 1024 threads
    _need_nvrtc()
    import re
    from pathlib import Path

    from llmcupy import nvrtc

    rows = nvrtc.compile_report(files=["fused_residual_forward"], archs=(75,))
    regs = {r["kernel"]: r["registers"] for r in rows}["fused_residual_forward_kernel6"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    claim = re.search(r"held it to (\d+)\)", readme)
    # 64 is what __launch_bounds__(1024) allows (64K registers per block); another NVRTC may use fewer
    assert claim and int(claim.group(1)) == 64 and regs <= 64, (claim and claim.group(0), regs)
    assert "compiles `fused_residual_forward` 6 to 66 registers" not in readme


def test_a_version_shows_what_it_is_not_where_its_launcher_lives():
    # repr(op.versions[7]) was the dataclass's: launch=<function _block_per_row.<locals>.launch at 0x...>
    text = repr(llmcupy.ops["softmax_forward"].versions[7])
    assert text == ("<version 7: block per row, 8 clamped loads in flight per thread, for very large C; "
                    "block sizes 32, 64, 128, 256, 512, 1024 (default 256)>"), text
    assert repr(llmcupy.ops["encoder_backward"].versions[1]).endswith("; nondeterministic>")
    assert " at 0x" not in repr(llmcupy.ops["layernorm_backward"].versions)


def test_a_kernel_run_states_the_tolerance_its_errors_are_held_to():
    # `layernorm_forward 3` printed "out: max abs 4.77e-07 rel 1.05e-02  PASS" with no bound in sight:
    # a 1% relative error passing looked like a bug (it is a tiny reference value, within atol)
    from llmcupy import kernel

    rc, out, err = _call(kernel.main, ["layernorm_forward", "3", "--B", "2", "--T", "4", "--block-size", "64"])
    assert rc == 0, out + err
    assert "  PASS when every element is within tolerance: out, mean, rstd within 1e-05 + 1.19e-07*|ref|\n" in out


def test_a_read_only_or_strided_out_array_is_an_op_error_naming_the_output():
    # these reached the launch and failed there as a KernelArgumentError naming kernel6's argument 1,
    # not the out= entry the caller passed (and not the OpError the README promises for a bad out=)
    import numpy as np

    op = llmcupy.ops["fused_residual_forward"]
    inputs = op.make_inputs()
    shape = inputs["residual"].shape
    frozen = np.empty(shape, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(OpError, match=r"^fused_residual_forward: out\['normed'\] is read-only"):
        op(**inputs, out={"normed": frozen})
    with pytest.raises(OpError, match=r"^fused_residual_forward: out\['normed'\] is not C-contiguous"):
        op(**inputs, out={"normed": np.empty(shape[::-1], np.float32).T})
    normed = np.empty(shape, np.float32)
    assert op(**inputs, out={"normed": normed})[1] is normed


def test_harness_and_analyze_take_an_op_by_name():
    # analyze_version("softmax_forward", 4) and harness.sweep("softmax_forward", 4) failed with
    # "AttributeError: 'str' object has no attribute 'version'"
    from llmcupy import analyze, harness

    assert harness.sweep("softmax_forward", 4, sizes={"B": 1, "T": 2, "V": 40})["ok"] is True
    assert analyze.analyze_version("softmax_forward", 4, sizes={"B": 1, "T": 2, "V": 40})["version"] == 4
    with pytest.raises(OpError, match="unknown op 'softmax'; ops: "):
        harness.sweep("softmax", 4)


def test_arch_with_a_version_names_the_command_to_run_instead():
    # `kernel softmax_forward 1 --arch sm_99` said only "--arch is for --compile-report"
    from llmcupy import kernel

    rc, out, err = _call(kernel.main, ["softmax_forward", "1", "--arch", "sm_99"])
    assert rc == 2 and err.count("\n") == 1, err
    suggested = err.split(": python -m llmcupy.kernel ")[1].split()
    assert suggested == ["--compile-report", "softmax_forward", "--arch", "sm_99"], err
    _need_nvrtc()
    rc, out, err = _call(kernel.main, suggested)   # which then says what sm_99 is not
    assert rc == 2 and "choose from" in err, err


def test_a_modules_repr_names_its_file_backend_and_kernels():
    # it was `<llmcupy.runtime.module.RawModule object at 0x...>`
    text = repr(llmcupy.ops["gelu_forward"].module())
    assert text == f"<llmcupy.RawModule gelu_forward.cu on {llmcupy.get_backend()}: kernels gelu_forward_kernel1, " \
                   "gelu_forward_kernel2>", text


def test_list_shows_the_sizes_a_run_in_the_emulator_uses():
    # --list showed only the spec's sizes (B=8 T=1024 V=50257) while `kernel softmax_forward 5` in the
    # emulator ran at B=2 T=8 V=2053, with nothing saying why
    from llmcupy import kernel

    rc, out, err = _call(kernel.main, ["--list", "softmax_forward"])
    assert rc == 0 and "sizes: B=8 T=1024 V=50257 (on a GPU; in the emulator B=2 T=8 V=2053)" in out, out


def test_op_names_complete_in_a_notebook():
    # `llmcupy.ops["softm<TAB>` completed nothing: the module-as-mapping gave IPython no keys
    # (IPython's dict-key completer asks any object for this; no shell is started here, since a
    # process-wide InteractiveShell would outlive the test)
    assert llmcupy.ops._ipython_key_completions_() == sorted(llmcupy.ops)


def test_a_pytorch_tensor_is_taken_as_out_and_written_in_place():
    # out=torch.empty(...) was refused with "out['out'] has dtype torch.float32, expected float32"
    torch = pytest.importorskip("torch")
    op = llmcupy.ops["gelu_forward"]
    x, into = torch.randn(4, 8), torch.empty(4, 8)
    y = op(x, out=into)
    assert isinstance(y, torch.Tensor) and y.data_ptr() == into.data_ptr()
    assert torch.equal(into, op(x))
    with pytest.raises(OpError, match=r"out\['out'\] is a non-contiguous PyTorch tensor"):
        op(x, out=torch.empty(8, 4).T)
    with pytest.raises(OpError, match=r"out\['out'\] has dtype float64, expected float32"):
        op(x, out=torch.empty(4, 8, dtype=torch.float64))


@pytest.mark.gpu
def test_a_torch_cuda_tensor_is_written_in_place_as_out_on_a_gpu():
    torch = pytest.importorskip("torch")
    llmcupy.set_backend("cuda")
    try:
        x, into = torch.randn(4, 8, 64, device="cuda"), torch.empty(4, 8, 64, device="cuda")
        y = llmcupy.ops["gelu_forward"](x, version=2, out=into)
        assert y.is_cuda and y.data_ptr() == into.data_ptr()
        assert torch.allclose(into, torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-5)
        with pytest.raises(OpError, match="output 'out' is a PyTorch CPU tensor"):
            llmcupy.ops["gelu_forward"](x, version=2, out=into.cpu())
    finally:
        llmcupy.set_backend("sim")


def test_ptx_of_an_op_whose_kernels_are_templates_in_another_ops_file():
    # `nvrtc flash_attention_forward --ptx` said "no kernel file" (its kernels live in flash_attention.cu),
    # and flash_attention.cu's PTX held no entry at all: its kernels are templates NVRTC only emits
    # when named
    _need_nvrtc()
    from llmcupy import nvrtc

    rc, out, err = _call(nvrtc.main, ["flash_attention_forward", "--ptx"])
    assert rc == 0, err
    assert out.count(".entry") == 9 and "flash_attention_forward_kernel1" in out, out[:2000]
