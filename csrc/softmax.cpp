#include "softmax.h"

#include <cmath>

namespace sprint {
namespace cpu {


template <typename L>
double softmax_xent_f32(const float* logits, const L* labels, float* probs, float* dlogits,
                        float* row_loss, int64_t N, int K, float inv_n) {
#pragma omp parallel for schedule(static) if (N * K >= 16384)
    for (int64_t r = 0; r < N; ++r) {
        const float* x = logits + r * K;
        float* p = probs + r * K;
        float* d = dlogits + r * K;
        float m = -3.402823466e38f;
#pragma omp simd reduction(max : m)
        for (int j = 0; j < K; ++j) m = x[j] > m ? x[j] : m;  // NaN skipped, like fmaxf
        float s = 0.0f;
        for (int j = 0; j < K; ++j) {  // max subtracted: exp() stays in [0, 1]
            const float e = std::exp(x[j] - m);
            p[j] = e;
            s += e;
        }
        const float inv_s = 1.0f / s;
        const int64_t lab = static_cast<int64_t>(labels[r]);
#pragma omp simd
        for (int j = 0; j < K; ++j) {
            const float pj = p[j] * inv_s;
            p[j] = pj;
            d[j] = pj * inv_n;
        }
        d[lab] = (p[lab] - 1.0f) * inv_n;
        const float loss = std::log(s) - (x[lab] - m);
        row_loss[r] = loss;
    }
    double total = 0.0;  // summed in row order: the same bits for any thread count
    for (int64_t r = 0; r < N; ++r) total += row_loss[r];
    return total / double(N);
}

template double softmax_xent_f32<int32_t>(const float*, const int32_t*, float*, float*, float*,
                                          int64_t, int, float);
template double softmax_xent_f32<int64_t>(const float*, const int64_t*, float*, float*, float*,
                                          int64_t, int, float);

}  // namespace cpu
}  // namespace sprint
