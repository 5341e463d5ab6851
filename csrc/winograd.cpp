// Winograd convolution driver (winograd.h): the tile blocking, the
// workspace layout and the threads; the transforms are the ISA units'
// (winograd_simd.h), the per-position GEMMs the engine's SGEMM (gemm.h).
#include "winograd.h"

#include <omp.h>

namespace sprint {
namespace winograd {

namespace {

using detail::Block;
using detail::Kernels;

const Kernels& kernels(Isa isa) {
    switch (isa) {
        case Isa::avx512: return detail::kernels_avx512();
        case Isa::avx2: return detail::kernels_avx2();
        default: return detail::kernels_generic();
    }
}

i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }
i64 up16(i64 v) { return cdiv(v, 16) * 16; }

constexpr i64 kMaxFloats = i64(1) << 38;  // any workspace beyond this is refused before any arithmetic

// The tiling of g and where each part of the workspace lies.
struct Layout {
    int m, a, nth;
    i64 N, T, tb, ld, nblocks;
    i64 u, v, z, per_thread, total;  // floats
};

bool layout(const Conv& g, int m, Layout& L) {
    if (!serves(g, m) || g.B < 1 || g.C < 1 || g.M < 1 || g.OH < 1 || g.OW < 1) return false;
    L.m = m, L.a = m + 2, L.N = i64(L.a) * L.a;
    const double tiles = double(g.B) * double(cdiv(g.OH, m)) * double(cdiv(g.OW, m));
    if (tiles > double(kMaxFloats) || double(L.N) * g.M * g.C > double(kMaxFloats)) return false;
    L.T = i64(tiles);
    // A block's V (N x C x tb) and Z (N x M x tb) in half of the L2, so the
    // per-position GEMMs read V and the output transform reads Z from cache;
    // tb a multiple of 48 (whole micro-panels of every ISA's SGEMM: NR = 48,
    // 24, 16; whole vectors of every lane loop) and at least 48 (a GEMM much
    // narrower runs its edge kernels and repacks U for too few columns).
    const i64 l2 = gemm::blocking(Isa::generic).l2;
    const i64 fit = l2 / 2 / (4 * L.N * (g.C + g.M)) / 48 * 48;
    const int threads = omp_get_max_threads();
    // Then the blocks evened out over the threads (a multiple of them, if
    // there are tiles enough: cifar's 8x8 layers have 128 tiles, which 48-tile
    // blocks would split 96 : 32), at the cost of narrower GEMMs.
    const i64 nb = cdiv(cdiv(L.T, fit < 48 ? 48 : fit), threads) * threads;
    L.tb = up16(cdiv(L.T, nb));
    L.nblocks = cdiv(L.T, L.tb);
    L.nth = int(L.nblocks < threads ? L.nblocks : threads);
    L.ld = L.tb;
    L.u = up16(L.N * g.M * g.C);
    L.v = up16(L.N * g.C * L.ld);
    L.z = up16(L.N * g.M * L.ld);
    if (double(L.v) + double(L.z) > double(kMaxFloats) / threads) return false;
    L.per_thread = L.v + L.z;
    L.total = L.u + L.nth * L.per_thread;
    return true;
}

// Filter transform (rows split over the team), then every thread runs whole
// tile blocks: input transform, N SGEMMs, output transform.
const char* run(Isa isa, const Layout& L, const Conv& g, const float* x, const float* w, bool flipped,
                const float* bias, bool relu, float* y, float* ws) {
    const Kernels& k = kernels(isa);
    float* U = ws;
    const char* err = nullptr;
#pragma omp parallel num_threads(L.nth) if (L.nth > 1)
    {
        // The SGEMMs below run inside this team: one thread each (this
        // implicit task's own setting; the caller's is untouched).
        omp_set_num_threads(1);
        const i64 rstep = cdiv(g.M, omp_get_num_threads());
        const i64 r0 = omp_get_thread_num() * rstep, r1 = r0 + rstep < g.M ? r0 + rstep : g.M;
        if (r0 < r1) k.filter(L.m, g, w, flipped, U, r0, r1);
#pragma omp barrier
        float* V = ws + L.u + omp_get_thread_num() * L.per_thread;
        float* Z = V + L.v;
#pragma omp for schedule(dynamic, 1)
        for (i64 bi = 0; bi < L.nblocks; ++bi) {
            const Block b{bi * L.tb, bi * L.tb + L.tb <= L.T ? L.tb : L.T - bi * L.tb, L.ld};
            k.input(L.m, g, x, b, V);
            const char* e = nullptr;
            for (i64 xi = 0; xi < L.N && !e; ++xi)
                e = gemm::sgemm(isa, false, false, g.M, b.nt, g.C, 1.f, U + xi * g.M * g.C, g.C,
                                V + xi * g.C * L.ld, L.ld, 0.f, Z + xi * g.M * L.ld, L.ld);
            if (e) {
#pragma omp critical(sprint_winograd_err)
                err = e;
            } else {
                k.output(L.m, g, Z, b, bias, relu, y);
            }
        }
    }
    return err;
}

// The stride-1 convolution of dy with w flipped and channel-transposed,
// whose output is dx of layer g.
Conv transposed(const Conv& g) {
    return Conv{g.B, g.M, g.OH, g.OW, g.C, g.kh, g.kw, 1, 1, g.kh - 1 - g.ph, g.kw - 1 - g.pw, g.H, g.W};
}

const char* kNotServed = "winograd: needs a 3x3 window at stride 1, pads of at most 2, a tile size of 2 or 4 and sizes that fit";
const char* kSmallWs = "winograd: workspace smaller than workspace_floats()";

}  // namespace

bool serves(const Conv& g, int m) {
    return (m == 2 || m == 4) && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.ph >= 0 && g.pw >= 0 &&
           g.ph <= 2 && g.pw <= 2;  // so dX's transposed convolution (pad 2 - p) is served too
}

i64 workspace_floats(const Conv& g, int m) {
    Layout L;
    return layout(g, m, L) ? L.total : 0;
}

i64 dx_workspace_floats(const Conv& g, int m) {
    return serves(g, m) ? workspace_floats(transposed(g), m) : 0;
}

const char* conv_forward(Isa isa, int m, const Conv& g, const float* x, const float* w, const float* bias,
                         bool relu, float* y, float* ws, i64 ws_floats) {
    Layout L;
    if (!layout(g, m, L)) return kNotServed;
    if (ws_floats < L.total) return kSmallWs;
    return run(isa, L, g, x, w, false, bias, relu, y, ws);
}

const char* conv_backward_x(Isa isa, int m, const Conv& g, const float* w, const float* dy, float* dx, float* ws,
                            i64 ws_floats) {
    Layout L;
    if (!serves(g, m) || !layout(transposed(g), m, L)) return kNotServed;
    if (ws_floats < L.total) return kSmallWs;
    return run(isa, L, transposed(g), dy, w, true, nullptr, false, dx, ws);
}

}  // namespace winograd
}  // namespace sprint
