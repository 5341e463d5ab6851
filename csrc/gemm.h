// The engine's own SGEMM (BLIS-style) and the implicit-GEMM convolution built
// on it. Row-major throughout; all sizes int64.
//
// Blocking (the five loops of BLIS, csrc/gemm_driver.h):
//   jc over n in NC columns      B block KC x NC packed into NR-wide panels,
//    pc over k in KC             each just before its first use
//     ic over m in MC rows       A block MC x KC packed into MR-high panels
//      jr over NR panels         (sized for the L2)
//       ir over MR panels        micro-kernel: MR x NR tile of C in registers,
//                                 the KC x NR B micro-panel stays in L1/L2
// KC = L2/12 / (NR*4) (at most 768), MC = L2/2 / (KC*4), NC = 4096 (rounded to MR/NR),
// read from the running CPU's caches (sysconf, then /sys) at first use;
// SPRINT_GEMM_BLOCKING=kc,mc,nc overrides them (for measuring others). When
// a thread's rows fit one MC block (the conv GEMMs: M = channels), B panels
// are used once and share one panel buffer that never leaves L1.
//
// Threads: C is cut into a tm x tn grid; every thread runs the five loops on
// its own part with private packing buffers allocated before the parallel
// region, so no barrier sits inside a GEMM. The grid minimises per-thread
// micro-tiles plus redundant packing (gemm.cpp, plan()).
//
// Determinism: each element of C is one chain of FMAs over k in order,
// started from 0 or beta*C (alpha is folded into A), whatever m, n, the
// blocking, the tile and the thread grid. So a row of a forward pass is the
// same in a micro-batch as in the whole batch, and beta = 1 continues C's
// chains: gradients summed micro-batch by micro-batch equal the whole
// batch's bit for bit (a ReLU flipped by a rounding difference would
// otherwise make pipelined and single-process training drift apart).
//
// ISA: micro-kernels for AVX-512 (8 x 48; dW's tap kernel 6 x 64, its small-K
// lane kernel 3 channels x 9 taps), AVX2+FMA (4 x 24; 6 x 16; 2 x 6) and
// portable C++ (4 x 16; 4 x 16; 2 x 4), one template (gemm_simd.h) instantiated in a translation unit per
// ISA compiled with its own -m flags; the running CPU's features pick one,
// SPRINT_CPU_ISA=avx512|avx2|generic forces one (an ISA the CPU lacks is an
// error, never a crash).
// Edge panels of at most NR - L columns run on the same template one vector
// per row narrower (8 x 32 on AVX-512; same chains, same bits).
#pragma once

#include <cstdint>
#include <string>

namespace sprint {
namespace gemm {

using i64 = std::int64_t;

enum class Isa { generic = 0, avx2 = 1, avx512 = 2 };

const char* isa_name(Isa isa);
bool isa_supported(Isa isa);
// The ISA to use: `request` ("" = $SPRINT_CPU_ISA, then the best supported).
// Returns false and sets `err` for an unknown or unsupported name.
bool isa_select(const std::string& request, Isa& out, std::string& err);

struct Blocking {
    int mr, nr;
    i64 mc, kc, nc;
    i64 l1d, l2;  // bytes, as read from the CPU
};
Blocking blocking(Isa isa);

// The convolution kernels' register tiles (gemm_conv.cpp): dW's tap kernel
// (dw_mr taps x dw_nr channels, threads' channels in multiples of dw_l) and
// the small-K lane kernel (lanes_mb channels x lanes_tb taps, lanes_l output
// pixels of a row per vector, a row's remainder one masked vector). The
// performance model prices the padded tiles (engine/perf/conv_tiles.py).
struct ConvTiles {
    int dw_mr, dw_nr, dw_l, lanes_l, lanes_mb, lanes_tb;
};
ConvTiles conv_tiles(Isa isa);

// C (m x n, ldc) = beta * C + (alpha op(A)) @ op(B); op(X) = X^T if trans.
// A is m x k (lda) or, transposed, k x m; B is k x n (ldb) or n x k.
// beta == 0 overwrites C (NaN in C does not propagate); k == 0 gives beta*C.
// Returns nullptr or an error message (size overflow, allocation failure).
const char* sgemm(Isa isa, bool trans_a, bool trans_b, i64 m, i64 n, i64 k, float alpha, const float* A,
                  i64 lda, const float* B, i64 ldb, float beta, float* C, i64 ldc);

// Measured peak: 12 independent FMA chains per thread for `iters` iterations
// on `threads` threads; returns the flops executed (the caller times it).
double fma_peak(Isa isa, i64 iters, int threads);

// Time profile of every GEMM (and implicit convolution) while on: seconds
// summed over threads spent packing panels and in the micro-kernel loops
// (micro-kernel + tile write-back). profile_take returns and clears them.
void set_profiling(bool on);
void profile_take(double& pack_s, double& kernel_s);

// Geometry of an implicit-GEMM convolution. Pads may be negative (the
// transposed convolution used for dX pads by kh-1-ph).
struct Conv {
    i64 B, C, H, W;   // input
    i64 M;            // output channels
    i64 kh, kw, sh, sw, ph, pw;
    i64 OH, OW;
    i64 K() const { return C * kh * kw; }
    i64 P() const { return OH * OW; }
};

// The kernel conv_backward_w runs for g (gemm_conv.cpp's table): "lanes"
// (small K: gemm_conv_small.h) or "taps" (gemm_dw.h).
const char* conv_backward_w_kernel(Isa isa, const Conv& g);

// y (B, M, OH, OW) = W (M, C*kh*kw) @ im2col(x) [+ bias[m]] [ReLU], the
// column matrix formed only inside the B-panel packing. bias may be null.
const char* conv_forward(Isa isa, const Conv& g, const float* x, const float* w, const float* bias,
                         bool relu, float* y);

// dw (M, K) = dy (B, M, P) @ im2col(x)^T, overwritten or (accumulate) added
// by continuing dw's chains, k = (image, pixel) in order: calls on
// consecutive micro-batches give the whole batch's dw bit for bit. For small
// K (unit stride along the rows) the chain runs over the images, each adding
// its own sum taken in vector lanes (gemm_conv_small.h); otherwise computed
// as dW^T = im2col(x) @ dy^T on a tap kernel that reads the taps from x
// (zero-padded into scratch when the layer pads: B*C*(H+2ph)*(W+2pw) floats
// kept per calling thread, like the packing buffers) -- gemm_dw.h.
// db (M), when not null, gets dy's channel sums the same way (overwritten or
// continued; each one chain of adds over (image, pixel) in order), taken from
// dW's packed dy^T panels instead of a separate pass over dy.
const char* conv_backward_w(Isa isa, const Conv& g, const float* x, const float* dy, float* dw, bool accumulate,
                            float* db = nullptr);

// dx (B, C, H, W) = col2im(W^T @ dy), for stride 1 computed as the forward
// convolution of dy with the flipped, transposed filters (pad kh-1-ph):
// no column matrix, no scatter. Returns an error for stride > 1.
const char* conv_backward_x(Isa isa, const Conv& g, const float* w, const float* dy, float* dx);

}  // namespace gemm
}  // namespace sprint
