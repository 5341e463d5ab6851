// Helpers for csrc/launch_*.cu (nvcc only). The grid rule matches
// engine/backend.py's RawModule path so both paths launch identically.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common.cuh"

namespace sprint {
namespace cuda {

inline cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Blocks for a grid-stride loop over n items (at least 1).
inline unsigned grid_1d(long long n) {
    const long long b = (n + SPRINT_BLOCK - 1) / SPRINT_BLOCK;
    return unsigned(std::max<long long>(1, std::min<long long>(b, SPRINT_MAX_BLOCKS)));
}

// After a launch: the launch error (configuration, no device...) as int.
inline int launch_status() { return int(cudaGetLastError()); }

}  // namespace cuda
}  // namespace sprint
