// DeformImage of SPRINT in one pass: scale jitter + crop offset + horizontal
// flip, bilinear, zero outside, then per-channel normalisation.
// Output pixel (i, j) of sample n with params[n] = (scale, dy, dx, flip) reads
//   sy = (H-1)/2 + (i - (OH-1)/2) / scale + dy
//   sx = (W-1)/2 + (j - (OW-1)/2) / scale + dx,  sx = (W-1) - sx if flip > 0.5
// With identity params and OH == H, OW == W, sy == i and sx == j exactly, the
// bilinear weights are 1 and 0, so the input comes back unchanged. The blend
// (rows of columns) is the CPU twin's, so both round alike.
// In-plane arithmetic is 32-bit (planes < 2^31 pixels), plane offsets 64-bit.
// CPU twin: csrc/deform.cpp.
#include "common.cuh"

// Bilinear taps along one axis (as csrc/deform.cpp): the two neighbours of
// coordinate s clamped into [0, L) and their weights, zero for a neighbour
// outside (or for s far outside / NaN).
struct SprintTap {
    int a, b;
    float wa, wb;
};

__device__ __forceinline__ SprintTap sprint_tap(float s, int L) {
    SprintTap t;
    const float f0 = floorf(s), w = s - f0;
    if (!(f0 > -2.0f && f0 < (float)L)) {
        t.a = t.b = 0;
        t.wa = t.wb = 0.0f;
        return t;
    }
    const int i0 = (int)f0, i1 = i0 + 1;
    t.a = i0 < 0 ? 0 : i0;
    t.b = i1 >= L ? L - 1 : i1;
    t.wa = i0 >= 0 ? 1.0f - w : 0.0f;
    t.wb = i1 < L ? w : 0.0f;
    return t;
}

// wa * va + wb * vb where a zero weight drops its term (0 * Inf would be NaN):
// identity and integer-shift samples return the pixel itself, Inf, NaN and -0
// included. The rule of csrc/deform.cpp's blend().
__device__ __forceinline__ float sprint_blend(float wa, float va, float wb, float vb) {
    if (wb == 0.0f) return wa == 0.0f ? 0.0f : wa * va;
    if (wa == 0.0f) return wb * vb;
    return wa * va + wb * vb;
}

template <typename T>
__device__ void sprint_deform(const T* __restrict__ x, const float* __restrict__ params,
                              const float* __restrict__ mean, const float* __restrict__ stdv,
                              float* __restrict__ out, i64 N, int C, int H, int W,
                              int OH, int OW, float in_div) {
    const i64 plane_out = (i64)OH * OW;
    const float cy = 0.5f * (H - 1), cx = 0.5f * (W - 1);
    const float ocy = 0.5f * (OH - 1), ocx = 0.5f * (OW - 1);
    const i64 n_out = sprint_size3(N, C, plane_out);
    if (sprint_size3(N, C, (i64)H * W) < 0) return;
    SPRINT_FOR(o, n_out) {
        const i64 plane = o / plane_out;
        const int rem = (int)(o - plane * plane_out);
        const int i = rem / OW, j = rem - (rem / OW) * OW;
        const i64 n = plane / C;
        const int c = (int)(plane - n * C);
        const float* prm = params + 4 * n;
        const float scale = prm[0];
        const float sy = cy + ((float)i - ocy) / scale + prm[1];
        float sx = cx + ((float)j - ocx) / scale + prm[2];
        if (prm[3] > 0.5f) sx = (float)(W - 1) - sx;
        const SprintTap r = sprint_tap(sy, H), t = sprint_tap(sx, W);
        const T* ra = x + plane * H * W + (i64)r.a * W;
        const T* rb = x + plane * H * W + (i64)r.b * W;
        const float va = r.wa == 0.0f ? 0.0f : sprint_blend(t.wa, (float)ra[t.a], t.wb, (float)ra[t.b]);
        const float vb = r.wb == 0.0f ? 0.0f : sprint_blend(t.wa, (float)rb[t.a], t.wb, (float)rb[t.b]);
        out[o] = (sprint_blend(r.wa, va, r.wb, vb) / in_div - mean[c]) / stdv[c];
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
