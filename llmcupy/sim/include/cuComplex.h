// Stand-in for <cuComplex.h> in the CPU emulator: cuFloatComplex / cuDoubleComplex are float2 /
// double2 with CUDA's helper functions.
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim.h"
typedef float2 cuFloatComplex;
typedef double2 cuDoubleComplex;
typedef cuFloatComplex cuComplex;
inline float cuCrealf(cuFloatComplex x) { return x.x; }
inline float cuCimagf(cuFloatComplex x) { return x.y; }
inline cuFloatComplex make_cuFloatComplex(float r, float i) { return make_float2(r, i); }
inline cuFloatComplex make_cuComplex(float r, float i) { return make_float2(r, i); }
inline cuFloatComplex cuConjf(cuFloatComplex x) { return make_float2(x.x, -x.y); }
inline cuFloatComplex cuCaddf(cuFloatComplex a, cuFloatComplex b) { return make_float2(a.x + b.x, a.y + b.y); }
inline cuFloatComplex cuCsubf(cuFloatComplex a, cuFloatComplex b) { return make_float2(a.x - b.x, a.y - b.y); }
inline cuFloatComplex cuCmulf(cuFloatComplex a, cuFloatComplex b) { return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }
inline cuFloatComplex cuCdivf(cuFloatComplex a, cuFloatComplex b) {
    float s = std::fabs(b.x) + std::fabs(b.y), ars = a.x / s, ais = a.y / s, brs = b.x / s, bis = b.y / s;
    float d = brs * brs + bis * bis;
    return make_float2((ars * brs + ais * bis) / d, (ais * brs - ars * bis) / d);
}
inline float cuCabsf(cuFloatComplex x) { return std::hypot(x.x, x.y); }
inline cuFloatComplex cuCfmaf(cuFloatComplex x, cuFloatComplex y, cuFloatComplex d) { return cuCaddf(cuCmulf(x, y), d); }
inline double cuCreal(cuDoubleComplex x) { return x.x; }
inline double cuCimag(cuDoubleComplex x) { return x.y; }
inline cuDoubleComplex make_cuDoubleComplex(double r, double i) { return make_double2(r, i); }
inline cuDoubleComplex cuConj(cuDoubleComplex x) { return make_double2(x.x, -x.y); }
inline cuDoubleComplex cuCadd(cuDoubleComplex a, cuDoubleComplex b) { return make_double2(a.x + b.x, a.y + b.y); }
inline cuDoubleComplex cuCsub(cuDoubleComplex a, cuDoubleComplex b) { return make_double2(a.x - b.x, a.y - b.y); }
inline cuDoubleComplex cuCmul(cuDoubleComplex a, cuDoubleComplex b) { return make_double2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }
inline cuDoubleComplex cuCdiv(cuDoubleComplex a, cuDoubleComplex b) {
    double s = std::fabs(b.x) + std::fabs(b.y), ars = a.x / s, ais = a.y / s, brs = b.x / s, bis = b.y / s;
    double d = brs * brs + bis * bis;
    return make_double2((ars * brs + ais * bis) / d, (ais * brs - ars * bis) / d);
}
inline double cuCabs(cuDoubleComplex x) { return std::hypot(x.x, x.y); }
inline cuDoubleComplex cuCfma(cuDoubleComplex x, cuDoubleComplex y, cuDoubleComplex d) { return cuCadd(cuCmul(x, y), d); }
inline cuDoubleComplex cuComplexFloatToDouble(cuFloatComplex c) { return make_double2(c.x, c.y); }
inline cuFloatComplex cuComplexDoubleToFloat(cuDoubleComplex c) { return make_float2(float(c.x), float(c.y)); }
#include "llmcupy_sim_nvrtc_names_on.h"
