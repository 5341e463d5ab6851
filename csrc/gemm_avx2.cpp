// AVX2+FMA micro-kernel and the driver instantiated for it. Compiled with
// -mavx2 -mfma (CMakeLists.txt); only called after the CPU reported AVX2 and
// FMA. Tile 4 x 24 (3 ymm per row): 12 accumulators + 3 B vectors + 1
// broadcast of the 16 ymm registers.
#include "gemm_plan.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "gemm_simd.h"

namespace {

struct V256 {
    using reg = __m256;
    static constexpr int L = 8;
    static reg zero() { return _mm256_setzero_ps(); }
    static reg load(const float* p) { return _mm256_loadu_ps(p); }
    static reg bcast(const float* p) { return _mm256_broadcast_ss(p); }
    static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
    static reg relu(reg a) { return _mm256_max_ps(a, _mm256_setzero_ps()); }  // NaN: the second operand, 0
    static void pin(reg& a) { asm("" : "+x"(a)); }
    static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
    static reg load_mask(reg acc, const float* x, std::int64_t off, std::uint32_t mask) {
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        const __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(mask)), bit), bit);
        // masked lanes never touch memory
        return _mm256_blendv_ps(acc, _mm256_maskload_ps(x + off, m), _mm256_castsi256_ps(m));
    }
    static void store_mask(float* x, std::int64_t off, reg v, std::uint32_t mask) {
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        _mm256_maskstore_ps(x + off, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(mask)), bit), bit), v);
    }
    static void transpose(const float* x, const std::int64_t* off, std::int64_t q, const std::uint32_t* mask, float* d,
                          std::int64_t ld) {
        transpose_scalar<L>(x, off, q, mask, d, ld);
    }
    static void sum_lanes(const reg* v, int n, float* out) { sum_lanes_scalar<V256>(v, n, out); }
    // 4 rows x 8 k: pairs interleaved, 4-row groups per 128-bit lane, then
    // the lanes of two elements joined (12 shuffles for 32 floats).
    template <int MR>
    static void panel(const float* const* s, int n, std::int64_t q, float* d) {
        if constexpr (MR != 4) {
            panel_scalar<L, MR>(s, n, q, d);
        } else {
            __m256 r[4];
            for (int i = 0; i < 4; ++i) r[i] = i < n ? _mm256_loadu_ps(s[i] + q) : _mm256_setzero_ps();
            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
            // u[e]: lane h holds rows 0-3 of element 4h + e
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u1, 0x20));
            _mm256_storeu_ps(d + 8, _mm256_permute2f128_ps(u2, u3, 0x20));
            _mm256_storeu_ps(d + 16, _mm256_permute2f128_ps(u0, u1, 0x31));
            _mm256_storeu_ps(d + 24, _mm256_permute2f128_ps(u2, u3, 0x31));
        }
    }
};

using UK = MicroKernel<V256, 4, 3>;
using DK = TapKernel<V256, 6, 2>;  // dW: 12 accumulators + 2 B + 1 broadcast of 16 ymm
using SK = LaneKernel<V256, 2, 6>;  // small-K dW: 12 accumulators + 2 dy + 1 tap row

}  // namespace

#include "gemm_driver.h"

SPRINT_GEMM_KERNELS(avx2, V256, 16)
#else
SPRINT_GEMM_FALLBACK(avx2)
#endif
