// Internal: the micro-kernel and the FMA-peak probe written once over a
// vector type, instantiated by each ISA translation unit (gemm_avx512.cpp,
// gemm_avx2.cpp, gemm_generic.cpp) with its own traits `V`:
//   V::reg, V::L (floats per register), zero(), load(p), bcast(p),
//   fma(a, b, c) = a*b + c, add(a, b), relu(a) = a > 0 ? a : 0 (NaN: 0), store(p, v),
//   sum_lanes(v, n, out): out[i] = the sum of v[i]'s lanes (a fixed order),
//   pin(v): v is opaque to the optimiser from here (kept in a register, not re-read),
//   load_mask(acc, x, off, mask): acc with the lanes l whose bit is set in
//     mask replaced by x[off + l] (only those elements are read)
//   store_mask(x, off, v, mask): x[off + l] = lane l of v for the lanes in
//     mask (only those elements are written)
//   transpose(x, off, q, mask, dst, ld): the L x L block
//     dst[e*ld + r] = x[off[r] + q + e] where bit e of mask[r] is set, else 0
//     (only those elements are read)
//   panel<MR>(s, n, q, dst): the L x MR block of an A panel,
//     dst[e*MR + r] = s[r][q + e] for rows r < n, 0 for n <= r < MR
//     (rows past n are not read)
// so the ISA units only say which instructions and which tile they use.
// Internal linkage only (see gemm_plan.h): an AVX-512 instance must never be
// merged with, or serve, a caller of another unit.
#pragma once

#include <omp.h>

#include <cstdint>

namespace {

// The accumulators of an MR x (NV registers) tile, from t (row stride TS)
// or zero, and back: shared by the micro-kernels below.
template <class V, int MR, int NV, int TS>
inline void acc_load(typename V::reg (&c)[MR][NV], const float* t, bool from_zero) {
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) c[r][v] = from_zero ? V::zero() : V::load(t + r * TS + v * V::L);
}
template <class V, int MR, int NV, int TS>
inline void acc_store(const typename V::reg (&c)[MR][NV], float* t) {
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) V::store(t + r * TS + v * V::L, c[r][v]);
}

// MR x NR tile (NR = NV registers per row) of C in MR*NV accumulators: each
// continues the FMA chain of its element of C from `t` (MR x NR, row stride
// NR; the running sums the driver loaded), or from zero (`from_zero`: the
// chains' start, t not read), over this k block, in k order,
// and leaves the sums in `t` for the driver to store. B is read through one
// row pointer per k (a packed panel row, or an image row read in place by
// the implicit convolution). TS is t's row stride: a narrower kernel (fewer
// registers per row) runs the tiles of a wide one's edge panels.
template <class V, int MR_, int NV, int TS = NV * V::L>
struct MicroKernel {
    using Vec = V;
    static constexpr int MR = MR_, NR = NV * V::L, NVEC = NV;
    static void run(std::int64_t k, const float* __restrict a, const float* const* __restrict brow,
                    float* __restrict t, bool from_zero) {
        typename V::reg c[MR][NV];
        acc_load<V, MR, NV, TS>(c, t, from_zero);
        for (std::int64_t p = 0; p < k; ++p) {
            const float* b = brow[p];
            typename V::reg bv[NV];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) bv[v] = V::load(b + v * V::L);
#pragma GCC unroll 32
            for (int r = 0; r < MR; ++r) {
                const typename V::reg av = V::bcast(a + r);
#pragma GCC unroll 8
                for (int v = 0; v < NV; ++v) c[r][v] = V::fma(av, bv[v], c[r][v]);
            }
            a += MR;
        }
        acc_store<V, MR, NV, TS>(c, t);
    }
};

// dW's kernel (gemm_dw.h): an MR x NR tile of dW^T, rows = filter taps,
// columns = output channels, k = output pixels. A is never packed: element
// (r, p) is read by broadcast from the (zero-padded) image at pix[p] +
// toff[r]; B is a packed panel of dy^T (row stride BS). The same chains in the
// same k order as MicroKernel (fma(a, b, c) with a and b swapped, the same
// product), so dW keeps its bits. A kernel NV registers wide serves the edge
// panels of a wider one (TS, BS: the wide one's tile and panel strides).
template <class V, int MR_, int NV, int TS = NV * V::L, int BS = TS>
struct TapKernel {
    using Vec = V;
    static constexpr int MR = MR_, NR = NV * V::L;
    static void run(std::int64_t k, const float* const* __restrict pix, const std::int64_t* toff,
                    const float* __restrict b, float* __restrict t, bool from_zero) {
        typename V::reg c[MR][NV];
        std::int64_t o[MR];
#pragma GCC unroll 32
        for (int r = 0; r < MR; ++r) o[r] = toff[r];
        acc_load<V, MR, NV, TS>(c, t, from_zero);
        for (std::int64_t p = 0; p < k; ++p) {
            const float* px = pix[p];
            typename V::reg bv[NV];
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) bv[v] = V::load(b + v * V::L);
#pragma GCC unroll 32
            for (int r = 0; r < MR; ++r) {
                const typename V::reg av = V::bcast(px + o[r]);
#pragma GCC unroll 8
                for (int v = 0; v < NV; ++v) c[r][v] = V::fma(av, bv[v], c[r][v]);
            }
            b += BS;
        }
        acc_store<V, MR, NV, TS>(c, t);
    }
    // The narrowest kernel of this family that covers nr columns.
    static void run_fit(int nr, std::int64_t k, const float* const* pix, const std::int64_t* toff, const float* b,
                        float* t, bool from_zero) {
        if constexpr (NV > 1) {
            if (nr <= (NV - 1) * V::L)
                return TapKernel<V, MR_, NV - 1, TS, BS>::run_fit(nr, k, pix, toff, b, t, from_zero);
        }
        run(k, pix, toff, b, t, from_zero);
    }
};

// The masked L x L transpose done element by element (the traits without a
// register transpose use it).
template <int L>
inline void transpose_scalar(const float* x, const std::int64_t* off, std::int64_t q, const std::uint32_t* mask,
                             float* dst, std::int64_t ld) {
    for (int e = 0; e < L; ++e)
        for (int r = 0; r < L; ++r) dst[e * ld + r] = (mask[r] >> e & 1u) ? x[off[r] + q + e] : 0.f;
}

// panel<MR> done element by element (the traits without a register
// version for their MR use it).
template <int L, int MR>
inline void panel_scalar(const float* const* s, int n, std::int64_t q, float* dst) {
    for (int e = 0; e < L; ++e)
        for (int r = 0; r < MR; ++r) dst[e * MR + r] = r < n ? s[r][q + e] : 0.f;
}

// out[i] = the sum of the lanes of v[i] (i < n), by a fixed pairwise tree
// over the lanes (the traits without a register tree use it).
template <class V>
inline void sum_lanes_scalar(const typename V::reg* v, int n, float* out) {
    alignas(64) float b[V::L];
    for (int i = 0; i < n; ++i) {
        V::store(b, v[i]);
        for (int w = V::L / 2; w >= 1; w /= 2)
            for (int l = 0; l < w; ++l) b[l] += b[l + w];
        out[i] = b[0];
    }
}

// Lanes lo <= l < hi of a mask.
inline std::uint32_t lane_range(int lo, int hi) { return lo >= hi ? 0u : ((2u << (hi - 1)) - 1u) & ~((1u << lo) - 1u); }

// The small-K dW's kernel (gemm_conv_small.h): acc[k][t] = sum over one image's output pixels of
// dy[m0 + k][px] * xp[px + toff[t]], lanes over ow (stride 1 along a row; rows
// row_step apart in the padded image), rows in order, prefetching pf's rows
// (when not null), then each summed over its lanes into s[k*TB + t].
template <class V, int MB, int TB>
struct LaneKernel {
    using Vec = V;
    static constexpr int L = V::L, MB_ = MB, TB_ = TB;
    static void run(std::int64_t OH, std::int64_t OW, std::int64_t row_step, const float* xi, const std::int64_t* toff,
                    const float* const* dyr, const float* const* pf, float* s) {
        using reg = typename V::reg;
        reg acc[MB][TB];
#pragma GCC unroll 32
        for (int k = 0; k < MB; ++k)
#pragma GCC unroll 32
            for (int t = 0; t < TB; ++t) acc[k][t] = V::zero();
        std::int64_t o[TB];
        for (int t = 0; t < TB; ++t) o[t] = toff[t];
        const std::int64_t full = OW / L * L;
        const std::uint32_t tail = lane_range(0, int(OW - full));
        for (std::int64_t oh = 0; oh < OH; ++oh) {
            const float* xr = xi + oh * row_step;
            const std::int64_t dro = oh * OW;
            // the next block's dy rows, a row of each per output row: each dy row is
            // its own 4 KiB page on cifar conv1, where the L2 streamer starts over
            if (pf)
                for (int k = 0; k < MB; ++k)
                    for (std::int64_t q = 0; q < OW; q += 16) __builtin_prefetch(pf[k] + dro + q, 0, 3);
            for (std::int64_t ow = 0; ow < full; ow += L) {
                reg d[MB];
#pragma GCC unroll 32
                for (int k = 0; k < MB; ++k) d[k] = V::load(dyr[k] + dro + ow);
#pragma GCC unroll 32
                for (int t = 0; t < TB; ++t) {
                    // one load per tap row, held in a register for the MB FMAs: GCC
                    // otherwise folds it into each FMA, MB loads of one often
                    // line-splitting address (the loop ran at 2/5 of the peak)
                    reg xv = V::load(xr + ow + o[t]);
                    V::pin(xv);
#pragma GCC unroll 32
                    for (int k = 0; k < MB; ++k) acc[k][t] = V::fma(d[k], xv, acc[k][t]);
                }
            }
            if (tail) {  // masked lanes are zero on both sides and read no memory
                reg d[MB];
                for (int k = 0; k < MB; ++k) d[k] = V::load_mask(V::zero(), dyr[k], dro + full, tail);
                for (int t = 0; t < TB; ++t) {
                    const reg xv = V::load_mask(V::zero(), xr, full + o[t], tail);
                    for (int k = 0; k < MB; ++k) acc[k][t] = V::fma(d[k], xv, acc[k][t]);
                }
            }
        }
        // summed from a copy: acc's own address taken kept it in memory (the loop ran at half speed)
        reg flat[MB * TB];
#pragma GCC unroll 32
        for (int k = 0; k < MB; ++k)
#pragma GCC unroll 32
            for (int t = 0; t < TB; ++t) flat[k * TB + t] = acc[k][t];
        V::sum_lanes(flat, MB * TB, s);
    }
};

volatile float g_fma_sink;  // keeps the chains observable

// Measured peak: 12 independent FMA chains per thread (enough to cover the
// FMA latency on two ports); returns the flops executed.
template <class V>
double fma_peak_t(std::int64_t iters, int threads) {
    double flops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
        constexpr int kChains = 12;
        const float one = 0.999999f, tiny = 1e-7f;
        const typename V::reg b = V::bcast(&one), c = V::bcast(&tiny);
        typename V::reg a[kChains];
        for (int i = 0; i < kChains; ++i) {
            const float s = 1.f + omp_get_thread_num() + 1e-3f * i;
            a[i] = V::bcast(&s);
        }
        for (std::int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
            for (int i = 0; i < kChains; ++i) a[i] = V::fma(a[i], b, c);
        }
        typename V::reg s = a[0];
        for (int i = 1; i < kChains; ++i) s = V::add(s, a[i]);
        alignas(64) float out[V::L];
        V::store(out, s);
        g_fma_sink = out[0];
        flops += double(iters) * kChains * V::L * 2;
    }
    return flops;
}

}  // namespace

// Defines detail::kernels_<name>() of a unit from its UK, traits V and FMA
// lanes per cycle (after gemm_driver.h); SPRINT_GEMM_FALLBACK (gemm_plan.h)
// stands in where the unit's ISA cannot be compiled.
#define SPRINT_GEMM_KERNELS(name, V, lanes)                                                               \
    namespace sprint {                                                                                    \
    namespace gemm {                                                                                      \
    namespace detail {                                                                                    \
    const Kernels& kernels_##name() {                                                                     \
        static const Kernels k{UK::MR, UK::NR, lanes, fma_peak_t<V>, sgemm_isa, conv_fwd_isa, DK::MR, DK::NR, DK::Vec::L, \
                                conv_dw_isa, conv_dx_isa, conv_dw_lanes_isa, SK::L, SK::MB_, SK::TB_};        \
        return k;                                                                                         \
    }                                                                                                     \
    }                                                                                                     \
    }                                                                                                     \
    }
