// Size arithmetic shared by the geometry checks (csrc/*.h), the CPU and CUDA
// bindings (bindings/bind.h wraps it to raise ValueError) and the CUDA
// launchers. Plain C++, no headers beyond <cstdint>: nvcc compiles it too.
//
// Every element count, index extent or scratch size is formed here, never by
// a bare multiplication: an int64 product of attacker-sized dimensions wraps
// silently, and a wrapped (small or negative) size then passes a shape check
// and the kernel writes past its buffer.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace sprint {

// Most elements any buffer may hold: its byte count (up to 8-byte elements,
// plus index arithmetic of a few such offsets) stays far inside int64.
constexpr std::int64_t kMaxElems = INT64_MAX / 16;

// Largest value accepted for one geometry parameter (kernel size, stride,
// pad, output size...).
constexpr std::int64_t kMaxDim = std::int64_t(1) << 31;

// a * b for sizes, or -1 when either is negative or the product exceeds
// kMaxElems. -1 propagates through chained calls.
inline std::int64_t size_mul(std::int64_t a, std::int64_t b) {
    if (a < 0 || b < 0) return -1;
    if (a == 0 || b == 0) return 0;
    return a > kMaxElems / b ? -1 : a * b;
}

// The element count of a shape, or -1 as size_mul. A zero dimension makes
// the count 0 whatever the others are (an empty array may have huge dims),
// but a negative one is always -1.
inline std::int64_t size_product(std::initializer_list<std::int64_t> dims) {
    for (auto d : dims)
        if (d < 0) return -1;
    for (auto d : dims)
        if (d == 0) return 0;
    std::int64_t p = 1;
    for (auto d : dims) p = size_mul(p, d);
    return p;
}

}  // namespace sprint
