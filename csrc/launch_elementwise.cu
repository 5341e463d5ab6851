// Host launchers of kernels/elementwise.cu (the kernel source is compiled here).
#include "cuda_launch.h"
#include "launch_util.cuh"

#include "elementwise.cu"

namespace sprint {
namespace cuda {

int relu_fwd_f32(const float* x, float* y, i64 n, std::uintptr_t stream) {
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_relu_fwd_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(x, y, n);
    return launch_status();
}

int relu_bwd_f32(const float* y, const float* dy, float* dx, i64 n, std::uintptr_t stream) {
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_relu_bwd_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(y, dy, dx, n);
    return launch_status();
}

int bias_act_f32(const float* x, const float* b, float* y, i64 outer, i64 channels, i64 inner, bool relu,
                 std::uintptr_t stream) {
    const i64 n = size_product({outer, channels, inner});
    if (n < 0 || channels < 1 || inner < 1) return kBadSize;
    if (n == 0) return 0;
    sprint_bias_act_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(x, b, y, n, channels, inner,
                                                                             relu ? 1 : 0);
    return launch_status();
}

}  // namespace cuda
}  // namespace sprint
