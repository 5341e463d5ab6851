// CPU twin of kernels/pool.cu: the same windows in the same order (so the
// same argmax and, in backward, the same sums bit for bit), threads over planes.
#include "pool.h"

#include <algorithm>

namespace sprint {
namespace cpu {

namespace {

// One output, window clipped to the plane: the loop of the CUDA kernel.
inline void pool_one(const float* xp, int W, int hs, int he, int ws, int we, float* y, int32_t* a) {
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
    *y = best;
    *a = best_i;
}

}  // namespace

// Per output row: the windows that need no column clipping are updated
// together, window element by window element (row-major, so the same first
// maximum as the per-output loop), with selects instead of branches: random
// data makes the comparison unpredictable, and the ow loop vectorizes.
void maxpool_fwd_f32(const float* x, float* y, int32_t* argmax, const PoolGeom& g) {
    const int H = g.H, W = g.W, OH = g.OH, OW = g.OW, kw = g.kw, sw = g.sw, pw = g.pw;
    // interior columns: w0 = ow*sw - pw >= 0 and w0 + kw <= W
    const int lo = std::min((pw + sw - 1) / sw, OW);
    const int hi = std::max(lo, std::min((W + pw - kw) / sw + 1, OW));
#pragma omp parallel for schedule(static) if (g.planes * OH * OW >= 8192)
    for (int64_t p = 0; p < g.planes; ++p) {
        const float* xp = x + p * H * W;
        for (int oh = 0; oh < OH; ++oh) {
            const int h0 = oh * g.sh - g.ph;
            const int hs = std::max(h0, 0), he = std::min(h0 + g.kh, H);
            float* yr = y + (p * OH + oh) * OW;
            int32_t* ar = argmax + (p * OH + oh) * OW;
            for (int ow = 0; ow < OW; ++ow) {
                if (ow == lo) ow = hi;
                if (ow >= OW) break;
                const int w0 = ow * sw - pw;
                pool_one(xp, W, hs, he, std::max(w0, 0), std::min(w0 + kw, W), yr + ow, ar + ow);
            }
            const int base = hs * W - pw;
#pragma omp simd
            for (int ow = lo; ow < hi; ++ow) {
                yr[ow] = xp[base + ow * sw];
                ar[ow] = base + ow * sw;
            }
            for (int h = hs; h < he; ++h)
                for (int j = (h == hs); j < kw; ++j) {
                    const int off = h * W - pw + j;
#pragma omp simd
                    for (int ow = lo; ow < hi; ++ow) {
                        const float v = xp[off + ow * sw], b = yr[ow];
                        const bool take = (v > b) | ((v != v) & (b == b));  // no branches
                        yr[ow] = take ? v : b;
                        ar[ow] = take ? off + ow * sw : ar[ow];
                    }
                }
        }
    }
}

// A scatter per plane (threads own whole planes: no races): dx = 0, then
// each output adds its dy at its argmax in ascending output order -- for every
// pixel the same additions in the same order as the gather of the CUDA
// kernel, hence the same bits. An argmax outside its own window is skipped,
// as the gather never matches it.
void maxpool_bwd_f32(const float* dy, const int32_t* argmax, float* dx, const PoolGeom& g) {
    const int H = g.H, W = g.W, OH = g.OH, OW = g.OW;
    const int64_t plane = int64_t(H) * W;
#pragma omp parallel for schedule(static) if (g.planes * H * W >= 8192)
    for (int64_t p = 0; p < g.planes; ++p) {
        const float* dyp = dy + p * OH * OW;
        const int32_t* ap = argmax + p * OH * OW;
        float* dxp = dx + p * plane;
        std::fill(dxp, dxp + plane, 0.0f);
        for (int oh = 0; oh < OH; ++oh) {
            const int h0 = oh * g.sh - g.ph;
            for (int ow = 0; ow < OW; ++ow) {
                const int32_t a = ap[oh * OW + ow];
                if (a < 0 || a >= plane) continue;
                const int ah = a / W, aw = a - (a / W) * W, w0 = ow * g.sw - g.pw;
                if (unsigned(ah - h0) < unsigned(g.kh) && unsigned(aw - w0) < unsigned(g.kw))
                    dxp[a] += dyp[oh * OW + ow];
            }
        }
    }
}

}  // namespace cpu
}  // namespace sprint
