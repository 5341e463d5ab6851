// Host launchers of kernels/vector.cu (the kernel source is compiled here).
#include "cuda_launch.h"
#include "launch_util.cuh"

#include "vector.cu"

namespace sprint {
namespace cuda {

int axpy_f32(float* y, const float* x, float alpha, i64 n, std::uintptr_t stream) {
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_axpy_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(y, x, alpha, n);
    return launch_status();
}

int scale_f32(float* x, float alpha, i64 n, std::uintptr_t stream) {
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_scale_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(x, alpha, n);
    return launch_status();
}

int sum_into_f32(float* out, const float* const* bufs, int nbufs, i64 n, std::uintptr_t stream) {
    if (n < 0) return kBadSize;
    if (n == 0 || nbufs < 1) return 0;
    // 8 buffers per pass; later passes carry the running sum in as b0 (same
    // summation order as the CPU twin: left to right).
    for (int first = 0; first < nbufs;) {
        const float* b[8] = {};
        int k = 0;
        if (first > 0) b[k++] = out;
        while (k < 8 && first < nbufs) b[k++] = bufs[first++];
        sprint_sum_into_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(
            out, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], k, n);
        if (const int e = launch_status()) return e;
    }
    return 0;
}

int momentum_step_f32(float* w, float* delta, const float* upd, float nu, i64 n, std::uintptr_t stream) {
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_momentum_step_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(w, delta, upd, nu, n);
    return launch_status();
}

int sgd_update_f32(float* w, float* v, const float* g, float lr, float momentum, float wd, i64 n,
                   std::uintptr_t stream) {
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_sgd_update_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(w, v, g, lr, momentum, wd, n);
    return launch_status();
}

}  // namespace cuda
}  // namespace sprint
