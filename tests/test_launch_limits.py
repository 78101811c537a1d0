"""Launches a GPU would refuse: more threads than a kernel's ``__launch_bounds__`` allow, more
registers or shared memory than a device gives one block.

The emulator has no registers to run out of, so without these checks such a launch passes every
CPU test and fails on the first GPU run with CUDA's "too many resources requested for launch":

* the emulator enforces ``__launch_bounds__`` (evaluated with the source's own macros), so a
  launcher that exceeds its kernel's bound fails in CI (``LaunchBoundsError``);
* on a GPU, ``RawKernel`` compares the block with what the driver says the kernel can launch with
  and raises ``DeviceLimitError`` naming the registers (or shared memory) and the device; the
  catalogue then reports that block size as skipped on this device rather than failed;
* NVRTC's register report shows, without a GPU, that every launch of the trainer's step fits on
  each architecture the project claims (sm_75, sm_80, sm_90).
"""

import types

import numpy as np
import pytest

import llmcupy
from llmcupy import harness
from llmcupy import ops as ops_registry
from llmcupy.runtime import DeviceLimitError, KernelArgumentError, LaunchBoundsError
from llmcupy.runtime import backend as _backend
from llmcupy.runtime import module as module_mod

BOUNDED = r"""
#define ROWS_PER_BLOCK 4
__global__ void __launch_bounds__(ROWS_PER_BLOCK * 32, 1) scale_rows(float* out, const float* inp, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = s * inp[i];
}
__global__ __launch_bounds__(32) void one_warp(float* out) { out[threadIdx.x] = 1.0f; }
__global__ void unbounded(float* out) { out[threadIdx.x] = 1.0f; }
template <int BLOCK> __global__ void __launch_bounds__(BLOCK) templated(float* out) { out[threadIdx.x] = 1.0f; }
// Simon Boehm's SGEMM ladder: a bound in parentheses, from the template's parameters
template <const int BM, const int BN, const int TM, const int TN>
__global__ void __launch_bounds__((BM * BN) / (TM * TN), 1) tiled(float* out) { out[threadIdx.x] = 1.0f; }
__global__ void __launch_bounds__((ROWS_PER_BLOCK * 32) / (2), 1) halved(float* out) { out[threadIdx.x] = 1.0f; }
__launch_bounds__(32) __global__ void bound_first(float* out) { out[threadIdx.x] = 1.0f; }
extern "C" __launch_bounds__(64, 2) __global__ void c_bound_first(float* out) { out[threadIdx.x] = 1.0f; }
template <typename T> __launch_bounds__(64) __global__ void typed_bound_first(T* out) { out[threadIdx.x] = T(1); }
namespace ops {
constexpr int kWarps = 2;
__global__ void __launch_bounds__(kWarps * 32) in_namespace(float* out) { out[threadIdx.x] = 1.0f; }
}
"""


@pytest.fixture
def sim_backend():
    previous = _backend.get_backend()
    _backend.set_backend("sim")
    yield
    _backend.set_backend(previous)


def test_emulator_enforces_launch_bounds(sim_backend):
    mod = llmcupy.RawModule(code=BOUNDED, name_expressions=["templated<64>", "ops::in_namespace", "scale_rows",
                                                            "one_warp", "unbounded", "tiled<128, 128, 8, 8>",
                                                            "halved", "bound_first", "c_bound_first"])
    scale = mod.get_function("scale_rows")
    # the bound is the C expression, evaluated with the file's macro; a kernel without one gets CUDA's 1024;
    # a template's with the instance's arguments (before: not enforced, 1024)
    assert scale.max_threads_per_block == 128
    assert mod.get_function("one_warp").max_threads_per_block == 32
    assert mod.get_function("unbounded").max_threads_per_block == 1024
    assert mod.get_function("templated<64>").max_threads_per_block == 64
    assert mod.get_function("ops::in_namespace").max_threads_per_block == 64  # the namespace's constant
    # before: a bound holding parentheses made the kernel's name '__launch_bounds__', and the source failed
    # to build ("the source compiles, but a kernel name ... (__launch_bounds__) does not name a __global__ ...")
    assert mod.get_function("tiled<128, 128, 8, 8>").max_threads_per_block == 256
    assert mod.get_function("halved").max_threads_per_block == 64
    # before: a bound written before __global__ (CUDA takes it there too) was not enforced
    assert mod.get_function("bound_first").max_threads_per_block == 32
    assert mod.get_function("c_bound_first").max_threads_per_block == 64
    with pytest.raises(LaunchBoundsError, match=r"tiled<128, 128, 8, 8>: a block of 512 threads is more than its "
                                                r"__launch_bounds__ allow \(256\)"):
        mod.get_function("tiled<128, 128, 8, 8>")((1,), (512,), (np.zeros(512, np.float32),))

    x = np.arange(256, dtype=np.float32)
    y = np.zeros_like(x)
    scale((2,), (128,), (y, x, np.float32(2), np.int32(256)))   # at the bound: runs
    np.testing.assert_array_equal(y, 2 * x)
    with pytest.raises(LaunchBoundsError, match=r"scale_rows: a block of 256 threads is more than its "
                                                r"__launch_bounds__ allow \(128\)"):
        scale((1,), (256,), (y, x, np.float32(2), np.int32(256)))
    with pytest.raises(LaunchBoundsError, match="one_warp"):
        mod.get_function("one_warp")((1,), (8, 8), (y,))      # 64 threads in two dimensions
    assert issubclass(LaunchBoundsError, KernelArgumentError)


def test_a_kernel_whose_bound_holds_parentheses_is_found_for_its_argument_checks():
    # the GPU path checks arguments against the declaration it finds in the source; before, a bound in
    # parentheses hid it: get_function raised "cannot find its __global__ declaration"
    from llmcupy.runtime.signature import parse_signature

    params = parse_signature(BOUNDED, "tiled<128, 128, 8, 8>")
    assert params is not None and [p.name for p in params] == ["out"]
    assert [p.name for p in parse_signature(BOUNDED, "halved")] == ["out"]
    assert [p.name for p in parse_signature(BOUNDED, "bound_first")] == ["out"]
    assert [p.name for p in parse_signature(BOUNDED, "c_bound_first")] == ["out"]
    # a template's parameters are substituted only when its header is found with the declaration
    assert [p.spelling for p in parse_signature(BOUNDED, "typed_bound_first<double>")] == ["double*"]


def test_a_kernel_with_maxnreg_or_a_grid_constant_parameter_is_found_for_its_argument_checks():
    # before, the GPU path's get_function raised "cannot find its __global__ declaration" for a kernel with
    # __maxnreg__(n), and took `const __grid_constant__ int n` for a struct of an unknown type (any bytes)
    from llmcupy.runtime.signature import parse_signature

    source = ('extern "C" __global__ void __maxnreg__(32) limited(float* out) {}\n'
              '__global__ void __launch_bounds__(64) __maxnreg__(32) both(float* out) {}\n'
              'extern "C" __global__ void constant(const __grid_constant__ int n, __grid_constant__ const double s) {}\n')
    assert [p.name for p in parse_signature(source, "limited")] == ["out"]
    assert [p.name for p in parse_signature(source, "both")] == ["out"]
    assert [(p.spelling, p.name) for p in parse_signature(source, "constant")] == [("int", "n"), ("double", "s")]



def test_finding_a_declaration_takes_time_linear_in_the_bounds_before_it():
    # before, each space after a __launch_bounds__(...) could be taken by two nested \s*, so a failed
    # search tried 2**n ways past n bounds in a row (20: 0.7 s; 40: days). Run apart, so that the old
    # pattern fails the test by the timeout instead of hanging the suite; the new one takes milliseconds.
    import subprocess
    import sys

    script = ("from llmcupy.runtime.signature import parse_signature\n"
              "src = '__launch_bounds__(256) ' * 40 + 'int x;\\n__global__ void k(float* out) {}'\n"
              "assert [p.name for p in parse_signature(src, 'k')] == ['out']\n"
              "assert parse_signature('__launch_bounds__(256) ' * 40 + 'int x;', 'k') is None\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)

def test_every_catalogue_launch_respects_its_kernels_bounds(sim_backend):
    """Every version at every block size of its sweep, kernels stubbed (the checks run, the kernels
    do not): no launcher asks for more threads than its kernel's ``__launch_bounds__``."""
    for name in ops_registry.names():
        op = ops_registry.get(name)
        inputs = op.make_inputs(np.random.default_rng(0), **op.sim_sizes)
        for number, version in sorted(op.versions.items()):
            if not version.available:
                continue
            for bs in harness.block_sizes_for(version, None):
                if version.requires is not None and version.requires(inputs, bs):
                    continue
                arrays = {k: (np.array(v, copy=True) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
                with module_mod.STUBBED, np.errstate(all="ignore"):
                    op.run(number, arrays, bs)   # raises LaunchBoundsError on a violation


@pytest.mark.gpu
def test_gpu_refuses_a_block_beyond_launch_bounds_with_the_same_error():
    import cupy

    previous = _backend.get_backend()
    llmcupy.set_backend("cuda")
    try:
        mod = llmcupy.RawModule(code=BOUNDED)
        scale = mod.get_function("scale_rows")
        assert scale.max_threads_per_block == 128
        x = cupy.arange(256, dtype=cupy.float32)
        y = cupy.zeros_like(x)
        with pytest.raises(LaunchBoundsError, match=r"__launch_bounds__ allow \(128\)"):
            scale((1,), (256,), (y, x, np.float32(2), np.int32(256)))
        scale((2,), (128,), (y, x, np.float32(2), np.int32(256)))
        np.testing.assert_array_equal(cupy.asnumpy(y), 2 * np.arange(256, dtype=np.float32))
        unbounded = mod.get_function("unbounded")
        # what the driver allows follows the registers, as registers_limit computes it
        per_block = _backend.device_attribute("MaxRegistersPerBlock")
        assert unbounded.max_threads_per_block == module_mod.registers_limit(unbounded._kernel.num_regs, per_block)
    finally:
        llmcupy.set_backend(previous)


SHARED_SUM = r"""
extern "C" __global__ void shared_sum(float* out, const float* inp, int n) {
    extern __shared__ float slab[];   // n floats: more than the 48 KiB a block gets without an opt-in
    for (int i = threadIdx.x; i < n; i += blockDim.x) slab[i] = inp[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < n; i++) s += slab[i];
        out[0] = s;
    }
}
"""


@pytest.mark.gpu
def test_gpu_shared_memory_opt_in_through_cupys_attribute():
    # What the stand-ins above cannot show: the opt-in reaches CuPy's RawKernel attribute
    # (cuFuncSetAttribute on this device's function) and a launch above 48 KiB then runs; CuPy's own
    # attribute reads the value back, and one byte past the device's opt-in limit is refused by us
    import cupy

    previous = _backend.get_backend()
    llmcupy.set_backend("cuda")
    try:
        k = llmcupy.RawModule(code=SHARED_SUM).get_function("shared_sum")
        n = 16 * 1024   # 64 KiB of floats
        k.max_dynamic_shared_size_bytes = 4 * n
        assert k.max_dynamic_shared_size_bytes == 4 * n and k._kernel.max_dynamic_shared_size_bytes == 4 * n
        inp = cupy.ones(n, dtype=cupy.float32)
        out = cupy.zeros(1, dtype=cupy.float32)
        k((1,), (256,), (out, inp, np.int32(n)), shared_mem=4 * n)
        assert float(out[0]) == n
        optin = _backend.device_attribute("MaxSharedMemoryPerBlockOptin")
        with pytest.raises(DeviceLimitError, match=r"shared_sum: \d+ bytes of dynamic shared memory"):
            k.max_dynamic_shared_size_bytes = optin + 1
        assert k._kernel.max_dynamic_shared_size_bytes == 4 * n   # left as it was
        # a second kernel object launched above 48 KiB without the setter opts in by itself
        k2 = llmcupy.RawModule(code=SHARED_SUM, options=("-DSECOND",)).get_function("shared_sum")
        out.fill(0)
        k2((1,), (256,), (out, inp, np.int32(n)), shared_mem=4 * n)
        assert float(out[0]) == n and k2._kernel.max_dynamic_shared_size_bytes >= 4 * n
    finally:
        llmcupy.set_backend(previous)


@pytest.mark.gpu
def test_gpu_kernel_name_typos_are_named_as_in_the_emulator():
    # CuPy 14.2: a name the module was not given fails the driver's lookup (CUDADriverError
    # CUDA_ERROR_NOT_FOUND), a name expression that names nothing fails NVRTC's compile
    # (CompileException); both say which name and the kernel it likely meant, as the emulator does
    previous = _backend.get_backend()
    llmcupy.set_backend("cuda")
    try:
        with pytest.raises(AttributeError, match=r"no kernel 'scal_rows' in kernel.cu \(did you mean 'scale_rows'\?\)"):
            llmcupy.RawModule(code=BOUNDED).get_function("scal_rows")
        with pytest.raises(AttributeError, match=r"no kernel 'unbound' in kernel.cu \(did you mean 'unbounded'\?\)"):
            llmcupy.RawKernel(BOUNDED, "unbound")
    finally:
        llmcupy.set_backend(previous)


def test_registers_limit():
    # registers are allocated per warp in units of 256, 64K per block
    assert module_mod.registers_limit(32) == 1024
    assert module_mod.registers_limit(64) == 1024
    assert module_mod.registers_limit(66) == 896    # 9 x 256 per warp -> 28 warps
    assert module_mod.registers_limit(128) == 512
    assert module_mod.registers_limit(255) == 256


def _cuda_kernel(monkeypatch, *, max_threads, num_regs, static_smem=0, optin=227 * 1024):
    """A RawKernel as the cuda backend builds it, over a stand-in for CuPy's kernel (no GPU here)."""
    k = object.__new__(module_mod.RawKernel)
    k.name, k.backend = "heavy_kernel", "cuda"
    k._max_threads = {0: max_threads}   # what CuPy's max_threads_per_block would say on device 0
    k._opted_in = {}
    k._static_shared = {}
    k._kernel = types.SimpleNamespace(num_regs=num_regs, shared_size_bytes=static_smem,
                                      max_dynamic_shared_size_bytes=0)
    attributes = {"MaxRegistersPerBlock": 65536, "MaxSharedMemoryPerBlockOptin": optin}
    monkeypatch.setattr(_backend, "device_attribute", lambda name: attributes[name])
    monkeypatch.setattr(_backend, "device_name", lambda: "Tesla T4")
    return k


def test_gpu_register_limit_is_a_device_limit(monkeypatch):
    k = _cuda_kernel(monkeypatch, max_threads=896, num_regs=66)
    err = k._too_many_threads(1024)
    assert isinstance(err, DeviceLimitError)
    text = str(err)
    assert "heavy_kernel" in text and "66 registers per thread" in text and "Tesla T4" in text
    assert "at most 896 threads" in text and "smaller block size" in text


def test_gpu_launch_bounds_are_told_apart_from_registers(monkeypatch):
    # 40 registers allow 1024 threads: a limit of 256 can only come from __launch_bounds__
    k = _cuda_kernel(monkeypatch, max_threads=256, num_regs=40)
    err = k._too_many_threads(512)
    assert isinstance(err, LaunchBoundsError) and not isinstance(err, DeviceLimitError)
    assert "__launch_bounds__ allow (256)" in str(err)


def test_gpu_shared_memory_opt_in_is_checked_against_the_device(monkeypatch):
    k = _cuda_kernel(monkeypatch, max_threads=1024, num_regs=32, static_smem=1024, optin=64 * 1024)
    k._opt_in_shared(60 * 1024)
    assert k._kernel.max_dynamic_shared_size_bytes == 60 * 1024
    with pytest.raises(DeviceLimitError, match=r"heavy_kernel: 65536 bytes of dynamic shared memory \(plus 1024 "
                                               r"static\) are more than the 65536 bytes one block may have on Tesla T4"):
        k._opt_in_shared(64 * 1024)
    assert k._kernel.max_dynamic_shared_size_bytes == 60 * 1024   # left as it was


def test_cupys_spelling_of_the_opt_in_opts_in_on_the_device(monkeypatch):
    # kernel.max_dynamic_shared_size_bytes = n, as CuPy's RawKernel takes it: an AttributeError since
    # the per-device bookkeeping made it a property (and before that, on cuda, a plain attribute that
    # skipped the real opt-in, so the launch was refused)
    k = _cuda_kernel(monkeypatch, max_threads=1024, num_regs=32, optin=64 * 1024)
    k.max_dynamic_shared_size_bytes = 60 * 1024
    assert k._kernel.max_dynamic_shared_size_bytes == 60 * 1024 and k.max_dynamic_shared_size_bytes == 60 * 1024
    with pytest.raises(DeviceLimitError, match="more than the 65536 bytes one block may have"):
        k.max_dynamic_shared_size_bytes = 80 * 1024


def test_the_opt_in_setter_refuses_what_no_gpu_takes(monkeypatch):
    # the setter took any value: on cuda a negative or fractional one went on to CUDA (its driver
    # error, or 1.5 truncated), and the emulator stored an opt-in past any GPU's 227 KiB without a word
    k = _cuda_kernel(monkeypatch, max_threads=1024, num_regs=32, optin=64 * 1024)
    for bad in (-1, 1.5, True):
        with pytest.raises(KernelArgumentError, match=r"^heavy_kernel: max_dynamic_shared_size_bytes must be a "
                                                      rf"non-negative int, got {bad!r}$"):
            k.max_dynamic_shared_size_bytes = bad
    assert k._kernel.max_dynamic_shared_size_bytes == 0 and k.max_dynamic_shared_size_bytes == 0   # left as it was
    sim_kernel = llmcupy.RawModule(code=BOUNDED).get_function("unbounded")
    sim_kernel.max_dynamic_shared_size_bytes = 100 * 1024   # fits some GPUs: the launch checks the rest
    assert sim_kernel.max_dynamic_shared_size_bytes == 100 * 1024
    with pytest.raises(KernelArgumentError, match=r"^unbounded: 240640 bytes of shared memory exceed any GPU's 227 KiB$"):
        sim_kernel.max_dynamic_shared_size_bytes = 235 * 1024
    with pytest.raises(KernelArgumentError, match="must be a non-negative int, got -1"):
        sim_kernel.max_dynamic_shared_size_bytes = -1
    assert sim_kernel.max_dynamic_shared_size_bytes == 100 * 1024


def test_gpu_shared_memory_opt_in_is_made_again_on_another_device(monkeypatch):
    # CuPy's kernel loads once per device and the opt-in is an attribute of each device's copy: one
    # made while device 0 was current does not let a launch with device 1 current go above 48 KiB
    k = _cuda_kernel(monkeypatch, max_threads=1024, num_regs=32)
    device = [0]
    monkeypatch.setattr(_backend, "current_device", lambda: device[0])
    k._opt_in_shared(100 * 1024)
    assert k.max_dynamic_shared_size_bytes == 100 * 1024
    device[0] = 1
    assert k.max_dynamic_shared_size_bytes == 0   # so the next launch above 48 KiB opts in here
    k._opt_in_shared(80 * 1024)
    assert k.max_dynamic_shared_size_bytes == 80 * 1024
    device[0] = 0
    assert k.max_dynamic_shared_size_bytes == 100 * 1024


def test_gpu_opt_in_counts_the_kernels_static_shared_memory(monkeypatch):
    # CUDA's limit before an opt-in is 48 KiB for static and dynamic shared memory together: with 16
    # KiB static, a launch of 40 KiB dynamic was not opted in (only "dynamic > 48 KiB" was) and the
    # driver refused it (CUDA_ERROR_INVALID_VALUE)
    k = _cuda_kernel(monkeypatch, max_threads=1024, num_regs=32, static_smem=16 * 1024)
    launched = []
    k.params = []   # a kernel of no arguments
    monkeypatch.setattr(k, "_kernel", _StandInKernel(k._kernel, launched))
    monkeypatch.setattr(_backend, "current_device", lambda: 0)
    k._launch_trusted(1, 32, (), 32 * 1024, None)        # 16 + 32 KiB: the default covers it
    assert k._kernel.max_dynamic_shared_size_bytes == 0
    k._launch_trusted(1, 32, (), 40 * 1024, None)        # 16 + 40 KiB > 48 KiB: opt in first
    assert k._kernel.max_dynamic_shared_size_bytes == 40 * 1024 == k.max_dynamic_shared_size_bytes
    k.max_dynamic_shared_size_bytes = 1024               # lowered by hand: a larger launch raises it again
    k._launch_trusted(1, 32, (), 8 * 1024, None)
    assert k._kernel.max_dynamic_shared_size_bytes == 8 * 1024
    assert [shared for _, shared in launched] == [32 * 1024, 40 * 1024, 8 * 1024]


class _StandInKernel:
    """CuPy's kernel as a launch uses it: attributes of ``like``, and a call that records the launch
    with the opt-in it found (a GPU refuses dynamic shared memory past it, static included)."""

    def __init__(self, like, launched):
        self.__dict__.update(vars(like))
        self._launched = launched

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        limit = self.max_dynamic_shared_size_bytes or 48 * 1024 - self.shared_size_bytes
        assert shared_mem <= limit, f"CUDA_ERROR_INVALID_VALUE: {shared_mem} bytes past the kernel's limit {limit}"
        self._launched.append((grid, shared_mem))


def test_sweep_reports_a_block_size_the_device_cannot_run_as_skipped(sim_backend, monkeypatch):
    op = ops_registry.get("softmax_forward")
    real_run = op.run

    def run(number, arrays, block_size=None, **kw):
        if block_size == 1024:
            raise DeviceLimitError("softmax_forward_kernel4: a block of 1024 threads needs 80 registers per thread")
        return real_run(number, arrays, block_size, **kw)

    monkeypatch.setattr(op, "run", run)
    result = harness.sweep(op, 4)
    by_size = {b["block_size"]: b for b in result["blocks"]}
    assert by_size[1024]["ok"] is None
    assert by_size[1024]["skipped"].startswith("this device cannot launch it: softmax_forward_kernel4")
    assert all(b["ok"] for size, b in by_size.items() if size != 1024)
    assert result["ok"] is True


# ----------------------------------------------------------------------------------------------
# the trainer's step on every claimed architecture, from NVRTC's register report


def _step_launches(kernels):
    """(file, kernel, threads, dynamic shared bytes) of every launch of one training step of a
    one-layer model at GPT-2 124M's widths and T = 1024 (shared memory sizes follow C and T; the
    layer count only repeats launches), kernels stubbed."""
    from llmcupy.config import GPT2Config, init_params
    from llmcupy.model import GPT2

    cfg = GPT2Config(max_seq_len=1024, num_layers=1)
    model = GPT2(cfg, init_params(cfg, seed=0), kernels)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(1, 1025))
    seen = set()
    real_call = module_mod.RawKernel.__call__

    def record(self, grid, block, args, *, shared_mem=0, stream=None):
        b = module_mod._dims(block, "block", self.name)
        seen.add((self.module.filename, self.name, b[0] * b[1] * b[2], int(shared_mem)))
        return real_call(self, grid, block, args, shared_mem=shared_mem, stream=stream)

    from llmcupy.ops._op import launch_plans

    # every call checked in full: a launch plan's replays (of this or an earlier test's calls) skip __call__
    with pytest.MonkeyPatch.context() as mp, module_mod.STUBBED, launch_plans(False), np.errstate(all="ignore"):
        mp.setattr(module_mod.RawKernel, "__call__", record)
        model.forward(tokens[:, :-1], tokens[:, 1:])
        model.zero_grad()
        model.backward()
        model.update(1e-4, 0.9, 0.999, 1e-8, 0.0, 1)
    return sorted(seen)


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True], ids=["default", "fused"])
def test_trainer_step_launches_fit_every_claimed_architecture(sim_backend, have_nvrtc, fused):
    from llmcupy import analyze, nvrtc
    from llmcupy.model import KernelChoice

    kernels = KernelChoice()
    if fused:
        kernels.select_fusions()
    launches = _step_launches(kernels)
    assert len(launches) > 10
    gpus = {75: analyze.GPUS["t4"], 80: analyze.GPUS["a100-sxm"], 90: analyze.GPUS["h100-sxm"]}
    assert set(gpus) == set(nvrtc.DEFAULT_ARCHS)
    problems = []
    for arch, g in gpus.items():
        for filename, kernel, threads, dynamic in launches:
            table, reason = analyze.kernel_resources(filename, arch)
            assert reason is None, reason
            stats = analyze._resources_for(table, kernel)
            assert stats is not None, f"NVRTC reports no {kernel} in {filename} for sm_{arch}"
            if threads > module_mod.registers_limit(stats.registers):
                problems.append(f"sm_{arch}: {kernel} at {threads} threads needs {stats.registers} registers each")
            if stats.shared_bytes + dynamic > g.smem_per_sm - g.smem_reserved:
                problems.append(f"sm_{arch}: {kernel} needs {stats.shared_bytes} + {dynamic} bytes of shared memory")
    assert not problems, "launches of the trainer's step a GPU would refuse:\n" + "\n".join(problems)


_ENTRY_BOUNDS = r"\.entry\s+(?P<name>\w+)\s*\([^)]*\)\s*(?:\.maxntid\s+(?P<threads>\d+),\s*(?P<ty>\d+),\s*(?P<tz>\d+))?" \
                r"\s*(?:\.minnctapersm\s+(?P<blocks>\d+))?"


@pytest.mark.parametrize("arch", [75, 80, 90])
def test_the_blocks_a_launch_bound_asks_to_keep_resident_fit_on_an_sm(have_nvrtc, arch):
    # __launch_bounds__(threads, blocks) makes ptxas cap each thread's registers so that `blocks`
    # blocks can share an SM. When their threads or static shared memory cannot share it anyway
    # (matmul_forward 5's two 40 KiB blocks on sm_75's 64 KiB), the cap buys no occupancy and only
    # makes ptxas spill. PTX states the bound after the preprocessor, per architecture.
    import re

    from llmcupy import analyze, nvrtc

    g = {75: analyze.GPUS["t4"], 80: analyze.GPUS["a100-sxm"], 90: analyze.GPUS["h100-sxm"]}[arch]
    min_blocks = re.compile(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*,")
    files = [p for p in nvrtc.resolve_files() if min_blocks.search(p.read_text())]
    assert any(p.name == "matmul_forward.cu" for p in files)
    problems, checked = [], 0
    for path in files:
        table, reason = analyze.kernel_resources(path.name, arch)
        if reason is not None and "mma.h" in reason:
            continue  # matmul_forward_tf32 needs nvcc's crt/mma.h (test_nvrtc says so)
        assert reason is None, reason
        by_symbol = {stats.mangled: stats for stats in table.values()}
        for m in re.finditer(_ENTRY_BOUNDS, nvrtc.file_ptx(path, arch)):
            if not m.group("blocks") or int(m.group("blocks")) < 2:
                continue
            blocks = int(m.group("blocks"))
            threads = int(m.group("threads")) * int(m.group("ty")) * int(m.group("tz"))
            stats = by_symbol[m.group("name")]
            checked += 1
            if blocks * threads > g.max_threads_per_sm:
                problems.append(f"{stats.kernel}: {blocks} x {threads} threads, an SM holds {g.max_threads_per_sm}")
            if blocks * (stats.shared_bytes + g.smem_reserved) > g.smem_per_sm:
                problems.append(f"{stats.kernel}: {blocks} x {stats.shared_bytes} bytes of static shared memory, "
                                f"an SM has {g.smem_per_sm}")
    assert checked >= 2, "the PTX's .minnctapersm directives were not found"
    assert not problems, f"sm_{arch}: launch bounds asking for more resident blocks than fit:\n" + "\n".join(problems)
