// The implicit-GEMM convolution's packers and tiles, included by
// gemm_driver.h (same translation unit, same ISA, internal linkage): B panels
// of im2col(x) read from the image (forward, and dX as a forward of dy), the
// NCHW tile with fused bias and ReLU, dX's A panels read from the filters
// as they are; dW lives in gemm_dw.h.
#pragma once

namespace {

// x (B*C planes of H x W) zero-padded by (ph, pw) into xp (planes of Hp x Wp):
// the dW kernels and the small-K forward read taps at fixed offsets from it.
// Each thread of the kernel's parallel region pads its share of the planes,
// then all wait (every thread reads the whole image): a parallel region of its
// own cost a fork and join, 10-40 us here, a few % of cifar conv1's passes.
inline void pad_shared(const Conv& g, const float* x, float* xp, i64 Hp, i64 Wp) {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const i64 planes = g.B * g.C;
    for (i64 pl = planes * t / nt; pl < planes * (t + 1) / nt; ++pl) {
        const float* s = x + pl * g.H * g.W;
        float* d = xp + pl * Hp * Wp;
        std::memset(d, 0, sizeof(float) * size_t(g.ph * Wp));
        for (i64 h = 0; h < g.H; ++h) {
            float* row = d + (g.ph + h) * Wp;
            for (i64 q = 0; q < g.pw; ++q) row[q] = 0.f;
            std::memcpy(row + g.pw, s + h * g.W, sizeof(float) * size_t(g.W));
            for (i64 q = g.pw + g.W; q < Wp; ++q) row[q] = 0.f;
        }
        std::memset(d + (g.ph + g.H) * Wp, 0, sizeof(float) * size_t((Hp - g.ph - g.H) * Wp));
    }
#pragma omp barrier
}

// ---- implicit-GEMM convolution -------------------------------------------------
// A run: columns of one B panel that share (image, output row), i.e. that
// read one input row per (c, i, j).
struct Run {
    int col, len;
    i64 img;       // offset of the image (img*C*H*W)
    i64 ih0, iw0;  // oh*sh - ph, ow*sw - pw of the run's first column
};

// B = im2col(x): row kk = (c, i, j), column n = (img, oh, ow); zero by
// predicate where the window covers padding.
struct PackIm2col {
    const Conv* g;
    const float* x;
    // Unit stride: for each filter tap (i, j), lane l of an L-lane group reads
    // x[base + l + c*HW] for the lanes in the mask of each segment (the
    // columns inside the image of the runs that read at that base), the other
    // lanes are zero. The table of segments, masks included, is made once per
    // panel, so a row of the panel costs one vector load per segment -- one
    // plain load where a group is one whole segment --
    // and padding needs neither a zero-bordered copy of x nor per-element
    // tests. A tap whose panel row is one contiguous stretch of x is read in
    // place (no copy). False when the panel needs more table than fits
    // (many taps, or many runs per group): the general path then packs it.
    static constexpr int kMaxTaps = 49, kMaxSeg = 4;
#ifndef SPRINT_PACK_WRITE_AHEAD  // overridable at build time, for measuring other distances
#define SPRINT_PACK_WRITE_AHEAD 4
#endif
    // The panel row this many channels on is fetched for writing: the panel
    // (kc x NR, 144 KiB at KC 768) lives in L2, and its stores otherwise wait
    // for each line's fill (cifar conv2, conv3, conv5: packing 4-14 % shorter).
    static constexpr i64 kWriteAhead = SPRINT_PACK_WRITE_AHEAD;
    bool unit_stride(float* dst, const float** rows, i64 nr, i64 kc, i64 p0, const Run* runs, int nrun) const {
        using V = typename UK::Vec;
        constexpr int NR = UK::NR, L = V::L, NG = NR / L;
        const Conv& G = *g;
        const i64 HW = G.H * G.W, khw = G.kh * G.kw;
        if (khw > kMaxTaps) return false;
        struct Seg {
            std::uint32_t mask;
            i64 base;
        };
        Seg seg[kMaxTaps][NG][kMaxSeg];
        int nseg[kMaxTaps][NG];
        bool whole[kMaxTaps][NG], inplace[kMaxTaps];
        for (i64 q = 0; q < khw; ++q) {
            const i64 i = q / G.kw, j = q % G.kw;
            inplace[q] = nr == NR;
            for (int gi = 0; gi < NG; ++gi) {
                int n = 0;
                for (int r = 0; r < nrun; ++r) {
                    const Run& R = runs[r];
                    const i64 ih = R.ih0 + i, iw = R.iw0 + j;  // of the run's first column
                    const int a = int(hi_(R.col, gi * L)) - gi * L, e = int(lo_(R.col + R.len, (gi + 1) * L)) - gi * L;
                    if (a >= e || ih < 0 || ih >= G.H) continue;
                    const i64 shift = R.col - gi * L - iw;  // lane l reads column l - shift
                    const int lo = int(hi_(a, shift)), hi = int(lo_(e, G.W + shift));
                    if (lo >= hi) continue;
                    // Runs whose lanes read at one base share a load: when W == OW (same
                    // padding), the output rows of an image a group holds do.
                    const i64 base = R.img + ih * G.W - shift;
                    int s = 0;
                    while (s < n && seg[q][gi][s].base != base) ++s;
                    if (s == kMaxSeg) return false;
                    if (s == n) seg[q][gi][n++] = Seg{0u, base};
                    seg[q][gi][s].mask |= lane_range(lo, hi);
                }
                nseg[q][gi] = n;
                whole[q][gi] = n == 1 && seg[q][gi][0].mask == lane_range(0, L);
                // Read in place when the panel row is one contiguous stretch of x:
                // each group one whole load, group gi at the first's base + gi*L.
                // Besides a panel inside one image row, with "same" padding (W ==
                // OW) the taps of the kernel's middle column read consecutive
                // output rows as consecutive input rows: a third of a 3 x 3
                // convolution's rows away from the image's top and bottom.
                inplace[q] = inplace[q] && whole[q][gi] && seg[q][gi][0].base == seg[q][0][0].base + gi * L;
            }
        }
        // Tap by tap, then channel by channel (rows kk = c*khw + q - p0): a tap's
        // masks and bases stay in registers over its channels, and a tap whose
        // groups each need at most one load (nearly all of them) runs a loop of
        // NG loads and stores per row. Row by row, looking the tap's table up
        // each time, cifar conv2's forward packing took 3.3 thread-ms against
        // 1.8 now (with the rows read in place above).
        const i64 p1 = p0 + kc;
        for (i64 q = 0; q < khw; ++q) {
            i64 c = q >= p0 ? 0 : (p0 - q + khw - 1) / khw;  // first channel whose row lies in [p0, p1)
            const i64 cend = p1 > q ? (p1 - q + khw - 1) / khw : 0;
            if (inplace[q]) {  // the panel row is x[base + c*HW ...]: read it in place
                for (; c < cend; ++c) rows[c * khw + q - p0] = x + seg[q][0][0].base + c * HW;
                continue;
            }
            bool single = true;
            i64 base[NG];
            std::uint32_t mask[NG];
            for (int gi = 0; gi < NG; ++gi) {
                single = single && nseg[q][gi] <= 1;
                base[gi] = nseg[q][gi] ? seg[q][gi][0].base : 0;
                mask[gi] = nseg[q][gi] ? seg[q][gi][0].mask : 0u;  // no lane: a zero row, no memory read
            }
            if (single) {
                const float* const xs = x;  // a local: the stores to dst could alias the member
                bool wh[NG];
                for (int gi = 0; gi < NG; ++gi) wh[gi] = whole[q][gi];
                for (; c < cend; ++c) {
                    const i64 kk = c * khw + q - p0, off = c * HW;
                    float* d = dst + kk * NR;
                    rows[kk] = d;
                    for (int gi = 0; gi < NG; ++gi) __builtin_prefetch(d + kWriteAhead * khw * NR + gi * L, 1, 3);
#pragma GCC unroll 8
                    for (int gi = 0; gi < NG; ++gi)
                        V::store(d + gi * L, wh[gi] ? V::load(xs + base[gi] + off)
                                                    : V::load_mask(V::zero(), xs, base[gi] + off, mask[gi]));
                }
                continue;
            }
            for (; c < cend; ++c) {
                const i64 kk = c * khw + q - p0, off = c * HW;
                float* d = dst + kk * NR;
                rows[kk] = d;
                for (int gi = 0; gi < NG; ++gi) {
                    const Seg* sg = seg[q][gi];
                    typename V::reg acc = V::zero();
                    for (int t = 0; t < nseg[q][gi]; ++t) acc = V::load_mask(acc, x, sg[t].base + off, sg[t].mask);
                    V::store(d + gi * L, acc);
                }
            }
        }
        return true;
    }
    void operator()(float* dst, const float** rows, i64 j0, i64 nr, i64 p0, i64 kc) const {
        constexpr int NR = UK::NR;
        const Conv& G = *g;
        const i64 P = G.P(), HW = G.H * G.W;
        Run runs[NR];
        int nrun = 0;
        i64 img = j0 / P, pp = j0 % P, oh = pp / G.OW, ow = pp % G.OW;
        for (int col = 0; col < nr;) {
            const int len = int(lo_(nr - col, G.OW - ow));
            runs[nrun++] = Run{col, len, img * G.C * HW, oh * G.sh - G.ph, ow * G.sw - G.pw};
            col += len;
            ow += len;
            if (ow == G.OW) {
                ow = 0;
                if (++oh == G.OH) oh = 0, ++img;
            }
        }
        const i64 khw = G.kh * G.kw;
        if (G.sw == 1 && unit_stride(dst, rows, nr, kc, p0, runs, nrun)) return;
        const bool one_run = nrun == 1 && nr == NR && G.sw == 1;
        i64 c = p0 / khw, i = (p0 % khw) / G.kw, j = p0 % G.kw;
        for (i64 kk = 0; kk < kc; ++kk) {
            float* d = dst + kk * NR;
            rows[kk] = d;
            if (one_run) {  // the whole panel row inside the image: read it in place
                const Run& R = runs[0];
                const i64 ih = R.ih0 + i, iw0 = R.iw0 + j;
                if (ih >= 0 && ih < G.H && iw0 >= 0 && iw0 + NR <= G.W) {
                    rows[kk] = x + R.img + c * HW + ih * G.W + iw0;
                    if (++j == G.kw) {
                        j = 0;
                        if (++i == G.kh) i = 0, ++c;
                    }
                    continue;
                }
            }
            if (G.sw == 1) {  // each L-lane group: one masked vector load per run it holds
                using V = typename UK::Vec;
                constexpr int L = V::L;
                for (int r = 0, g0 = 0; g0 < NR; g0 += L) {
                    typename V::reg acc = V::zero();
                    for (; r < nrun && runs[r].col < g0 + L; ++r) {
                        const Run& R = runs[r];
                        const i64 ih = R.ih0 + i, iw = R.iw0 + j;  // of the run's first column
                        if (ih < 0 || ih >= G.H) continue;
                        // lane l of the group reads column iw + (l - (R.col - g0)), where inside the row
                        const int a = R.col - g0;
                        const int lo = int(hi_(hi_(a, a - iw), 0)), hi = int(lo_(lo_(a + R.len, a + G.W - iw), L));
                        if (lo < hi) acc = V::load_mask(acc, x, R.img + c * HW + ih * G.W + iw - a, lane_range(lo, hi));
                    }
                    if (r > 0 && runs[r - 1].col + runs[r - 1].len > g0 + L) --r;  // a run spilling into the next group
                    V::store(d + g0, acc);
                }
                if (++j == G.kw) {
                    j = 0;
                    if (++i == G.kh) i = 0, ++c;
                }
                continue;
            }
            for (int r = 0; r < nrun; ++r) {
                const Run& R = runs[r];
                float* dr = d + R.col;
                const i64 ih = R.ih0 + i;
                if (ih < 0 || ih >= G.H) {
                    for (int q = 0; q < R.len; ++q) dr[q] = 0.f;
                    continue;
                }
                const float* row = x + R.img + c * HW + ih * G.W;
                const i64 iw0 = R.iw0 + j;
                if (G.sw == 1) {
                    const int a = int(lo_(R.len, hi_(0, -iw0))), b = int(hi_(a, lo_(R.len, G.W - iw0)));
                    for (int q = 0; q < a; ++q) dr[q] = 0.f;
                    for (int q = a; q < b; ++q) dr[q] = row[iw0 + q];
                    for (int q = b; q < R.len; ++q) dr[q] = 0.f;
                } else {
                    for (int q = 0; q < R.len; ++q) {
                        const i64 iw = iw0 + q * G.sw;
                        dr[q] = (iw >= 0 && iw < G.W) ? row[iw] : 0.f;
                    }
                }
            }
            for (i64 q = nr; q < NR; ++q) d[q] = 0.f;
            if (++j == G.kw) {
                j = 0;
                if (++i == G.kh) i = 0, ++c;
            }
        }
    }
};

// One output row segment: c[q] = s[q] (+ bias, ReLU after the last k block),
// by whole registers and one masked one. TileNCHW and the small-K direct
// forward (gemm_conv_small.h) share it. The plain loop GCC vectorised
// itself, with its run-time length, cost about as much as the FMAs of a
// K = 27 tile (cifar conv1's forward).
inline void write_out(float* c, const float* s, int len, const float* bias, bool relu, bool last) {
    if (!last || (!bias && !relu)) return copy_row(c, s, len);
    using V = typename UK::Vec;
    constexpr int L = V::L;
    const float zero = 0.f;
    const typename V::reg b = V::bcast(bias ? bias : &zero);
    int q = 0;
    for (; q + L <= len; q += L) {
        const typename V::reg v = V::add(V::load(s + q), b);
        V::store(c + q, relu ? V::relu(v) : v);
    }
    if (q < len) {
        const std::uint32_t m = lane_range(0, len - q);
        const typename V::reg v = V::add(V::load_mask(V::zero(), s, q, m), b);
        V::store_mask(c, q, relu ? V::relu(v) : v, m);
    }
}

// Tile column n = (img, p) is y[img, m, p]; chains start from zero, and
// after the last k block the bias is added and ReLU applied.
struct TileNCHW {
    static constexpr int kAhead = 2;
    const Conv* g;
    float* y;
    const float* bias;
    bool relu;
    template <class F>
    void runs(i64 i0, i64 j0, int mr, int nr, F f) const {  // f(row of y, tile offset, length, r)
        const i64 P = g->P(), M = g->M;
        i64 img = j0 / P, pp = j0 % P;
        for (int col = 0; col < nr;) {
            const int len = int(lo_(nr - col, P - pp));
            for (int r = 0; r < mr; ++r) f(y + (img * M + i0 + r) * P + pp, r * UK::NR + col, len, r);
            col += len;
            pp = 0;
            ++img;
        }
    }
    bool load(i64 i0, i64 j0, int mr, int nr, float* t, bool first) const {
        if (first) return true;
        if (mr < UK::MR || nr < UK::NR) zero_tile(t);  // lanes no run covers (the kernel reads them)
        runs(i0, j0, mr, nr, [&](const float* c, int o, int len, int) { copy_row(t + o, c, len); });
        return false;
    }
    void store(i64 i0, i64 j0, int mr, int nr, const float* t, bool last) const {
        // The tile's rows kAhead panels on, fetched for writing now: a tile's
        // rows lie P floats apart (one stream per channel, more than the L2
        // streamer tracks), so each first store of a line waited for its fill;
        // cifar conv1's forward (k = 27) was bound by those waits.
        const i64 ja = j0 + kAhead * UK::NR, n = g->B * g->P();
        if (last && ja < n)
            runs(i0, ja, mr, int(lo_(UK::NR, n - ja)), [](const float* c, int, int len, int) {
                for (int q = 0; q < len; q += 16) __builtin_prefetch(c + q, 1, 3);
                __builtin_prefetch(c + len - 1, 1, 3);
            });
        runs(i0, j0, mr, nr, [&](float* c, int o, int len, int r) {
            write_out(c, t + o, len, bias ? bias + i0 + r : nullptr, relu, last);
        });
    }
};

void conv_fwd_isa(const Plan& p, const Conv& g, const float* x, const float* w, const float* bias, bool relu,
                  float* y) {
    run_plan(p, g.M, g.B * g.P(), g.K(), PackA{w, g.K(), false, 1.f}, PackIm2col{&g, x},
             TileNCHW{&g, y, bias, relu});
}

// dX's A = the flipped, transposed filters wt[c][m*khw + q] = w[m][c][khw-1-q]
// (t = the transposed convolution: t.M = the filters' C, t.C = their M),
// read straight from w while packing: a flipped copy made first was one
// single-threaded strided pass over all the filters per call (about 1.5 ms of
// cifar conv6's 10 ms dX on this machine).
struct PackWFlipped {
    const float* w;
    i64 rows, khw;  // rows = t.M
    void operator()(float* dst, i64 i0, i64 mr, i64 p0, i64 kc) const {
        constexpr int MR = UK::MR;
        i64 m = p0 / khw, q = p0 % khw;
        for (i64 kk = 0; kk < kc; ++kk) {
            const float* s = w + (m * rows + i0) * khw + (khw - 1 - q);
            float* d = dst + kk * MR;
            for (i64 r = 0; r < mr; ++r) d[r] = s[r * khw];
            for (i64 r = mr; r < MR; ++r) d[r] = 0.f;
            if (++q == khw) q = 0, ++m;
        }
    }
};

void conv_dx_isa(const Plan& p, const Conv& t, const float* dy, const float* w, float* dx) {
    run_plan(p, t.M, t.B * t.P(), t.K(), PackWFlipped{w, t.M, t.kh * t.kw}, PackIm2col{&t, dy},
             TileNCHW{&t, dx, nullptr, false});
}

}  // namespace

#include "gemm_dw.h"  // dW as dW^T = im2col(x) @ dy^T
#include "gemm_conv_small.h"  // small K: the direct forward and dW in vector lanes
