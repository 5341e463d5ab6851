// Portable micro-kernel (4 x 16, plain C++: the compiler vectorises it for
// the baseline x86-64 SSE2 or any other target) and the driver for it.
#include "gemm_plan.h"

namespace {

struct UK {
    static constexpr int MR = 4, NR = 16;
    static void run(std::int64_t k, const float* __restrict a, const float* const* __restrict brow,
                    float* __restrict t) {
        float c[MR][NR] = {};
        for (std::int64_t p = 0; p < k; ++p) {
            const float* b = brow[p];
            for (int r = 0; r < MR; ++r) {
                const float av = a[r];
                for (int j = 0; j < NR; ++j) c[r][j] += av * b[j];
            }
            a += MR;
        }
        for (int r = 0; r < MR; ++r)
            for (int j = 0; j < NR; ++j) t[r * NR + j] = c[r][j];
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
        float a[12][4];
        for (int r = 0; r < 12; ++r)
            for (int l = 0; l < 4; ++l) a[r][l] = 1.f + omp_get_thread_num() + 1e-3f * (4 * r + l);
        for (std::int64_t i = 0; i < iters; ++i)
            for (auto& r : a)
                for (float& v : r) v = v * 0.999999f + 1e-7f;
        float t = 0;
        for (auto& r : a)
            for (float v : r) t += v;
        g_fma_sink = t;
        flops += double(iters) * 12 * 4 * 2;
    }
    return flops;
}
}  // namespace

namespace sprint {
namespace gemm {
namespace detail {
const Kernels& kernels_generic() {
    static const Kernels k{UK::MR, UK::NR, 4, fma_peak_isa, sgemm_isa, conv_fwd_isa, conv_dw_isa};
    return k;
}
}  // namespace detail
}  // namespace gemm
}  // namespace sprint
