// dW's packers, included by gemm_conv_pack.h (same translation unit, same
// ISA, internal linkage): the A panels of dy (M x B*P read from NCHW) and
// the B panels of im2col(x)^T. Its own header so each module stays under
// ~400 lines.
#pragma once

namespace {

// dW = dy (M x B*P, read from NCHW) @ im2col(x)^T.
struct PackDy {
    const Conv* g;
    const float* dy;
    // Each image's pixels of MR rows of dy through the register transpose
    // (pack_rows, gemm_driver.h).
    void operator()(float* dst, i64 i0, i64 mr, i64 p0, i64 kc) const {
        constexpr int MR = UK::MR;
        const i64 P = g->P(), M = g->M;
        i64 img = p0 / P, pp = p0 % P;
        for (i64 kk = 0; kk < kc;) {
            const i64 len = lo_(kc - kk, P - pp);
            const float* rows[MR] = {};
            for (i64 r = 0; r < mr; ++r) rows[r] = dy + (img * M + i0 + r) * P + pp;
            pack_rows(rows, mr, len, dst + kk * MR);
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
    }
    void operator()(float* dst, const float** rows, i64 j0, i64 nr, i64 p0, i64 kc) const {
        constexpr int NR = UK::NR;
        for (i64 kk = 0; kk < kc; ++kk) rows[kk] = dst + kk * NR;
        const Conv& G = *g;
        const i64 P = G.P(), HW = G.H * G.W, khw = G.kh * G.kw;
        zero_edge(dst, nr, kc);  // columns past nr (the data written after it)
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
    }
};

void conv_dw_isa(const Plan& p, const Conv& g, const float* x, const float* dy, float* dw, bool accumulate) {
    run_plan(p, g.M, g.K(), g.B * g.P(), PackDy{&g, dy}, PackIm2colT{&g, x}, TilePlain{dw, g.K(), accumulate ? 1.f : 0.f});
}

}  // namespace
