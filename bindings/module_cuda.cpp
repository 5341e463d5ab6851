// engine._sprint_cuda: host launchers of the CUDA kernels (csrc/launch_*.cu,
// compiled by nvcc into a static library). This translation unit and the
// bind_<op>_cuda.cpp files contain no CUDA code: device pointers and streams
// arrive as integers (e.g. cupy_array.data.ptr, cupy.cuda.Stream.ptr).
#include "bind.h"
#include "cuda_launch.h"

void sprint::bind::raise_cuda_error(int code, const char* what) {
    if (code != 0)
        throw std::runtime_error(std::string(what) + ": CUDA error " + std::to_string(code) + " (" +
                                 sprint::cuda::error_string(code) + ")");
}

PYBIND11_MODULE(_sprint_cuda, m) {
    m.doc() = "SPRINT engine CUDA launchers: pointers and streams as integers; every launcher "
              "checks its arguments and raises RuntimeError on a CUDA error.";
    m.def("device_count", []() { return sprint::cuda::device_count(); },
          "Number of CUDA devices (0 when there is no driver or no device).");
    m.def("synchronize", []() {
        sprint::bind::raise_cuda_error(sprint::cuda::synchronize(), "synchronize");
    });
    m.attr("kernel_arch") = "sm_90 + compute_90 PTX";

    bind_im2col_cuda(m);
    // ---- K2 op families: add one line each (declared in bind.h) ----
    bind_pool_cuda(m);
    bind_softmax_cuda(m);
    bind_elementwise_cuda(m);
    bind_vector_cuda(m);
    bind_deform_cuda(m);
    // ---- end K2 ----
}
