"""Why one kernel version is faster than another, without a GPU: memory-traffic metrics from the
emulator, occupancy from NVRTC's register report, and a roofline *model* of the time on a named GPU.

    python -m llmcupy.kernel softmax_forward --all --analyze          # every version, H100 SXM model
    python -m llmcupy.kernel softmax_forward 1 --analyze --gpu a100-sxm

``analyze_version(op, number)`` runs one version once in the emulator's instrumented build
(``sim.metrics.collect``) at one block size and returns, per launch and per source line:

* global memory: warp-level **requests** (the k-th execution of one load/store by each lane of a
  warp between two sync points), **32-byte sectors per request** (4 for a warp reading 32
  consecutive floats, 32 when every lane hits its own sector), **bytes requested** (what the lanes
  asked for) against **bytes moved** (sectors x 32);
* the launch's **unique bytes** read and written: a lower bound of DRAM traffic (every cache
  infinite), compared with the op's **ideal bytes** (its stated bytes moved, ``op.bound.bytes``;
  for GEMM-shaped ops every input read once and every output written once);
* shared memory: requests and **bank-conflict ways** (wavefronts per request over the phases an
  access width needs: 32 banks of 4 bytes, the same word read by several lanes is a broadcast).

The model (always printed as "model", never as a measurement) predicts a launch's time on a GPU of
:data:`GPUS` (H100 SXM by default) from those counts::

    t = launch_us + max(t_dram, t_l1, t_smem, t_fp32) / min(1, warps_per_sm / 32)
    t_dram = unique bytes / DRAM bandwidth
    t_l1   = sectors / (4 sectors per clock per SM)          # the L1's tag throughput, SMs in use
    t_smem = shared wavefronts / (1 per clock per SM)        # 32 banks x 4 bytes per clock
    t_fp32 = the op's FLOPs (GEMM-shaped ops) / FP32 peak    # shared among its launches by accesses

``warps_per_sm`` is what the SM can hold (theoretical occupancy, from the block size, NVRTC's
registers and static shared memory for the GPU's architecture, and the dynamic shared memory) but at
most the grid's warps spread over the SMs it reaches: fewer than 32 resident warps per SM are taken
not to hide memory latency, in proportion. ``launch_us`` is a fixed launch cost. What the model does
not capture: caches beyond unique bytes (L1/L2 hit rates, L2 bandwidth), latency chains within a
thread, instruction issue and integer work, tensor cores, clocks under load, DRAM page effects, and
cuBLAS calls an op makes (the emulator runs them in NumPy, outside any kernel).

When this checkout's ``bench/results/`` holds GPU measurements of the same op at the same sizes, :func:`correlate`
gives Spearman's rank correlation between the model and the measured times.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict, dataclass

import numpy as np

from .sim.metrics import KINDS

SATURATING_WARPS = 32   # resident warps per SM taken to hide memory latency fully (half of 64 slots)
L1_SECTORS_PER_CLOCK = 4
SMEM_WAVEFRONTS_PER_CLOCK = 1


@dataclass(frozen=True)
class GPU:
    name: str
    arch: int                 # compute capability, for NVRTC's register report
    dram_gbs: float           # DRAM bandwidth, GB/s (datasheet)
    fp32_tflops: float        # FP32 peak (non-tensor), TFLOP/s (datasheet, boost clock)
    sms: int
    clock_ghz: float          # boost clock: fp32_tflops = sms x FP32 lanes x 2 x clock
    smem_per_sm: int          # shared memory an SM can give its blocks, bytes
    smem_reserved: int        # per block, reserved by the driver (sm_80+: 1 KiB)
    regs_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    launch_us: float = 2.0    # a kernel launch's fixed cost on the GPU timeline (an assumption)


# Datasheet figures (boost clocks); the default is the one the issue names.
GPUS = {
    "h100-sxm": GPU("H100 SXM", 90, 3350, 67.0, 132, 1.98, 228 * 1024, 1024, 65536, 2048, 32),
    "h200": GPU("H200 SXM", 90, 4800, 67.0, 132, 1.98, 228 * 1024, 1024, 65536, 2048, 32),
    "h100-pcie": GPU("H100 PCIe", 90, 2000, 51.2, 114, 1.755, 228 * 1024, 1024, 65536, 2048, 32),
    "a100-sxm": GPU("A100 SXM 80GB", 80, 2039, 19.5, 108, 1.41, 164 * 1024, 1024, 65536, 2048, 32),
    "rtx-4090": GPU("RTX 4090", 89, 1008, 82.6, 128, 2.52, 100 * 1024, 1024, 65536, 1536, 24),
    "t4": GPU("T4", 75, 320, 8.1, 40, 1.59, 64 * 1024, 0, 65536, 1024, 16),
}
DEFAULT_GPU = "h100-sxm"


def gpu(name: str | None) -> GPU:
    key = (name or DEFAULT_GPU).lower()
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r} for the model; choose one of {', '.join(GPUS)}")
    return GPUS[key]


# ----------------------------------------------------------------------------------------------
# occupancy


def occupancy(g: GPU, threads: int, registers: int | None, static_smem: int, dynamic_smem: int) -> dict:
    """Theoretical occupancy of one block shape on ``g``: resident blocks and warps per SM and what
    limits them (threads, blocks, registers, shared memory). ``registers`` None: not limited by them
    (no NVRTC report)."""
    warps = -(-threads // 32)
    limits = {"threads": g.max_threads_per_sm // (warps * 32), "blocks": g.max_blocks_per_sm}
    if registers:
        from .runtime.module import registers_per_warp

        limits["registers"] = (g.regs_per_sm // registers_per_warp(registers)) // warps
    smem = static_smem + dynamic_smem
    if smem:
        limits["shared memory"] = g.smem_per_sm // (smem + g.smem_reserved)
    blocks = min(limits.values())
    limiter = min(limits, key=lambda k: limits[k])
    max_warps = g.max_threads_per_sm // 32
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps, "occupancy": blocks * warps / max_warps,
            "limited_by": limiter, "registers": registers, "static_smem": static_smem, "dynamic_smem": dynamic_smem}


_RESOURCES: dict = {}


def _resource_cache_path(source: str, arch: int):
    """Where NVRTC's report for the kernel file ``source`` and ``arch`` is kept across processes (``--all`` runs
    each version in a child, and an NVRTC compile takes seconds): keyed by the file, the headers
    beside it and the NVRTC library."""
    import hashlib

    from . import nvrtc
    from .runtime.module import kernels_dir
    from .sim.compiler import cache_dir

    d = kernels_dir()
    digest = hashlib.sha256(f"{arch}\0{nvrtc.find_nvrtc().path}\0".encode())
    for path in [d / source] + sorted(d.glob("*.cuh")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return cache_dir().parent / "nvrtc" / f"{source.rsplit('.', 1)[0]}-sm{arch}-{digest.hexdigest()[:20]}.json"


def kernel_resources(source: str, arch: int) -> tuple[dict, str | None]:
    """``({kernel name: nvrtc.KernelStats}, None)`` for the kernel file ``source`` (e.g.
    ``"softmax_forward.cu"``) compiled for ``sm_<arch>``, or ``({}, reason)`` when NVRTC is not
    installed or the file does not compile for that arch."""
    key = (source, arch)
    if key in _RESOURCES:
        return _RESOURCES[key]
    from . import nvrtc
    from .runtime.module import kernels_dir

    try:
        cached = _resource_cache_path(source, arch)
    except nvrtc.NvrtcNotFound as exc:
        _RESOURCES[key] = ({}, f"no NVRTC ({exc})")
        return _RESOURCES[key]
    try:
        data = json.loads(cached.read_text())
        _RESOURCES[key] = ({k["kernel"]: nvrtc.KernelStats(**k) for k in data["kernels"]}, data["reason"])
        return _RESOURCES[key]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    res = nvrtc.compile_file(kernels_dir() / source, arch)
    if res.ok:
        found = ({k.kernel: k for k in res.kernels}, None)
    else:
        first = next((l for l in res.log.splitlines() if l.strip()), "failed")
        found = ({}, f"NVRTC cannot compile {source} for sm_{arch}: {first.strip()}")
    _RESOURCES[key] = found
    try:  # written whole under a temporary name, then renamed: a concurrent reader sees all or nothing
        from .fileio import atomic_write

        with atomic_write(cached) as f:
            f.write(json.dumps({"kernels": [asdict(k) for k in found[0].values()], "reason": found[1]}).encode())
    except OSError:
        pass
    return found


def _resources_for(table: dict, kernel: str):
    if kernel in table:
        return table[kernel]
    base = kernel.split("<", 1)[0]  # a template instance: NVRTC reports it as name<...>
    for name, stats in table.items():
        if name.split("<", 1)[0] == base:
            return stats
    return None


# ----------------------------------------------------------------------------------------------
# aggregation


_FIELDS = ("requests", "lane_accesses", "bytes", "sectors", "wavefronts", "ideal_wavefronts")


def _empty() -> dict:
    return {k: 0 for k in _FIELDS} | {"width": 0}


def _add(into: dict, row: dict) -> None:
    for k in _FIELDS:
        into[k] += row[k]
    into["width"] = max(into["width"], row.get("width", 0))


def by_kind(sites: list) -> dict:
    """Site rows summed per kind (``global load`` ...), only the kinds present."""
    out: dict = {}
    for s in sites:
        _add(out.setdefault(s["kind"], _empty()), s)
    return {k: out[k] for k in KINDS if k in out}


def by_line(sites: list) -> list:
    """Site rows summed per (source line, kind), in source order."""
    out: dict = {}
    for s in sites:
        _add(out.setdefault((s["line"], s["kind"]), _empty()), s)

    def order(key):
        file, _, line = key[0].rpartition(":")
        return (file, int(line) if line.isdigit() else 0, KINDS.index(key[1]))

    return [{"line": k[0], "kind": k[1], **out[k]} for k in sorted(out, key=order)]


def ratios(row: dict) -> dict:
    """Derived figures of a summed row: sectors per request, bytes moved, efficiency, conflict ways."""
    out = {}
    req = row["requests"]
    if row["sectors"]:
        out["sectors_per_request"] = row["sectors"] / req if req else 0.0
        out["bytes_moved"] = 32 * row["sectors"]
        out["efficiency"] = row["bytes"] / out["bytes_moved"]
    if row["ideal_wavefronts"]:
        out["wavefronts_per_request"] = row["wavefronts"] / req if req else 0.0
        out["conflict_ways"] = row["wavefronts"] / row["ideal_wavefronts"]
    return out


# ----------------------------------------------------------------------------------------------
# the model


def model_launch(g: GPU, launch: dict, occ: dict | None, flops: float = 0.0) -> dict:
    """The roofline model of one launch on ``g`` (see the module docstring). Seconds."""
    kinds = by_kind(launch["sites"])
    sectors = sum(v["sectors"] for k, v in kinds.items() if k.startswith("global"))
    wavefronts = sum(v["wavefronts"] for k, v in kinds.items() if k.startswith("shared"))
    unique = launch["totals"]["unique_read_bytes"] + launch["totals"]["unique_written_bytes"]
    threads = int(np.prod(launch["block"]))
    warps_per_block = -(-threads // 32)
    blocks = int(np.prod(launch["grid"]))
    sms = max(1, min(g.sms, blocks))
    grid_warps_per_sm = -(-blocks // sms) * warps_per_block
    resident = grid_warps_per_sm if occ is None else min(occ["warps_per_sm"], grid_warps_per_sm)
    parallel = min(1.0, resident / SATURATING_WARPS) if resident else 0.0
    terms = {
        "dram": unique / (g.dram_gbs * 1e9),
        "l1": sectors / (sms * L1_SECTORS_PER_CLOCK * g.clock_ghz * 1e9),
        "shared": wavefronts / (sms * SMEM_WAVEFRONTS_PER_CLOCK * g.clock_ghz * 1e9),
        "fp32": flops / (g.fp32_tflops * 1e12),
    }
    bound = max(terms, key=lambda k: terms[k])
    if occ is not None and occ["blocks_per_sm"] == 0:
        return {"terms": terms, "bound": bound, "parallelism": 0.0, "seconds": None,
                "note": f"cannot launch on {g.name}: {occ['limited_by']} allow no block per SM"}
    seconds = g.launch_us * 1e-6 + terms[bound] / max(parallel, 1e-9)
    return {"terms": terms, "bound": bound, "parallelism": parallel, "resident_warps_per_sm": resident,
            "seconds": seconds}


# ----------------------------------------------------------------------------------------------
# running a version


def analysis_block_sizes(version, pinned: int | None = None) -> list:
    """The block sizes to analyse at, in order of preference: ``pinned``, else the version's sweep
    nearest 256 first (the smaller of two equally near); ``[None]`` for a fixed launch shape."""
    sizes = tuple(version.block_sizes)
    if pinned is not None or not sizes:
        return [pinned]
    return sorted(sizes, key=lambda b: (abs(np.log2(b / 256)), b))


def ideal_bytes(op, inputs: dict, outputs: dict, sizes: dict) -> tuple[int, str]:
    """The op's ideal bytes moved and where the figure comes from."""
    if op.bound is not None and op.bound.kind == "memory" and op.bound.bytes is not None:
        return int(op.bound.bytes(sizes)), "the op's bytes moved (its GB/s figure)"
    seen, total = set(), 0
    for a in list(inputs.values()) + list(outputs.values()):
        if hasattr(a, "nbytes") and id(a) not in seen:
            seen.add(id(a))
            total += int(a.nbytes)
    return total, "inputs read once + outputs written once"


def analyze_version(op, number: int, sizes: dict | None = None, block_size: int | None = None, seed: int = 0,
                    gpu_name: str | None = None, inputs: dict | None = None) -> dict:
    """Runs version ``number`` of ``op`` (an Op or its name) once with metrics on (emulator) and models
    it on a GPU."""
    if isinstance(op, str):
        from . import ops as ops_registry

        op = ops_registry.get(op)   # an unknown name: the OpError listing the ops
    from .harness import _copy_to_backend, _default_sizes
    from .runtime import backend as _backend
    from .sim import metrics

    if not _backend.is_sim():
        raise RuntimeError("the metrics come from the emulator: run with --backend sim")
    g = gpu(gpu_name)
    version = op.version(number)
    merged = _default_sizes(op)
    merged.update({k: v for k, v in (sizes or {}).items() if v is not None})
    if inputs is None:
        inputs = op.make_inputs(np.random.default_rng(seed), **merged)
    # the preferred block size the version's constraints accept at these sizes
    problem, bs = None, None
    for bs in analysis_block_sizes(version, block_size):
        problem = version.requires(inputs, bs) if version.requires is not None else None
        if not problem:
            break
    out = {"op": op.name, "version": number, "block_size": bs, "sizes": {k: int(v) for k, v in merged.items()},
           "gpu": asdict(g) | {"key": next(k for k, v in GPUS.items() if v == g)}}
    if problem:
        out["skipped"] = problem
        return out
    arrays = _copy_to_backend(inputs)
    from .runtime import blas

    with metrics.collect() as launches:
        # cuBLAS calls run in NumPy here: no launch to count or model, so the version's total is partial
        with blas.recorded_gemms() as gemms:
            got = op.run(number, arrays, bs)
        library_calls = len(gemms)
    out["library_calls"] = library_calls
    op_sizes = op.sizes_of(arrays) if op.sizes_of else {}
    out["ideal_bytes"], out["ideal_source"] = ideal_bytes(op, arrays, got, op_sizes)
    flops = float(op.bound.flops(op_sizes)) if op.bound is not None and op.bound.kind == "flops" else 0.0
    from .runtime.module import kernels_dir

    notes = []
    accesses = [sum(s["lane_accesses"] for s in l["sites"]) for l in launches]
    total_accesses = sum(accesses) or 1
    rows = []
    for launch, n in zip(launches, accesses):
        # a version may launch kernels of another file (attention's permutes live in permute.cu)
        source = launch.get("file")
        if not source or not (kernels_dir() / source).is_file():
            source = op.source
        table, reason = kernel_resources(source, g.arch)
        if reason and reason not in notes:
            notes.append(reason)
        stats = _resources_for(table, launch["kernel"])
        threads = int(np.prod(launch["block"]))
        occ = occupancy(g, threads, stats.registers if stats else None, stats.shared_bytes if stats else 0,
                        launch["shared_mem"]) if (stats or not table) else None
        model = model_launch(g, launch, occ, flops * n / total_accesses)
        rows.append({**launch, "occupancy": occ, "model": model, "kinds": by_kind(launch["sites"]),
                     "lines": by_line(launch["sites"])})
    if notes:
        out["resources_note"] = "; ".join(notes)
    out["launches"] = rows
    out["summary"] = summarize(out)
    return out


def summarize(result: dict) -> dict:
    """The op-level figures of an analysis: totals over its launches, ratios, the model's time."""
    all_sites = [s for l in result["launches"] for s in l["sites"]]
    kinds = by_kind(all_sites)
    glob_rows = [v for k, v in kinds.items() if k.startswith("global")]
    g = _empty()
    for v in glob_rows:
        _add(g, v)
    sh = _empty()
    for k, v in kinds.items():
        if k.startswith("shared"):
            _add(sh, v)
    unique = sum(l["totals"]["unique_read_bytes"] + l["totals"]["unique_written_bytes"] for l in result["launches"])
    times = [l["model"]["seconds"] for l in result["launches"]]
    occs = [l["occupancy"]["occupancy"] for l in result["launches"] if l.get("occupancy")]
    ideal = result.get("ideal_bytes") or 0
    s = {"launches": len(result["launches"]), "global_requests": g["requests"],
         "sectors_per_request": g["sectors"] / g["requests"] if g["requests"] else None,
         "bytes_requested": g["bytes"], "bytes_moved": 32 * g["sectors"], "unique_bytes": unique,
         "ideal_bytes": ideal,
         "moved_over_ideal": 32 * g["sectors"] / ideal if ideal else None,
         "unique_over_ideal": unique / ideal if ideal else None,
         "shared_requests": sh["requests"],
         "conflict_ways": sh["wavefronts"] / sh["ideal_wavefronts"] if sh["ideal_wavefronts"] else None,
         "occupancy": min(occs) if occs else None,
         "model_seconds": sum(times) if times and all(t is not None for t in times) else None,
         # cuBLAS calls are not modelled: model_seconds then covers the version's own kernels only
         "library_calls": result.get("library_calls", 0)}
    if not result["launches"]:
        s["moved_over_ideal"] = s["unique_over_ideal"] = None
    return s


# ----------------------------------------------------------------------------------------------
# text


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def _us(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.3g} us"


def _table(header: list, rows: list, indent: str = "    ") -> list:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for n, r in enumerate(cells):
        lines.append(indent + "  ".join(c.ljust(widths[i]) if i == 0 or (n == 0) else c.rjust(widths[i])
                                        for i, c in enumerate(r)).rstrip())
    return lines


def _metric_rows(rows: list, label) -> list:
    out = []
    for r in rows:
        d = ratios(r)
        shared = r["kind"].startswith("shared") if "kind" in r else False
        out.append([label(r), r["kind"], r["requests"], r["width"],
                    "-" if shared else f"{d.get('sectors_per_request', 0):.2f}",
                    _bytes(r["bytes"]), "-" if shared else _bytes(d.get("bytes_moved", 0)),
                    "-" if shared else f"{100 * d.get('efficiency', 0):.0f}%",
                    f"{d['conflict_ways']:.2f}" if shared and "conflict_ways" in d else "-"])
    return out


_HEADER = ["", "kind", "requests", "B/lane", "sectors/req", "requested", "moved", "efficiency", "bank ways"]


def format_analysis(result: dict, lines: bool = True) -> str:
    """The metrics table of one analysed version: per launch, then per source line, then the model."""
    g = result["gpu"]
    bs = "-" if result.get("block_size") is None else result["block_size"]
    head = f"  metrics (emulator, block size {bs}, sizes {' '.join(f'{k}={v}' for k, v in result['sizes'].items())})"
    if result.get("skipped"):
        return head + f": skipped ({result['skipped']})"
    out = [head + ":"]
    for i, l in enumerate(result["launches"]):
        t = l["totals"]
        out.append(f"  launch {i + 1}: {l['kernel']} grid {tuple(l['grid'])} block {tuple(l['block'])}"
                   + (f" dynamic smem {l['shared_mem']} B" if l["shared_mem"] else ""))
        rows = [dict(v, kind=k) for k, v in l["kinds"].items()]
        if rows:
            out += _table(_HEADER, _metric_rows(rows, lambda r: "total"))
        out.append(f"    unique bytes {_bytes(t['unique_read_bytes'] + t['unique_written_bytes'])} "
                   f"(read {_bytes(t['unique_read_bytes'])}, written {_bytes(t['unique_written_bytes'])})")
        if lines and l["lines"]:
            out.append("    per source line:")
            out += _table(["line"] + _HEADER[1:], _metric_rows(l["lines"], lambda r: r["line"]), indent="      ")
        occ, m = l.get("occupancy"), l["model"]
        occ_text = "occupancy unknown" if occ is None else (
            f"{occ['registers'] if occ['registers'] else '?'} regs, "
            f"{occ['static_smem'] + occ['dynamic_smem']} B smem/block, occupancy {100 * occ['occupancy']:.0f}% "
            f"({occ['blocks_per_sm']} blocks/SM, limited by {occ['limited_by']})")
        if m.get("seconds") is None:
            out.append(f"    model ({g['name']}): {occ_text}; {m.get('note', 'no prediction')}")
        else:
            terms = ", ".join(f"{k} {_us(v)}" for k, v in m["terms"].items() if v)
            out.append(f"    model ({g['name']}, sm_{g['arch']}): {occ_text}; {m['resident_warps_per_sm']} warps/SM "
                       f"resident -> {_us(m['seconds'])} predicted, bound by {m['bound']} ({terms or 'no traffic'})")
    s = result["summary"]
    if not result["launches"]:
        out.append("  no kernel launch: this version calls a library (cuBLAS), which the emulator runs in NumPy")
        return "\n".join(out)
    ideal = result.get("ideal_bytes")
    if ideal:
        out.append(f"  unique bytes {_bytes(s['unique_bytes'])} = {s['unique_over_ideal']:.2f}x ideal, "
                   f"bytes moved in sectors {_bytes(s['bytes_moved'])} = {s['moved_over_ideal']:.2f}x ideal "
                   f"(ideal {_bytes(ideal)}: {result.get('ideal_source')})")
    if result.get("resources_note"):
        out.append(f"  note: registers unknown, occupancy from threads and shared memory only: {result['resources_note']}")
    partial = (f", its own kernels only: + {s['library_calls']} cuBLAS call(s), not modelled"
               if s.get("library_calls") else "")
    out.append(f"  model total on {g['name']}: {_us(s['model_seconds'])} (a roofline model, not a measurement{partial})")
    return "\n".join(out)


def format_comparison(results: list) -> str:
    """One line per analysed version: the figures that explain a ladder's ordering, side by side."""
    rows = []
    for r in results:
        if not r or r.get("skipped") or "summary" not in r:
            continue
        s = r["summary"]
        if not s["launches"]:  # a library call (cuBLAS) only: no kernel of ours to count
            rows.append([f"v{r['version']}", "-", 0] + ["-"] * 7 + ["no kernel launch (library call)"])
            continue
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        rows.append([f"v{r['version']}", "-" if r.get("block_size") is None else r["block_size"], s["launches"],
                     s["global_requests"], f(s["sectors_per_request"], ".2f"), f(s["moved_over_ideal"], ".2f"),
                     f(s["unique_over_ideal"], ".2f"), s["shared_requests"], f(s["conflict_ways"], ".2f"),
                     "-" if s["occupancy"] is None else f"{100 * s['occupancy']:.0f}%",
                     _us(s["model_seconds"]) + (" + cuBLAS, not modelled" if s.get("library_calls") else "")])
    if not rows:
        return ""
    name = results[0]["gpu"]["name"]
    head = ["version", "block", "launches", "gld/gst req", "sectors/req", "moved/ideal", "unique/ideal",
            "smem req", "bank ways", "occupancy", f"model ({name})"]
    return "\n".join([f"{results[0]['op']}: metrics per version (emulator counts; time = roofline model)"]
                     + _table(head, rows, indent="  "))


# ----------------------------------------------------------------------------------------------
# the model against measurements


def spearman(xs, ys) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 pairs or a constant side."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            r[order[i:j + 1]] = (i + j) / 2.0
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def measured_times(op_name: str, sizes: dict, results_dir) -> dict:
    """``{device: {(version, block_size): (ms, file)}}`` from the GPU records under ``results_dir`` for
    ``op_name`` at exactly ``sizes`` (per device, the newest record wins). Emulator records and
    unreadable files are skipped. Kept per device: two GPUs' times do not rank against each other."""
    from .bench import load, record_date

    records = []
    for path in sorted(glob.glob(os.path.join(str(results_dir), "*.json"))):
        try:
            records.append((path, load(path)))
        except (OSError, ValueError, json.JSONDecodeError):
            continue
    found: dict = {}
    # oldest first by the recorded date (file names do not sort by date: catalogue.json), so the newest wins
    for path, record in sorted(records, key=lambda pr: record_date(pr[1])):
        if record.get("backend") != "cuda":
            continue
        device = found.setdefault(record.get("device") or "unknown GPU", {})
        for entry in record.get("results", []):
            if entry.get("op") != op_name or entry.get("sizes") != sizes:
                continue
            for b in entry.get("blocks", []):
                if b.get("ok") and b.get("ms") is not None:
                    device[(int(entry["version"]), b.get("block_size"))] = (float(b["ms"]), path)
    return found


def correlate(results: list, results_dir=None) -> dict | None:
    """Spearman's rank correlation between the model's times of ``results`` (analysed versions of
    one op) and GPU times measured at the same sizes and block sizes under ``results_dir``
    (default: this checkout's ``bench/results``, whatever the working folder) on one GPU: the device with
    the most such versions. None when fewer than three versions have both."""
    from .defaults import results_dir as checkout_results

    # a partial model (cuBLAS calls not modelled) would rank a library-backed version as fast as its bias kernel
    results = [r for r in results if r and r.get("summary") and r["summary"].get("model_seconds")
               and not r["summary"].get("library_calls")]
    if not results:
        return None
    results_dir = results_dir or checkout_results()
    best = None
    for device, measured in measured_times(results[0]["op"], results[0]["sizes"], results_dir).items():
        pairs = []
        for r in results:
            hit = measured.get((r["version"], r.get("block_size")))
            if hit:
                pairs.append((r["version"], r["summary"]["model_seconds"] * 1e3, hit[0], hit[1]))
        if best is None or len(pairs) > len(best[1]):
            best = (device, pairs)
    if best is None:
        return None
    device, pairs = best
    rho = spearman([p[1] for p in pairs], [p[2] for p in pairs])
    if rho is None:
        return None
    return {"rho": rho, "pairs": [{"version": v, "model_ms": m, "measured_ms": t, "file": f} for v, m, t, f in pairs],
            "gpu": results[0]["gpu"]["name"], "device": device}


def format_correlation(c: dict | None) -> str:
    if not c:
        return ""
    devices = sorted({os.path.basename(p["file"]) for p in c["pairs"]})
    return (f"rank correlation, model ({c['gpu']}) vs times measured on {c.get('device', 'a GPU')}: Spearman rho = "
            f"{c['rho']:.2f} over "
            f"{len(c['pairs'])} versions ({', '.join(devices)})")


if __name__ == "__main__":
    # no CLI of its own: `python -m llmcupy.analyze` used to exit 0 having done nothing
    import sys

    print("error: llmcupy.analyze is run through the kernel CLI: python -m llmcupy.kernel OP VERSION --analyze "
          "(or OP --all --analyze; --backend sim), or from Python: llmcupy.analyze.analyze_version(op, version)",
          file=sys.stderr)
    sys.exit(2)
