// Memory-bound loops over flat buffers; threads only pay off past ~64K floats
// (below that the fork/join costs more than the loop on 2 cores).
#include "vector.h"

namespace sprint {
namespace cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 16;
}

void axpy_f32(float* __restrict y, const float* __restrict x, float alpha, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void scale_f32(float* __restrict x, float alpha, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

void sum_into_f32(float* out, const float* const* bufs, int nbufs, int64_t n) {
    // Blocked so that a block of out stays in L1 across the passes over the
    // buffers. Each pass reads before it writes the same index, so out may be
    // bufs[0]; 0 + b0 first, as the CUDA kernel does (same bits, -0 included).
    constexpr int64_t kBlock = 4096;
    const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
        const int64_t lo = blk * kBlock, len = lo + kBlock < n ? kBlock : n - lo;
        float* o = out + lo;
        const float* b0 = bufs[0] + lo;
        if (nbufs == 1) {
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) o[i] = 0.0f + b0[i];
            continue;
        }
        const float* b1 = bufs[1] + lo;
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) o[i] = (0.0f + b0[i]) + b1[i];
        for (int k = 2; k < nbufs; ++k) {
            const float* b = bufs[k] + lo;
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) o[i] += b[i];
        }
    }
}

void momentum_step_f32(float* __restrict w, float* __restrict delta,
                       const float* __restrict upd, float nu, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
        const float d = nu * delta[i] + upd[i];
        delta[i] = d;
        w[i] += d;
    }
}

void sgd_update_f32(float* __restrict w, float* __restrict v, const float* __restrict g,
                    float lr, float momentum, float wd, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
        const float vi = momentum * v[i] - lr * (g[i] + wd * w[i]);
        v[i] = vi;
        w[i] += vi;
    }
}

}  // namespace cpu
}  // namespace sprint
