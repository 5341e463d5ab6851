#include "elementwise.h"

namespace sprint {
namespace cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 16;
}

// Outputs may alias inputs (in-place ReLU), so no __restrict; omp simd still
// vectorizes since each index is read before it is written.
void relu_fwd_f32(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = v < 0.0f ? 0.0f : v;  // NaN propagates, as on the GPU
    }
}

void relu_bwd_f32(const float* y, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
        const float g = dy[i];  // read unconditionally: a select, not a branch
        dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
}

void bias_act_f32(const float* x, const float* b, float* y, int64_t outer, int channels,
                  int64_t inner, bool relu) {
    const int64_t rows = outer * channels;
#pragma omp parallel for schedule(static) if (rows * inner >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
        const float bc = b[r % channels];
        const float* xr = x + r * inner;
        float* yr = y + r * inner;
        if (relu) {
#pragma omp simd
            for (int64_t i = 0; i < inner; ++i) {
                const float v = xr[i] + bc;
                yr[i] = v < 0.0f ? 0.0f : v;
            }
        } else {
#pragma omp simd
            for (int64_t i = 0; i < inner; ++i) yr[i] = xr[i] + bc;
        }
    }
}

}  // namespace cpu
}  // namespace sprint
