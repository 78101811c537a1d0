"""Memory-traffic metrics (sim.metrics, the emulator's instrumented build), occupancy, the roofline
model and its rank correlation with measured times (llmcupy.analyze).

The arithmetic is checked on small hand-written kernels whose answers are known from how a GPU
serves a warp's request: 32 consecutive floats span 4 sectors of 32 bytes, 32 floats 128 bytes
apart span 32; a shared-memory read with a stride of 2 words puts two distinct words in each of 16
banks (2 wavefronts), a stride of 32 puts all 32 in one bank, and one word read by every lane is a
broadcast (1 wavefront). Each runs in every thread order: the grouping into requests must not
depend on the order the emulator runs lanes in.
"""

import json
import textwrap

import numpy as np
import pytest

import llmcupy
from llmcupy import analyze, bench
from llmcupy.sim import metrics

from _helpers import stand_in_checkout

ORDERS = ("forward", "reverse", "random")


def _module(code):
    return llmcupy.RawModule(code=textwrap.dedent(code), target="sim")


def _zeros(n):
    """A buffer of n floats. Sectors are counted from each buffer's start, as on a GPU, where
    cudaMalloc aligns every allocation to 256 bytes (NumPy's 16 would add straddled sectors)."""
    return np.zeros(n, np.float32)


def _run(kernel, grid, block, args, order="forward"):
    with llmcupy.sim.settings(order=order, seed=3), metrics.collect() as launches:
        kernel(grid, block, args)
    assert len(launches) == 1
    return launches[0]


def _only(launch, kind):
    rows = [s for s in launch["sites"] if s["kind"] == kind]
    assert len(rows) == 1, launch["sites"]
    return rows[0]


GLOBAL = r"""
__global__ void strided(float* out, const float* in, int stride) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[i * stride];
}
__global__ void vec4(float4* out, const float4* in) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[i];
}
__global__ void loop(float* out, const float* in, int n) {   // each lane loads n times, then stores
    int t = threadIdx.x;
    float s = 0.0f;
    for (int k = 0; k < n; ++k) s += in[k * blockDim.x + t];
    __syncthreads();
    out[t] = s + in[t];                                         // read again: no new unique bytes
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_global_sectors_per_request(order, no_hazards):
    mod = _module(GLOBAL)
    inp = _zeros(64 * 32)
    out = _zeros(64)
    for stride, sectors in ((1, 4), (2, 8), (8, 32), (32, 32)):
        launch = _run(mod.get_function("strided"), (2,), (32,), (out, inp, np.int32(stride)), order)
        load, store = _only(launch, "global load"), _only(launch, "global store")
        assert load["requests"] == 2 and load["lane_accesses"] == 64 and load["bytes"] == 256
        assert load["sectors"] == 2 * sectors, (stride, load)
        assert store["requests"] == 2 and store["sectors"] == 8  # the stores stay consecutive
        assert analyze.ratios(load)["sectors_per_request"] == sectors
        assert launch["totals"]["unique_read_bytes"] == 64 * 4 and launch["totals"]["unique_written_bytes"] == 64 * 4
        assert load["line"].endswith(":4") and store["line"].endswith(":4")
    # an unaligned start straddles one more sector per request
    launch = _run(mod.get_function("strided"), (2,), (32,), (out, inp[1:], np.int32(1)), order)
    assert _only(launch, "global load")["sectors"] == 2 * 5


@pytest.mark.parametrize("order", ORDERS)
def test_vector_loads_move_16_sectors_per_request_at_full_efficiency(order, no_hazards):
    mod = _module(GLOBAL)
    inp, out = _zeros(4 * 64), _zeros(4 * 64)
    launch = _run(mod.get_function("vec4"), (2,), (32,), (out, inp), order)
    load = _only(launch, "global load")
    assert load["width"] == 16 and load["requests"] == 2 and load["sectors"] == 32
    r = analyze.ratios(load)
    assert r["sectors_per_request"] == 16 and r["efficiency"] == 1.0 and r["bytes_moved"] == 1024


PAIRS = r"""
__global__ void pair(float* out, const float* in) {
    int t = threadIdx.x;
    float2 v = reinterpret_cast<const float2*>(in)[t];   // one 8-byte access (g++: two moves)
    float a = in[2 * t];                                 // two statements: two accesses on a GPU too
    float b = in[2 * t + 1];
    out[t] = v.x + v.y + a + b;
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_a_vector_copy_is_one_access_two_statements_are_two(order, no_hazards):
    mod = _module(PAIRS)
    inp, out = _zeros(64), _zeros(32)
    launch = _run(mod.get_function("pair"), (1,), (32,), (out, inp), order)
    rows = {s["line"].rsplit(":", 1)[1]: s for s in launch["sites"] if s["kind"] == "global load"}
    assert sorted(rows) == ["4", "5", "6"], launch["sites"]
    assert (rows["4"]["width"], rows["4"]["requests"], rows["4"]["sectors"]) == (8, 1, 8)
    for line in ("5", "6"):
        assert (rows[line]["width"], rows[line]["requests"], rows[line]["sectors"]) == (4, 1, 8)


@pytest.mark.parametrize("order", ORDERS)
def test_a_request_is_the_kth_execution_per_warp_between_sync_points(order, no_hazards):
    mod = _module(GLOBAL)
    inp = _zeros(5 * 64)
    out = _zeros(64)
    launch = _run(mod.get_function("loop"), (1,), (64,), (out, inp, np.int32(5)), order)
    rows = [s for s in launch["sites"] if s["kind"] == "global load"]
    loop_row = next(s for s in rows if s["line"].endswith(":13"))
    again = next(s for s in rows if s["line"].endswith(":15"))
    # 2 warps x 5 iterations, each a 128-byte aligned row: 4 sectors
    assert loop_row["requests"] == 10 and loop_row["lane_accesses"] == 320 and loop_row["sectors"] == 40
    assert again["requests"] == 2 and again["sectors"] == 8
    # the second read of in[t] and the reads of bytes this launch wrote add no unique bytes
    assert launch["totals"]["unique_read_bytes"] == 5 * 64 * 4
    assert launch["totals"]["unique_written_bytes"] == 64 * 4


SHARED = r"""
__global__ void bank(float* out, int stride) {
    __shared__ float buf[32 * 32];
    int t = threadIdx.x;
    for (int j = t; j < 32 * 32; j += 32) buf[j] = (float)j;
    __syncthreads();
    out[t] = buf[(t * stride) % (32 * 32)];
}
__global__ void bank2(float2* out, int stride) {
    __shared__ float2 buf[32 * 32];
    int t = threadIdx.x;
    for (int j = t; j < 32 * 32; j += 32) buf[j] = make_float2((float)j, 0.0f);
    __syncthreads();
    out[t] = buf[(t * stride) % (32 * 32)];
}
"""


@pytest.mark.parametrize("order", ORDERS)
def test_shared_memory_bank_conflict_ways(order, no_hazards):
    mod = _module(SHARED)
    out = _zeros(32)
    for stride, ways in ((1, 1), (2, 2), (4, 4), (32, 32), (33, 1), (0, 1)):  # 0: every lane reads one word
        launch = _run(mod.get_function("bank"), (1,), (32,), (out, np.int32(stride)), order)
        load = _only(launch, "shared load")
        assert load["requests"] == 1 and load["ideal_wavefronts"] == 1, load
        assert load["wavefronts"] == ways, (stride, load)
        assert analyze.ratios(load)["conflict_ways"] == ways
        store = _only(launch, "shared store")  # 32 iterations of 32 consecutive floats
        assert store["requests"] == 32 and store["wavefronts"] == 32 and store["ideal_wavefronts"] == 32
        assert analyze.by_kind(launch["sites"])["shared load"]["requests"] == 1


@pytest.mark.parametrize("order", ORDERS)
def test_eight_byte_shared_accesses_are_served_per_half_warp(order, no_hazards):
    mod = _module(SHARED)
    out = _zeros(64)
    # consecutive float2: each half-warp covers the 32 banks once -> 2 wavefronts, no conflict
    load = _only(_run(mod.get_function("bank2"), (1,), (32,), (out, np.int32(1)), order), "shared load")
    assert (load["width"], load["wavefronts"], load["ideal_wavefronts"]) == (8, 2, 2)
    # a stride of 2 float2 (16 bytes): each half-warp needs its banks twice
    load = _only(_run(mod.get_function("bank2"), (1,), (32,), (out, np.int32(2)), order), "shared load")
    assert (load["wavefronts"], load["ideal_wavefronts"]) == (4, 2)


def test_metrics_alongside_the_sanitizers(no_hazards):
    """Both observers on one instrumented launch: the sanitizers stay quiet on a clean kernel and the
    counts are the same as with the metrics alone (the observers never see each other's work)."""
    mod = _module(SHARED)
    out = _zeros(32)
    alone = _run(mod.get_function("bank"), (1,), (32,), (out, np.int32(2)))
    with llmcupy.sim.settings(check="race,memory,init"):
        both = _run(mod.get_function("bank"), (1,), (32,), (out, np.int32(2)))
    assert both["sites"] == alone["sites"] and both["totals"] == alone["totals"]


def test_launches_outside_collect_are_not_instrumented():
    mod = _module(GLOBAL)
    inp, out = _zeros(64), _zeros(64)
    with metrics.collect() as launches:
        pass
    mod.get_function("strided")((2,), (32,), (out, inp, np.int32(1)))
    assert launches == [] and not metrics.enabled()


# ----------------------------------------------------------------------------------------------
# the catalogue: the numbers explain a ladder's ordering


def test_softmax_thread_per_row_vs_block_per_row(no_hazards):
    op = llmcupy.ops["softmax_forward"]
    sizes = {"B": 2, "T": 16, "V": 517}  # 32 rows: version 1's warp is full
    inputs = op.make_inputs(np.random.default_rng(0), **sizes)
    got = {v: analyze.analyze_version(op, v, sizes, inputs=inputs) for v in (1, 4, 7)}
    s1, s4, s7 = (got[v]["summary"] for v in (1, 4, 7))
    # a thread per row: each lane of a request reads its own row -> one sector per lane
    assert s1["sectors_per_request"] > 30
    for s in (s4, s7):
        # 32 consecutive floats: 4 or 5 sectors (rows are not 128-byte aligned), fewer for a row's tail
        assert s["sectors_per_request"] < 6
        assert s1["sectors_per_request"] > 3 * s["sectors_per_request"]
        assert s1["moved_over_ideal"] > 3 * s["moved_over_ideal"]
    for s in (s1, s4, s7):
        # every version reads the input and writes the output once as far as DRAM is concerned
        assert s["unique_bytes"] == s["ideal_bytes"] == 2 * 32 * 517 * 4
    assert s4["conflict_ways"] == 1.0 and s1["shared_requests"] == 0
    assert all(line["line"].startswith("softmax_forward.cu:") for l in got[1]["launches"] for line in l["lines"])
    text = analyze.format_analysis(got[1])
    assert "per source line" in text and "softmax_forward.cu:" in text and "a roofline model, not a measurement" in text
    table = analyze.format_comparison(list(got.values()))
    assert "sectors/req" in table and "v1" in table and "v7" in table


def test_layernorm_thread_per_row_vs_warp_per_row(no_hazards):
    """The same property on another memory-bound ladder: layernorm_forward's thread per row (v1)
    against a warp per row (v3, v4): several times the sectors per request and the bytes through L1."""
    op = llmcupy.ops["layernorm_forward"]
    sizes = {"B": 2, "T": 16, "C": 96}   # 32 rows: v1's warp is full
    inputs = op.make_inputs(np.random.default_rng(0), **sizes)
    s = {v: analyze.analyze_version(op, v, sizes, inputs=inputs)["summary"] for v in (1, 3, 4)}
    for v in (3, 4):
        assert s[1]["sectors_per_request"] > 3 * s[v]["sectors_per_request"], s
        assert s[1]["moved_over_ideal"] > 3 * s[v]["moved_over_ideal"], s
        assert s[v]["unique_over_ideal"] == pytest.approx(1.0)


def test_float4_copies_count_as_one_16_byte_access_at_the_kernels_line(no_hazards):
    """gelu_forward v2 loads and stores float4 through common.cuh's load128cs/store128: g++ copies
    each as scalar moves, which count as one 16-byte access per lane (16 sectors per request, all
    bytes used), reported at the line of gelu_forward.cu that called the helper."""
    r = analyze.analyze_version(llmcupy.ops["gelu_forward"], 2)
    rows = r["launches"][0]["lines"]
    assert rows and all(row["line"].startswith("gelu_forward.cu:") for row in rows), rows
    for row in rows:
        assert row["width"] == 16 and row["lane_accesses"] == row["bytes"] // 16
        assert analyze.ratios(row)["sectors_per_request"] == 16 and analyze.ratios(row)["efficiency"] == 1.0
    assert r["summary"]["moved_over_ideal"] == 1.0


def test_a_version_that_only_calls_cublas_is_shown_as_such():
    op = llmcupy.ops["matmul_forward"]
    assert op.versions[3].summary.startswith("cuBLASLt")  # bias fused in cuBLAS's epilogue: no kernel of ours
    r = analyze.analyze_version(op, 3)
    assert r["launches"] == [] and r["summary"]["model_seconds"] is None
    assert "no kernel launch" in analyze.format_analysis(r)
    other = analyze.analyze_version(op, 2)
    assert "no kernel launch (library call)" in analyze.format_comparison([other, r])


def test_kernel_cli_analyze_prints_the_tables(capsys):
    from llmcupy import kernel

    rc = kernel.main(["softmax_forward", "4", "--analyze", "--block-size", "128", "--backend", "sim"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "metrics (emulator, block size 128" in out
    assert "sectors/req" in out and "bank ways" in out and "per source line:" in out
    assert "softmax_forward.cu:" in out and "model (H100 SXM, sm_90)" in out
    assert "a roofline model, not a measurement" in out


def test_kernel_cli_analyze_refuses_an_unknown_gpu(capsys):
    from llmcupy import kernel

    assert kernel.main(["softmax_forward", "4", "--analyze", "--gpu", "h900", "--backend", "sim"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'h900'" in err and "h100-sxm" in err


# ----------------------------------------------------------------------------------------------
# occupancy and the model


def test_occupancy_limits():
    h100 = analyze.gpu("h100-sxm")
    o = analyze.occupancy(h100, 256, 32, 0, 0)
    assert (o["blocks_per_sm"], o["occupancy"], o["limited_by"]) == (8, 1.0, "threads")
    o = analyze.occupancy(h100, 256, 64, 0, 0)   # 64 x 32 = 2048 registers per warp -> 32 warps
    assert (o["blocks_per_sm"], o["occupancy"], o["limited_by"]) == (4, 0.5, "registers")
    o = analyze.occupancy(h100, 128, 30, 0, 100 * 1024)  # 101 KiB with the reserved 1 KiB -> 2 blocks
    assert (o["blocks_per_sm"], o["limited_by"]) == (2, "shared memory")
    o = analyze.occupancy(h100, 32, 16, 0, 0)    # small blocks: the 32-blocks limit
    assert (o["blocks_per_sm"], o["occupancy"], o["limited_by"]) == (32, 0.5, "blocks")
    t4 = analyze.gpu("t4")
    assert analyze.occupancy(t4, 1024, 32, 0, 0)["occupancy"] == 1.0
    assert analyze.occupancy(h100, 1024, 128, 0, 0)["blocks_per_sm"] == 0  # cannot launch


def test_model_of_a_synthetic_launch():
    g = analyze.gpu("h100-sxm")
    launch = {"grid": [132 * 8, 1, 1], "block": [256, 1, 1], "shared_mem": 0,
              "totals": {"unique_read_bytes": 335_000_000, "unique_written_bytes": 0},
              "sites": [{"line": "k.cu:1", "kind": "global load", "width": 4, "requests": 1000, "lane_accesses": 32000,
                         "bytes": 128000, "sectors": 4000, "wavefronts": 0, "ideal_wavefronts": 0}]}
    occ = analyze.occupancy(g, 256, 32, 0, 0)
    m = analyze.model_launch(g, launch, occ)
    assert m["bound"] == "dram" and m["parallelism"] == 1.0
    assert m["seconds"] == pytest.approx(2e-6 + 335e6 / 3350e9)
    # the same traffic from one block on one SM: latency-bound, far slower
    one = dict(launch, grid=[1, 1, 1])
    assert analyze.model_launch(g, one, occ)["seconds"] > 3 * m["seconds"]


# ----------------------------------------------------------------------------------------------
# rank correlation with measured GPU times


def test_spearman():
    assert analyze.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert analyze.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert analyze.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert analyze.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # a tie: average ranks
    assert analyze.spearman([1, 2], [2, 1]) is None and analyze.spearman([1, 1, 1], [1, 2, 3]) is None


def _gpu_record(sizes, times, block_size=256, backend="cuda", device="NVIDIA H100 80GB HBM3"):
    return {"schema": bench.SCHEMA, "date": "2026-01-01T00:00:00Z", "backend": backend, "device": device,
            "git": {"commit": "0" * 40}, "timed": backend == "cuda",
            "results": [{"op": "softmax_forward", "version": v, "ok": True, "sizes": sizes,
                         "blocks": [{"block_size": block_size, "ok": True, "ms": ms}]} for v, ms in times.items()]}


def _softmax_analyses():
    """softmax_forward versions 1, 5, 6 and 7 analysed at small sizes: (sizes, analyses, the versions
    ranked by the model's time, fastest first)."""
    op = llmcupy.ops["softmax_forward"]
    sizes = {"B": 2, "T": 16, "V": 517}
    inputs = op.make_inputs(np.random.default_rng(0), **sizes)
    analyses = [analyze.analyze_version(op, v, sizes, inputs=inputs) for v in (1, 5, 6, 7)]
    model = {a["version"]: a["summary"]["model_seconds"] for a in analyses}
    return sizes, analyses, sorted(model, key=model.get)


def test_correlation_with_a_synthetic_results_folder(tmp_path):
    sizes, analyses, ranked = _softmax_analyses()
    assert analyze.correlate(analyses, tmp_path) is None  # nothing measured yet
    # measured times in the model's order -> rho = 1; reversed -> -1
    (tmp_path / "a.json").write_text(json.dumps(_gpu_record(sizes, {v: 0.01 * (i + 1) for i, v in enumerate(ranked)})))
    c = analyze.correlate(analyses, tmp_path)
    assert c["rho"] == pytest.approx(1.0) and len(c["pairs"]) == 4
    assert "Spearman rho = 1.00 over 4 versions (a.json)" in analyze.format_correlation(c)
    (tmp_path / "b.json").write_text(json.dumps(_gpu_record(sizes, {v: 0.01 * (4 - i) for i, v in enumerate(ranked)})))
    assert analyze.correlate(analyses, tmp_path)["rho"] == pytest.approx(-1.0)  # the newest file wins
    # other sizes, another block size, or an emulator record: not the same measurement
    for f in tmp_path.glob("*.json"):
        f.unlink()
    (tmp_path / "c.json").write_text(json.dumps(_gpu_record({"B": 8, "T": 1024, "V": 50257}, {1: 1.0, 5: 0.1, 6: 0.2, 7: 0.5})))
    (tmp_path / "d.json").write_text(json.dumps(_gpu_record(sizes, {1: 1.0, 5: 0.1, 6: 0.2, 7: 0.5}, block_size=128)))
    (tmp_path / "e.json").write_text(json.dumps(_gpu_record(sizes, {1: 1.0, 5: 0.1, 6: 0.2, 7: 0.5}, backend="sim")))
    (tmp_path / "f.json").write_text("{not json")
    assert analyze.correlate(analyses, tmp_path) is None


def test_correlation_never_mixes_the_times_of_two_gpus(tmp_path):
    # before: each (version, block size) took its time from whichever file sorted last, so a T4 run of
    # two versions beside an H100 run of four ranked T4 and H100 times together, as one GPU
    sizes, analyses, ranked = _softmax_analyses()
    (tmp_path / "a_h100.json").write_text(json.dumps(_gpu_record(sizes, {v: 0.01 * (i + 1) for i, v in enumerate(ranked)})))
    (tmp_path / "b_t4.json").write_text(json.dumps(_gpu_record(sizes, {ranked[0]: 9.0, ranked[1]: 0.001},
                                                               device="Tesla T4")))
    c = analyze.correlate(analyses, tmp_path)
    assert c["device"] == "NVIDIA H100 80GB HBM3" and c["rho"] == pytest.approx(1.0) and len(c["pairs"]) == 4
    assert {p["file"] for p in c["pairs"]} == {str(tmp_path / "a_h100.json")}
    assert ("rank correlation, model (H100 SXM) vs times measured on NVIDIA H100 80GB HBM3: Spearman rho = 1.00 "
            "over 4 versions (a_h100.json)") == analyze.format_correlation(c)


def test_correlation_takes_the_newest_run_by_its_date_not_its_file_name(tmp_path):
    # before: the file that sorted last won, so catalogue.json (kernel --json) beat a newer dated sweep
    sizes, analyses, ranked = _softmax_analyses()
    newer = dict(_gpu_record(sizes, {v: 0.01 * (i + 1) for i, v in enumerate(ranked)}), date="2026-02-01T00:00:00Z")
    (tmp_path / "20260201T000000Z_h100.json").write_text(json.dumps(newer))
    (tmp_path / "catalogue.json").write_text(json.dumps(_gpu_record(sizes, {v: 0.01 * (4 - i) for i, v in enumerate(ranked)})))
    assert analyze.correlate(analyses, tmp_path)["rho"] == pytest.approx(1.0)


def test_kernel_cli_prints_the_correlation_when_bench_results_hold_gpu_times(tmp_path, monkeypatch, capsys):
    # the checkout's bench/results, from any working folder: before, the kernel CLI looked in
    # bench/results of the working folder, and found the checkout's GPU times only from its root
    from llmcupy import kernel

    op = llmcupy.ops["softmax_forward"]
    sizes = dict(op.sim_sizes)
    analyses = [analyze.analyze_version(op, v, sizes) for v in (1, 5, 6, 7)]
    results = [{"op": a["op"], "version": a["version"], "analysis": a} for a in analyses]
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    stand_in_checkout(monkeypatch, checkout)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    kernel._print_comparisons(results)
    out = capsys.readouterr().out
    assert "metrics per version" in out and "rank correlation" not in out  # no GPU results here
    (checkout / "bench" / "results").mkdir(parents=True)
    times = {1: 0.9, 5: 0.5, 6: 0.05, 7: 0.04}
    (checkout / "bench" / "results" / "h100.json").write_text(json.dumps(_gpu_record(sizes, times)))
    kernel._print_comparisons(results)
    out = capsys.readouterr().out
    model = {a["version"]: a["summary"]["model_seconds"] for a in analyses}
    rho = analyze.spearman([model[v] for v in times], list(times.values()))
    assert f"Spearman rho = {rho:.2f} over 4 versions (h100.json)" in out


# ----------------------------------------------------------------------------------------------
# bench records and plot


def test_bench_records_metrics_and_plots_bytes_against_ideal(tmp_path):
    pytest.importorskip("matplotlib")
    with open(tmp_path / "log.txt", "w") as log:
        record = bench.run(["gelu_forward"], progress=False, log=log)
    for entry in record["results"]:
        m = entry["metrics"]
        assert m["block_size"] == 256 and m["model_gpu"] == "h100-sxm"
        s = m["summary"]
        assert s["unique_bytes"] == s["ideal_bytes"] == 2 * 2 * 8 * 64 * 4
        assert s["model_seconds"] > 0 and s["sectors_per_request"] >= 4
        assert m["launches"][0]["lines"] and "sites" not in m["launches"][0]
    assert "metrics @ 256" in (tmp_path / "log.txt").read_text()
    path = bench.save(record, tmp_path)
    loaded = bench.load(path)
    fig = bench.plot_results(loaded, tmp_path / "plot.png")
    titles = [ax.get_title() for ax in fig.axes]
    assert any("memory traffic per version" in t for t in titles), titles
    assert (tmp_path / "plot.png").stat().st_size > 10_000


# ----------------------------------------------------------------------------------------------
# on a GPU: the model against the device


@pytest.mark.gpu
def test_model_rank_correlation_against_this_gpu(tmp_path):
    """Times softmax_forward's versions on this GPU at the emulator's sizes, records them as bench
    does, then analyses the same versions in the emulator and prints the rank correlation (a
    figure to read, not asserted: performance is measured, never asserted in tests)."""
    from llmcupy import harness
    from llmcupy.runtime import backend

    op = llmcupy.ops["softmax_forward"]
    sizes = dict(op.sim_sizes)
    record = {"schema": bench.SCHEMA, "backend": "cuda", "date": "now", "results": []}
    # the GPU explicitly: the other GPU tests' fixtures leave the process on "sim" when they end,
    # so the backend from LLMCUPY_BACKEND cannot be relied on here
    backend.set_backend("cuda")
    try:
        for v in sorted(op.versions):
            raw = harness.sweep(op, v, sizes, 256 if 256 in op.versions[v].block_sizes else None, repeat=20)
            assert raw["backend"] == "cuda"
            record["results"].append(bench._version_entry_from_raw(raw))
    finally:
        backend.set_backend("sim")
    (tmp_path / "gpu.json").write_text(json.dumps(record, default=str))
    analyses = [analyze.analyze_version(op, v, sizes) for v in sorted(op.versions)]
    c = analyze.correlate(analyses, tmp_path)
    assert c is not None and -1.0 <= c["rho"] <= 1.0
    print(analyze.format_correlation(c))


def test_a_version_that_calls_cublas_has_a_partial_model_marked_as_such():
    """matmul_forward v2 is a cuBLAS GEMM (NumPy in the emulator, not modelled) plus a bias kernel:
    its model time is the bias kernel's alone, so it must not read as a total beside v5's."""
    op = llmcupy.ops["matmul_forward"]
    partial = analyze.analyze_version(op, 2)
    whole = analyze.analyze_version(op, 5)
    assert partial["summary"]["library_calls"] == 1 and whole["summary"]["library_calls"] == 0
    table = analyze.format_comparison([partial, whole])
    v2 = next(line for line in table.splitlines() if line.strip().startswith("v2"))
    v5 = next(line for line in table.splitlines() if line.strip().startswith("v5"))
    assert v2.endswith("+ cuBLAS, not modelled") and "cuBLAS" not in v5
    assert "cuBLAS call(s), not modelled" in analyze.format_analysis(partial, lines=False)
    assert analyze.correlate([partial]) is None   # a partial time is never ranked against measurements


def test_running_the_module_says_where_its_cli_is():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "llmcupy.analyze"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "python -m llmcupy.kernel OP VERSION --analyze" in proc.stderr, proc.stderr
