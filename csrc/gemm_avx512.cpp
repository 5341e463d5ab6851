// AVX-512 micro-kernel and the driver instantiated for it. Compiled with
// -mavx512f (CMakeLists.txt); only called after the CPU reported AVX-512F.
//
// Tile 8 x 48 (3 zmm per row): 24 accumulators + 3 B vectors + 1 broadcast
// of the 32 zmm registers; per k 11 loads feed 24 FMAs, so the two FMA ports,
// not the load ports, bound it, and 24 chains cover the 4-cycle FMA latency
// three times over. MR = 8 divides the channel counts of the conv nets (the
// M of their GEMMs), which a 12- or 14-row tile would leave ragged.
#include "gemm_plan.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "gemm_simd.h"

#ifndef SPRINT_AVX512_MR  // overridable at build time, for measuring other tiles
#define SPRINT_AVX512_MR 8
#define SPRINT_AVX512_NV 3
#endif

// GCC 12 reports its own _mm512_undefined_ps inside the unpack/shuffle
// intrinsics as "(may be) used uninitialized" (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

struct V512 {
    using reg = __m512;
    static constexpr int L = 16;
    static reg zero() { return _mm512_setzero_ps(); }
    static reg load(const float* p) { return _mm512_loadu_ps(p); }
    static reg bcast(const float* p) { return _mm512_set1_ps(*p); }
    static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
    static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
    static reg relu(reg a) { return _mm512_max_ps(a, _mm512_setzero_ps()); }  // NaN: the second operand, 0
    static void pin(reg& a) { asm("" : "+v"(a)); }
    static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
    static reg load_mask(reg acc, const float* x, std::int64_t off, std::uint32_t mask) {
        return _mm512_mask_loadu_ps(acc, __mmask16(mask), x + off);  // masked lanes never touch memory
    }
    static void store_mask(float* x, std::int64_t off, reg v, std::uint32_t mask) {
        _mm512_mask_storeu_ps(x + off, __mmask16(mask), v);
    }
    // 16 x 16 in registers: pairs of rows interleaved, then 4-row groups,
    // then 128-bit lanes (64 shuffles for 256 elements instead of 256
    // scalar stores, which bound the dW packing).
    static void transpose(const float* x, const std::int64_t* off, std::int64_t q, const std::uint32_t* mask, float* d,
                          std::int64_t ld) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; ++i) {
            const __mmask16 m = __mmask16(mask[i]);
            r[i] = m == 0xFFFF ? _mm512_loadu_ps(x + off[i] + q)
                               : _mm512_maskz_loadu_ps(m, x + off[i] + q);  // masked lanes never touch memory
        }
        for (int i = 0; i < 8; ++i) {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // r[4g + e]: rows 4g..4g+3, element e of each 128-bit lane
        for (int g = 0; g < 4; ++g) {
            r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
            r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
            r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
            r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
        }
        for (int e = 0; e < 4; ++e) {
            const __m512 u0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x44), u1 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xEE);
            const __m512 u2 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x44);
            const __m512 u3 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xEE);
            _mm512_storeu_ps(d + (0 + e) * ld, _mm512_shuffle_f32x4(u0, u2, 0x88));
            _mm512_storeu_ps(d + (4 + e) * ld, _mm512_shuffle_f32x4(u0, u2, 0xDD));
            _mm512_storeu_ps(d + (8 + e) * ld, _mm512_shuffle_f32x4(u1, u3, 0x88));
            _mm512_storeu_ps(d + (12 + e) * ld, _mm512_shuffle_f32x4(u1, u3, 0xDD));
        }
    }
    // out[i] = the lanes of v[i] summed (i < n), 16 registers at a time by a
    // tree of 30 shuffles and 15 adds (the small-K dW sums 27 registers per
    // image and channel block; one reduce per register cost a third of it):
    // halves of pairs, then 128-bit lanes of pairs of those, then elements
    // within the lanes, leaving register 4e + k's sum in lane 4k + e.
    static void sum_lanes(const reg* v, int n, float* out) {
        for (int i0 = 0; i0 < n; i0 += 16) {
            const int m = n - i0 < 16 ? n - i0 : 16;
            if (m <= 2) {
                for (int i = 0; i < m; ++i) out[i0 + i] = _mm512_reduce_add_ps(v[i0 + i]);
                continue;
            }
            __m512 a[16], b[8], c[4], d[2];
            for (int i = 0; i < 16; ++i) a[i] = i < m ? v[i0 + i] : _mm512_setzero_ps();
            for (int i = 0; i < 8; ++i)
                b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                                     _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
            for (int i = 0; i < 4; ++i)
                c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                                     _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
            for (int i = 0; i < 2; ++i)
                d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                                     _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
            const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
            const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
            alignas(64) float r[16];
            _mm512_store_ps(r, _mm512_permutexvar_ps(idx, e));
            for (int i = 0; i < m; ++i) out[i0 + i] = r[i];
        }
    }
    // 8 rows x 16 k (an A panel's MR = 8): pairs interleaved, 4-row groups
    // per 128-bit lane (u[e], lane h: rows 0-3 -- u[4+e]: rows 4-7 -- of
    // element 4h + e), then each output register joins the two halves of two
    // consecutive elements: 32 shuffles for 128 floats, all stores whole
    // registers (the 16 x 16 transpose wasted half its work on MR = 8 and
    // needed a copy after it).
    template <int MR>
    static void panel(const float* const* s, int n, std::int64_t q, float* d) {
        if constexpr (MR != 8) {
            panel_scalar<L, MR>(s, n, q, d);
        } else {
            __m512 r[8], t[8], u[8];
            for (int i = 0; i < 8; ++i) r[i] = i < n ? _mm512_loadu_ps(s[i] + q) : _mm512_setzero_ps();
            for (int i = 0; i < 4; ++i) {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
                u[4 * h + 0] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
                u[4 * h + 1] = _mm512_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
                u[4 * h + 2] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
                u[4 * h + 3] = _mm512_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
            }
            // from a = (u[e] lanes x, y, u[e+1] lanes x, y) and b = the same of u[4+e], u[5+e]:
            // lanes (a0 b0 a2 b2) = elements e, e+1 of lane pair x; (a1 b1 a3 b3) of y
            const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
            const __m512i i1 = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
            for (int e = 0; e < 4; e += 2) {
                const __m512 alo = _mm512_shuffle_f32x4(u[e], u[e + 1], 0x44);
                const __m512 blo = _mm512_shuffle_f32x4(u[4 + e], u[5 + e], 0x44);
                const __m512 ahi = _mm512_shuffle_f32x4(u[e], u[e + 1], 0xEE);
                const __m512 bhi = _mm512_shuffle_f32x4(u[4 + e], u[5 + e], 0xEE);
                _mm512_storeu_ps(d + e * 8, _mm512_permutex2var_ps(alo, i0, blo));
                _mm512_storeu_ps(d + (4 + e) * 8, _mm512_permutex2var_ps(alo, i1, blo));
                _mm512_storeu_ps(d + (8 + e) * 8, _mm512_permutex2var_ps(ahi, i0, bhi));
                _mm512_storeu_ps(d + (12 + e) * 8, _mm512_permutex2var_ps(ahi, i1, bhi));
            }
        }
    }
};

using UK = MicroKernel<V512, SPRINT_AVX512_MR, SPRINT_AVX512_NV>;
// dW's tap kernel (gemm_dw.h): 6 taps x 64 channels, 24 accumulators like
// UK; 64 columns divide the conv nets' channel counts (48 would leave 64
// ragged), and 6 tap offsets stay in registers. 8 x 48 (192 bytes of panel
// per 24 FMAs, as UK) measured within 1-3 points of it both ways and 4 worse
// on cifar conv2 (64 channels: 48 + 16), so 6 x 64 stays.
#ifndef SPRINT_AVX512_DW_MR  // overridable at build time, for measuring other tiles
#define SPRINT_AVX512_DW_MR 6
#define SPRINT_AVX512_DW_NV 4
#endif
using DK = TapKernel<V512, SPRINT_AVX512_DW_MR, SPRINT_AVX512_DW_NV>;
// The small-K dW (gemm_conv_small.h): 3 channels x 9 taps, 27 accumulators +
// 3 dy rows + 1 tap row of 32 zmm; 12 loads per 27 FMAs.
using SK = LaneKernel<V512, 3, 9>;

}  // namespace

#include "gemm_driver.h"

SPRINT_GEMM_KERNELS(avx512, V512, 32)
#else
SPRINT_GEMM_FALLBACK(avx512)
#endif
