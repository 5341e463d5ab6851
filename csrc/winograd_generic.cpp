// The Winograd transforms (winograd_simd.h) at 4 lanes in portable C++: the
// baseline (SSE2 on x86-64) vector or plain scalar code on other targets.
#include "winograd_simd.h"

SPRINT_WINOGRAD_KERNELS(generic, 4)
