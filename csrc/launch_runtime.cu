// Runtime helpers exposed by engine._sprint_cuda.
#include "cuda_launch.h"
#include "launch_util.cuh"

namespace sprint {
namespace cuda {

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver/device" error
        return 0;
    }
    return n;
}

int synchronize() { return int(cudaDeviceSynchronize()); }

const char* error_string(int code) { return cudaGetErrorString(cudaError_t(code)); }

}  // namespace cuda
}  // namespace sprint
