"""The README's Python API example runs as written (in the emulator)."""

import re
from pathlib import Path

import pytest


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


def test_readme_kernel_is_mangled_in_the_cubin(have_nvrtc):
    # why the name expression is needed: NVRTC emits `scale` under its C++ name (have_nvrtc: skips
    # without NVRTC here, fails on CI, where these README checks used to skip too)
    from llmcupy import nvrtc

    res = nvrtc.compile_source(_readme_kernel_source(), 80)
    assert res.ok, res.log
    assert [k.mangled for k in res.kernels] == ["_Z5scalePfPKffi"]
def _readme_command(marker: str) -> str:
    """The README's indented command line that contains ``marker``, exactly as printed."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = [line[4:] for line in text.splitlines() if line.startswith("    ") and marker in line]
    if len(lines) > 1:   # a marker that starts a command names that command, not others quoting it
        lines = [line for line in lines if line.startswith(marker)]
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


def _run_readme_line(command: str, cwd, **env):
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
                    LLMCUPY_BACKEND="sim", **{k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=full_env, capture_output=True, encoding="utf-8",
                          errors="replace", timeout=900)   # samples of a tiny model may be any bytes


def test_readme_commands_for_a_trained_model_run_as_printed(tmp_path):
    """The README's `sample` and `convert` lines for a model you trained, on a training state the
    trainer wrote (a tiny d1 run on generated inputs), exactly as printed."""
    import gen_inputs
    from llmcupy import train

    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    tr, va = gen_inputs.write_token_files(tmp_path, bpe)
    # the trainer's default --save-path, in the folder the commands run in
    rc = train.main(["--init", "d1", "-b", "2", "-t", "32", "--steps", "1", "-v", "0", "-s", "0", "--save-every",
                     "1", "--save-path", str(tmp_path / "llmcupy_train_state.npz"), "-i", str(tr), "-j", str(va)])
    assert rc == 0
    sample = _readme_command("python -m llmcupy.sample -e llmcupy_train_state.npz")
    proc = _run_readme_line(sample, tmp_path, LLMCUPY_GPT2_BPE=bpe)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ROMEO:") and len(proc.stdout) > len("ROMEO:\n")
    convert = _readme_command("python -m llmcupy.convert llmcupy_train_state.npz")
    proc = _run_readme_line(convert, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "trained.bin").is_file() and (tmp_path / "trained" / "model.safetensors").is_file()
    assert (tmp_path / "trained" / "config.json").is_file()


def test_readme_kernel_commands_run_as_printed(tmp_path):
    """The kernel catalogue's README lines (all but the whole-catalogue and NVRTC ones, which CI and
    tests/test_nvrtc.py run), exactly as printed."""
    for marker in ("python -m llmcupy.kernel --list", "python -m llmcupy.kernel softmax_forward 5",
                   "python -m llmcupy.kernel layernorm_forward 3 --B 4"):
        proc = _run_readme_line(_readme_command(marker), tmp_path)
        assert proc.returncode == 0, (marker, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "PASS" in proc.stdout or "* = default version" in proc.stdout, proc.stdout[-2000:]


def test_readme_pytorch_example_runs():
    """The PyTorch interop block as printed: it named device="cuda", which a learner without a GPU (or
    with the CPU build of torch) could not run; in the emulator it must run on CPU tensors."""
    torch = pytest.importorskip("torch")
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(import torch, llmcupy\n.*?)```", text, re.S)
    assert block, "the README's PyTorch example is missing"
    namespace = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    y = namespace["y"]
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (4, 64, 768)


def test_readme_analyze_line_prints_the_rows_it_quotes(monkeypatch, capfd):
    """`kernel softmax_forward --all --analyze` as printed, and the v1/v4/v7 rows the README quotes from
    its last table are what it prints today (a kernel or model change would leave them stale). The
    occupancy and model columns follow NVRTC's registers, which vary with its release: the run models
    the registers the README states, not this machine's NVRTC's (before, the check failed on a machine
    whose NVRTC gave version 7 other registers; the stand-in for this machine's NVRTC here is another
    release's, so a check that used it would fail)."""
    import shlex

    from llmcupy import analyze, kernel

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    quoted = re.search(r"For\s+`softmax_forward --all --analyze`.*?\n\n(.*?)\n\n", text, re.S)
    assert quoted, "the README's --analyze table is missing"
    rows = [" ".join(line.split()) for line in quoted.group(1).splitlines() if re.match(r"\s+v\d", line)]
    assert len(rows) >= 3, quoted.group(1)
    registers, arch, _ = _stated_registers(_ANALYZE_STATED)
    monkeypatch.setattr(analyze, "kernel_resources", _another_nvrtc)   # as on a machine with another NVRTC
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(analyze, "kernel_resources", _resources_as_stated(registers, arch))
        command = shlex.split(_readme_command("python -m llmcupy.kernel softmax_forward --all --analyze"),
                              comments=True)
        assert command[:3] == ["python", "-m", "llmcupy.kernel"], command
        rc = kernel.main(command[3:])
    out = capfd.readouterr().out
    assert rc == 0, out[-2000:]
    printed = {" ".join(line.split()) for line in out.splitlines()}
    for row in rows:
        assert row in printed, (row, out[-2500:])


def test_readme_ptx_line_runs_as_printed(tmp_path, have_nvrtc):
    proc = _run_readme_line(_readme_command("python -m llmcupy.nvrtc softmax_forward --ptx"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ".target sm_80" in proc.stdout and ".entry _Z23softmax_forward_kernel1" in proc.stdout


def test_python_names_the_readmes_give_resolve_after_import_llmcupy():
    """Every `llmcupy.a.b` the READMEs name for Python use resolves after a plain `import llmcupy`, as a
    notebook user types it: `llmcupy.analyze.analyze_version(op, 4)` and `llmcupy.runtime.blas.tf32`
    were AttributeErrors unless the submodule had been imported by hand. Run in a fresh interpreter,
    since this test process has imported most submodules already."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    text = "".join((root / name).read_text() for name in ("README.md", "examples/README.md", "bench/README.md"))
    # not a module path (llmcupy/x.py), a C header (llmcupy_sim.h) or a command (python -m llmcupy.x)
    names = sorted(set(re.findall(r"(?<!-m )(?<![\w/])llmcupy(?:\.[A-Za-z_]\w*)+", text)))
    assert "llmcupy.analyze.analyze_version" in names, names
    script = ("import functools, llmcupy\n"
              "for name in %r:\n"
              "    functools.reduce(getattr, name.split('.')[1:], llmcupy)\n" % names)
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LLMCUPY_BACKEND": "sim", "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_readme_says_how_the_state_its_sample_line_reads_is_written():
    """The README's `sample -e llmcupy_train_state.npz` came after train lines that save nothing, and
    nothing said which flag writes that file: the paragraph must name --save-path and its default."""
    from llmcupy.train import DEFAULT_SAVE_PATH

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    paragraph = re.search(r"A model you trained is its training state.*?\n\n", text, re.S)
    assert paragraph, "the README's paragraph on trained models is missing"
    assert "`--save-path P`" in paragraph.group(0) and f"`{DEFAULT_SAVE_PATH}`" in paragraph.group(0)
    assert f"-e {DEFAULT_SAVE_PATH}" in _readme_command("python -m llmcupy.sample -e")


def test_readme_says_every_cli_ends_quietly_with_141():
    """The README named only kernel, bench, nvrtc and launchbench as ending with 141 under `| head`,
    while every CLI's __main__ goes through _cli.run_main (train and sample included). The CLIs are
    the modules the Architecture section lists as `python -m llmcupy.{...}`."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    listed = re.search(r"python -m llmcupy\.\{([^}]*)\}", text)
    assert listed, "the README's list of CLIs is missing"
    for name in (n.strip() for n in listed.group(1).split(",")):
        source = (root / "llmcupy" / f"{name}.py").read_text()
        assert "run_main(" in source.split('if __name__ == "__main__":')[-1], name
    sentence = " ".join(re.search(r"\n\nEvery CLI reports bad input.*?\n\n", text, re.S).group(0).split())
    assert "every CLI ends quietly with 141 when the reader of its output stops early" in sentence, sentence


def test_readme_exit_codes_cover_what_the_clis_return():
    """The README's list of exit codes left out 4, which train returns when another rank of a
    data-parallel run did not reach a collective in time. Every integer a CLI's main (or a helper
    named *main*) returns literally must be in that list."""
    import ast

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    sentence = " ".join(re.search(r"\n\nEvery CLI reports bad input.*?\n\n", text, re.S).group(0).split())
    listed = {int(n) for n in re.findall(r"\b(\d+) (?:on|when)\b", sentence)}
    for name in (n.strip() for n in re.search(r"python -m llmcupy\.\{([^}]*)\}", text).group(1).split(",")):
        tree = ast.parse((root / "llmcupy" / f"{name}.py").read_text())
        for func in (f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and "main" in f.name):
            for ret in (r for r in ast.walk(func) if isinstance(r, ast.Return) and isinstance(r.value, ast.Constant)):
                if type(ret.value.value) is int:
                    assert ret.value.value in listed, (name, func.name, ret.value.value, sentence)


def _stated_registers(sentence_start: str):
    """The registers the README states a quoted table was modelled with, in the paragraph that starts
    with ``sentence_start``: ({kernel: registers}, the arch, the NVRTC release). Occupancy and the
    model's time follow them, and NVRTC's registers vary with its release, so the README names it."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    paragraph = text[text.index(sentence_start):].split("\n\n")[0]
    stated = re.search(r"registers\s+NVRTC\s+(\d+\.\d+)\s+gives\s+versions\s+([\d, and]+?)\s+on\s+sm_(\d+):\s+"
                       r"([\d,\sand]+?);", paragraph)
    assert stated, f"the README no longer says which registers the table after {sentence_start!r} was modelled with"
    release, versions, arch, counts = stated.groups()
    versions, counts = (re.findall(r"\d+", versions), re.findall(r"\d+", counts))
    assert len(versions) == len(counts), stated.group(0)
    # the kernels of these softmax_forward versions are softmax_forward_kernel<N> (not the online ones)
    return {f"softmax_forward_kernel{v}": int(n) for v, n in zip(versions, counts)}, int(arch), release


def _resources_as_stated(registers: dict, arch: int):
    """A stand-in for analyze.kernel_resources that reports the stated registers (NVRTC's other
    figures: no static shared memory in these kernels)."""
    from llmcupy import nvrtc

    def resources(source, asked_arch):
        assert (source, asked_arch) == ("softmax_forward.cu", arch), (source, asked_arch)
        return {name: nvrtc.KernelStats(kernel=name, mangled=name, registers=count)
                for name, count in registers.items()}, None

    return resources


def _another_nvrtc(source, arch):
    """analyze.kernel_resources as another NVRTC release might answer: more registers for every kernel."""
    from llmcupy import nvrtc

    return {f"softmax_forward_kernel{v}": nvrtc.KernelStats(kernel=f"softmax_forward_kernel{v}",
                                                            mangled=f"softmax_forward_kernel{v}", registers=64)
            for v in (1, 2, 3, 4, 7)}, None


_COMPARE_STATED = "An edit that made"
_ANALYZE_STATED = "`softmax_forward --all --analyze` the last table"


def _check_readme_compare_rows():
    """The `bench compare` rows the README quotes for two emulator records: their before figures (and
    the untouched version 2's row) are what compare prints today for those versions (a kernel or model
    change would leave them stale). The after figures come from an edit of the kernel file, which a
    test cannot make, so each `before -> after` cell is checked at its before value. Occupancy and the
    model's time follow the registers NVRTC gives each kernel, which vary with the NVRTC release: the
    model runs on the registers the README states, not on this machine's NVRTC."""
    from llmcupy import analyze, bench

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    quoted = re.search(r"\n(    emulator counts and a roofline MODEL.*?)\n\n", text, re.S)
    assert quoted, "the README's bench compare table of emulator counts is missing"
    title, _, *rows = [line[4:] for line in quoted.group(1).splitlines()]
    assert len(rows) == 2, rows
    registers, arch, _ = _stated_registers(_COMPARE_STATED)
    results = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(analyze, "kernel_resources", _resources_as_stated(registers, arch))
        for number in (1, 2):
            raw = {"op": "softmax_forward", "version": number, "ok": True, "blocks": [],
                   "analysis": analyze.analyze_version("softmax_forward", number)}
            results.append(bench._version_entry_from_raw(raw))
    record = {"backend": "sim", "device": "CPU emulator (sim)", "git": {"commit": "1" * 40}, "results": results}
    printed, _ = bench.compare(record, record)
    assert title in printed.splitlines(), printed
    printed_rows = {" ".join(line.split()) for line in printed.splitlines()}
    for row in rows:
        before = re.sub(r"(\S+(?: us)?) -> \S+(?: us)?", r"\1", row)   # each cell at its before value
        before = re.sub(r"\S+x$", "1.00x", before)
        assert " ".join(before.split()) in printed_rows, (before, printed)


def test_readme_compare_rows_hold_what_the_emulator_counts_today():
    _check_readme_compare_rows()


def test_readme_compare_rows_do_not_depend_on_this_machines_nvrtc(monkeypatch):
    # the rows' occupancy and model time came from this machine's NVRTC registers: another NVRTC
    # release (another pip wheel of nvidia-cuda-nvrtc) gave version 1 more than 32 registers, less
    # occupancy and another model time, and the README check failed on that machine alone
    from llmcupy import analyze

    monkeypatch.setattr(analyze, "kernel_resources", _another_nvrtc)
    _check_readme_compare_rows()


@pytest.mark.parametrize("paragraph", [_COMPARE_STATED, _ANALYZE_STATED])
def test_readme_registers_are_what_the_stated_nvrtc_gives(have_nvrtc, paragraph):
    """The registers the README states for a quoted table are the ones its NVRTC release gives today
    (checked where that release is installed: another one may give others, which is why the README
    names it)."""
    from llmcupy import analyze, nvrtc

    registers, arch, release = _stated_registers(paragraph)
    here = "{}.{}".format(*nvrtc.find_nvrtc().version())
    if here != release:
        pytest.skip(f"NVRTC {here} is installed; the README's registers are NVRTC {release}'s")
    table, reason = analyze.kernel_resources("softmax_forward.cu", arch)
    assert reason is None, reason
    assert {name: table[name].registers for name in registers} == registers


def _readme_quoted_report(first_words: str) -> str:
    """The sanitizer report the README quotes that starts with ``first_words``, on one line."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    m = re.search(r"^    " + re.escape(first_words) + r".*?(?=\n    (?:racecheck|memcheck):|\n\n)", text, re.S | re.M)
    assert m, f"the README's quoted report starting {first_words!r} is missing"
    return " ".join(m.group(0).split())


def _without_addresses(report: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x...", report)


def test_readme_memcheck_report_is_what_memcheck_prints():
    """The memcheck report the README quotes, word for word but the addresses: it lacked the
    '(stopped before it)' that memcheck prints, so a reader matching it against a real report saw
    another message."""
    import numpy as np

    import llmcupy
    import llmcupy.sim

    # the README's example: thread 5 of `spill` writes 12 bytes past a 128-byte argument at line 5
    code = "__global__ void spill(float* out) {\n    int t = threadIdx.x;\n\n    if (t == 5)\n" \
           "        out[t + 30] = 1.0f;\n}"
    kernel = llmcupy.RawModule(code=code).get_function("spill")
    with pytest.raises(llmcupy.sim.SimSanitizerError) as err, llmcupy.sim.settings(check="memory"):
        kernel((1,), (32,), (np.zeros(32, np.float32),))
    printed = [" ".join(line.split()) for line in str(err.value).splitlines() if "memcheck:" in line]
    assert len(printed) == 1, str(err.value)
    assert _without_addresses(printed[0]) == _without_addresses(_readme_quoted_report("memcheck: invalid"))


def test_readme_racecheck_report_between_blocks_is_what_racecheck_prints(tmp_path, monkeypatch, capsys):
    """The README's racecheck report of `layernorm_backward` 5 with its `__threadfence()` deleted, as
    `kernel layernorm_backward 5 --sanitize race` prints it today: it named lines 302 and 317, which
    the kernel's scratch write and `__ldcg` read had long left, and lacked the grid.sync() clause of
    the message. Run on a copy of kernels_cu with that one line deleted."""
    import shutil

    from llmcupy import kernel
    from llmcupy.ops import _op
    from llmcupy.runtime import module

    copy = tmp_path / "kernels_cu"
    shutil.copytree(module.kernels_dir(), copy)
    source = (copy / "layernorm_backward.cu").read_text()
    kernel5 = source.index("__global__ void layernorm_backward_kernel5")
    fence = source.index("    __threadfence();", kernel5)
    line_end = source.index("\n", fence) + 1
    assert source.index("__global__", kernel5 + 1) > fence   # the fence deleted is kernel 5's own
    (copy / "layernorm_backward.cu").write_text(source[:fence] + source[line_end:])
    monkeypatch.setattr(module, "kernels_dir", lambda: copy)
    monkeypatch.setattr(module, "_FILE_MODULES", {})
    monkeypatch.setattr(_op, "_KERNELS", {})
    monkeypatch.setenv("LLMCUPY_BACKEND", "sim")
    rc = kernel.main(["layernorm_backward", "5", "--sanitize", "race"])
    out = capsys.readouterr().out
    assert rc == 1, out[-3000:]
    printed = [" ".join(line.split()) for line in out.splitlines() if "racecheck:" in line]
    assert printed and printed[0] == _readme_quoted_report("racecheck: RAW hazard on global memory"), out[-3000:]
