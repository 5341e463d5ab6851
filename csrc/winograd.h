// Winograd convolution F(m x m, 3 x 3) for 3x3 stride-1 layers (Lavin & Gray
// 2015), on the engine's own SGEMM (gemm.h). m = 4 (6 x 6 input tiles, 36
// GEMMs, 4x fewer multiplies than the direct convolution) or m = 2 (4 x 4
// tiles, 16 GEMMs, 2.25x fewer, a smaller fp32 error).
//
//   U[xi] (M x C)  = (G g G^T)[xi]        filter transform, all (m, c) once per call
//   V[xi] (C x T)  = (B^T d B)[xi]        input transform of the T tiles' patches
//   Z[xi] (M x T)  = U[xi] @ V[xi]        one SGEMM per tile position xi
//   y tile         = A^T Z A (+ bias, ReLU)  output transform, written to NCHW
//
// Tiles: the (B, ceil(OH/m), ceil(OW/m)) output tiles; the patches are read
// straight from the NCHW image, the padding (and the image's edge past the
// last partial tile) by predicate, and output pixels past OH, OW are not
// written. Each OpenMP thread takes blocks of `tb` tiles and runs all of it
// on its own block (transforms and the per-position SGEMMs, single-threaded
// inside): the block's V and Z stay in the thread's cache, no barrier
// between the steps, and the workspace is U plus a fixed block per thread
// whatever the batch.
//
// dX of a stride-1 convolution is the convolution of dy with the flipped,
// channel-transposed filter padded by 2 - p: conv_backward_x runs it with
// the filter transform reading w that way (no flipped copy).
//
// The transforms are written once over a lane count (winograd_simd.h) and
// compiled per ISA like the GEMM's micro-kernels (winograd_avx512.cpp,
// winograd_avx2.cpp, winograd_generic.cpp), the same Isa selecting both.
#pragma once

#include "gemm.h"

namespace sprint {
namespace winograd {

using gemm::i64;
using gemm::Isa;
using gemm::Conv;

// Whether layer g is one Winograd serves: a 3x3 window at stride 1, pads of
// 0 to 2 (so that dX's convolution, padded by 2 - p, is one too), m in {2, 4}.
bool serves(const Conv& g, int m);

// Floats of workspace conv_forward / conv_backward_x need for g with the
// running OpenMP thread count (U, then one tile block per thread);
// 0 when g is not served or the sizes overflow.
i64 workspace_floats(const Conv& g, int m);

// y (B, M, OH, OW) = conv(x, w) [+ bias] [ReLU]; ws: workspace_floats(g, m)
// floats (any contents). Returns nullptr or an error message.
const char* conv_forward(Isa isa, int m, const Conv& g, const float* x, const float* w, const float* bias,
                         bool relu, float* y, float* ws, i64 ws_floats);

// dx (B, C, H, W) of the layer g (stride 1) from dy (B, M, OH, OW) and w
// (M, C, 3, 3); ws: workspace_floats of the transposed convolution, which
// dx_workspace_floats gives.
const char* conv_backward_x(Isa isa, int m, const Conv& g, const float* w, const float* dy, float* dx, float* ws,
                            i64 ws_floats);
i64 dx_workspace_floats(const Conv& g, int m);

namespace detail {

// Per-ISA transforms (winograd_simd.h). Tile block of nt tiles, tile t at
// image b, tile row th, tile column tw (tiles numbered t0.. in (b, th, tw)
// order, TH x TW per image).
struct Block {
    i64 t0, nt, ld;  // first tile, tiles, row stride of V and Z rows (>= nt)
};
struct Kernels {
    // U[xi][r][c] (rows x cols, xi < a*a) from w: forward rows = M, cols = C,
    // g = w[r][c]; flipped (dX) rows = C, cols = M, g[i][j] = w[c][r][2-i][2-j].
    void (*filter)(int m, const Conv& g, const float* w, bool flipped, float* U, i64 r0, i64 r1);
    // V[xi][c][0..nt) of block b from x (C = g.C channels).
    void (*input)(int m, const Conv& g, const float* x, const Block& b, float* V);
    // y of block b from Z[xi][r][0..nt) (g.M rows), + bias, ReLU.
    void (*output)(int m, const Conv& g, const float* Z, const Block& b, const float* bias, bool relu, float* y);
    int lanes;  // tiles (filters) per vector
};
const Kernels& kernels_generic();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();

}  // namespace detail
}  // namespace winograd
}  // namespace sprint
