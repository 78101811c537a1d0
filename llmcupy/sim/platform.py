"""Where the emulator runs, and what it says where it was not checked.

The emulator is POSIX code: fibers on mmap'ed stacks, faults caught with signals, libraries loaded
with dlopen. It is checked on Linux x86-64 (g++ and clang++); Linux aarch64 is checked by building
every kernel with a cross compiler and running the fiber, fault and watchdog paths under qemu; macOS
is written for but never run. Windows has none of it: the emulator refuses to start there and says
to use WSL, instead of failing on the first POSIX call.
"""

from __future__ import annotations

import functools
import platform as _platform
import re
import subprocess
import sys
import warnings

from .compiler import TSAN_FLAGS_CLANG, CompilerNotFound, _compiler_env, compiler_identity


class UnsupportedPlatform(CompilerNotFound):
    """The emulator cannot run on this operating system: the machine's set-up (the CLIs exit 2)."""


class SimPlatformWarning(UserWarning):
    """The emulator runs on a platform or compiler it has not been checked on."""


def _untested(system: str, machine: str) -> str:
    """What is untested or missing here ('' on Linux x86-64, where everything is checked)."""
    machine = machine.lower()
    if system == "darwin":
        return ("the emulator has not been run on macOS (it is written for it: Apple clang, SIGBUS faults, the "
                "fibers' assembly switch in Mach-O; if kernels crash at their first barrier or shuffle, "
                "LLMCUPY_SIM_UCONTEXT=1 switches with ucontext instead); sanitizer reports name library offsets "
                "instead of source lines (they read /proc and binutils' addr2line), and the AddressSanitizer recipe's "
                "LD_PRELOAD is Linux's. Please report what fails")
    if system == "linux" and machine in ("aarch64", "arm64"):
        return ("on Linux aarch64 the emulator is checked under qemu, not on hardware; a misaligned float4 does not "
                "fault there, only memcheck (--sanitize) finds it")
    if system == "linux" and machine in ("x86_64", "amd64"):
        return ""
    # the assembly context switch covers x86-64 and aarch64; other CPUs fall back to ucontext
    switch = "" if machine in ("x86_64", "amd64", "aarch64", "arm64") else "; fibers switch with ucontext"
    return (f"the emulator has not been checked on {system} {machine or 'this machine'} (it is checked on Linux "
            f"x86-64, and under qemu on Linux aarch64){switch}. Please report what fails")


_said = False


def check_platform(system: str | None = None, machine: str | None = None) -> None:
    """Refuses to start on Windows (a one-line UnsupportedPlatform naming WSL); on a platform the
    emulator was not checked on, one SimPlatformWarning per process saying what is untested."""
    global _said
    system = (system if system is not None else sys.platform).lower()
    if system.startswith(("win", "cygwin", "msys")):
        raise UnsupportedPlatform(
            "the emulator (backend sim) runs on Linux and macOS only: it needs POSIX signals, mmap and "
            "dlopen, which Windows lacks; on Windows run llmcupy inside WSL (`wsl --install`, then install "
            "Python, g++ and llmcupy there), or use the cuda backend with an NVIDIA GPU")
    if _said:
        return
    note = _untested("linux" if system.startswith("linux") else system,
                     machine if machine is not None else _platform.machine())
    if note:
        _said = True
        warnings.warn(SimPlatformWarning(note), stacklevel=3)


# How compilers refuse an option: g++, clang's driver, and LLVM's own option parser (-mllvm).
_REFUSED_OPTION = re.compile(
    r"(?:unrecognized command[- ]line option|unknown argument:?|Unknown command line argument|unsupported option)"
    r"\s*['\"‘]?(?P<option>-[^'\"’\s]+)")


def refused_option(cxx: str, stderr: str) -> None:
    """Raises CompilerNotFound when the compiler refused one of the emulator's own options (a compiler
    older or other than the ones the emulator knows), naming the option and the compiler; returns
    when the failure is the source's."""
    found = _REFUSED_OPTION.search(stderr)
    if not found:
        return
    identity = (compiler_identity(cxx).splitlines() or [cxx])[0].strip()
    raise CompilerNotFound(
        f"{cxx} ({identity}) does not take the option {found['option']}, which the emulator builds with; "
        "it needs g++ 11 or newer, or clang 14 or newer (Apple's g++ is clang): install one and set CXX to it")


# A float4 copied as a whole: how the compiler's ThreadSanitizer instrumentation shows it to the
# emulator's hooks.
_STRUCT_COPY = "struct alignas(16) F4 { float x, y, z, w; };\nvoid copy(F4* out, const F4* in) { *out = *in; }\n"


@functools.lru_cache(maxsize=None)
def clang_instruments_copies(cxx: str) -> bool:
    """Does this clang's ThreadSanitizer instrumentation report a struct copy (a float4 assigned) to the
    hooks? Newer clang calls __tsan_memcpy for it (19 does); clang 14 calls the C library's memcpy,
    which the sanitizers and the memory-traffic metrics cannot see."""
    proc = subprocess.run([cxx, "-x", "c++", "-std=c++17", "-O2", *TSAN_FLAGS_CLANG, "-S", "-o", "-", "-"],
                          input=_STRUCT_COPY, capture_output=True, text=True, env=_compiler_env())
    return proc.returncode == 0 and "__tsan_memcpy" in proc.stdout


def check_instrumentation(cxx: str, filename: str) -> None:
    """Refuses the instrumented build with a clang whose instrumentation hides struct copies: the
    sanitizers would miss those accesses (and initcheck report memory a hidden memset wrote)."""
    if clang_instruments_copies(cxx):
        return
    identity = (compiler_identity(cxx).splitlines() or [cxx])[0].strip()
    raise CompilerNotFound(
        f"{filename}: the sanitizers (--sanitize, llmcupy.sim.settings(check=...)) and the memory-traffic "
        f"metrics (--analyze) cannot be built with {cxx} ({identity}): its instrumentation turns a struct copy "
        "(a float4) into a memcpy call they cannot see, so they would miss those accesses; set CXX=g++ for them, "
        "or use a newer clang (19 works)")
