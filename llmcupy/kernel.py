"""python -m llmcupy.kernel: run any version of any op, validated against its CPU reference.

    python -m llmcupy.kernel --list [OP]                 # every op and version (* = default), or OP's
    python -m llmcupy.kernel softmax_forward 5           # validate version 5; on a GPU, sweep and time it
    python -m llmcupy.kernel softmax_forward 5 --block-size 256 --B 4 --T 512
    python -m llmcupy.kernel softmax_forward --all       # every version of one op
    python -m llmcupy.kernel --all --json results.json   # the whole catalogue
    python -m llmcupy.kernel --all --T 64                # ... with T = 64 in every op that has a T
    python -m llmcupy.kernel softmax_forward --all --analyze   # memory-traffic metrics + roofline model
    python -m llmcupy.kernel --compile-report [OP] [--arch sm_80 ...]   # NVRTC registers/spills per kernel
    python -m llmcupy.kernel softmax_forward --all --sanitize          # racecheck, memcheck, initcheck
    python -m llmcupy.kernel --all --sanitize race,memory              # (emulator only)

Exit status: 0 all passed, 1 a version failed, 2 bad usage (unknown op or version, bad size; for one
version: unavailable here, or the sizes refused by every block size; no C++ compiler or NVRTC; a
version and --all together).
"""

from __future__ import annotations

import argparse
import json
import sys

from . import harness
from ._cli import int_at_least
from . import ops as ops_registry
from .ops import OpError
from .runtime import backend as _backend


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m llmcupy.kernel",
        description="Validate (and on a GPU, time) numbered kernel versions against their NumPy reference.",
        epilog="Sizes: any of the op's size names as flags, e.g. --B 4 --T 64 --C 768 (see --list); with --all "
               "and no op, each op takes the sizes it has.",
        # no abbreviations: a size flag such as --c 768 must not be read as --compile-report
        allow_abbrev=False,
    )
    p.add_argument("op", nargs="?", help="op name (see --list)")
    p.add_argument("version", nargs="?", help="version number")
    p.add_argument("--list", action="store_true", help="list every op and version (or OP's)")
    p.add_argument("--all", action="store_true", help="every version of OP, or the whole catalogue without OP")
    p.add_argument("--block-size", type=int, help="run only this block size instead of the sweep")
    p.add_argument("--backend", choices=_backend.CHOICES, default=None, help="cuda, sim or auto (default: auto)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the random inputs")
    p.add_argument("--repeat", type=int_at_least(1), default=50, help="timed launches per block size (GPU)")
    p.add_argument("--order", choices=("forward", "reverse", "random"), help="emulator thread order")
    p.add_argument("--sanitize", nargs="?", const="all", metavar="CHECKS",
                   help="emulator: run under racecheck, memcheck and initcheck (or a comma-separated subset of "
                        "race,memory,init); a version with findings FAILs and its reports are printed")
    p.add_argument("--json", metavar="PATH", help="also write the results (or --compile-report's rows) as JSON")
    p.add_argument("--compile-report", action="store_true", help="NVRTC compile of kernels_cu (no GPU needed)")
    p.add_argument("--arch", nargs="+", default=None, metavar="ARCH",
                   help="compute capabilities for --compile-report: 80, sm_80 or 8.0 (default: 75 80 90)")
    p.add_argument("--analyze", action="store_true",
                   help="emulator: memory-traffic metrics per launch and source line, occupancy and a roofline "
                        "model of the time on --gpu (see llmcupy/analyze.py)")
    p.add_argument("--gpu", default=None, metavar="NAME",
                   help="the GPU the --analyze model predicts for (default h100-sxm; "
                        "h200, h100-pcie, a100-sxm, rtx-4090, t4)")
    p.add_argument("--no-lines", action="store_true", help="--analyze without the per-source-line tables")
    return p


def _arch(text: str) -> int:
    from .nvrtc import parse_arch

    try:
        return parse_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _split_size_flags(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[tuple]]:
    """Separates the size flags (``--B 4``, ``--T=64``: any ``--NAME`` the parser does not define) from the
    rest before argparse sees them, as (flag, name, value) with value None when missing: otherwise
    ``--all --B 3`` would hand ``3`` to the positional OP."""
    known = {s for a in parser._actions for s in a.option_strings}
    rest, sizes, i = [], [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--":                       # everything after is positional
            rest += argv[i:]
            break
        name = token[2:].split("=", 1)[0]
        if token.startswith("--") and name and token.split("=", 1)[0] not in known:
            if "=" in token:
                value = token.split("=", 1)[1]
            elif i + 1 < len(argv):
                value = argv[i + 1]
                i += 1
            else:
                value = None
            sizes.append((token.split("=", 1)[0], name, value))
        else:
            rest.append(token)
        i += 1
    return rest, sizes


def _parse_sizes(op, flags: list[tuple]) -> dict:
    """(flag, name, value) triples -> {'B': 4, 'T': 64}, checking the names against the op's sizes."""
    names = {k.lower(): k for k in op.sizes}
    sizes = {}
    for flag, name, value in flags:
        if name.lower() not in names:
            raise OpError(f"unknown option {flag!r} for {op.name}; its sizes are {', '.join('--' + k for k in op.sizes)}")
        sizes[names[name.lower()]] = _positive(flag, value)
    return sizes


def _positive(flag: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise OpError(f"{flag} needs a positive integer, got {value!r}") from None
    if number < 1:
        raise OpError(f"{flag} needs a positive integer, got {number}")
    return number


def _catalogue_sizes(flags: list[tuple]) -> dict:
    """``--all`` without an op: {op: its sizes}, each op taking the size flags it has (``--T 64`` sets T
    wherever there is one); a name that no op has is a typo."""
    every = {k.lower(): k for name in ops_registry.names() for k in ops_registry.get(name).sizes}
    for flag, name, value in flags:
        if name.lower() not in every:
            raise OpError(f"unknown option {flag!r}; the ops' sizes are {', '.join('--' + k for k in sorted(set(every.values())))}")
        _positive(flag, value)
    by_op = {}
    for op_name in ops_registry.names():
        op = ops_registry.get(op_name)
        has = {k.lower() for k in op.sizes}
        by_op[op_name] = _parse_sizes(op, [f for f in flags if f[1].lower() in has])
    return by_op


def list_catalogue(names=None) -> str:
    """``--list``: every op (or those of ``names``), its versions and sizes, and where the defaults come from."""
    blocks = []
    for name in names or ops_registry.names():
        op = ops_registry.get(name)
        sizes = " ".join(f"{k}={v}" for k, v in op.sizes.items())
        small = " ".join(f"{k}={v}" for k, v in op.sim_sizes.items())
        # a run in the emulator uses the small sizes: say so, or its "sizes B=2 T=8" looks like a mistake
        block = op.describe() + f"\n       sizes: {sizes} (on a GPU; in the emulator {small})"
        if names and op.tolerance_note:   # one op asked for: the reasons too, not just where to find them
            import textwrap

            block += "\n" + textwrap.fill(f"why this tolerance: {op.tolerance_note}", 100,
                                           initial_indent=" " * 7, subsequent_indent=" " * 7)
        blocks.append(block)
    if not names and ops_registry.unregistered():   # a new op's module that registered nothing says why here
        blocks.append("not registered:\n" + "\n".join(f"  {why}" for why in ops_registry.unregistered().values()))
    return "\n\n".join(blocks) + "\n\n* = default version. " + defaults_provenance()


def defaults_provenance() -> str:
    """Where the defaults come from: the GPUs bench/defaults.json names, or llm.c's choices."""
    from . import defaults

    try:
        return defaults.provenance()
    except defaults.DefaultsError as exc:
        return f"The measured defaults cannot be read: {exc}. Every * is llm.c's choice."


def _write_json(path: str, results: list) -> None:
    """The results so far, replacing the file atomically (a reader never sees half a file)."""
    from .fileio import atomic_write

    with atomic_write(path) as f:
        f.write(json.dumps(results, indent=2, default=str).encode())


def _run_one(op_name: str, number: int, sizes: dict, args) -> dict:
    if args.backend:
        _backend.set_backend(args.backend)
    op = ops_registry.get(op_name)
    if not _backend.is_sim():
        return harness.sweep(op, number, sizes, args.block_size, args.seed, repeat=args.repeat)
    from . import sim
    from .sim.launcher import check_bits, check_names

    # --sanitize, else LLMCUPY_SIM_CHECK: the record says which checks ran, so "no findings" means something
    with sim.settings(order=args.order, check=args.sanitize or None):
        checks = check_names(check_bits())
        try:
            result = harness.sweep(op, number, sizes, args.block_size, args.seed, repeat=args.repeat)
        except sim.SimSanitizerError as exc:
            result = {"op": op_name, "version": number, "ok": False, "error": str(exc),
                      "sanitizer": [dict(vars(r), check=r.check) for r in exc.reports]}
    if checks:
        result["sanitizers"] = checks
    return result


def _run_and_analyze(op_name: str, number: int, sizes: dict, args) -> dict:
    """``_run_one``, then with ``--analyze`` the version's metrics and model (llmcupy.analyze)."""
    result = _run_one(op_name, number, sizes, args)
    if getattr(args, "analyze", False) and result.get("ok") is not None and "error" not in result:
        from . import analyze

        result["analysis"] = analyze.analyze_version(ops_registry.get(op_name), number, sizes, args.block_size,
                                                     args.seed, args.gpu)
    return result


def _print_comparisons(results: list) -> None:
    """--analyze over several versions: each op's versions side by side, and the model's rank
    correlation with GPU times in bench/results when there are any for the same sizes."""
    from . import analyze

    by_op: dict = {}
    for r in results:
        if r.get("analysis"):
            by_op.setdefault(r["op"], []).append(r["analysis"])
    for analyses in by_op.values():
        text = analyze.format_comparison(analyses) if len(analyses) > 1 else ""
        corr = analyze.format_correlation(analyze.correlate(analyses))
        if text or corr:
            print("\n".join(t for t in (text, corr) if t) + "\n")


def isolation(versions: int, backend: str) -> str | None:
    """How a run of several versions isolates each one in a child process, so that one bad kernel
    fails its own line instead of the run: ``fork`` in the emulator (a crash kills only the child;
    ``spawn`` on macOS, see harness.emulator_start), ``spawn`` on a GPU (an illegal address poisons the
    CUDA context for every later launch in that process, and a process forked after CUDA's
    initialisation cannot use CUDA). None for one version."""
    if versions <= 1:
        return None
    return "spawn" if backend == "cuda" else harness.emulator_start()


def main(argv=None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:   # before or after the versions' loop (which says what it kept)
        print("\ninterrupted", file=sys.stderr)
        return 130


def _main(argv=None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    rest, size_flags = _split_size_flags(parser, argv)
    args = parser.parse_args(rest)
    if args.arch:
        # --arch is greedy: in `--compile-report --arch 86 softmax_forward` the op follows the archs
        archs, moved = [], []
        for token in args.arch:
            if moved or (token in ops_registry.names() and args.op is None):
                moved.append(token)
                continue
            try:
                archs.append(_arch(token))
            except argparse.ArgumentTypeError as exc:
                parser.error(f"argument --arch: {exc}")
        if moved:
            if len(moved) > 2 or args.version is not None:
                parser.error(f"unrecognized arguments: {' '.join(moved[2:] or [args.version])}")
            args.op, args.version = moved[0], (moved[1] if len(moved) > 1 else None)
        args.arch = archs
    try:
        if args.json:
            from ._cli import check_output_file

            check_output_file(args.json, "--json")   # before the run, not after its first version
        if args.backend:
            _backend.set_backend(args.backend)
        if args.compile_report:
            if size_flags:
                raise OpError(f"--compile-report takes no sizes (got {size_flags[0][0]}): it compiles, it does "
                              "not run")
            from . import nvrtc

            files = None
            if args.op:
                files = [ops_registry.get(args.op).source]
            if args.version is not None:
                raise OpError(f"--compile-report compiles {args.op}'s whole kernel file, every version; give the op "
                              f"without a version (got {args.version})")
            try:
                if args.arch:
                    nvrtc.check_archs(args.arch)   # sm_99: exit 2 with the choices, not a failed compile
                rows = nvrtc.compile_report(files=files, archs=tuple(args.arch or nvrtc.DEFAULT_ARCHS))
            except (nvrtc.NvrtcNotFound, ValueError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            print(nvrtc.format_report(rows))
            if args.json:   # one row per file, architecture and kernel (registers, spills, shared memory);
                # NVRTC's whole log is repeated in every row of a file: kept only where it says what failed
                _write_json(args.json, [{k: v for k, v in r.items() if k != "log" or not r["ok"]} for r in rows])
            return 0 if all(r["ok"] for r in rows) else 1
        if args.sanitize is not None:
            from .sim.launcher import parse_check

            if not args.sanitize.replace(",", "").strip():
                # an empty value ran no check without a word (`--sanitize "$CHECKS"` with CHECKS unset)
                raise OpError("--sanitize '' names no check: write --sanitize alone for all three, or a subset "
                              "of race,memory,init; --sanitize none runs without them")
            parse_check(args.sanitize, "--sanitize")  # a misspelt check: exit 2 before anything runs
            if _backend.get_backend() != "sim":
                raise OpError("--sanitize runs in the emulator only (add --backend sim); on a GPU use "
                              "compute-sanitizer")
        if args.order and not args.compile_report and _backend.get_backend() != "sim":
            # a GPU schedules threads itself: the order would be ignored without a word
            raise OpError(f"--order {args.order} sets the emulator's thread order (add --backend sim); a GPU "
                          "schedules its threads itself")
        if args.list:
            if args.json:
                raise OpError("--json records what a run or --compile-report finds; --list runs nothing")
            if args.version is not None or size_flags or args.all:
                extra = args.version if args.version is not None else "--all" if args.all else size_flags[0][0]
                raise OpError(f"--list lists versions, it runs nothing (got {extra}); give --list alone or --list OP")
            print(list_catalogue([ops_registry.get(args.op).name] if args.op else None))
            return 0
        for flag, given in (("--gpu", args.gpu), ("--no-lines", args.no_lines)):
            if given and not args.analyze:
                raise OpError(f"{flag} is for --analyze (the memory-traffic model); add --analyze")
        if args.analyze:
            from . import analyze

            analyze.gpu(args.gpu)  # an unknown GPU: exit 2 with the choices
            if not _backend.is_sim():
                raise OpError("--analyze counts memory traffic in the emulator: add --backend sim "
                              "(the model then predicts the time on --gpu)")
        if not args.op and not args.all:
            _parser().print_usage(sys.stderr)
            # the ops, as an unknown op lists them: a learner's first command needs a name to try
            print(f"give an op and a version, --all, or --list; ops: {', '.join(ops_registry.names())}",
                  file=sys.stderr)
            return 2
        if args.arch and not args.compile_report:
            archs = " ".join(f"sm_{a}" for a in args.arch)
            raise OpError("--arch is for --compile-report (the NVRTC compile check of an op's whole file, every "
                          f"version): python -m llmcupy.kernel --compile-report {args.op or ''} --arch {archs}"
                          .replace("  ", " "))
        if args.op:
            op = ops_registry.get(args.op)
            sizes = _parse_sizes(op, size_flags)
            if args.version is not None and args.all:
                raise OpError(f"give a version of {op.name} or --all, not both (got {args.version} and --all)")
            if args.version is not None:
                version = op.version(args.version)  # unknown version: exit 2 with the choices
                if args.block_size is not None:
                    harness.block_sizes_for(version, args.block_size)  # not in the sweep: exit 2
                plan = [(op.name, int(args.version), sizes)]
            elif args.all:
                plan = [(op.name, n, sizes) for n in sorted(op.versions)]
            else:
                raise OpError(f"give a version of {op.name} (one of {', '.join(map(str, sorted(op.versions)))}) or --all")
        else:
            sizes_of_op = _catalogue_sizes(size_flags)
            plan = [(n, v, sizes_of_op[n]) for n in ops_registry.names() for v in sorted(ops_registry.get(n).versions)]
        if args.block_size is not None and len(plan) > 1:
            # versions without it are skipped; a block size no version offers is a typo
            offered = {bs for name, n, _ in plan for bs in ops_registry.get(name).versions[n].block_sizes}
            if args.block_size not in offered:
                raise OpError(f"--block-size {args.block_size} is in no version's sweep; they offer "
                              f"{', '.join(map(str, sorted(offered)))}")
        backend = _backend.get_backend()  # cuda asked for (LLMCUPY_BACKEND) but unusable: exit 2
        if backend == "sim":
            from .sim.launcher import check_environment

            check_environment()   # a bad LLMCUPY_SIM_* / LLMCUPY_CACHE_DIR: one line now, not per version
    except (OpError, _backend.BackendError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    isolate = isolation(len(plan), backend)
    results = []
    if args.json:
        # what `bench compare` and --list-results show of a kept run (the file stays a list of sweeps)
        import shlex

        from .bench import _utc_now, git_commit

        args.provenance = {"date": _utc_now().isoformat().replace("+00:00", "Z"),
                           "command": "python -m llmcupy.kernel" + ("" if not argv else " " + shlex.join(argv)),
                           "git": git_commit()}
    run = _run_and_analyze if args.analyze else _run_one
    # a forked child per version in the emulator; on a GPU one spawned child until a version fails
    versions = harness.runner(isolate)
    try:
        failed = _run_plan(plan, versions, run, args, results)
    except KeyboardInterrupt:
        versions.close()
        if args.json and results:   # the interrupt may have come between a version's end and its write
            _write_json(args.json, results)
        kept = f"; {args.json} holds the versions that finished" if args.json and results else ""
        print(f"\ninterrupted after {len(results)} of {len(plan)} versions{kept}", file=sys.stderr)
        return 130
    if failed is None:   # nothing can run here (no compiler): said in one line
        return 2
    versions.close()
    if args.analyze:
        _print_comparisons(results)
    if len(plan) > 1:
        passed = sum(r.get("ok") is True for r in results)
        skipped = sum(r.get("ok") is None for r in results)
        print(f"{passed} passed, {failed} failed, {skipped} skipped")
    if len(plan) == 1 and results[0].get("ok") is None:
        # one version asked for and it could not run (unavailable here, or the sizes refused):
        # not a pass, as a script reading the exit status would take 0 for
        print(f"error: {results[0]['op']} version {results[0]['version']} did not run: "
              f"{results[0].get('skipped', 'skipped')}", file=sys.stderr)
        return 2
    return 1 if failed else 0


def _nvrtc_compile_errors() -> tuple:
    """CuPy's CompileException (NVRTC refusing a kernel file on a GPU), when CuPy has loaded its compiler:
    only then can one have been raised, and importing CuPy just to name it would slow emulator runs."""
    compiler = sys.modules.get("cupy.cuda.compiler")
    return (compiler.CompileException,) if compiler is not None else ()


def _run_plan(plan: list, versions, run, args, results: list) -> int | None:
    """Runs each (op, version, sizes) of ``plan`` through ``versions`` (a harness runner), printing
    each result and appending it to ``results`` (and --json) as it comes; returns the number that
    failed, or None when a single version cannot run here at all (no C++ compiler)."""
    from .sim.compiler import CompilerNotFound, SimCompileError
    from .sim.launcher import SimLaunchError

    failed = 0
    for op_name, number, sizes in plan:
        try:
            result = versions.call(run, op_name, number, sizes, args)
        except CompilerNotFound as exc:
            if len(plan) == 1:   # nothing can run here: one line, exit 2 (with --all: each version FAILs)
                print(f"error: {exc}", file=sys.stderr)
                return None
            result = {"op": op_name, "version": number, "ok": False, "error": str(exc)}
        except (OpError, _backend.BackendError, SimCompileError, *_nvrtc_compile_errors()) as exc:
            # g++'s or NVRTC's diagnostics are the message (a kernel being written): the line --all
            # prints, no traceback
            result = {"op": op_name, "version": number, "ok": False, "error": str(exc)}
        except SimLaunchError as exc:
            # the emulator stopped a launch (a fault, a failed device assert, the watchdog): the line a
            # child of --all reports, not a traceback
            result = {"op": op_name, "version": number, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if "signal" in result:   # the runner could not name the version in its --sanitize command
            result = {**result, **harness.died_by_signal(result["signal"], _backend.is_sim(), op_name, number)}
        if "error" in result:
            result.setdefault("op", op_name)
            result.setdefault("version", number)
            print(f"{op_name} version {number}: ERROR {result['error']}")
            if result["error"].startswith("SimMemoryFaultError") and args.sanitize is None:
                # a plain launch says where the access went, not which line made it
                print(f"  python -m llmcupy.kernel {op_name} {number} --sanitize names the line")
            print("FAIL")
        else:
            print(harness.format_sweep(result))
            if result.get("ok") is False and not result.get("sanitizers") and _backend.is_sim():
                # a wrong result that no check explains: in a new version, most often a missing barrier
                # or an index outside an array that a plain run's fences miss (in an allocation over
                # 4 MiB, or a read just outside an array, which gives the slack's canary bytes)
                print(f"  a race or an out-of-bounds access? python -m llmcupy.kernel {op_name} {number} --sanitize "
                      "names the line")
            if result.get("sanitizers") and result.get("ok") is not None:
                print(f"  sanitizers: {', '.join(result['sanitizers'])}: no findings")
            if result.get("analysis"):
                from . import analyze

                print(analyze.format_analysis(result["analysis"], lines=not args.no_lines))
        print(flush=True)
        results.append({**result, **getattr(args, "provenance", {})})
        failed += result.get("ok") is False
        if args.json:  # after every version: a run stopped by a time limit keeps what it measured
            _write_json(args.json, results)
    return failed


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
