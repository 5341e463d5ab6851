// Host launchers of kernels/im2col.cu (the kernel source is compiled here).
#include "cuda_launch.h"
#include "launch_util.cuh"

#include "im2col.cu"

namespace sprint {
namespace cuda {

int im2col_f32(const float* x, float* cols, const ConvGeom& g, std::uintptr_t stream) {
    ConvGeom chk = g;
    if (conv_geom_check(chk)) return kBadSize;
    const i64 n = size_product({g.K(), g.B, g.P()});
    if (n == 0) return 0;
    sprint_im2col_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(
        x, cols, g.B, g.C, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.OH, g.OW);
    return launch_status();
}

int col2im_f32(const float* cols, float* x, const ConvGeom& g, std::uintptr_t stream) {
    ConvGeom chk = g;
    if (conv_geom_check(chk)) return kBadSize;
    const i64 n = size_product({g.B, g.C, g.H, g.W});
    if (n == 0) return 0;
    sprint_col2im_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(
        cols, x, g.B, g.C, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.OH, g.OW);
    return launch_status();
}

int cnhw_to_nchw_f32(const float* yt, const float* bias, float* y, i64 B, i64 M, i64 P, std::uintptr_t stream) {
    const i64 n = size_product({B, M, P});
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_cnhw_to_nchw_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(
        yt, bias, bias != nullptr, y, B, M, P);
    return launch_status();
}

int nchw_to_cnhw_f32(const float* y, float* out, i64 B, i64 M, i64 P, std::uintptr_t stream) {
    const i64 n = size_product({B, M, P});
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_nchw_to_cnhw_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(y, out, B, M, P);
    return launch_status();
}

int channel_sum_f32(const float* y, float* db, bool accumulate, i64 B, i64 M, i64 P, std::uintptr_t stream) {
    if (size_product({B, M, P}) < 0) return kBadSize;
    if (M == 0) return 0;
    const unsigned blocks = unsigned(std::min<i64>(M, SPRINT_MAX_BLOCKS));
    sprint_channel_sum_f32<<<blocks, SPRINT_BLOCK, 0, as_stream(stream)>>>(y, db, accumulate, B, M, P);
    return launch_status();
}

int add_channel_bias_f32(float* y, const float* bias, i64 B, i64 M, i64 P, std::uintptr_t stream) {
    const i64 n = size_product({B, M, P});
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_add_channel_bias_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(y, bias, B, M, P);
    return launch_status();
}

}  // namespace cuda
}  // namespace sprint
