// Internal: what gemm.cpp (portable code) hands the per-ISA translation units
// (gemm_generic.cpp, gemm_avx2.cpp, gemm_avx512.cpp). Plain data only: the
// ISA units use no standard-library code that the linker could merge with a
// portable copy (an AVX-512 instance of a shared inline function must never
// serve a caller on a CPU without AVX-512).
#pragma once

#include "gemm.h"

namespace sprint {
namespace gemm {
namespace detail {

// How one GEMM is cut over threads and where each thread packs. Thread t
// (0 <= t < nth) owns grid cell (im, in) with t = im*tn + in: rows
// [im*mq, ...), columns [in*nq, ...) (clipped), and all of k.
struct Plan {
    int nth, tm, tn;
    i64 mq, nq;           // rows / columns per thread (mq a multiple of MR, nq of NR)
    i64 mc, kc, nc;       // cache blocks
    bool one_b_panel;     // mq <= mc: each B panel serves one row block, so one panel buffer suffices
    float* arena;         // per thread: abuf (a_floats) then bbuf (b_floats), 64-byte aligned;
    i64 a_floats, b_floats;  // bbuf: packed B panels (b_packed floats), then one row pointer per
    i64 b_packed;            // (panel, k) -- the micro-kernel reads B rows through these
};

// dW computed as its transpose (gemm_dw.h): dW^T (K taps x M channels) =
// im2col(x) @ dy^T, thread t owning taps [im*mq, ...) x channels [in*nq, ...).
struct DwPlan {
    int nth, tm, tn;
    i64 mq, nq;           // taps / channels per thread (multiples of the kernel's MR / NR)
    i64 kc;               // pixels per k block
    float* bufs;          // per thread (buf_floats): the dy^T panel (kc x NR), then kc pixel pointers
    i64 buf_floats;
    const i64* toff;      // per tap (c, i, j): c*Hp*Wp + i*Wp + j
    float* dwt;           // K x M: dW^T's running sums between k blocks
    const float* xp;      // x zero-padded by (ph, pw) to Hp x Wp (x itself when unpadded)
    i64 Hp, Wp;
    const float* x;       // when pad_to is not null: padded into it (= xp) by the kernel's threads
    float* pad_to;
};

// dW of a small-K convolution (gemm_conv_small.h): x zero-padded by (ph, pw)
// into Hp x Wp planes (by the kernel's threads, into pad_to), taps at toff.
struct SmallPlan {
    int nth;
    const float* xp;      // the padded image (= pad_to)
    i64 Hp, Wp;
    const i64* toff;      // per tap (c, i, j): c*Hp*Wp + i*Wp + j
    const float* x;
    float* pad_to;
};

// Time profile of the GEMMs (off unless set_profiling(true)): seconds per
// OpenMP thread spent packing and in the micro-kernel loops (micro-kernel +
// tile write-back), summed over calls. Each thread writes its own slot.
constexpr int kProfSlots = 256;
struct alignas(64) ProfSlot {
    double pack, kernel;
};
extern bool g_profiling;
extern ProfSlot g_prof[kProfSlots];

struct Kernels {
    int mr, nr;
    int lanes;  // FMA lanes per cycle per core (planning weight)
    // Runs `iters` iterations of 12 independent FMA chains on each of
    // `threads` threads; returns the floating-point operations executed.
    double (*fma_peak)(i64 iters, int threads);
    void (*sgemm)(const Plan&, bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const float* A, i64 lda,
                  const float* B, i64 ldb, float beta, float* C, i64 ldc);
    void (*conv_fwd)(const Plan&, const Conv&, const float* x, const float* w, const float* bias, bool relu,
                     float* y);
    int dw_mr, dw_nr;  // dW's tap kernel
    int dw_l;          // its register width: a thread's channels are a multiple of it
    void (*conv_dw)(const DwPlan&, const Conv&, const float* dy, float* dw, bool accumulate, float* db);
    // dX as the forward convolution t of dy with w flipped and transposed (w as
    // the layer holds it, read so by the packing)
    void (*conv_dx)(const Plan&, const Conv& t, const float* dy, const float* w, float* dx);
    // dW of a small K (gemm_conv_small.h); lanes_l: LaneKernel's vector width
    void (*conv_dw_lanes)(const SmallPlan&, const Conv&, const float* dy, float* dw, bool accumulate, float* db);
    int lanes_l;
    // its block: lanes_mb channels x lanes_tb taps, spare rows and taps computed
    // and dropped (the performance model prices the padded block, engine/perf)
    int lanes_mb, lanes_tb;
};

const Kernels& kernels_generic();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();

}  // namespace detail
}  // namespace gemm
}  // namespace sprint

// kernels_<name>() = the generic kernels, for an ISA unit built on a target
// without that ISA.
#define SPRINT_GEMM_FALLBACK(name)                                        \
    namespace sprint {                                                    \
    namespace gemm {                                                      \
    namespace detail {                                                    \
    const Kernels& kernels_##name() { return kernels_generic(); }         \
    }                                                                     \
    }                                                                     \
    }
