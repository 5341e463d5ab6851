#include "deform.h"

#include <cmath>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sprint {
namespace cpu {

namespace {

template <typename T>
constexpr float in_div() { return 1.0f; }
template <>
constexpr float in_div<uint8_t>() { return 255.0f; }

// Bilinear taps along one axis for sample coordinate s in [0, L): the two
// neighbours (clamped into range) and their weights, zero for a neighbour
// outside the image (so "zero outside" needs no branch in the pixel loop).
struct Tap {
    int a, b;
    float wa, wb;
};

inline Tap tap(float s, int L) {
    const float f0 = std::floor(s), t = s - f0;
    if (!(f0 > -2.0f && f0 < float(L))) return Tap{0, 0, 0.0f, 0.0f};  // far outside (or NaN)
    const int i0 = int(f0), i1 = i0 + 1;
    return Tap{i0 < 0 ? 0 : i0, i1 >= L ? L - 1 : i1, i0 >= 0 ? 1.0f - t : 0.0f, i1 < L ? t : 0.0f};
}

// wa * va + wb * vb where a zero weight drops its term instead of
// multiplying it (0 * Inf would be NaN): an identity or integer-shift sample
// (weights 1 and 0) returns the pixel itself, Inf, NaN and -0 included, and
// a neighbour's Inf cannot leak into it. Same rule in kernels/deform.cu.
inline float blend(float wa, float va, float wb, float vb) {
    if (wb == 0.0f) return wa == 0.0f ? 0.0f : wa * va;
    if (wa == 0.0f) return wb * vb;
    return wa * va + wb * vb;
}

}  // namespace

// Per plane: the row taps and column taps are computed once (the sample
// coordinates are separable), then each pixel is four loads and a blend. Same
// mapping and formula as the CUDA kernel, blended as rows of columns.
template <typename T>
void deform(const T* x, const float* params, const float* mean, const float* stdv, float* out,
            const DeformGeom& g) {
    const int C = g.C, H = g.H, W = g.W, OH = g.OH, OW = g.OW;
    const float cy = 0.5f * (H - 1), cx = 0.5f * (W - 1);
    const float ocy = 0.5f * (OH - 1), ocx = 0.5f * (OW - 1);
    const float div = in_div<T>();
    const int64_t planes = g.N * C;
    if (planes == 0) return;
    const bool parallel = planes * OH * OW >= 16384;
    int nthreads = 1;
#ifdef _OPENMP
    if (parallel) nthreads = omp_get_max_threads();
#endif
    // column taps of each thread, allocated here: no exception may leave the region
    std::vector<Tap> taps(static_cast<size_t>(OW) * nthreads);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t plane = 0; plane < planes; ++plane) {
        const int64_t n = plane / C;
        const int c = int(plane - n * C);
        const float* prm = params + 4 * n;
        const float scale = prm[0];
#ifdef _OPENMP
        Tap* cols = taps.data() + static_cast<size_t>(OW) * omp_get_thread_num();
#else
        Tap* cols = taps.data();
#endif
        for (int j = 0; j < OW; ++j) {
            float sx = cx + (float(j) - ocx) / scale + prm[2];
            if (prm[3] > 0.5f) sx = float(W - 1) - sx;
            cols[j] = tap(sx, W);
        }
        const T* pl = x + plane * H * W;
        const float mc = mean[c], sc = stdv[c];
        for (int i = 0; i < OH; ++i) {
            const Tap r = tap(cy + (float(i) - ocy) / scale + prm[1], H);
            const T* ra = pl + int64_t(r.a) * W;
            const T* rb = pl + int64_t(r.b) * W;
            float* o = out + (plane * OH + i) * OW;
            for (int j = 0; j < OW; ++j) {
                const Tap& t = cols[j];
                const float va = r.wa == 0.0f ? 0.0f : blend(t.wa, float(ra[t.a]), t.wb, float(ra[t.b]));
                const float vb = r.wb == 0.0f ? 0.0f : blend(t.wa, float(rb[t.a]), t.wb, float(rb[t.b]));
                o[j] = (blend(r.wa, va, r.wb, vb) / div - mc) / sc;
            }
        }
    }
}

template void deform<uint8_t>(const uint8_t*, const float*, const float*, const float*, float*,
                              const DeformGeom&);
template void deform<float>(const float*, const float*, const float*, const float*, float*,
                            const DeformGeom&);

}  // namespace cpu
}  // namespace sprint
