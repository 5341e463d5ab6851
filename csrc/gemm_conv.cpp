// The convolutions on the engine's SGEMM (csrc/gemm.h), portable half: size
// checks, plans, scratch, and which kernel runs dW -- a table (kBackwardW),
// the first row that serves the geometry runs. The kernels are
// gemm_conv_pack.h, gemm_dw.h and gemm_conv_small.h, per ISA.
#include <omp.h>

#include <cstring>
#include <iterator>
#include <limits>

#include "gemm.h"
#include "gemm_portable.h"

namespace sprint {
namespace gemm {

using detail::allocate;
using detail::blocking_cached;
using detail::cdiv;
using detail::clamp;
using detail::kAlloc;
using detail::Kernels;
using detail::kernels;
using detail::mul_ok;
using detail::Plan;
using detail::plan;
using detail::Scratch;
using detail::t_arena;
using detail::TrimScratch;

namespace {
bool conv_sizes_ok(const Conv& g) {
    i64 t = 0;
    return mul_ok(g.B, g.C, t) && mul_ok(t, g.H, t) && mul_ok(t, g.W, t) && mul_ok(g.B, g.M, t) &&
           mul_ok(t, g.P(), t) && mul_ok(g.M, g.K(), t) && g.OH > 0 && g.OW > 0;
}

// Plans a convolution's GEMM (m x n, depth k), takes the scratch, then runs
// f(kernels, plan) on them. The packings read x as it is: padding is masked
// off inside them (a zero-bordered copy of x cost as much as it saved).
template <class F>
const char* run_conv(Isa isa, const Conv& g, i64 m, i64 n, i64 k, F f) {
    const Kernels& kr = kernels(isa);
    Plan p = plan(kr, blocking_cached(isa), m, n, k);
    TrimScratch trim;
    if (!allocate(p, t_arena)) return kAlloc;
    f(kr, p);
    return nullptr;
}

// dW's grid (gemm_dw.h): the fewest per-thread tap-kernel FMA cycles plus
// the dy^T panels each thread packs (every thread packs its channels' panels
// for all pixels).
detail::DwPlan dw_plan(const Kernels& kr, const Blocking& bl, i64 K, i64 M, i64 BP) {
    detail::DwPlan best{};
    // Pixels per k block. The tap kernel reads NR floats of the dy^T panel per
    // pixel (256 bytes per 24 FMAs on AVX-512, a third more than the 8 x 48
    // GEMM kernel): streamed from L2 (KC 768) the bare kernel ran at 80 % of
    // the FMA peak on cifar's shapes, from L1 (128 pixels) at 91-92 %. But
    // every k block moves all of dW^T's tiles in and out: where dW^T is larger
    // than L1 that cost more than it saved (cifar conv3-conv6 dW 1.12-1.18x
    // slower at 128), where it fits (conv1: 27 x 64) the panel in 2/3 of L1
    // won (0.80x).
    // Where dW^T outgrows an eighth of L2 the panel takes a third of L2 (2728
    // pixels here) instead of the GEMM's KC (768): fewer k blocks, so fewer
    // passes of dW^T's tiles through the registers (each a tile load and
    // store at a stride of M floats, from L3 once dW^T outgrows L2: cifar
    // conv6's is 2.4 MB), while the panel streams from L2 as before. cifar
    // conv3-conv6 and cnn-a's conv2-conv6 dW: 2-5 points of the FMA peak
    // higher; cifar conv2 (dW^T 147 KB) gained nothing, and keeps its smaller
    // panel (its padded x sizes the dW scratch of the cifar step).
#ifndef SPRINT_DW_KC_L2_DIV  // overridable at build time, for measuring other panels
#define SPRINT_DW_KC_L2_DIV 3
#endif
    const bool small = K * M * 4 <= bl.l1d;
    const i64 big = clamp(bl.l2 / SPRINT_DW_KC_L2_DIV / (i64(kr.dw_nr) * 4) / 8 * 8, bl.kc, 4096);
    const i64 kc = small ? clamp(bl.l1d * 2 / 3 / (i64(kr.dw_nr) * 4) / 8 * 8, 32, bl.kc)
                   : K * M * 4 > bl.l2 / 8 ? clamp(cdiv(BP, 8) * 8, bl.kc, big)  // no larger than the pixels need
                                           : bl.kc;
    const double work = double(K) * double(M) * double(BP) / kr.lanes;
    const int nth = work < 1.0e5 ? 1 : omp_get_max_threads();
    double best_cost = std::numeric_limits<double>::infinity();
    for (int tm = 1; tm <= nth; ++tm) {
        if (nth % tm) continue;
        const int tn = nth / tm;
        // Channels per thread in whole registers, not whole panels: cifar conv1's
        // 64 channels split 32 + 32 (each thread packing only its own dy^T
        // columns) instead of its 27 taps 18 + 9 on 6-tap tiles (3 tiles to 2).
        // Each tile pass also pays its MR broadcasts per pixel, weighed as MR
        // registers of FMAs, so a narrow tile costs more per FMA: two 6 x 32
        // tiles measured 1.16x slower than one 6 x 64 on cifar conv2.
        const i64 mq = cdiv(cdiv(K, kr.dw_mr), tm) * kr.dw_mr, nq = cdiv(cdiv(M, kr.dw_l), tn) * kr.dw_l;
        const i64 panels = cdiv(nq, kr.dw_nr);
        const double fma = double(mq) * double(nq + panels * kr.dw_l) * double(BP) / kr.lanes;
        const double cost = fma + double(BP) * double(nq);
        if (cost < best_cost) {
            best_cost = cost;
            best = detail::DwPlan{};  // the buffers and image: set by dw_taps
            best.nth = nth, best.tm = tm, best.tn = tn, best.mq = mq, best.nq = nq, best.kc = kc;
        }
    }
    best.buf_floats = cdiv(best.kc * kr.dw_nr + 2 * best.kc, 16) * 16;
    return best;
}

thread_local Scratch t_dw_arena;  // dW's padded image and dW^T (kept apart from the GEMM plans' scratch)

// Tap (c, i, j)'s offset in a padded image of Hp x Wp planes: c*Hp*Wp + i*Wp + j.
void tap_offsets(const Conv& g, i64 Hp, i64 Wp, i64* toff) {
    const i64 khw = g.kh * g.kw;
    for (i64 t = 0; t < g.K(); ++t) toff[t] = t / khw * Hp * Wp + t % khw / g.kw * Wp + t % g.kw;
}

// The packed implicit GEMM (gemm_conv_pack.h) for every forward. A direct
// kernel for small K (the padded image read in place through the
// micro-kernel's row pointers, no packing) was tried for cifar conv1 and
// dropped: 0.89x the time on one thread, no gain on two, where the 8 MiB
// write of y, not the packing, bounds it (bench/RESULTS.md, issue 14).

// dW in vector lanes over the output rows (gemm_conv_small.h) where K is at
// most this: the tap kernel packs dy^T for every pixel by register transposes,
// which cost it a third of cifar conv1's dW (K = 27).
constexpr i64 kSmallK = 64;

// ---- dW --------------------------------------------------------------------------
// dW on the tap kernel (gemm_dw.h): any geometry.
const char* dw_taps(Isa isa, const Conv& g, const float* x, const float* dy, float* dw, bool accumulate,
                    float* db) {
    const Kernels& kr = kernels(isa);
    const i64 K = g.K(), M = g.M;
    detail::DwPlan p = dw_plan(kr, blocking_cached(isa), K, M, g.B * g.P());
    p.Hp = g.H + 2 * g.ph;
    p.Wp = g.W + 2 * g.pw;
    const bool padded = g.ph > 0 || g.pw > 0;
    i64 bufs = 0, dwt = 0, xpn = 0, total = 0;
    if (!mul_ok(p.buf_floats, p.nth, bufs) || !mul_ok(K, M, dwt) || !mul_ok(g.B * g.C, p.Hp * p.Wp, xpn))
        return "conv: sizes overflow";
    if (!padded) xpn = 0;
    total = bufs + cdiv(2 * K, 16) * 16 + cdiv(dwt, 16) * 16 + xpn;
    TrimScratch trim{t_dw_arena};
    float* base = t_dw_arena.try_aligned(total);
    if (!base) return kAlloc;
    p.bufs = base;
    i64* toff = reinterpret_cast<i64*>(base + bufs);
    p.toff = toff;
    p.dwt = base + bufs + cdiv(2 * K, 16) * 16;
    float* xp = p.dwt + cdiv(dwt, 16) * 16;
    p.xp = padded ? xp : x;
    tap_offsets(g, p.Hp, p.Wp, toff);
    p.x = x;
    p.pad_to = padded ? xp : nullptr;  // padded by the kernel's threads
    kr.conv_dw(p, g, dy, dw, accumulate, db);
    return nullptr;
}

// dW in vector lanes over each output row (gemm_conv_small.h): small K, unit
// stride along the rows, and rows at least one register wide.
bool lanes_serve(const Kernels& kr, const Blocking&, const Conv& g) {
    return g.sw == 1 && g.K() <= kSmallK && g.OW >= kr.lanes_l;
}

const char* dw_lanes(Isa isa, const Conv& g, const float* x, const float* dy, float* dw, bool accumulate,
                     float* db) {
    const Kernels& kr = kernels(isa);
    detail::SmallPlan p{};
    p.Hp = g.H + 2 * g.ph;
    // rows of whole 64-byte lines: a 3 x 3's taps with j = 0 are aligned loads
    // (a batch-1 cifar conv1 dW took 0.83x the time of unaligned rows)
    p.Wp = cdiv(g.W + 2 * g.pw, 16) * 16;
    const i64 K = g.K(), mblocks = cdiv(g.M, 3);  // blocks of at most 3 channels (any ISA's MB): none idle
    const double work = double(g.M) * double(g.B * g.P()) * double(K) / kr.lanes;
    p.nth = work < 1.0e5 ? 1 : int(std::min<i64>(omp_get_max_threads(), mblocks));
    i64 xpn = 0;  // always a copy, for the aligned rows
    if (!mul_ok(g.B * g.C, p.Hp * p.Wp, xpn)) return "conv: sizes overflow";
    const i64 toffs = cdiv(2 * K, 16) * 16;
    TrimScratch trim{t_dw_arena};
    float* base = t_dw_arena.try_aligned(toffs + xpn);
    if (!base) return kAlloc;
    i64* toff = reinterpret_cast<i64*>(base);
    tap_offsets(g, p.Hp, p.Wp, toff);
    p.toff = toff;
    p.xp = p.pad_to = base + toffs;  // padded by the kernel's threads
    p.x = x;
    kr.conv_dw_lanes(p, g, dy, dw, accumulate, db);
    return nullptr;
}

bool any_geometry(const Kernels&, const Blocking&, const Conv&) { return true; }

struct BackwardWRow {
    const char* name;
    bool (*serves)(const Kernels&, const Blocking&, const Conv&);
    const char* (*run)(Isa, const Conv&, const float* x, const float* dy, float* dw, bool accumulate, float* db);
};
const BackwardWRow kBackwardW[] = {{"lanes", lanes_serve, dw_lanes}, {"taps", any_geometry, dw_taps}};

const BackwardWRow& pick_dw(Isa isa, const Conv& g) {
    for (const BackwardWRow& r : kBackwardW)
        if (r.serves(kernels(isa), blocking_cached(isa), g)) return r;
    return kBackwardW[std::size(kBackwardW) - 1];
}
}  // namespace

const char* conv_backward_w_kernel(Isa isa, const Conv& g) { return pick_dw(isa, g).name; }

const char* conv_forward(Isa isa, const Conv& g, const float* x, const float* w, const float* bias, bool relu,
                         float* y) {
    if (!conv_sizes_ok(g)) return "conv: sizes overflow";
    if (g.B == 0) return nullptr;
    return run_conv(isa, g, g.M, g.B * g.P(), g.K(), [&](const Kernels& kr, const Plan& p) {
        kr.conv_fwd(p, g, x, w, bias, relu, y);
    });
}

const char* conv_backward_w(Isa isa, const Conv& g, const float* x, const float* dy, float* dw, bool accumulate,
                            float* db) {
    if (!conv_sizes_ok(g)) return "conv: sizes overflow";
    if (g.B == 0) {
        if (!accumulate) {
            for (i64 i = 0; i < g.M * g.K(); ++i) dw[i] = 0.f;
            for (i64 i = 0; db && i < g.M; ++i) db[i] = 0.f;
        }
        return nullptr;
    }
    return pick_dw(isa, g).run(isa, g, x, dy, dw, accumulate, db);
}

const char* conv_backward_x(Isa isa, const Conv& g, const float* w, const float* dy, float* dx) {
    if (g.sh != 1 || g.sw != 1) return "conv: the implicit dX needs stride 1";
    if (!conv_sizes_ok(g)) return "conv: sizes overflow";
    if (g.B == 0) return nullptr;
    // dx[c, h, w] = sum_{m,i,j} dy[m, h+ph-i, w+pw-j] w[m,c,i,j]: a stride-1
    // convolution of dy (M channels) with wt[c,m,i',j'] = w[m,c,kh-1-i',kw-1-j'].
    const Conv t{g.B, g.M, g.OH, g.OW, g.C, g.kh, g.kw, 1, 1, g.kh - 1 - g.ph, g.kw - 1 - g.pw, g.H, g.W};
    // The flipped filters are read from w by the A packing (gemm_conv_pack.h).
    return run_conv(isa, t, t.M, t.B * t.P(), t.K(), [&](const Kernels& kr, const Plan& p) {
        kr.conv_dx(p, t, dy, w, dx);
    });
}


}  // namespace gemm
}  // namespace sprint
