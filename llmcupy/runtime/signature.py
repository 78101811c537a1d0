"""Kernel parameter types and the argument check every launch goes through, on both backends.

CuPy passes a Python ``int`` as a 64-bit value and a Python ``float`` as a double whatever the
kernel's parameter is (cupy issue 8485), so an ``int N`` silently receives garbage in its upper
half on some ABIs, and a ``float`` scale reads the wrong bytes. Every argument is therefore checked
against the kernel's C signature before a launch: count, scalar C type, array dtype,
C-contiguity, const-ness, and alignment of vector pointees (``float4*`` needs 16 bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..sim.compiler import strip_comments

# C scalar spelling -> the NumPy scalar type that must be passed for it.
SCALAR_TYPES = {
    "float": np.float32,
    "double": np.float64,
    "int": np.int32,
    "unsigned int": np.uint32,
    "long": np.int64,
    "long long": np.int64,
    "unsigned long": np.uint64,
    "unsigned long long": np.uint64,
    "short": np.int16,
    "unsigned short": np.uint16,
    "char": np.int8,
    "signed char": np.int8,
    "unsigned char": np.uint8,
    "bool": np.bool_,
    "__half": np.float16,
}

# Pointee spelling -> (element dtype or None for "any", required alignment in bytes).
POINTEE_TYPES = {
    "float": (np.float32, 4),
    "float2": (np.float32, 8),
    "float4": (np.float32, 16),
    "double": (np.float64, 8),
    "double2": (np.float64, 16),
    "int": (np.int32, 4),
    "int2": (np.int32, 8),
    "int4": (np.int32, 16),
    "unsigned int": (np.uint32, 4),
    "long": (np.int64, 8),
    "long long": (np.int64, 8),
    "unsigned long": (np.uint64, 8),
    "unsigned long long": (np.uint64, 8),
    "short": (np.int16, 2),
    "unsigned short": (np.uint16, 2),
    "bool": (np.bool_, 1),
    # the other vector types with CUDA's alignment (a GPU faults on a misaligned uint4 load)
    "float1": (np.float32, 4),
    "float3": (np.float32, 4),
    "double4": (np.float64, 16),
    "int1": (np.int32, 4),
    "int3": (np.int32, 4),
    "uint2": (np.uint32, 8),
    "uint4": (np.uint32, 16),
    "short2": (np.int16, 4),
    "short4": (np.int16, 8),
    "ushort2": (np.uint16, 4),
    "longlong2": (np.int64, 16),
    "ulonglong2": (np.uint64, 16),
    "char4": (None, 4),
    "uchar2": (None, 2),
    "uchar4": (None, 4),
    # cuda_fp16.h / cuda_bf16.h: float16 arrays; NumPy has no bfloat16, so its raw bits as uint16
    # (or ml_dtypes' bfloat16, which CuPy and NumPy can hold)
    "__half": (np.float16, 2),
    "__half2": (np.float16, 4),
    "__nv_bfloat16": (("uint16", "bfloat16"), 2),
    "__nv_bfloat162": (("uint16", "bfloat16"), 4),
    "char": (None, 1),
    "signed char": (None, 1),
    "unsigned char": (None, 1),
    "void": (None, 1),
}

_ALIASES = {
    "unsigned": "unsigned int",
    "signed": "int",
    "signed int": "int",
    "long int": "long",
    "long long int": "long long",
    "unsigned long int": "unsigned long",
    "unsigned long long int": "unsigned long long",
    "size_t": "unsigned long",
    "ptrdiff_t": "long",
    "int64_t": "long",
    "uint64_t": "unsigned long",
    "int32_t": "int",
    "uint32_t": "unsigned int",
    "uint": "unsigned int",
    "half": "__half",
    "half2": "__half2",
    "nv_bfloat16": "__nv_bfloat16",
    "nv_bfloat162": "__nv_bfloat162",
}


_BUILTIN_WORDS = {"int", "float", "double", "char", "short", "long", "unsigned", "signed", "bool", "void"}


class KernelArgumentError(TypeError):
    """An argument does not match the kernel's C signature (names kernel, index and C type)."""


class LaunchBoundsError(KernelArgumentError):
    """A block of more threads than the kernel's ``__launch_bounds__`` allow. Every GPU refuses
    such a launch, so it is a mistake in the launcher; the emulator refuses it too."""


class DeviceLimitError(KernelArgumentError):
    """A launch this device cannot hold: the block needs more registers, or the kernel more shared
    memory, than the device gives one block. A smaller block, or another GPU, may run it."""


@dataclass(frozen=True)
class Param:
    spelling: str  # e.g. "const float*", "int"
    name: str = ""
    size: int = 0  # bytes of a by-value parameter of a type the checks have no dtype for (a struct), if known

    @property
    def is_pointer(self) -> bool:
        return self.spelling.endswith("*")

    @property
    def pointee(self) -> str:
        return self.spelling.rstrip("*").removeprefix("const ").strip()

    @property
    def is_const(self) -> bool:
        return self.spelling.startswith("const ")

    def describe(self) -> str:
        return f"{self.spelling} {self.name}".strip()


def normalize_type(tokens: list[str]) -> str:
    """['float', 'const', '*'] -> 'const float*'; unknown base types are kept as written."""
    stars = tokens.count("*")
    # __grid_constant__ (a const kernel parameter kept in constant memory) changes nothing the caller passes
    words = [t for t in tokens if t not in ("*", "__restrict__", "__restrict", "restrict", "volatile",
                                            "__grid_constant__")]
    const = "const" in words
    words = [w for w in words if w != "const"]
    base = " ".join(words)
    base = _ALIASES.get(base, base)
    return ("const " if const and stars else "") + base + "*" * stars


def _split_params(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip() and p.strip() != "void"]


def parse_param(text: str, substitutions: dict[str, str] | None = None) -> Param:
    text = re.sub(r"=.*$", "", text).strip()  # default arguments
    tokens = re.findall(r"[A-Za-z_]\w*|\*|&", text)
    if "&" in tokens:
        raise ValueError(f"reference parameter {text!r} cannot be passed to a kernel")
    name = ""
    qualifiers = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__", "*"}
    type_words = [t for t in tokens if t not in qualifiers]
    if len(type_words) >= 2 and tokens[-1] not in _BUILTIN_WORDS and tokens[-1] not in qualifiers:
        name = tokens.pop()
    if substitutions:
        tokens = [substitutions.get(t, t) for t in tokens]
        tokens = " ".join(tokens).split()
    return Param(normalize_type(tokens), name)


# __launch_bounds__'s arguments may hold parentheses, two deep: ((BM * BN) / (TM * TN), 1)
# (no trailing \s*: in _SPECIFIERS it would share each space with the repeat's own, and a source with
# many bounds in a row took time doubling with each)
# (and __maxnreg__(n), which stands where __launch_bounds__ may)
_BOUNDS = r"(?:__launch_bounds__|__maxnreg__)\s*\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"


# around __global__, in any order: `__launch_bounds__(256) __global__ void k` is CUDA too
_SPECIFIERS = rf"(?:(?:extern\s+\"C\"|static|{_BOUNDS})\s*)*"


def _kernel_pattern(name: str) -> re.Pattern:
    return re.compile(
        r"(?P<template>template\s*<(?P<tparams>[^{};]*?)>\s*)?"
        rf"{_SPECIFIERS}__global__\s+{_SPECIFIERS}void\s+"
        rf"(?:{_BOUNDS}\s*)*" + re.escape(name) + r"\s*\((?P<params>[^)]*)\)"
    )


def _split_template_args(text: str) -> list[str]:
    return [a.strip() for a in _split_params(text)]


def parse_signature(code: str, name_expression: str) -> list[Param] | None:
    """The parameters of kernel ``name_expression`` (``k`` or ``k<float, 4>``) found in ``code``.

    Returns None when the declaration cannot be found (the caller then reports that no check is
    possible rather than guessing).
    """
    m = re.match(r"\s*&?\s*([A-Za-z_][\w:]*)\s*(?:<(.*)>)?\s*$", name_expression, re.S)
    if not m:
        return None
    base, targs = m.group(1).split("::")[-1], m.group(2)
    found = _kernel_pattern(base).search(strip_comments(code))
    if not found:
        return None
    subs = {}
    if found["template"] and targs is not None:
        names = []
        for tp in _split_template_args(found["tparams"]):
            tp_tokens = re.findall(r"[A-Za-z_]\w*", re.sub(r"=.*$", "", tp))
            names.append(tp_tokens[-1] if tp_tokens else "")
        for tname, value in zip(names, _split_template_args(targs)):
            subs[tname] = value
    return [parse_param(p, subs) for p in _split_params(found["params"])]


def parse_compiled_signature(text: str, source: list[Param] | None = None) -> list[Param]:
    """The emulator's exported spelling ('const float*;int;?12;') -> parameters, named as in ``source``
    (the parameters parsed from the source). A by-value type the emulator has no name for ('?' and
    its size: a struct) takes the source's spelling and keeps its size."""
    spellings = [s for s in text.split(";") if s]
    if not source or len(source) != len(spellings):
        source = [Param("")] * len(spellings)
    params = []
    for spelling, written in zip(spellings, source):
        unnamed = re.fullmatch(r"\?(\d+)", spelling)
        if unnamed:
            params.append(Param(written.spelling or "?", written.name, int(unnamed[1])))
        else:
            params.append(Param(spelling, written.name))
    return params


def _is_device_array(a) -> bool:
    return type(a).__module__.startswith("cupy") and hasattr(a, "data") and hasattr(a, "dtype")


def check_arguments(kernel: str, params: list[Param], args, backend: str) -> list:
    """Validates ``args`` against ``params`` and returns them ready to launch on ``backend``.

    On ``cuda`` arrays stay CuPy arrays and scalars stay NumPy scalars (a null pointer becomes an
    8-byte zero); on ``sim`` every argument becomes a NumPy array or scalar whose bytes the
    emulator reads.
    """
    if not isinstance(args, (tuple, list)):
        # k(grid, block, (x)) is k(grid, block, x): an array would be taken element by element
        listing = ", ".join(p.describe() for p in params)
        raise KernelArgumentError(f"{kernel}: args must be a tuple of its {len(params)} argument(s) ({listing}), "
                                  f"got {type(args).__name__}; a single argument is written (x,)")
    args = tuple(args)
    if len(args) != len(params):
        listing = ", ".join(p.describe() for p in params)
        raise KernelArgumentError(
            f"{kernel}: takes {len(params)} argument(s) ({listing}) but {len(args)} were given"
        )
    prepared = []
    for i, (p, a) in enumerate(zip(params, args)):
        where = f"{kernel}: argument {i} ({p.describe()})"
        if p.is_pointer:
            prepared.append(_check_pointer(where, p, a, backend))
        else:
            prepared.append(_check_scalar(where, p, a))
    return prepared


def _check_scalar(where: str, p: Param, a):
    want = SCALAR_TYPES.get(p.spelling)
    if want is None:
        # a struct passed by value: its bytes are taken as they are, so only their count can be checked
        layout = ("a NumPy structured scalar with the struct's fields, e.g. np.array([(2.0, 10)], "
                  "dtype=np.dtype([('a', np.float32), ('n', np.int32)], align=True))[0] (align=True pads "
                  "the fields as C does)")
        if isinstance(a, np.generic) or isinstance(a, np.ndarray):
            if p.size and a.nbytes != p.size:
                raise KernelArgumentError(f"{where}: the kernel takes {p.size} bytes here, got {a.nbytes} "
                                          f"(np.{a.dtype}); pass a NumPy scalar of that type and size (for a "
                                          f"struct, {layout})")
            return a
        raise KernelArgumentError(f"{where}: cannot pass {type(a).__name__} for C type {p.spelling}; pass a NumPy "
                                  f"scalar of that type (for a struct, {layout})")
    if isinstance(a, (bool, int, float)) and not isinstance(a, np.generic):
        raise KernelArgumentError(
            f"{where}: got a Python {type(a).__name__}; pass np.{np.dtype(want).name}({a!r}). "
            "CuPy would pass a Python int as 64 bits and a float as a double into this "
            f"{np.dtype(want).itemsize * 8}-bit parameter (cupy issue 8485)."
        )
    if not isinstance(a, np.generic):
        raise KernelArgumentError(f"{where}: expected a np.{np.dtype(want).name} scalar, got {type(a).__name__}")
    if a.dtype != np.dtype(want):
        raise KernelArgumentError(f"{where}: expected np.{np.dtype(want).name}, got np.{a.dtype.name}")
    return a


def _check_pointer(where: str, p: Param, a, backend: str):
    if a is None:
        return np.uint64(0) if backend == "cuda" else None
    dtype, align = POINTEE_TYPES.get(p.pointee, (None, 1))
    if backend == "cuda":
        if isinstance(a, np.ndarray):
            raise KernelArgumentError(f"{where}: got a NumPy (host) array; the cuda backend needs a CuPy array")
        if not _is_device_array(a):
            raise KernelArgumentError(f"{where}: expected a CuPy array, got {type(a).__name__}")
        address = a.data.ptr
    else:
        if _is_device_array(a):
            raise KernelArgumentError(f"{where}: got a CuPy (device) array; the sim backend needs a NumPy array")
        if not isinstance(a, np.ndarray):
            raise KernelArgumentError(f"{where}: expected a NumPy array, got {type(a).__name__}")
        if not p.is_const and not a.flags.writeable:
            raise KernelArgumentError(f"{where}: the kernel writes through this pointer but the array is read-only")
        address = a.ctypes.data
    if not a.flags.c_contiguous:
        raise KernelArgumentError(f"{where}: the array is not C-contiguous; pass xp.ascontiguousarray(...)")
    if isinstance(dtype, tuple):   # any of these dtype names (bfloat16: its bits as uint16, or ml_dtypes')
        if a.dtype.name not in dtype:
            raise KernelArgumentError(f"{where}: expected an array of {' or '.join(dtype)}, got {a.dtype.name}")
    elif dtype is not None and a.dtype != np.dtype(dtype):
        raise KernelArgumentError(f"{where}: expected an array of {np.dtype(dtype).name}, got {a.dtype.name}")
    if address % align:
        raise KernelArgumentError(
            f"{where}: address {address:#x} is not {align}-byte aligned, which {p.pointee} loads need"
        )
    return a
