// CPU twins of kernels/vector.cu: in-place updates of flat float32 buffers.
#pragma once
#include <cstdint>

namespace sprint {
namespace cpu {

void axpy_f32(float* y, const float* x, float alpha, int64_t n);
void scale_f32(float* x, float alpha, int64_t n);
// out = bufs[0] + ... + bufs[nbufs-1], summed left to right
void sum_into_f32(float* out, const float* const* bufs, int nbufs, int64_t n);
void momentum_step_f32(float* w, float* delta, const float* upd, float nu, int64_t n);
void sgd_update_f32(float* w, float* v, const float* g, float lr, float momentum, float wd,
                    int64_t n);

}  // namespace cpu
}  // namespace sprint
