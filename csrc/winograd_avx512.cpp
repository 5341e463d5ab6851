// The Winograd transforms (winograd_simd.h) at 16 lanes, compiled with
// -mavx512f (CMakeLists.txt): one zmm per lane loop. Only called after the
// CPU reported AVX-512F (the Isa the GEMM uses).
#include "winograd_simd.h"

#if defined(__x86_64__) || defined(__i386__)
SPRINT_WINOGRAD_KERNELS(avx512, 16)
#else
SPRINT_WINOGRAD_KERNELS(avx512, 4)
#endif
