// CPU twin of kernels/im2col.cu. See im2col.h for the layouts.
#include "im2col.h"

#include <algorithm>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#define SPRINT_HAVE_STREAM 1
#endif

namespace sprint {
namespace cpu {
// Threads only pay off above this many floats (4 MiB) moved: below it the fork/join
// (and, on a busy machine, waking a descheduled worker) costs more than the copy.
constexpr i64 kParallelMin = i64(1) << 20;
// cols larger than this (2^24 floats = 64 MiB, twice a typical L3) is written
// with non-temporal stores.
constexpr i64 kStreamMinFloats = i64(1) << 24;

// Per-thread scratch is allocated before the parallel region (an exception,
// bad_alloc included, must never leave an OpenMP region: it would abort the
// process): one slice per thread that region may run.
inline int region_threads(bool parallel) {
#ifdef _OPENMP
    return parallel ? omp_get_max_threads() : 1;
#else
    return 1;
#endif
}

inline int thread_index() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

// Floats of the zero-padded plane (Hp x Wp) that the fast paths of im2col and
// col2im work in, or 0 when it would be much larger than the data it serves:
// a huge stride or pad makes it GBs for a tiny output (2^17 stride, 2^16 pad:
// 2^34 floats for a 2x2 output); then the direct paths (an edge test per
// element, no scratch) are used instead.
inline i64 padded_plane_floats(const ConvGeom& g) {
    const i64 Hp = (g.OH - 1) * g.sh + g.kh, Wp = (g.OW - 1) * g.sw + g.kw;
    const i64 n = size_product({Hp, Wp});
    const i64 data = g.H * g.W + g.kh * g.kw * g.P();  // one input plane + its cols
    return n >= 0 && n <= 2 * data + 4096 ? n : 0;
}

// The outputs q in [lo, hi) whose tap q*s + k - p lies inside [0, L): the
// rest read padding. Computed, not searched: a huge pad leaves most outputs
// outside, and the direct paths cost what they write.
inline void inside_range(i64 n_out, i64 s, i64 k, i64 p, i64 L, i64& lo, i64& hi) {
    lo = k >= p ? 0 : (p - k + s - 1) / s;
    hi = L - 1 + p - k < 0 ? 0 : std::min(n_out, (L - 1 + p - k) / s + 1);
    lo = std::min(lo, n_out);
    if (hi < lo) hi = lo;
}

// im2col block (i, j) of one plane, straight from the unpadded plane.
inline void copy_rows_direct(const float* plane, float* dst, const ConvGeom& g, i64 i, i64 j) {
    i64 r0, r1, q0, q1;
    inside_range(g.OH, g.sh, i, g.ph, g.H, r0, r1);
    inside_range(g.OW, g.sw, j, g.pw, g.W, q0, q1);
    std::fill(dst, dst + r0 * g.OW, 0.0f);
    std::fill(dst + r1 * g.OW, dst + g.OH * g.OW, 0.0f);
    for (i64 oh = r0; oh < r1; ++oh) {
        float* d = dst + oh * g.OW;
        const float* row = plane + (oh * g.sh + i - g.ph) * g.W;
        std::fill(d, d + q0, 0.0f);
        for (i64 q = q0; q < q1; ++q) d[q] = row[q * g.sw + j - g.pw];
        std::fill(d + q1, d + g.OW, 0.0f);
    }
}

// One (i, j) block of im2col from a zero-padded copy of the plane (Hp x Wp,
// every window position in range): rows without edge tests.
inline void copy_rows_padded(const float* pp, i64 Wp, float* dst, const ConvGeom& g, i64 i, i64 j) {
    for (i64 oh = 0; oh < g.OH; ++oh, dst += g.OW) {
        const float* src = pp + (oh * g.sh + i) * Wp + j;
        if (g.sw == 1) {
#pragma omp simd
            for (i64 q = 0; q < g.OW; ++q) dst[q] = src[q];
        } else {
            for (i64 q = 0; q < g.OW; ++q) dst[q] = src[q * g.sw];
        }
    }
}

// Zero-padded copy of one plane: padded (hp, wp) = input (hp - ph, wp - pw).
inline void pad_plane(const float* plane, float* pp, i64 Hp, i64 Wp, const ConvGeom& g) {
    std::memset(pp, 0, sizeof(float) * Hp * Wp);
    const i64 rows = std::max<i64>(0, std::min(g.H, Hp - g.ph));
    const i64 cols = std::max<i64>(0, std::min(g.W, Wp - g.pw));
    for (i64 h = 0; h < rows; ++h)
        std::memcpy(pp + (h + g.ph) * Wp + g.pw, plane + h * g.W, sizeof(float) * cols);
}

// The same block when stride is 1 and OW == W ("same" padding): output rows
// are input rows shifted by s = j - pw columns, so all valid rows are one
// contiguous copy; the |s| columns that wrapped into the neighbouring row are
// then zeroed. Avoids per-row overhead on the narrow rows of small images.
inline void copy_shifted_block(const float* plane, float* dst, const ConvGeom& g, i64 i, i64 j) {
    const i64 W = g.W, HW = g.H * g.W, s = j - g.pw;
    i64 oh_lo = std::max<i64>(0, g.ph - i), oh_hi = std::min<i64>(g.OH, g.H + g.ph - i);
    if (oh_hi < oh_lo) oh_hi = oh_lo = 0;
    std::memset(dst, 0, sizeof(float) * oh_lo * W);
    std::memset(dst + oh_hi * W, 0, sizeof(float) * (g.OH - oh_hi) * W);
    if (oh_hi == oh_lo) return;
    float* d = dst + oh_lo * W;
    const i64 len = (oh_hi - oh_lo) * W;
    const i64 off = (oh_lo - g.ph + i) * W + s;  // d[q] <- plane[off + q]
    const i64 qa = std::min(len, std::max<i64>(0, -off)), qb = std::max(qa, std::min(len, HW - off));
    std::memset(d, 0, sizeof(float) * qa);
    std::memcpy(d + qa, plane + off + qa, sizeof(float) * (qb - qa));
    std::memset(d + qb, 0, sizeof(float) * (len - qb));
    const i64 e = std::min<i64>(s < 0 ? -s : s, W);
    if (e == 0) return;
    for (i64 r = 0; r < oh_hi - oh_lo; ++r) {
        float* row = d + r * W + (s > 0 ? W - e : 0);
        for (i64 q = 0; q < e; ++q) row[q] = 0.0f;
    }
}

// Rows of cols are written once and read by the SGEMM much later (after the
// whole block exceeds the caches): non-temporal stores skip the read-for-
// ownership of each destination line. dst must be 16-byte aligned and n % 4 == 0.
inline void stream_row(float* dst, const float* src, i64 n) {
#ifdef SPRINT_HAVE_STREAM
    for (i64 q = 0; q < n; q += 4) _mm_stream_ps(dst + q, _mm_loadu_ps(src + q));
#else
    std::memcpy(dst, src, sizeof(float) * n);
#endif
}

inline bool streamable(const float* dst, i64 OW) {
#ifdef SPRINT_HAVE_STREAM
    return OW % 4 == 0 && OW <= 1024 && (reinterpret_cast<std::uintptr_t>(dst) & 15) == 0;
#else
    return false;
#endif
}

// One (i, j) block, stride 1, OW == W: each output row is an input row
// shifted by s = j - pw with zeros at the edge, assembled in a cached buffer
// and streamed out.
inline void stream_shifted_rows(const float* plane, float* dst, const ConvGeom& g, i64 i, i64 j) {
    alignas(16) float row[1024];
    const i64 W = g.W, s = j - g.pw;
    const i64 e = std::min<i64>(s < 0 ? -s : s, W);
    for (i64 oh = 0; oh < g.OH; ++oh, dst += W) {
        const i64 h = oh - g.ph + i;
        if (h < 0 || h >= g.H || e == W) {
            std::memset(row, 0, sizeof(float) * W);
        } else if (s >= 0) {
            std::memcpy(row, plane + h * W + s, sizeof(float) * (W - e));
            std::memset(row + W - e, 0, sizeof(float) * e);
        } else {
            std::memset(row, 0, sizeof(float) * e);
            std::memcpy(row + e, plane + h * W, sizeof(float) * (W - e));
        }
        stream_row(dst, row, W);
    }
}

// Each task is one (n, c) input plane: it is read kh*kw times from cache and
// written to kh*kw rows of cols at column offset n*P.
void im2col(const float* x, float* cols, const ConvGeom& g) {
    if (g.B == 0) return;  // cols is empty
    const i64 P = g.P(), BP = g.B * P, HW = g.H * g.W;
    const i64 planes = g.B * g.C;
    const i64 Wp = (g.OW - 1) * g.sw + g.kw;
    const bool same_rows = g.sh == 1 && g.sw == 1 && g.OW == g.W;
    const i64 pad_floats = same_rows ? 0 : padded_plane_floats(g);
    const bool padded = pad_floats > 0, parallel = planes * g.kh * g.kw * P > kParallelMin;
    std::vector<float> scratch(static_cast<size_t>(pad_floats) * region_threads(parallel));
    // Stream only what cannot stay in the last-level cache anyway.
    const bool stream = same_rows && g.K() * BP > kStreamMinFloats && streamable(cols + BP, g.OW);
#pragma omp parallel if (parallel)
    {
        float* pp = padded ? scratch.data() + thread_index() * pad_floats : nullptr;
        const i64 Hp = padded ? pad_floats / Wp : 0;
#pragma omp for schedule(static)
        for (i64 t = 0; t < planes; ++t) {
            const i64 n = t / g.C, c = t % g.C;
            const float* plane = x + t * HW;
            if (padded) pad_plane(plane, pp, Hp, Wp, g);
            for (i64 i = 0; i < g.kh; ++i) {
                for (i64 j = 0; j < g.kw; ++j) {
                    float* dst = cols + ((c * g.kh + i) * g.kw + j) * BP + n * P;
                    if (padded)
                        copy_rows_padded(pp, Wp, dst, g, i, j);
                    else if (!same_rows)
                        copy_rows_direct(plane, dst, g, i, j);
                    else if (stream && streamable(dst, g.OW))
                        stream_shifted_rows(plane, dst, g, i, j);
                    else
                        copy_shifted_block(plane, dst, g, i, j);
                }
            }
#ifdef SPRINT_HAVE_STREAM
            if (stream) _mm_sfence();  // streamed stores visible before cols is read
#endif
        }
    }
}

// The adjoint of im2col, computed by the owner of each (n, c) plane. The
// owner accumulates into a zeroed, padded copy of the plane (every window
// position in range, so the inner loops have no edge tests), adding the cols
// entries in (i, j, oh, ow) order: each pixel sums its contributions in a
// fixed order (kernel row, then column), with no atomics and no sharing
// between threads -- deterministic whatever the thread count. The interior is
// then copied out (pixels no window covers get 0). cols rows are streamed
// sequentially while the padded plane stays in cache. When the padded plane
// would be far larger than the data (huge stride or pad), the owner adds
// straight into its output plane with edge tests, in the same order: the
// same sums bit for bit.
void col2im(const float* cols, float* x, const ConvGeom& g) {
    if (g.B == 0) return;  // x is empty
    const i64 P = g.P(), BP = g.B * P, HW = g.H * g.W;
    const i64 Wp = (g.OW - 1) * g.sw + g.kw;
    const i64 planes = g.B * g.C;
    const i64 pad_floats = padded_plane_floats(g);
    const bool parallel = planes * g.kh * g.kw * P > kParallelMin;
    std::vector<float> scratch(static_cast<size_t>(pad_floats) * region_threads(parallel));
#pragma omp parallel if (parallel)
    {
        float* pp = pad_floats ? scratch.data() + thread_index() * pad_floats : nullptr;
        const i64 Hp = pad_floats ? pad_floats / Wp : 0;
#pragma omp for schedule(static)
        for (i64 t = 0; t < planes; ++t) {
            const i64 n = t / g.C, c = t % g.C;
            float* plane = x + t * HW;
            if (!pp) {
                std::fill(plane, plane + HW, 0.0f);
                for (i64 i = 0; i < g.kh; ++i) {
                    for (i64 j = 0; j < g.kw; ++j) {
                        const float* src = cols + ((c * g.kh + i) * g.kw + j) * BP + n * P;
                        i64 r0, r1, q0, q1;
                        inside_range(g.OH, g.sh, i, g.ph, g.H, r0, r1);
                        inside_range(g.OW, g.sw, j, g.pw, g.W, q0, q1);
                        for (i64 oh = r0; oh < r1; ++oh) {
                            float* row = plane + (oh * g.sh + i - g.ph) * g.W;
                            const float* s = src + oh * g.OW;
                            for (i64 q = q0; q < q1; ++q) row[q * g.sw + j - g.pw] += s[q];
                        }
                    }
                }
                continue;
            }
            std::memset(pp, 0, sizeof(float) * Hp * Wp);
            for (i64 i = 0; i < g.kh; ++i) {
                for (i64 j = 0; j < g.kw; ++j) {
                    const float* src = cols + ((c * g.kh + i) * g.kw + j) * BP + n * P;
                    for (i64 oh = 0; oh < g.OH; ++oh) {
                        float* d = pp + (oh * g.sh + i) * Wp + j;
                        const float* s = src + oh * g.OW;
                        if (g.sw == 1) {
#pragma omp simd
                            for (i64 q = 0; q < g.OW; ++q) d[q] += s[q];
                        } else {
                            for (i64 q = 0; q < g.OW; ++q) d[q * g.sw] += s[q];
                        }
                    }
                }
            }
            // input (h, w) is padded (h + ph, w + pw)
            const i64 wn = std::max<i64>(0, std::min(g.W, Wp - g.pw));
            for (i64 h = 0; h < g.H; ++h) {
                float* row = plane + h * g.W;
                const i64 hp = h + g.ph;
                if (hp >= Hp) {
                    std::memset(row, 0, sizeof(float) * g.W);
                    continue;
                }
                std::memcpy(row, pp + hp * Wp + g.pw, sizeof(float) * wn);
                if (wn < g.W) std::memset(row + wn, 0, sizeof(float) * (g.W - wn));
            }
        }
    }
}

void cnhw_to_nchw(const float* yt, const float* bias, float* y, i64 B, i64 M, i64 P) {
    if (B == 0 || M == 0 || P == 0) return;  // y is empty (its other dims may be huge)
#pragma omp parallel for collapse(2) schedule(static) if (B * M * P > kParallelMin)
    for (i64 n = 0; n < B; ++n) {
        for (i64 m = 0; m < M; ++m) {
            const float* src = yt + m * B * P + n * P;
            float* dst = y + (n * M + m) * P;
            const float b = bias ? bias[m] : 0.0f;
#pragma omp simd
            for (i64 p = 0; p < P; ++p) dst[p] = src[p] + b;
        }
    }
}

namespace {

// One sample's sum; the bias gradient then adds the samples one by one in
// order onto db (accumulate: onto db's value), so sums over consecutive
// micro-batches equal the whole batch's bit for bit.
inline float row_sum(const float* r, i64 P) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (i64 p = 0; p < P; ++p) s += r[p];
    return s;
}

}  // namespace

// An empty y (B*P == 0) returns at once: out is empty, db gets zero sums
// (M is then db's real length, but B or P may be huge).
inline bool empty_sums(float* db, bool accumulate, i64 B, i64 M, i64 P) {
    if (B != 0 && M != 0 && P != 0) return false;
    if (db && !accumulate) std::fill(db, db + M, 0.0f);
    return true;
}

void nchw_to_cnhw(const float* y, float* out, float* db, bool accumulate, i64 B, i64 M, i64 P) {
    if (empty_sums(db, accumulate, B, M, P)) return;
#pragma omp parallel for schedule(static) if (B * M * P > kParallelMin)
    for (i64 m = 0; m < M; ++m) {
        float s = db && accumulate ? db[m] : 0.0f;
        for (i64 n = 0; n < B; ++n) {
            const float* src = y + (n * M + m) * P;
            std::memcpy(out + m * B * P + n * P, src, sizeof(float) * P);
            if (db) s += row_sum(src, P);
        }
        if (db) db[m] = s;
    }
}

void channel_sum(const float* y, float* db, bool accumulate, i64 B, i64 M, i64 P) {
    if (empty_sums(db, accumulate, B, M, P)) return;
#pragma omp parallel for schedule(static) if (B * M * P > kParallelMin)
    for (i64 m = 0; m < M; ++m) {
        float s = accumulate ? db[m] : 0.0f;
        for (i64 n = 0; n < B; ++n) s += row_sum(y + (n * M + m) * P, P);
        db[m] = s;
    }
}

void add_channel_bias(float* y, const float* bias, i64 B, i64 M, i64 P) {
    if (B == 0 || M == 0 || P == 0) return;
#pragma omp parallel for collapse(2) schedule(static) if (B * M * P > kParallelMin)
    for (i64 n = 0; n < B; ++n) {
        for (i64 m = 0; m < M; ++m) {
            float* r = y + (n * M + m) * P;
            const float b = bias[m];
#pragma omp simd
            for (i64 p = 0; p < P; ++p) r[p] += b;
        }
    }
}

}  // namespace cpu
}  // namespace sprint
