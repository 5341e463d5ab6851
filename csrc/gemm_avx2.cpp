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
    static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
    static reg load_merge(reg acc, const float* x, std::int64_t off, int lo, int hi) {
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i m = _mm256_and_si256(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1)),
                                           _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx));
        // masked lanes never touch memory
        return _mm256_blendv_ps(acc, _mm256_maskload_ps(x + off, m), _mm256_castsi256_ps(m));
    }
    static void transpose(const float* x, const std::int64_t* off, std::int64_t q, const std::uint32_t* mask, float* d,
                          std::int64_t ld) {
        transpose_scalar<L>(x, off, q, mask, d, ld);
    }
};

using UK = MicroKernel<V256, 4, 3>;

}  // namespace

#include "gemm_driver.h"

SPRINT_GEMM_KERNELS(avx2, V256, 16)
#else
SPRINT_GEMM_FALLBACK(avx2)
#endif
