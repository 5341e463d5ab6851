// DeformImage of SPRINT in one pass: scale jitter + crop offset + horizontal
// flip, bilinear, zero outside, then per-channel normalisation.
// Output pixel (i, j) of sample n with params[n] = (scale, dy, dx, flip) reads
//   sy = (H-1)/2 + (i - (OH-1)/2) / scale + dy
//   sx = (W-1)/2 + (j - (OW-1)/2) / scale + dx,  sx = (W-1) - sx if flip > 0.5
// With identity params and OH == H, OW == W, sy == i and sx == j exactly, the
// bilinear weights are 1 and 0, so the input comes back unchanged.
// In-plane arithmetic is 32-bit (planes < 2^31 pixels), plane offsets 64-bit.
// CPU twin: csrc/deform.cpp.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ float sprint_deform_px(const T* plane, int H, int W, int y, int x) {
    return (y >= 0 && y < H && x >= 0 && x < W) ? (float)plane[(i64)y * W + x] : 0.0f;
}

template <typename T>
__device__ void sprint_deform(const T* __restrict__ x, const float* __restrict__ params,
                              const float* __restrict__ mean, const float* __restrict__ stdv,
                              float* __restrict__ out, i64 N, int C, int H, int W,
                              int OH, int OW, float in_div) {
    const i64 plane_out = (i64)OH * OW;
    const float cy = 0.5f * (H - 1), cx = 0.5f * (W - 1);
    const float ocy = 0.5f * (OH - 1), ocx = 0.5f * (OW - 1);
    SPRINT_FOR(o, N * C * plane_out) {
        const i64 plane = o / plane_out;
        const int r = (int)(o - plane * plane_out);
        const int i = r / OW, j = r - (r / OW) * OW;
        const i64 n = plane / C;
        const int c = (int)(plane - n * C);
        const float* prm = params + 4 * n;
        const float scale = prm[0];
        const float sy = cy + ((float)i - ocy) / scale + prm[1];
        float sx = cx + ((float)j - ocx) / scale + prm[2];
        if (prm[3] > 0.5f) sx = (float)(W - 1) - sx;
        const float fy0 = floorf(sy), fx0 = floorf(sx);
        const float ty = sy - fy0, tx = sx - fx0;
        float v = 0.0f;
        // a sample far outside would overflow int: it is zero anyway
        if (fy0 > -2.0f && fy0 < (float)H && fx0 > -2.0f && fx0 < (float)W) {
            const int y0 = (int)fy0, x0 = (int)fx0;
            const T* pl = x + plane * H * W;
            v = sprint_deform_px(pl, H, W, y0, x0) * ((1.0f - ty) * (1.0f - tx)) +
                sprint_deform_px(pl, H, W, y0, x0 + 1) * ((1.0f - ty) * tx) +
                sprint_deform_px(pl, H, W, y0 + 1, x0) * (ty * (1.0f - tx)) +
                sprint_deform_px(pl, H, W, y0 + 1, x0 + 1) * (ty * tx);
        }
        out[o] = (v / in_div - mean[c]) / stdv[c];
    }
}

extern "C" __global__ void sprint_deform_u8(const unsigned char* x, const float* params,
                                            const float* mean, const float* stdv, float* out,
                                            i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW) {
    sprint_deform<unsigned char>(x, params, mean, stdv, out, N, (int)C, (int)H, (int)W, (int)OH,
                                 (int)OW, 255.0f);
}

extern "C" __global__ void sprint_deform_f32(const float* x, const float* params,
                                             const float* mean, const float* stdv, float* out,
                                             i64 N, i64 C, i64 H, i64 W, i64 OH, i64 OW) {
    sprint_deform<float>(x, params, mean, stdv, out, N, (int)C, (int)H, (int)W, (int)OH, (int)OW,
                         1.0f);
}
