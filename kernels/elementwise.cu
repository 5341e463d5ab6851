// Elementwise kernels of the layers: ReLU forward/backward and a fused
// per-channel bias-add + optional ReLU. CPU twin: csrc/elementwise.cpp.
#include "common.cuh"

// y = max(x, 0); NaN propagates (v < 0 is false for NaN) so divergence stays
// visible. y may be x.
extern "C" __global__ void sprint_relu_fwd_f32(const float* x, float* y, i64 n) {
    SPRINT_FOR(i, n) {
        const float v = x[i];
        y[i] = v < 0.0f ? 0.0f : v;
    }
}

// dx = dy where y > 0, else 0 (the mask is taken from the forward output).
extern "C" __global__ void sprint_relu_bwd_f32(const float* y, const float* dy, float* dx, i64 n) {
    SPRINT_FOR(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// x viewed as (outer, channels, inner): y = x + b[c], then ReLU if relu != 0.
// y may be x.
extern "C" __global__ void sprint_bias_act_f32(const float* x, const float* b, float* y, i64 n,
                                               i64 channels, i64 inner, i64 relu) {
    SPRINT_FOR(i, n) {
        const float v = x[i] + b[(i / inner) % channels];
        y[i] = (relu && v < 0.0f) ? 0.0f : v;
    }
}
