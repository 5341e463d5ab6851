// Device helpers shared by kernels/*.cu.
//
// These sources are compiled twice: by nvcc (#included from csrc/launch_*.cu)
// and at run time by NVRTC through CuPy RawModule (engine/backend.py inlines
// this header into each kernel file before compiling, so CuPy's cache key sees
// its content). Hence: no host or standard headers, only extern "C" kernels.
//
// Kernel argument convention (RawModule passes numpy scalars by type):
// pointers, i64 (long long) for every integer/flag, float for real scalars.
#pragma once

typedef long long i64;

// Threads per block of the 1-D kernels and the most blocks a launch uses;
// engine/backend.py (RawModule path) and csrc/launch_*.cu use the same rule.
#define SPRINT_BLOCK 256
#define SPRINT_MAX_BLOCKS (1 << 20)

// Index arithmetic (division/modulo) in 64 bits is several times slower on a
// GPU than in 32 bits; kernels run their body with 32-bit indices when every
// index fits (a uniform branch) and with 64-bit ones otherwise. Tests lower
// this bound (-DSPRINT_NARROW_INDEX_MAX=0) to exercise the 64-bit path.
#ifndef SPRINT_NARROW_INDEX_MAX
#define SPRINT_NARROW_INDEX_MAX 0x7fffffffLL
#endif

// a * b for sizes, -1 when either is negative or the product passes 2^59:
// the rule of csrc/sizes.h (size_mul), which the bindings and launchers
// apply first. Kernels form their element counts with it and do nothing on
// -1, so a RawModule caller with unchecked sizes cannot make them wrap.
#define SPRINT_MAX_ELEMS (0x7fffffffffffffffLL / 16)
__device__ __forceinline__ i64 sprint_size_mul(i64 a, i64 b) {
    if (a < 0 || b < 0) return -1;
    if (a == 0 || b == 0) return 0;
    return a > SPRINT_MAX_ELEMS / b ? -1 : a * b;
}

__device__ __forceinline__ i64 sprint_size3(i64 a, i64 b, i64 c) {
    return (a == 0 || b == 0 || c == 0) && a >= 0 && b >= 0 && c >= 0 ? 0
                                                                      : sprint_size_mul(sprint_size_mul(a, b), c);
}

// Grid-stride loop over [0, n) with indices of type I.
#define SPRINT_FOR_T(I, idx, n)                                                         \
    for (I idx = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; idx < (I)(n);         \
         idx += (I)blockDim.x * (I)gridDim.x)

// Grid-stride loop over [0, n) with 64-bit indices.
#define SPRINT_FOR(idx, n)                                                       \
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < (i64)(n); \
         idx += (i64)blockDim.x * gridDim.x)

// Block-wide sum of one float per thread; blockDim.x a power of two <=
// SPRINT_BLOCK (smem has SPRINT_BLOCK floats). Fixed reduction tree:
// deterministic. Result returned to every thread.
__device__ __forceinline__ float sprint_block_sum(float v, float* smem) {
    smem[threadIdx.x] = v;
    __syncthreads();
    for (int s = (int)blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
        __syncthreads();
    }
    return smem[0];
}
