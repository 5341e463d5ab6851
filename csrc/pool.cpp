// Same loops as kernels/pool.cu (so CPU and GPU agree bit for bit), threads over planes.
#include "pool.h"

#include <algorithm>

namespace sprint {
namespace cpu {

void maxpool_fwd_f32(const float* x, float* y, int32_t* argmax, const PoolGeom& g) {
    const int H = g.H, W = g.W, OH = g.OH, OW = g.OW;
#pragma omp parallel for schedule(static) if (g.planes * OH * OW >= 8192)
    for (int64_t p = 0; p < g.planes; ++p) {
        const float* xp = x + p * H * W;
        float* yp = y + p * OH * OW;
        int32_t* ap = argmax + p * OH * OW;
        for (int oh = 0; oh < OH; ++oh) {
            const int h0 = oh * g.sh - g.ph;
            const int hs = std::max(h0, 0), he = std::min(h0 + g.kh, H);
            for (int ow = 0; ow < OW; ++ow) {
                const int w0 = ow * g.sw - g.pw;
                const int ws = std::max(w0, 0), we = std::min(w0 + g.kw, W);
                int best_i = hs * W + ws;
                float best = xp[best_i];
                for (int h = hs; h < he; ++h)
                    for (int w = ws; w < we; ++w) {
                        const float v = xp[h * W + w];
                        if (v > best || (v != v && best == best)) {  // first max; NaN sticks
                            best = v;
                            best_i = h * W + w;
                        }
                    }
                yp[oh * OW + ow] = best;
                ap[oh * OW + ow] = best_i;
            }
        }
    }
}

void maxpool_bwd_f32(const float* dy, const int32_t* argmax, float* dx, const PoolGeom& g) {
    const int H = g.H, W = g.W, OH = g.OH, OW = g.OW;
#pragma omp parallel for schedule(static) if (g.planes * H * W >= 8192)
    for (int64_t p = 0; p < g.planes; ++p) {
        const float* dyp = dy + p * OH * OW;
        const int32_t* ap = argmax + p * OH * OW;
        float* dxp = dx + p * H * W;
        for (int h = 0; h < H; ++h) {
            // windows oh with oh*sh - ph <= h < oh*sh - ph + kh
            const int ohs = h + g.ph < g.kh ? 0 : (h + g.ph - g.kh) / g.sh + 1;
            const int ohe = std::min((h + g.ph) / g.sh, OH - 1);
            for (int w = 0; w < W; ++w) {
                const int ows = w + g.pw < g.kw ? 0 : (w + g.pw - g.kw) / g.sw + 1;
                const int owe = std::min((w + g.pw) / g.sw, OW - 1);
                const int idx = h * W + w;
                float acc = 0.0f;
                for (int oh = ohs; oh <= ohe; ++oh)
                    for (int ow = ows; ow <= owe; ++ow)
                        if (ap[oh * OW + ow] == idx) acc += dyp[oh * OW + ow];
                dxp[idx] = acc;
            }
        }
    }
}

}  // namespace cpu
}  // namespace sprint
