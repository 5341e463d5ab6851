// Max pooling over (planes, H, W), planes = N*C: geometry shared by the CPU
// twin and the CUDA bindings, and the CPU twin of kernels/pool.cu.
#pragma once
#include <cstdint>

namespace sprint {

struct PoolGeom {
    int64_t planes;
    int H, W, OH, OW, kh, kw, sh, sw, ph, pw;
};

// Validates a pooling geometry (all in int64, so nothing can overflow) and
// fills *g. Returns nullptr when valid, else a message that starts with the
// name of the bad argument. pad < k guarantees that every window holds at
// least one real pixel, so the argmax is always a real pixel.
inline const char* pool_geom_make(int64_t planes, int64_t H, int64_t W, int64_t kh, int64_t kw,
                                  int64_t sh, int64_t sw, int64_t ph, int64_t pw, PoolGeom* g) {
    constexpr int64_t kMaxParam = int64_t(1) << 24;
    if (kh < 1 || kw < 1 || kh > kMaxParam || kw > kMaxParam) return "k: window must be in [1, 2^24]";
    if (sh < 1 || sw < 1 || sh > kMaxParam || sw > kMaxParam) return "stride: must be in [1, 2^24]";
    if (ph < 0 || pw < 0) return "pad: must be >= 0";
    if (ph >= kh || pw >= kw) return "pad: must be smaller than the window k";
    if (planes < 0) return "x: batch and channels must be >= 0";
    if (H < 1 || W < 1) return "x: spatial size must be >= 1";
    if (H > INT32_MAX || W > INT32_MAX) return "x: plane too large for int32 indices";
    if (kh > H + 2 * ph || kw > W + 2 * pw) return "k: window larger than the padded input";
    // the padded plane bounds the input and the output plane: int32 indices
    if ((H + ph) * (W + pw) > INT32_MAX)
        return "x: plane too large for int32 indices";
    if (planes > (INT64_MAX / 8) / ((H + ph) * (W + pw))) return "x: too many elements";
    *g = PoolGeom{planes,
                  int(H), int(W),
                  int((H + 2 * ph - kh) / sh + 1), int((W + 2 * pw - kw) / sw + 1),
                  int(kh), int(kw), int(sh), int(sw), int(ph), int(pw)};
    return nullptr;
}

namespace cpu {

void maxpool_fwd_f32(const float* x, float* y, int32_t* argmax, const PoolGeom& g);
// dx[p, i] = sum of dy[p, o] over windows o whose argmax is i, in ascending o
// (the order of the CUDA kernel's gather: bit-identical results).
void maxpool_bwd_f32(const float* dy, const int32_t* argmax, float* dx, const PoolGeom& g);

}  // namespace cpu
}  // namespace sprint
