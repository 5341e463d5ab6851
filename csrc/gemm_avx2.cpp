// AVX2+FMA micro-kernel (4 x 24: 12 ymm accumulators, three B vectors, one
// broadcast) and the driver instantiated for it. Compiled with -mavx2 -mfma
// (CMakeLists.txt); only called after the CPU reported AVX2 and FMA.
#include "gemm_plan.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace {

struct UK {
    static constexpr int MR = 4, NR = 24;
    static void run(std::int64_t k, const float* __restrict a, const float* const* __restrict brow,
                    float* __restrict t) {
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00, c20 = c00,
               c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
        for (std::int64_t p = 0; p < k; ++p) {
            const float* b = brow[p];
            const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), b2 = _mm256_loadu_ps(b + 16);
            __m256 av;
#define SPRINT_ROW(r)                          \
    av = _mm256_broadcast_ss(a + r);            \
    c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0); \
    c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1); \
    c##r##2 = _mm256_fmadd_ps(av, b2, c##r##2);
            SPRINT_ROW(0) SPRINT_ROW(1) SPRINT_ROW(2) SPRINT_ROW(3)
#undef SPRINT_ROW
            a += MR;
        }
#define SPRINT_STORE(r)                           \
    _mm256_storeu_ps(t + r * NR, c##r##0);        \
    _mm256_storeu_ps(t + r * NR + 8, c##r##1);    \
    _mm256_storeu_ps(t + r * NR + 16, c##r##2);
        SPRINT_STORE(0) SPRINT_STORE(1) SPRINT_STORE(2) SPRINT_STORE(3)
#undef SPRINT_STORE
    }
};

}  // namespace

#include "gemm_driver.h"

namespace {

volatile float g_fma_sink;  // keeps the chains observable

double fma_peak_isa(std::int64_t iters, int threads) {
    double flops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
        const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
        const float base = 1.f + omp_get_thread_num();
        __m256 a0 = _mm256_set1_ps(base + 0e-3f);
        __m256 a1 = _mm256_set1_ps(base + 1e-3f);
        __m256 a2 = _mm256_set1_ps(base + 2e-3f);
        __m256 a3 = _mm256_set1_ps(base + 3e-3f);
        __m256 a4 = _mm256_set1_ps(base + 4e-3f);
        __m256 a5 = _mm256_set1_ps(base + 5e-3f);
        __m256 a6 = _mm256_set1_ps(base + 6e-3f);
        __m256 a7 = _mm256_set1_ps(base + 7e-3f);
        __m256 a8 = _mm256_set1_ps(base + 8e-3f);
        __m256 a9 = _mm256_set1_ps(base + 9e-3f);
        __m256 a10 = _mm256_set1_ps(base + 10e-3f);
        __m256 a11 = _mm256_set1_ps(base + 11e-3f);
        for (std::int64_t i = 0; i < iters; ++i) {
            a0 = _mm256_fmadd_ps(a0, b, c); a1 = _mm256_fmadd_ps(a1, b, c); a2 = _mm256_fmadd_ps(a2, b, c);
            a3 = _mm256_fmadd_ps(a3, b, c); a4 = _mm256_fmadd_ps(a4, b, c); a5 = _mm256_fmadd_ps(a5, b, c);
            a6 = _mm256_fmadd_ps(a6, b, c); a7 = _mm256_fmadd_ps(a7, b, c); a8 = _mm256_fmadd_ps(a8, b, c);
            a9 = _mm256_fmadd_ps(a9, b, c); a10 = _mm256_fmadd_ps(a10, b, c); a11 = _mm256_fmadd_ps(a11, b, c);
        }
        const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                       _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                                     _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11))));
        alignas(32) float v[8];
        _mm256_store_ps(v, s);
        g_fma_sink = v[0];
        flops += double(iters) * 12 * 8 * 2;
    }
    return flops;
}
}  // namespace

namespace sprint {
namespace gemm {
namespace detail {
const Kernels& kernels_avx2() {
    static const Kernels k{UK::MR, UK::NR, 16, fma_peak_isa, sgemm_isa, conv_fwd_isa, conv_dw_isa};
    return k;
}
}  // namespace detail
}  // namespace gemm
}  // namespace sprint
#else
namespace sprint {
namespace gemm {
namespace detail {
const Kernels& kernels_avx2() { return kernels_generic(); }
}  // namespace detail
}  // namespace gemm
}  // namespace sprint
#endif
