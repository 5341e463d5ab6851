// dW of small-K convolutions (K = C*kh*kw up to kSmallK, gemm_conv.cpp;
// cifar's conv1: K = 27), included by gemm_conv_pack.h (same translation
// unit, same ISA, internal linkage).
//
// dW[m][t] = sum over pixels of dy[m][px] * x_t[px], taken with the pixels
// of an output row in the vector lanes: an MB-channel x TB-tap block of
// accumulators (LaneKernel, gemm_simd.h; 27 of the 32 zmm on AVX-512) streams
// dy's rows and the image's tap rows, both L1-resident per image -- no
// transpose of dy (the tap kernel's 16 x 16 register transposes of dy^T took
// about a third of conv1's dW), each dy vector loaded once per TB taps. The
// image is read zero-padded (the kernel's threads copy it first) with rows
// padded to whole 64-byte lines, so a tap row with j = 0 is an aligned load.
// The lanes of each image are summed by a fixed tree (V::sum_lanes) and the
// image's sums added to dW in image order: each element is one chain of adds
// over the images, so micro-batches (accumulate) continue the whole batch's
// sums bit for bit -- a different order from the tap kernel's single FMA
// chain over all pixels, so the bits differ from that path's (measured:
// about 1e-7 of the largest |dW| on cifar's conv1 against float64, like the
// tap kernel). db the same way, from dy's rows.
//
// No CUDA counterpart: the GPU runs the explicit path (cuBLAS).
#pragma once

namespace {

using sprint::gemm::detail::SmallPlan;

// The lanes of a whole row of P floats summed the same way (db).
template <class V>
inline float row_sum(const float* d, i64 n) {
    using reg = typename V::reg;
    constexpr int L = V::L;
    reg a[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
    i64 q = 0;
    for (; q + 4 * L <= n; q += 4 * L)
        for (int u = 0; u < 4; ++u) a[u] = V::add(a[u], V::load(d + q + u * L));
    for (; q + L <= n; q += L) a[0] = V::add(a[0], V::load(d + q));
    if (q < n) a[1] = V::add(a[1], V::load_mask(V::zero(), d, q, lane_range(0, int(n - q))));
    const reg r = V::add(V::add(a[0], a[1]), V::add(a[2], a[3]));
    float out[1];
    V::sum_lanes(&r, 1, out);
    return out[0];
}

void conv_dw_lanes_isa(const SmallPlan& p, const Conv& G, const float* dy, float* dw, bool accumulate, float* db) {
    constexpr int MB = SK::MB_, TB = SK::TB_;
    using V = typename SK::Vec;
    const i64 K = G.K(), M = G.M, P = G.P(), img_stride = G.C * p.Hp * p.Wp;
    const i64 mblocks = (M + MB - 1) / MB;
#pragma omp parallel num_threads(p.nth) if (p.nth > 1)
    {
        if (p.pad_to) pad_shared(G, p.x, p.pad_to, p.Hp, p.Wp);
        for (int t = omp_get_thread_num(); t < p.nth; t += omp_get_num_threads()) {
            // thread t: channel blocks [b0, b1) -- its rows of dw and db, so no two threads write one element
            const i64 b0 = mblocks * t / p.nth, b1 = mblocks * (t + 1) / p.nth;
            alignas(64) float s[MB * TB + V::L];
            i64 toff[TB];
            for (i64 img = 0; img < G.B; ++img) {
                const bool first = img == 0 && !accumulate;
                const float* xi = p.xp + img * img_stride;
                for (i64 b = b0; b < b1; ++b) {
                    const i64 m0 = b * MB;
                    const int nb = int(lo_(MB, M - m0));
                    const float* dyr[MB];
                    const float* pf[MB];  // the next block's rows (the next image's first, after the last)
                    const i64 nimg = b + 1 < b1 ? img : img + 1, nm0 = b + 1 < b1 ? m0 + MB : b0 * MB;
                    for (int k = 0; k < MB; ++k) {
                        dyr[k] = dy + (img * M + m0 + (k < nb ? k : 0)) * P;  // spare: dropped
                        pf[k] = dy + (nimg * M + lo_(nm0 + k, M - 1)) * P;
                    }
                    for (i64 t0 = 0; t0 < K; t0 += TB) {
                        const int nt = int(lo_(TB, K - t0));
                        for (int q = 0; q < TB; ++q) toff[q] = p.toff[t0 + (q < nt ? q : 0)];  // spare: dropped
                        SK::run(G.OH, G.OW, G.sh * p.Wp, xi, toff, dyr, t0 == 0 && nimg < G.B ? pf : nullptr, s);
                        for (int k = 0; k < nb; ++k)
                            for (int q = 0; q < nt; ++q) {
                                float& d = dw[(m0 + k) * K + t0 + q];
                                d = (first ? 0.f : d) + s[k * TB + q];
                            }
                    }
                    if (db)
                        for (int k = 0; k < nb; ++k) db[m0 + k] = (first ? 0.f : db[m0 + k]) + row_sum<V>(dyr[k], P);
                }
            }
        }
    }
}

}  // namespace
