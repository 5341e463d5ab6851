// Helpers for csrc/launch_*.cu (nvcc only). The grid rule matches
// engine/backend.py's RawModule path so both paths launch identically.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "sizes.h"

namespace sprint {
namespace cuda {

inline cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Blocks for a grid-stride loop over n items (at least 1).
inline unsigned grid_1d(long long n) {
    const long long b = (n + SPRINT_BLOCK - 1) / SPRINT_BLOCK;
    return unsigned(std::max<long long>(1, std::min<long long>(b, SPRINT_MAX_BLOCKS)));
}

// The element count of a launch, the same checked product as the bindings'
// (csrc/sizes.h); launchers refuse a negative one with kBadSize before any
// launch, so a caller that skipped the binding's checks cannot make a kernel
// index past its buffers.
constexpr int kBadSize = int(cudaErrorInvalidValue);

// After a launch: the launch error (configuration, no device...) as int.
inline int launch_status() { return int(cudaGetLastError()); }

}  // namespace cuda
}  // namespace sprint
