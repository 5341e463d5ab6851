// Portable micro-kernel (4 x 16 over a 4-float vector written in plain C++:
// the compiler vectorises it for the baseline x86-64 SSE2 or any other
// target) and the driver for it.
#include "gemm_plan.h"
#include "gemm_simd.h"

namespace {

struct VPlain {
    struct reg {
        float v[4];
    };
    static constexpr int L = 4;
    static reg zero() { return reg{{0.f, 0.f, 0.f, 0.f}}; }
    static reg load(const float* p) { return reg{{p[0], p[1], p[2], p[3]}}; }
    static reg bcast(const float* p) { return reg{{*p, *p, *p, *p}}; }
    // a*b + c rounded twice, as the scalar code always did (no fused FMA).
    static reg fma(reg a, reg b, reg c) {
        reg r;
        for (int i = 0; i < L; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
        return r;
    }
    static reg add(reg a, reg b) {
        reg r;
        for (int i = 0; i < L; ++i) r.v[i] = a.v[i] + b.v[i];
        return r;
    }
    static void pin(reg&) {}
    static reg relu(reg a) {
        for (int i = 0; i < L; ++i) a.v[i] = a.v[i] > 0.f ? a.v[i] : 0.f;
        return a;
    }
    static void store(float* p, reg v) {
        for (int i = 0; i < L; ++i) p[i] = v.v[i];
    }
    static reg load_mask(reg acc, const float* x, std::int64_t off, std::uint32_t mask) {
        for (int i = 0; i < L; ++i)
            if (mask >> i & 1u) acc.v[i] = x[off + i];
        return acc;
    }
    static void store_mask(float* x, std::int64_t off, reg v, std::uint32_t mask) {
        for (int i = 0; i < L; ++i)
            if (mask >> i & 1u) x[off + i] = v.v[i];
    }
    static void transpose(const float* x, const std::int64_t* off, std::int64_t q, const std::uint32_t* mask, float* d,
                          std::int64_t ld) {
        transpose_scalar<L>(x, off, q, mask, d, ld);
    }
    template <int MR>
    static void panel(const float* const* s, int n, std::int64_t q, float* d) {
        panel_scalar<L, MR>(s, n, q, d);
    }    static void sum_lanes(const reg* v, int n, float* out) { sum_lanes_scalar<VPlain>(v, n, out); }
};

using UK = MicroKernel<VPlain, 4, 4>;
using DK = TapKernel<VPlain, 4, 4>;  // dW (gemm_dw.h)
using SK = LaneKernel<VPlain, 2, 4>;  // small-K dW (gemm_conv_small.h)

}  // namespace

#include "gemm_driver.h"

SPRINT_GEMM_KERNELS(generic, VPlain, 4)
