"""CUDA math functions the emulator declares beyond C's (erfinv, erfcinv, erfcx, normcdfinv, norm, rnorm,
rcbrt, rhypot, sinpi, cospi, sincospi, cyl_bessel_i0/i1, and their float forms), within the ulp bounds of
CUDA's Math API appendix, against mpmath at 50 digits.
"""

import math

import numpy as np
import pytest

import llmcupy

mpmath = pytest.importorskip("mpmath")
mpmath.mp.dps = 50

# function: (CUDA's maximum ulp error for double, for float), from the table "Maximum ULP Error" of the CUDA C++
# Programming Guide's appendix "Mathematical Functions" (standard functions, single and double precision). The
# emulator must do at least as well as a GPU here: a kernel validated in it must not lean on more accuracy than
# CUDA promises, but a looser bound would let a wrong formula pass (erfcinvf(1e-10) once gave infinity).
FUNCTIONS = {
    "erfinv": (lambda x: mpmath.erfinv(x), 5, 2),
    "normcdfinv": (lambda p: -mpmath.sqrt(2) * _erfcinv(2 * mpmath.mpf(p)), 7, 5),
    "erfcx": (lambda x: (0.0 if x > 0 else math.inf) if math.isinf(x) else mpmath.exp(mpmath.mpf(x) ** 2) * mpmath.erfc(x),
              3, 4),
    "cyl_bessel_i0": (lambda x: mpmath.besseli(0, x), 6, 6),
    "cyl_bessel_i1": (lambda x: mpmath.besseli(1, x), 6, 6),
    "rcbrt": (lambda x: math.copysign(math.inf, x) if x == 0 else
              1 / mpmath.cbrt(x) if x > 0 else -1 / mpmath.cbrt(-mpmath.mpf(x)), 1, 1),
    "sinpi": (lambda x: mpmath.sinpi(x), 1, 2),
    "cospi": (lambda x: mpmath.cospi(x), 1, 2),
}


def _erfcinv(z):
    """erfcinv(z) = erfinv(1 - z), with enough digits that 1 - z keeps all of a small z."""
    z = mpmath.mpf(z)
    if z == 0:
        return mpmath.inf
    if z > 1:
        return -_erfcinv(2 - z)
    with mpmath.workdps(60 + max(0, int(-mpmath.log10(z)))):
        return +mpmath.erfinv(1 - z)


FUNCTIONS["erfcinv"] = (_erfcinv, 6, 2)


def _as_float(value, dtype):
    """``value`` rounded to ``dtype``, as a Python float (infinity past its range)."""
    try:
        double = float(value)
    except OverflowError:
        double = math.copysign(math.inf, value)
    with np.errstate(over="ignore"):
        return float(np.array(double).astype(dtype))


def _ulps(got, want, dtype):
    """|got - want| in units of the last place of ``want`` in ``dtype`` (infinities and NaN must agree)."""
    if math.isnan(got) or mpmath.isnan(want):
        return 0 if math.isnan(got) and mpmath.isnan(want) else math.inf
    want_rounded = _as_float(want, dtype)
    if not math.isfinite(want_rounded) or not math.isfinite(got):
        return 0 if got == want_rounded else math.inf
    info = np.finfo(dtype)
    magnitude = abs(want_rounded)
    exponent = max(math.frexp(magnitude)[1] - 1, info.minexp) if magnitude else info.minexp
    ulp = 2.0 ** (exponent - info.nmant)
    return float(abs(mpmath.mpf(got) - want) / ulp)


def _inputs():
    """Per function, values where it is defined: the whole range, its tails, tiny and large arguments."""
    rng = np.random.default_rng(11)
    unit = np.concatenate([rng.uniform(-1, 1, 40), 1 - np.exp2(-rng.uniform(1, 52, 15)),
                           -(1 - np.exp2(-rng.uniform(1, 52, 5))), np.exp2(-rng.uniform(1, 1000, 15)), [0.5, -0.5, 1e-5]])
    two = np.concatenate([rng.uniform(0, 2, 40), np.exp2(-rng.uniform(1, 1020, 20)), 2 - np.exp2(-rng.uniform(1, 51, 10)),
                          [1.0, 0.5, 1.5]])
    probability = np.concatenate([rng.uniform(0, 1, 40), np.exp2(-rng.uniform(1, 1020, 20)),
                                  1 - np.exp2(-rng.uniform(1, 52, 10)), [0.5, 0.025, 0.975]])
    wide = np.concatenate([rng.uniform(-30, 30, 40), rng.uniform(-5, 5, 20), np.exp2(rng.uniform(-40, 20, 20)),
                           [0.0, 1.0, -1.0, 26.0, 27.0, 100.0, 1e5, 1e150]])
    bessel = np.concatenate([rng.uniform(-50, 50, 40), rng.uniform(-700, 700, 20), np.exp2(rng.uniform(-40, 3, 10)),
                             [0.0, 1.0, -1.0]])
    cube = np.concatenate([rng.uniform(-100, 100, 20), np.exp2(rng.uniform(-1000, 1000, 30)) * rng.choice([-1, 1], 30)])
    pi_args = np.concatenate([rng.uniform(-4, 4, 40), rng.uniform(-1e6, 1e6, 20), np.exp2(rng.uniform(-60, 60, 20)),
                              [0.0, 0.5, 1.0, 1.5, 2.0, -0.5, -1.0, 0.25, 1e15 + 0.5, 2.0 ** 52 + 1, 1.0 / 3]])
    return {"erfinv": unit, "erfcinv": two, "normcdfinv": probability, "erfcx": wide, "cyl_bessel_i0": bessel,
            "cyl_bessel_i1": bessel, "rcbrt": cube, "sinpi": pi_args, "cospi": pi_args}


@pytest.mark.parametrize("precision", ["double", "float"])
def test_math_functions_within_cudas_ulp_bounds(precision):
    # before: erfinv, erfcinv, erfcx(f), normcdfinv, cyl_bessel_i0/i1(f), rcbrt and sincospi were not declared;
    # erfcinvf(1e-10) gave infinity (it computed erfinvf(1 - y), and 1 - 1e-10 is 1 in float) and normcdfinvf of
    # a small probability -infinity likewise; sinpi(1) gave 1.2e-16 (sin(M_PI * x)) where CUDA gives 0
    dtype = np.float64 if precision == "double" else np.float32
    t = precision
    suffix = "" if precision == "double" else "f"
    inputs = _inputs()
    names = list(FUNCTIONS)
    n = max(len(v) for v in inputs.values())
    body = "\n".join(f"    o[{k} * n + i] = {name}{suffix}(x[{k} * n + i]);" for k, name in enumerate(names))
    code = (f'extern "C" __global__ void maths(const {t}* x, {t}* o, int n) {{\n'
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n" + body + "\n}\n")
    with np.errstate(over="ignore"):   # a double past float's range is infinity in the float test: also an input
        x = np.concatenate([np.resize(inputs[name], n) for name in names]).astype(dtype)
    o = np.zeros_like(x)
    llmcupy.RawModule(code=code, target="sim").get_function("maths")(((n + 63) // 64,), (64,), (x, o, np.int32(n)))
    wrong = []
    for k, name in enumerate(names):
        reference, double_bound, float_bound = FUNCTIONS[name]
        bound = double_bound if precision == "double" else float_bound
        for i in range(n):
            arg, got = float(x[k * n + i]), float(o[k * n + i])
            want = reference(arg)
            error = _ulps(got, want, dtype)
            if error > bound:
                wrong.append(f"{name}{suffix}({arg!r}) = {got!r}, want {mpmath.nstr(want, 20)} ({error:.3g} ulp)")
    assert not wrong, "\n".join(wrong[:15])


def test_norms_and_reciprocal_norms():
    # before: norm, normf, rnorm, rnormf, norm3d, norm4d, rnorm3d, rnorm4d, rnorm4df and rhypot were not declared
    code = r'''
    extern "C" __global__ void norms(const double* v, const float* f, double* o, float* of) {
        o[0] = norm(5, v); o[1] = rnorm(5, v); o[2] = norm3d(v[0], v[1], v[2]); o[3] = norm4d(v[0], v[1], v[2], v[3]);
        o[4] = rnorm3d(v[0], v[1], v[2]); o[5] = rnorm4d(v[0], v[1], v[2], v[3]); o[6] = rhypot(v[0], v[1]);
        o[7] = norm3d(1e300, 1e300, 0.0); o[8] = rnorm3d(1e-300, 1e-300, 0.0);
        of[0] = normf(5, f); of[1] = rnormf(5, f); of[2] = rnorm4df(f[0], f[1], f[2], f[3]);
        double inf_nan[] = {__longlong_as_double(0x7ff8000000000000ll), __longlong_as_double(0x7ff0000000000000ll)};
        o[9] = norm(2, inf_nan); o[10] = rnorm(2, inf_nan);
    }'''
    v = np.array([3.0, -4.0, 12.0, 84.0, 0.5])
    f = v.astype(np.float32)
    o, of = np.zeros(11), np.zeros(3, np.float32)
    llmcupy.RawModule(code=code, target="sim").get_function("norms")((1,), (1,), (v, f, o, of))

    def exact(values):
        return mpmath.sqrt(mpmath.fsum(mpmath.mpf(float(a)) ** 2 for a in values))
    want = [exact(v), 1 / exact(v), exact(v[:3]), exact(v[:4]), 1 / exact(v[:3]), 1 / exact(v[:4]), 1 / exact(v[:2]),
            mpmath.sqrt(2) * mpmath.mpf("1e300"), 1 / (mpmath.sqrt(2) * mpmath.mpf(1e-300))]
    # CUDA's bounds (the table above): norm 3, rnorm 2, norm3d/norm4d 2, rnorm3d/rnorm4d 1, rhypot 1 ulp;
    # normf 4, rnormf 3, rnorm4df 2 ulp
    double_bounds = [3, 2, 2, 2, 1, 1, 1, 2, 1]
    for got, w, bound in zip(o[:9].tolist(), want, double_bounds):
        assert _ulps(got, w, np.float64) <= bound, (got, w, bound)
    for got, w, bound in zip(of.tolist(), [exact(f), 1 / exact(f), 1 / exact(f[:4])], [4, 3, 2]):
        assert _ulps(got, w, np.float32) <= bound, (got, w, bound)
    assert o[9] == math.inf and o[10] == 0.0   # an infinite component wins over a NaN, as C's hypot


def test_sincospi_and_scoped_wrapping_atomics():
    # before: sincospi (double) and atomicInc/atomicDec's _block and _system forms were not declared
    code = r'''
    extern "C" __global__ void k(double* o, unsigned* c) {
        double s, co;
        sincospi(1.0 / 6.0, &s, &co);
        o[0] = s; o[1] = co;
        sincospi(3.0, &s, &co);
        o[2] = s; o[3] = co;
        atomicInc_block(c, 3u); atomicInc_system(c + 1, 3u); atomicDec_block(c + 2, 3u); atomicDec_system(c + 3, 3u);
    }'''
    o, c = np.zeros(4), np.zeros(4, np.uint32)
    llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (5,), (o, c))
    assert _ulps(o[0], mpmath.sinpi(mpmath.mpf(1.0 / 6.0)), np.float64) <= 1   # CUDA's bound for sincospi
    assert _ulps(o[1], mpmath.cospi(mpmath.mpf(1.0 / 6.0)), np.float64) <= 1
    assert o[2] == 0.0 and o[3] == -1.0
    # five threads: inc wraps 0 1 2 3 0 -> 1; dec from 0 gives 3, then 2 1 0 3 -> 3
    assert c.tolist() == [1, 1, 3, 3]


def test_double_complex_fma():
    # before: cuComplex.h had cuCfmaf but not cuCfma ("'cuCfma' was not declared in this scope")
    code = r'''
    #include <cuComplex.h>
    extern "C" __global__ void k(double* o) {
        cuDoubleComplex r = cuCfma(make_cuDoubleComplex(1, 2), make_cuDoubleComplex(3, 4), make_cuDoubleComplex(5, 6));
        o[0] = cuCreal(r); o[1] = cuCimag(r);
    }'''
    o = np.zeros(2)
    llmcupy.RawModule(code=code, target="sim").get_function("k")((1,), (1,), (o,))
    assert o.tolist() == [0.0, 16.0]   # (1 + 2i)(3 + 4i) + (5 + 6i) = (-5 + 10i) + (5 + 6i)


def test_fdividef():
    # before: "'fdividef' was not declared in this scope" (the Math API's name beside __fdividef)
    o = np.zeros(1, np.float32)
    llmcupy.RawModule(code='extern "C" __global__ void k(float* o) { o[0] = fdividef(3.0f, 4.0f); }',
                      target="sim").get_function("k")((1,), (1,), (o,))
    assert o[0] == 0.75
