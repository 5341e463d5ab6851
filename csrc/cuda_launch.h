// Host-side launchers of the CUDA kernels: declarations of ALL of them.
// Definitions live in csrc/launch_<op>.cu (nvcc); callers (the pybind11
// bindings) include only this header, which needs no CUDA headers.
//
// Conventions: device pointers are plain pointers, the stream is a uintptr_t
// (a cudaStream_t, 0 = legacy default stream); each launcher picks its own
// grid, launches and returns the cudaError_t of the launch as int (0 = ok).
// Sizes are int64 (grid-stride loops with 64-bit indices in the kernels).
#pragma once

#include <cstdint>

#include "deform.h"
#include "im2col.h"
#include "pool.h"
#include "softmax.h"

namespace sprint {
namespace cuda {

// ---- runtime helpers (launch_runtime.cu) ----
int device_count();                // 0 if no driver / no device
int synchronize();                 // cudaDeviceSynchronize
const char* error_string(int code);

// ---- im2col family (launch_im2col.cu; see im2col.h for layouts) ----
int im2col_f32(const float* x, float* cols, const ConvGeom& g, std::uintptr_t stream);
int col2im_f32(const float* cols, float* x, const ConvGeom& g, std::uintptr_t stream);
int cnhw_to_nchw_f32(const float* yt, const float* bias /*nullable*/, float* y, i64 B, i64 M, i64 P,
                     std::uintptr_t stream);
int nchw_to_cnhw_f32(const float* y, float* out, i64 B, i64 M, i64 P, std::uintptr_t stream);
int channel_sum_f32(const float* y, float* db, bool accumulate, i64 B, i64 M, i64 P, std::uintptr_t stream);
int add_channel_bias_f32(float* y, const float* bias, i64 B, i64 M, i64 P, std::uintptr_t stream);

// ---- K2: pool, softmax, elementwise, vector, deform (append below) ----
// pool (launch_pool.cu; geometry checked by pool_geom_make in pool.h)
int maxpool_fwd_f32(const float* x, float* y, std::int32_t* argmax, const PoolGeom& g, std::uintptr_t stream);
int maxpool_bwd_f32(const float* dy, const std::int32_t* argmax, float* dx, const PoolGeom& g,
                    std::uintptr_t stream);
// softmax + cross-entropy (launch_softmax.cu); labels int64 in 0..K-1
int softmax_xent_f32(const float* logits, const std::int64_t* labels, float* probs, float* dlogits,
                     float* row_loss, i64 N, i64 K, float inv_n, std::uintptr_t stream);
// elementwise (launch_elementwise.cu); outputs may be the inputs (in place)
int relu_fwd_f32(const float* x, float* y, i64 n, std::uintptr_t stream);
int relu_bwd_f32(const float* y, const float* dy, float* dx, i64 n, std::uintptr_t stream);
int bias_act_f32(const float* x, const float* b, float* y, i64 outer, i64 channels, i64 inner, bool relu,
                 std::uintptr_t stream);
// vector ops on flat buffers (launch_vector.cu); bufs is a host array of device pointers
int axpy_f32(float* y, const float* x, float alpha, i64 n, std::uintptr_t stream);
int scale_f32(float* x, float alpha, i64 n, std::uintptr_t stream);
int sum_into_f32(float* out, const float* const* bufs, int nbufs, i64 n, std::uintptr_t stream);
int momentum_step_f32(float* w, float* delta, const float* upd, float nu, i64 n, std::uintptr_t stream);
int sgd_update_f32(float* w, float* v, const float* g, float lr, float momentum, float wd, i64 n,
                   std::uintptr_t stream);
// deform (launch_deform.cu; see deform.h)
int deform_u8(const std::uint8_t* x, const float* params, const float* mean, const float* stdv, float* out,
              const DeformGeom& g, std::uintptr_t stream);
int deform_f32(const float* x, const float* params, const float* mean, const float* stdv, float* out,
               const DeformGeom& g, std::uintptr_t stream);

}  // namespace cuda
}  // namespace sprint
