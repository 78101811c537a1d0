"""Builds a CUDA C source into a shared library the emulator can launch.

The source is compiled unchanged except for line-preserving rewrites (so compiler errors and
deadlock reports point at the right lines of the .cu file):

* ``[static] __shared__ T name[dims];`` (also ``T a[n], b[m];`` and template types with commas)
  becomes a reference to per-block storage that is poisoned
  with 0xFF bytes (NaN for floats) when each block starts (at file scope: an object that looks the
  running block's storage up at every use);
* ``extern __shared__ T name[];`` becomes a pointer to the launch's dynamic shared memory (at file
  scope: an object that does the same at every use);
* ``asm("...")`` statements with a PTX idiom the emulator knows (``%laneid``, ``%warpid``,
  ``%smid``, ``%clock``, ``ld.global.nc``, fences) become the equivalent C++; any other inline PTX
  is refused at compile time with the instruction named;
* a ``warpSize`` NVRTC refuses and g++ takes (its address, a static or namespace-scope variable's
  initializer) becomes an expression that fails to compile, saying why in NVRTC's words.

A source that uses ``volatile`` is compiled with GCC's ThreadSanitizer instrumentation, whose hooks
(defined by the emulator's header, no TSan runtime involved) let a thread yield at every volatile
access: warp-synchronous code on ``volatile`` shared memory then runs in lock-step, and a spin-wait
on a volatile flag makes progress.

Every source is compiled with GCC's ``-fsanitize=float-cast-overflow`` check (handled by the header,
no UBSan runtime): a float-to-integer conversion out of the target's range, where a GPU saturates
and C++ does not, stops the launch with an error naming the line.

``build_library(..., instrument=True)`` compiles the checking variant used by the sanitizers
(racecheck, memcheck, initcheck) and the memory-traffic metrics: the same unit with that
instrumentation everywhere, line tables and ``LLMCUPY_SIM_ACCESS_HOOKS``, so that every load and
store of the kernel reaches the emulator's access observers ("Access hooks" in llmcupy_sim.h). It
is a separate library under its own cache key; plain builds are unchanged.

Kernels inside namespaces are found with their qualified names (``ops::scale``), as CuPy's
``name_expressions`` spell them; ``__constant__`` and ``__device__`` variables get an exported
accessor for ``RawModule.get_global``. When building, both are looked for again in the source as the
preprocessor leaves it (``g++ -E`` with the build's own flags), so one inside a disabled ``#if`` branch
gets no entry point; the library's ``.names`` file lists those it has. The fiber stack a kernel needs is taken from
``-fstack-usage`` and stored next to the library.

For every kernel an ``extern "C"`` entry point is appended; it unpacks a ``void**`` argument array
into the kernel's own parameter types (the compiler checks them) and exports the parameter types
as C spellings, which the runtime uses to check arguments exactly, and the maximum block size of
its ``__launch_bounds__``, which the runtime enforces as a GPU does.

Libraries are cached by the hash of everything that goes into them (source as written, included
files, the emulator's headers, this file's rewrite rules, flags, compiler version), under ``$LLMCUPY_CACHE_DIR/sim`` (default
``~/.cache/llmcupy/sim``). A build writes to a temporary name and renames it into place, so two
processes compiling the same source at once both end up with a complete library.
"""

from __future__ import annotations

import bisect
import difflib
import errno
import functools
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from . import libcuxx

INCLUDE_DIR = Path(__file__).resolve().parent / "include"

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# __launch_bounds__'s arguments may hold parentheses, two deep: ((BM * BN) / (TM * TN), 1)
_BOUNDS_ARGS = r"(?:[^()]|\((?:[^()]|\([^()]*\))*\))*"
_LAUNCH_BOUNDS = re.compile(rf"__launch_bounds__\s*\((?P<args>{_BOUNDS_ARGS})\)")
# what may stand around __global__ before `void`, in any order (NVRTC takes `__launch_bounds__(256)
# __global__ void k` as well as `__global__ void __launch_bounds__(256) k`, and __maxnreg__(n) in the
# same places)
_SPECIFIERS = rf"(?:(?:extern\s+\"C\"|static|__launch_bounds__\s*\({_BOUNDS_ARGS}\)|__maxnreg__\s*\({_BOUNDS_ARGS}\))\s*)*"
_GLOBAL_FN = re.compile(
    r"(?P<template>template\s*<[^{};]*?>\s*)?"
    rf"(?P<before>{_SPECIFIERS})__global__\s+(?P<after>{_SPECIFIERS})void\s+"
    rf"(?:(?:__launch_bounds__\s*\((?P<bounds_after>{_BOUNDS_ARGS})\)|__maxnreg__\s*\({_BOUNDS_ARGS}\))\s*)*"
    r"(?P<name>[A-Za-z_]\w*)\s*\("
)
_INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<([^>]+)>)', re.M)
_EXTERN_SHARED = re.compile(r"\bextern\s+__shared__\b(?P<rest>[^;{}]*?)\b(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*;")
# Shared memory is uninitialised on a GPU, and NVRTC refuses an initializer; the `static thread_local`
# fallback would initialise it once per emulator thread, so such a kernel would run here.
_SHARED_BRACED_INITIALIZER = re.compile(r"(?:\bstatic\s+)?(?<![\w])__shared__\b[^;{}]*=\s*\{[^;]*\}\s*;")
_SHARED_INITIALIZER_REFUSED = (
    'static_assert(llmcupy_sim::always_false<__LINE__>, "a __shared__ variable cannot have an initializer (NVRTC '
    'refuses it too: initializer not allowed for __shared__ variable); assign it in the kernel: '
    'if (threadIdx.x == 0) s = value; __syncthreads();");')
_SHARED = re.compile(r"(?P<static>\bstatic\s+)?(?<![\w])__shared__\b(?P<rest>[^;{}]*);")
# Where a `__shared__` match is no declaration: a string literal (a char literal is matched only so that
# '"' opens none; one after a word character is a digit separator, 1'000), or a preprocessor directive
# line (`#define SHARED __shared__`) the match runs past, into the code after it.
_NOT_DECLARATION = re.compile(r""""(?:\\.|[^"\\\n])*"|(?<![\w'])'(?:\\[^'\n]+|[^'\\\n])'"""
                              r"|^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_ALIGN = re.compile(r"\b(?:__align__|alignas|__attribute__)\s*\(")
_MORE_DECLARATOR = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]+\]\s*)*)$")
_DECLARATOR = re.compile(r"^(?P<type>.*?[\w>*&])\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]+\]\s*)*)$", re.S)
_DEVICE_VAR = re.compile(
    r"\b(?:__constant__|__device__|__managed__)\b(?P<rest>[^;{}()]*?)\b(?P<name>[A-Za-z_]\w*)\s*"
    r"(?:\[[^\]]*\]\s*)*(?:=[^;]*)?;"
)
_ASM = re.compile(r"\b(?:asm|__asm__|__asm)\b\s*(?:(?:volatile|__volatile__)\s*)?\(")
_VOLATILE = re.compile(r"\bvolatile\b")


def _blank(m: re.Match) -> str:
    text = m.group(0)
    return " " * len(text) if "\n" not in text else re.sub(r"[^\n]", " ", text)


@functools.lru_cache(maxsize=64)
def blank_comments(code: str) -> str:
    """The source with every comment replaced by spaces (newlines kept): same length, same lines."""
    return _COMMENT.sub(_blank, code)


def _matching(text: str, open_pos: int) -> int:
    """Index just past the parenthesis that closes the one at ``open_pos`` (strings respected)."""
    depth, i, n = 0, open_pos, len(text)
    while i < n:
        ch = text[i]
        if ch == '"' or ch == "'":
            j = i + 1
            while j < n and text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _strip_attributes(text: str) -> str:
    """Removes ``__align__(...)``, ``alignas(...)`` and ``__attribute__((...))`` from a declaration."""
    while True:
        m = _ALIGN.search(text)
        if not m:
            return text
        end = _matching(text, m.end() - 1)
        text = text[:m.start()] + " " + text[end:]


class _Scopes:
    """Brace structure of a (comment-blanked) source: for a position, is it inside a function or
    class body, and which namespaces enclose it."""

    _OPENER = re.compile(r"(?:\bnamespace\s*(?P<ns>[\w:]*)\s*|\bextern\s*\"C\"\s*)$")

    def __init__(self, text: str):
        self.positions: list[int] = []  # every brace, with the stack of scopes after it
        self.stacks: list[list[tuple[str, str]]] = []
        self.innermost: list[int] = []  # and the innermost '{' still open after it (-1: none)
        stack: list[tuple[str, str]] = []
        opened: list[int] = []
        for m in re.finditer(r"[{}]", text):
            i = m.start()
            if text[i] == "{":
                before = text[max(0, i - 200):i]
                found = self._OPENER.search(before) if ("namespace" in before or "extern" in before) else None
                stack = stack + [("ns", found["ns"] or "") if found else ("code", "")]
                opened.append(i)
            else:
                stack = stack[:-1]
                if opened:
                    opened.pop()
            self.positions.append(i)
            self.stacks.append(stack)
            self.innermost.append(opened[-1] if opened else -1)

    def at(self, pos: int) -> list[tuple[str, str]]:
        k = bisect.bisect_right(self.positions, pos) - 1
        return self.stacks[k] if k >= 0 else []

    def file_scope(self, pos: int) -> bool:
        return all(kind == "ns" for kind, _ in self.at(pos))

    def namespace(self, pos: int) -> str:
        return "::".join(name for kind, name in self.at(pos) if kind == "ns" and name)

    def enclosing_brace(self, pos: int) -> int:
        """Index of the innermost '{' still open just before ``pos`` (-1: none)."""
        k = bisect.bisect_left(self.positions, pos) - 1
        return self.innermost[k] if k >= 0 else -1


def _same_lines(original: str, replacement: str) -> str:
    return replacement + "\n" * original.count("\n")


class SimCompileError(RuntimeError):
    """g++ rejected the source; the message carries the compiler's diagnostics."""


def strip_comments(code: str) -> str:
    """Replaces comments by the same number of newlines, so line numbers survive."""
    return _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n") or " ", code)


def _declarations(blanked: str):
    """A test ``is_declaration(match)`` for a ``__shared__`` match in the comment-blanked text: false
    when it starts inside a string literal, or inside a preprocessor directive and ends past it."""
    spans = [(m.start(), m.end(), m.group(0).lstrip().startswith("#")) for m in _NOT_DECLARATION.finditer(blanked)]
    starts = [s[0] for s in spans]

    def is_declaration(m: re.Match) -> bool:
        i = bisect.bisect_right(starts, m.start()) - 1
        if i < 0 or m.start() >= spans[i][1]:
            return True
        start, end, directive = spans[i]
        return directive and m.end() <= end

    return is_declaration


def _edit(code: str, blanked: str, pattern: re.Pattern, fn) -> tuple[str, str]:
    """Applies ``fn(match) -> replacement or None`` to the matches of ``pattern`` in the blanked
    text, editing the original and the blanked text at the same positions."""
    out, out_b, last = [], [], 0
    for m in pattern.finditer(blanked):
        new = fn(m)
        if new is None:
            continue
        new = _same_lines(m.group(0), new)
        out.append(code[last:m.start()] + new)
        out_b.append(blanked[last:m.start()] + new)
        last = m.end()
    out.append(code[last:])
    out_b.append(blanked[last:])
    return "".join(out), "".join(out_b)


def _split_declarators(decl: str) -> list[str]:
    """A declaration split at its top-level commas (template arguments and array bounds kept whole)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(decl):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(decl[start:i])
            start = i + 1
    parts.append(decl[start:])
    return parts


def rewrite_shared(code: str) -> str:
    """Line-preserving rewrite of ``__shared__`` declarations (see the module docstring)."""
    blanked = blank_comments(code)
    scopes = _Scopes(blanked)

    def dynamic(m: re.Match) -> str:
        ctype = " ".join(_strip_attributes(m["rest"]).split())
        if not ctype:
            return None
        if scopes.file_scope(m.start()):
            return f"llmcupy_sim::FileDynamicShared<{ctype}> {m['name']};"
        return f"{ctype}* {m['name']} = llmcupy_sim::dynamic_shared<{ctype}>();"

    code, blanked = _edit(code, blanked, _EXTERN_SHARED, dynamic)
    is_declaration = _declarations(blanked)
    code, blanked = _edit(code, blanked, _SHARED_BRACED_INITIALIZER,
                          lambda m: _SHARED_INITIALIZER_REFUSED if is_declaration(m) else None)
    scopes = _Scopes(blanked)
    counter = iter(range(1_000_000))
    newlines = [m.start() for m in re.finditer("\n", blanked)]
    is_declaration = _declarations(blanked)

    def static(m: re.Match) -> str:
        if not is_declaration(m):
            return None
        decl = " ".join(_strip_attributes(m["rest"]).split())
        if re.search(r"(?<![=!<>])=(?!=)", re.sub(r"\[[^\]]*\]", "", decl)):
            return _SHARED_INITIALIZER_REFUSED
        # `__shared__ float a[32], b[32];` declares one array per declarator, each with its own storage
        parts = _split_declarators(decl)
        d = _DECLARATOR.match(parts[0].strip())
        more = [_MORE_DECLARATOR.match(p) for p in parts[1:]]
        # extern, pointer declarators: left to the `static thread_local` fallback
        if not d or not all(more) or d["type"].strip() in ("", "extern"):
            return None
        line = bisect.bisect_left(newlines, m.start()) + 1
        out = []
        for name, dims in [(d["name"], d["dims"])] + [(x["name"], x["dims"]) for x in more]:
            ctype = f"{d['type'].strip()}{' '.join(dims.split())}"
            ident = next(counter)
            if scopes.file_scope(m.start()):
                out.append(f'llmcupy_sim::FileShared<{ctype}, {ident}> {name}{{"{name}", {line}}};')
            else:
                out.append(f'auto& {name} = llmcupy_sim::shared_var<{ctype}, {ident}>("{name}", {line});')
        return " ".join(out)

    code, _ = _edit(code, blanked, _SHARED, static)
    return code


def global_kernel_names(code: str) -> list[str]:
    """Names of the non-template ``__global__`` functions, qualified by their namespaces
    (templates need name expressions)."""
    blanked = blank_comments(code)
    scopes = _Scopes(blanked) if "namespace" in blanked else None
    names = []
    for m in _GLOBAL_FN.finditer(blanked):
        if m["template"]:
            continue
        ns = scopes.namespace(m.start()) if scopes else ""
        name = f"{ns}::{m['name']}" if ns and "extern \"C\"" not in m.group(0) else m["name"]
        if name not in names:
            names.append(name)
    return names


def global_function_names(code: str) -> list[str]:
    """Names of every ``__global__`` function, templates included, unqualified."""
    names = []
    for m in _GLOBAL_FN.finditer(blank_comments(code)):
        if m["name"] not in names:
            names.append(m["name"])
    return names


def undefined_kernel_names(code: str) -> list[str]:
    """The non-template kernels (named as ``global_kernel_names`` names them) that the source declares
    (``__global__ void k(float*);``) and never defines. NVRTC compiles such a source (12.4, 12.9 and 13.5)
    and its module has no such kernel: on a GPU, CuPy's get_function fails for it, and only for it."""
    blanked = blank_comments(code)
    defined, declared = set(), []
    for m in _GLOBAL_FN.finditer(blanked):
        if m["template"]:
            continue
        after = blanked[_matching(blanked, m.end() - 1):].lstrip()
        if after.startswith("{"):
            defined.add(m["name"])
        elif after.startswith(";"):
            declared.append(m["name"])
    return [name for name in global_kernel_names(code)
            if name.rpartition("::")[2] in declared and name.rpartition("::")[2] not in defined]


def launch_bounds(code: str) -> dict[str, tuple[str, str]]:
    """The maximum block size each kernel declares with ``__launch_bounds__``, as the C expression
    written there (``256``, ``16 * 16``, a macro, ``BM * BN / (TM * TN)``), by unqualified name, with
    a template kernel's ``template <...>`` header ('' for a plain kernel). A GPU refuses a launch with
    more threads; the entry points built here evaluate the expression with the source's own macros
    (a template's with the instance's arguments) so the emulator refuses it too."""
    found = {}
    for m in _GLOBAL_FN.finditer(blank_comments(code)):
        declared = _LAUNCH_BOUNDS.search(m["before"] + " " + m["after"])
        text = declared["args"] if declared else m["bounds_after"]
        header = " ".join((m["template"] or "").split())
        # a header the lazy match cut short (a '>' inside a default argument) cannot be reused
        if text is not None and m["name"] not in found and header.count("<") == header.count(">"):
            found[m["name"]] = (header, _split_top(text, ",")[0].strip())
    return found


def _device_variable_definitions(code: str):
    """(qualified name, line, whether __constant__) of each file-scope ``__constant__`` / ``__device__``
    variable definition, in source order."""
    blanked = blank_comments(code)
    matches = list(_DEVICE_VAR.finditer(blanked))
    scopes = _Scopes(blanked) if matches else None
    for m in matches:
        before = blanked[max(0, m.start() - 40):m.start()]
        if (not scopes.file_scope(m.start()) or re.search(r"\b(?:template|typedef|using|extern)\b", m["rest"])
                or re.search(r"\bextern\s*(?:\"C\"\s*)?$", before)):
            continue  # a declaration of a variable defined elsewhere has no storage here

        ns = scopes.namespace(m.start())
        yield (f"{ns}::{m['name']}" if ns else m["name"], blanked.count("\n", 0, m.start()) + 1,
               "__constant__" in m.group(0))


def define_extern_variables(code: str) -> str:
    """The source with ``extern`` dropped from each file-scope ``extern __device__`` (``__constant__``)
    variable that no definition of the source defines: NVRTC compiles a source as a whole program and takes
    such a declaration for a definition (12.4, 12.9 and 13.5: 'warning #20044-D: extern declaration of the
    entity g is treated as a static definition'), so on a GPU the kernel reads a zero-initialised variable;
    here the library would otherwise fail to load ('undefined symbol: g'). Same length, same lines."""
    if "extern" not in code:
        return code
    blanked = blank_comments(code)
    defined = {name.rpartition("::")[2] for name, _, _ in _device_variable_definitions(code)}
    matches = list(_DEVICE_VAR.finditer(blanked))
    scopes = _Scopes(blanked) if matches else None
    starts = []
    for m in matches:
        if m["name"] in defined or not scopes.file_scope(m.start()) or re.search(r"\b(?:template|typedef|using)\b",
                                                                                 m["rest"]):
            continue
        inside = re.search(r"\bextern\b(?!\s*\")", m["rest"])
        before = re.search(r"\bextern(?=\s*$)", blanked[max(0, m.start() - 40):m.start()])
        if inside:
            starts.append(m.start("rest") + inside.start())
        elif before:
            starts.append(max(0, m.start() - 40) + before.start())
    for start in reversed(starts):
        code = code[:start] + " " * len("extern") + code[start + len("extern"):]
    return code


def device_variables(code: str) -> list[str]:
    """Qualified names of the file-scope ``__constant__`` / ``__device__`` variables."""
    names = []
    for name, _, _ in _device_variable_definitions(code):
        if name not in names:
            names.append(name)
    return names


# A GPU holds a module's __constant__ variables in one 64 KiB bank (ptxas: "N bytes cmem[3]"); past it
# NVRTC fails the compile, and the emulator, which keeps them in ordinary memory, refuses it as well.
_CONSTANT_BANK_BYTES = 64 * 1024


def _constant_bank_check(code: str, filename: str) -> str:
    """A static_assert on the bytes of the source's __constant__ variables, placed (#line) at the first
    one's declaration ('' for none). Their sizes without the padding ptxas may put between them: what
    NVRTC compiles is never refused (its order of the variables is its own)."""
    seen, first = [], 0
    for name, line, constant in _device_variable_definitions(code):
        if constant and name not in seen:
            seen.append(name)
            first = first or line
    if not seen:
        return ""
    names = ", ".join(seen)
    total = " + ".join(f"sizeof({name})" for name in seen)
    return (f'#line {first} "{filename}"\n'
            f'static_assert({total} <= {_CONSTANT_BANK_BYTES}ull, "the __constant__ variables ({names}) '
            f'hold more than the 64 KiB (65536 bytes) of a GPU\'s constant bank (NVRTC refuses it too: ptxas reports '
            f'the bytes as cmem[3] and the compile fails); keep a large table in global memory: pass it as a '
            f'const pointer argument");\n')


# --- warpSize where NVRTC refuses it ----------------------------------------------------------------

# warpSize is a built-in variable under NVRTC: a run-time value in a register. The header's stand-in
# (an int with a run-time initializer) makes g++ refuse it where a constant is needed; these are the
# uses g++ takes and NVRTC refuses (measured with NVRTC 12.4, 12.9 and 13.5, tests/test_nvrtc_parity.py):
# its address, and the initializer of a variable that is initialised once, before any thread runs (a
# namespace-scope variable, which is a __device__ variable under CuPy's --device-as-default-execution-
# space, or a static one). The warpSize there becomes an expression that fails to compile with NVRTC's
# meaning (same value, same line).
_WARP_SIZE_REFUSALS = {
    "address": 'cannot take the address of warpSize (NVRTC refuses it too: cannot take address of builtin variable '
               '\\"warpSize\\"): a GPU keeps it in a register; copy it first (int w = warpSize;) and take &w',
    "static": "a static variable cannot be initialized from warpSize (NVRTC refuses it too: dynamic initialization "
              "is not supported for a function-scope static __device__ variable); drop the static (int w = "
              "warpSize;), or write a constant of your own: constexpr int WARP_SIZE = 32;",
    "namespace": "a variable at namespace scope cannot be initialized from warpSize (NVRTC refuses it too: dynamic "
                 "initialization is not supported for a __device__ variable); read warpSize inside the kernel, or "
                 "write a constant of your own: constexpr int WARP_SIZE = 32;",
}
_WARP_SIZE = re.compile(r"\bwarpSize\b")
# a static variable's declaration up to its initializer: `static const int w = `, `static int a[2] = {`
_STATIC_INITIALIZER = re.compile(r"\bstatic\s+[\w:<>,\s*&]*?\b[A-Za-z_]\w*\s*(?:\[[^\]]*\]\s*)*(?:=\s*\{?|\{)"
                                 r"(?P<init>[^;{}]*)")
# an operand that only asks for warpSize's type or size: a constant, which NVRTC takes anywhere
_UNEVALUATED = re.compile(r"\b(?:sizeof|decltype|alignof|noexcept)\s*\(?\s*$")


def _opens_aggregate(text: str, brace: int) -> bool:
    """Does the '{' at ``brace`` open a struct, class or union body (its head, back to the last ';', brace
    or parenthesis, names one)?"""
    head = max(text.rfind(c, 0, brace) for c in ";{}()") + 1
    return bool(re.search(r"\b(?:struct|class|union)\b", text[head:brace]))


def _warp_size_refusal(text: str, pos: int, scopes: "_Scopes", statics: list) -> str | None:
    """Which of _WARP_SIZE_REFUSALS the warpSize at ``pos`` of the blanked ``text`` meets, or None.
    ``statics`` holds _STATIC_INITIALIZER's matches as (start, end, start of the initializer), in order.
    Each question looks back a few characters only, not over the whole source: a file has many warpSizes."""
    def skip_back(i: int, chars: str = "") -> int:
        while i > 0 and (text[i - 1].isspace() or text[i - 1] in chars):
            i -= 1
        return i

    amp = skip_back(pos, "(")   # &(warpSize)
    if amp > 0 and text[amp - 1] == "&" and (amp < 2 or text[amp - 2] != "&"):
        rest = skip_back(amp - 1)
        word_start = rest
        while word_start > 0 and (text[word_start - 1].isalnum() or text[word_start - 1] == "_"):
            word_start -= 1
        word = text[word_start:rest]
        # a unary '&' follows an operator or punctuation, or `return`; a binary one follows an operand
        if rest == 0 or text[rest - 1] not in ")]" and not (word and word not in ("return", "case", "throw")):
            return "address"
    if _UNEVALUATED.search(text, max(0, pos - 200), pos):
        return None
    # the matches do not overlap: only the last one starting before pos can hold it
    k = bisect.bisect_right(statics, (pos, math.inf, math.inf)) - 1
    for start, end, init_start in statics[max(k, 0):k + 1]:
        if init_start <= pos < end:
            if re.search(r"\bconstexpr\b", text[start:init_start]):
                return None   # g++ refuses it as a constant expression (_WARP_SIZE_NOT_CONSTANT says why)
            if scopes.file_scope(start):
                return "namespace"
            # a static data member's initializer (struct S { static const int w = warpSize; }) needs a
            # constant, and g++ already refuses it
            return None if _opens_aggregate(text, scopes.enclosing_brace(start)) else "static"
    if not scopes.file_scope(pos):
        return None
    statement = text[max(text.rfind(";", 0, pos), text.rfind("}", 0, pos), text.rfind("{", 0, pos)) + 1:pos]
    if re.search(r"\b(?:template|using|typedef|constexpr)\b", statement):
        return None
    depth = 0
    for i, ch in enumerate(statement):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif (ch == "=" and depth == 0 and statement[i + 1:i + 2] != "=" and
              (i == 0 or statement[i - 1] not in "=!<>+-*/%&|^")):
            return "namespace"   # `const int W = warpSize;`, not a default argument `int f(int w = warpSize)`
    return None


def rewrite_warp_size(code: str) -> str:
    """Line-preserving: each warpSize NVRTC refuses (_WARP_SIZE_REFUSALS) becomes a lambda that reads it
    and fails to compile, saying why."""
    if "warpSize" not in code:
        return code
    text = _LITERAL.sub(lambda m: " " * len(m.group(0)), blank_comments(code))
    scopes = _Scopes(text)
    statics = [(m.start(), m.end(), m.start("init")) for m in _STATIC_INITIALIZER.finditer(text)]
    out, last = [], 0
    for m in _WARP_SIZE.finditer(text):
        why = _warp_size_refusal(text, m.start(), scopes, statics)
        if why is None:
            continue
        out.append(code[last:m.start()] + '([]() -> const int& { static_assert(llmcupy_sim::always_false<__LINE__>, '
                   f'"{_WARP_SIZE_REFUSALS[why]}"); return ::warpSize; }}())')
        last = m.end()
    out.append(code[last:])
    return "".join(out)


# --- variables initialized before any thread runs -------------------------------------------------

# A __device__ or __constant__ variable at namespace scope, and a static local, are initialized once,
# before the kernel runs; NVRTC takes only a constant initializer for them ("dynamic initialization is
# not supported for a __device__ variable", "... for a function-scope static __device__ variable"), where
# g++ would run any code at load or first use. Each gets C++20's constinit (GCC's __constinit in any -std,
# clang's attribute), so g++ refuses what NVRTC refuses; _unsupported_features says why in NVRTC's words. So does
# a namespace-scope variable without __device__ (_unmarked_file_scope_variables). A call of the C library's math,
# expf(1.0f), is no constant either: GPU_LANGUAGE_FLAGS keeps g++ from folding it into one.
_STATIC_SPECIFIER = re.compile(r"\bstatic\s+")
_NOT_CONSTANT_INITIALIZER = re.compile(r"does not have a constant initializer")
# isnan, isinf, isfinite and signbit of a __half or __nv_bfloat16, which llmcupy_sim_half.h deletes (g++'s words,
# then clang's)
_HALF_CLASSIFICATION = re.compile(r"error: (?:use of deleted function .int (isnan|isinf|isfinite|signbit)"
                                  r"\((__half|__nv_bfloat16)\).|call to deleted function .(isnan|isinf|isfinite|signbit).)")


# Under CuPy's --device-as-default-execution-space a namespace-scope variable written without __device__ is a
# __device__ variable too, and NVRTC refuses its run-time initializer in the same words (`float g = f();`,
# `Counter c;` with a constructor that is not constexpr; NVRTC 12.4, 12.9 and 13.5). Such a definition is a
# statement at namespace scope whose declarator part (before any '=') holds no parenthesis or brace.
_NOT_A_VARIABLE = re.compile(r"\b(?:typedef|using|template|namespace|extern|static_assert|friend|struct|class|union|"
                             r"enum|asm|__asm__|operator|constexpr|constinit|consteval|thread_local|__device__|"
                             r"__constant__|__shared__|__managed__|warpSize|LLMCUPY_SIM_CONSTANT_INIT)\b")
_DECLARATOR_END = re.compile(r"[A-Za-z_]\w*\s*(?:\[[^\]]*\]\s*)*$")
_PREPROCESSOR_LINE = re.compile(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*")


def _unmarked_file_scope_variables(text: str, scopes: "_Scopes") -> list[int]:
    """Where each namespace-scope variable definition without __device__ starts, in the comment- and
    literal-blanked ``text``."""
    # a macro of the source's own standing for __constant__, ... (#define TABLE __constant__) marks its variables
    marking = re.findall(r"(?m)^[ \t]*#[ \t]*define[ \t]+(\w+)\b[^\n]*\b(?:__device__|__constant__|__shared__|"
                         r"__managed__)\b", text)
    marked = re.compile(rf"\b(?:{'|'.join(marking)})\b") if marking else None
    text = _PREPROCESSOR_LINE.sub(_blank, text)
    starts, start = [], 0
    for m in re.finditer(r"[;{}]", text):
        i, ch = m.start(), m.group(0)
        if ch == "{":
            if scopes.file_scope(i):
                start = i + 1   # a namespace's or extern "C"'s body
            continue
        if ch == "}":
            opener = scopes.enclosing_brace(i)
            if (scopes.file_scope(i) and opener >= 0 and text[max(0, opener - 200):opener].rstrip()[-1:] != "="
                    and not _opens_aggregate(text, opener) and not re.search(r"\benum\b", text[max(0, opener - 200):opener])):
                start = i + 1   # the end of a function's or namespace's body, not of an initializer or a class
            continue
        if not scopes.file_scope(i):
            continue
        statement = text[start:i]
        start = i + 1
        head = statement.split("=")[0]
        words = head.split()
        if (len(words) < 2 or re.search(r"[(){}]", head) or head.lstrip().startswith("[")
                or _NOT_A_VARIABLE.search(head) or (marked and marked.search(head)) or "warpSize" in statement
                or not _DECLARATOR_END.search(head.rstrip())):
            continue
        starts.append(i - len(statement.lstrip()))
    return starts


def rewrite_constant_initialization(code: str) -> str:
    """Line-preserving: ``LLMCUPY_SIM_CONSTANT_INIT`` (llmcupy_sim.h) before each namespace-scope
    __device__/__constant__ variable definition and after each function-scope ``static``."""
    text = _LITERAL.sub(lambda m: " " * len(m.group(0)), blank_comments(code))
    if ";" not in text:
        return code
    scopes = _Scopes(text)
    inserts = []

    def declaration(start: int) -> str:
        end = text.find(";", start)
        return text[start:end if end >= 0 else len(text)]

    for m in _DEVICE_VAR.finditer(text):
        before = text[max(0, m.start() - 40):m.start()]
        if (not scopes.file_scope(m.start()) or re.search(r"\b(?:template|typedef|using|extern|constexpr)\b", m["rest"])
                or re.search(r"\b(?:extern\s*(?:\"C\"\s*)?|constexpr\s+)$", before) or "warpSize" in m.group(0)):
            continue   # a declaration without storage, a constant already, or warpSize's own refusal
        inserts.append(m.start())
    inserts += _unmarked_file_scope_variables(text, scopes)
    for m in _STATIC_SPECIFIER.finditer(text):
        decl = declaration(m.end())
        if scopes.file_scope(m.start()) or re.match(r"(?:__shared__|thread_local|constexpr|inline)\b", decl):
            continue
        if re.search(r"\b(?:constexpr|__shared__)\b", decl.split("=")[0]) or "warpSize" in decl:
            continue
        if _opens_aggregate(text, scopes.enclosing_brace(m.start())):
            continue   # a static data member: in-class initializers must be constant already
        inserts.append(m.end())
    out, last = [], 0
    for pos in sorted(set(inserts)):
        out.append(code[last:pos] + "LLMCUPY_SIM_CONSTANT_INIT ")
        last = pos
    out.append(code[last:])
    return "".join(out)


# --- C++ that NVRTC refuses in device code --------------------------------------------------------

# Words g++ takes and NVRTC refuses (measured with NVRTC 12.4, 12.9 and 13.5, tests/test_nvrtc_parity.py),
# by word: (NVRTC's words, what to do). Each one the source writes gets a `#pragma GCC error` at its place,
# so the refusal names the line and, being the preprocessor's, skips code NVRTC does not see either
# (#ifndef __CUDACC_RTC__). Exceptions and RTTI need no word list: the emulator compiles with
# -fno-exceptions -fno-rtti (_unsupported_features words g++'s refusal).
_REFUSED_WORDS = {
    "thread_local": ("cannot use thread_local specifier for variable declarations in device code",
                     "a GPU thread has no thread-local storage beyond its locals: keep the value in a local "
                     "variable, or in an array indexed by thread"),
    "__int128": ('128-bit integer type is only supported in Linux with the "--device-int128" flag in NVRTC',
                 "pass the option --device-int128 (NVRTC and the emulator take it), or use unsigned long long "
                 "with __umul64hi"),
    "__float128": ('128-bit floating point type is only supported in Linux with the "--device-float128" flag in '
                   "NVRTC", "use double (NVRTC takes --device-float128 for sm_100 and newer only)"),
}

# GCC's builtins and GNU keywords that g++ takes in any C++ and NVRTC does not know (NVRTC 12.4, 12.9 and 13.5:
# 'identifier "__builtin_popcount" is undefined'; measured row by row in tests/test_nvrtc_parity.py, BUILTINS).
# Refused where the kernel's source writes one, as _REFUSED_WORDS are: never in a header of the emulator or of
# libcu++, which use them freely (and whose macros, such as INFINITY, expand to some in the kernel's source).
# NVRTC does take __builtin_expect, __builtin_assume, __builtin_assume_aligned, __builtin_unreachable,
# __builtin_bit_cast, __builtin_addressof, __builtin_is_constant_evaluated, __builtin_isnan, __builtin_isinf,
# __builtin_isfinite and __builtin_copysign(f); and from 12.9 on __builtin_FILE, __builtin_LINE, __builtin_FUNCTION.
_BUILT_IN_MATH = "the math functions are built in: drop __builtin_ (sqrtf, expf, fabsf, ...)"
_ATOMICS = "CUDA's atomic functions are built in (atomicAdd, atomicCAS, atomicExch, ...), or include <cuda/std/atomic>"
_MATH_FUNCTIONS = """acos acosh asin asinh atan atan2 atanh cbrt ceil cos cosh erf erfc exp exp10 exp2 expm1 fabs fdim
    floor fma fmax fmin fmod hypot ldexp lgamma log log10 log1p log2 logb nearbyint nextafter pow remainder rint
    round sin sinh sqrt tan tanh tgamma trunc""".split()
BUILTINS_NVRTC_LACKS = {
    **dict.fromkeys(("__builtin_popcount", "__builtin_popcountl", "__builtin_popcountll"),
                    "write __popc(x), or __popcll(x) for 64 bits"),
    **dict.fromkeys(("__builtin_clz", "__builtin_clzl", "__builtin_clzll"), "write __clz(x), or __clzll(x) for 64 bits"),
    **dict.fromkeys(("__builtin_ctz", "__builtin_ctzl", "__builtin_ctzll"),
                    "write __ffs(x) - 1, or __ffsll(x) - 1 for 64 bits (x != 0)"),
    **dict.fromkeys(("__builtin_ffs", "__builtin_ffsl", "__builtin_ffsll"), "write __ffs(x), or __ffsll(x) for 64 bits"),
    **dict.fromkeys(("__builtin_parity", "__builtin_parityl", "__builtin_parityll"),
                    "write __popc(x) & 1, or __popcll(x) & 1 for 64 bits"),
    **dict.fromkeys(("__builtin_bswap16", "__builtin_bswap32", "__builtin_bswap64"),
                    "write __byte_perm(x, 0, 0x0123), which reverses the 4 bytes of x (__byte_perm(x, 0, 0x4401) the "
                    "low 2); for 64 bits, reverse each half and swap them"),
    **dict.fromkeys(("__builtin_memcpy", "__builtin_memset"), "memcpy() and memset() are built in: drop __builtin_"),
    **dict.fromkeys(("__builtin_memcmp", "__builtin_strlen"), "write the loop, or call cuda::std::memcmp or "
                                                              "cuda::std::strlen after including <cuda/std/cstring>"),
    "__builtin_trap": "write __trap(), or assert()",
    "__builtin_launder": "drop it: use the pointer itself",
    "__builtin_offsetof": "write offsetof after including <cuda/std/cstddef> (NVRTC 13.5 alone has __builtin_offsetof)",
    "__builtin_constant_p": "drop it (NVRTC 13.5 alone has it); __builtin_is_constant_evaluated() is built in",
    **dict.fromkeys(("__builtin_add_overflow", "__builtin_sub_overflow", "__builtin_mul_overflow"),
                    "compute in a wider type and compare (NVRTC 13.5 alone has these), or __umulhi / __umul64hi for "
                    "the high bits of a product"),
    **dict.fromkeys(("__builtin_inff", "__builtin_huge_valf"),
                    "write CUDART_INF_F from <math_constants.h>, or INFINITY after including <cuda/std/cmath>"),
    **dict.fromkeys(("__builtin_inf", "__builtin_huge_val"), "write CUDART_INF from <math_constants.h>"),
    "__builtin_nanf": "write CUDART_NAN_F from <math_constants.h>, or NAN after including <cuda/std/cmath>",
    "__builtin_nan": "write CUDART_NAN from <math_constants.h>",
    "__builtin_signbit": "signbit() is built in: drop __builtin_",
    "__builtin_abs": "abs() is built in: drop __builtin_",
    **{f"__builtin_{name}{suffix}": _BUILT_IN_MATH for name in _MATH_FUNCTIONS for suffix in ("", "f")},
    **dict.fromkeys(("__builtin_isnormal", "__builtin_fpclassify"),
                    "write cuda::std::isnormal or cuda::std::fpclassify after including <cuda/std/cmath>"),
    **dict.fromkeys(("__builtin_isless", "__builtin_isunordered"), "compare with <, or test isnan()"),
    "__builtin_prefetch": "drop it: a GPU thread has no prefetch hint for it (load the data into shared memory "
                          "first, or use cuda::memcpy_async)",
    "__builtin_alloca": "use a local array of a constant size, malloc(), or dynamic shared memory",
    **dict.fromkeys(("__builtin_frame_address", "__builtin_return_address"),
                    "drop it: device code has no use for the stack's addresses"),
    "__builtin_shuffle": "CUDA's vector types (float4, int4, ...) are structs: build the result from .x, .y, .z, .w "
                         "(__shfl_sync shuffles across a warp's threads)",
    **dict.fromkeys(("__builtin_va_list", "__builtin_va_start", "__builtin_va_arg", "__builtin_va_end"),
                    "write a variadic template (template <class... T>), which NVRTC takes"),
    **dict.fromkeys(("__sync_fetch_and_add", "__sync_fetch_and_sub", "__sync_fetch_and_or", "__sync_fetch_and_and",
                     "__sync_add_and_fetch", "__sync_val_compare_and_swap", "__sync_bool_compare_and_swap",
                     "__sync_lock_test_and_set"), _ATOMICS),
    "__sync_synchronize": "write __threadfence()",
    **dict.fromkeys(("__atomic_fetch_add", "__atomic_fetch_sub", "__atomic_fetch_or", "__atomic_fetch_and",
                     "__atomic_add_fetch", "__atomic_load_n", "__atomic_store_n", "__atomic_exchange_n",
                     "__atomic_compare_exchange_n", "__atomic_thread_fence"), _ATOMICS),
    **dict.fromkeys(("__ATOMIC_RELAXED", "__ATOMIC_ACQUIRE", "__ATOMIC_RELEASE", "__ATOMIC_ACQ_REL",
                     "__ATOMIC_SEQ_CST"), "write cuda::std::memory_order_relaxed, ... after including "
                                         "<cuda/std/atomic>"),
    "__typeof__": "write decltype",
    "__typeof": "write decltype",
    "__extension__": "drop it",
    "__label__": "drop it, and give each label a name of its own in the function",
    **dict.fromkeys(("_Complex", "__complex__", "__real__", "__imag__"),
                    "use cuda::std::complex after including <cuda/std/complex> (.real(), .imag())"),
}
# `__attribute__((vector_size(16)))`: NVRTC warns 'unknown attribute "vector_size"' and drops it, so the type is
# its element type there ('too many initializer values' at the first {1, 2, 3, 4})
_VECTOR_SIZE = re.compile(r"\b__attribute__\s*\(\((?:[^()]|\([^()]*\))*?\b(?P<word>(?:__)?vector_size(?:__)?)\s*\(")
_VECTOR_SIZE_REFUSAL = (
    "__attribute__((vector_size)) is not available in device code (NVRTC ignores it, 'unknown attribute "
    "\"vector_size\"', and the type is its element type there); use CUDA's vector types (float4, int4, ..., "
    "make_float4), which are structs with .x, .y, .z, .w")
# a candidate for BUILTINS_NVRTC_LACKS (one pass over the source, not one per name)
_GNU_WORD = re.compile(r"\b(?:__builtin_|__sync_|__atomic_|__ATOMIC_|__typeof|__extension__|__label__|_Complex|"
                       r"__complex__|__real__|__imag__)\w*")


# A lambda annotated __device__ or __host__ (`[] __device__ (float x) {...}`): NVRTC 12 asks for nvcc's
# --extended-lambda, which NVRTC itself does not take, and NVRTC 13 calls it not allowed in JIT mode. The
# `]` closes a capture list, not an attribute (`[[nodiscard]] __device__ int f()`).
_ANNOTATED_LAMBDA = re.compile(r"(?<!\])\]\s*(?:__host__|__device__)\b")
_LAMBDA_REFUSAL = (
    "a lambda cannot be marked __device__ or __host__ (NVRTC refuses it too: NVRTC 12 says '__host__ or __device__ "
    "annotation on lambda requires --extended-lambda nvcc flag', an option NVRTC does not take, NVRTC 13 'is not "
    "allowed in JIT mode'); drop the annotation: a lambda written in device code is device code")
_GRID_CONSTANT = re.compile(r"\b__grid_constant__\b")
_GRID_CONSTANT_REFUSAL = (
    "a parameter annotated with __grid_constant__ must have const-qualified type (NVRTC refuses it too); "
    "write const __grid_constant__ T name")
_GRID_CONSTANT_NOT_A_KERNEL = (
    "__grid_constant__ annotation is only allowed on a parameter of a __global__ function (NVRTC refuses it too); "
    "drop it here: a __device__ function or a lambda takes the kernel's parameter by const reference (const T& name)")
_GRID_CONSTANT_NOT_A_PARAMETER = (
    'attribute "grid_constant" does not apply here (NVRTC refuses it too): __grid_constant__ marks a __global__ '
    "function's const parameter only; drop it")

_MAXNREG_REFUSAL = (
    "The __launch_bounds__ and __maxnreg__ qualifiers cannot be applied to the same kernel (NVRTC refuses it too); "
    "keep one: __launch_bounds__ bounds the block size, __maxnreg__ the registers per thread")


def _template_arguments_blanked(text: str) -> str:
    """``text`` with what stands inside <...> blanked, so a `const` there is not the parameter's own."""
    out, depth = [], 0
    for ch in text:
        depth += ch == "<"
        out.append(ch if depth == 0 else " ")
        depth -= ch == ">" and depth > 0
    return "".join(out)


def _parameter_around(text: str, position: int) -> str:
    """The parameter declaration holding ``position``: back to the '(' or ',' that opens it and on to the
    ',' or ')' that ends it, skipping those inside <...> or (...)."""
    depth, begin = 0, position
    while begin > 0:
        ch = text[begin - 1]
        if ch in ">)":
            depth += 1
        elif ch in "<(" and depth > 0:
            depth -= 1
        elif ch in "(,;{}" and depth == 0:
            break
        begin -= 1
    depth, end = 0, position
    while end < len(text):
        ch = text[end]
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth > 0:
            depth -= 1
        elif ch in "),;{" and depth == 0:
            break
        end += 1
    return text[begin:end]


def _parameter_list_head(text: str, position: int) -> str | None:
    """What declares the function whose parameter list holds ``position`` (back from its '(' to the last ';'
    or brace), or None where ``position`` is in no parameter list."""
    depth, i = 0, position
    while i > 0:
        ch = text[i - 1]
        if ch in ")>":
            depth += 1
        elif ch in "(<" and depth > 0:
            depth -= 1
        elif ch == "(":
            return text[max(text.rfind(c, 0, i - 1) for c in ";{}") + 1:i - 1]
        elif ch in ";{}":
            return None
        i -= 1
    return None


def _misplaced_grid_constants(text: str):
    """(position, refusal) for each __grid_constant__ NVRTC refuses: on what is not a parameter, on a parameter
    of a function that is not __global__ (a __device__ function, a lambda), or on one not declared const."""
    # a kernel declared through a macro of the source's own (#define KERNEL extern "C" __global__)
    kernel_words = ["__global__"] + re.findall(r"(?m)^[ \t]*#[ \t]*define[ \t]+(\w+)\b.*\b__global__\b", text)
    is_kernel = re.compile(rf"\b(?:{'|'.join(kernel_words)})\b")
    for m in _GRID_CONSTANT.finditer(text):
        if text[text.rfind("\n", 0, m.start()) + 1:m.start()].lstrip().startswith("#"):
            continue   # a macro's definition (#define GRID_CONSTANT __grid_constant__): its uses are the parameters
        head = _parameter_list_head(text, m.start())
        if head is None:
            yield m.start(), _GRID_CONSTANT_NOT_A_PARAMETER
            continue
        if not is_kernel.search(head):
            yield m.start(), _GRID_CONSTANT_NOT_A_KERNEL
            continue
        # const must qualify the parameter itself: `const T* p` is a pointer to const, `T* const p` is const
        parameter = _template_arguments_blanked(_parameter_around(text, m.start()))
        if not re.search(r"\bconst\b", parameter[parameter.rfind("*") + 1:]):
            yield m.start(), _GRID_CONSTANT_REFUSAL


_CONDITIONAL_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(?:if|ifdef|ifndef|elif|elifdef|elifndef|undef)\b(?:\\\n|[^\n])*",
                                   re.M)


def rewrite_refused_words(code: str, options=()) -> str:
    """Line-preserving: each word of _REFUSED_WORDS and BUILTINS_NVRTC_LACKS in the source is preceded by a
    preprocessor error saying why NVRTC refuses it (``__int128`` is allowed with ``--device-int128``, as under
    NVRTC); so is a vector_size attribute, a
    lambda marked __device__/__host__, a __grid_constant__ other than on a kernel's const parameter, and a kernel with both
    __launch_bounds__ and __maxnreg__."""
    words = [w for w in _REFUSED_WORDS if w in code]
    for word in ("__int128", "__float128"):
        if word in words and any(isinstance(o, str) and o.lstrip("-") == f"device-{word[2:]}" for o in options or ()):
            words.remove(word)
    annotated = "__device__" in code or "__host__" in code or "__grid_constant__" in code
    gnu = any(m.group(0) in BUILTINS_NVRTC_LACKS for m in _GNU_WORD.finditer(code)) or "vector_size" in code
    if not words and not annotated and "__maxnreg__" not in code and not gnu:
        return code
    text = _LITERAL.sub(lambda m: " " * len(m.group(0)), blank_comments(code))
    refusals = []   # (position, message)
    if words:
        for m in re.finditer(rf"\b(?:{'|'.join(words)})\b", text):
            nvrtc_says, advice = _REFUSED_WORDS[m.group(0)]
            refusals.append((m.start(), f"{m.group(0)} is not available in device code (NVRTC refuses it too: "
                                        f"{nvrtc_says}); {advice}"))
    if gnu:
        for m in _GNU_WORD.finditer(text):
            if m.group(0) not in BUILTINS_NVRTC_LACKS:
                continue
            refusals.append((m.start(), f"{m.group(0)} is GCC's, which NVRTC does not have (NVRTC refuses it: "
                                        f"'identifier \"{m.group(0)}\" is undefined'); "
                                        f"{BUILTINS_NVRTC_LACKS[m.group(0)]}"))
        refusals += [(m.start("word"), _VECTOR_SIZE_REFUSAL) for m in _VECTOR_SIZE.finditer(text)]
    if annotated:
        refusals += [(m.start() + m.group(0).index("_"), _LAMBDA_REFUSAL) for m in _ANNOTATED_LAMBDA.finditer(text)]
        refusals += list(_misplaced_grid_constants(text))
    if "__maxnreg__" in code:
        for m in _GLOBAL_FN.finditer(text):
            if "__launch_bounds__" in m.group(0) and "__maxnreg__" in m.group(0):
                refusals.append((m.start() + m.group(0).index("__maxnreg__"), _MAXNREG_REFUSAL))
    # a word an #if or #ifdef only tests (`#ifdef __ATOMIC_RELAXED`) is no use of it: NVRTC takes the test (it has
    # no such macro, and neither has the kernel's source here: predefined_macro_modes)
    tests = [m.span() for m in _CONDITIONAL_DIRECTIVE.finditer(text)]
    refusals = [(position, said) for position, said in refusals
                if not any(start <= position < end for start, end in tests)]
    out, last = [], 0
    for position, said in sorted(refusals):
        message = said.replace("\\", "\\\\").replace('"', '\\"')
        pragma = f'GCC error "{message}"'.replace("\\", "\\\\").replace('"', '\\"')
        out.append(code[last:position] + f'_Pragma("{pragma}") ')
        last = position
    out.append(code[last:])
    return "".join(out)


# --- inline PTX ---------------------------------------------------------------------------------

_SPECIAL_REGISTERS = {
    "laneid": "llmcupy_sim::ptx_laneid()", "warpid": "llmcupy_sim::ptx_warpid()",
    "smid": "0u", "nsmid": "1u", "gridid": "0ull",
    "clock": "(unsigned)clock64()", "clock64": "(unsigned long long)clock64()", "clock_hi": "0u",
    "globaltimer": "__globaltimer()", "globaltimer_lo": "(unsigned)__globaltimer()",
    "lanemask_eq": "(1u << llmcupy_sim::ptx_laneid())",
    "lanemask_lt": "((1u << llmcupy_sim::ptx_laneid()) - 1u)",
    "lanemask_le": "((2u << llmcupy_sim::ptx_laneid()) - 1u)",
    "lanemask_gt": "(~((2u << llmcupy_sim::ptx_laneid()) - 1u))",
    "lanemask_ge": "(~((1u << llmcupy_sim::ptx_laneid()) - 1u))",
    "tid.x": "threadIdx.x", "tid.y": "threadIdx.y", "tid.z": "threadIdx.z",
    "ntid.x": "blockDim.x", "ntid.y": "blockDim.y", "ntid.z": "blockDim.z",
    "ctaid.x": "blockIdx.x", "ctaid.y": "blockIdx.y", "ctaid.z": "blockIdx.z",
    "nctaid.x": "gridDim.x", "nctaid.y": "gridDim.y", "nctaid.z": "gridDim.z",
}
_PTX_TYPES = {"f32": "float", "f64": "double", "u32": "unsigned int", "s32": "int", "b32": "unsigned int",
              "u64": "unsigned long long", "s64": "long long", "b64": "unsigned long long",
              "u16": "unsigned short", "s16": "short", "b16": "unsigned short", "u8": "unsigned char",
              "s8": "signed char", "b8": "unsigned char"}
_OPERAND = re.compile(r'\s*(?:\[\s*\w+\s*\]\s*)?"(?P<constraint>[^"]*)"\s*\(')


def _split_top(text: str, sep: str) -> list[str]:
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i:j + 1])
            i = j + 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _operands(text: str) -> list[tuple[str, str]] | None:
    ops = []
    for part in _split_top(text, ","):
        if not part.strip():
            continue
        m = _OPERAND.match(part)
        if not m:
            return None
        expr = part[m.end():part.rindex(")")]
        ops.append((m["constraint"], expr.strip()))
    return ops


def _translate_ptx(template: str, operands: list[tuple[str, str]]) -> str | None:
    """C++ for one PTX statement sequence, or None if the emulator does not know it."""
    out = []

    def ref(token: str) -> str | None:
        token = token.strip()
        m = re.fullmatch(r"%(\d+)", token)
        return f"({operands[int(m[1])][1]})" if m and int(m[1]) < len(operands) else None

    for stmt in (x.strip() for x in template.split(";")):
        if not stmt:
            continue
        stmt = stmt.replace("%%", "%")
        m = re.fullmatch(r"mov\.[usb](32|64)\s+(%\d+)\s*,\s*%(\w+(?:\.[xyz])?)", stmt)
        if m and m[3] in _SPECIAL_REGISTERS and ref(m[2]):
            out.append(f"{ref(m[2])} = {_SPECIAL_REGISTERS[m[3]]};")
            continue
        m = re.fullmatch(r"ld\.global(?:\.nc|\.ca|\.cg|\.cs|\.lu|\.cv)?(?:\.L1::no_allocate|\.L2::\w+)*"
                         r"(?:\.v(2|4))?\.(\w+)\s+(\{[^}]*\}|%\d+)\s*,\s*\[\s*(%\d+)\s*(?:\+\s*(\d+))?\s*\]", stmt)
        if m and m[2] in _PTX_TYPES:
            ctype = _PTX_TYPES[m[2]]
            dests = [d.strip() for d in m[3].strip("{}").split(",")]
            addr = ref(m[4])
            if addr is None or any(ref(d) is None for d in dests):
                return None
            base = f"((const {ctype}*)((const char*){addr} + {m[5] or 0}))"
            for k, d in enumerate(dests):
                out.append(f"{ref(d)} = {base}[{k}];")
            continue
        if re.fullmatch(r"(membar\.(gl|sys|cta)|fence\.(sc|acq_rel)\.(gpu|sys|cta))", stmt):
            out.append("__threadfence();")
            continue
        if re.fullmatch(r"bar\.sync\s+0|barrier\.sync\s+0|bar\.sync\s+0\s*,\s*%\d+", stmt) and "%" not in stmt:
            out.append("__syncthreads();")
            continue
        m = re.fullmatch(r"nanosleep\.u32\s+(\S+)", stmt)
        if m:
            out.append("__nanosleep(0);")
            continue
        return None
    return " ".join(out) if out else ";"


def rewrite_asm(code: str) -> str:
    """Line-preserving rewrite of inline PTX (see the module docstring)."""
    blanked = blank_comments(code)
    out, last = [], 0
    for m in _ASM.finditer(blanked):
        if m.start() < last:
            continue
        end = _matching(blanked, m.end() - 1)
        inner = code[m.end():end - 1]
        parts = _split_top(inner, ":")
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', parts[0])).replace("\\n", ";").replace("\\t", " ")
        outputs = _operands(parts[1]) if len(parts) > 1 else []
        inputs = _operands(parts[2]) if len(parts) > 2 else []
        translated = None
        if outputs is not None and inputs is not None:
            translated = _translate_ptx(template, outputs + inputs)
        if translated is None:
            first = next((x.strip() for x in template.split(";") if x.strip()), template.strip()) or "(empty)"
            first = first.replace("\\", "").replace('"', "'")
            translated = (f'static_assert(llmcupy_sim::always_false<__LINE__>, "inline PTX \'{first}\' is not '
                          f'supported by the emulator (it knows %laneid, %warpid, %smid, %clock, ld.global.nc, '
                          f'fences); use the CUDA C intrinsic instead");')
        out.append(code[last:m.start()] + _same_lines(code[m.start():end], f"do {{ {translated} }} while (0)"))
        last = end
    out.append(code[last:])
    return "".join(out)


def _included_files(code: str, include_dirs: list[Path], seen: set[Path], here: Path | None = None) -> list[Path]:
    """The user's headers a source includes, nested ones too, found as g++ finds them here: a quoted
    name in the including header's folder first, then the emulator's headers (hashed with the
    emulator, so skipped here), then the -I folders in order; ``<...>`` names the same without the
    first step."""
    found = []
    for quoted, angled in _INCLUDE.findall(code):
        rel = quoted or angled
        candidates = [here / rel] if quoted and here is not None else []
        if os.path.isabs(rel):
            # not an emulator's header (INCLUDE_DIR / "/abs/x.cuh" is the absolute path itself)
            candidates = [Path(rel)]
        elif not candidates or not candidates[0].is_file():
            if (INCLUDE_DIR / rel).is_file():
                continue
            candidates = [d / rel for d in include_dirs]
        for cand in candidates:
            if cand.is_file():
                p = cand.resolve()
                if p not in seen:
                    seen.add(p)
                    found.append(p)
                    found += _included_files(p.read_text(errors="replace"), include_dirs, seen, p.parent)
                break
    return found


def include_digest(code: str, options=(), filename: str = "kernel.cu") -> str:
    """Hash of the user's headers the source includes (through -I folders, and -include), so that an
    edited header makes a new library: in the compile cache and in the process's own memos (a
    notebook that edits a header and builds the module again gets the new code)."""
    flags, include_dirs = translate_options(options, filename)
    files = _included_files(code, include_dirs, set())
    pre = [flags[k + 1] for k, f in enumerate(flags) if f == "-include"]
    if pre:
        files += _included_files("".join(f'#include "{name}"\n' for name in pre), include_dirs, set(files),
                                 Path.cwd())
    if not files:
        return ""
    digest = hashlib.sha256()
    for p in files:
        digest.update(str(p).encode() + b"\0")
        try:
            digest.update(p.read_bytes())
        except OSError:
            pass  # gone since it was found: g++ will say so
    return digest.hexdigest()[:24]


_LIBCUXX_NAMES = re.compile(r"(?:cuda|cub|nv)/")


def reaches_libcuxx(code: str, options=(), filename: str = "kernel.cu") -> bool:
    """Does the source include a libcu++ or CUB header (cuda/..., cub/..., nv/target), itself or through its
    own headers? Only such a build depends on which libcu++ the emulator compiles against (sim/libcuxx.py),
    so the catalogue's builds stay cached across a CuPy upgrade."""
    flags, include_dirs = translate_options(options, filename)
    texts = [code] + [p.read_text(errors="replace") for p in _included_files(code, include_dirs, set())
                      if p.is_file()]
    pre = [flags[k + 1] for k, f in enumerate(flags) if f == "-include"]
    texts += [p.read_text(errors="replace") for p in _included_files(
        "".join(f'#include "{name}"\n' for name in pre), include_dirs, set(), Path.cwd()) if p.is_file()]
    return any(_LIBCUXX_NAMES.match(quoted or angled) for text in texts for quoted, angled in _INCLUDE.findall(text))


def _compiler_env() -> dict:
    """The environment for g++: without LD_PRELOAD. The ASan recipe preloads libasan into Python;
    inherited by g++ it makes LeakSanitizer fail the compiler's own run (exit 1 and pages of leak
    reports), which would read as "no compiler"."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


class CompilerNotFound(SimCompileError):
    """No working C++ compiler: the machine's set-up, not the kernel (the CLIs exit 2)."""


class LibcudacxxNotFound(CompilerNotFound):
    """LLMCUPY_SIM_LIBCUDACXX names no libcu++: the machine's set-up, not the kernel (the CLIs exit 2)."""


class CacheFullError(CompilerNotFound):
    """The compile cache's disk is full: the machine's set-up, not the kernel (the CLIs exit 2)."""


def _cache_full(out_dir: Path, filename: str) -> CacheFullError:
    return CacheFullError(f"no space left in the emulator's compile cache {out_dir} to build {filename}: free space "
                          "there, remove old builds (llmcupy.sim.clear_cache()) or set LLMCUPY_CACHE_DIR to another "
                          "folder")


@functools.lru_cache(maxsize=None)
def compiler_identity(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True,
                              env=_compiler_env()).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CompilerNotFound(
            f"the emulator needs a C++17 compiler ({cxx!r} did not run: {exc}). "
            "Install g++ (e.g. `apt-get install g++`) or set CXX."
        ) from exc


def is_clang(cxx: str) -> bool:
    """Is ``cxx`` clang (Apple's ``g++`` is)? A few of GCC's options are spelt otherwise or not at all."""
    return "clang" in compiler_identity(cxx)


@functools.lru_cache(maxsize=1)
def _include_dir_digest() -> bytes:
    """Hash of the emulator's headers (read once per process)."""
    digest = hashlib.sha256()
    files = sorted(os.path.relpath(os.path.join(d, f), INCLUDE_DIR) for d, _, fs in os.walk(INCLUDE_DIR) for f in fs)
    for rel in files:
        digest.update(rel.encode())
        with open(os.path.join(INCLUDE_DIR, rel), "rb") as fh:
            digest.update(fh.read())
    return digest.digest()


@functools.lru_cache(maxsize=1)
def _compiler_source_digest() -> bytes:
    return hashlib.sha256(Path(__file__).read_bytes()).digest()


def cache_dir() -> Path:
    root = os.environ.get("LLMCUPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "llmcupy")
    return Path(root) / "sim"


def ensure_cache_dir(path: Path) -> Path:
    """Creates the compile cache folder; when LLMCUPY_CACHE_DIR put it somewhere unusable, a ValueError
    naming the variable (a setting to change, not a failure of the emulator)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable", str(path))
    except OSError as exc:
        setting = os.environ.get("LLMCUPY_CACHE_DIR")
        if not setting:
            # the default folder (a read-only or odd home): say which setting moves it
            raise ValueError(f"cannot use {path} for the emulator's compiled kernels ({exc.strerror or exc}); set "
                             "LLMCUPY_CACHE_DIR to a folder that can be created and written") from None
        raise ValueError(f"LLMCUPY_CACHE_DIR={setting!r} is not valid: cannot use {path} for the emulator's "
                         f"compiled kernels ({exc.strerror or exc}); give a folder that can be created and "
                         "written, or unset it (default ~/.cache/llmcupy)") from None
    return path


# NVRTC's options (CUDA 12 and 13), by name without the leading dashes (NVRTC takes one or two):
# those that take a value (after "=" or as the next option) and those that do not. NVRTC refuses any
# other option (NVRTC_ERROR_INVALID_OPTION: "unrecognized option"), so the emulator does too, instead
# of dropping it: a misspelt option would otherwise pass here and fail on the GPU.
_NVRTC_VALUE_OPTIONS = frozenset("""
    gpu-architecture arch relocatable-device-code rdc dopt ptxas-options Xptxas maxrregcount ftz prec-sqrt
    prec-div fmad modify-stack-limit jump-table-density device-stack-protector Ofast-compile define-macro D
    undefine-macro U include-path I pre-include include std builtin-move-forward builtin-initializer-list
    optimization-info diag-error diag-suppress diag-warn brief-diagnostics time split-compile fdevice-time-trace
    frandom-seed create-pch use-pch pch-dir pch-verbose pch-messages instantiate-templates-in-pch
    static-global-template-stub device-entity-has-hidden-visibility""".split())
_NVRTC_FLAG_OPTIONS = frozenset("""
    extensible-whole-program ewp device-debug G generate-line-info lineinfo use_fast_math
    extra-device-vectorization dlink-time-opt dlto gen-opt-lto optix-ir no-source-include disable-warnings w
    restrict device-as-default-execution-space default-device device-int128 device-float128
    display-error-number err-no no-display-error-number no-err-no fdevice-syntax-only minimal pch""".split())
# The C++ standards NVRTC takes; the emulator's header needs C++17, so older ones build as C++17.
_NVRTC_STANDARDS = ("c++03", "c++11", "c++14", "c++17", "c++20")


def translate_options(options, filename: str = "kernel.cu") -> tuple[list[str], list[Path]]:
    """Maps NVRTC options onto g++: -D, -U, -I, --pre-include and -std carry over, -arch sets
    ``__CUDA_ARCH__``; NVRTC's other options (code generation, diagnostics) have no meaning on a
    CPU and are accepted without effect. An option NVRTC does not know raises SimCompileError naming
    it, as NVRTC refuses it."""
    flags, include_dirs = [], []
    options = list(options or ())
    i = 0
    while i < len(options):
        opt = options[i]
        i += 1
        if not isinstance(opt, str) or not opt.startswith("-"):
            raise SimCompileError(f"{filename}: unrecognized NVRTC option {opt!r} (NVRTC refuses it too); "
                                  "every option starts with '-', and a value follows its option: "
                                  "('-D', 'N=4') or ('-DN=4',)")
        body = opt[2:] if opt.startswith("--") else opt[1:]
        if body[:1] in ("D", "U", "I") and len(body) > 1 and not opt.startswith("--"):
            name, eq, value = body[0], "=", body[1:]   # -DN=4, -Idir: the value attached
        else:
            name, eq, value = body.partition("=")
        if name in _NVRTC_FLAG_OPTIONS and not eq:
            continue  # --use_fast_math, -lineinfo, -G ...: no meaning on a CPU
        if name not in _NVRTC_VALUE_OPTIONS:
            close = difflib.get_close_matches(name, sorted(_NVRTC_VALUE_OPTIONS | _NVRTC_FLAG_OPTIONS), n=1)
            hint = f"did you mean '--{close[0]}'? " if close else ""
            raise SimCompileError(
                f"{filename}: unrecognized NVRTC option {opt!r} (NVRTC refuses it too: NVRTC_ERROR_INVALID_OPTION); "
                f"{hint}NVRTC's documentation lists its options (in the emulator -D, -U, -I, -include, -std and "
                "-arch take effect, the others are accepted without effect)")
        if not eq:
            if i >= len(options):
                raise SimCompileError(f"{filename}: NVRTC option {opt!r} needs a value, as the next option or "
                                      "after '='")
            value = options[i]
            i += 1
        if name in ("D", "define-macro"):
            flags.append("-D" + value)
        elif name in ("U", "undefine-macro"):
            flags.append("-U" + value)
        elif name in ("I", "include-path"):
            include_dirs.append(Path(value).absolute())   # g++ runs in a temporary folder
        elif name in ("include", "pre-include"):
            flags += ["-include", str(Path(value).absolute()) if Path(value).is_file() else value]
        elif name == "std":
            if value not in _NVRTC_STANDARDS:
                raise SimCompileError(f"{filename}: invalid value for NVRTC option {opt!r} (NVRTC refuses it too); "
                                      f"choose -std= one of {', '.join(_NVRTC_STANDARDS)}")
            flags.append("-std=c++20" if value == "c++20" else "-std=c++17")
        elif name in ("arch", "gpu-architecture"):
            m = re.fullmatch(r"(?:sm|compute)_(\d+)[af]?", value)
            if not m:   # -arch=sm80, -arch=80, -arch=native: NVRTC refuses them
                raise SimCompileError(f"{filename}: invalid value for NVRTC option {opt!r} (NVRTC refuses it too); "
                                      "write -arch=sm_80 or -arch=compute_80 (any sm_XX / compute_XX)")
            # __CUDA_ARCH__ as NVRTC sets it for this -arch, so `#if` guards pick the same branch
            flags.append(f"-D__CUDA_ARCH__={int(m[1][:-1]) * 100 + int(m[1][-1]) * 10}")
    return flags, include_dirs


# What the C++ of a kernel means on a GPU where the host compiler's default differs: `char` is signed
# in CUDA device code (NVCC and NVRTC follow x86), while aarch64's ABI makes it unsigned, so without
# this `char c = 200; int i = c;` gave 200 in the emulator on ARM Linux and -56 on the GPU.
#
# -fno-builtin-expf, ...: on a GPU the C library's math functions are functions like any other, so a call is
# never a constant expression and NVRTC refuses it as a __device__ variable's initializer ("dynamic
# initialization is not supported", `__device__ float g = expf(1.0f);`, NVRTC 12.4, 12.9 and 13.5). g++ knows
# them as builtins and folds a call with constant arguments into a constant, so LLMCUPY_SIM_CONSTANT_INIT took
# it here. As plain functions they compile to calls of the same C library (no change in value); fabsf, sqrtf and
# copysignf, which g++ would otherwise inline, become calls too.
# (those of BUILTINS_NVRTC_LACKS's __builtin_NAME, and the rest of the C library's and glibc's math)
_C_MATH_FUNCTIONS = _MATH_FUNCTIONS + """copysign frexp gamma ilogb j0 j1 jn llrint llround lrint lround modf nan
    nexttoward pow10 remquo scalb scalbln scalbn significand sincos y0 y1 yn""".split()
_UNFOLDED_MATH_FLAGS = tuple(f"-fno-builtin-{name}{suffix}" for name in _C_MATH_FUNCTIONS for suffix in ("", "f")) + (
    "-fno-builtin-abs", "-fno-builtin-labs", "-fno-builtin-llabs")
GPU_LANGUAGE_FLAGS = ("-fsigned-char", *_UNFOLDED_MATH_FLAGS)

# --- host C/C++ headers ---------------------------------------------------------------------------

# NVRTC has no host C or C++ library: with the include paths CuPy gives it, `#include <cmath>` (any
# header of the C and C++ standard libraries) fails with 'cannot open source file "cmath"' (measured
# with NVRTC 12.4, 12.9 and 13.5; tests/test_nvrtc.py keeps checking each name against the NVRTCs it
# has). g++ would take the host's, so a kernel built here and failed on a GPU. The emulator puts a
# refusing stand-in in front of each (host_header_dir); its own headers, which need the host's, say so
# with LLMCUPY_SIM_HOST_HEADERS.
NVRTC_VERSIONS_WITHOUT_HOST_HEADERS = "12.4 to 13.5"
HOST_HEADERS = tuple("""
    algorithm any array atomic bit bitset cassert ccomplex cctype cerrno cfenv cfloat charconv chrono cinttypes
    ciso646 climits clocale cmath codecvt compare complex concepts condition_variable csetjmp csignal cstdalign
    cstdarg cstdbool cstddef cstdint cstdio cstdlib cstring ctgmath ctime cuchar cwchar cwctype deque exception
    execution filesystem forward_list fstream functional future initializer_list iomanip ios iosfwd iostream
    istream iterator limits list locale map memory memory_resource mutex new numbers numeric optional ostream
    queue random ratio regex scoped_allocator set shared_mutex span sstream stack stdexcept streambuf string
    string_view system_error thread tuple type_traits typeindex typeinfo unordered_map unordered_set utility
    valarray variant vector version
    assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h math.h setjmp.h
    signal.h stdalign.h stdarg.h stdbool.h stddef.h stdint.h stdio.h stdlib.h string.h tgmath.h time.h uchar.h
    wchar.h wctype.h""".split())
# C-library macros that the host headers under llmcupy_sim.h define and NVRTC does not without an include
# ('identifier "INFINITY" is undefined', NVRTC 12.4, 12.9 and 13.5; tests/test_nvrtc_parity.py keeps
# measuring each): #undef-ed where the user's source starts, so a kernel that uses one without its header
# fails here as on a GPU. The emulator's stand-ins for the libcu++ headers that define them under NVRTC
# define them again (cuda/std/cfloat, climits, cstdint and cmath, and those that include these under NVRTC:
# cuda/std/limits, complex, atomic, ..., cub's block_reduce.cuh and warp_reduce.cuh; not cooperative_groups.h,
# through which NVRTC 12.9 and 13.5 bring in FLT_MAX, ... and 12.4 does not). By name: what a kernel includes or
# writes for it under NVRTC. (Not FP_NAN, FP_ZERO, ...: glibc declares them as enumerators too, which an
# #undef leaves; they are renamed instead, as NAMES_NVRTC_LACKS are.)
_FLOAT_MACROS = ("FLT_MAX FLT_MIN FLT_EPSILON FLT_TRUE_MIN FLT_DIG FLT_MANT_DIG FLT_MAX_EXP FLT_MIN_EXP FLT_RADIX "
                 "DBL_MAX DBL_MIN DBL_EPSILON DBL_TRUE_MIN DBL_DIG DBL_MANT_DIG DBL_MAX_EXP DBL_MIN_EXP").split()
_LIMITS_MACROS = ("CHAR_BIT SCHAR_MIN SCHAR_MAX UCHAR_MAX CHAR_MIN CHAR_MAX SHRT_MIN SHRT_MAX USHRT_MAX INT_MIN "
                  "INT_MAX UINT_MAX LONG_MIN LONG_MAX ULONG_MAX LLONG_MIN LLONG_MAX ULLONG_MAX").split()
_STDINT_MACROS = ("INT8_MIN INT8_MAX UINT8_MAX INT16_MIN INT16_MAX UINT16_MAX INT32_MIN INT32_MAX UINT32_MAX "
                  "INT64_MIN INT64_MAX UINT64_MAX SIZE_MAX").split()
# The host C library's other macros that the emulator's header brings in and NVRTC lacks without an include
# (NVRTC 12.4, 12.9 and 13.5 define only NULL and assert; measured in tests/test_nvrtc_parity.py): those
# libcu++ headers define under NVRTC are taken back there (#pragma pop_macro in the stand-ins, so each keeps
# the host's definition, which matches the host's int_fast16_t, ...); no CUDA header defines the others.
_FLOAT_MACROS_KEPT = ("DBL_DECIMAL_DIG DBL_HAS_SUBNORM DBL_MAX_10_EXP DBL_MIN_10_EXP DECIMAL_DIG "
                      "FLT_DECIMAL_DIG FLT_EVAL_METHOD FLT_HAS_SUBNORM FLT_MAX_10_EXP FLT_MIN_10_EXP "
                      "FLT_ROUNDS").split()
_STDINT_MACROS_KEPT = ("INT16_C INT32_C INT64_C INT8_C INTMAX_C INTMAX_MAX INTMAX_MIN INTPTR_MAX "
                       "INTPTR_MIN INT_FAST16_MAX INT_FAST16_MIN INT_FAST32_MAX INT_FAST32_MIN "
                       "INT_FAST64_MAX INT_FAST64_MIN INT_FAST8_MAX INT_FAST8_MIN INT_LEAST16_MAX "
                       "INT_LEAST16_MIN INT_LEAST32_MAX INT_LEAST32_MIN INT_LEAST64_MAX INT_LEAST64_MIN "
                       "INT_LEAST8_MAX INT_LEAST8_MIN PTRDIFF_MAX PTRDIFF_MIN UINT16_C UINT32_C UINT64_C "
                       "UINT8_C UINTMAX_C UINTMAX_MAX UINTPTR_MAX UINT_FAST16_MAX UINT_FAST32_MAX "
                       "UINT_FAST64_MAX UINT_FAST8_MAX UINT_LEAST16_MAX UINT_LEAST32_MAX UINT_LEAST64_MAX "
                       "UINT_LEAST8_MAX").split()
MACROS_KEPT_FOR_HEADERS = (*_FLOAT_MACROS_KEPT, *_STDINT_MACROS_KEPT, "offsetof")
_ERRNO_MACROS = ("E2BIG EACCES EADDRINUSE EADDRNOTAVAIL EADV EAFNOSUPPORT EAGAIN EALREADY EBADE EBADF "
                 "EBADFD EBADMSG EBADR EBADRQC EBADSLT EBFONT EBUSY ECANCELED ECHILD ECHRNG ECOMM "
                 "ECONNABORTED ECONNREFUSED ECONNRESET EDEADLK EDEADLOCK EDESTADDRREQ EDOM EDOTDOT EDQUOT "
                 "EEXIST EFAULT EFBIG EHOSTDOWN EHOSTUNREACH EHWPOISON EIDRM EILSEQ EINPROGRESS EINTR "
                 "EINVAL EIO EISCONN EISDIR EISNAM EKEYEXPIRED EKEYREJECTED EKEYREVOKED EL2HLT EL2NSYNC "
                 "EL3HLT EL3RST ELIBACC ELIBBAD ELIBEXEC ELIBMAX ELIBSCN ELNRNG ELOOP EMEDIUMTYPE EMFILE "
                 "EMLINK EMSGSIZE EMULTIHOP ENAMETOOLONG ENAVAIL ENETDOWN ENETRESET ENETUNREACH ENFILE "
                 "ENOANO ENOBUFS ENOCSI ENODATA ENODEV ENOENT ENOEXEC ENOKEY ENOLCK ENOLINK ENOMEDIUM "
                 "ENOMEM ENOMSG ENONET ENOPKG ENOPROTOOPT ENOSPC ENOSR ENOSTR ENOSYS ENOTBLK ENOTCONN "
                 "ENOTDIR ENOTEMPTY ENOTNAM ENOTRECOVERABLE ENOTSOCK ENOTSUP ENOTTY ENOTUNIQ ENXIO "
                 "EOPNOTSUPP EOVERFLOW EOWNERDEAD EPERM EPFNOSUPPORT EPIPE EPROTO EPROTONOSUPPORT "
                 "EPROTOTYPE ERANGE EREMCHG EREMOTE EREMOTEIO ERESTART ERFKILL EROFS ESHUTDOWN "
                 "ESOCKTNOSUPPORT ESPIPE ESRCH ESRMNT ESTALE ESTRPIPE ETIME ETIMEDOUT ETOOMANYREFS "
                 "ETXTBSY EUCLEAN EUNATCH EUSERS EWOULDBLOCK EXDEV EXFULL errno").split()
_STDIO_MACROS = ("BUFSIZ EOF FILENAME_MAX FOPEN_MAX L_ctermid L_cuserid L_tmpnam P_tmpdir RENAME_EXCHANGE "
                 "RENAME_NOREPLACE RENAME_WHITEOUT SEEK_CUR SEEK_DATA SEEK_END SEEK_HOLE SEEK_SET TMP_MAX").split()
_LONG_DOUBLE_MACROS = ("LDBL_DECIMAL_DIG LDBL_DIG LDBL_EPSILON LDBL_HAS_SUBNORM LDBL_MANT_DIG LDBL_MAX "
                      "LDBL_MAX_10_EXP LDBL_MAX_EXP LDBL_MIN LDBL_MIN_10_EXP LDBL_MIN_EXP LDBL_TRUE_MIN").split()
_HUGE_AND_SNAN_MACROS = ("HUGE_VALL HUGE_VAL_F128 HUGE_VAL_F32 HUGE_VAL_F32X HUGE_VAL_F64 HUGE_VAL_F64X "
                        "SNAN SNANF SNANF128 SNANF32 SNANF32X SNANF64 SNANF64X SNANL").split()
_WIDTH_AND_LIMIT_MACROS = ("BOOL_MAX BOOL_WIDTH CHAR_WIDTH INT16_WIDTH INT32_WIDTH INT64_WIDTH INT8_WIDTH "
                           "INTMAX_WIDTH INTPTR_WIDTH INT_FAST16_WIDTH INT_FAST32_WIDTH INT_FAST64_WIDTH "
                           "INT_FAST8_WIDTH INT_LEAST16_WIDTH INT_LEAST32_WIDTH INT_LEAST64_WIDTH "
                           "INT_LEAST8_WIDTH INT_WIDTH LLONG_WIDTH LONG_BIT LONG_LONG_MAX LONG_LONG_MIN "
                           "LONG_WIDTH MB_CUR_MAX MB_LEN_MAX PTRDIFF_WIDTH SCHAR_WIDTH SHRT_WIDTH "
                           "SIG_ATOMIC_MAX SIG_ATOMIC_MIN SIG_ATOMIC_WIDTH SIZE_WIDTH SSIZE_MAX "
                           "UCHAR_WIDTH UINT16_WIDTH UINT32_WIDTH UINT64_WIDTH UINT8_WIDTH UINTMAX_WIDTH "
                           "UINTPTR_WIDTH UINT_FAST16_WIDTH UINT_FAST32_WIDTH UINT_FAST64_WIDTH "
                           "UINT_FAST8_WIDTH UINT_LEAST16_WIDTH UINT_LEAST32_WIDTH UINT_LEAST64_WIDTH "
                           "UINT_LEAST8_WIDTH UINT_WIDTH ULLONG_WIDTH ULONG_LONG_MAX ULONG_WIDTH "
                           "USHRT_WIDTH WCHAR_MAX WCHAR_MIN WCHAR_WIDTH WINT_MAX WINT_MIN WINT_WIDTH "
                           "WORD_BIT").split()
_MATH_MACROS = ("FP_ILOGB0 FP_ILOGBNAN FP_LLOGB0 FP_LLOGBNAN MATH_ERREXCEPT MATH_ERRNO issubnormal "
                "math_errhandling").split()
_POSIX_MACROS = ("AIO_PRIO_DELTA_MAX BC_BASE_MAX BC_DIM_MAX BC_SCALE_MAX BC_STRING_MAX BIG_ENDIAN "
                 "BYTE_ORDER CHARCLASS_NAME_MAX COLL_WEIGHTS_MAX DELAYTIMER_MAX EXPR_NEST_MAX FD_SETSIZE "
                 "HOST_NAME_MAX IOV_MAX LINE_MAX LITTLE_ENDIAN LOGIN_NAME_MAX MAX_CANON MAX_INPUT "
                 "MQ_PRIO_MAX NAME_MAX NFDBITS NGROUPS_MAX NL_ARGMAX NL_LANGMAX NL_MSGMAX NL_NMAX "
                 "NL_SETMAX NL_TEXTMAX NZERO PATH_MAX PDP_ENDIAN PIPE_BUF PTHREAD_DESTRUCTOR_ITERATIONS "
                 "PTHREAD_KEYS_MAX PTHREAD_STACK_MIN RE_DUP_MAX RTSIG_MAX SEM_VALUE_MAX TTY_NAME_MAX "
                 "WCONTINUED WEXITED WNOHANG WNOWAIT WSTOPPED WUNTRACED XATTR_LIST_MAX XATTR_NAME_MAX "
                 "XATTR_SIZE_MAX").split()
_M_CONSTANTS = ("M_PI M_PI_2 M_PI_4 M_1_PI M_2_PI M_2_SQRTPI M_E M_LOG2E M_LOG10E M_LN2 M_LN10 M_SQRT2 "
                "M_SQRT1_2").split()
_MATH_CONSTANTS = "<math_constants.h>'s CUDART_* constants (CUDART_PI_F, CUDART_PIO2_F, CUDART_SQRT_TWO_F, " \
                  "CUDART_LN2_F, ...; without _F for double), or a constexpr of your own"
MACROS_NVRTC_LACKS = {
    "INFINITY": "include <cuda/std/cmath>, or write CUDART_INF_F from <math_constants.h>",
    "NAN": "include <cuda/std/cmath>, or write CUDART_NAN_F from <math_constants.h>",
    "HUGE_VALF": "no CUDA header defines it: write CUDART_INF_F from <math_constants.h>",
    "HUGE_VAL": "no CUDA header defines it: write CUDART_INF from <math_constants.h>",
    **dict.fromkeys(_M_CONSTANTS, f"no CUDA header defines it: write {_MATH_CONSTANTS}"),
    # glibc's float, long double and _FloatN forms of them
    **dict.fromkeys((name + suffix for name in _M_CONSTANTS for suffix in ("f", "l", "f32", "f64", "f128", "f32x", "f64x")),
                    f"no CUDA header defines it: write {_MATH_CONSTANTS}"),
    **dict.fromkeys(_FLOAT_MACROS, "include <cuda/std/cfloat>"),
    **dict.fromkeys(_LIMITS_MACROS, "include <cuda/std/climits>"),
    **dict.fromkeys(_STDINT_MACROS, "include <cuda/std/cstdint>"),
    **dict.fromkeys(("RAND_MAX", "EXIT_SUCCESS", "EXIT_FAILURE"),
                    "no CUDA header defines it (device code has no rand() or exit()): define a constant of your own"),
    **dict.fromkeys(_FLOAT_MACROS_KEPT, "include <cuda/std/cfloat>"),
    **dict.fromkeys(_STDINT_MACROS_KEPT, "include <cuda/std/cstdint>"),
    "offsetof": "include <cuda/std/cstddef>",
    **dict.fromkeys(_ERRNO_MACROS, "no CUDA header defines it (device code has no errno; CUDA's math functions set "
                                   "none): report a failure through an output of the kernel"),
    **dict.fromkeys(_STDIO_MACROS, "no CUDA header defines it (device code has no files or streams; printf() is "
                                   "built in): define a constant of your own"),
    **dict.fromkeys(_LONG_DOUBLE_MACROS, "no CUDA header defines it (<cuda/std/cfloat> has the FLT_ and DBL_ macros "
                                         "only): use the DBL_ one, or define a constant of your own"),
    **dict.fromkeys(_HUGE_AND_SNAN_MACROS, "no CUDA header defines it: write CUDART_INF or CUDART_NAN (CUDART_INF_F, "
                                           "CUDART_NAN_F for a float) from <math_constants.h>"),
    "MAXFLOAT": "no CUDA header defines it: include <cuda/std/cfloat> and write FLT_MAX",
    **dict.fromkeys(_WIDTH_AND_LIMIT_MACROS, "no CUDA header defines it (<cuda/std/climits> and <cuda/std/cstdint> have "
                                             "C's limits without it): write cuda::std::numeric_limits<T> after "
                                             "including <cuda/std/limits>, or define a constant of your own"),
    **dict.fromkeys(_MATH_MACROS, "no CUDA header defines it: define a constant (or a function) of your own"),
    **dict.fromkeys(_POSIX_MACROS, "it is a host (POSIX) constant, which no CUDA header defines: define a constant "
                                   "of your own"),
}

# The predefined macros of NVRTC 12.0 (the CUDA the emulator presents; measured with the 12.0.76 wheel), with its
# values; a host macro of the same name and value stays as it is, every other is replaced (predefined_macro_modes).
# NVRTC is EDG's front end, and says it has exceptions and RTTI although device code may use neither (a kernel's
# `#if __cpp_exceptions` takes the branch NVRTC then refuses; so does the emulator, which compiles with
# -fno-exceptions -fno-rtti). NVRTC 12.4, 12.9 and 13.5 define the same but __EDG_VERSION__ (605, 606, 608), and
# 13.5 adds __cpp_digit_separators (tests/test_nvrtc_parity.py keeps measuring them). NVRTC_CXX17_MACROS: the
# feature macros of its C++17 (CuPy's default -std).
NVRTC_PREDEFINED_MACROS = {
    "__EDG__": "1", "__EDG_VERSION__": "603", "__EDG_IA64_ABI": "1", "__EDG_RUNTIME_USES_NAMESPACES": "1",
    "__EDG_TYPE_TRAITS_ENABLED": "1", "__cpp_exceptions": "199711", "__cpp_rtti": "199711", "__EXCEPTIONS": "1",
    "__RTTI": "1", "_BOOL": "1", "_WCHAR_T": "1", "__ARRAY_OPERATORS": "1", "__VARIADIC_TEMPLATES": "1",
    "__LP64__": "1", "__PRAGMA_REDEFINE_EXTNAME": "1", "__STDCPP_DEFAULT_NEW_ALIGNMENT__": "16",
    "__STDC_HOSTED__": "1", "__STDC__": "1",
}
NVRTC_CXX17_MACROS = dict(item.split("=") for item in """__cplusplus=201703 __cpp_aggregate_bases=201603
    __cpp_aggregate_nsdmi=201304 __cpp_alias_templates=200704 __cpp_aligned_new=201606 __cpp_attributes=200809
    __cpp_binary_literals=201304 __cpp_capture_star_this=201603 __cpp_constexpr=201603 __cpp_decltype=200707
    __cpp_decltype_auto=201304 __cpp_deduction_guides=201703 __cpp_delegating_constructors=200604
    __cpp_enumerator_attributes=201411 __cpp_fold_expressions=201603 __cpp_generic_lambdas=201304
    __cpp_guaranteed_copy_elision=201606 __cpp_hex_float=201603 __cpp_if_constexpr=201606
    __cpp_inheriting_constructors=201511 __cpp_init_captures=201304 __cpp_initializer_lists=200806
    __cpp_inline_variables=201606 __cpp_lambdas=200907 __cpp_namespace_attributes=201411
    __cpp_nested_namespace_definitions=201411 __cpp_noexcept_function_type=201510 __cpp_nontype_template_args=201411
    __cpp_nontype_template_parameter_auto=201606 __cpp_nsdmi=200809 __cpp_range_based_for=201603
    __cpp_raw_strings=200710 __cpp_ref_qualifiers=200710 __cpp_return_type_deduction=201304
    __cpp_rvalue_references=200610 __cpp_sized_deallocation=201309 __cpp_static_assert=201411
    __cpp_structured_bindings=201606 __cpp_template_template_args=201611 __cpp_threadsafe_static_init=200806
    __cpp_unicode_characters=200704 __cpp_unicode_literals=200710 __cpp_user_defined_literals=200809
    __cpp_variable_templates=201304 __cpp_variadic_templates=200704 __cpp_variadic_using=201611""".split())
# The host's predefined macros a kernel still sees: the limits and formats of its types, which the C library's
# public macros and the emulator's stand-ins expand to (FLT_MAX is __FLT_MAX__, INT64_MAX __INT64_MAX__,
# ATOMIC_INT_LOCK_FREE __GCC_ATOMIC_INT_LOCK_FREE, ...), for a kernel that includes <cuda/std/cfloat> and writes
# FLT_MAX. NVRTC lacks them too; a kernel writes them by these names only by mistake.
VALUE_MACROS = re.compile(r"__(FLT|DBL|LDBL)\w*__|__U?INT\w*_C|__\w+_(MAX|MIN|WIDTH)__|__CHAR_BIT__|__DECIMAL_DIG__|"
                          r"__GCC_ATOMIC_\w+_LOCK_FREE")
_MACRO_DEFINITION = re.compile(r"#define (\w+)(\([^)]*\))? ?(.*)")


def _macro_definitions(command: list[str], source: str) -> dict[str, str]:
    """{name: the rest of its #define line} after the preprocessor has read ``source`` (g++ -dM)."""
    proc = subprocess.run([*command, "-dM", "-E", "-x", "c++", source], capture_output=True, text=True,
                          env=_compiler_env())
    if proc.returncode != 0:
        raise SimCompileError(f"the host compiler could not list its predefined macros:\n{proc.stderr[-2000:]}")
    return {m[1]: (m[2] or "") + " " + m[3] for m in map(_MACRO_DEFINITION.match, proc.stdout.splitlines()) if m}


def _same_value(host: str, nvrtc: str) -> bool:
    return re.sub(r"(?<=\d)[uUlL]+$", "", host.strip()) == nvrtc


@functools.lru_cache(maxsize=16)
def predefined_macro_modes(command: tuple[str, ...]) -> tuple[str, str]:
    """(kernel mode, header mode): the #undef and #define lines that give the kernel's source NVRTC's predefined
    macros, and the emulator's headers the host compiler's again.

    The host compiler predefines some 400 macros NVRTC does not (__GNUC__, __linux__, __x86_64__,
    __SIZEOF_INT128__, __OPTIMIZE__, ...; NVRTC 12.4, 12.9 and 13.5 define none of them), so a kernel's
    `#ifdef __GNUC__` or `#ifdef __SIZEOF_INT128__` took another branch here than on a GPU. ``command`` is the
    compile command; the user's -D and -U names are left as the options set them. Kept: VALUE_MACROS."""
    user = {flag[2:].partition("=")[0] for flag in command if flag.startswith(("-D", "-U"))}
    # a pre-include's macros are not the compiler's (the -D ones are the options', and stay as they set them)
    flags = [flag for k, flag in enumerate(command) if flag != "-include" and (k == 0 or command[k - 1] != "-include")]
    predefined = {name: definition for name, definition in _macro_definitions(flags, os.devnull).items()
                  if name not in user}
    kept = {name for name in predefined if VALUE_MACROS.fullmatch(name)}
    standard = next((f[5:] for f in reversed(flags) if f.startswith("-std=")), "c++17")
    cxx17 = standard in ("c++17", "gnu++17")
    nvrtc = {**NVRTC_PREDEFINED_MACROS, **(NVRTC_CXX17_MACROS if cxx17 else {})}
    kernel, header = [], []
    for name in sorted((set(predefined) | set(nvrtc)) - user - kept):   # the options' -D and -U hold
        if not cxx17 and name.startswith(("__cpp_", "__cplusplus")) and name not in nvrtc:
            continue   # another C++ standard's feature macros: NVRTC's are measured for C++17 only
        if name in predefined and name in nvrtc and _same_value(predefined[name], nvrtc[name]):
            continue
        kernel.append(f"#undef {name}" + (f"\n#define {name} {nvrtc[name]}" if name in nvrtc else ""))
        header.append(f"#undef {name}" + (f"\n#define {name}{predefined[name]}" if name in predefined else ""))
    return "\n".join(kernel) + "\n", "\n".join(header) + "\n"


def predefined_macros_prefix(command: list[str], tmp: Path) -> str:
    """Where the kernel's source starts: NVRTC's predefined macros instead of the host compiler's, and the names of
    the two files that switch between them (llmcupy_sim_nvrtc_names_off.h and _on.h include them)."""
    try:
        kernel, header = predefined_macro_modes(tuple(command))
    except SimCompileError:
        return ""   # the host's macros stay: the compile that follows fails too, and says why
    # a system header: g++ warns of each #undef of a __STDC_ macro elsewhere, in the output of a failed build
    (tmp / "llmcupy_sim_kernel_macros.h").write_text("#pragma GCC system_header\n" + kernel)
    (tmp / "llmcupy_sim_header_macros.h").write_text("#pragma GCC system_header\n" + header)
    return (f'#define LLMCUPY_SIM_HEADER_MACROS "{(tmp / "llmcupy_sim_header_macros.h").absolute()}"\n'
            f'#define LLMCUPY_SIM_KERNEL_MACROS "{(tmp / "llmcupy_sim_kernel_macros.h").absolute()}"\n'
            "#include LLMCUPY_SIM_KERNEL_MACROS\n")


# The host's std namespace and C library, which the headers under llmcupy_sim.h declare and NVRTC does not
# (NVRTC 12.4, 12.9 and 13.5: 'namespace "std" has no member "min"', 'identifier "uint32_t" is undefined';
# tests/test_nvrtc_parity.py keeps measuring each). Where the user's source starts, `std` becomes the
# namespace __llmcupy_sim_nvrtc_std, which holds only what NVRTC's std holds without an include, and each name
# of NAMES_NVRTC_LACKS becomes llmcupy_nvrtc_no_NAME, which nothing declares: a kernel using one fails here as on
# a GPU, and _UNSUPPORTED names what to write instead (the names are short: for a replacement of over about 32
# characters, g++ 12 no longer names the line where the kernel used the macro). The emulator's headers a kernel
# can include turn the renames off inside (llmcupy_sim_nvrtc_names_off.h and _on.h, which list the same names),
# and those that declare a name under NVRTC leave it declared (llmcupy_sim_nvrtc_names_on.h).
NVRTC_STD_NAMES = ("move", "forward", "initializer_list", "align_val_t")
_STDINT_TYPES = [f"{u}int{kind}{bits}_t" for u in ("", "u") for kind in ("", "_least", "_fast")
                 for bits in (8, 16, 32, 64)] + ["intmax_t", "uintmax_t", "intptr_t", "uintptr_t"]
_NO_HOST_LIBRARY = "device code has no host C library"
_FP_CATEGORIES = ("FP_NAN", "FP_INFINITE", "FP_ZERO", "FP_SUBNORMAL", "FP_NORMAL")
_COMPARISONS = ("isgreater", "isgreaterequal", "isless", "islessequal", "islessgreater")


def _builtin_integer(name: str) -> str:
    """The built-in type a kernel writes for <cstdint>'s ``name`` (the exact width's; at least that wide)."""
    bits = re.sub(r"\D", "", name) or "64"
    base = {"8": "char", "16": "short", "32": "int", "64": "long long"}[bits]
    return ("unsigned " if name.startswith("u") else "signed " if bits == "8" else "") + base
NAMES_NVRTC_LACKS = {
    **{name: f"include <cuda/std/cstdint> (also cuda::std::{name}), or write " + _builtin_integer(name)
       for name in _STDINT_TYPES},
    **dict.fromkeys(("exit", "abort", "atexit"), f"{_NO_HOST_LIBRARY}: return from the kernel, or stop it with "
                                                 "assert() or __trap()"),
    **dict.fromkeys(("rand", "srand"), f"{_NO_HOST_LIBRARY}: draw random numbers with cuRAND's device API "
                                       "(<curand_kernel.h>) or a hash of the thread's index"),
    "time": f"{_NO_HOST_LIBRARY}: pass the time in as an argument, or read clock64() for a cycle count",
    **dict.fromkeys(("puts", "putchar", "fprintf", "sprintf", "snprintf", "stderr", "stdout", "fopen", "fflush"),
                    f"{_NO_HOST_LIBRARY}: print with printf(), which is built in"),
    **dict.fromkeys(("atoi", "atof", "strtol", "getenv", "qsort", "strcpy", "strncpy", "strcmp"),
                    f"{_NO_HOST_LIBRARY}: pass the values in as arguments, or write the loop"),
    **dict.fromkeys(("strlen", "memcmp"), f"{_NO_HOST_LIBRARY}: write the loop, or call cuda::std::{{name}} "
                                          "after including <cuda/std/cstring>"),
    **dict.fromkeys(("calloc", "realloc"), "only malloc() and free() (and new and delete) are built in: allocate "
                                           "with malloc() and set the memory with memset()"),
    "stdin": f"{_NO_HOST_LIBRARY}: pass the kernel's input in as an argument",
    # glibc's <math.h> declares these as enumerators and as macros; libcu++'s <cuda/std/cmath> defines the macros
    # under NVRTC (the same values), for cuda::std::fpclassify
    **dict.fromkeys(_FP_CATEGORIES, "include <cuda/std/cmath>, which defines FP_NAN, FP_INFINITE, FP_ZERO, "
                                    "FP_SUBNORMAL and FP_NORMAL (cuda::std::fpclassify returns them)"),
    # C's comparison macros: libcu++ has them as cuda::std::isgreater, ... only
    **dict.fromkeys(_COMPARISONS, "write cuda::std::{name} after including <cuda/std/cmath>, or compare with <, <=, "
                                  ">, >= (each is false where an operand is NaN, as these are)"),
}
NAMES_NVRTC_LACKS = {name: what.replace("{name}", name) for name, what in NAMES_NVRTC_LACKS.items()}
# What std:: names a kernel writes most, by what NVRTC has for them
_STD_ADVICE = {
    **dict.fromkeys(("min", "max"), "CUDA's min() and max() are built in (for int, float, double, ...), and "
                                    "fminf() and fmaxf()"),
    **dict.fromkeys(("sqrt", "abs", "fabs", "exp", "log", "pow", "floor", "ceil", "round", "isnan", "isinf",
                     "isfinite", "tanh", "sin", "cos", "erf", "fma", "fmin", "fmax"),
                    "the math functions are built in (sqrtf, fabsf, expf, powf, isnan, ... and their double "
                    "forms), or cuda::std::{name} after including <cuda/std/cmath>"),
    "swap": "cuda::std::swap after including <cuda/std/utility>",
    "numeric_limits": "cuda::std::numeric_limits after including <cuda/std/limits>, or <cuda/std/cfloat>'s FLT_MAX, ...",
    **dict.fromkeys(("size_t", "ptrdiff_t"), "{name} is built in without std::, or cuda::std::{name} after including "
                                             "<cuda/std/cstddef>"),
    **{name: f"cuda::std::{name} after including <cuda/std/cstdint>" for name in _STDINT_TYPES},
    **dict.fromkeys(("is_same", "enable_if", "conditional", "is_floating_point", "is_integral", "integral_constant",
                     "remove_reference", "decay", "declval"), "cuda::std::{name} after including <cuda/std/type_traits>"),
    **{name: f"cuda::std::{name} after including <cuda/std/{name}>" for name in ("array", "tuple", "complex")},
    "pair": "cuda::std::pair after including <cuda/std/utility>",
}
_STD_NOT_A_MEMBER = re.compile(r"error: (?:.(\w+). is not a member of .__llmcupy_sim_nvrtc_std."
                               r"|(?:no member|no template|no type) named .(\w+). in namespace .__llmcupy_sim_nvrtc_std.)")


def _std_advice(stderr: str) -> str:
    """What a kernel writes instead of the std:: names the compiler reports missing from NVRTC's std ('' for none)."""
    names = list(dict.fromkeys(gcc or clang for gcc, clang in _STD_NOT_A_MEMBER.findall(stderr)))
    if not names:
        return ""
    shown = [name.replace("llmcupy_nvrtc_no_", "") for name in names]
    advice = "; ".join(dict.fromkeys(f"for std::{name}: " + _STD_ADVICE[name].replace("{name}", name)
                                     for name in shown if name in _STD_ADVICE))
    return ("NVRTC has no C++ standard library: its namespace std holds only "
            f"{', '.join('std::' + n for n in NVRTC_STD_NAMES)} without an include (NVRTC "
            f"{NVRTC_VERSIONS_WITHOUT_HOST_HEADERS}: 'namespace \"std\" has no member \"{shown[0]}\"'; "
            "__llmcupy_sim_nvrtc_std is the emulator's name for it), so this kernel would not compile on a GPU; use "
            "CUDA's built-in functions, or libcu++'s cuda::std:: with its <cuda/std/...> header"
            + (f" ({advice})" if advice else ""))


# What compiles on both instead (each checked with NVRTC by tests/test_nvrtc.py), by header; a C header
# and its <cNAME> twin share the advice.
_BUILT_IN = "are built into NVRTC: drop the include"
_HOST_HEADER_ADVICE = {
    "cassert": "device assert() needs no header under NVRTC (it is built in): drop the include, or include "
               "<cuda/std/cassert>",
    "cmath": f"the math functions (sqrtf, expf, fmaxf, isnan, ...) {_BUILT_IN}; INFINITY and NAN are not: write "
             "CUDART_INF_F and CUDART_NAN_F from <math_constants.h>; for std:: overloads include <cuda/std/cmath> "
             "(cuda::std::sqrt)",
    "cstdint": "include <cuda/std/cstdint> (uint32_t, int64_t, ...)",
    "cfloat": "include <cuda/std/cfloat> (FLT_MAX, FLT_EPSILON, ...)",
    "climits": "include <cuda/std/climits> (INT_MAX, UINT_MAX, ...)",
    "cstdio": f"device printf() needs no header: it and the rest of the kernel's I/O {_BUILT_IN}",
    "cstring": f"memcpy() and memset() {_BUILT_IN}",
    "cstdlib": f"device malloc(), free() and abs() {_BUILT_IN}",
    "cstddef": "size_t needs no header under NVRTC; for the rest include <cuda/std/cstddef>",
}
# host headers whose libcu++ twin (<cuda/std/NAME>, cuda::std::) the emulator has
LIBCUXX_TWINS = ("array", "atomic", "bit", "complex", "functional", "initializer_list", "limits", "ratio", "tuple",
                 "type_traits", "utility")


def host_header_advice(name: str) -> str:
    """What a kernel includes or writes instead of the host header ``name`` under NVRTC."""
    twin = "c" + name[:-2] if name.endswith(".h") else name
    if twin in _HOST_HEADER_ADVICE:
        return _HOST_HEADER_ADVICE[twin]
    if name in LIBCUXX_TWINS:
        return f"include libcu++'s <cuda/std/{name}> (cuda::std::), which compiles on both"
    return "a kernel has no host library under NVRTC: drop the include (libcu++'s <cuda/std/...> headers hold " \
           "what CUDA offers of it on the device)"


def _host_header_stand_in(name: str) -> str:
    message = (f"<{name}> is a host header, which NVRTC does not have (NVRTC {NVRTC_VERSIONS_WITHOUT_HOST_HEADERS}: "
               f"'cannot open source file'), so this kernel would not compile on a GPU; {host_header_advice(name)}")
    return ("// The emulator's stand-in for a host header NVRTC does not have (sim/compiler.py, HOST_HEADERS): refused\n"
            "// in the kernel's source and its headers, the host's own for the emulator's headers.\n"
            "#if defined(LLMCUPY_SIM_USER_SOURCE) && !defined(LLMCUPY_SIM_HOST_HEADERS)\n"
            f'#error "{message}"\n'
            "#else\n"
            f"#include_next <{name}>\n"
            "#endif\n")


def host_header_dir(root: Path) -> Path:
    """The folder of refusing stand-ins for HOST_HEADERS, made once under ``root`` (the compile cache):
    searched after the kernel's own -I folders and before the host's (-isystem), so a header of the
    user's that happens to share a name is still found first, as NVRTC finds it."""
    files = {name: _host_header_stand_in(name) for name in HOST_HEADERS}
    digest = hashlib.sha256("\0".join(f"{k}\0{v}" for k, v in files.items()).encode()).hexdigest()[:16]
    folder = Path(root) / f"host-headers-{digest}"
    if not (folder / ".complete").is_file():
        # written aside and renamed into place: a concurrent build sees all of the folder or none of it
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".host-headers-"))
        for name, text in files.items():
            (tmp / name).write_text(text)
        (tmp / ".complete").write_text("")
        try:
            os.rename(tmp, folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)   # another process made it first
            if not (folder / ".complete").is_file():
                raise
    return folder


# ThreadSanitizer's instrumentation without its runtime: the hooks live in llmcupy_sim.h.
TSAN_FLAGS = ["-fsanitize=thread", "--param", "tsan-distinguish-volatile=1",
              "--param", "tsan-instrument-func-entry-exit=0"]
# The same two settings as clang spells them (LLVM's pass options, not GCC's --param).
TSAN_FLAGS_CLANG = ["-fsanitize=thread", "-mllvm", "-tsan-distinguish-volatile=1",
                    "-mllvm", "-tsan-instrument-func-entry-exit=0"]


_VOLATILE_CAST = re.compile(r"\(\s*(?:const\s+)?volatile\s+(?:const\s+)?[\w:<>\s]+?[*&]+\s*\)")


def uses_volatile(code: str) -> bool:
    """Does the source declare ``volatile`` variables, pointers or parameters? The instrumentation
    costs a lot (every memory access becomes a call), so a one-off volatile cast such as
    ``*((volatile unsigned*)p)`` does not count: a spin on one such cast hits the watchdog instead."""
    blanked = re.sub(r"\b(?:asm|__asm__|__asm)\s+(?:volatile|__volatile__)", "asm", blank_comments(code))
    blanked = _VOLATILE_CAST.sub("()", blanked)
    return bool(_VOLATILE.search(blanked))


# The CUDA keywords the scans look for, each defined as itself after the emulator's header (which
# defines them away: empty, or `static thread_local`), so that the preprocessed text still shows them.
_KEEP_KEYWORDS = "".join(f"#undef {word}\n#define {word} {word}\n"
                         for word in ("__global__", "__device__", "__host__", "__constant__", "__shared__")) + (
    "#undef __launch_bounds__\n#define __launch_bounds__(...) __launch_bounds__(__VA_ARGS__)\n")
_LINEMARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"')
_LINE_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(?:line\b|\d)", re.M)


def _preprocessed_source(command: list[str], prefix: str, code: str, safe_name: str, tmp: Path) -> str | None:
    """The source as the compiler sees it after the preprocessor, one line per line of ``code``: a line
    of a disabled branch (#if 0, an #ifdef the -D options turn off) is empty, macros are expanded
    (a `#define TABLE __constant__` declares a __constant__ variable), the CUDA keywords kept.
    ``command`` is the compile command up to the source, so the same defines, include folders and
    predefined macros apply. None when the preprocessor fails: the compile then says why."""
    if _LINE_DIRECTIVE.search(code):
        return None   # its own #line directives renumber the lines: the markers would not map back
    src = tmp / "scan.cpp"
    try:
        macros = predefined_macros_prefix(command, tmp)
    except OSError:
        return None
    src.write_text(f'{prefix}{macros}{_KEEP_KEYWORDS}#line 1 "{safe_name}"\n{code}\n')
    proc = subprocess.run([*command, "-E", str(src), "-o", str(tmp / "scan.i")], capture_output=True, text=True,
                          cwd=tmp, env=_compiler_env())
    if proc.returncode != 0:
        return None
    lines = [""] * (code.count("\n") + 1)
    in_source, number = False, 0
    with open(tmp / "scan.i", errors="replace") as fh:
        for row in fh:
            marker = _LINEMARKER.match(row)
            if marker:
                in_source, number = marker[2] == safe_name, int(marker[1])
                continue
            if in_source and 1 <= number <= len(lines):
                lines[number - 1] += row.rstrip("\n")
            number += 1
    return "\n".join(lines)


# `__global__ int k(...)`: g++ compiles it as a plain function, so the kernel would be missing from the
# module ("no kernel 'k'") with no word of why; NVRTC says why, and so does the emulator, in its words
_NON_VOID_GLOBAL = re.compile(
    rf"\b__global__\s+(?:{_SPECIFIERS}(?:(?:inline|__inline__|__forceinline__|__noinline__)\s+)?)*"
    r"(?!void\b)(?P<type>(?:(?:const|unsigned|signed|long|short)\s+)*[A-Za-z_][\w:]*(?:\s*<[^;{}()]*>)?[\s*&]*?)"
    r"\s*\b(?P<name>[A-Za-z_]\w*)\s*\(")


def non_void_kernels(preprocessed: str) -> list[tuple[int, str, str]]:
    """(line, name, return type) of each ``__global__`` function declared to return something, in the
    source as the preprocessor leaves it (a macro standing for `void` is expanded)."""
    text = _LITERAL.sub(lambda m: " " * len(m.group(0)), blank_comments(preprocessed))
    return [(text.count("\n", 0, m.start()) + 1, m["name"], " ".join(m["type"].split()))
            for m in _NON_VOID_GLOBAL.finditer(text)]


def host_only_functions(preprocessed: str) -> list[tuple[int, str]]:
    """(line, name) of each function declared ``__host__`` without ``__device__``, in the source as the
    preprocessor leaves it. NVRTC refuses them, called or not ("A function explicitly marked as a __host__
    function is not allowed in JIT mode"); g++ takes them as any other function."""
    text = _LITERAL.sub(lambda m: " " * len(m.group(0)), blank_comments(preprocessed))
    found = []
    for m in re.finditer(r"\b__host__\b", text):
        before = len(text[:m.start()].rstrip())
        if before and _ANNOTATED_LAMBDA.match(text, before - 1):
            continue   # a lambda's annotation (`[] __host__ (...)`): refused as such (_LAMBDA_REFUSAL)
        start = max(text.rfind(c, 0, m.start()) for c in ";{}") + 1
        ends = [i for i in (text.find(c, m.end()) for c in "(;{") if i >= 0]
        end = min(ends) if ends else len(text)
        if not re.search(r"\b__device__\b", text[start:end]):
            name = re.search(r"(\w+)\s*$", text[m.end():end]) if end < len(text) and text[end] == "(" else None
            found.append((text.count("\n", 0, m.start()) + 1, name[1] if name else "__host__"))
    return found


def _refuse_host_only_code(preprocessed: str, filename: str) -> None:
    """Refuses, before g++ runs, the declarations NVRTC refuses and g++ takes as plain C++: a kernel that
    returns a value, a function marked __host__ only."""
    errors = [(line, f"a __global__ function must have a void return type: '{name}' returns {rtype}")
              for line, name, rtype in non_void_kernels(preprocessed)]
    hints = ["a kernel's launch returns nothing to the host: write the result through a pointer argument, or make "
             "it a __device__ function called from a kernel"] if errors else []
    host = host_only_functions(preprocessed)
    errors += [(line, f"'{name}' is marked __host__ only: a function explicitly marked as a __host__ function is "
                      "not allowed in JIT mode") for line, name in host]
    if host:
        hints.append("a RawModule source is device code: NVRTC compiles an unmarked function for the device "
                     "(CuPy passes --device-as-default-execution-space) and refuses a __host__ one even if "
                     "nothing calls it; drop __host__, or write __host__ __device__")
    if errors:
        raise SimCompileError(
            f"the emulator could not compile {filename}:\n"
            + "\n".join(f"{filename}:{line}: error: {what}" for line, what in sorted(errors))
            + f"\n(NVRTC refuses {'them' if len(errors) > 1 else 'it'} too, in those words; "
            + "; ".join(hints) + ")")


def _kernel_base(name: str) -> str:
    """The unqualified name of a kernel name or name expression: "k" of "&ops::k<float>"."""
    return name.strip().lstrip("&:").split("<", 1)[0].strip().rpartition("::")[2]


_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*if", re.M)


def _left_by_preprocessor(kernels, code: str, preprocessed: str) -> list[str]:
    """The kernel names whose __global__ function the preprocessor left; a name written nowhere in the
    source is kept, so that the compile fails naming it (a misspelt name expression)."""
    left = set(global_function_names(preprocessed))
    written = set(global_function_names(code))
    return [k for k in kernels if _kernel_base(k) in left or _kernel_base(k) not in written]


def compiled_kernel_names(code: str, options=(), filename: str = "kernel.cu") -> list[str]:
    """``global_kernel_names`` of the source as NVRTC will see it after the preprocessor, for the GPU
    path's name expressions: a kernel inside a disabled #if branch (#ifdef X without -DX, #if 0) is no
    name expression, which NVRTC would refuse ('identifier "k" is undefined' in __nv_name_map). Found
    with the host compiler's preprocessor and the emulator's stand-ins for CUDA's headers, only for a
    source with an #if (about 0.15 s); without a compiler, or where it fails, the names as written."""
    names = global_kernel_names(code)
    if not _CONDITIONAL.search(code):
        return names
    try:
        flags, include_dirs = translate_options(options, filename)
    except SimCompileError:
        return names   # NVRTC says what is wrong with the options
    if not any(f.startswith("-std=") for f in flags):
        flags.append("-std=c++17")
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return names
    try:
        before, after = libcuxx.include_flags(ensure_cache_dir(cache_dir()))
    except (OSError, libcuxx.LibcudacxxSettingError):
        return names   # the build says what is wrong
    command = [cxx, *flags, *before, f"-I{INCLUDE_DIR}", *after, *[f"-I{d}" for d in include_dirs]]
    safe_name = re.sub(r"[^\w.-]", "_", filename)
    try:
        with tempfile.TemporaryDirectory(prefix="llmcupy-scan-") as tmp:
            preprocessed = _preprocessed_source(command, '#include "llmcupy_sim.h"\n', code, safe_name, Path(tmp))
    except OSError:
        return names
    return names if preprocessed is None else _left_by_preprocessor(names, code, preprocessed)


def built_names(lib: Path, kernels, variables) -> tuple[list[str], list[str]]:
    """The kernels and variables the library at ``lib`` has entry points for, by index: those of the
    request that the preprocessor left (see build_library)."""
    try:
        found = json.loads(Path(str(lib) + ".names").read_text())
        return list(found["kernels"]), list(found["variables"])
    except (OSError, ValueError, KeyError, TypeError):
        return list(kernels), list(variables)


def stack_requirement(lib: Path) -> int:
    """Bytes of fiber stack the library's kernels need (0: the default is enough)."""
    try:
        return int(Path(str(lib) + ".stack").read_text())
    except (OSError, ValueError):
        return 0


def _stack_from_su(folder: Path) -> int:
    frames = [0]
    for su in folder.glob("*.su"):
        for line in su.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) >= 2 and fields[1].strip().isdigit():
                frames.append(int(fields[1]))
    biggest = max(frames)
    # A big local array lives in one kernel's frame; room for it twice (a helper's copy) plus the
    # default 64 KiB for everything else. Small frames keep the default.
    return 0 if biggest < 8192 else 2 * biggest + 64 * 1024


def build_library(code: str, kernels: list[str], options=(), filename: str = "kernel.cu",
                  variables: list[str] = (), instrument: bool = False) -> Path:
    """Compiles ``code`` with one entry point per name in ``kernels`` (and an address accessor per
    name in ``variables``); returns the .so path.

    ``instrument=True`` builds the checking variant used by the sanitizers and metrics: the whole
    unit with GCC's ThreadSanitizer instrumentation (``TSAN_FLAGS``, no TSan runtime) and line
    tables (``-g1``), ``LLMCUPY_SIM_ACCESS_HOOKS`` defined, so every load and store of the kernel
    reaches the emulator's access observers (see "Access hooks" in llmcupy_sim.h). It is cached
    under its own key; the plain build is untouched."""
    from .platform import check_platform
    check_platform()   # Windows: a one-line refusal naming WSL; elsewhere unchecked: one warning
    memo_key = (code, include_digest(code, options, filename), tuple(kernels), tuple(options or ()), filename,
                tuple(variables), bool(instrument), build_environment())
    lib = _BUILT.get(memo_key)
    if lib is not None and lib.exists():
        return lib
    lib = _build_library(code, kernels, options, filename, variables, bool(instrument))
    _BUILT[memo_key] = lib
    return lib


_BUILT: dict = {}  # the libraries this process built or found, by everything their key is made of


def build_environment() -> tuple:
    """The settings of the environment a build depends on besides the source and its options: the
    compiler (CXX), the AddressSanitizer build, the ucontext switch and the cache folder. Part of
    every in-process memo of built libraries, so that changing one of them in a running process
    (a notebook, a test over several compilers) builds anew instead of reusing the old library."""
    return (os.environ.get("CXX", "g++"), os.environ.get("LLMCUPY_SIM_ASAN", ""),
            os.environ.get("LLMCUPY_SIM_UCONTEXT", ""), str(cache_dir()), os.environ.get(libcuxx.ENV_VAR, ""))


def _build_library(code, kernels, options, filename, variables, instrument=False) -> Path:
    flags, include_dirs = translate_options(options, filename)
    if not any(f.startswith("-std=") for f in flags):
        flags.append("-std=c++17")
    asan = os.environ.get("LLMCUPY_SIM_ASAN", "") not in ("", "0")
    cxx = os.environ.get("CXX", "g++")
    # Hidden visibility and no GNU-unique symbols: every library keeps its own copy of the
    # emulator's state (workers, pools, shared-memory storage), even when several libraries built
    # with different options are loaded in one process.
    # -fsanitize=float-cast-overflow: a check before each float-to-integer conversion, handled by
    # the emulator's header (no UBSan runtime): an out-of-range one stops the launch with an error,
    # since a GPU saturates where the CPU gives another value.
    # -fstack-clash-protection: a frame larger than a page (a big local array, or a recursion GCC
    # has merged into one frame) touches every page it allocates, top down, so a fiber stack overflow
    # always faults in the stack's guard page and is reported as one. Without it the first write of
    # such a frame could land below the guard page: in another fiber's stack (silently corrupting it)
    # or unmapped memory, which the fault handler cannot tell from a fault of the emulator itself and
    # so killed the process (LLMCUPY_SIM_STACK_KB=70: a 12 KiB frame of a recursive kernel).
    # -Werror=vla: a local array sized at run time (float buf[n]) is a g++/clang extension NVRTC refuses;
    # warnings are otherwise on as the compiler's defaults (no -w: it would silence this error too), and
    # only a failed build shows them (the catalogue builds without one)
    # -fno-exceptions -fno-rtti: device code has neither (NVRTC: "device code does not support exception
    # handling"; typeid and dynamic_cast fail to compile), and the emulator's header uses neither
    base_flags = ["-O2", "-g0", "-fPIC", "-shared", "-fno-strict-aliasing", "-pthread", "-Werror=vla",
                  "-fno-exceptions", "-fno-rtti",
                  "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-fno-gnu-unique", "-fstack-clash-protection",
                  *GPU_LANGUAGE_FLAGS]
    # Only for the compile step: linked with -fsanitize, g++ would make the library load UBSan's
    # runtime (not wanted, and not on every machine).
    # -fsanitize=integer-divide-by-zero likewise: x86 traps (SIGFPE) where a GPU gives some value.
    check_flags = ["-fsanitize=float-cast-overflow", "-fsanitize=integer-divide-by-zero"]
    if is_clang(cxx):
        # clang (also Apple's `g++`) emits no GNU-unique symbols, so has nothing to turn off, and refuses
        # GCC's option for it.
        # -ftrivial-auto-var-init=pattern: CUDA code passes a variable only some lanes set to a warp
        # collective (`int r; if (lane == leader) r = atomicAdd(...); r = __shfl_sync(m, r, leader);`,
        # NVIDIA's warp-aggregated atomics), which C++ calls undefined; clang then assumes the branch is
        # taken and every lane ran the atomicAdd. Locals start as a pattern (garbage, as on a GPU) instead.
        base_flags.remove("-fno-gnu-unique")
        base_flags.append("-ftrivial-auto-var-init=pattern")
    if asan and instrument:
        raise SimCompileError(f"{filename}: the sanitizers (llmcupy.sim.settings(check=...)) and the AddressSanitizer "
                              "build (LLMCUPY_SIM_ASAN) cannot be combined; unset one of them")
    if instrument and is_clang(cxx):
        from .platform import check_instrumentation
        check_instrumentation(cxx, filename)
    if asan and is_clang(cxx):
        # clang's ASan runtime is not the libasan the recipe preloads, and a clang-built library would
        # need its own: a failure at link or load time that names neither
        raise CompilerNotFound(f"{filename}: the AddressSanitizer build (LLMCUPY_SIM_ASAN) is made with g++ (the "
                               f"runtime its recipe preloads is g++'s libasan), and CXX={cxx!r} is clang; set CXX=g++ "
                               "or unset LLMCUPY_SIM_ASAN (the sanitizers, llmcupy.sim.settings(check=...), work with "
                               "clang)")
    if asan:
        base_flags += ["-fsanitize=address", "-fno-omit-frame-pointer"]
    if os.environ.get("LLMCUPY_SIM_UCONTEXT", "") not in ("", "0"):
        # fibers switch with ucontext instead of the assembly switch (llmcupy_sim_switch.h): the way
        # round, should the assembly one fail on a platform it has not run on (README, Platforms)
        base_flags.append("-DLLMCUPY_SIM_UCONTEXT")
    if instrument:
        # line tables for sim/symbols.py; the hooks' pc is a return address inside the kernel
        # -fno-tree-sra: a vector value (float4 v = reinterpret_cast<const float4*>(p)[i]) stays one
        # access of its size and alignment, not one per field, so memcheck sees a misaligned one
        # (GCC's option; clang has none: it copies such a value with memcpy, which its instrumentation
        # reports as a range without the alignment (clang 14's not at all: platform.check_instrumentation))
        # -fno-optimize-sibling-calls: a hook called last in a kernel (an atomic as its final statement)
        # would otherwise be a tail jump, and its return address would point into the emulator's
        # launch loop rather than at the kernel line that made the access
        base_flags = [f for f in base_flags if f != "-g0"] + ["-g1", "-fno-optimize-sibling-calls",
                                                              "-DLLMCUPY_SIM_ACCESS_HOOKS=1"]
        if not is_clang(cxx):
            base_flags.append("-fno-tree-sra")

    safe_name = re.sub(r"[^\w.-]", "_", filename)
    # The key hashes the source as written plus this file (which holds the rewrite rules), so a
    # cached library is found without rewriting the source first.
    digest = hashlib.sha256()
    for part in (code, "\0".join(kernels), "\0".join(variables), safe_name, " ".join(flags + base_flags),
                 compiler_identity(cxx)):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(_include_dir_digest())
    digest.update(_compiler_source_digest())
    digest.update(include_digest(code, options, filename).encode())
    try:
        uses_libcuxx = reaches_libcuxx(code, options, filename)
        if uses_libcuxx:
            digest.update(libcuxx.fingerprint())
    except libcuxx.LibcudacxxSettingError as exc:
        raise LibcudacxxNotFound(str(exc)) from None
    key = digest.hexdigest()[:24]
    out_dir = ensure_cache_dir(cache_dir())
    lib = out_dir / f"{Path(safe_name).stem}-{key}{'-asan' if asan else ''}{'-check' if instrument else ''}.so"
    if lib.exists():
        return lib

    # constant initialization before warpSize's refusals: a declaration warpSize refuses is left to them
    body = rewrite_asm(rewrite_shared(rewrite_warp_size(rewrite_constant_initialization(
        define_extern_variables(rewrite_refused_words(code, options))))))
    volatile = uses_volatile(code) and not asan  # GCC cannot combine the two sanitizers' instrumentation
    try:
        # the real libcu++'s wrappers answer <cuda/std/...> before the emulator's stand-ins (sim/libcuxx.py)
        before, after = libcuxx.include_flags(out_dir) if uses_libcuxx else ([], [])
        includes = [*before, f"-I{INCLUDE_DIR}", *after, *[f"-I{d}" for d in include_dirs]]
        # the refusing stand-ins for host headers, after the kernel's own folders (host_header_dir)
        includes += ["-isystem", str(host_header_dir(out_dir))]
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".build-") as tmp:
            return _compile_and_publish(cxx, base_flags, check_flags, flags, includes, volatile, instrument, asan,
                                        out_dir, lib, filename, safe_name, kernels, variables, code, body, Path(tmp))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):   # writing the unit or the library
            raise _cache_full(out_dir, filename) from None
        raise


# malloc, calloc, realloc, free; operator new, new[], delete, delete[] and their sized forms (Itanium names)
_DEVICE_HEAP_FUNCTIONS = ("malloc", "calloc", "realloc", "free", "_Znwm", "_Znam", "_ZdlPv", "_ZdaPv", "_ZdlPvm",
                          "_ZdaPvm")


def _entry_points(scanned: str, kernels, variables) -> str:
    """The ``extern "C"`` functions appended to the source: per kernel its launch, signature and
    launch bound; per variable its address and size."""
    entries = []
    bounds = launch_bounds(scanned)
    for i, name in enumerate(kernels):
        qualified = name.lstrip(":")
        head = qualified.split("<", 1)[0].strip()   # "ops::k" of "ops::k<float, ns::Tag>"
        namespace, _, base = head.rpartition("::")
        template_args = qualified[len(head):].strip()
        header, bound = bounds.get(base, ("", None))
        if bound is None or bool(header) != bool(template_args):
            bound_fn = "0"   # no bound declared: only CUDA's 1024 threads limit the launch
        else:
            # evaluated where the kernel is declared, so a namespace's constants resolve as in the bound,
            # and a template's with the instance's arguments
            fn = f"{header} static int llmcupy_sim_bound_{i}() {{ return (int)({bound}); }}"
            entries.append(f"namespace {namespace} {{ {fn} }}\n" if namespace else fn + "\n")
            bound_fn = f"{namespace + '::' if namespace else ''}llmcupy_sim_bound_{i}{template_args}()"
        # the parameters' names are the emulator's own: a kernel or variable of the source may be called
        # anything NVRTC takes (`c`, `size`), and a parameter of that name would hide it here
        entries.append(
            f'extern "C" LLMCUPY_SIM_EXPORT int llmcupy_sim_entry_{i}(const llmcupy_sim::LaunchConfig* llmcupy_sim_cfg, '
            f"void** llmcupy_sim_args, llmcupy_sim::LaunchResult* llmcupy_sim_res) {{ return llmcupy_sim::launch("
            f"&{name}, \"{name}\", llmcupy_sim_cfg, llmcupy_sim_args, llmcupy_sim_res); }}\n"
            f'extern "C" LLMCUPY_SIM_EXPORT const char* llmcupy_sim_signature_{i}() {{ return llmcupy_sim::signature(&{name}); }}\n'
            f'extern "C" LLMCUPY_SIM_EXPORT int llmcupy_sim_max_threads_{i}() {{ return {bound_fn}; }}\n'
        )
    for i, name in enumerate(variables):
        entries.append(
            f'extern "C" LLMCUPY_SIM_EXPORT void* llmcupy_sim_global_{i}(unsigned long long* llmcupy_sim_size) '
            f"{{ *llmcupy_sim_size = sizeof({name}); return (void*)&{name}; }}\n"
        )
    return "".join(entries)


def _compile_and_publish(cxx, base_flags, check_flags, flags, includes, volatile, instrument, asan, out_dir, lib,
                         filename, safe_name, kernels, variables, code, body, tmp: Path) -> Path:
    tsan_flags = TSAN_FLAGS_CLANG if is_clang(cxx) else TSAN_FLAGS
    sanitize_flags = check_flags + (tsan_flags if volatile or instrument else [])
    command = [cxx, *[f for f in base_flags if f != "-shared"], *sanitize_flags, "-fstack-usage", *flags, *includes]
    prefix = ("#define LLMCUPY_SIM_VOLATILE_HOOKS 1\n" if volatile else "") + '#include "llmcupy_sim.h"\n'
    # The names were found in the source as written; the preprocessor may leave some out (a variable or
    # kernel inside #if 0, or an #ifdef the -D options turn off), and an entry point naming one would
    # fail the build. Scanned again as the compiler sees the source (about 0.15 s, only when building).
    preprocessed = _preprocessed_source(command, prefix, code, safe_name, tmp)
    scanned = code if preprocessed is None else preprocessed
    if preprocessed is not None:
        _refuse_host_only_code(preprocessed, filename)
        variables = device_variables(preprocessed)
        kernels = _left_by_preprocessor(kernels, code, preprocessed)
    # The host's headers under llmcupy_sim.h redefine a -DM_PI=... of the user's: set again after the #undef,
    # so the user's value holds, as under NVRTC
    user_defined = [d for d in (f[2:] for f in flags if f.startswith("-D")) if d.partition("=")[0] in MACROS_NVRTC_LACKS]
    user_macros = "".join(f"#define {d.partition('=')[0]} {d.partition('=')[2] if '=' in d else '1'}\n"
                          for d in user_defined)
    kept = [name for name in (*MACROS_KEPT_FOR_HEADERS, *libcuxx.HOST_MACROS_LIBCUXX_USES)
            if name not in {d.partition("=")[0] for d in user_defined}]
    unit = (
        prefix
        + "#define LLMCUPY_SIM_USER_SOURCE 1\n"   # from here on a host header is refused (HOST_HEADERS)
        # the host compiler's predefined macros off, NVRTC's on (back to the host's inside the emulator's headers)
        + predefined_macros_prefix(command, tmp)
        # as NVRTC lacks them; those a libcu++ header defines under NVRTC are kept for its stand-in's (or
        # wrapper's) pop_macro, and those the real libcu++'s host code uses for its wrappers (sim/libcuxx.py)
        + "".join(f"#pragma push_macro(\"{name}\")\n" for name in kept)
        + "".join(f"#undef {name}\n" for name in MACROS_NVRTC_LACKS)
        + user_macros
        + '#include "llmcupy_sim_nvrtc_names.h"\n'   # std:: and the C library as NVRTC has them (NAMES_NVRTC_LACKS)
        + '#pragma GCC diagnostic warning "-Wpedantic"\n'   # GNU syntax NVRTC refuses (_GNU_SYNTAX)
        + f'#line 1 "{safe_name}"\n'
        f"{body}\n"
        + _constant_bank_check(scanned, safe_name)
        + '#line 1 "llmcupy_sim_entries"\n'
        + _entry_points(scanned, kernels, variables)
    )
    src = tmp / "unit.cpp"
    src.write_text(unit)
    tmp_lib = tmp / "lib.so"
    # compile instrumented, link without the sanitizers' runtimes (the header defines the hooks)
    obj = tmp / "unit.o"
    # memcheck knows the blocks a kernel allocates (malloc, new) through wrappers of those functions
    # (llmcupy_sim_check.h, "The device heap"); GNU ld and lld take --wrap, macOS's linker does not
    heap = [f"-Wl,--wrap={name}" for name in _DEVICE_HEAP_FUNCTIONS] if instrument and sys.platform.startswith("linux") else []
    steps = [[*command, "-c", str(src), "-o", str(obj)],
             [cxx, "-shared", "-pthread", *(["-fsanitize=address"] if asan else []), *heap, str(obj), "-o", str(tmp_lib)]]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=_compiler_env())
        if proc.returncode == 0 and _GCC_AMBIGUITY_EXTENSION in proc.stderr:
            raise SimCompileError(f"the emulator could not compile {filename}:\n{_compiler_says(proc.stderr)}")
        gnu_syntax = _gnu_syntax_refusals(proc.stderr) if proc.returncode == 0 else []
        if gnu_syntax:
            raise SimCompileError(f"the emulator could not compile {filename}:\n" + "\n".join(gnu_syntax))
        if proc.returncode != 0:
            from .platform import refused_option
            refused_option(cxx, proc.stderr)   # the compiler refused the emulator's own options
            if "No space left on device" in proc.stderr or "Disk quota exceeded" in proc.stderr:
                raise _cache_full(out_dir, filename)   # g++ or the assembler could not write its output
            errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
            hint = ""
            # the braces of the branches compiled: `#if A { #else { #endif` opens one block, not two
            unclosed = _unclosed_brace_line(scanned)
            launch, unsupported = _launch_line(code), _unsupported_features(proc.stderr)
            if unclosed:
                # the entry points appended after the source land inside the unclosed block, and g++
                # blames them: say where the block opened instead
                hint = (f"\n({filename} ends inside a block: a '}}' is missing (the outermost '{{' left open is on "
                        f"line {unclosed}); the errors in llmcupy_sim_entries, the emulator's code appended after "
                        "the source, follow from it)")
            elif launch or unsupported:
                if launch:
                    # g++ reads `k<<<1, 32>>>(x)` as shifts and comparisons: "expected primary-expression"
                    hint = (f"\n(line {launch} launches a kernel with <<<...>>>: a RawModule source "
                            "is device code, as NVRTC compiles it, without host code or launches from a kernel "
                            "(dynamic parallelism); launch each kernel from Python: "
                            "mod.get_function(name)(grid, block, args))")
                if unsupported:
                    hint += f"\n({unsupported})"
            elif errors and all(line.startswith("llmcupy_sim_entries:") for line in errors):
                # the source compiled; only the emulator's entry points naming each kernel did not
                hint = (f"\n(the source compiles, but a kernel name or name expression ({', '.join(kernels)}) "
                        "does not name a __global__ function as written: a template kernel needs its "
                        "arguments, \"k<float>\", a plain one none; one in a namespace its qualified name)")
            raise SimCompileError(f"the emulator could not compile {filename}:\n{_compiler_says(proc.stderr)}"
                                  f"{hint}")
    stack = tmp / "lib.stack"
    stack.write_text(str(_stack_from_su(tmp)))
    names = tmp / "lib.names"
    names.write_text(json.dumps({"kernels": list(kernels), "variables": list(variables)}))
    # Atomic publish: a concurrent reader sees either no library or a complete one (the stack size and
    # the names go first: a library without them would run with the default stack, or the names requested).
    os.replace(stack, Path(str(lib) + ".stack"))
    os.replace(names, Path(str(lib) + ".names"))
    os.replace(tmp_lib, lib)
    return lib


_LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')


# A call that C++ finds ambiguous, which g++ alone takes with a warning: between two overloads where one
# argument converts better for each, it picks the one whose worst conversion is better. fmax(x, 0.0) with
# a float x is one (CUDA's fmax has a float and a double overload): NVRTC refuses it, as clang does, so
# the emulator makes it an error too, in the words g++ uses for the other ambiguous calls.
_GCC_AMBIGUITY_EXTENSION = ("warning: ISO C++ says that these are ambiguous, even though the worst conversion for "
                            "the first is better than the worst conversion for the second:")


# GNU syntax that g++ takes in C++ with a -Wpedantic warning (turned on for the kernel's source and its own headers,
# after the emulator's header) and NVRTC refuses (12.4, 12.9 and 13.5; tests/test_nvrtc_parity.py, GNU_SYNTAX):
# g++'s words (any quotes) -> (NVRTC's, what to write instead). Designated initializers warn without -Wpedantic,
# and only below C++20, as NVRTC refuses them only there.
_GNU_SYNTAX = {
    r"ISO C\+\+ forbids braced-groups within expressions": (
        "a statement expression ({ ... })", "expected an expression",
        "call a lambda in place, [&] { ...; return value; }(), or a __device__ function"),
    r"range expressions in switch statements are non-standard": (
        "a case range (case 1 ... 3:)", 'expected a ":"', "write a case label per value, or an if"),
    r"taking the address of a label is non-standard|ISO C\+\+ forbids computed gotos": (
        "a computed goto (&&label, goto *p)", "expected an expression", "use a switch"),
    r"ISO C\+\+ does not allow .\?:. with omitted middle operand|ISO C\+\+ forbids omitting the middle term": (
        "a conditional with its middle operand omitted (a ?: b)", "expected an expression", "write a ? a : b"),
    r"ISO C\+\+ forbids zero-size array": (
        "an array of size zero", "the size of an array must be greater than zero",
        "give the array a size of at least 1, or keep a pointer to the data"),
    r"ISO C\+\+ forbids flexible array member": (
        "a flexible array member (int data[];)", "incomplete type is not allowed",
        "give the array its size, or keep a pointer to the data"),
    r"C\+\+ designated initializers only available with": (
        "a designated initializer ({.x = 1}) below C++20", "expected an expression",
        "list the values in order ({1, 2}), or pass -std=c++20, under which NVRTC takes them"),
}
_GNU_SYNTAX_WARNING = re.compile(r"^(?P<where>[^\n]*?:\d+:\d+): warning: (?P<said>(?:%s)[^\n]*)"
                                 % "|".join(f"(?:{k})" for k in _GNU_SYNTAX), re.M)


def _gnu_syntax_refusals(stderr: str) -> list[str]:
    """An error per GNU extension of _GNU_SYNTAX that g++ warned of in the kernel's source or its own headers
    (one per place; the emulator's headers are not the kernel's)."""
    refusals = {}
    for m in _GNU_SYNTAX_WARNING.finditer(stderr):
        where = m.group("where")
        if where.startswith(str(INCLUDE_DIR)) or where.rsplit(":", 1)[0] in refusals:
            continue
        what, nvrtc_says, advice = next(v for k, v in _GNU_SYNTAX.items() if re.match(k, m.group("said")))
        refusals[where.rsplit(":", 1)[0]] = (f"{where}: error: {what} is a GNU extension, which NVRTC refuses "
                                             f"('{nvrtc_says}'); {advice}")
    return list(refusals.values())


def _compiler_says(stderr: str) -> str:
    """The compiler's diagnostics as the user reads them: the kernel's `cuda::std` is the emulator's
    `cuda::__llmcupy_sim_nvrtc_std` to the compiler (llmcupy_sim_nvrtc_names.h), and is named as written."""
    text = _ambiguity_as_error(stderr).replace("cuda::__llmcupy_sim_nvrtc_std", "cuda::std")
    # cuda::std::isgreater without its header: the kernel's name is renamed (NAMES_NVRTC_LACKS), named as written
    return _RENAMED_NOT_A_MEMBER.sub(r"\g<q>\g<name>\g<rest>", text)


_RENAMED_NOT_A_MEMBER = re.compile(r"(?P<q>.)llmcupy_nvrtc_no_(?P<name>\w+)(?P<rest>. is not a member of .(?:cuda::)?std.)"
                                   r"(?:; did you mean .\w+.\?)?")


def _ambiguity_as_error(stderr: str) -> str:
    return stderr.strip().replace(
        _GCC_AMBIGUITY_EXTENSION,
        "error: call of overloaded function is ambiguous (ISO C++ says so and NVRTC refuses it: 'more than one "
        "instance of overloaded function matches the argument list'; g++ alone would take the first candidate "
        "below): convert an argument so that one overload matches, as fmaxf(x, 0.0f) or fmax((double)x, 0.0)")


# The CUDA runtime's functions a kernel is most likely to call: host code, which NVRTC does not declare
# (NVRTC 12.4 to 13.5: 'identifier "cudaMalloc" is undefined'; tests/test_nvrtc_parity.py, CUDART_TYPES). Another
# cuda... name the emulator lacks gets _CUDART_NAME_ADVICE.
CUDA_RUNTIME_FUNCTIONS = (
    "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemcpyAsync", "cudaMemset", "cudaDeviceSynchronize", "cudaGetLastError",
    "cudaPeekAtLastError", "cudaGetErrorString", "cudaGetErrorName", "cudaStreamCreate", "cudaStreamSynchronize",
    "cudaEventCreate", "cudaEventRecord", "cudaEventSynchronize", "cudaEventElapsedTime", "cudaMallocManaged",
    "cudaMallocHost", "cudaFreeHost", "cudaMemcpyToSymbol", "cudaGetDevice", "cudaSetDevice", "cudaGetDeviceProperties",
    "cudaDeviceGetAttribute", "cudaFuncSetAttribute", "cudaLaunchKernel", "cudaMallocAsync", "cudaFreeAsync",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor")

# A cuda... name neither declared here nor one of CUDA_RUNTIME_FUNCTIONS: another runtime function (host code), or
# a type or enumerator the emulator leaves out (llmcupy_sim_cudart_types.h declares those that NVRTC 12.4 to 13.5
# all declare and a kernel has a use for)
_CUDART_NAME_ADVICE = (
    "the emulator declares the CUDA runtime's types and enumerators that NVRTC 12.4 to 13.5 all declare in every "
    "kernel and a kernel has a use for (cudaError_t and the cudaError... values, cudaStream_t, cudaMemcpyKind, "
    "cudaDeviceAttr, cudaDataType, cudaExtent, ...), not this name: a runtime function is host code, which NVRTC "
    "lacks too ('identifier is undefined'), so launch and copy from Python; for another type or enumerator (of the "
    "host API's options, or one only some CUDA releases declare), write its value or declare it in the source")

# CUDA names the emulator does not define, by the feature they belong to: g++ only says "'X' was not
# declared in this scope", which reads like a missing #include.
_UNSUPPORTED = {
    # the handles cudaTextureObject_t and cudaSurfaceObject_t are declared (llmcupy_sim_cudart_types.h, as NVRTC
    # declares them): a kernel that takes one and never reads through it runs the same
    **dict.fromkeys(("tex1Dfetch", "tex1D", "tex2D", "tex3D", "tex1DLayered",
                     "tex2DLayered", "texCubemap", "tex2Dgather", "tex2DLod", "texture"),
                    "texture objects are not emulated: pass the data as a const pointer (read with __ldg if "
                    "you like), which runs on both backends"),
    # the host C library's macros, which NVRTC lacks too (MACROS_NVRTC_LACKS)
    **{name: f"NVRTC does not define {name} either (NVRTC {NVRTC_VERSIONS_WITHOUT_HOST_HEADERS}: 'identifier "
             f"\"{name}\" is undefined'): {what}" for name, what in MACROS_NVRTC_LACKS.items()},
    **dict.fromkeys(("surf1Dread", "surf1Dwrite", "surf2Dread", "surf2Dwrite", "surf3Dread",
                     "surf3Dwrite"),
                    "surface objects are not emulated: pass the data as a pointer"),
    **dict.fromkeys(CUDA_RUNTIME_FUNCTIONS,
                    "the CUDA runtime API is host code, which a RawModule source does not hold (NVRTC compiles "
                    "device code only): allocate and copy with NumPy/CuPy arrays and launch from Python; "
                    "device-side runtime calls (dynamic parallelism) are not emulated"),
    **dict.fromkeys(("make_cudaExtent", "make_cudaPitchedPtr", "make_cudaPos"),
                    f"NVRTC declares the CUDA runtime's cudaExtent, cudaPitchedPtr and cudaPos but not their make_ "
                    f"functions (NVRTC {NVRTC_VERSIONS_WITHOUT_HOST_HEADERS}: 'identifier is undefined'): set the "
                    f"fields, as in cudaExtent e = {{width, height, depth}};"),
    **{f"llmcupy_nvrtc_no_{name}": f"'{name}' is the host C library's, which NVRTC does not have (NVRTC "
       f"{NVRTC_VERSIONS_WITHOUT_HOST_HEADERS}: 'identifier \"{name}\" is undefined'), so this kernel would not "
       f"compile on a GPU; {what}" for name, what in NAMES_NVRTC_LACKS.items()},
    # C's classification macros NVRTC lacks, with <cuda/std/cmath> too (it has isnan, isinf, isfinite and signbit
    # built in); the emulator's header declares none of them in the kernel's scope
    **{name: f"NVRTC does not have {name} either (NVRTC {NVRTC_VERSIONS_WITHOUT_HOST_HEADERS}: 'identifier \"{name}\" "
             f"is undefined', after <cuda/std/cmath> too): write cuda::std::{name} after including <cuda/std/cmath>"
       for name in ("fpclassify", "isnormal", "isunordered")},
    **dict.fromkeys((f"cuda::std::{name}" for name in _COMPARISONS),
                    "libcu++ declares cuda::std::isgreater, isgreaterequal, isless, islessequal and islessgreater in "
                    "<cuda/std/cmath>, and <cuda/std/complex> includes it; without either NVRTC 12.4 to 13.5 say "
                    "'namespace \"cuda::std\" has no member': include <cuda/std/cmath>"),
    # cuda::std before any <cuda/std/...> include (g++: "'cuda' has not been declared")
    "cuda": "libcu++'s namespace cuda (cuda::std::) needs a header, under NVRTC too ('name followed by \"::\" must "
            "be a class or namespace name'): include the <cuda/std/...> header of what the kernel uses "
            "(<cuda/std/cmath>, <cuda/std/limits>, <cuda/std/utility>, ...)",
    **{f"llmcupy_sim_nvrtc_has_no_{name}": f"'{name}' is a host typedef (glibc's <sys/types.h>) that NVRTC does not "
       f"define: write {c_type}, or declare it in the source (typedef {c_type} {name};), which compiles on both"
       for name, c_type in (("uint", "unsigned int"), ("ushort", "unsigned short"), ("ulong", "unsigned long"))},
    # CUB's functors before CCCL 3; g++: "'Max' is not a member of 'cub'"
    **dict.fromkeys(("cub::Sum", "cub::Max", "cub::Min"),
                    "CCCL 3, whose CUB CuPy 14 bundles and a GPU compiles the kernel against, has no cub::Sum, "
                    "cub::Max or cub::Min (NVRTC: 'namespace \"cub\" has no member'): pass cuda::std::plus<>{}, "
                    "cuda::maximum<>{} or cuda::minimum<>{}, which CUB's headers bring in, or call .Sum()"),
    # libcu++'s asynchronous copies (the last rung of SGEMM tutorials); g++: "'barrier' is not a member of
    # 'cuda'", or for the header "fatal error: cuda/pipeline: No such file or directory"
    **dict.fromkeys(("cuda::barrier", "cuda::pipeline", "cuda::make_pipeline", "cuda::memcpy_async",
                     "cuda::pipeline_shared_state", "cuda::thread_scope_block", "cuda::thread_scope",
                     "cuda/pipeline", "cuda/annotated_ptr"),
                    "libcu++'s cuda::barrier, cuda::pipeline and cuda::memcpy_async are not emulated: copy with "
                    "cooperative_groups' cg::memcpy_async and cg::wait (<cooperative_groups/memcpy_async.h>), or "
                    "with __pipeline_memcpy_async, __pipeline_commit and __pipeline_wait_prior (<cuda_pipeline.h>), "
                    "which run on both backends"),
}


# g++ refuses warpSize where a constant is needed (the header gives it a run-time initializer), in its own
# words: "the value of 'warpSize' is not usable in a constant expression", or for an array type it builds
# (a __shared__ array's, as the emulator declares it) "'float [warpSize]' is a variably modified type".
_WARP_SIZE_NOT_CONSTANT = re.compile(r"error: (?:the value of .warpSize. is not usable in a constant expression"
                                     r"|.[^\n]*\bwarpSize\b[^\n]*. is a variably modified type)")


def _unsupported_features(stderr: str) -> str:
    """What the emulator does not offer, for the CUDA names the compiler reports as undeclared, and what CUDA
    does not offer either, in NVRTC's words ('' for none)."""
    said = []
    # g++'s wording, then clang's (also Apple's `g++`)
    names = [gcc or clang for gcc, clang in re.findall(
        r"error: (?:.(\w+). (?:was not declared|has not been declared|does not name a type)"
        r"|(?:use of undeclared identifier|unknown type name|no template named) .(\w+).)", stderr)]
    names += [f"cuda::{gcc or clang}" for gcc, clang in re.findall(
        r"error: (?:.(\w+). is not a member of .cuda.|no member named .(\w+). in namespace .cuda.)", stderr)]
    names += [f"cuda::std::{name}" for name in re.findall(r"error: .llmcupy_nvrtc_no_(\w+). is not a member of "
                                                           r".(?:cuda::)?(?:std|__llmcupy_sim_nvrtc_std).", stderr)]
    names += [f"cub::{gcc or clang}" for gcc, clang in re.findall(
        r"error: (?:.(\w+). is not a member of .cub.|no member named .(\w+). in namespace .cub.)", stderr)]
    names += re.findall(r"fatal error: .?(cuda/\w+).? ?(?::|file not found)", stderr)
    # a libcu++ header the emulator's stand-ins lack (the real libcu++ has every one: sim/libcuxx.py)
    for header in re.findall(r"fatal error: .?((?:cuda|nv)/[\w/]+).? ?(?::|file not found)", stderr):
        if header not in _UNSUPPORTED and header not in libcuxx.REFUSED:
            said.append(f"'{header}': {libcuxx.missing_header_hint()}")
    for name in names:
        what = _UNSUPPORTED.get(name) or (_CUDART_NAME_ADVICE if re.fullmatch(r"cuda[A-Z]\w*", name) else None)
        if what and f"{what}" not in " ".join(said):
            said.append(what if name.startswith(("llmcupy_sim_", "llmcupy_nvrtc_no_")) else f"'{name}': {what}")
    std_advice = _std_advice(stderr)
    if std_advice:
        said.append(std_advice)
    # g++'s and clang's words for -Werror=vla (g++'s under -Wpedantic, which the kernel's source has: "ISO C++ forbids")
    if re.search(r"error: (?:ISO C\+\+ forbids )?variable[ -]length array", stderr):
        said.append("a local array sized at run time is not CUDA: NVRTC refuses it ('expression must have a "
                    "constant value'); size it with a constant (a template parameter, a constexpr, 32 rather "
                    "than warpSize), or use dynamic shared memory or a buffer passed as an argument")
    # a float with a double where CUDA has a float and a double overload (fmax(x, 0.0)): under -Wpedantic (the kernel's
    # source has it) g++ refuses the call itself, where it would otherwise take it with _GCC_AMBIGUITY_EXTENSION's warning
    if re.search(r"error: call of overloaded .\w+\((?:float&?, double|double, float&?)\). is ambiguous", stderr):
        said.append("NVRTC refuses such a call too ('more than one instance of overloaded function matches the "
                    "argument list'): convert an argument so that one overload matches, as fmaxf(x, 0.0f) or "
                    "fmax((double)x, 0.0)")
    if re.search(r"error: exception handling disabled", stderr):   # g++'s words for -fno-exceptions; clang's:
        said.append("exceptions are not CUDA: NVRTC refuses them ('device code does not support exception "
                    "handling'); report a failure through an output (an error flag) or stop with assert()")
    elif re.search(r"error: cannot use .(?:try|throw). with exceptions disabled", stderr):
        said.append("exceptions are not CUDA: NVRTC refuses them ('device code does not support exception "
                    "handling'); report a failure through an output (an error flag) or stop with assert()")
    if re.search(r"error: (?:cannot use .typeid. with .-fno-rtti|.dynamic_cast. not permitted with .-fno-rtti"
                 r"|use of typeid requires -frtti|use of dynamic_cast requires -frtti)", stderr):
        said.append("typeid and dynamic_cast are not CUDA: NVRTC fails on them too (no RTTI in device code); "
                    "dispatch on a type tag or a virtual function instead")
    for name in dict.fromkeys(m[1] or m[3] for m in _HALF_CLASSIFICATION.finditer(stderr)):
        said.append(f"{name}() of a __half or __nv_bfloat16 is ambiguous under NVRTC ('more than one instance of "
                    f"overloaded function \"{name}\" matches the argument list': CUDA's half types convert to float "
                    f"and to every integer type); write " + ("__hisnan(h) or " if name == "isnan" else
                                                             "__hisinf(h) or " if name == "isinf" else "")
                    + f"{name}(__half2float(h)) ({name}(__bfloat162float(h)) for a __nv_bfloat16)")
    if _NOT_CONSTANT_INITIALIZER.search(stderr):
        said.append("a __device__ or __constant__ variable (one at namespace scope is __device__ even unmarked, under "
                    "CuPy's --device-as-default-execution-space), or a static local, is initialized before any thread runs: "
                    "NVRTC refuses a value computed at run time there ('dynamic initialization is not supported for a "
                    "__device__ variable'); give it constants (a constexpr constructor for a class), or set it in "
                    "the kernel")
    if _WARP_SIZE_NOT_CONSTANT.search(stderr):
        said.append("warpSize is no compile-time constant in CUDA: NVRTC refuses it too in an array size, a template "
                    "argument, constexpr, static_assert or a case label ('expression must have a constant value'); "
                    "write 32 there, or a constant of your own: constexpr int WARP_SIZE = 32;")
    return "; ".join(said)


def _launch_line(code: str) -> int:
    """The line of the first `<<<` launch in the source outside comments and literals (0: none)."""
    text = _LITERAL.sub(lambda m: " " * len(m.group(0)), blank_comments(code))
    found = re.search(r"<<<", text)
    return text.count("\n", 0, found.start()) + 1 if found else 0


def _unclosed_brace_line(code: str) -> int:
    """The line of the outermost '{' the source never closes (0 when its braces balance)."""
    text = _LITERAL.sub(lambda m: " " * len(m.group(0)), blank_comments(code))
    stack = []
    for m in re.finditer(r"[{}]", text):
        if m.group(0) == "{":
            stack.append(m.start())
        elif stack:
            stack.pop()
    return text.count("\n", 0, stack[0]) + 1 if stack else 0


def clear_cache() -> None:
    shutil.rmtree(cache_dir(), ignore_errors=True)
