"""``pytest --shuffle SEED`` (tests/conftest.py): the suite in a random but repeatable order, so a GPU
session can show that no test depends on state another left behind (TF32, the backend, caches)."""

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _order(*args):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(TESTS / "test_bench_defaults.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_shuffle_is_a_repeatable_permutation_of_the_default_order():
    plain, first, again, other = _order(), _order("--shuffle", "1"), _order("--shuffle", "1"), _order("--shuffle", "2")
    assert len(plain) > 5 and sorted(first) == sorted(plain)
    assert first == again and first != plain and first != other
