// The implicit-GEMM convolution's packers and tiles, included by
// gemm_driver.h (same translation unit, same ISA, internal linkage): B panels
// of im2col(x) read from the image (forward, and dX as a forward of dy), the
// NCHW tile with fused bias and ReLU, and dW's packings of dy and
// im2col(x)^T.
#pragma once

namespace {

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
    // x[base + l + c*HW] for lanes lo <= l < hi of each segment (a run's
    // columns inside the image), the other lanes are zero. The table of
    // segments is made once per panel, so a row of the panel costs one vector
    // load per segment -- one plain load where a group is one whole segment --
    // and padding needs neither a zero-bordered copy of x nor per-element
    // tests. A tap whose whole panel row lies in one image row is read in
    // place (no copy). False when the panel needs more table than fits
    // (many taps, or many runs per group): the general path then packs it.
    static constexpr int kMaxTaps = 49, kMaxSeg = 4;
    bool unit_stride(float* dst, const float** rows, i64 nr, i64 kc, i64 p0, const Run* runs, int nrun) const {
        using V = typename UK::Vec;
        constexpr int NR = UK::NR, L = V::L, NG = NR / L;
        const Conv& G = *g;
        const i64 HW = G.H * G.W, khw = G.kh * G.kw;
        if (khw > kMaxTaps) return false;
        struct Seg {
            int lo, hi;
            i64 base;
        };
        Seg seg[kMaxTaps][NG][kMaxSeg];
        int nseg[kMaxTaps][NG];
        bool whole[kMaxTaps][NG], inplace[kMaxTaps];
        for (i64 q = 0; q < khw; ++q) {
            const i64 i = q / G.kw, j = q % G.kw;
            inplace[q] = nrun == 1 && nr == NR;
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
                    if (n == kMaxSeg) return false;
                    seg[q][gi][n++] = Seg{lo, hi, R.img + ih * G.W - shift};
                }
                nseg[q][gi] = n;
                whole[q][gi] = n == 1 && seg[q][gi][0].lo == 0 && seg[q][gi][0].hi == L;
                inplace[q] = inplace[q] && whole[q][gi];
            }
        }
        i64 c = p0 / khw, q = p0 % khw;
        for (i64 kk = 0; kk < kc; ++kk) {
            const i64 off = c * HW;
            if (inplace[q]) {  // the whole panel row inside one image row: read it in place
                rows[kk] = x + seg[q][0][0].base + off;
            } else {
                float* d = dst + kk * NR;
                rows[kk] = d;
                for (int gi = 0; gi < NG; ++gi) {
                    const Seg* sg = seg[q][gi];
                    if (whole[q][gi]) {
                        V::store(d + gi * L, V::load(x + sg[0].base + off));
                        continue;
                    }
                    typename V::reg acc = V::zero();
                    for (int t = 0; t < nseg[q][gi]; ++t) acc = V::load_merge(acc, x, sg[t].base + off, sg[t].lo, sg[t].hi);
                    V::store(d + gi * L, acc);
                }
            }
            if (++q == khw) q = 0, ++c;
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
                        if (lo < hi) acc = V::load_merge(acc, x, R.img + c * HW + ih * G.W + iw - a, lo, hi);
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

// Tile column n = (img, p) is y[img, m, p]; chains start from zero, and
// after the last k block the bias is added and ReLU applied.
struct TileNCHW {
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
        zero_tile(t);
        runs(i0, j0, mr, nr, [&](const float* c, int o, int len, int) {
            for (int q = 0; q < len; ++q) t[o + q] = c[q];
        });
        return false;
    }
    void store(i64 i0, i64 j0, int mr, int nr, const float* t, bool last) const {
        runs(i0, j0, mr, nr, [&](float* c, int o, int len, int r) {
            const float* s = t + o;
            if (!last) {
                for (int q = 0; q < len; ++q) c[q] = s[q];
                return;
            }
            const float b = bias ? bias[i0 + r] : 0.f;
            if (relu) {
                for (int q = 0; q < len; ++q) c[q] = s[q] + b > 0.f ? s[q] + b : 0.f;
            } else if (bias) {
                for (int q = 0; q < len; ++q) c[q] = s[q] + b;
            } else {
                for (int q = 0; q < len; ++q) c[q] = s[q];
            }
        });
    }
};

void conv_fwd_isa(const Plan& p, const Conv& g, const float* x, const float* w, const float* bias, bool relu,
                  float* y) {
    run_plan(p, g.M, g.B * g.P(), g.K(), PackA{w, g.K(), false, 1.f}, PackIm2col{&g, x},
             TileNCHW{&g, y, bias, relu});
}

// dW = dy (M x B*P, read from NCHW) @ im2col(x)^T.
struct PackDy {
    const Conv* g;
    const float* dy;
    // L pixels x MR rows at a time through the register transpose (rows past
    // mr masked to zero), then MR floats per pixel into the panel.
    void operator()(float* dst, i64 i0, i64 mr, i64 p0, i64 kc) const {
        constexpr int MR = UK::MR, L = UK::Vec::L;
        static_assert(MR <= L, "an A panel row must fit one transposed register");
        const i64 P = g->P(), M = g->M;
        alignas(64) float tmp[L * L];
        i64 img = p0 / P, pp = p0 % P;
        for (i64 kk = 0; kk < kc;) {
            const i64 len = lo_(kc - kk, P - pp);
            i64 off[L];
            std::uint32_t mask[L];
            for (int r = 0; r < L; ++r) {
                off[r] = r < mr ? (img * M + i0 + r) * P + pp : 0;
                mask[r] = r < mr ? lane_range(0, L) : 0u;
            }
            i64 q = 0;
            for (; q + L <= len; q += L) {
                UK::Vec::transpose(dy, off, q, mask, tmp, L);
                for (int e = 0; e < L; ++e)
                    for (int r = 0; r < MR; ++r) dst[(kk + q + e) * MR + r] = tmp[e * L + r];
            }
            for (; q < len; ++q)
                for (int r = 0; r < MR; ++r) dst[(kk + q) * MR + r] = r < mr ? dy[off[r] + q] : 0.f;
            kk += len;
            pp = 0;
            ++img;
        }
    }
};

// B = im2col(x)^T: row kk = pixel (img, oh, ow), column = (c, i, j).
struct PackIm2colT {
    const Conv* g;
    const float* x;
    // Unit column stride: each column reads a run of an image row per output
    // row, so L columns x L pixels go through one register transpose, the
    // lanes over padding masked off (never read). When the output rows are
    // as wide as the input's (unit strides, "same" padding: W == OW), pixel p
    // of an image reads x at p + (i - ph)*W + (j - pw) for tap (i, j), so a
    // block of L pixels is one run per column even across output rows (the
    // small images, OW < L, would otherwise go element by element); its
    // padding lanes are masked by the tap's row and column.
    void unit_stride(float* dst, i64 j0, i64 nr, i64 p0, i64 kc) const {
        constexpr int NR = UK::NR, L = UK::Vec::L;
        constexpr int kMaxTap = 32;
        const Conv& G = *g;
        const i64 P = G.P(), HW = G.H * G.W, khw = G.kh * G.kw;
        // each column's (c*HW, i, j), once per panel: divisions per run would cost more than the copies
        i64 cHW[NR];
        int ci[NR], cj[NR];
        for (i64 col = 0; col < nr; ++col) {
            const i64 kidx = j0 + col;
            cHW[col] = kidx / khw * HW;
            ci[col] = int(kidx % khw / G.kw);
            cj[col] = int(kidx % G.kw);
        }
        const bool blocks = G.sh == 1 && G.W == G.OW && G.kh <= kMaxTap && G.kw <= kMaxTap;
        i64 img = p0 / P, pp = p0 % P;
        for (i64 kk = 0; kk < kc;) {
            const i64 oh = pp / G.OW, ow = pp % G.OW, base = img * G.C * HW;
            i64 len = lo_(kc - kk, G.OW - ow);
            if (blocks && lo_(kc - kk, P - pp) >= L) {
                len = L;
                // lanes inside the image per tap row / column, one output row (lanes [a, b)) at a time
                std::uint32_t rm[kMaxTap] = {}, cm[kMaxTap] = {};
                for (i64 a = 0, h = oh, w = ow; a < L; ++h, w = 0) {
                    const i64 b = lo_(L, a + G.OW - w);
                    for (int i = 0; i < G.kh; ++i)
                        if (h - G.ph + i >= 0 && h - G.ph + i < G.H) rm[i] |= lane_range(int(a), int(b));
                    for (int j = 0; j < G.kw; ++j)  // columns w - pw + j of lane a + t, t < b - a
                        cm[j] |= lane_range(int(a + hi_(0, G.pw - j - w)), int(a + lo_(b - a, G.W + G.pw - j - w)));
                    a = b;
                }
                for (i64 col = 0; col < nr; col += L) {
                    i64 off[L];
                    std::uint32_t mask[L];
                    for (int r = 0; r < L; ++r) {
                        const bool in = col + r < nr;
                        off[r] = in ? base + cHW[col + r] + (ci[col + r] - G.ph) * G.W + cj[col + r] - G.pw + pp : 0;
                        mask[r] = in ? rm[ci[col + r]] & cm[cj[col + r]] : 0u;
                    }
                    UK::Vec::transpose(x, off, 0, mask, dst + kk * NR + col, NR);
                }
            } else {
                const i64 ih0 = oh * G.sh - G.ph;
                for (i64 col = 0; col < nr; col += L) {
                    const int w = int(lo_(L, nr - col));
                    i64 off[L], iw[L];  // element (r, q) is x[off[r] + q], in the image where 0 <= iw[r] + q < W
                    for (int r = 0; r < L; ++r) {
                        if (r >= w) {
                            off[r] = 0, iw[r] = G.W;
                            continue;
                        }
                        const i64 ih = ih0 + ci[col + r];
                        iw[r] = ow - G.pw + cj[col + r];
                        if (ih < 0 || ih >= G.H) iw[r] = G.W;  // a padding row: no lane is inside
                        off[r] = base + cHW[col + r] + ih * G.W + iw[r];
                    }
                    float* d = dst + kk * NR + col;
                    i64 q = 0;
                    for (; q + L <= len; q += L) {
                        std::uint32_t mask[L];
                        for (int r = 0; r < L; ++r)
                            mask[r] = lane_range(int(lo_(L, hi_(0, -(iw[r] + q)))), int(lo_(L, G.W - (iw[r] + q))));
                        UK::Vec::transpose(x, off, q, mask, d + q * NR, NR);
                    }
                    for (; q < len; ++q)
                        for (int r = 0; r < w; ++r) {
                            const i64 c = iw[r] + q;
                            d[q * NR + r] = (c >= 0 && c < G.W) ? x[off[r] + q] : 0.f;
                        }
                }
            }
            kk += len;
            pp += len;
            if (pp == P) pp = 0, ++img;
        }
        for (i64 kk = 0; kk < kc; ++kk)
            for (i64 col = nr; col < NR; ++col) dst[kk * NR + col] = 0.f;
    }
    void operator()(float* dst, const float** rows, i64 j0, i64 nr, i64 p0, i64 kc) const {
        constexpr int NR = UK::NR;
        for (i64 kk = 0; kk < kc; ++kk) rows[kk] = dst + kk * NR;
        const Conv& G = *g;
        const i64 P = G.P(), HW = G.H * G.W, khw = G.kh * G.kw;
        if (G.sw == 1) {
            unit_stride(dst, j0, nr, p0, kc);
            return;
        }
        for (i64 col = 0; col < nr; ++col) {
            const i64 kidx = j0 + col, c = kidx / khw, i = (kidx % khw) / G.kw, j = kidx % G.kw;
            float* d = dst + col;
            i64 img = p0 / P, pp = p0 % P, oh = pp / G.OW, ow = pp % G.OW;
            for (i64 kk = 0; kk < kc;) {
                const i64 len = lo_(kc - kk, G.OW - ow);
                const i64 ih = oh * G.sh - G.ph + i;
                if (ih < 0 || ih >= G.H) {
                    for (i64 q = 0; q < len; ++q) d[(kk + q) * NR] = 0.f;
                } else {
                    const float* row = x + (img * G.C + c) * HW + ih * G.W;
                    const i64 iw0 = ow * G.sw - G.pw + j;
                    for (i64 q = 0; q < len; ++q) {
                        const i64 iw = iw0 + q * G.sw;
                        d[(kk + q) * NR] = (iw >= 0 && iw < G.W) ? row[iw] : 0.f;
                    }
                }
                kk += len;
                ow = 0;
                if (++oh == G.OH) oh = 0, ++img;
            }
        }
        for (i64 col = nr; col < NR; ++col)
            for (i64 kk = 0; kk < kc; ++kk) dst[kk * NR + col] = 0.f;
    }
};

void conv_dw_isa(const Plan& p, const Conv& g, const float* x, const float* dy, float* dw, bool accumulate) {
    run_plan(p, g.M, g.K(), g.B * g.P(), PackDy{&g, dy}, PackIm2colT{&g, x}, TilePlain{dw, g.K(), accumulate ? 1.f : 0.f});
}

}  // namespace
