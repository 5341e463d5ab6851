// Portable half of the SGEMM (csrc/gemm.h): ISA choice, cache sizes, the
// thread plan, scratch allocation (outside every parallel region) and size
// checks; the convolutions on it are gemm_conv.cpp. The loops themselves live
// in gemm_driver.h, instantiated by the per-ISA units.
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

#include "gemm_portable.h"

namespace sprint {
namespace gemm {
namespace detail {
bool g_profiling = false;
ProfSlot g_prof[kProfSlots];
thread_local Scratch t_arena;
const char* const kAlloc = "gemm: scratch allocation failed (sizes too large)";

const Kernels& kernels(Isa isa) {
    switch (isa) {
        case Isa::avx512: return kernels_avx512();
        case Isa::avx2: return kernels_avx2();
        default: return kernels_generic();
    }
}
}  // namespace detail

using detail::Kernels;
using detail::Plan;
using detail::cdiv;
using detail::clamp;
using detail::kAlloc;
using detail::kernels;
using detail::mul_ok;
using detail::t_arena;
using detail::TrimScratch;

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
}  // namespace

namespace detail {
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

bool allocate(Plan& p, Scratch& arena) {
    i64 per = 0, total = 0;
    if (!mul_ok(p.a_floats + p.b_floats, 1, per) || !mul_ok(per, p.nth, total)) return false;
    p.arena = arena.try_aligned(total);
    return p.arena != nullptr;
}
}  // namespace detail

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

ConvTiles conv_tiles(Isa isa) {
    const Kernels& kr = kernels(isa);
    return ConvTiles{kr.dw_mr, kr.dw_nr, kr.dw_l, kr.lanes_l, kr.lanes_mb, kr.lanes_tb};
}

namespace detail {
const Blocking& blocking_cached(Isa isa) {
    static const Blocking b[3] = {blocking(Isa::generic), blocking(Isa::avx2), blocking(Isa::avx512)};
    return b[int(isa)];
}
}  // namespace detail
using detail::allocate;
using detail::blocking_cached;
using detail::plan;

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

}  // namespace gemm
}  // namespace sprint
