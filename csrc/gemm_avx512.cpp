// AVX-512 micro-kernel (8 x 32: 16 zmm accumulators, two B vectors, one
// broadcast) and the driver instantiated for it. Compiled with -mavx512f
// (CMakeLists.txt); only called after the CPU reported AVX-512F.
#include "gemm_plan.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace {

struct UK {
    static constexpr int MR = 8, NR = 32;
    static void run(std::int64_t k, const float* __restrict a, const float* const* __restrict brow,
                    float* __restrict t) {
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
               c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
        for (std::int64_t p = 0; p < k; ++p) {
            const float* b = brow[p];
            const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
            __m512 av;
#define SPRINT_ROW(r)                          \
    av = _mm512_set1_ps(a[r]);                 \
    c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0); \
    c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1);
            SPRINT_ROW(0) SPRINT_ROW(1) SPRINT_ROW(2) SPRINT_ROW(3)
            SPRINT_ROW(4) SPRINT_ROW(5) SPRINT_ROW(6) SPRINT_ROW(7)
#undef SPRINT_ROW
            a += MR;
        }
#define SPRINT_STORE(r)                          \
    _mm512_store_ps(t + r * NR, c##r##0);        \
    _mm512_store_ps(t + r * NR + 16, c##r##1);
        SPRINT_STORE(0) SPRINT_STORE(1) SPRINT_STORE(2) SPRINT_STORE(3)
        SPRINT_STORE(4) SPRINT_STORE(5) SPRINT_STORE(6) SPRINT_STORE(7)
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
        const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
        const float base = 1.f + omp_get_thread_num();
        __m512 a0 = _mm512_set1_ps(base + 0e-3f);
        __m512 a1 = _mm512_set1_ps(base + 1e-3f);
        __m512 a2 = _mm512_set1_ps(base + 2e-3f);
        __m512 a3 = _mm512_set1_ps(base + 3e-3f);
        __m512 a4 = _mm512_set1_ps(base + 4e-3f);
        __m512 a5 = _mm512_set1_ps(base + 5e-3f);
        __m512 a6 = _mm512_set1_ps(base + 6e-3f);
        __m512 a7 = _mm512_set1_ps(base + 7e-3f);
        __m512 a8 = _mm512_set1_ps(base + 8e-3f);
        __m512 a9 = _mm512_set1_ps(base + 9e-3f);
        __m512 a10 = _mm512_set1_ps(base + 10e-3f);
        __m512 a11 = _mm512_set1_ps(base + 11e-3f);
        for (std::int64_t i = 0; i < iters; ++i) {
            a0 = _mm512_fmadd_ps(a0, b, c); a1 = _mm512_fmadd_ps(a1, b, c); a2 = _mm512_fmadd_ps(a2, b, c);
            a3 = _mm512_fmadd_ps(a3, b, c); a4 = _mm512_fmadd_ps(a4, b, c); a5 = _mm512_fmadd_ps(a5, b, c);
            a6 = _mm512_fmadd_ps(a6, b, c); a7 = _mm512_fmadd_ps(a7, b, c); a8 = _mm512_fmadd_ps(a8, b, c);
            a9 = _mm512_fmadd_ps(a9, b, c); a10 = _mm512_fmadd_ps(a10, b, c); a11 = _mm512_fmadd_ps(a11, b, c);
        }
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                       _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                                     _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
        alignas(64) float v[16];
        _mm512_store_ps(v, s);
        g_fma_sink = v[0];
        flops += double(iters) * 12 * 16 * 2;
    }
    return flops;
}
}  // namespace

namespace sprint {
namespace gemm {
namespace detail {
const Kernels& kernels_avx512() {
    static const Kernels k{UK::MR, UK::NR, 32, fma_peak_isa, sgemm_isa, conv_fwd_isa, conv_dw_isa};
    return k;
}
}  // namespace detail
}  // namespace gemm
}  // namespace sprint
#else
namespace sprint {
namespace gemm {
namespace detail {
const Kernels& kernels_avx512() { return kernels_generic(); }
}  // namespace detail
}  // namespace gemm
}  // namespace sprint
#endif
