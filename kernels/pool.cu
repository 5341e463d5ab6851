// Max pooling over each (n, c) plane, any window / stride / padding; the
// geometry is checked by the caller (csrc/pool.h: pad < k, so every window
// holds a real pixel). Forward keeps the argmax as the flat index h*W + w in
// the plane (int32). Backward is a gather: every input pixel sums dy over the
// windows that chose it, in ascending output order: no atomics, deterministic.
// The CPU twin (csrc/pool.cpp) compares and adds in the same orders: same bits.
// In-plane arithmetic is 32-bit (planes are < 2^31 pixels), plane offsets 64-bit.
#include "common.cuh"

extern "C" __global__ void sprint_maxpool_fwd_f32(const float* __restrict__ x,
                                                  float* __restrict__ y,
                                                  int* __restrict__ argmax, i64 planes, i64 H_,
                                                  i64 W_, i64 OH_, i64 OW_, i64 kh, i64 kw,
                                                  i64 sh, i64 sw, i64 ph, i64 pw) {
    const int H = (int)H_, W = (int)W_, OH = (int)OH_, OW = (int)OW_;
    const i64 plane_out = (i64)OH * OW;
    const i64 n = sprint_size_mul(planes, plane_out);
    SPRINT_FOR(o, n) {
        const i64 p = o / plane_out;
        const int r = (int)(o - p * plane_out);
        const int oh = r / OW, ow = r - (r / OW) * OW;
        const int h0 = oh * (int)sh - (int)ph, w0 = ow * (int)sw - (int)pw;
        const int hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;
        const int he = h0 + (int)kh < H ? h0 + (int)kh : H;
        const int we = w0 + (int)kw < W ? w0 + (int)kw : W;
        const float* xp = x + p * H * W;
        int best_i = hs * W + ws;
        float best = xp[best_i];
        for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w) {
                const float v = xp[h * W + w];
                if (v > best || (v != v && best == best)) {  // first max wins; NaN sticks
                    best = v;
                    best_i = h * W + w;
                }
            }
        y[o] = best;
        argmax[o] = best_i;
    }
}

extern "C" __global__ void sprint_maxpool_bwd_f32(const float* __restrict__ dy,
                                                  const int* __restrict__ argmax,
                                                  float* __restrict__ dx, i64 planes, i64 H_,
                                                  i64 W_, i64 OH_, i64 OW_, i64 kh_, i64 kw_,
                                                  i64 sh_, i64 sw_, i64 ph_, i64 pw_) {
    const int H = (int)H_, W = (int)W_, OH = (int)OH_, OW = (int)OW_;
    const int kh = (int)kh_, kw = (int)kw_, sh = (int)sh_, sw = (int)sw_;
    const int ph = (int)ph_, pw = (int)pw_;
    const i64 plane_in = (i64)H * W, plane_out = (i64)OH * OW;
    const i64 n = sprint_size_mul(planes, plane_in);
    if (sprint_size_mul(planes, plane_out) < 0) return;
    SPRINT_FOR(i, n) {
        const i64 p = i / plane_in;
        const int idx = (int)(i - p * plane_in);
        const int h = idx / W, w = idx - (idx / W) * W;
        // the windows oh with oh*sh - ph <= h < oh*sh - ph + kh
        const int ohs = h + ph < kh ? 0 : (h + ph - kh) / sh + 1;
        const int ows = w + pw < kw ? 0 : (w + pw - kw) / sw + 1;
        const int ohe = (h + ph) / sh < OH - 1 ? (h + ph) / sh : OH - 1;
        const int owe = (w + pw) / sw < OW - 1 ? (w + pw) / sw : OW - 1;
        const int* ap = argmax + p * plane_out;
        const float* dyp = dy + p * plane_out;
        float g = 0.0f;
        for (int oh = ohs; oh <= ohe; ++oh)
            for (int ow = ows; ow <= owe; ++ow)
                if (ap[oh * OW + ow] == idx) g += dyp[oh * OW + ow];
        dx[i] = g;
    }
}
