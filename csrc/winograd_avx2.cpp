// The Winograd transforms (winograd_simd.h) at 8 lanes, compiled with
// -mavx2 -mfma (CMakeLists.txt): one ymm per lane loop.
#include "winograd_simd.h"

#if defined(__x86_64__) || defined(__i386__)
SPRINT_WINOGRAD_KERNELS(avx2, 8)
#else
SPRINT_WINOGRAD_KERNELS(avx2, 4)
#endif
