// CPU twins of kernels/elementwise.cu.
#pragma once
#include <cstdint>

namespace sprint {
namespace cpu {

void relu_fwd_f32(const float* x, float* y, int64_t n);  // y may be x
void relu_bwd_f32(const float* y, const float* dy, float* dx, int64_t n);
// x viewed as (outer, channels, inner): y = x + b[c], then ReLU if relu; y may be x
void bias_act_f32(const float* x, const float* b, float* y, int64_t outer, int channels,
                  int64_t inner, bool relu);

}  // namespace cpu
}  // namespace sprint
