#include "deform.h"

#include <cmath>

namespace sprint {
namespace cpu {

namespace {

template <typename T>
inline float px(const T* plane, int H, int W, int y, int x) {
    return (y >= 0 && y < H && x >= 0 && x < W) ? float(plane[int64_t(y) * W + x]) : 0.0f;
}

template <typename T>
constexpr float in_div() { return 1.0f; }
template <>
constexpr float in_div<uint8_t>() { return 255.0f; }

}  // namespace

template <typename T>
void deform(const T* x, const float* params, const float* mean, const float* stdv, float* out,
            const DeformGeom& g) {
    const int C = g.C, H = g.H, W = g.W, OH = g.OH, OW = g.OW;
    const float cy = 0.5f * (H - 1), cx = 0.5f * (W - 1);
    const float ocy = 0.5f * (OH - 1), ocx = 0.5f * (OW - 1);
    const float div = in_div<T>();
    const int64_t rows = g.N * C * OH;
#pragma omp parallel for schedule(static) if (rows * OW >= 16384)
    for (int64_t row = 0; row < rows; ++row) {
        const int64_t plane = row / OH;
        const int i = int(row - plane * OH);
        const int64_t n = plane / C;
        const int c = int(plane - n * C);
        const float* prm = params + 4 * n;
        const float scale = prm[0];
        const bool flip = prm[3] > 0.5f;
        const float sy = cy + (float(i) - ocy) / scale + prm[1];
        const float fy0 = std::floor(sy), ty = sy - fy0;
        const T* pl = x + plane * H * W;
        float* o = out + row * OW;
        const float mc = mean[c], sc = stdv[c];
        for (int j = 0; j < OW; ++j) {
            float sx = cx + (float(j) - ocx) / scale + prm[2];
            if (flip) sx = float(W - 1) - sx;
            const float fx0 = std::floor(sx), tx = sx - fx0;
            float v = 0.0f;
            // far outside would overflow int: zero anyway
            if (fy0 > -2.0f && fy0 < float(H) && fx0 > -2.0f && fx0 < float(W)) {
                const int y0 = int(fy0), x0 = int(fx0);
                v = px(pl, H, W, y0, x0) * ((1.0f - ty) * (1.0f - tx)) +
                    px(pl, H, W, y0, x0 + 1) * ((1.0f - ty) * tx) +
                    px(pl, H, W, y0 + 1, x0) * (ty * (1.0f - tx)) +
                    px(pl, H, W, y0 + 1, x0 + 1) * (ty * tx);
            }
            o[j] = (v / div - mc) / sc;
        }
    }
}

template void deform<uint8_t>(const uint8_t*, const float*, const float*, const float*, float*,
                              const DeformGeom&);
template void deform<float>(const float*, const float*, const float*, const float*, float*,
                            const DeformGeom&);

}  // namespace cpu
}  // namespace sprint
