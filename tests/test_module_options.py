"""What the catalogue's modules hand the compiler on a GPU: the hash of its headers (common.cuh,
async_copy.cuh) in the options (CuPy's cache key does not cover files found through -I) and no
cooperative groups where they are unused."""

import hashlib
import re

from llmcupy.runtime import module
from llmcupy.runtime.module import kernels_dir


def test_editing_a_header_changes_the_compile_options(tmp_path, monkeypatch):
    for name in ("common.cuh", "async_copy.cuh", "gelu_forward.cu"):
        (tmp_path / name).write_text((kernels_dir() / name).read_text())
    monkeypatch.setattr(module, "kernels_dir", lambda: tmp_path)
    monkeypatch.setattr(module, "_FILE_MODULES", {})

    def define():
        mod = module.load_kernel_file("gelu_forward.cu")
        (opt,) = [o for o in mod.options if o.startswith("-DLLMCUPY_HEADERS=")]
        return opt

    before = define()
    digest = hashlib.sha256()
    for name in ("async_copy.cuh", "common.cuh"):  # every header, sorted by name
        digest.update(name.encode() + b"\0" + (tmp_path / name).read_bytes())
    assert before == f"-DLLMCUPY_HEADERS={digest.hexdigest()[:16]}"
    seen = {before}
    for name in ("common.cuh", "async_copy.cuh"):
        with open(tmp_path / name, "a") as f:
            f.write("\n#define SOMETHING_NEW 1\n")
        module._FILE_MODULES.clear()
        assert define() not in seen, name
        seen.add(define())


def test_cooperative_groups_only_where_used():
    # the header costs ~1 s of NVRTC per file: common.cuh must not pull it into every file
    assert "#include <cooperative_groups" not in (kernels_dir() / "common.cuh").read_text()
    for path in sorted(kernels_dir().glob("*.cu")):
        code = path.read_text()
        uses = "cg::" in code
        assert ("#include <cooperative_groups.h>" in code) == uses, path.name
        assert ("#include <cooperative_groups/reduce.h>" in code) == ("cg::reduce" in code), path.name
        if uses:  # before common.cuh, so libcu++'s FLT_MAX (CUDA 12.6+) comes first where it exists
            assert code.index("#include <cooperative_groups.h>") < code.index('#include "common.cuh"'), path.name
            assert re.search(r"^namespace cg = cooperative_groups;", code, re.M), path.name
