// CPU im2col family (OpenMP). Layout, shared with kernels/im2col.cu:
//   x     (B, C, H, W)                    NCHW images
//   cols  (K, B*P), K = C*kh*kw, P = OH*OW; row k = (c*kh + i)*kw + j,
//         column n*P + oh*OW + ow   -- the "K x (x^2 N)" matrix of SPEC §2,
//         so W (M,K) @ cols gives Y in (M, B, P) ("CNHW") order.
// All index arithmetic is int64.
#pragma once

#include <cstdint>

#include "sizes.h"

namespace sprint {

using i64 = std::int64_t;

struct ConvGeom {
    i64 B, C, H, W;   // input batch/channels/height/width
    i64 kh, kw;       // kernel
    i64 sh, sw;       // stride
    i64 ph, pw;       // zero padding
    i64 OH, OW;       // output size (derived)
    i64 K() const { return C * kh * kw; }
    i64 P() const { return OH * OW; }
};

// Fills OH/OW; returns nullptr if the geometry is valid, else a message that
// names the offending argument. Every size derived later (K, P, B*P, K*B*P,
// B*C*H*W) is checked here, so callers may multiply them freely.
inline const char* conv_geom_check(ConvGeom& g) {
    if (g.kh < 1 || g.kw < 1 || g.kh > kMaxDim || g.kw > kMaxDim) return "kernel size (kh, kw) must be in [1, 2^31]";
    if (g.sh < 1 || g.sw < 1 || g.sh > kMaxDim || g.sw > kMaxDim) return "stride must be in [1, 2^31]";
    if (g.ph < 0 || g.pw < 0 || g.ph > kMaxDim || g.pw > kMaxDim) return "pad must be in [0, 2^31]";
    if (g.B < 0 || g.C < 1 || g.H < 1 || g.W < 1) return "x must have C, H, W >= 1";
    if (g.B > kMaxElems || g.C > kMaxElems || g.H > kMaxElems || g.W > kMaxElems) return "x is too large";
    if (g.H + 2 * g.ph < g.kh || g.W + 2 * g.pw < g.kw) return "kernel larger than the padded input";
    g.OH = (g.H + 2 * g.ph - g.kh) / g.sh + 1;
    g.OW = (g.W + 2 * g.pw - g.kw) / g.sw + 1;
    const i64 K = size_product({g.C, g.kh, g.kw}), P = size_product({g.OH, g.OW});
    if (K < 0) return "C*kh*kw (rows of cols) is too large";
    if (P < 0) return "output size OH*OW is too large";
    if (size_product({K, g.B, P}) < 0) return "cols (C*kh*kw x B*OH*OW) is too large";
    if (size_product({g.B, g.C, g.H, g.W}) < 0) return "x is too large";
    return nullptr;
}

namespace cpu {

// cols (K, B*P) <- x (B, C, H, W); zero where the window hits padding.
void im2col(const float* x, float* cols, const ConvGeom& g);

// x (B, C, H, W) = adjoint of im2col applied to cols (K, B*P). A gather: each
// x element sums its contributions in a fixed order; no atomics, deterministic.
void col2im(const float* cols, float* x, const ConvGeom& g);

// y (B, M, P) = yt (M, B*P) transposed, plus bias[m] (bias may be null).
void cnhw_to_nchw(const float* yt, const float* bias, float* y, i64 B, i64 M, i64 P);

// out (M, B*P) = y (B, M, P) transposed. If db is not null also
// db[m] (+)= sum over (n, p) of y[n, m, p] (accumulate: add to db).
void nchw_to_cnhw(const float* y, float* out, float* db, bool accumulate, i64 B, i64 M, i64 P);

// db[m] (+)= sum over (n, p) of y[n, m, p] (bias gradient): each sample summed,
// then added onto db one by one in order (micro-batches chain exactly).
void channel_sum(const float* y, float* db, bool accumulate, i64 B, i64 M, i64 P);

// y[n, m, p] += bias[m], in place.
void add_channel_bias(float* y, const float* bias, i64 B, i64 M, i64 P);

}  // namespace cpu
}  // namespace sprint
