"""Every version of every op against its NumPy reference, in the emulator.

Each (op, version, shape) runs in two thread orders (forward and reverse; the random order is a
third for a subset) and at every block size of the version's sweep, with the hazard counters
asserted zero. Shapes come from each op's ``test_shapes``: awkward sizes its constraints allow.
"""

import dataclasses

import numpy as np
import pytest

import llmcupy
from llmcupy import sim
from llmcupy.harness import run_isolated
from _helpers import trial_op
from llmcupy import harness
from llmcupy.ops import OpDefinitionError, OpError, check_outputs
from llmcupy.ops._op import kernel_file_versions
from llmcupy.runtime.module import kernels_dir


def _cases():
    for name in llmcupy.ops:
        op = llmcupy.ops[name]
        for number, version in sorted(op.versions.items()):
            if not version.available:
                continue
            for i, shape in enumerate(op.test_shapes):
                yield pytest.param(name, number, i, id=f"{name}-v{number}-shape{i}")


@pytest.mark.parametrize("name,number,shape_index", list(_cases()))
def test_version_matches_reference(name, number, shape_index):
    # In a child process: a kernel that crashes the emulator fails this test only.
    outcome = run_isolated(_check_version, name, number, shape_index)
    if outcome.get("skip"):
        pytest.skip(outcome["skip"])
    assert outcome.get("ok"), outcome.get("error")


def _check_version(name, number, shape_index):
    sim.reset_hazards()
    try:
        ran = _run_version(name, number, shape_index)
    except AssertionError as exc:
        return {"ok": False, "error": str(exc)}
    if ran == 0:
        return {"skip": f"{name} v{number}: no block size of its sweep allows shape {shape_index}"}
    hazards = {k: v for k, v in sim.hazards().items() if k != "launches" and v}
    if hazards:
        return {"ok": False, "error": f"emulator hazards: {hazards}"}
    return {"ok": True}


def _fresh(inputs):
    # a copy of every array per run (in-place ops); scalar inputs (NH, a switch) pass as they are
    return {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}


def _run_version(name, number, shape_index):
    op = llmcupy.ops[name]
    version = op.versions[number]
    shape = op.test_shapes[shape_index]
    inputs = op.make_inputs(np.random.default_rng(shape_index), **shape)
    ref = op.reference_fn(**_fresh(inputs))
    ran = 0
    orders = ("forward", "reverse", "random") if shape_index == 0 else ("forward", "reverse")
    for block_size in version.block_sizes or (None,):
        if version.requires is not None and version.requires(inputs, block_size):
            continue
        for order in orders:
            arrays = _fresh(inputs)
            with sim.settings(order=order, seed=17):
                got = op.run(number, arrays, block_size)
            for result in check_outputs(op, ref, got, inputs=inputs):
                if not result["ok"]:
                    wrong = f"{name} v{number} block {block_size} order {order}: {result}"
                    findings = _sanitizer_findings(op, number, inputs, block_size)
                    if findings:
                        wrong += f"\nthe sanitizers say why ({_sanitize_command(name, number)}):\n{findings}"
                    raise AssertionError(wrong)
            ran += 1
    return ran


def _untested(op, version):
    """Why no test shape runs ``version`` (its requires refuses each at every block size), or None."""
    refusals = []
    for i, shape in enumerate(op.test_shapes):
        inputs = op.make_inputs(np.random.default_rng(i), **shape)
        for block_size in version.block_sizes or (None,):
            problem = version.requires(inputs, block_size) if version.requires is not None else None
            if not problem:
                return None
            refusals.append(problem)
    return (f"{op.name} v{version.number} refuses every one of the op's test shapes ({refusals[0]}), so no test "
            f"runs it: add a shape it takes to the op's test_shapes")


@pytest.mark.parametrize("name,number", [(n, v) for n in llmcupy.ops for v, ver in sorted(llmcupy.ops[n].versions.items())
                                         if ver.available])
def test_every_version_runs_on_some_test_shape(name, number):
    # the reference test skips a shape a version refuses: one that refused them all passed untested
    op = llmcupy.ops[name]
    problem = _untested(op, op.versions[number])
    assert problem is None, problem


def test_a_version_that_refuses_every_test_shape_is_named():
    op = llmcupy.ops["softmax_forward"]
    picky = dataclasses.replace(op.versions[4], number=99, requires=lambda a, bs: "C must be a multiple of 128")
    trial = dataclasses.replace(op, versions={99: picky})
    assert _untested(trial, trial.versions[99]) == (
        "softmax_forward v99 refuses every one of the op's test shapes (C must be a multiple of 128), so no test "
        "runs it: add a shape it takes to the op's test_shapes")
    assert _untested(op, op.versions[4]) is None


def _deterministic_cases():
    for name in llmcupy.ops:
        for number, version in sorted(llmcupy.ops[name].versions.items()):
            if version.available and version.deterministic:
                yield pytest.param(name, number, id=f"{name}-v{number}")


@pytest.mark.parametrize("name,number", list(_deterministic_cases()))
def test_a_version_marked_deterministic_gives_the_same_bits_in_every_thread_order(name, number):
    # `deterministic` is a promise to the trainer (its defaults and --kernel choices) that two runs
    # print the same losses. fp32 atomics, in global or shared memory, break it: their order is the
    # thread order, which the emulator varies here as a GPU's scheduler does.
    outcome = run_isolated(_check_same_bits, name, number)
    if outcome.get("skip"):
        pytest.skip(outcome["skip"])
    assert outcome.get("ok"), outcome.get("error")


def _check_same_bits(name, number):
    op = llmcupy.ops[name]
    version = op.versions[number]
    bs = version.default_block_size
    # the largest test shape the version takes (most input elements): the most rows and blocks
    # adding into one output
    candidates = []
    for i, shape in enumerate(op.test_shapes):
        inputs = op.make_inputs(np.random.default_rng(i), **shape)
        if version.requires is None or not version.requires(inputs, bs):
            candidates.append((sum(v.size for v in inputs.values() if isinstance(v, np.ndarray)), i, inputs))
    if not candidates:
        return {"skip": f"{name} v{number}: no test shape allowed at block size {bs}"}
    inputs = max(candidates, key=lambda c: c[:2])[2]
    runs = []
    for order in ("forward", "reverse", "random"):
        with sim.settings(order=order, seed=5):
            got = op.run(number, _fresh(inputs), bs)
        runs.append({k: np.array(got[k], copy=True) for k in op.outputs if got[k] is not None})
    unspecified = None
    for order, run in zip(("reverse", "random"), runs[1:]):
        for k, v in run.items():
            if np.array_equal(v, runs[0][k], equal_nan=True):
                continue
            if unspecified is None:
                # entries the reference leaves NaN are unspecified (trimat's upper triangle), and a
                # version may leave them unwritten: each run's output is a fresh np.empty, whose
                # leftover bytes depend on what the process allocated before, not on thread order
                ref = op.reference(**inputs)
                ref = dict(zip(op.outputs, ref if isinstance(ref, tuple) else (ref,)))
                unspecified = {n: np.isnan(r) if r is not None and r.dtype.kind == "f" else False
                               for n, r in ref.items()}
            differs = ~((v == runs[0][k]) | (np.isnan(v) & np.isnan(runs[0][k])) if v.dtype.kind == "f"
                        else v == runs[0][k])
            if (differs & ~unspecified[k]).any():
                changed = f"{name} v{number} {k}: the {order} thread order changed the bits"
                findings = _sanitizer_findings(op, number, inputs, bs)
                if findings:   # a bug that moves with the thread order, not fp32 atomics: nothing to mark
                    return {"ok": False, "error": f"{changed}; the sanitizers say why ({_sanitize_command(name, number)}):"
                                                  f"\n{findings}"}
                return {"ok": False, "error": f"{changed}, and the sanitizers find no race or out-of-bounds access: "
                                              "fp32 atomics adding in thread order? Then mark the version "
                                              "deterministic=False"}
    return {"ok": True}


def _sanitize_command(name, number):
    return f"python -m llmcupy.kernel {name} {number} --sanitize"


def _sanitizer_findings(op, number, inputs, bs):
    """The racecheck and memcheck reports of one run, or None: a result that changes with the thread
    order is a race or an out-of-bounds access far more often than an atomic's order."""
    try:
        with sim.settings(check="race,memory"):
            op.run(number, _fresh(inputs), bs)
    except sim.SimSanitizerError as exc:
        return str(exc)
    return None


def test_a_race_that_changes_the_bits_is_reported_as_a_race_not_as_nondeterminism(monkeypatch):
    # Before, a version whose bits changed with the thread order was told "mark the version
    # deterministic=False" whatever the cause: a newcomer's missing __syncthreads (or an out-of-bounds
    # write) got the advice that hides it. Now the sanitizers run on that input and name the lines.
    op = trial_op(monkeypatch, "neighbour_copy")
    outcome = _check_same_bits(op.name, 1)
    assert not outcome["ok"]
    assert "deterministic=False" not in outcome["error"]
    assert "the sanitizers say why (python -m llmcupy.kernel trial_neighbour_copy 1 --sanitize)" in outcome["error"]
    assert "racecheck:" in outcome["error"] and "in kernel neighbour_copy" in outcome["error"]
    wrong = _check_version(op.name, 1, 0)   # the reference test: wrong outputs, and why
    assert not wrong["ok"] and "racecheck:" in wrong["error"] and "--sanitize" in wrong["error"]


def test_fp32_atomics_that_change_the_bits_are_told_to_mark_the_version(monkeypatch):
    op = trial_op(monkeypatch, "atomic_row_sums")
    outcome = _check_same_bits(op.name, 1)
    assert not outcome["ok"]
    assert "the sanitizers find no race or out-of-bounds access" in outcome["error"]
    assert "mark the version deterministic=False" in outcome["error"]


@pytest.mark.parametrize("name", list(llmcupy.ops))
def test_op_is_well_formed(name):
    op = llmcupy.ops[name]
    # each check says what to add: a new op's author reads these (DEVELOPERS.md, "Adding an op")
    assert op.default_version in op.versions, f"default_version={op.default_version} is not in OP.versions"
    assert op.versions[op.default_version].available, "the default version must be available everywhere"
    assert len(op.test_shapes) >= 3, "at least three shapes per op"
    assert set(op.tolerance) == set(op.outputs), "OP.tolerance needs one (atol, rtol) per output, no other"
    assert op.tolerance_note, "tolerances must say why"
    assert set(op.tf32_tolerance) <= set(op.outputs)
    assert not op.tf32_tolerance or op.tf32_tolerance_note, "TF32 tolerances must say why"
    assert op.bound is not None, "OP.bound (a Bound, with sizes_of) is the upper bound GPU timings are set against"
    assert op.sizes_of is not None, "OP.sizes_of(arrays) gives the sizes OP.bound reads"
    for which in ("sizes", "sim_sizes"):   # `sizes` is read only on a GPU: a mistake in it shows here first
        assert op.sizes_problem(getattr(op, which), which) is None
    code = op.source_code()
    assert code.lstrip().startswith("/*"), "a kernel file starts with a header listing its versions"
    with pytest.raises(OpError, match="versions"):
        op.version(999)


def _kernel_file_problems(source, code, registered):
    """What a kernel file and the versions registered on it (by every op that uses the file) disagree
    on: a registered version with no ``version N:`` entry in the header comment, and a header entry or a
    kernel named ``..._kernel<N>`` that no op registers (DEVELOPERS.md, "Adding a kernel version")."""
    mentioned = kernel_file_versions(code)
    problems = []
    for number in sorted(registered):
        if not any(m.startswith("a header entry") for m in mentioned.get(number, [])):
            problems.append(f"kernels_cu/{source}: its header comment has no entry 'version {number}:' for the "
                            f"registered version {number}")
    for number, mentions in sorted(mentioned.items()):
        if number not in registered:
            problems.append(f"kernels_cu/{source} has {' and '.join(mentions)}, but no op registers version {number}: "
                            f"add a Version({number}, ...) to the op's OP.versions")
    return problems


def _kernel_files():
    files = {}
    for name in llmcupy.ops:
        op = llmcupy.ops[name]
        files.setdefault(op.source, set()).update(op.versions)
    return sorted(files.items())


@pytest.mark.parametrize("source,registered", _kernel_files(), ids=[f for f, _ in _kernel_files()])
def test_a_kernel_file_and_its_registered_versions_agree(source, registered):
    code = (kernels_dir() / source).read_text()
    problems = _kernel_file_problems(source, code, registered)
    assert not problems, "\n".join(problems)


def test_every_kernel_file_is_some_ops_source():
    # a kernels_cu/<op>.cu whose op module is missing (or registers nothing) compiled in the NVRTC check
    # and nowhere else: --list, the catalogue and these tests never ran its kernels
    sources = {llmcupy.ops[name].source for name in llmcupy.ops}
    orphans = sorted(p.name for p in kernels_dir().glob("*.cu") if p.name not in sources)
    assert not orphans, (f"no op's source: {', '.join(orphans)}: add llmcupy/ops/<op>.py with OP = Op(..., "
                         f"source=...) (DEVELOPERS.md, \"Adding an op\")")


def test_the_kernel_file_check_sees_a_missing_header_entry_and_a_version_left_unregistered():
    # Before, "version N" anywhere in the file stood for the header entry (the kernel's own
    # "// version 9: ..." comment was enough, and "version 1" matched "version 10"), and a kernel or a
    # header entry that no Version registered went unnoticed: the tests ran every version but that one.
    code = "/*\nversion 1: naive\nversion 10: fast\n*/\n" + "".join(
        f"// version {n}: ...\n__global__ void __launch_bounds__(256) demo_kernel{n}(float* y) {{}}\n"
        for n in (1, 9, 10))
    assert _kernel_file_problems("demo.cu", code, {1, 9}) == [
        "kernels_cu/demo.cu: its header comment has no entry 'version 9:' for the registered version 9",
        "kernels_cu/demo.cu has a header entry 'version 10:' and kernel demo_kernel10, but no op registers version 10: "
        "add a Version(10, ...) to the op's OP.versions",
    ]


def test_an_unknown_version_that_the_kernel_file_has_says_to_register_it(monkeypatch):
    # A newcomer who wrote the kernel and its header entry but no Version met only "softmax_forward has
    # no version 8; versions: 1, ..., 7"; now the error says what the file has and where the Version goes.
    from llmcupy.ops import _REGISTRY

    op = llmcupy.ops["softmax_forward"]
    forgot = dataclasses.replace(op, versions={n: v for n, v in op.versions.items() if n != 8})
    monkeypatch.setitem(_REGISTRY, "softmax_forward", forgot)
    with pytest.raises(OpError, match=r"softmax_forward has no version 8; versions: 1, 2, 3, 4, 5, 6, 7(, \d+)*; "
                                      r"kernels_cu/softmax_forward.cu has a header entry 'version 8:' and kernel "
                                      r"softmax_forward_online_kernel8, but no Version\(8, ...\) is registered: add one "
                                      r"to OP.versions in llmcupy/ops/softmax_forward.py"):
        forgot.version(8)
    with pytest.raises(OpError, match=r"matmul_gelu_forward has no version 5; versions: 1, 2(, \d+)*$"):
        llmcupy.ops["matmul_gelu_forward"].version(5)   # matmul_forward.cu's version 5 is matmul_forward's


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_compare_skips_unwritten_entries_without_a_warning():
    # a version may leave "don't care" entries unwritten (trimat's upper triangle, reference NaN);
    # from xp.empty they can hold a signalling NaN, whose float64 cast sets the FPU's invalid flag
    from llmcupy.ops._op import compare

    # a signalling NaN, 1.0 and +inf, as bit patterns (a float scalar on the way would quieten the NaN)
    got = np.array([0x7FA00000, 0x3F800000, 0x7F800000], dtype=np.uint32).view(np.float32)
    ref = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
    result = compare("out", ref, got, 1e-3, 0.0)
    assert not result["ok"] and result["mismatches"] == 1 and result["max_abs"] == float("inf")


def test_out_takes_a_bare_array_for_a_single_output_op_and_refuses_unknown_names():
    op = llmcupy.ops["softmax_forward"]
    x = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    out = np.empty((4, 100), np.float32)
    assert op(x, version=5, out=out) is out
    np.testing.assert_allclose(out, op.reference(x), atol=1e-6)
    with pytest.raises(OpError, match=r"softmax_forward has no output 'y'; outputs: out"):
        op(x, version=5, out={"y": out})
    with pytest.raises(OpError, match=r"out\['out'\] must be an array, got list"):
        op(x, version=5, out=[out])
    several = llmcupy.ops["matmul_backward"]
    with pytest.raises(OpError, match=r"3 outputs: give out= as a dict by name \(dinp, dweight, dbias\)"):
        several(*[None] * 6, out=out)


def test_inputs_are_checked_and_named_before_outputs_are_allocated_from_them():
    op = llmcupy.ops["softmax_forward"]
    x = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    with pytest.raises(OpError, match=r"softmax_forward: input 'inp' is not C-contiguous"):
        op(np.asfortranarray(x), version=5)
    with pytest.raises(OpError, match=r"softmax_forward: input 'inp' is empty \(shape \(0, 100\)\)"):
        op(np.zeros((0, 100), np.float32), version=5)


def test_a_bad_call_is_an_op_error_naming_the_problem():
    op = llmcupy.ops["softmax_forward"]
    x = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    with pytest.raises(OpError, match=r"softmax_forward has no version 5.5; versions: 1, 2, 3"):
        op(x, version=5.5)           # not version 5
    with pytest.raises(OpError, match=r"softmax_forward has no version True; versions: 1, 2, 3"):
        op(x, version=True)          # not version 1
    with pytest.raises(OpError, match=r"softmax_forward version 5: block size 'a' is not a whole number \(its block "
                                      r"sizes: 32, 64, 128, 256, 512, 1024\)"):
        op(x, version=5, block_size="a")
    with pytest.raises(OpError, match=r"block size 100.5 is not a whole number"):
        op(x, version=5, block_size=100.5)
    with pytest.raises(OpError, match=r"softmax_forward: out\['out'\] has dtype float64, expected float32"):
        op(x, version=5, out=np.empty((4, 100), np.float64))
    np.testing.assert_allclose(op(x, version=5.0, block_size=64.0), op.reference(x), atol=1e-6)


def test_a_requires_written_as_a_predicate_is_refused_naming_the_contract():
    # A newcomer's requires=lambda a, bs: C % 4 == 0 answers True where the version can run. Taken as a
    # refusal, that ran the version on every shape it cannot take (False passed as "no problem") and
    # refused the ones it can with the reason "True"; the tests skipped those shapes without a word.
    op = llmcupy.ops["softmax_forward"]
    predicate = dataclasses.replace(op.versions[4], number=99, requires=lambda a, bs: a["inp"].shape[1] % 4 == 0)
    trial = dataclasses.replace(op, versions={99: predicate})
    contract = r"softmax_forward version 99: requires\(\) returned {}; it must return None when the version can run"
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    with pytest.raises(TypeError, match=contract.format("True")):
        trial(x, version=99)
    with pytest.raises(TypeError, match=contract.format("False")):
        trial(x[:, :7].copy(), version=99)
    refusing = dataclasses.replace(predicate, requires=lambda a, bs: "C must be a multiple of 4")
    with pytest.raises(OpError, match="softmax_forward version 99: C must be a multiple of 4"):
        dataclasses.replace(op, versions={99: refusing})(x, version=99)
    # a copy renumbered keeps the predicate, and its mistake names the new number
    renumbered = dataclasses.replace(predicate, number=98)
    with pytest.raises(TypeError, match=r"softmax_forward version 98: requires\(\) returned True"):
        dataclasses.replace(op, versions={98: renumbered})(x, version=98)


def test_make_inputs_takes_a_seed_and_refuses_bad_sizes_naming_them():
    # before: an int seed was an AttributeError ('int' object has no attribute 'uniform'), a
    # misspelt size a bare TypeError, a negative size NumPy's "negative dimensions are not allowed"
    op = llmcupy.ops["softmax_forward"]
    a, b = op.make_inputs(3, B=1, T=2, V=5), op.make_inputs(np.random.default_rng(3), B=1, T=2, V=5)
    np.testing.assert_array_equal(a["inp"], b["inp"])
    with pytest.raises(OpError, match=r"softmax_forward.make_inputs has no size 'Q'; it takes B, T, V"):
        op.make_inputs(0, Q=3)
    with pytest.raises(OpError, match=r"softmax_forward.make_inputs: B must be a positive int, got -2"):
        op.make_inputs(0, B=-2)
    with pytest.raises(OpError, match=r"softmax_forward.make_inputs: V must be a positive int, got 0"):
        op.make_inputs(0, V=0)
    with pytest.raises(OpError, match=r"softmax_forward.make_inputs: rng must be a np.random.Generator or an int "
                                      r"seed, got float"):
        op.make_inputs(0.5)
    mm = llmcupy.ops["matmul_forward"]
    assert mm.make_inputs(0, B=1, T=2, C=4, OC=8, has_bias=0)["bias"] is None   # an option, not a size


def test_sizes_that_do_not_fit_make_inputs_are_named_with_where_they_come_from():
    # A new op whose sim_sizes lacked a size met a TypeError traceback from its make_inputs ("missing 1
    # required positional argument: 'C'"), and a mistake in `sizes`, read only on a GPU, went unseen here.
    op = llmcupy.ops["residual_forward"]
    lacking = dataclasses.replace(op, sim_sizes={"B": 2, "T": 8})
    with pytest.raises(OpError, match=r"^residual_forward.make_inputs: it needs C, which neither the call nor "
                                      r"OP.sim_sizes gives: add it to OP.sim_sizes \(llmcupy/ops/residual_forward.py\)$"):
        lacking.make_inputs(0)
    assert lacking.make_inputs(0, C=4)["inp1"].shape == (2, 8, 4)   # the call may give what the defaults lack
    typo = dataclasses.replace(op, sim_sizes={"B": 2, "T": 8, "c": 4})
    with pytest.raises(OpError, match=r"OP.sim_sizes has c, which make_inputs\(rng, B, T, C\) does not take"):
        typo.make_inputs(0)
    # the op's own mistake fails a catalogue run: it is not sizes a caller asked for, which a run skips
    with pytest.raises(OpDefinitionError, match="it needs C"):
        harness.sweep(lacking, 1)
    assert harness.sweep(op, 1, {"Q": 6})["skipped"] == ("the sizes do not fit the op: residual_forward.make_inputs "
                                                         "has no size 'Q'; it takes B, T, C")   # the caller's: skipped
    assert op.sizes_problem({"B": 8, "T": 1024}, "sizes") == (
        "it needs C, which neither the call nor OP.sizes gives: add it to OP.sizes")
    assert op.sizes_problem(op.sizes) is None


def test_ops_mapping_refuses_a_key_that_is_not_a_name_and_has_keys_and_values():
    with pytest.raises(OpError, match=r"ops are looked up by name \(a str\), got int 0; ops: adamw, "):
        llmcupy.ops[0]
    with pytest.raises(OpError, match=r"got slice"):
        llmcupy.ops[0:2]
    with pytest.raises(OpError, match=r"unknown op 'softmax'; ops: adamw, "):
        llmcupy.ops["softmax"]
    assert llmcupy.ops.keys() == sorted(llmcupy.ops) and len(llmcupy.ops.values()) == len(llmcupy.ops)
    assert dict(llmcupy.ops)["softmax_forward"] is llmcupy.ops["softmax_forward"]


def test_an_op_module_that_registers_nothing_says_why_and_a_copied_name_replaces_no_op(monkeypatch, tmp_path):
    # A newcomer's new op module without OP = Op(...) met only "unknown op 'x'; ops: ..." and nothing in
    # --list; one copied from residual_forward.py and left with its name= silently replaced residual_forward.
    import sys

    from llmcupy import kernel, ops as registry

    (tmp_path / "demo_no_op.py").write_text("SUMMARY = 'an op whose OP is not written yet'\n")
    (tmp_path / "zz_copied.py").write_text("import dataclasses\nfrom llmcupy.ops import residual_forward\n"
                                           "OP = dataclasses.replace(residual_forward.OP)\n")
    real = registry["residual_forward"]
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_UNREGISTERED", {})
    try:
        with pytest.raises(OpError, match=r"unknown op 'demo_no_op' \(llmcupy/ops/demo_no_op.py defines no "
                                          r"OP = Op\(...\), which is what registers an op\); ops: adamw, "):
            registry["demo_no_op"]
        assert registry["residual_forward"] is real
        with pytest.raises(OpError, match=r"llmcupy/ops/zz_copied.py names its OP 'residual_forward'; an op's "
                                          r"name is its module's: name it 'zz_copied' \(or rename the file\)"):
            registry["zz_copied"]
        listing = kernel.list_catalogue()
        assert "\nnot registered:\n  llmcupy/ops/demo_no_op.py defines no OP" in listing
        assert "\n  llmcupy/ops/zz_copied.py names its OP 'residual_forward'" in listing
        assert "not registered" not in kernel.list_catalogue(["residual_forward"])
    finally:
        for name in ("demo_no_op", "zz_copied"):   # the import also set them as the package's attributes
            sys.modules.pop(f"llmcupy.ops.{name}", None)
            vars(registry).pop(name, None)


def test_every_op_module_registers_its_op():
    assert llmcupy.ops.unregistered() == {}


def test_optional_inputs_may_be_none_or_left_out_and_no_other_may_be_none():
    # (was an AttributeError from inside the op's validation)
    with pytest.raises(OpError, match=r"softmax_forward: input 'inp' is None; it needs a value \(inputs: inp\)"):
        llmcupy.ops["softmax_forward"](None)
    with pytest.raises(OpError, match=r"softmax_forward: input 'inp' is None"):
        llmcupy.ops["softmax_forward"].reference(None)
    with pytest.raises(OpError, match=r"attention_forward: input 'NH' is None"):
        llmcupy.ops["attention_forward"](np.zeros((1, 4, 24), np.float32), None)
    rng = np.random.default_rng(0)
    mm = llmcupy.ops["matmul_forward"]
    a = mm.make_inputs(rng)
    ref = mm.reference(a["inp"], a["weight"])          # no bias, left out
    np.testing.assert_allclose(ref, a["inp"] @ a["weight"].T, atol=1e-4)   # (was NaN: None became an array)
    for number in mm.versions:
        np.testing.assert_allclose(mm(a["inp"], a["weight"], version=number), ref, atol=1e-4)
        np.testing.assert_allclose(mm(a["inp"], a["weight"], None, version=number), ref, atol=1e-4)
    mb = llmcupy.ops["matmul_backward"]
    b = {**mb.make_inputs(rng), "dbias": None}
    assert mb.reference(**b)[2] is None
    got = mb(**{k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in b.items()})
    assert got[2] is None
    np.testing.assert_allclose(got[1], mb.reference(**b)[1], atol=1e-4)
    cf = llmcupy.ops["classifier_fused"]
    c = {**cf.make_inputs(rng), "dlosses": None}       # every dloss = 1/N
    losses, dlogits = cf.reference(**c)
    got_losses, got_dlogits = cf(**{k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
                                    for k, v in c.items()}, version=3)
    V = c["V"]
    np.testing.assert_allclose(got_losses, losses, atol=1e-5)
    np.testing.assert_allclose(got_dlogits[..., :V], dlogits[..., :V], atol=1e-6)


def test_the_reference_refuses_what_the_op_refuses():
    # (it used to answer a float64 input in float64 and a mis-shaped one with whatever NumPy made of it)
    sm = llmcupy.ops["softmax_forward"]
    x = np.random.default_rng(0).standard_normal((4, 8))
    for call in (sm, sm.reference):
        with pytest.raises(OpError, match=r"softmax_forward: inp must be float32, got float64"):
            call(x)
        with pytest.raises(OpError, match=r"softmax_forward: inp must be 2-D \(N, C\), got shape \(32,\)"):
            call(x.astype(np.float32).ravel())
    mm = llmcupy.ops["matmul_forward"]
    a = mm.make_inputs(np.random.default_rng(0))
    for call in (mm, mm.reference):
        with pytest.raises(OpError, match=r"matmul_forward: "):
            call(a["inp"], a["weight"][:-1], a["bias"])   # OC of weight and bias disagree
    mb = llmcupy.ops["matmul_backward"]
    b = mb.make_inputs(np.random.default_rng(0))
    with pytest.raises(OpError, match=r"overwrite_dinp must be True or False"):
        mb.reference(**{**b, "overwrite_dinp": 2})
    assert len(mb.reference(**{**b, "overwrite_dinp": True})) == 3   # a Python bool stays one


def test_an_input_named_out_is_given_by_name_and_out_is_still_the_destination_after_it():
    op = llmcupy.ops["flash_attention_backward"]        # its inputs: dout, inp, out (the forward's), lse, NH
    a = op.make_inputs(np.random.default_rng(0))
    ref = op.reference(**a)
    np.testing.assert_allclose(op(**a), ref, atol=1e-4)
    dest = np.empty_like(ref)
    assert op(a["dout"], a["inp"], a["out"], a["lse"], a["NH"], out=dest) is dest
    np.testing.assert_allclose(dest, ref, atol=1e-4)


def test_an_op_shows_how_it_is_called_and_explains_itself():
    op = llmcupy.ops["matmul_forward"]
    assert repr(op) == ("<llmcupy op matmul_forward(inp, weight, bias=None) -> out: 5 versions, default "
                        f"{op.default_version}; op.describe() lists them>")
    assert "-> (dinp, dweight, dbias)" in repr(llmcupy.ops["matmul_backward"])
    assert "overwrite_dinp=False" in repr(llmcupy.ops["matmul_backward"])
    doc = type(op).__doc__
    assert "op.describe()" in doc and "op.reference(" in doc and "OpError" in doc
    for method in ("describe", "reference", "make_inputs", "source_code", "version", "__call__"):
        assert getattr(type(op), method).__doc__, method
