// Stand-in for <curand_kernel.h> in the CPU emulator: device-side cuRAND generators.
//
// Philox4_32_10 follows the published Philox 4x32-10 algorithm (Salmon et al., SC'11) with
// cuRAND's documented state layout: the key is the seed, the subsequence selects the high 64 bits
// of the 128-bit counter, the offset skips single outputs. curand_uniform maps a 32-bit draw to
// (0, 1]; curand_normal is a Box-Muller pair. XORWOW (curandState, cuRAND's default) is Marsaglia's
// xorwow; its seeding and skip-ahead do not reproduce cuRAND's sequences (they use precomputed
// jump matrices), so with XORWOW expect the same distribution, not the same numbers as a GPU.
#pragma once
#include "llmcupy_sim_nvrtc_names_off.h"  // the kernel's renames of std, uint32_t, ... are off in here
#include "llmcupy_sim.h"

#define CURAND_2POW32_INV (2.3283064e-10f)
#define CURAND_2POW32_INV_2PI (2.3283064e-10f * 6.2831855f)

struct curandStatePhilox4_32_10 {
    uint4 ctr;
    uint2 key;
    uint4 output;
    unsigned int STATE;
    int boxmuller_flag;
    float boxmuller_extra;
};
typedef curandStatePhilox4_32_10 curandStatePhilox4_32_10_t;

struct curandStateXORWOW {
    unsigned int d, v[5];
    int boxmuller_flag;
    float boxmuller_extra;
};
typedef curandStateXORWOW curandStateXORWOW_t;
typedef curandStateXORWOW curandState_t;
typedef curandStateXORWOW curandState;

namespace llmcupy_sim {
inline uint4 philox_round(uint4 c, uint2 k) {
    unsigned long long p0 = 0xD2511F53ull * c.x, p1 = 0xCD9E8D57ull * c.z;
    return make_uint4(unsigned(p1 >> 32) ^ c.y ^ k.x, unsigned(p1), unsigned(p0 >> 32) ^ c.w ^ k.y, unsigned(p0));
}
inline uint4 philox4x32_10(uint4 c, uint2 k) {
    for (int i = 0; i < 10; ++i) {
        c = philox_round(c, k);
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}
inline void philox_add(uint4& c, unsigned long long n) {
    unsigned long long lo = (unsigned long long)c.x | ((unsigned long long)c.y << 32);
    unsigned long long sum = lo + n;
    c.x = unsigned(sum);
    c.y = unsigned(sum >> 32);
    if (sum < lo && ++c.z == 0) ++c.w;
}
inline float2 box_muller(unsigned x, unsigned y) {
    float u = x * CURAND_2POW32_INV + CURAND_2POW32_INV / 2.0f;
    float v = y * CURAND_2POW32_INV_2PI + CURAND_2POW32_INV_2PI / 2.0f;
    float s = std::sqrt(-2.0f * std::log(u));
    return make_float2(std::sin(v) * s, std::cos(v) * s);
}
}  // namespace llmcupy_sim

inline void skipahead(unsigned long long n, curandStatePhilox4_32_10_t* s) {
    s->STATE += unsigned(n & 3);
    n /= 4;
    if (s->STATE > 3) { n += 1; s->STATE -= 4; }
    llmcupy_sim::philox_add(s->ctr, n);
    s->output = llmcupy_sim::philox4x32_10(s->ctr, s->key);
}
inline void skipahead_sequence(unsigned long long n, curandStatePhilox4_32_10_t* s) {
    unsigned long long hi = (unsigned long long)s->ctr.z | ((unsigned long long)s->ctr.w << 32);
    hi += n;
    s->ctr.z = unsigned(hi);
    s->ctr.w = unsigned(hi >> 32);
    s->output = llmcupy_sim::philox4x32_10(s->ctr, s->key);
}
inline void curand_init(unsigned long long seed, unsigned long long subsequence, unsigned long long offset,
                        curandStatePhilox4_32_10_t* s) {
    s->ctr = make_uint4(0, 0, 0, 0);
    s->key = make_uint2(unsigned(seed), unsigned(seed >> 32));
    s->STATE = 0;
    s->boxmuller_flag = 0;
    s->boxmuller_extra = 0.0f;
    skipahead_sequence(subsequence, s);
    skipahead(offset, s);
}
inline unsigned int curand(curandStatePhilox4_32_10_t* s) {
    unsigned int words[4] = {s->output.x, s->output.y, s->output.z, s->output.w};
    unsigned int r = words[s->STATE++];
    if (s->STATE == 4) {
        llmcupy_sim::philox_add(s->ctr, 1);
        s->output = llmcupy_sim::philox4x32_10(s->ctr, s->key);
        s->STATE = 0;
    }
    return r;
}
inline uint4 curand4(curandStatePhilox4_32_10_t* s) {
    uint4 r;
    r.x = curand(s); r.y = curand(s); r.z = curand(s); r.w = curand(s);
    return r;
}

inline void curand_init(unsigned long long seed, unsigned long long subsequence, unsigned long long offset,
                        curandStateXORWOW_t* s) {
    // splitmix64 of (seed, subsequence) fills the state; then `offset` draws are skipped.
    unsigned long long z = seed ^ (subsequence * 0x9E3779B97F4A7C15ull);
    auto next = [&z] {
        z += 0x9E3779B97F4A7C15ull;
        unsigned long long x = z;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        return unsigned((x ^ (x >> 31)) | 1u);
    };
    for (unsigned& v : s->v) v = next();
    s->d = 6615241u;
    s->boxmuller_flag = 0;
    s->boxmuller_extra = 0.0f;
    for (unsigned long long i = 0; i < offset; ++i) {
        unsigned t = s->v[0] ^ (s->v[0] >> 2);
        s->v[0] = s->v[1]; s->v[1] = s->v[2]; s->v[2] = s->v[3]; s->v[3] = s->v[4];
        s->v[4] = (s->v[4] ^ (s->v[4] << 4)) ^ (t ^ (t << 1));
        s->d += 362437u;
    }
}
inline unsigned int curand(curandStateXORWOW_t* s) {
    unsigned t = s->v[0] ^ (s->v[0] >> 2);
    s->v[0] = s->v[1]; s->v[1] = s->v[2]; s->v[2] = s->v[3]; s->v[3] = s->v[4];
    s->v[4] = (s->v[4] ^ (s->v[4] << 4)) ^ (t ^ (t << 1));
    s->d += 362437u;
    return s->v[4] + s->d;
}

template <typename S>
inline float curand_uniform(S* s) { return curand(s) * CURAND_2POW32_INV + CURAND_2POW32_INV / 2.0f; }
template <typename S>
inline double curand_uniform_double(S* s) {
    unsigned long long x = ((unsigned long long)curand(s) << 21) ^ curand(s);
    return double(x) * (1.0 / 9007199254740992.0) + (1.0 / 9007199254740992.0) / 2.0;
}
template <typename S>
inline float curand_normal(S* s) {
    if (s->boxmuller_flag) {
        s->boxmuller_flag = 0;
        return s->boxmuller_extra;
    }
    unsigned x = curand(s), y = curand(s);
    float2 v = llmcupy_sim::box_muller(x, y);
    s->boxmuller_extra = v.y;
    s->boxmuller_flag = 1;
    return v.x;
}
template <typename S>
inline float2 curand_normal2(S* s) {
    unsigned x = curand(s), y = curand(s);
    return llmcupy_sim::box_muller(x, y);
}
inline float4 curand_uniform4(curandStatePhilox4_32_10_t* s) {
    uint4 r = curand4(s);
    return make_float4(r.x * CURAND_2POW32_INV + CURAND_2POW32_INV / 2.0f, r.y * CURAND_2POW32_INV + CURAND_2POW32_INV / 2.0f,
                       r.z * CURAND_2POW32_INV + CURAND_2POW32_INV / 2.0f, r.w * CURAND_2POW32_INV + CURAND_2POW32_INV / 2.0f);
}
inline float4 curand_normal4(curandStatePhilox4_32_10_t* s) {
    uint4 r = curand4(s);
    float2 a = llmcupy_sim::box_muller(r.x, r.y), b = llmcupy_sim::box_muller(r.z, r.w);
    return make_float4(a.x, a.y, b.x, b.y);
}
template <typename S>
inline float curand_log_normal(S* s, float mean, float stddev) { return std::exp(mean + stddev * curand_normal(s)); }
#include "llmcupy_sim_nvrtc_names_on.h"
