// Vector kernels on flat float32 buffers: the optimizer and SPRINT's updater
// (SumGradient, AddMomentum, UpdateWeights) run on the flat parameter vector.
// Memory-bound: one element per thread step, grid-stride, 64-bit index.
// CPU twin: csrc/vector.cpp.
#include "common.cuh"

extern "C" __global__ void sprint_axpy_f32(float* __restrict__ y, const float* __restrict__ x,
                                           float alpha, i64 n) {
    SPRINT_FOR(i, n) { y[i] += alpha * x[i]; }
}

extern "C" __global__ void sprint_scale_f32(float* __restrict__ x, float alpha, i64 n) {
    SPRINT_FOR(i, n) { x[i] *= alpha; }
}

// out = b0 + b1 + ... (nbufs <= 8; unused pointers may be null), summed left to
// right like the CPU twin. Every buffer is read before out[i] is written, so
// out may be b0: callers chain more than 8 buffers by passing out back as b0.
extern "C" __global__ void sprint_sum_into_f32(float* out, const float* b0, const float* b1,
                                               const float* b2, const float* b3,
                                               const float* b4, const float* b5,
                                               const float* b6, const float* b7, i64 nbufs,
                                               i64 n) {
    const float* bufs[8] = {b0, b1, b2, b3, b4, b5, b6, b7};
    SPRINT_FOR(i, n) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k)  // unrolled: bufs[] stays in registers
            if (k < nbufs) s += bufs[k][i];
        out[i] = s;
    }
}

// delta = nu * delta + upd; w += delta   (SPRINT's AddMomentum + UpdateWeights)
extern "C" __global__ void sprint_momentum_step_f32(float* __restrict__ w, float* __restrict__ delta,
                                                    const float* __restrict__ upd, float nu,
                                                    i64 n) {
    SPRINT_FOR(i, n) {
        const float d = nu * delta[i] + upd[i];
        delta[i] = d;
        w[i] += d;
    }
}

// v = momentum * v - lr * (g + wd * w); w += v   (single-process SGD)
extern "C" __global__ void sprint_sgd_update_f32(float* __restrict__ w, float* __restrict__ v,
                                                 const float* __restrict__ g, float lr,
                                                 float momentum, float wd, i64 n) {
    SPRINT_FOR(i, n) {
        const float vi = momentum * v[i] - lr * (g[i] + wd * w[i]);
        v[i] = vi;
        w[i] += vi;
    }
}
