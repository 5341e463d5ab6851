// Internal: the Winograd transforms (winograd.h) written once over a lane
// count L, instantiated by each ISA translation unit (winograd_avx512.cpp:
// L = 16, winograd_avx2.cpp: 8, winograd_generic.cpp: 4) compiled with its
// own -m flags. Every transform works on L tiles (or L filters) at once:
// the lane loops are plain fixed-length loops the compiler turns into one
// vector operation each under the unit's flags. Only the gathers from the
// NCHW image and the scatters into it are per lane (their addresses are
// strided by the tile size).
// Internal linkage only (an AVX-512 instance must never serve another unit:
// see gemm_plan.h).
#pragma once

#include <omp.h>

#include <cstdint>

#include "winograd.h"

namespace {

using sprint::winograd::Conv;
using sprint::winograd::i64;
using sprint::winograd::detail::Block;

// F(2x2, 3x3): B^T, G, A^T of Lavin & Gray (2015), section 4.1.
// a[j*s + l]: element j of lane l.
struct F23 {
    static constexpr int m = 2, a = 4;
    template <int L>
    static void in(const float* __restrict d, i64 ds, float* __restrict o, i64 os) {
#pragma GCC ivdep
        for (int l = 0; l < L; ++l) {
            const float d0 = d[l], d1 = d[ds + l], d2 = d[2 * ds + l], d3 = d[3 * ds + l];
            o[l] = d0 - d2;
            o[os + l] = d1 + d2;
            o[2 * os + l] = d2 - d1;
            o[3 * os + l] = d1 - d3;
        }
    }
    template <int L>
    static void filt(const float* __restrict g, i64 gs, float* __restrict o, i64 os) {
#pragma GCC ivdep
        for (int l = 0; l < L; ++l) {
            const float g0 = g[l], g1 = g[gs + l], g2 = g[2 * gs + l];
            const float h = 0.5f * (g0 + g2);
            o[l] = g0;
            o[os + l] = h + 0.5f * g1;
            o[2 * os + l] = h - 0.5f * g1;
            o[3 * os + l] = g2;
        }
    }
    template <int L>
    static void out(const float* __restrict z, i64 zs, float* __restrict o, i64 os) {
#pragma GCC ivdep
        for (int l = 0; l < L; ++l) {
            const float z1 = z[zs + l], z2 = z[2 * zs + l];
            o[l] = z[l] + z1 + z2;
            o[os + l] = z1 - z2 - z[3 * zs + l];
        }
    }
};

// F(4x4, 3x3): the points 0, +-1, +-2 and infinity (Lavin & Gray, 4.2).
struct F43 {
    static constexpr int m = 4, a = 6;
    template <int L>
    static void in(const float* __restrict d, i64 ds, float* __restrict o, i64 os) {
#pragma GCC ivdep
        for (int l = 0; l < L; ++l) {
            const float d0 = d[l], d1 = d[ds + l], d2 = d[2 * ds + l], d3 = d[3 * ds + l], d4 = d[4 * ds + l],
                        d5 = d[5 * ds + l];
            const float p = d4 - 4.f * d2, q = d3 - 4.f * d1;   // rows 1, 2
            const float r = d4 - d2, s = 2.f * (d3 - d1);        // rows 3, 4
            o[l] = 4.f * d0 - 5.f * d2 + d4;
            o[os + l] = p + q;
            o[2 * os + l] = p - q;
            o[3 * os + l] = r + s;
            o[4 * os + l] = r - s;
            o[5 * os + l] = 4.f * d1 - 5.f * d3 + d5;
        }
    }
    template <int L>
    static void filt(const float* __restrict g, i64 gs, float* __restrict o, i64 os) {
#pragma GCC ivdep
        for (int l = 0; l < L; ++l) {
            const float g0 = g[l], g1 = g[gs + l], g2 = g[2 * gs + l];
            const float e = g0 + g2, f = g0 * (1.f / 24) + g2 * (1.f / 6);
            o[l] = 0.25f * g0;
            o[os + l] = -(e + g1) * (1.f / 6);
            o[2 * os + l] = -(e - g1) * (1.f / 6);
            o[3 * os + l] = f + g1 * (1.f / 12);
            o[4 * os + l] = f - g1 * (1.f / 12);
            o[5 * os + l] = g2;
        }
    }
    template <int L>
    static void out(const float* __restrict z, i64 zs, float* __restrict o, i64 os) {
#pragma GCC ivdep
        for (int l = 0; l < L; ++l) {
            const float z0 = z[l], z1 = z[zs + l], z2 = z[2 * zs + l], z3 = z[3 * zs + l], z4 = z[4 * zs + l],
                        z5 = z[5 * zs + l];
            const float p = z1 + z2, q = z1 - z2, r = z3 + z4, s = z3 - z4;
            o[l] = z0 + p + r;
            o[os + l] = q + 2.f * s;
            o[2 * os + l] = p + 4.f * r;
            o[3 * os + l] = q + 8.f * s + z5;
        }
    }
};

inline i64 cdiv_(i64 a, i64 b) { return (a + b - 1) / b; }

// Filter transform of rows [r0, r1): U[xi][r][c] = (G g G^T)[xi], L filters
// (consecutive c) at a time. g = w[r][c] (forward) or, flipped (dX of the
// layer whose filters w is: rows = its input channels), w[c][r] rotated by
// 180 degrees.
template <class T, int L>
void filter_t(const Conv& g, const float* w, bool flipped, float* U, i64 r0, i64 r1) {
    constexpr int A = T::a;
    const i64 rows = g.M, cols = g.C;
    alignas(64) float G[9 * L], Q[3 * A * L], R[A * A * L];
    for (i64 r = r0; r < r1; ++r)
        for (i64 c0 = 0; c0 < cols; c0 += L) {
            const int nl = int(cols - c0 < L ? cols - c0 : L);
            for (int l = 0; l < nl; ++l) {
                const float* s = flipped ? w + ((c0 + l) * rows + r) * 9 : w + (r * cols + c0 + l) * 9;
                if (flipped) {
                    for (int e = 0; e < 9; ++e) G[e * L + l] = s[8 - e];
                } else {
                    for (int e = 0; e < 9; ++e) G[e * L + l] = s[e];
                }
            }
            for (int l = nl; l < L; ++l)
                for (int e = 0; e < 9; ++e) G[e * L + l] = 0.f;
            for (int i = 0; i < 3; ++i) T::template filt<L>(G + i * 3 * L, L, Q + i * A * L, L);  // along j
            for (int k = 0; k < A; ++k) T::template filt<L>(Q + k * L, A * L, R + k * L, A * L);  // along i
            for (int xi = 0; xi < A * A; ++xi) {
                float* u = U + (xi * rows + r) * cols + c0;
                if (nl == L) {
#pragma GCC ivdep
                    for (int l = 0; l < L; ++l) u[l] = R[xi * L + l];  // one vector store
                } else {
                    for (int l = 0; l < nl; ++l) u[l] = R[xi * L + l];
                }
            }
        }
}

// Where the L tiles of a lane group start: image offset (channel 0), top row,
// left column of the patch (may be negative: padding).
template <int L>
int decode(const Conv& g, int m, i64 t0, i64 nt, i64 TH, i64 TW, i64 chan, i64 (&base)[L], i64 (&h0)[L],
           i64 (&w0)[L], i64 off_h, i64 off_w, i64 plane) {
    const int nl = int(nt < L ? nt : L);
    for (int l = 0; l < nl; ++l) {
        const i64 t = t0 + l, b = t / (TH * TW), rem = t % (TH * TW);
        base[l] = b * chan * plane;
        h0[l] = rem / TW * m - off_h;
        w0[l] = rem % TW * m - off_w;
    }
    return nl;
}

// V[xi][c][j] (row stride blk.ld) for the block's tiles j < nt, all C channels.
template <class T, int L>
void input_t(const Conv& g, const float* x, const Block& blk, float* V) {
    constexpr int A = T::a, N = A * A, m = T::m;
    const i64 TH = cdiv_(g.OH, m), TW = cdiv_(g.OW, m), HW = g.H * g.W;
    alignas(64) float P[N * L], Q[N * L], R[N * L];
    i64 base[L], h0[L], w0[L];
    for (i64 j0 = 0; j0 < blk.nt; j0 += L) {
        const int nl = decode<L>(g, m, blk.t0 + j0, blk.nt - j0, TH, TW, g.C, base, h0, w0, g.ph, g.pw, HW);
        bool inner[L];
        for (int l = 0; l < nl; ++l)
            inner[l] = h0[l] >= 0 && h0[l] + A <= g.H && w0[l] >= 0 && w0[l] + A <= g.W;
        for (i64 c = 0; c < g.C; ++c) {
            for (int l = 0; l < L; ++l) {
                if (l >= nl) {
                    for (int e = 0; e < N; ++e) P[e * L + l] = 0.f;
                    continue;
                }
                const float* s = x + base[l] + c * HW;
                if (inner[l]) {
                    const float* p = s + h0[l] * g.W + w0[l];
                    for (int i = 0; i < A; ++i)
                        for (int j = 0; j < A; ++j) P[(i * A + j) * L + l] = p[i * g.W + j];
                } else {
                    for (int i = 0; i < A; ++i) {
                        const i64 h = h0[l] + i;
                        const bool hin = h >= 0 && h < g.H;
                        for (int j = 0; j < A; ++j) {
                            const i64 wc = w0[l] + j;
                            P[(i * A + j) * L + l] = hin && wc >= 0 && wc < g.W ? s[h * g.W + wc] : 0.f;
                        }
                    }
                }
            }
            for (int i = 0; i < A; ++i) T::template in<L>(P + i * A * L, L, Q + i * A * L, L);  // along j
            for (int k = 0; k < A; ++k) T::template in<L>(Q + k * L, A * L, R + k * L, A * L);  // along i
            float* v = V + c * blk.ld + j0;
            for (int xi = 0; xi < N; ++xi) {
                float* d = v + xi * g.C * blk.ld;
#pragma GCC ivdep
                for (int l = 0; l < L; ++l) d[l] = R[xi * L + l];  // whole vector: ld has room past nt
            }
        }
    }
}

// y from Z[xi][r][j] (row stride blk.ld, g.M rows) for the block's tiles:
// + bias[r], ReLU, pixels past OH, OW not written.
template <class T, int L>
void output_t(const Conv& g, const float* Z, const Block& blk, const float* bias, bool relu, float* y) {
    constexpr int A = T::a, N = A * A, m = T::m;
    const i64 TH = cdiv_(g.OH, m), TW = cdiv_(g.OW, m), P2 = g.OH * g.OW;
    alignas(64) float P[N * L], Q[A * m * L], R[m * m * L];
    i64 base[L], h0[L], w0[L];
    for (i64 j0 = 0; j0 < blk.nt; j0 += L) {
        const int nl = decode<L>(g, m, blk.t0 + j0, blk.nt - j0, TH, TW, g.M, base, h0, w0, 0, 0, P2);
        for (i64 r = 0; r < g.M; ++r) {
            const float* z = Z + r * blk.ld + j0;
            for (int xi = 0; xi < N; ++xi) {
                const float* s = z + xi * g.M * blk.ld;
#pragma GCC ivdep
                for (int l = 0; l < L; ++l) P[xi * L + l] = s[l];
            }
            for (int i = 0; i < A; ++i) T::template out<L>(P + i * A * L, L, Q + i * m * L, L);  // along j
            for (int k = 0; k < m; ++k) T::template out<L>(Q + k * L, m * L, R + k * L, m * L);  // along i
            const float bv = bias ? bias[r] : 0.f;
#pragma GCC ivdep
            for (int e = 0; e < m * m * L; ++e) {
                const float v = R[e] + bv;
                R[e] = relu && !(v > 0.f) ? 0.f : v;  // max(v, 0) as the implicit path's write-back does
            }
            for (int l = 0; l < nl; ++l) {
                float* d = y + base[l] + r * P2 + h0[l] * g.OW + w0[l];
                const i64 hn = g.OH - h0[l] < m ? g.OH - h0[l] : m, wn = g.OW - w0[l] < m ? g.OW - w0[l] : m;
                if (hn == m && wn == m) {  // a whole tile: fixed loops the compiler unrolls
                    for (int i = 0; i < m; ++i)
                        for (int j = 0; j < m; ++j) d[i * g.OW + j] = R[(i * m + j) * L + l];
                } else {
                    for (i64 i = 0; i < hn; ++i)
                        for (i64 j = 0; j < wn; ++j) d[i * g.OW + j] = R[(i * m + j) * L + l];
                }
            }
        }
    }
}

template <int L>
void filter_k(int m, const Conv& g, const float* w, bool flipped, float* U, i64 r0, i64 r1) {
    m == 2 ? filter_t<F23, L>(g, w, flipped, U, r0, r1) : filter_t<F43, L>(g, w, flipped, U, r0, r1);
}
template <int L>
void input_k(int m, const Conv& g, const float* x, const Block& b, float* V) {
    m == 2 ? input_t<F23, L>(g, x, b, V) : input_t<F43, L>(g, x, b, V);
}
template <int L>
void output_k(int m, const Conv& g, const float* Z, const Block& b, const float* bias, bool relu, float* y) {
    m == 2 ? output_t<F23, L>(g, Z, b, bias, relu, y) : output_t<F43, L>(g, Z, b, bias, relu, y);
}

}  // namespace

// kernels_<name>(): this unit's transforms at L lanes.
#define SPRINT_WINOGRAD_KERNELS(name, L)                                                   \
    namespace sprint {                                                                     \
    namespace winograd {                                                                   \
    namespace detail {                                                                     \
    const Kernels& kernels_##name() {                                                      \
        static const Kernels k{&filter_k<L>, &input_k<L>, &output_k<L>, L};                \
        return k;                                                                          \
    }                                                                                      \
    }                                                                                      \
    }                                                                                      \
    }
