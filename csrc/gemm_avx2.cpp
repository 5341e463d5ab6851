// AVX2+FMA micro-kernel (4 x 24: 12 ymm accumulators, three B vectors, one
// broadcast) and the driver instantiated for it. Compiled with -mavx2 -mfma
// (CMakeLists.txt); only called after the CPU reported AVX2 and FMA.
#include "gemm_plan.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace {

struct UK {
    static constexpr int MR = 4, NR = 24;
    static void run(std::int64_t k, const float* __restrict a, const float* __restrict b, float* __restrict t) {
        __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00, c20 = c00,
               c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
        for (std::int64_t p = 0; p < k; ++p) {
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
            b += NR;
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

namespace sprint {
namespace gemm {
namespace detail {
const Kernels& kernels_avx2() {
    static const Kernels k{UK::MR, UK::NR, 16, sgemm_isa, conv_fwd_isa, conv_dw_isa};
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
