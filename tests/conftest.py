import os
import random

import pytest

# Tests run in the emulator unless a GPU run asks otherwise (LLMCUPY_BACKEND=cuda pytest -m gpu).
os.environ.setdefault("LLMCUPY_BACKEND", "sim")


def _cuda_reason():
    from llmcupy.runtime.backend import cuda_unavailable_reason

    return cuda_unavailable_reason()


def pytest_addoption(parser):
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the tests in a random order drawn from SEED, to show that none depends on "
                          "state another left behind (e.g. pytest -m gpu --shuffle 1)")


def pytest_report_header(config):
    seed = config.getoption("--shuffle")
    return None if seed is None else f"test order shuffled with seed {seed} (--shuffle {seed} repeats it)"


def pytest_collection_modifyitems(config, items):
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    reason = None
    checked = False
    for item in items:
        # the marker itself: item.keywords also holds the names of the folders above the test file,
        # so a checkout inside a folder called "gpu" would skip every test
        if item.get_closest_marker("gpu") is not None:
            if not checked:
                reason, checked = _cuda_reason(), True
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"needs a CUDA device: {reason}"))


@pytest.fixture
def no_hazards():
    """Resets the emulator's hazard counters and asserts they are still zero afterwards."""
    from llmcupy import sim

    sim.reset_hazards()
    yield
    counts = sim.hazards()
    bad = {k: v for k, v in counts.items() if k != "launches" and v}
    assert not bad, f"emulator hazards: {bad}"


@pytest.fixture(autouse=True)
def tf32_off():
    """Every test starts and ends with TF32 off: the FP32 tolerances assume exact FP32 GEMMs, and an
    in-process trainer run (``--tf32`` defaults to 1) must not leave it on for the tests after it.
    A test that wants TF32 scopes it with ``with llmcupy.runtime.blas.tf32(True): ...``."""
    from llmcupy.runtime import blas

    assert not blas.tf32_enabled(), "TF32 was left on before this test"
    yield
    assert not blas.tf32_enabled(), "this test left TF32 on (use `with blas.tf32(...)`, which restores it)"


@pytest.fixture(scope="session")
def have_nvrtc():
    """NVRTC and the CUDA headers (pip wheels of the test extra): without them the NVRTC checks skip,
    except on CI (``CI`` or ``LLMCUPY_REQUIRE_NVRTC`` set), where they fail instead."""
    from llmcupy import nvrtc

    try:
        nvrtc.find_nvrtc()
        nvrtc.cuda_include_dirs()
    except nvrtc.NvrtcNotFound as exc:
        if os.environ.get("CI") or os.environ.get("LLMCUPY_REQUIRE_NVRTC"):
            pytest.fail(f"the NVRTC checks must run on CI: {exc}")
        pytest.skip(f"NVRTC is not installed: {exc}")


@pytest.fixture(params=["real libcu++", "stand-ins"])
def libcuxx_mode(request, monkeypatch):
    """Runs a test against each libcu++ the emulator can compile with (llmcupy/sim/libcuxx.py): the real one
    (CuPy's, as CI has with the test extra) and its stand-ins (a plain ``pip install llmcupy``, forced here
    with LLMCUPY_SIM_LIBCUDACXX=none)."""
    from llmcupy.sim import libcuxx

    if request.param == "stand-ins":
        monkeypatch.setenv(libcuxx.ENV_VAR, "none")
    elif libcuxx.libcudacxx_dir() is None:
        pytest.skip(f"no real libcu++ here (CuPy's, or {libcuxx.ENV_VAR})")
    return request.param
