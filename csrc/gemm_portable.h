// Internal: the portable units' shared helpers (gemm.cpp: the SGEMM, its
// plan and scratch; gemm_conv.cpp: the convolutions on it). Never included by
// an ISA unit (see gemm_plan.h).
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>

#include "gemm_plan.h"

namespace sprint {
namespace gemm {
namespace detail {

inline i64 clamp(i64 v, i64 lo, i64 hi) { return v < lo ? lo : v > hi ? hi : v; }
inline i64 cdiv(i64 a, i64 b) { return (a + b - 1) / b; }

constexpr i64 kMaxElems = i64(1) << 40;  // any matrix beyond this is refused before any arithmetic

inline bool mul_ok(i64 a, i64 b, i64& out) {
    if (a < 0 || b < 0) return false;
    if (b != 0 && a > kMaxElems / b) return false;
    out = a * b;
    return true;
}

// Scratch: packing buffers per OpenMP thread. Kept
// per calling thread and only grown: a fresh allocation per call would pay
// page faults and zero-filling on every GEMM. Nothing reads it unwritten.
struct Scratch {
    std::unique_ptr<float[]> mem;
    i64 cap = 0;
    float* aligned(i64 n) {
        if (n + 16 > cap) {
            mem.reset();
            mem.reset(new float[size_t(n) + 16]);
            cap = n + 16;
        }
        const auto addr = reinterpret_cast<std::uintptr_t>(mem.get());
        return mem.get() + ((64 - addr % 64) % 64) / sizeof(float);
    }
    // aligned(n), or nullptr when the allocation fails (sizes too large)
    float* try_aligned(i64 n) noexcept {
        try {
            return aligned(n);
        } catch (const std::bad_alloc&) {
        } catch (const std::length_error&) {
        }
        return nullptr;
    }
};
extern thread_local Scratch t_arena;  // the GEMM plans' scratch (gemm.cpp)

// Drops a calling thread's scratch after a call that grew it past 64 MiB
// (an odd huge GEMM must not pin its buffers for the life of the thread).
struct TrimScratch {
    Scratch& s = t_arena;
    ~TrimScratch() {
        if (s.cap > (i64(1) << 24)) s.mem.reset(), s.cap = 0;
    }
};

extern const char* const kAlloc;

// The kernels of an ISA, and its cache blocking (read once).
const Kernels& kernels(Isa isa);
const Blocking& blocking_cached(Isa isa);
// The thread grid and scratch sizes of an m x n x k GEMM (gemm.cpp).
Plan plan(const Kernels& kr, const Blocking& bl, i64 m, i64 n, i64 k);
// Allocates the plan's scratch; false on overflow or allocation failure.
bool allocate(Plan& p, Scratch& arena);

}  // namespace detail
}  // namespace gemm
}  // namespace sprint
