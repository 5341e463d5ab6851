// dW of the implicit convolution, included by gemm_conv_pack.h (same
// translation unit, same ISA, internal linkage; DK is the unit's TapKernel).
//
// dW (M x K) = dy (M x B*P) @ im2col(x)^T is computed as its transpose,
// dW^T (K taps x M channels) = im2col(x) @ dy^T, so the image-derived operand
// is the broadcast side of the micro-kernel: tap (c, i, j) at output pixel
// (img, oh, ow) is xp[pix + c*Hp*Wp + i*Wp + j], pix = img*C*Hp*Wp +
// oh*sh*Wp + ow*sw, in the image zero-padded by (ph, pw) (gemm.cpp copies
// it once per call; an unpadded layer reads x itself). One pointer per pixel
// and one offset per tap: no packing, no masks, any stride. Packing
// im2col(x)^T (9 C values per pixel through register transposes) cost 12-35
// % of dW; packing dy^T instead moves M values per pixel, and each packed
// panel serves every tap of the thread.
//
// dW^T's running sums live in p.dwt between k blocks (whole-register tile
// moves); each thread transposes its own cell into dw at the end (and out of
// dw at the start when accumulating), so no barrier is needed. Chains: each
// element one FMA chain over the pixels in order from zero or dw, the same
// products as the plain GEMM of dy and im2col(x)^T: the same bits.
#pragma once

namespace {

// The dy^T panel: dst[kk*NR + j] = dy[img, n0 + j, pixel] for k = p0 + kk,
// columns past nr zero. L channels x L pixels per register transpose.
inline void pack_dyt(const Conv& G, const float* dy, float* dst, i64 n0, i64 nr, i64 p0, i64 kc) {
    using V = typename DK::Vec;
    constexpr int NR = DK::NR, L = V::L;
    const i64 P = G.P();
    i64 img = p0 / P, pp = p0 % P;
    for (i64 kk = 0; kk < kc;) {
        const i64 len = lo_(kc - kk, P - pp), base = img * G.M * P + pp;
        for (int col = 0; col < NR; col += L) {
            i64 off[L];
            std::uint32_t mask[L];
            for (int r = 0; r < L; ++r) {
                const bool in = col + r < nr;
                off[r] = in ? base + (n0 + col + r) * P : 0;
                mask[r] = in ? lane_range(0, L) : 0u;
            }
            float* d = dst + kk * NR + col;
            i64 q = 0;
            if (col >= nr) {  // a whole register of zero columns
                for (; q < len; ++q) V::store(d + q * NR, V::zero());
                continue;
            }
            for (; q + L <= len; q += L) V::transpose(dy, off, q, mask, d + q * NR, NR);
            for (; q < len; ++q)
                for (int r = 0; r < L; ++r) d[q * NR + r] = mask[r] ? dy[off[r] + q] : 0.f;
        }
        kk += len;
        pp = 0;
        ++img;
    }
}

// rows [r0, r1) x columns [c0, c1) of src (ld ls) to dst (ld ld) transposed:
// dst[c*ld + r] = src[r*ls + c]; whole L x L blocks through the register
// transpose, the rest element by element (nothing outside the cell written:
// the other threads own it).
inline void transpose_cell(const float* src, i64 ls, float* dst, i64 ld, i64 r0, i64 r1, i64 c0, i64 c1) {
    using V = typename DK::Vec;
    constexpr int L = V::L;
    i64 r = r0;
    for (; r + L <= r1; r += L) {
        i64 off[L];
        std::uint32_t mask[L];
        for (int e = 0; e < L; ++e) off[e] = (r + e) * ls, mask[e] = lane_range(0, L);
        i64 c = c0;
        for (; c + L <= c1; c += L) V::transpose(src, off, c, mask, dst + c * ld + r, ld);
        for (; c < c1; ++c)
            for (int e = 0; e < L; ++e) dst[c * ld + r + e] = src[(r + e) * ls + c];
    }
    for (; r < r1; ++r)
        for (i64 c = c0; c < c1; ++c) dst[c * ld + r] = src[r * ls + c];
}

// db[0..nr) continued over the kc rows of a packed dy^T panel, one add per
// row in k order per channel (the NR/L column groups interleaved: four
// independent chains hide the add latency). db's first values are read only
// when !from_zero.
inline void sum_panel(const float* panel, i64 kc, float* db, int nr, bool from_zero) {
    using V = typename DK::Vec;
    constexpr int NR = DK::NR, L = V::L, NG = NR / L;
    typename V::reg s[NG];
    std::uint32_t mask[NG];
    for (int gi = 0; gi < NG; ++gi) {
        mask[gi] = lane_range(0, int(lo_(L, hi_(0, nr - gi * L))));
        s[gi] = from_zero ? V::zero() : V::load_mask(V::zero(), db, gi * L, mask[gi]);
    }
    for (i64 kk = 0; kk < kc; ++kk)
#pragma GCC unroll 8
        for (int gi = 0; gi < NG; ++gi) s[gi] = V::add(s[gi], V::load(panel + kk * NR + gi * L));
    for (int gi = 0; gi < NG; ++gi)
        if (mask[gi]) V::store_mask(db, gi * L, s[gi], mask[gi]);
}

void conv_dw_isa(const sprint::gemm::detail::DwPlan& p, const Conv& G, const float* dy, float* dw, bool accumulate,
                 float* db) {
    constexpr int MR = DK::MR, NR = DK::NR;
    const i64 K = G.K(), M = G.M, BP = G.B * G.P(), P = G.P();
    const i64 plane = p.Hp * p.Wp, img_stride = G.C * plane;
#pragma omp parallel num_threads(p.nth) if (p.nth > 1)
    {
        if (p.pad_to) pad_shared(G, p.x, p.pad_to, p.Hp, p.Wp);
        for (int t = omp_get_thread_num(); t < p.nth; t += omp_get_num_threads()) {
            Cell cell;
            if (!grid_cell(t, p.tn, p.mq, p.nq, K, M, cell)) continue;
            const i64 m0 = cell.m0, m1 = cell.m1, n0 = cell.n0, n1 = cell.n1;
            float* bbuf = p.bufs + t * p.buf_floats;
            const float** pix = reinterpret_cast<const float**>(bbuf + p.kc * NR);
            // the GEMM profile (gemm_plan.h): dy^T packing vs the kernel loop
            const bool prof = sprint::gemm::detail::g_profiling;
            double t_pack = 0, t_kern = 0, t0 = prof ? omp_get_wtime() : 0;
            auto tick = [&](double& acc) {
                if (!prof) return;
                const double now = omp_get_wtime();
                acc += now - t0;
                t0 = now;
            };
            if (accumulate) transpose_cell(dw, K, p.dwt, M, n0, n1, m0, m1);
            float* const cell_db = m0 == 0 ? db : nullptr;  // the first row of threads sums its channels' db
            alignas(64) float tile[MR * NR];
            for (i64 pc = 0; pc < BP; pc += p.kc) {
                const i64 kc = lo_(p.kc, BP - pc);
                const bool first = pc == 0 && !accumulate;
                i64 img = pc / P, pp = pc % P, oh = pp / G.OW, ow = pp % G.OW;
                for (i64 kk = 0; kk < kc; ++kk) {
                    pix[kk] = p.xp + img * img_stride + oh * G.sh * p.Wp + ow * G.sw;
                    if (++ow == G.OW) {
                        ow = 0;
                        if (++oh == G.OH) oh = 0, ++img;
                    }
                }
                for (i64 j = n0; j < n1; j += NR) {
                    const int nr = int(lo_(NR, n1 - j));
                    tick(t_kern);
                    pack_dyt(G, dy, bbuf, j, nr, pc, kc);
                    if (cell_db) sum_panel(bbuf, kc, cell_db + j, nr, pc == 0 && !accumulate);
                    tick(t_pack);
                    for (i64 i = m0; i < m1; i += MR) {
                        const int mr = int(lo_(MR, m1 - i));
                        i64 toff[MR];
                        for (int r = 0; r < MR; ++r) toff[r] = p.toff[r < mr ? i + r : i];  // spare rows: discarded
                        float* c = p.dwt + i * M + j;
                        const bool whole = mr == MR && nr == NR;
                        if (!first) {
                            if (whole) {
                                tile_in_t<DK>(tile, c, M);
                            } else {
                                for (int q = 0; q < MR * NR; ++q) tile[q] = 0.f;
                                for (int r = 0; r < mr; ++r) copy_row(tile + r * NR, c + r * M, nr);
                            }
                        }
                        DK::run_fit(nr, kc, pix, toff, bbuf, tile, first);
                        if (whole) {
                            tile_out_t<DK>(c, M, tile);
                        } else {
                            for (int r = 0; r < mr; ++r) copy_row(c + r * M, tile + r * NR, nr);
                        }
                    }
                }
            }
            transpose_cell(p.dwt, M, dw, K, m0, m1, n0, n1);
            tick(t_kern);
            if (prof) {
                auto& slot = sprint::gemm::detail::g_prof[omp_get_thread_num() % sprint::gemm::detail::kProfSlots];
                slot.pack += t_pack;
                slot.kernel += t_kern;
            }
        }
    }
}

}  // namespace
