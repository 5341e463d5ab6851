// Portable half of the SGEMM (csrc/gemm.h): ISA choice, cache sizes, the
// thread plan, scratch allocation (outside every parallel region), size
// checks, and the dX-as-convolution rewrite. The loops themselves live in
// gemm_driver.h, instantiated by the per-ISA units.
#include "gemm.h"

#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <new>

#include "gemm_plan.h"

namespace sprint {
namespace gemm {
namespace detail {
bool g_profiling = false;
ProfSlot g_prof[kProfSlots];
}  // namespace detail

using detail::Kernels;
using detail::Plan;

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::avx512: return "avx512";
        case Isa::avx2: return "avx2";
        default: return "generic";
    }
}

bool isa_supported(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    // libgcc's checks include the OS's XSAVE state for the AVX/AVX-512 registers.
    switch (isa) {
        case Isa::avx512: return __builtin_cpu_supports("avx512f");
        case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        default: return true;
    }
#else
    return isa == Isa::generic;
#endif
}

bool isa_select(const std::string& request, Isa& out, std::string& err) {
    std::string name = request;
    if (name.empty()) {
        const char* env = std::getenv("SPRINT_CPU_ISA");
        name = env ? env : "";
    }
    if (name.empty() || name == "auto") {
        out = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::generic;
        return true;
    }
    for (Isa i : {Isa::avx512, Isa::avx2, Isa::generic}) {
        if (name == isa_name(i)) {
            if (!isa_supported(i)) {
                err = "SPRINT_CPU_ISA=" + name + ": this CPU does not support " + name;
                return false;
            }
            out = i;
            return true;
        }
    }
    err = "SPRINT_CPU_ISA=" + name + ": expected avx512, avx2, generic or auto";
    return false;
}

namespace {

const Kernels& kernels(Isa isa) {
    switch (isa) {
        case Isa::avx512: return detail::kernels_avx512();
        case Isa::avx2: return detail::kernels_avx2();
        default: return detail::kernels_generic();
    }
}

i64 sys_cache_bytes(int level, const char* type) {
    // /sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}: "48K"
    for (int idx = 0; idx < 8; ++idx) {
        const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/";
        std::ifstream fl(dir + "level"), ft(dir + "type"), fs(dir + "size");
        int lv = 0;
        std::string ty, sz;
        if (!(fl >> lv) || !(ft >> ty) || !(fs >> sz)) continue;
        if (lv != level || (ty != type && ty != "Unified")) continue;
        char* end = nullptr;
        const long long v = std::strtoll(sz.c_str(), &end, 10);
        const i64 mult = (end && (*end == 'K' || *end == 'k')) ? 1024 : (end && *end == 'M') ? 1 << 20 : 1;
        if (v > 0) return i64(v) * mult;
    }
    return 0;
}

i64 cache_bytes(int level) {
    long v = 0;
#ifdef _SC_LEVEL1_DCACHE_SIZE
    v = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : _SC_LEVEL2_CACHE_SIZE);
#endif
    if (v > 0) return v;
    const i64 s = sys_cache_bytes(level, level == 1 ? "Data" : "Unified");
    return s > 0 ? s : (level == 1 ? 32 * 1024 : 1 << 20);
}

i64 clamp(i64 v, i64 lo, i64 hi) { return v < lo ? lo : v > hi ? hi : v; }
i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }

constexpr i64 kMaxElems = i64(1) << 40;  // any matrix beyond this is refused before any arithmetic

bool mul_ok(i64 a, i64 b, i64& out) {
    if (a < 0 || b < 0) return false;
    if (b != 0 && a > kMaxElems / b) return false;
    out = a * b;
    return true;
}

// Scratch: packing buffers per OpenMP thread. Kept
// per calling thread and only grown: a fresh allocation per call would pay
// page faults and zero-filling on every GEMM. Nothing reads it unwritten.
struct Scratch {
    std::unique_ptr<float[]> mem;
    i64 cap = 0;
    float* aligned(i64 n) {
        if (n + 16 > cap) {
            mem.reset();
            mem.reset(new float[size_t(n) + 16]);
            cap = n + 16;
        }
        const auto addr = reinterpret_cast<std::uintptr_t>(mem.get());
        return mem.get() + ((64 - addr % 64) % 64) / sizeof(float);
    }
    // aligned(n), or nullptr when the allocation fails (sizes too large)
    float* try_aligned(i64 n) noexcept {
        try {
            return aligned(n);
        } catch (const std::bad_alloc&) {
        } catch (const std::length_error&) {
        }
        return nullptr;
    }
};
thread_local Scratch t_arena;

// Drops a calling thread's scratch after a call that grew it past 64 MiB
// (an odd huge GEMM must not pin its buffers for the life of the thread).
struct TrimScratch {
    Scratch& s = t_arena;
    ~TrimScratch() {
        if (s.cap > (i64(1) << 24)) s.mem.reset(), s.cap = 0;
    }
};

// Picks the thread grid: the fewest per-thread FMA cycles plus packing (B
// once per k block, A once per column block). k is never split: that would
// cut each element's single chain of FMAs (gemm_driver.h).
Plan plan(const Kernels& kr, const Blocking& bl, i64 m, i64 n, i64 k) {
    Plan best{};
    const double work = double(m) * double(n) * double(k) / kr.lanes;
    const int nth = work < 1.0e5 ? 1 : omp_get_max_threads();  // waking a sleeping team costs ~10-40 us
    double best_cost = std::numeric_limits<double>::infinity();
    for (int tm = 1; tm <= nth; ++tm) {
        if (nth % tm) continue;
        const int tn = nth / tm;
        const i64 mq = cdiv(cdiv(m, kr.mr), tm) * kr.mr, nq = cdiv(cdiv(n, kr.nr), tn) * kr.nr;
        const double fma = double(mq) * double(nq) * double(k) / kr.lanes;
        const double pack = double(k) * (double(nq) + double(mq) * double(cdiv(nq, bl.nc)));
        if (fma + pack < best_cost) {
            best_cost = fma + pack;
            best = Plan{nth, tm, tn, mq, nq, bl.mc, bl.kc, bl.nc, mq <= bl.mc, nullptr, 0, 0, 0};
        }
    }
    best.a_floats = cdiv(clamp(best.mq, 1, bl.mc) * bl.kc, 16) * 16 + 16;
    const i64 bcols = best.one_b_panel ? kr.nr : clamp(best.nq, 1, bl.nc);  // a multiple of NR
    best.b_packed = cdiv(bcols * bl.kc, 16) * 16;
    best.b_floats = best.b_packed + 2 * cdiv(bcols, kr.nr) * bl.kc + 16;  // + 8-byte row pointers
    return best;
}

// Allocates the plan's scratch; false on overflow or allocation failure.
bool allocate(Plan& p, Scratch& arena) {
    i64 per = 0, total = 0;
    if (!mul_ok(p.a_floats + p.b_floats, 1, per) || !mul_ok(per, p.nth, total)) return false;
    p.arena = arena.try_aligned(total);
    return p.arena != nullptr;
}

const char* kAlloc = "gemm: scratch allocation failed (sizes too large)";

}  // namespace

double fma_peak(Isa isa, i64 iters, int threads) { return kernels(isa).fma_peak(iters, threads); }

void set_profiling(bool on) { detail::g_profiling = on; }

void profile_take(double& pack_s, double& kernel_s) {
    pack_s = kernel_s = 0;
    for (auto& s : detail::g_prof) {
        pack_s += s.pack;
        kernel_s += s.kernel;
        s.pack = s.kernel = 0;
    }
}

Blocking blocking(Isa isa) {
    const Kernels& kr = kernels(isa);
    const i64 l1 = cache_bytes(1), l2 = cache_bytes(2);
    Blocking b{kr.mr, kr.nr, 0, 0, 0, l1, l2};
    // B micro-panel in 1/12 of L2 (768 here): measured 5-15 % faster than one
    // sized for L1 on the conv shapes (fewer passes over C; the panel streams
    // from L2 fast enough for 24 FMAs per row).
    b.kc = clamp(l2 / 12 / (kr.nr * 4) / 8 * 8, 64, 768);
    b.mc = clamp(l2 / 2 / (b.kc * 4) / kr.mr * kr.mr, kr.mr, 1024 / kr.mr * kr.mr);  // A block in half of L2
    b.nc = 4096 / kr.nr * kr.nr;
    // SPRINT_GEMM_BLOCKING=kc,mc,nc overrides them (benchmarks of other blockings)
    if (const char* env = std::getenv("SPRINT_GEMM_BLOCKING")) {
        long long kc = 0, mc = 0, nc = 0;
        if (std::sscanf(env, "%lld,%lld,%lld", &kc, &mc, &nc) == 3 && kc > 0 && mc > 0 && nc > 0) {
            b.kc = clamp(kc, 8, 4096);
            b.mc = cdiv(clamp(mc, 1, 1 << 16), kr.mr) * kr.mr;
            b.nc = cdiv(clamp(nc, 1, 1 << 20), kr.nr) * kr.nr;
        }
    }
    return b;
}

namespace {
const Blocking& blocking_cached(Isa isa) {
    static const Blocking b[3] = {blocking(Isa::generic), blocking(Isa::avx2), blocking(Isa::avx512)};
    return b[int(isa)];
}
}  // namespace

const char* sgemm(Isa isa, bool trans_a, bool trans_b, i64 m, i64 n, i64 k, float alpha, const float* A,
                  i64 lda, const float* B, i64 ldb, float beta, float* C, i64 ldc) {
    i64 t = 0;
    if (!mul_ok(m, ldc, t) || !mul_ok(m, k, t) || !mul_ok(n, k, t) || !mul_ok(m, n, t))
        return "gemm: matrix sizes overflow";
    if (m == 0 || n == 0) return nullptr;
    if (k == 0) {  // empty inner dimension: C = beta*C (beta 0 clears NaN too)
        for (i64 i = 0; i < m; ++i)
            for (i64 j = 0; j < n; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
        return nullptr;
    }
    const Kernels& kr = kernels(isa);
    Plan p = plan(kr, blocking_cached(isa), m, n, k);
    TrimScratch trim;
    if (!allocate(p, t_arena)) return kAlloc;
    kr.sgemm(p, trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return nullptr;
}

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
}  // namespace

const char* conv_forward(Isa isa, const Conv& g, const float* x, const float* w, const float* bias, bool relu,
                         float* y) {
    if (!conv_sizes_ok(g)) return "conv: sizes overflow";
    if (g.B == 0) return nullptr;
    return run_conv(isa, g, g.M, g.B * g.P(), g.K(), [&](const Kernels& kr, const Plan& p) {
        kr.conv_fwd(p, g, x, w, bias, relu, y);
    });
}

namespace {
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
    const bool small = K * M * 4 <= bl.l1d;
    const i64 kc = small ? clamp(bl.l1d * 2 / 3 / (i64(kr.dw_nr) * 4) / 8 * 8, 32, bl.kc) : bl.kc;
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
        if (cost < best_cost) best_cost = cost, best = detail::DwPlan{nth, tm, tn, mq, nq, kc, nullptr, 0, nullptr, nullptr, nullptr, 0, 0};
    }
    best.buf_floats = cdiv(best.kc * kr.dw_nr + 2 * best.kc, 16) * 16;
    return best;
}

// x zero-padded by (ph, pw) into xp (B*C planes of Hp x Wp), planes split over threads.
void pad_image(const Conv& g, const float* x, float* xp, i64 Hp, i64 Wp, int nth) {
    const i64 planes = g.B * g.C;
#pragma omp parallel for num_threads(nth) if (nth > 1) schedule(static)
    for (i64 pl = 0; pl < planes; ++pl) {
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
}
thread_local Scratch t_dw_arena;  // dW's padded image and dW^T (kept apart from the GEMM plans' scratch)
}  // namespace

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
    const i64 khw = g.kh * g.kw;
    for (i64 t = 0; t < K; ++t) toff[t] = t / khw * p.Hp * p.Wp + t % khw / g.kw * p.Wp + t % g.kw;
    if (padded) pad_image(g, x, xp, p.Hp, p.Wp, p.nth);
    kr.conv_dw(p, g, dy, dw, accumulate, db);
    return nullptr;
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
