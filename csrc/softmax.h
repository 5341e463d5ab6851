// CPU twin of kernels/softmax.cu: row-wise softmax + cross-entropy + gradient.
#pragma once
#include <cstdint>

namespace sprint {

// Threads per row block of the CUDA kernel: a warp for small K, up to 256
// (engine/ops/softmax.py uses the same rule for the RawModule path).
inline int softmax_block(int64_t K) { return K <= 32 ? 32 : K <= 64 ? 64 : K <= 128 ? 128 : 256; }

namespace cpu {

// probs = softmax(logits), dlogits = (probs - onehot) * inv_n, row_loss = -log p[label].
// Labels must lie in 0..K-1 (checked by the caller). Returns the mean of row_loss (double sum).
template <typename L>
double softmax_xent_f32(const float* logits, const L* labels, float* probs, float* dlogits,
                        float* row_loss, int64_t N, int K, float inv_n);

}  // namespace cpu
}  // namespace sprint
