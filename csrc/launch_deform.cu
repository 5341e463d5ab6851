// Host launchers of kernels/deform.cu (the kernel source is compiled here).
#include "cuda_launch.h"
#include "launch_util.cuh"

#include "deform.cu"

namespace sprint {
namespace cuda {

int deform_u8(const std::uint8_t* x, const float* params, const float* mean, const float* stdv, float* out,
              const DeformGeom& g, std::uintptr_t stream) {
    const i64 n = size_product({g.N, g.C, g.OH, g.OW});
    if (n < 0 || size_product({g.N, g.C, g.H, g.W}) < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_deform_u8<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(x, params, mean, stdv, out, g.N, g.C,
                                                                         g.H, g.W, g.OH, g.OW);
    return launch_status();
}

int deform_f32(const float* x, const float* params, const float* mean, const float* stdv, float* out,
               const DeformGeom& g, std::uintptr_t stream) {
    const i64 n = size_product({g.N, g.C, g.OH, g.OW});
    if (n < 0 || size_product({g.N, g.C, g.H, g.W}) < 0) return kBadSize;
    if (n == 0) return 0;
    sprint_deform_f32<<<grid_1d(n), SPRINT_BLOCK, 0, as_stream(stream)>>>(x, params, mean, stdv, out, g.N, g.C,
                                                                          g.H, g.W, g.OH, g.OW);
    return launch_status();
}

}  // namespace cuda
}  // namespace sprint
