// The BLIS loops, the packers and the tile loads/stores, included once by
// each ISA translation unit after it defines its micro-kernel `UK` (a
// MicroKernel of gemm_simd.h), so packing and tile moves get that unit's
// vector instructions too. Everything here has internal linkage (see
// gemm_plan.h).
//
// Packed layouts: an A panel is kc x MR (a[kk*MR + r]), a B panel kc x NR
// (b[kk*NR + j]), rows/columns past the matrix edge zero. The micro-kernel
// reads B through one row pointer per k: into the packed panel, or -- for an
// implicit-GEMM panel whose NR columns are one unpadded run of an image row
// -- straight into the image, which then needs no copy at all.
//
// Summation order: every element of C is ONE chain of FMAs in k order. The
// tile functor loads the running sums into the micro-kernel's tile (zero or
// beta*C before the first k block, C's partial sums after), the kernel
// continues the chains, the functor stores them back (NCHW scatter, bias and
// ReLU after the last block). So a result does not depend on KC, the tiles or
// the thread grid, and a GEMM with beta = 1 continues C's chains exactly:
// gradients accumulated micro-batch by micro-batch (k = samples) equal the
// whole batch's bit for bit.
#pragma once

#include <omp.h>

#include <cstring>

#include "gemm_plan.h"

namespace {

using sprint::gemm::i64;
using sprint::gemm::Conv;
using sprint::gemm::detail::Plan;

inline i64 lo_(i64 a, i64 b) { return a < b ? a : b; }
inline i64 hi_(i64 a, i64 b) { return a > b ? a : b; }

// ---- the five loops for one thread's part of C -----------------------------
// An edge panel of at most NR - L columns runs on a kernel one register per
// row narrower (same chains, same order: the same bits), so narrow GEMMs
// waste less: cifar conv1's dW (n = 27) used 27 of 48 lanes.
inline void run_tile(i64 kc, const float* a, const float* const* bp, float* tile, bool from_zero, int nr) {
    if constexpr (UK::NVEC > 1) {
        using Narrow = MicroKernel<typename UK::Vec, UK::MR, UK::NVEC - 1, UK::NR>;
        if (nr <= Narrow::NR) return Narrow::run(kc, a, bp, tile, from_zero);
    }
    UK::run(kc, a, bp, tile, from_zero);
}

template <class PA, class PB, class WB>
void run_part(const Plan& p, float* abuf, float* bbuf, i64 m0, i64 m1, i64 n0, i64 n1, i64 k0, i64 k1,
              PA& pack_a, PB& pack_b, WB& wb) {
    constexpr int MR = UK::MR, NR = UK::NR;
    alignas(64) float tile[MR * NR];
    const float** bptr = reinterpret_cast<const float**>(bbuf + p.b_packed);
    const bool prof = sprint::gemm::detail::g_profiling;
    double t_pack = 0, t_kern = 0, t0 = 0;
    auto tick = [&](double& acc) {
        if (!prof) return;
        const double t = omp_get_wtime();
        acc += t - t0;
        t0 = t;
    };
    if (prof) t0 = omp_get_wtime();
    for (i64 jc = n0; jc < n1; jc += p.nc) {
        const i64 nc = lo_(p.nc, n1 - jc);
        for (i64 pc = k0; pc < k1; pc += p.kc) {
            const i64 kc = lo_(p.kc, k1 - pc);
            const bool first = pc == k0, last = pc + kc >= k1;
            for (i64 ic = m0; ic < m1; ic += p.mc) {
                const i64 mc = lo_(p.mc, m1 - ic);
                for (i64 i = 0; i < mc; i += MR) pack_a(abuf + i * kc, ic + i, lo_(MR, mc - i), pc, kc);
                tick(t_pack);
                for (i64 j = 0; j < nc; j += NR) {
                    const int nr = int(lo_(NR, nc - j));
                    // Each B panel is packed just before its first use (still in L1/L2
                    // for it); kept for the next row blocks only when there are any.
                    const i64 slot = p.one_b_panel ? 0 : j / NR;
                    const float** bp = bptr + slot * kc;
                    if (ic == m0) {
                        tick(t_kern);
                        pack_b(bbuf + slot * NR * kc, bp, jc + j, nr, pc, kc);
                        tick(t_pack);
                    }
                    for (i64 i = 0; i < mc; i += MR) {
                        const int mr = int(lo_(MR, mc - i));
                        const bool from_zero = wb.load(ic + i, jc + j, mr, nr, tile, first);
                        run_tile(kc, abuf + i * kc, bp, tile, from_zero, nr);
                        wb.store(ic + i, jc + j, mr, nr, tile, last);
                    }
                }
                tick(t_kern);
            }
        }
    }
    if (prof) {
        auto& slot = sprint::gemm::detail::g_prof[omp_get_thread_num() % sprint::gemm::detail::kProfSlots];
        slot.pack += t_pack;
        slot.kernel += t_kern;
    }
}

// Thread t's cell of a tm x tn grid over m x n (t = im*tn + in; mq, nq
// per cell): rows [m0, m1), columns [n0, n1); false when it is empty.
struct Cell {
    i64 m0, m1, n0, n1;
};
inline bool grid_cell(int t, int tn, i64 mq, i64 nq, i64 m, i64 n, Cell& c) {
    const int in = t % tn, im = t / tn;
    c.m0 = im * mq, c.n0 = in * nq;
    c.m1 = lo_(m, c.m0 + mq), c.n1 = lo_(n, c.n0 + nq);
    return c.m0 < c.m1 && c.n0 < c.n1;
}

// Every thread of the plan runs its cell of the grid (no k split: that
// would cut the chains).
template <class PA, class PB, class WB>
void run_plan(const Plan& p, i64 m, i64 n, i64 k, PA pack_a, PB pack_b, WB wb) {
#pragma omp parallel num_threads(p.nth) if (p.nth > 1)
    {
        for (int t = omp_get_thread_num(); t < p.nth; t += omp_get_num_threads()) {
            Cell c;
            if (!grid_cell(t, p.tn, p.mq, p.nq, m, n, c)) continue;
            float* abuf = p.arena + t * (p.a_floats + p.b_floats);
            run_part(p, abuf, abuf + p.a_floats, c.m0, c.m1, c.n0, c.n1, 0, k, pack_a, pack_b, wb);
        }
    }
}

// ---- plain matrices ------------------------------------------------------------
// Columns nr..NR-1 of kc B-panel rows zeroed by whole vector stores from the
// vector holding column nr, before the rows' data is written. A scalar loop
// per row compiled to a memset call (rep stos) per row: 30 % of cifar
// conv1's dW (nr = 27) went there.
inline void zero_edge(float* dst, i64 nr, i64 kc) {
    using V = typename UK::Vec;
    constexpr int NR = UK::NR, L = V::L;
    if (nr >= NR) return;
    const i64 v0 = nr / L * L;
    for (i64 kk = 0; kk < kc; ++kk)
        for (i64 v = v0; v < NR; v += L) V::store(dst + kk * NR + v, V::zero());
}

// The A panel of rows s[r] (r < mr; rows up to MR zero), k = 0..kc-1:
// dst[kk*MR + r] = s[r][kk], L k at a time through the register transpose.
inline void pack_rows(const float* const* s, i64 mr, i64 kc, float* dst) {
    constexpr int MR = UK::MR, L = UK::Vec::L;
    i64 q = 0;
    for (; q + L <= kc; q += L) UK::Vec::template panel<MR>(s, int(mr), q, dst + q * MR);
    for (; q < kc; ++q)
        for (int r = 0; r < MR; ++r) dst[q * MR + r] = r < mr ? s[r][q] : 0.f;
}

struct PackA {  // alpha * op(A) m x k; A is m x k (lda) or, transposed, k x m
    const float* A;
    i64 lda;
    bool trans;
    float alpha;  // folded into A, so C's chains can start from beta*C
    void operator()(float* dst, i64 i0, i64 mr, i64 p0, i64 kc) const {
        constexpr int MR = UK::MR;
        const float al = alpha;
        if (trans) {
            for (i64 kk = 0; kk < kc; ++kk) {
                const float* s = A + (p0 + kk) * lda + i0;
                float* d = dst + kk * MR;
                if (al == 1.f) {
                    for (i64 r = 0; r < mr; ++r) d[r] = s[r];
                } else {
                    for (i64 r = 0; r < mr; ++r) d[r] = al * s[r];
                }
                for (i64 r = mr; r < MR; ++r) d[r] = 0.f;
            }
            return;
        }
        const float* rows[MR] = {};
        for (i64 r = 0; r < mr; ++r) rows[r] = A + (i0 + r) * lda + p0;
        pack_rows(rows, mr, kc, dst);
        if (al != 1.f)  // the same single rounding of al * a as scaling while copying
            for (i64 q = 0; q < kc * MR; ++q) dst[q] *= al;
    }
};

struct PackB {  // op(B) k x n; B is k x n (ldb) or, transposed, n x k
    const float* B;
    i64 ldb;
    bool trans;
    void operator()(float* dst, const float** rows, i64 j0, i64 nr, i64 p0, i64 kc) const {
        constexpr int NR = UK::NR;
        for (i64 kk = 0; kk < kc; ++kk) rows[kk] = dst + kk * NR;
        zero_edge(dst, nr, kc);
        if (!trans) {
            for (i64 kk = 0; kk < kc; ++kk) {
                const float* s = B + (p0 + kk) * ldb + j0;
                float* d = dst + kk * NR;
                for (i64 j = 0; j < nr; ++j) d[j] = s[j];
            }
            return;
        }
        // L columns x L k per register transpose: the element-by-element
        // strided copy made the FC layers' forward (x @ W^T) pack-bound.
        using V = typename UK::Vec;
        constexpr int L = V::L;
        const i64 kv = kc / L * L;
        for (i64 col = 0; col < nr; col += L) {
            i64 off[L];
            std::uint32_t mask[L];
            for (int r = 0; r < L; ++r) {
                const bool in = col + r < nr;
                off[r] = in ? (j0 + col + r) * ldb + p0 : 0;
                mask[r] = in ? lane_range(0, L) : 0u;
            }
            for (i64 q = 0; q < kv; q += L) V::transpose(B, off, q, mask, dst + q * NR + col, NR);
        }
        for (i64 j = 0; j < nr; ++j) {
            const float* s = B + (j0 + j) * ldb + p0;
            for (i64 kk = kv; kk < kc; ++kk) dst[kk * NR + j] = s[kk];
        }
    }
};

// n floats from s to d by whole registers and one masked one: the plain
// loop compiled to a memmove call per tile row (3.5 % of the cifar step at
// batch 32, in the implicit convolution's NCHW tile moves).
inline void copy_row(float* d, const float* s, int n) {
    using V = typename UK::Vec;
    constexpr int L = V::L;
    int q = 0;
    for (; q + L <= n; q += L) V::store(d + q, V::load(s + q));
    if (q < n) {
        const std::uint32_t m = lane_range(0, n - q);
        V::store_mask(d, q, V::load_mask(V::zero(), s, q, m), m);
    }
}

inline void zero_tile(float* t) {
    for (int q = 0; q < UK::MR * UK::NR; ++q) t[q] = 0.f;
}

// Whole MR x NR tiles move with vector loads and stores (a dW GEMM, with its
// long k, moves every tile once per k block).
template <class K>
inline void tile_in_t(float* t, const float* c, i64 ldc) {
    using V = typename K::Vec;
    for (int r = 0; r < K::MR; ++r)
        for (int v = 0; v < K::NR; v += V::L) V::store(t + r * K::NR + v, V::load(c + r * ldc + v));
}
template <class K>
inline void tile_out_t(float* c, i64 ldc, const float* t) {
    using V = typename K::Vec;
    for (int r = 0; r < K::MR; ++r)
        for (int v = 0; v < K::NR; v += V::L) V::store(c + r * ldc + v, V::load(t + r * K::NR + v));
}
inline void tile_in(float* t, const float* c, i64 ldc) { tile_in_t<UK>(t, c, ldc); }
inline void tile_out(float* c, i64 ldc, const float* t) { tile_out_t<UK>(c, ldc, t); }

// A tile functor's load() puts the running sums of its tile in t, or
// returns true when the chains start from zero (t untouched: the kernel
// starts its accumulators at zero instead of reloading a zeroed tile).
struct TilePlain {  // C (ldc): chains start from beta*C (beta 0: from zero, NaN in C ignored)
    float* C;
    i64 ldc;
    float beta;
    bool load(i64 i0, i64 j0, int mr, int nr, float* t, bool first) const {
        if (first && beta == 0.f) return true;
        const bool whole = mr == UK::MR && nr == UK::NR;
        if (whole && (!first || beta == 1.f)) return tile_in(t, C + i0 * ldc + j0, ldc), false;
        if (!whole) zero_tile(t);
        for (int r = 0; r < mr; ++r) {
            const float* c = C + (i0 + r) * ldc + j0;
            float* d = t + r * UK::NR;
            if (!first || beta == 1.f) {
                for (int j = 0; j < nr; ++j) d[j] = c[j];
            } else {
                for (int j = 0; j < nr; ++j) d[j] = beta * c[j];
            }
        }
        return false;
    }
    void store(i64 i0, i64 j0, int mr, int nr, const float* t, bool) const {
        if (mr == UK::MR && nr == UK::NR) return tile_out(C + i0 * ldc + j0, ldc, t);
        for (int r = 0; r < mr; ++r) {
            float* c = C + (i0 + r) * ldc + j0;
            const float* s = t + r * UK::NR;
            for (int j = 0; j < nr; ++j) c[j] = s[j];
        }
    }
};

void sgemm_isa(const Plan& p, bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const float* A, i64 lda,
               const float* B, i64 ldb, float beta, float* C, i64 ldc) {
    run_plan(p, m, n, k, PackA{A, lda, ta, alpha}, PackB{B, ldb, tb}, TilePlain{C, ldc, beta});
}

}  // namespace

#include "gemm_conv_pack.h"  // the implicit convolution's packers and tiles
