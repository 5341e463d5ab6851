// Host launchers of kernels/pool.cu (the kernel source is compiled here).
#include "cuda_launch.h"
#include "launch_util.cuh"

#include "pool.cu"

namespace sprint {
namespace cuda {

int maxpool_fwd_f32(const float* x, float* y, std::int32_t* argmax, const PoolGeom& g, std::uintptr_t stream) {
    const i64 n = size_product({g.planes, g.OH, g.OW});
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_maxpool_fwd_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(
        x, y, argmax, g.planes, g.H, g.W, g.OH, g.OW, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw);
    return launch_status();
}

int maxpool_bwd_f32(const float* dy, const std::int32_t* argmax, float* dx, const PoolGeom& g,
                    std::uintptr_t stream) {
    const i64 n = size_product({g.planes, g.H, g.W});
    if (n < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_maxpool_bwd_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(
        dy, argmax, dx, g.planes, g.H, g.W, g.OH, g.OW, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw);
    return launch_status();
}

}  // namespace cuda
}  // namespace sprint
