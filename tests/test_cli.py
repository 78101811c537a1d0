"""python -m llmcupy.kernel end to end, as a user runs it (in the emulator)."""

import json
import os
import subprocess
import sys

import pytest

import llmcupy


def run(*args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "llmcupy.kernel", *args], capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def test_list_shows_every_op_and_marks_defaults():
    import llmcupy

    rc, out, _ = run("--list")
    assert rc == 0
    for name in llmcupy.ops:
        op = llmcupy.ops[name]
        assert f"{name}:" in out
        for number, v in op.versions.items():
            assert v.summary in out
        assert f" *{op.default_version:>3}  " in out
    assert "unavailable" in out  # e.g. matmul_forward 3 (cuBLASLt) says why


def test_one_version_passes_and_says_why_there_are_no_timings():
    rc, out, err = run("softmax_forward", "5", "--backend", "sim")
    assert rc == 0, out + err
    assert "PASS" in out and "max abs" in out
    assert "does not model GPU time" in out


def test_one_version_whose_kernel_file_does_not_compile_fails_in_one_line(monkeypatch):
    # A kernel engineer's compile error in `kernel OP N` met a Python traceback ending in g++'s
    # diagnostics; with --all the same error was one ERROR line. Now both print the line, exit 1.
    from _helpers import run_cli
    from llmcupy import kernel, sim
    from llmcupy.ops import _op

    def broken(source):
        raise sim.SimCompileError(f"the emulator could not compile {source}:\n{source}:29:24: error: invalid operands")

    monkeypatch.setattr(_op, "load_kernel_file", broken)
    monkeypatch.setattr(_op, "_KERNELS", {})
    rc, out, err = run_cli(kernel.main, ["residual_forward", "1", "--backend", "sim"])
    assert rc == 1, out + err
    assert out.startswith("residual_forward version 1: ERROR the emulator could not compile residual_forward.cu:\n"
                          "residual_forward.cu:29:24: error: invalid operands\nFAIL"), out
    assert "Traceback" not in out + err


def test_one_version_whose_kernel_file_nvrtc_refuses_fails_in_one_line(monkeypatch):
    # on a GPU the same mistake is NVRTC's: CuPy's CompileException, which `kernel OP N` let through as a
    # traceback (the line above covered g++'s only); raised here as cupy raises it from the module's load
    compiler = pytest.importorskip("cupy.cuda.compiler")
    from _helpers import run_cli
    from llmcupy import kernel
    from llmcupy.ops import _op

    def refused(source):
        raise compiler.CompileException(f"{source}(29): error: expression must have arithmetic type", "",
                                        source, (), "nvrtc")

    monkeypatch.setattr(_op, "load_kernel_file", refused)
    monkeypatch.setattr(_op, "_KERNELS", {})
    rc, out, err = run_cli(kernel.main, ["residual_forward", "1", "--backend", "sim"])
    assert rc == 1, out + err
    assert out.startswith("residual_forward version 1: ERROR residual_forward.cu(29): error: expression must "
                          "have arithmetic type"), out
    assert "Traceback" not in out + err


def test_sizes_and_block_size_and_json(tmp_path):
    path = tmp_path / "r.json"
    rc, out, err = run("softmax_forward", "4", "--B", "1", "--T", "3", "--V", "77", "--block-size", "64",
                       "--json", str(path))
    assert rc == 0, out + err
    data = json.loads(path.read_text())
    assert data[0]["sizes"] == {"B": 1, "T": 3, "V": 77}
    assert [b["block_size"] for b in data[0]["blocks"]] == [64]
    assert data[0]["ok"] is True


def test_json_entries_say_when_and_how_they_were_made_and_bench_reads_it(tmp_path):
    # a GPU session keeps `kernel --all --json` as bench/results/catalogue.json; before, its entries had
    # no date, commit or command, so `bench compare` / `--list-results` showed "unknown" for all three
    from llmcupy import bench

    path = tmp_path / "r.json"
    rc, out, err = run("gelu_forward", "1", "--B", "1", "--T", "3", "--block-size", "64", "--json", str(path))
    assert rc == 0, out + err
    entry = json.loads(path.read_text())[0]
    assert entry["command"] == f"python -m llmcupy.kernel gelu_forward 1 --B 1 --T 3 --block-size 64 --json {path}"
    assert entry["date"].endswith("Z") and entry["git"] == bench.git_commit()
    record = bench.load(path)
    assert (record["date"], record["command"], record["git"]) == (entry["date"], entry["command"], entry["git"])


def test_all_versions_of_one_op():
    rc, out, err = run("softmax_forward", "--all")
    assert rc == 0, out + err
    # counted from the op: a version added to softmax_forward is one more pass, not a broken test
    assert f"{len(llmcupy.ops['softmax_forward'].versions)} passed, 0 failed, 0 skipped" in out


@pytest.mark.parametrize("args,message", [
    (("softmaxx", "1"), "unknown op 'softmaxx'; ops: "),
    (("softmax_forward", "99"), "softmax_forward has no version 99; versions: "
                                + ", ".join(map(str, sorted(llmcupy.ops["softmax_forward"].versions)))),
    (("softmax_forward", "2", "--X", "3"), "unknown option '--X' for softmax_forward"),
    (("softmax_forward", "2", "--B", "0"), "--B needs a positive integer"),
    (("softmax_forward", "2", "--block-size", "48"), "block size 48 is not"),
    (("softmax_forward",), "give a version of softmax_forward"),
    ((), "give an op and a version, --all, or --list; ops: adamw, adamw_capturable, "),
    (("softmax_forward", "--all", "--block-size", "48"), "--block-size 48 is in no version's sweep"),
    (("softmax_forward", "5", "--all"), "give a version of softmax_forward or --all, not both"),
    (("--all", "--Q", "3"), "unknown option '--Q'; the ops' sizes are --B, "),
    (("--all", "--T", "x"), "--T needs a positive integer, got 'x'"),
    (("softmax_forward", "4", "--arch", "80"), "--arch is for --compile-report"),
    (("--compile-report", "--B", "3"), "--compile-report takes no sizes (got --B)"),
    (("softmax_forward", "4", "--arch", "sm_8x"), "'sm_8x' is not a compute capability"),
    # flags and arguments that were silently ignored
    (("--list", "softmax_forward", "3"), "--list lists versions, it runs nothing (got 3); give --list alone or --list OP"),
    (("--list", "--B", "3"), "--list lists versions, it runs nothing (got --B)"),
    (("--list", "softmaxx"), "unknown op 'softmaxx'; ops: "),
    (("softmax_forward", "4", "--gpu", "t4"), "--gpu is for --analyze (the memory-traffic model); add --analyze"),
    (("softmax_forward", "4", "--no-lines"), "--no-lines is for --analyze"),
    (("--list", "--json", "r.json"), "--json records what a run or --compile-report finds; --list runs nothing"),
    (("--compile-report", "softmax_forward", "3"), "--compile-report compiles softmax_forward's whole kernel file, "
                                                   "every version; give the op without a version (got 3)"),
    # NumPy refuses a negative seed with a traceback; zero timed samples have no mean
    (("softmax_forward", "4", "--seed", "-1"), "argument --seed: needs an integer >= 0, got -1"),
    (("softmax_forward", "4", "--repeat", "0"), "argument --repeat: needs an integer >= 1, got 0"),
])
def test_bad_usage_exits_2_with_the_choices(args, message):
    rc, out, err = run(*args)
    assert rc == 2 and message in err, (rc, out, err)


def test_list_of_one_op():
    rc, out, err = run("--list", "gelu_forward")
    assert rc == 0, err
    assert out.startswith("gelu_forward: ") and "softmax_forward" not in out and "* = default version." in out


def test_compile_report_without_a_gpu(tmp_path, have_nvrtc):
    # have_nvrtc: NVRTC comes with the test extra; skips without it here, fails on CI
    rc, out, err = run("--compile-report", "softmax_forward", "--arch", "sm_80", "--json", str(tmp_path / "r.json"))
    assert rc == 0, out + err
    assert "softmax_forward_kernel7" in out and "sm_80" in out and "1/1 compilations ok" in out
    # the op after the archs (--arch is greedy): was "'softmax_forward' is not a compute capability"
    rc, out, err = run("--compile-report", "--arch", "sm_80", "softmax_forward")
    assert rc == 0 and "softmax_forward_kernel7" in out and "1/1 compilations ok" in out, out + err
    # --json used to be accepted and ignored here
    rows = json.loads((tmp_path / "r.json").read_text())
    k7 = [r for r in rows if r["kernel"] == "softmax_forward_kernel7"]
    assert len(k7) == 1 and k7[0]["ok"] and k7[0]["arch"] == 80 and k7[0]["registers"] > 0, k7
    # register counts change with the NVRTC release: before, neither the table nor the rows named it
    from llmcupy import nvrtc

    version = "{}.{}".format(*nvrtc.find_nvrtc().version())
    assert out.startswith(f"NVRTC {version} ") and {r["nvrtc"] for r in rows} == {version}, out


def test_size_flags_are_taken_out_before_the_positionals():
    # `--all --B 3` used to hand "3" to OP; with --all and no op, each op takes the sizes it has
    from llmcupy import kernel

    rest, flags = kernel._split_size_flags(kernel._parser(), ["--all", "--T", "3", "--V=77", "--json", "r.json"])
    assert rest == ["--all", "--json", "r.json"]
    assert flags == [("--T", "T", "3"), ("--V", "V", "77")]
    by_op = kernel._catalogue_sizes(flags)
    assert by_op["softmax_forward"] == {"T": 3, "V": 77}
    assert by_op["gelu_forward"] == {"T": 3} and by_op["adamw"] == {}
    # lower case as the single-op path accepts it, and no abbreviation of --compile-report
    rest, flags = kernel._split_size_flags(kernel._parser(), ["softmax_forward", "2", "--c", "5"])
    assert rest == ["softmax_forward", "2"] and flags == [("--c", "c", "5")]
    assert kernel._catalogue_sizes(flags)["matmul_forward"] == {"C": 5}


def test_all_with_a_block_size_skips_the_versions_that_do_not_offer_it():
    rc, out, err = run("softmax_forward", "--all", "--block-size", "64", "--B", "1", "--T", "3", "--V", "77")
    assert rc == 0, out + err
    assert "version 3: ERROR" not in out
    assert "SKIP (block size 64 is not in this version's sweep (32))" in out
    assert "0 failed" in out and " skipped" in out and "0 skipped" not in out


@pytest.mark.parametrize("where,message", [
    ("/proc/x.json", "--json /proc/x.json: cannot create a file in /proc"),
    ("{tmp}", "--json {tmp}: it is a folder; give a file name"),
    ("{tmp}/no/such/r.json", "--json {tmp}/no/such/r.json: the folder {tmp}/no/such does not exist"),
    # a FIFO or device: the atomic write renamed the results over it (over /dev/null itself, as root)
    ("{tmp}/fifo", "--json {tmp}/fifo: it exists and is not a regular file"),
])
def test_an_unwritable_json_path_is_refused_before_anything_runs(tmp_path, where, message):
    where, message = where.format(tmp=tmp_path), message.format(tmp=tmp_path)
    if where.endswith("fifo"):
        os.mkfifo(where)
    rc, out, err = run("softmax_forward", "5", "--json", where)
    assert rc == 2 and err.startswith(f"error: {message}") and len(err.strip().splitlines()) == 1, (rc, out, err)
    assert "PASS" not in out


@pytest.mark.parametrize("variable,value,message", [
    ("LLMCUPY_SIM_TIMEOUT", "abc", "LLMCUPY_SIM_TIMEOUT='abc' is not valid: give a number of seconds >= 0"),
    ("LLMCUPY_SIM_CHECK", "bogus", "LLMCUPY_SIM_CHECK: unknown sanitizer 'bogus'; choose any of race, memory, init"),
    ("LLMCUPY_CACHE_DIR", "/proc/nope", "LLMCUPY_CACHE_DIR='/proc/nope' is not valid: cannot use /proc/nope/sim"),
    ("LLMCUPY_SIM_STACK_KB", "-5", "LLMCUPY_SIM_STACK_KB='-5' is not valid: give a whole number of KiB from 1"),
    ("LLMCUPY_SIM_WORKERS", "x", "LLMCUPY_SIM_WORKERS='x' is not valid: give a whole number of worker threads"),
])
@pytest.mark.parametrize("cli", ["llmcupy.kernel", "llmcupy.bench"])
def test_a_bad_emulator_variable_is_one_line_naming_it(monkeypatch, cli, variable, value, message):
    import os

    env = dict(os.environ, LLMCUPY_BACKEND="sim", **{variable: value})
    args = ["softmax_forward", "5"] if cli == "llmcupy.kernel" else ["--ops", "gelu_forward", "--no-save"]
    proc = subprocess.run([sys.executable, "-m", cli, *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {message}"), (proc.returncode, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_bad_emulator_variable_is_a_value_error_from_the_python_api():
    import os

    code = ("import numpy as np, llmcupy\n"
            "try:\n"
            "    llmcupy.ops['softmax_forward'](np.ones((2, 8), np.float32), version=5)\n"
            "except ValueError as exc:\n"
            "    print('ValueError:', exc)\n")
    for variable, value in (("LLMCUPY_SIM_STACK_KB", "-5"), ("LLMCUPY_SIM_TIMEOUT", "abc")):
        env = dict(os.environ, LLMCUPY_BACKEND="sim", **{variable: value})
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0 and proc.stdout.startswith(f"ValueError: {variable}={value!r} is not valid"), \
            (proc.returncode, proc.stdout, proc.stderr)


def test_ctrl_c_stops_the_run_in_one_line_and_keeps_the_json(tmp_path):
    import sys as _sys

    _sys.path.insert(0, os.path.dirname(__file__))
    from _helpers import ctrl_c_after

    path = tmp_path / "results.json"
    # the whole catalogue, once its second version printed (the first is in the JSON), far from done
    rc, out, err = ctrl_c_after(["llmcupy.kernel", "--all", "--backend", "sim", "--json", str(path)],
                                "adamw version 2:")
    assert rc == 130, (rc, out[-2000:], err)
    assert "Traceback" not in out + err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted after ") and f"{path} holds the versions that finished" in line, err
    done = int(line.split()[2])
    assert 1 <= done < 90 and len(json.loads(path.read_text())) == done
    assert " passed, " not in out   # no summary line of a finished run



def test_output_piped_into_head_ends_quietly():
    # `python -m llmcupy.kernel ... | head -1`: the reader goes away after one line
    proc = subprocess.Popen([sys.executable, "-m", "llmcupy.kernel", "softmax_forward", "--all", "--backend", "sim"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("softmax_forward version 1:")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and err == "", err


@pytest.mark.parametrize("cli", ["train", "sample"])
def test_trainer_and_sampler_piped_into_head_end_quietly(cli, tmp_path):
    # `python -m llmcupy.train ... | head -2`: the write after head left was handed to the OSError
    # handler, "error: Broken pipe" and exit 2, the code for a bad input file
    import numpy as np

    from llmcupy.checkpoint import write_model
    from llmcupy.config import PRESETS, init_params
    from llmcupy.data import write_tokens

    tokens, model = tmp_path / "tokens.bin", tmp_path / "model.bin"
    write_tokens(tokens, np.random.default_rng(0).integers(0, 50257, 2000))
    write_model(model, PRESETS["d1"], init_params(PRESETS["d1"], seed=0))
    argv = {"train": ["--init", "d1", "-t", "16", "-b", "2", "-x", "3", "-v", "0", "-s", "0", "-i", tokens, "-j", tokens],
            "sample": ["-e", model, "-t", "16", "-n", "200", "--seed", "1"]}[cli]
    proc = subprocess.Popen([sys.executable, "-m", f"llmcupy.{cli}", "--backend", "sim", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    assert os.read(proc.stdout.fileno(), 1)   # the first byte (sample writes a token at a time), then gone
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and "error" not in err and "Traceback" not in err, err


def test_a_broken_pipe_elsewhere_is_still_an_error(capsys):
    # only stdout's reader going away ends quietly: a peer's closed socket is a real error (exit 2)
    from llmcupy._cli import fail

    assert fail(BrokenPipeError(32, "Broken pipe")) == 2
    assert "error: Broken pipe" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--order", "reverse"], "--order reverse sets the emulator's thread order (add --backend sim)"),
    (["--sanitize"], "--sanitize runs in the emulator only (add --backend sim)"),
    (["--analyze"], "--analyze counts memory traffic in the emulator: add --backend sim"),
])
def test_emulator_only_flags_on_a_gpu_are_refused(monkeypatch, capsys, flags, message):
    # on a GPU (faked: the backend answers cuda) an emulator-only flag must not be silently ignored
    from llmcupy import kernel
    from llmcupy.runtime import backend

    monkeypatch.setattr(backend, "get_backend", lambda: "cuda")
    monkeypatch.setattr(backend, "is_sim", lambda: False)
    monkeypatch.setattr(kernel.harness, "sweep", lambda *a, **k: pytest.fail("a version ran"))
    assert kernel.main(["softmax_forward", "4", *flags]) == 2
    assert message in capsys.readouterr().err


def test_sizes_too_large_for_memory_are_a_usage_error():
    # before: a NumPy _ArrayMemoryError traceback, exit 1 (with --all: every version FAILed)
    rc, out, err = run("softmax_forward", "1", "--backend", "sim", "--B", "100000", "--T", "100000")
    assert rc == 2 and "Traceback" not in err, err
    assert err.startswith("error: softmax_forward version 1 did not run: out of host memory for the inputs at "
                          "B=100000 T=100000 V=") and err.rstrip().endswith("give smaller sizes"), err


@pytest.mark.parametrize("args,message", [
    # the reference's NumPy traceback ("cannot reshape array of size 6144 ..."), exit 1
    (("attention_forward", "1", "--NH", "5"), "attention_forward: C = 64 must be a multiple of NH = 5"),
    # the op's OpError from make_inputs reported as the version's FAIL, exit 1
    (("attention_backward", "3", "--NH", "5"), "attention_backward: C = 64 must be a multiple of NH = 5"),
])
def test_sizes_the_op_refuses_are_a_usage_error(args, message):
    rc, out, err = run(*args, "--backend", "sim")
    assert rc == 2 and "Traceback" not in err, (rc, out, err)
    assert err.startswith(f"error: {args[0]} version {args[1]} did not run: the sizes do not fit the op: {message}"), err


def test_a_version_that_fails_in_the_emulator_is_pointed_at_the_sanitizers(monkeypatch):
    # A new version with a missing __syncthreads printed its mismatches and FAIL, nothing more: a plain
    # emulator run does not report races or out-of-bounds accesses, and the reader was not told so
    from _helpers import run_cli, trial_op

    from llmcupy import kernel

    trial_op(monkeypatch, "neighbour_copy")
    rc, out, err = run_cli(kernel.main, ["trial_neighbour_copy", "1", "--backend", "sim"])
    assert rc == 1 and "FAIL" in out, out + err
    assert ("a race or an out-of-bounds access? python -m llmcupy.kernel trial_neighbour_copy 1 --sanitize names "
            "the line") in out
    rc, out, err = run_cli(kernel.main, ["trial_neighbour_copy", "1", "--backend", "sim", "--sanitize"])
    assert rc == 1 and "racecheck:" in out and "--sanitize names the line" not in out, out + err
    rc, out, err = run_cli(kernel.main, ["softmax_forward", "4", "--backend", "sim"])
    assert rc == 0 and "--sanitize names the line" not in out, out + err
