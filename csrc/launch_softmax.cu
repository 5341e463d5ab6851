// Host launcher of kernels/softmax.cu (the kernel source is compiled here).
#include "cuda_launch.h"
#include "launch_util.cuh"

#include "softmax.cu"

namespace sprint {
namespace cuda {

int softmax_xent_f32(const float* logits, const std::int64_t* labels, float* probs, float* dlogits,
                     float* row_loss, i64 N, i64 K, float inv_n, std::uintptr_t stream) {
    if (size_product({N, K}) < 0 || K < 1 || K > INT32_MAX) return kBadSize;
    if (N == 0) return 0;
    const unsigned blocks = unsigned(std::min<i64>(N, SPRINT_MAX_BLOCKS));
    sprint_softmax_xent_f32<<<blocks, softmax_block(K), 0, as_stream(stream)>>>(
        logits, reinterpret_cast<const long long*>(labels), probs, dlogits, row_loss, N, K, inv_n);
    return launch_status();
}

}  // namespace cuda
}  // namespace sprint
