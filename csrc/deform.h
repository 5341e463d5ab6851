// CPU twin of kernels/deform.cu: scale jitter + crop offset + flip, bilinear,
// zero outside, then (v / in_div - mean[c]) / std[c]. See the kernel for the mapping.
#pragma once
#include <cstdint>

namespace sprint {

struct DeformGeom {
    int64_t N;
    int C, H, W, OH, OW;
};

// Validates the sizes (int64, nothing can overflow) and fills *g; nullptr when
// valid, else a message that starts with the name of the bad argument.
inline const char* deform_geom_make(int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW,
                                    DeformGeom* g) {
    if (N < 0) return "x: batch must be >= 0";
    if (C < 1 || C > INT32_MAX) return "x: channels must be in [1, 2^31)";
    if (H < 1 || W < 1 || H > INT32_MAX || W > INT32_MAX || H * W > INT32_MAX)
        return "x: image sides must be >= 1 with H*W < 2^31";
    if (OH < 1 || OW < 1 || OH > INT32_MAX || OW > INT32_MAX || OH * OW > INT32_MAX)
        return "out_hw: sides must be >= 1 with oh*ow < 2^31";
    const int64_t plane = H * W > OH * OW ? H * W : OH * OW;
    if (N > (INT64_MAX / 8) / plane / C) return "x: too many elements";
    *g = DeformGeom{N, int(C), int(H), int(W), int(OH), int(OW)};
    return nullptr;
}

namespace cpu {

template <typename T>
void deform(const T* x, const float* params, const float* mean, const float* stdv, float* out,
            const DeformGeom& g);

}  // namespace cpu
}  // namespace sprint
