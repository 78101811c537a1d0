"""CUDA's directed-rounding intrinsics in the emulator (``__fadd_rz``, ``__dmul_ru``, ``__ll2float_rd``, ...):
each result is the exact value rounded as the suffix says (_rn to nearest even, _rz toward zero, _rd down,
_ru up), checked against exact rational arithmetic on random and edge inputs: ties, subnormals, overflow
(to infinity or to the largest finite value, by mode), integers past the float's 24 or the double's 53 bits.
"""

import math
import random
import struct
from fractions import Fraction

import numpy as np
import pytest

import llmcupy

MODES = ("rn", "rz", "rd", "ru")
# (significand bits, smallest normal exponent, largest exponent)
F32 = (24, -126, 127)
F64 = (53, -1022, 1023)


def round_exact(q: Fraction, mode: str, fmt) -> float:
    """The exact value ``q`` rounded to the format ``fmt`` (F32 or F64) as IEEE 754 rounds under ``mode``,
    subnormals included; as a Python float (every float32 value is one)."""
    bits, emin, emax = fmt
    largest = (2 - Fraction(1, 2 ** (bits - 1))) * Fraction(2) ** emax
    if q == 0:
        return 0.0
    negative, magnitude = q < 0, abs(q)
    # floor(log2(magnitude)), from the bit lengths (within one), then settled exactly
    exponent = max(magnitude.numerator.bit_length() - magnitude.denominator.bit_length(), emin)
    while magnitude >= Fraction(2) ** (exponent + 1):
        exponent += 1
    while exponent > emin and magnitude < Fraction(2) ** exponent:
        exponent -= 1
    ulp = Fraction(2) ** (exponent - bits + 1)
    units = magnitude / ulp
    down, up = math.floor(units), math.ceil(units)
    toward_larger = {"rz": False, "rd": negative, "ru": not negative}.get(mode)
    if toward_larger is None:   # rn: ties to even
        rest = units - down
        n = up if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and down % 2) else down
    else:
        n = up if toward_larger else down
    result = n * ulp
    if result > largest:
        # past the largest finite value: to infinity, unless the mode rounds toward it (rz, and rd/ru the
        # other way), which gives the largest finite value
        result = math.inf if mode == "rn" or toward_larger else float(largest)
    value = float(result)
    return -value if negative else value


def round_sqrt(x: Fraction, mode: str, fmt) -> float:
    """sqrt(x) rounded to ``fmt`` under ``mode``: the neighbours of the nearest double's square root,
    compared exactly by squaring."""
    nearest = round_exact(Fraction(math.sqrt(float(x))), "rn", fmt)
    step = (lambda v, d: float(np.nextafter(np.float32(v), np.float32(d)))) if fmt == F32 else math.nextafter
    below, above = nearest, nearest
    while Fraction(below) ** 2 > x:
        below = step(below, 0.0)
    while Fraction(above) ** 2 < x:
        above = step(above, math.inf)
    if below == above:
        return below
    if Fraction(step(below, math.inf)) ** 2 < x:   # the nearest double was more than one step off
        below = step(below, math.inf)
    if mode in ("rz", "rd"):
        return below
    if mode == "ru":
        return above
    exact_mid = ((Fraction(below) + Fraction(above)) / 2) ** 2
    return below if x < exact_mid else above   # a square root is never exactly halfway


def random_floats(rng, n, fmt):
    """Random finite values spread over every exponent, subnormals included, with both signs."""
    if fmt == F32:
        raw = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        raw = rng.integers(0, 2 ** 64, n, dtype=np.uint64).view(np.float64)
    return raw[np.isfinite(raw)]


def edge_floats(dtype):
    info = np.finfo(dtype)
    tiny, eps = info.smallest_subnormal, info.eps
    values = [0.0, 1.0, -1.0, 1.5, 3.0, 10.0, 0.1, eps / 2, eps, -eps / 2, 1 + eps, tiny, -tiny, 3 * tiny,
              info.smallest_normal, info.smallest_normal - tiny, info.max, -info.max, info.max / 2, 2.0 ** 60]
    return np.array(values, dtype)


def operands(dtype, fmt, count, seed):
    """(a, b, c) triples: random values; random values close in magnitude (so sums round in the last
    bits); ties of round-to-nearest (1 + half an ulp); and the edge values against each other."""
    rng = np.random.default_rng(seed)
    a, b, c = (random_floats(rng, count, fmt)[: count // 2] for _ in range(3))
    n = min(len(a), len(b), len(c))
    a, b, c = a[:n], b[:n], c[:n]
    close = (rng.uniform(0.5, 2.0, n) * rng.choice([-1, 1], n)).astype(dtype)
    scale = np.exp2(rng.integers(-40, 40, n)).astype(dtype)
    edges = edge_floats(dtype)
    ea, eb = np.meshgrid(edges, edges)
    half_ulp = np.finfo(dtype).eps / 2
    ties = np.array([half_ulp, -half_ulp, 3 * half_ulp, half_ulp * 0.5], dtype)
    aa = np.concatenate([a, close * scale, ea.ravel(), np.ones(len(ties), dtype)]).astype(dtype)
    bb = np.concatenate([b, (close * scale * rng.uniform(0.5, 2.0, n)).astype(dtype), eb.ravel(), ties]).astype(dtype)
    cc = np.concatenate([c, (scale * rng.uniform(-1, 1, n)).astype(dtype), eb.ravel()[::-1], ties]).astype(dtype)
    with np.errstate(all="ignore"):
        keep = np.isfinite(aa) & np.isfinite(bb) & np.isfinite(cc)
    return aa[keep], bb[keep], cc[keep]


ARITHMETIC = {   # name: (arguments, exact value); None where the exact value is no rational (sqrt)
    "add": (2, lambda a, b, c: a + b),
    "sub": (2, lambda a, b, c: a - b),
    "mul": (2, lambda a, b, c: a * b),
    "div": (2, lambda a, b, c: a / b if b else None),
    "rcp": (1, lambda a, b, c: 1 / a if a else None),
    "sqrt": (1, None),
    "fma": (3, lambda a, b, c: a * b + c),
}


def _arithmetic_source(t, prefix, fma_name, rcp, sqrt):
    names = {"add": f"__{prefix}add", "sub": f"__{prefix}sub", "mul": f"__{prefix}mul", "div": f"__{prefix}div",
             "rcp": rcp, "sqrt": sqrt, "fma": fma_name}
    lines = []
    for column, (op, mode) in enumerate((op, mode) for op in ARITHMETIC for mode in MODES):
        args = ", ".join("abc"[: ARITHMETIC[op][0]])
        lines.append(f"    o[{column}] = {names[op]}_{mode}({args});")
    return (f'extern "C" __global__ void ops(const {t}* pa, const {t}* pb, const {t}* pc, {t}* out, int n) {{\n'
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n"
            f"    {t} a = pa[i], b = pb[i], c = pc[i];\n    {t}* o = out + {len(ARITHMETIC) * len(MODES)} * i;\n"
            + "\n".join(lines) + "\n}\n")


def _run(source, dtype, a, b, c):
    n = len(a)
    out = np.zeros(n * len(ARITHMETIC) * len(MODES), dtype)
    module = llmcupy.RawModule(code=source, target="sim")
    module.get_function("ops")(((n + 127) // 128,), (128,), (a, b, c, out, np.int32(n)))
    return out.reshape(n, len(ARITHMETIC), len(MODES))


def _check_arithmetic(got, a, b, c, fmt):
    wrong = []
    for i in range(len(a)):
        x, y, z = Fraction(float(a[i])), Fraction(float(b[i])), Fraction(float(c[i]))
        for k, (op, (_, exact)) in enumerate(ARITHMETIC.items()):
            if op == "sqrt":
                if x < 0:
                    continue
                expected = [round_sqrt(x, mode, fmt) for mode in MODES]
            else:
                q = exact(x, y, z)
                if q is None:
                    continue
                expected = [round_exact(q, mode, fmt) for mode in MODES]
            for m, mode in enumerate(MODES):
                value = float(got[i, k, m])
                if value != expected[m] and len(wrong) < 10:
                    wrong.append(f"{op}_{mode}({float(a[i])!r}, {float(b[i])!r}, {float(c[i])!r}) = {value!r}, "
                                 f"exact rounding gives {expected[m]!r}")
    assert not wrong, "\n".join(wrong)


def test_float_arithmetic_rounds_as_each_mode_says():
    # before: __fadd_rz, __fmul_ru, __fmaf_rd, __fsqrt_rz ... were not declared ("'__fadd_rz' was not
    # declared in this scope"), so a kernel NVRTC compiles did not build here
    a, b, c = operands(np.float32, F32, 1200, seed=1)
    got = _run(_arithmetic_source("float", "f", "__fmaf", "__frcp", "__fsqrt"), np.float32, a, b, c)
    _check_arithmetic(got, a, b, c, F32)


def test_double_arithmetic_rounds_as_each_mode_says():
    a, b, c = operands(np.float64, F64, 1200, seed=2)
    got = _run(_arithmetic_source("double", "d", "__fma", "__drcp", "__dsqrt"), np.float64, a, b, c)
    _check_arithmetic(got, a, b, c, F64)


def test_directed_rounding_edges_by_hand():
    # the cases a reader checks at a glance: a tie, overflow to infinity or to the largest float, an
    # exact zero's sign, the integer past float's 24 bits that __int2float_rz used to round to nearest
    code = r'''
    extern "C" __global__ void edges(float* f, double* d) {
        const float max = 3.40282347e38f, half_ulp = 5.96046448e-8f;
        f[0] = __fadd_rn(1.0f, half_ulp); f[1] = __fadd_ru(1.0f, half_ulp); f[2] = __fadd_rz(1.0f, half_ulp);
        f[3] = __fadd_rn(max, max); f[4] = __fadd_rz(max, max); f[5] = __fadd_rd(max, max); f[6] = __fadd_ru(-max, -max);
        f[7] = __fadd_rd(1.0f, -1.0f); f[8] = __fadd_ru(1.0f, -1.0f);
        f[9] = __int2float_rz(16777219); f[10] = __int2float_rn(16777219); f[11] = __int2float_ru(16777217);
        f[12] = __fmaf_ieee_rn(1.0f, 1.0f, half_ulp); f[13] = __fmaf_ieee_ru(1.0f, 1.0f, half_ulp);
        f[14] = __fmul_rd(1.0e-45f, 0.5f); f[15] = __fmul_ru(1.0e-45f, 0.5f);
        d[0] = __dadd_ru(1.0, 1e-300); d[1] = __dadd_rz(-1.0, -1e-300); d[2] = __ull2double_rz(18446744073709551615ull);
        d[3] = __ull2double_rn(18446744073709551615ull);
    }'''
    f, d = np.zeros(16, np.float32), np.zeros(4)
    llmcupy.RawModule(code=code, target="sim").get_function("edges")((1,), (1,), (f, d))
    one_up = float(np.nextafter(np.float32(1), np.float32(2)))
    largest = float(np.finfo(np.float32).max)
    assert f[:3].tolist() == [1.0, one_up, 1.0]
    assert f[3:7].tolist() == [math.inf, largest, largest, -largest]
    assert math.copysign(1, f[7]) == -1 and math.copysign(1, f[8]) == 1 and f[7] == f[8] == 0
    assert f[9:12].tolist() == [16777218.0, 16777220.0, 16777218.0]
    assert f[12:14].tolist() == [1.0, one_up]   # 1 + half an ulp, exactly: a tie
    assert f[14] == 0.0 and f[15] == float(np.finfo(np.float32).smallest_subnormal)
    assert d.tolist() == [math.nextafter(1.0, 2.0), -1.0, 18446744073709549568.0, 2.0 ** 64]


def _bits_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


CONVERSIONS = [   # (CUDA's name, argument type, result type, modes)
    ("__int2float", "int", "float", MODES), ("__uint2float", "unsigned", "float", MODES),
    ("__ll2float", "long long", "float", MODES), ("__ull2float", "unsigned long long", "float", MODES),
    ("__ll2double", "long long", "double", MODES), ("__ull2double", "unsigned long long", "double", MODES),
]
_NUMPY = {"int": np.int32, "unsigned": np.uint32, "long long": np.int64, "unsigned long long": np.uint64}


def test_integer_to_float_conversions_round_as_each_mode_says():
    # before: only the _rn forms (and __int2float_rz, which rounded to nearest: 16777219 gave 16777220)
    rng = random.Random(3)
    lines, inputs = [], {}
    for name, arg, result, modes in CONVERSIONS:
        bits = 8 * np.dtype(_NUMPY[arg]).itemsize
        signed = not arg.startswith("unsigned")
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
        values = [lo, hi, 0, 1, 2 ** 24 + 1, 2 ** 24 + 3, 2 ** 53 + 1, -(2 ** 24 + 1), -(2 ** 53 + 3)]
        values += [rng.randint(lo, hi) for _ in range(150)] + [rng.randint(-(2 ** 30), 2 ** 30) for _ in range(50)]
        inputs[name] = np.array([v for v in values if lo <= v <= hi], _NUMPY[arg])
        for mode in modes:
            lines.append((name, mode, result))
    n = max(len(v) for v in inputs.values())
    params = ", ".join(f"const {arg}* in_{name[2:]}" for name, arg, _, _ in CONVERSIONS)
    body = "\n".join(f"    o_{name[2:]}_{mode}[i] = {name}_{mode}(in_{name[2:]}[i]);" for name, mode, _ in lines)
    outs = ", ".join(f"{result}* o_{name[2:]}_{mode}" for name, mode, result in lines)
    code = (f'extern "C" __global__ void convert({params}, {outs}, int n) {{\n'
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n" + body + "\n}\n")
    args = [np.resize(inputs[name], n) for name, _, _, _ in CONVERSIONS]
    results = [np.zeros(n, np.float32 if result == "float" else np.float64) for _, _, result in lines]
    llmcupy.RawModule(code=code, target="sim").get_function("convert")((1,), (n,), (*args, *results, np.int32(n)))
    wrong = []
    for (name, mode, result), got in zip(lines, results):
        source = args[[c[0] for c in CONVERSIONS].index(name)]
        for x, value in zip(source.tolist(), got.tolist()):
            expected = round_exact(Fraction(x), mode, F32 if result == "float" else F64)
            if value != expected:
                wrong.append(f"{name}_{mode}({x}) = {value!r}, exact rounding gives {expected!r}")
    assert not wrong, "\n".join(wrong[:10])


def test_float_to_integer_conversions_round_as_each_mode_says():
    # before: __float2ll_rd/_ru, __float2ull_rd/_ru, __double2ll_rd/_ru, __double2uint_rd/_ru and every
    # __double2ull_* were not declared
    code = r'''
    extern "C" __global__ void convert(const float* f, const double* d, long long* ll, unsigned long long* ull,
                                       unsigned* u, int n) {
        int i = threadIdx.x;
        if (i >= n) return;
        ll[4 * i + 0] = __float2ll_rd(f[i]); ll[4 * i + 1] = __float2ll_ru(f[i]);
        ll[4 * i + 2] = __double2ll_rd(d[i]); ll[4 * i + 3] = __double2ll_ru(d[i]);
        ull[6 * i + 0] = __float2ull_rd(f[i]); ull[6 * i + 1] = __float2ull_ru(f[i]);
        ull[6 * i + 2] = __double2ull_rn(d[i]); ull[6 * i + 3] = __double2ull_rz(d[i]);
        ull[6 * i + 4] = __double2ull_rd(d[i]); ull[6 * i + 5] = __double2ull_ru(d[i]);
        u[2 * i + 0] = __double2uint_rd(d[i]); u[2 * i + 1] = __double2uint_ru(d[i]);
    }'''
    values = [0.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.0 ** 40 + 0.5, -(2.0 ** 40) - 0.5, 1e30, -1e30, 4294967295.5,
              4294967296.0, 2.0 ** 63, 2.0 ** 64, -3.7, 3.7, float("nan"), math.inf, -math.inf]
    d = np.array(values)
    f = d.astype(np.float32)
    n = len(values)
    ll, ull, u = np.zeros(4 * n, np.int64), np.zeros(6 * n, np.uint64), np.zeros(2 * n, np.uint32)
    llmcupy.RawModule(code=code, target="sim").get_function("convert")((1,), (n,), (f, d, ll, ull, u, np.int32(n)))

    def cvt(x, rounding, lo, hi):   # PTX's cvt: NaN gives 0, out-of-range values saturate
        if math.isnan(x):
            return 0
        if math.isinf(x):
            return hi if x > 0 else lo
        r = rounding(Fraction(x))
        return min(max(r, lo), hi)
    floor, ceil, trunc = math.floor, math.ceil, math.trunc
    nearest = round   # Python's round of a Fraction is to nearest even

    L, UL, U = (-(2 ** 63), 2 ** 63 - 1), (0, 2 ** 64 - 1), (0, 2 ** 32 - 1)
    for i, x in enumerate(values):
        xf = float(f[i])
        assert ll[4 * i: 4 * i + 4].tolist() == [cvt(xf, floor, *L), cvt(xf, ceil, *L), cvt(x, floor, *L),
                                                 cvt(x, ceil, *L)], x
        assert ull[6 * i: 6 * i + 6].tolist() == [cvt(xf, floor, *UL), cvt(xf, ceil, *UL), cvt(x, nearest, *UL),
                                                  cvt(x, trunc, *UL), cvt(x, floor, *UL), cvt(x, ceil, *UL)], x
        assert u[2 * i: 2 * i + 2].tolist() == [cvt(x, floor, *U), cvt(x, ceil, *U)], x


def test_double_to_float_rounds_as_each_mode_says():
    # before: __double2float_rd and _ru were not declared
    code = r'''
    extern "C" __global__ void narrow(const double* d, float* o, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= n) return;
        o[4 * i] = __double2float_rn(d[i]); o[4 * i + 1] = __double2float_rz(d[i]);
        o[4 * i + 2] = __double2float_rd(d[i]); o[4 * i + 3] = __double2float_ru(d[i]);
    }'''
    rng = np.random.default_rng(4)
    d = np.concatenate([random_floats(rng, 400, F64)[:100], rng.standard_normal(200) * np.exp2(rng.integers(-160, 140, 200)),
                        edge_floats(np.float64), [1e39, -1e39, 1 + 2.0 ** -24, 1 - 2.0 ** -25, 2.0 ** -149 * 1.5]])
    n = len(d)
    o = np.zeros(4 * n, np.float32)
    llmcupy.RawModule(code=code, target="sim").get_function("narrow")(((n + 127) // 128,), (128,), (d, o, np.int32(n)))
    wrong = [f"{x!r}: {o[4 * i: 4 * i + 4].tolist()}" for i, x in enumerate(d.tolist())
             if o[4 * i: 4 * i + 4].tolist() != [round_exact(Fraction(x), m, F32) for m in MODES]]
    assert not wrong, wrong[:10]


def test_the_reference_rounding_agrees_with_the_hosts_round_to_nearest():
    # the reference itself: its round-to-nearest is NumPy's float32 conversion and Python's float division
    rng = np.random.default_rng(5)
    with np.errstate(over="ignore"):   # a double past float's range becomes infinity, as it should
        for x in random_floats(rng, 300, F64):
            assert round_exact(Fraction(float(x)), "rn", F32) == float(np.float32(x))
    for a, b in zip(random_floats(rng, 200, F64).tolist(), random_floats(rng, 200, F64).tolist()):
        try:
            quotient = a / b
        except (ZeroDivisionError, OverflowError):
            continue
        assert round_exact(Fraction(a) / Fraction(b), "rn", F64) == quotient


@pytest.mark.parametrize("bits, base, offset", [(0xAAAAAAAA, 3, 1), (0xAAAAAAAA, 3, -1), (0xAAAAAAAA, 2, 1),
                                                (0xAAAAAAAA, 2, -1)])
def test_fns_gives_the_ptx_isas_examples(bits, base, offset):
    # PTX ISA, fns.b32: 0xaaaaaaaa from 3 by +1 and -1 gives 3, from 2 by +1 gives 3, by -1 gives 1
    assert _fns_run([(bits, base, offset)]) == [{(3, 1): 3, (3, -1): 3, (2, 1): 3, (2, -1): 1}[(base, offset)]]


def _fns_reference(mask, base, offset):
    """PTX's fns.b32 pseudocode."""
    if offset == 0:
        return base if (mask >> base) & 1 else 0xFFFFFFFF
    count, step, pos = abs(offset) - 1, 1 if offset > 0 else -1, base
    while 0 <= pos < 32:
        if (mask >> pos) & 1:
            if count == 0:
                return pos
            count -= 1
        pos += step
    return 0xFFFFFFFF


def _fns_run(cases):
    code = r'''
    extern "C" __global__ void fns(const unsigned* mask, const unsigned* base, const int* offset, unsigned* o, int n) {
        int i = threadIdx.x;
        if (i < n) o[i] = __fns(mask[i], base[i], offset[i]);
    }'''
    mask, base, offset = (np.array(col, dtype) for col, dtype in zip(zip(*cases), (np.uint32, np.uint32, np.int32)))
    o = np.zeros(len(cases), np.uint32)
    llmcupy.RawModule(code=code, target="sim").get_function("fns")((1,), (len(cases),),
                                                                   (mask, base, offset, o, np.int32(len(cases))))
    return o.tolist()


def test_fns_follows_the_ptx_pseudocode():
    # before: "'__fns' was not declared in this scope"
    rng = random.Random(6)
    cases = [(rng.getrandbits(32) & rng.getrandbits(32), rng.randrange(32), rng.randint(-33, 33)) for _ in range(500)]
    cases += [(0, 5, 0), (0xFFFFFFFF, 0, 32), (0xFFFFFFFF, 0, 33), (0xFFFFFFFF, 31, -32), (1 << 31, 0, 1),
              (1, 31, -1), (0x80000001, 31, 0)]
    assert _fns_run(cases) == [_fns_reference(*c) for c in cases]


HALF = (11, -14, 15)
BF16 = (8, -126, 127)
_SOURCES = {"float": np.float32, "int": np.int32, "uint": np.uint32, "short": np.int16, "ushort": np.uint16,
            "ll": np.int64, "ull": np.uint64}
_C_TYPES = {"float": "float", "int": "int", "uint": "unsigned", "short": "short", "ushort": "unsigned short",
            "ll": "long long", "ull": "unsigned long long"}


def _sixteen_bit_values(bits, fmt):
    bits = np.asarray(bits, np.uint16)
    if fmt == HALF:
        return bits.view(np.float16).astype(np.float64).tolist()
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64).tolist()


def _conversion_inputs(source, rng):
    dtype = _SOURCES[source]
    if source == "float":
        return np.concatenate([
            random_floats(rng, 300, F32)[:150],
            (rng.standard_normal(200) * np.exp2(rng.integers(-30, 20, 200))).astype(np.float32),
            edge_floats(np.float32), np.float32([65504, 65519.99, 65520, 65536, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25,
                                                 1 + 2.0 ** -11, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -9, -(1 + 2.0 ** -11)])])
    info = np.iinfo(dtype)
    values = [info.min, info.max, 0, 1, 2049, 2051, 257, 16842753, 2 ** 24 + 2 ** 16, 65519, 65520]
    if info.min < 0:
        values += [-2049, -16842753, -65520]
    values = [v for v in values if info.min <= v <= info.max]
    randoms = rng.integers(info.min, info.max, 150, dtype=dtype, endpoint=True)
    small = rng.integers(max(info.min, -70000), min(info.max, 70000), 100, endpoint=True).astype(dtype)
    return np.concatenate([np.array(values, dtype), randoms, small])


@pytest.mark.parametrize("fmt", [HALF, BF16], ids=["half", "bfloat16"])
def test_conversions_to_16_bits_round_as_each_mode_says(fmt):
    # before: only __float2half_rn, __int2half_rn, __uint2half_rn, __float2bfloat16_rn/_rz and __int2bfloat16_rn
    # were declared, and __int2bfloat16_rn rounded through float (16842753 = 2^24 + 2^16 + 1 gave 2^24, a tie
    # once float had rounded it, instead of 2^24 + 2^17); __float2bfloat16_rz made a NaN infinity
    name = "half" if fmt == HALF else "bfloat16"
    t = "__half" if fmt == HALF else "__nv_bfloat16"
    rng = np.random.default_rng(7)
    inputs = {source: _conversion_inputs(source, rng) for source in _SOURCES}
    n = max(len(v) for v in inputs.values())
    calls = [(source, mode) for source in _SOURCES for mode in MODES]
    params = ", ".join(f"const {_C_TYPES[s]}* in_{s}" for s in _SOURCES)
    body = "\n".join(f"    o[{k} * n + i] = __{t[2:] if fmt == HALF else 'bfloat16'}_as_ushort(__{s}2{name}_{m}(in_{s}[i]));"
                     for k, (s, m) in enumerate(calls))
    code = ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
            f'extern "C" __global__ void convert({params}, unsigned short* o, int n) {{\n'
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n" + body + "\n}\n")
    args = [np.resize(inputs[s], n) for s in _SOURCES]
    o = np.zeros(len(calls) * n, np.uint16)
    llmcupy.RawModule(code=code, target="sim").get_function("convert")(((n + 127) // 128,), (128,),
                                                                       (*args, o, np.int32(n)))
    got = _sixteen_bit_values(o, fmt)
    wrong = []
    for k, (source, mode) in enumerate(calls):
        for i, x in enumerate(args[list(_SOURCES).index(source)].tolist()):
            exact = Fraction(x) if source != "float" or math.isfinite(x) else None
            expected = round_exact(exact, mode, fmt) if exact is not None else x
            if got[k * n + i] != expected:
                wrong.append(f"__{source}2{name}_{mode}({x!r}) = {got[k * n + i]!r}, exact rounding gives {expected!r}")
    assert not wrong, "\n".join(wrong[:10])


def test_16_bit_constructors_and_double_conversions_round_once():
    # before: a double, or an int past 2^24 (bfloat16), went through float first and was rounded twice
    code = r'''
    #include <cuda_fp16.h>
    #include <cuda_bf16.h>
    extern "C" __global__ void once(unsigned short* o) {
        o[0] = __half_as_ushort(__double2half(1.0 + 0x1p-11 + 0x1p-40));
        o[1] = __half_as_ushort(__half(1.0 + 0x1p-11 + 0x1p-40));
        o[2] = __bfloat16_as_ushort(__double2bfloat16(1.0 + 0x1p-8 + 0x1p-40));
        o[3] = __bfloat16_as_ushort(__nv_bfloat16(16842753));
        o[4] = __bfloat16_as_ushort(__nv_bfloat16(16842753ll));
        o[5] = __bfloat16_as_ushort(__nv_bfloat16((unsigned long long)((1ull << 60) + (1ull << 52) + 1)));
        __half2 h = make_half2(__float2half(1.0f), __float2half(2.0f));
        __nv_bfloat162 b = make_bfloat162(__float2bfloat16(3.0f), __float2bfloat16(4.0f));
        o[6] = __half_as_ushort(h.y); o[7] = __bfloat16_as_ushort(b.x);
    }'''
    o = np.zeros(8, np.uint16)
    llmcupy.RawModule(code=code, target="sim").get_function("once")((1,), (1,), (o,))
    assert _sixteen_bit_values(o[:2], HALF) == [1 + 2.0 ** -10] * 2
    assert _sixteen_bit_values(o[2:6], BF16) == [1 + 2.0 ** -7, 2.0 ** 24 + 2.0 ** 17, 2.0 ** 24 + 2.0 ** 17,
                                                  2.0 ** 60 + 2.0 ** 53]
    assert _sixteen_bit_values(o[6:7], HALF) == [2.0] and _sixteen_bit_values(o[7:8], BF16) == [3.0]


def test_16_bit_math_on_pairs():
    # before: h2exp2, h2log, h2sin, h2rcp, h2floor, ..., hexp10 and hlog10 were not declared
    code = r'''
    #include <cuda_fp16.h>
    extern "C" __global__ void pairs(float* o) {
        __half2 a = make_half2(__float2half(0.5f), __float2half(2.0f));
        __half2 r[] = {h2exp2(a), h2exp10(a), h2log(a), h2log2(a), h2log10(a), h2rsqrt(a), h2rcp(a), h2sin(a),
                       h2cos(a), h2tanh(a), h2tanh_approx(a), h2floor(a), h2ceil(a), h2trunc(a), h2rint(a)};
        for (int i = 0; i < 15; ++i) { o[2 * i] = __low2float(r[i]); o[2 * i + 1] = __high2float(r[i]); }
        o[30] = __half2float(hexp10(__float2half(2.0f))); o[31] = __half2float(hlog10(__float2half(100.0f)));
    }'''
    o = np.zeros(32, np.float32)
    llmcupy.RawModule(code=code, target="sim").get_function("pairs")((1,), (1,), (o,))
    functions = [lambda x: 2 ** x, lambda x: 10 ** x, math.log, math.log2, math.log10, lambda x: 1 / math.sqrt(x),
                 lambda x: 1 / x, math.sin, math.cos, math.tanh, math.tanh, math.floor, math.ceil, math.trunc, round]
    # each is the function's value rounded to half (within one unit: the float result is rounded again)
    expected = np.array([f(x) for f in functions for x in (0.5, 2.0)] + [100.0, 2.0], np.float64)
    np.testing.assert_allclose(o, expected.astype(np.float16).astype(np.float32), rtol=2.0 ** -10, atol=0)
