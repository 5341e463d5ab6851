// CPU twin of kernels/im2col.cu. See im2col.h for the layouts.
#include "im2col.h"

#include <algorithm>
#include <cstring>

namespace sprint {
namespace cpu {
namespace {

// Output columns ow whose input column w = ow*s - p + j lies in [0, W):
// [lo, hi), possibly empty (lo == hi).
inline void valid_range(i64 W, i64 OW, i64 s, i64 p, i64 j, i64& lo, i64& hi) {
    const i64 t = p - j;
    lo = t <= 0 ? 0 : (t + s - 1) / s;
    const i64 u = W - 1 + p - j;
    hi = u < 0 ? 0 : std::min(OW, u / s + 1);
    lo = std::min(lo, OW);
    if (hi < lo) hi = lo;
}

}  // namespace

void im2col(const float* x, float* cols, const ConvGeom& g) {
    const i64 K = g.K(), P = g.P(), BP = g.B * P, HW = g.H * g.W;
#pragma omp parallel for collapse(2) schedule(static)
    for (i64 k = 0; k < K; ++k) {
        for (i64 n = 0; n < g.B; ++n) {
            const i64 j = k % g.kw, i = (k / g.kw) % g.kh, c = k / (g.kw * g.kh);
            const float* plane = x + (n * g.C + c) * HW;
            float* dst = cols + k * BP + n * P;
            i64 lo, hi;
            valid_range(g.W, g.OW, g.sw, g.pw, j, lo, hi);
            for (i64 oh = 0; oh < g.OH; ++oh, dst += g.OW) {
                const i64 h = oh * g.sh - g.ph + i;
                if (h < 0 || h >= g.H || lo == hi) {
                    std::memset(dst, 0, sizeof(float) * g.OW);
                    continue;
                }
                // src[q] is input column (lo+q)*sw - pw + j
                const float* src = plane + h * g.W + lo * g.sw - g.pw + j;
                if (lo) std::memset(dst, 0, sizeof(float) * lo);
                if (g.sw == 1) {
                    std::memcpy(dst + lo, src, sizeof(float) * (hi - lo));
                } else {
                    for (i64 q = 0; q < hi - lo; ++q) dst[lo + q] = src[q * g.sw];
                }
                if (hi < g.OW) std::memset(dst + hi, 0, sizeof(float) * (g.OW - hi));
            }
        }
    }
}

void col2im(const float* cols, float* x, const ConvGeom& g) {
    const i64 P = g.P(), BP = g.B * P;
#pragma omp parallel for collapse(2) schedule(static)
    for (i64 n = 0; n < g.B; ++n) {
        for (i64 c = 0; c < g.C; ++c) {
            float* plane = x + (n * g.C + c) * g.H * g.W;
            for (i64 h = 0; h < g.H; ++h) {
                float* dst = plane + h * g.W;
                std::memset(dst, 0, sizeof(float) * g.W);
                // Contributions to row h come from kernel rows i with
                // h = oh*sh - ph + i for some output row oh.
                for (i64 i = 0; i < g.kh; ++i) {
                    const i64 t = h + g.ph - i;
                    if (t < 0) break;
                    if (t % g.sh) continue;
                    const i64 oh = t / g.sh;
                    if (oh >= g.OH) continue;
                    for (i64 j = 0; j < g.kw; ++j) {
                        const float* src = cols + ((c * g.kh + i) * g.kw + j) * BP + n * P + oh * g.OW;
                        i64 lo, hi;
                        valid_range(g.W, g.OW, g.sw, g.pw, j, lo, hi);
                        if (lo == hi) continue;
                        float* d = dst + lo * g.sw - g.pw + j;  // d[q*sw] is input column (lo+q)*sw-pw+j
                        const float* s = src + lo;
                        const i64 len = hi - lo;
                        if (g.sw == 1) {
#pragma omp simd
                            for (i64 q = 0; q < len; ++q) d[q] += s[q];
                        } else {
                            for (i64 q = 0; q < len; ++q) d[q * g.sw] += s[q];
                        }
                    }
                }
            }
        }
    }
}

void cnhw_to_nchw(const float* yt, const float* bias, float* y, i64 B, i64 M, i64 P) {
#pragma omp parallel for collapse(2) schedule(static)
    for (i64 n = 0; n < B; ++n) {
        for (i64 m = 0; m < M; ++m) {
            const float* src = yt + m * B * P + n * P;
            float* dst = y + (n * M + m) * P;
            const float b = bias ? bias[m] : 0.0f;
#pragma omp simd
            for (i64 p = 0; p < P; ++p) dst[p] = src[p] + b;
        }
    }
}

namespace {

inline float row_sum(const float* r, i64 P) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (i64 p = 0; p < P; ++p) s += r[p];
    return s;
}

}  // namespace

void nchw_to_cnhw(const float* y, float* out, float* db, bool accumulate, i64 B, i64 M, i64 P) {
#pragma omp parallel for schedule(static)
    for (i64 m = 0; m < M; ++m) {
        double s = 0.0;
        for (i64 n = 0; n < B; ++n) {
            const float* src = y + (n * M + m) * P;
            std::memcpy(out + m * B * P + n * P, src, sizeof(float) * P);
            if (db) s += row_sum(src, P);
        }
        if (db) db[m] = float(accumulate ? db[m] + s : s);
    }
}

void channel_sum(const float* y, float* db, bool accumulate, i64 B, i64 M, i64 P) {
#pragma omp parallel for schedule(static)
    for (i64 m = 0; m < M; ++m) {
        double s = 0.0;
        for (i64 n = 0; n < B; ++n) s += row_sum(y + (n * M + m) * P, P);
        db[m] = float(accumulate ? db[m] + s : s);
    }
}

void add_channel_bias(float* y, const float* bias, i64 B, i64 M, i64 P) {
#pragma omp parallel for collapse(2) schedule(static)
    for (i64 n = 0; n < B; ++n) {
        for (i64 m = 0; m < M; ++m) {
            float* r = y + (n * M + m) * P;
            const float b = bias[m];
#pragma omp simd
            for (i64 p = 0; p < P; ++p) r[p] += b;
        }
    }
}

}  // namespace cpu
}  // namespace sprint
