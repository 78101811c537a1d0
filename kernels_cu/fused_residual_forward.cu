/*
fused_residual_forward: the residual add fused with the LayerNorm that follows it.
N = B*T rows of C channels. Inputs inp1, inp2 (N, C) (the residual stream and the branch output),
weight and bias (C,). Outputs:
    residual = inp1 + inp2                                  (N, C), kept for later layers
    normed   = (residual - mean) * rstd * weight + bias     (N, C)
    mean, rstd                                              (N,), saved for the backward pass
with mean = sum(r) / C, var = sum((r - mean)^2) / C (biased), rstd = 1 / sqrt(var + 1e-5).

Versions (same numbers as llm.c's dev/cuda/fused_residual_forward.cu, whose header lists only two
of them, with stale text):

version 1: unfused baseline, two launches: an elementwise add (one thread per element), then the
           naive LayerNorm (one thread per row, three serial passes re-reading the residual).
version 2: naive fusion, one thread per row: write the residual row while summing it, then
           re-read it for the variance and again to normalise. Uncoalesced (threads C apart).
version 3: one warp per row, block = (32, block/32): lane-strided coalesced scalar accesses; the
           residual is written, then re-read from global for an exact two-pass variance and for
           the normalisation. Sums by xor-butterfly warpReduceSum.
version 4: as version 3 with 128-bit packs (float4): inp1/inp2 are streamed, the residual is
           stored normally (it stays cached), sum(r) and sum(r^2) are accumulated during the add
           (var = E[r^2] - mean^2, one pass), then the normalisation walks the packs in REVERSE
           ("zig-zag") so the chunks written last, most likely still cached, are re-read first.
           The residual re-read is streamed, normed is written with streaming stores.
version 5: as version 4's shape, with everything in dynamic shared memory of (2 + block/32)*C
           floats: weight and bias staged by the whole block (before any warp leaves), plus one
           copy of the residual row per warp. The variance (exact two-pass again) and the
           normalisation read shared memory only.
version 6: persistent kernel, several warps per token: block (32, y, z) where y warps cooperate on
           a token and z token slots share the block; warps_per_token = max(1, C/4/32),
           z = max(1, (block/32)/warps_per_token), y = max(1, (block/32)/z). The grid fills the GPU
           once (resident threads / block, at most the number of token groups) and grid-strides
           over tokens. weight and bias are loaded into shared memory once per block. Each z slot
           has a residual row buffer and separate 32-float buffers for the cross-warp mean and
           variance partials (separate so one barrier per reduction suffices). Two-pass variance.
           __launch_bounds__(1024): sm_75's compiler otherwise gives it 66 registers, and 1024
           threads x 66 exceeds a T4's 64K registers per block (the launch would fail there).

Changes from llm.c (ours is correct where theirs relies on luck):
- v2-v5 guard rows with idx > N there; here idx >= N.
- v6 in llm.c keeps __syncthreads inside a per-slot token loop whose trip count differs between
  z slots when N is not a multiple of the block's token stride; here the loop runs over token
  groups, so every thread of a block makes the same number of trips (slots past N idle through
  the barriers).
- v4 clamps the one-pass variance at 0 so rounding can never feed a negative number to rsqrtf.
- mean and rstd are FP32 (llm.c's dev file stores them in floatX).
Versions 4-6 need C % 4 == 0 and 16-byte aligned pointers; v5/v6 need their shared memory to fit.
Default: version 6, llm.c's last step of the ladder (one weight/bias staging per block instead of
per row, several warps per token); llm.c's bf16 mainline adopts version 5.
*/

#include "common.cuh"

#define LN_EPS 1e-5f

// ----------------------------------------------------------------------------------------------
// version 1: separate residual add, then the naive LayerNorm

__global__ void fused_residual_forward_add_kernel1(float* out, const float* inp1, const float* inp2, int NC) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < NC) {
        out[idx] = inp1[idx] + inp2[idx];
    }
}

__global__ void fused_residual_forward_layernorm_kernel1(float* out, float* mean, float* rstd, const float* inp,
                                                         const float* weight, const float* bias, int N, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < N) {
        const float* x = inp + (size_t)idx * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++) m += x[i];
        m = m / C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        v = v / C;
        float s = 1.0f / sqrtf(v + LN_EPS);
        float* o = out + (size_t)idx * C;
        for (int i = 0; i < C; i++) {
            o[i] = s * (x[i] - m) * weight[i] + bias[i];
        }
        mean[idx] = m;
        rstd[idx] = s;
    }
}

// ----------------------------------------------------------------------------------------------
// version 2: one thread per row, fused

__global__ void fused_residual_forward_kernel2(float* residual, float* normed, float* mean, float* rstd,
                                               const float* inp1, const float* inp2,
                                               const float* weight, const float* bias, int N, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N) return;  // no barrier follows
    size_t off = (size_t)idx * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) {
        float r = inp1[off + i] + inp2[off + i];
        residual[off + i] = r;
        m += r;
    }
    m = m / C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) {
        float d = residual[off + i] - m;  // this thread's own writes
        v += d * d;
    }
    v = v / C;
    float s = 1.0f / sqrtf(v + LN_EPS);
    for (int i = 0; i < C; i++) {
        normed[off + i] = s * (residual[off + i] - m) * weight[i] + bias[i];
    }
    mean[idx] = m;
    rstd[idx] = s;
}

// ----------------------------------------------------------------------------------------------
// version 3: one warp per row, scalar, two-pass through global memory

__global__ void fused_residual_forward_kernel3(float* residual, float* normed, float* mean, float* rstd,
                                               const float* inp1, const float* inp2,
                                               const float* weight, const float* bias, int N, int C) {
    // blockDim.x == 32: threadIdx.y names the warp, and the whole warp shares idx
    int idx = blockIdx.x * blockDim.y + threadIdx.y;
    int lane = threadIdx.x;
    if (idx >= N) return;  // whole warps leave together; only warp collectives follow
    size_t off = (size_t)idx * C;

    float sum = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float r = inp1[off + i] + inp2[off + i];
        residual[off + i] = r;
        sum += r;
    }
    float m = warpReduceSum(sum) / C;

    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = residual[off + i] - m;  // the lane re-reads only what it wrote
        v += d * d;
    }
    float s = rsqrtf(warpReduceSum(v) / C + LN_EPS);

    for (int i = lane; i < C; i += 32) {
        normed[off + i] = s * (residual[off + i] - m) * weight[i] + bias[i];
    }
    if (lane == 0) {
        mean[idx] = m;
        rstd[idx] = s;
    }
}

// ----------------------------------------------------------------------------------------------
// version 4: one warp per row, float4 packs, one-pass statistics, zig-zag second pass

__global__ void fused_residual_forward_kernel4(float* residual, float* normed, float* mean, float* rstd,
                                               const float* inp1, const float* inp2,
                                               const float* weight, const float* bias, int N, int C) {
    int idx = blockIdx.x * blockDim.y + threadIdx.y;
    int lane = threadIdx.x;
    if (idx >= N) return;  // whole warps leave together
    size_t off = (size_t)idx * C;
    int packs = C / 4;

    float sum = 0.0f, sumsq = 0.0f;
    for (int p = lane; p < packs; p += 32) {
        float4 a = load128cs(inp1 + off + 4 * p);  // read once: streamed
        float4 b = load128cs(inp2 + off + 4 * p);
        float4 r;
        r.x = a.x + b.x;
        r.y = a.y + b.y;
        r.z = a.z + b.z;
        r.w = a.w + b.w;
        store128(residual + off + 4 * p, r);  // normal store: re-read below, wanted in cache
        sum += r.x + r.y + r.z + r.w;
        sumsq += r.x * r.x + r.y * r.y + r.z * r.z + r.w * r.w;
    }
    float m = warpReduceSum(sum) / C;
    float var = fmaxf(warpReduceSum(sumsq) / C - m * m, 0.0f);
    float s = rsqrtf(var + LN_EPS);

    // zig-zag: this lane's packs in reverse order, so the warp starts with the end of the row
    if (lane < packs) {
        for (int p = lane + ((packs - 1 - lane) / 32) * 32; p >= 0; p -= 32) {
            float4 r = load128cs(residual + off + 4 * p);  // last use of the residual here
            float4 w = load128(weight + 4 * p);
            float4 bb = load128(bias + 4 * p);
            float4 o;
            o.x = s * (r.x - m) * w.x + bb.x;
            o.y = s * (r.y - m) * w.y + bb.y;
            o.z = s * (r.z - m) * w.z + bb.z;
            o.w = s * (r.w - m) * w.w + bb.w;
            store128cs(normed + off + 4 * p, o);
        }
    }
    if (lane == 0) {
        __stcs(mean + idx, m);
        __stcs(rstd + idx, s);
    }
}

// ----------------------------------------------------------------------------------------------
// version 5: one warp per row, weight/bias and the residual row in shared memory

__global__ void fused_residual_forward_kernel5(float* residual, float* normed, float* mean, float* rstd,
                                               const float* inp1, const float* inp2,
                                               const float* weight, const float* bias, int N, int C) {
    extern __shared__ float smem[];  // (2 + blockDim.y) * C floats
    float* s_weight = smem;
    float* s_bias = smem + C;
    float* s_row = smem + (2 + threadIdx.y) * C;  // this warp's residual row
    int packs = C / 4;

    // the whole block stages weight and bias before any warp may leave
    int tid = threadIdx.y * 32 + threadIdx.x;
    for (int p = tid; p < packs; p += blockDim.x * blockDim.y) {
        store128(s_weight + 4 * p, load128(weight + 4 * p));
        store128(s_bias + 4 * p, load128(bias + 4 * p));
    }
    __syncthreads();

    int idx = blockIdx.x * blockDim.y + threadIdx.y;
    int lane = threadIdx.x;
    if (idx >= N) return;  // whole warps leave together, after the only barrier
    size_t off = (size_t)idx * C;

    float sum = 0.0f;
    for (int p = lane; p < packs; p += 32) {
        float4 a = load128cs(inp1 + off + 4 * p);
        float4 b = load128cs(inp2 + off + 4 * p);
        float4 r;
        r.x = a.x + b.x;
        r.y = a.y + b.y;
        r.z = a.z + b.z;
        r.w = a.w + b.w;
        store128cs(residual + off + 4 * p, r);  // not re-read from global by this kernel
        store128(s_row + 4 * p, r);
        sum += r.x + r.y + r.z + r.w;
    }
    float m = warpReduceSum(sum) / C;

    float v = 0.0f;
    for (int p = lane; p < packs; p += 32) {  // the lane's own packs: no barrier needed
        float4 r = load128(s_row + 4 * p);
        v += (r.x - m) * (r.x - m) + (r.y - m) * (r.y - m) + (r.z - m) * (r.z - m) + (r.w - m) * (r.w - m);
    }
    float s = rsqrtf(warpReduceSum(v) / C + LN_EPS);

    for (int p = lane; p < packs; p += 32) {
        float4 r = load128(s_row + 4 * p);
        float4 w = load128(s_weight + 4 * p);
        float4 bb = load128(s_bias + 4 * p);
        float4 o;
        o.x = s * (r.x - m) * w.x + bb.x;
        o.y = s * (r.y - m) * w.y + bb.y;
        o.z = s * (r.z - m) * w.z + bb.z;
        o.w = s * (r.w - m) * w.w + bb.w;
        store128cs(normed + off + 4 * p, o);
    }
    if (lane == 0) {
        __stcs(mean + idx, m);
        __stcs(rstd + idx, s);
    }
}

// ----------------------------------------------------------------------------------------------
// version 6: persistent, y warps per token, z tokens per block, weight/bias staged once per block

__global__ void __launch_bounds__(1024)
fused_residual_forward_kernel6(float* residual, float* normed, float* mean, float* rstd, const float* inp1,
                               const float* inp2, const float* weight, const float* bias, int N, int C) {
    // (2 + blockDim.z) * C floats, then blockDim.z * 32 mean partials and blockDim.z * 32 variance
    // partials
    extern __shared__ float smem[];
    float* s_weight = smem;
    float* s_bias = smem + C;
    float* s_row = smem + (2 + threadIdx.z) * C;
    float* s_mean = smem + (2 + blockDim.z) * C + threadIdx.z * 32;
    float* s_var = smem + (2 + blockDim.z) * C + blockDim.z * 32 + threadIdx.z * 32;
    int packs = C / 4;
    int lane = threadIdx.x;
    int warp_y = threadIdx.y;
    int warps_y = blockDim.y;

    int tid = (threadIdx.z * blockDim.y + threadIdx.y) * 32 + threadIdx.x;
    for (int p = tid; p < packs; p += blockDim.x * blockDim.y * blockDim.z) {
        store128(s_weight + 4 * p, load128(weight + 4 * p));
        store128(s_bias + 4 * p, load128(bias + 4 * p));
    }
    __syncthreads();

    // The loop runs over groups of blockDim.z tokens, so its trip count is the same for every
    // thread of the block and the barriers inside are always reached by all of them.
    for (int group = blockIdx.x * blockDim.z; group < N; group += gridDim.x * blockDim.z) {
        int idx = group + threadIdx.z;
        bool valid = idx < N;  // uniform per warp (a warp has one threadIdx.z)
        size_t off = (size_t)idx * C;

        float sum = 0.0f;
        if (valid) {
            for (int p = warp_y * 32 + lane; p < packs; p += warps_y * 32) {
                float4 a = load128cs(inp1 + off + 4 * p);
                float4 b = load128cs(inp2 + off + 4 * p);
                float4 r;
                r.x = a.x + b.x;
                r.y = a.y + b.y;
                r.z = a.z + b.z;
                r.w = a.w + b.w;
                store128cs(residual + off + 4 * p, r);
                store128(s_row + 4 * p, r);
                sum += r.x + r.y + r.z + r.w;
            }
        }
        sum = warpReduceSum(sum);
        if (lane == 0) s_mean[warp_y] = sum;
        __syncthreads();
        float m = warpReduceSum(lane < warps_y ? s_mean[lane] : 0.0f) / C;

        float v = 0.0f;
        if (valid) {
            for (int p = warp_y * 32 + lane; p < packs; p += warps_y * 32) {  // own packs only
                float4 r = load128(s_row + 4 * p);
                v += (r.x - m) * (r.x - m) + (r.y - m) * (r.y - m) + (r.z - m) * (r.z - m) + (r.w - m) * (r.w - m);
            }
        }
        v = warpReduceSum(v);
        // s_var, not s_mean: a slower warp may still be reading s_mean[] of this token
        if (lane == 0) s_var[warp_y] = v;
        __syncthreads();
        float s = rsqrtf(warpReduceSum(lane < warps_y ? s_var[lane] : 0.0f) / C + LN_EPS);
        // No third barrier is needed: every read of s_mean[] happens before the barrier above and
        // the next write after it; every read of s_var[] happens before the next token's first
        // barrier and the next write after that one.

        if (valid) {
            for (int p = warp_y * 32 + lane; p < packs; p += warps_y * 32) {
                float4 r = load128(s_row + 4 * p);
                float4 w = load128(s_weight + 4 * p);
                float4 bb = load128(s_bias + 4 * p);
                float4 o;
                o.x = s * (r.x - m) * w.x + bb.x;
                o.y = s * (r.y - m) * w.y + bb.y;
                o.z = s * (r.z - m) * w.z + bb.z;
                o.w = s * (r.w - m) * w.w + bb.w;
                store128(normed + off + 4 * p, o);
            }
            if (warp_y == 0 && lane == 0) {
                mean[idx] = m;
                rstd[idx] = s;
            }
        }
    }
}
