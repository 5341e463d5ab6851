// AVX-512 micro-kernel (8 x 32: 16 zmm accumulators, two B vectors, one
// broadcast) and the driver instantiated for it. Compiled with -mavx512f
// (CMakeLists.txt); only called after the CPU reported AVX-512F.
#include "gemm_plan.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

namespace {

struct UK {
    static constexpr int MR = 8, NR = 32;
    static void run(std::int64_t k, const float* __restrict a, const float* __restrict b, float* __restrict t) {
        __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
               c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
        for (std::int64_t p = 0; p < k; ++p) {
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
            b += NR;
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

namespace sprint {
namespace gemm {
namespace detail {
const Kernels& kernels_avx512() {
    static const Kernels k{UK::MR, UK::NR, 32, sgemm_isa, conv_fwd_isa, conv_dw_isa};
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
