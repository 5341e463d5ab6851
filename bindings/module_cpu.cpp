// engine._sprint_cpu: the C++ CPU kernels (csrc/*.cpp). One bind_<op>() per
// op family, defined in bindings/bind_<op>.cpp and declared in bind.h.
#include <omp.h>

#include "bind.h"

PYBIND11_MODULE(_sprint_cpu, m) {
    m.doc() = "SPRINT engine CPU kernels (C++17, OpenMP). Arrays are numpy, float32, C-contiguous; "
              "outputs are passed in and written fully.";
    m.def("get_num_threads", []() { return omp_get_max_threads(); }, "OpenMP threads used by the kernels.");
    m.def("set_num_threads", [](int n) {
        sprint::bind::check_int(n, "n", 1, 4096);
        omp_set_num_threads(n);
    }, py::arg("n"));

    bind_im2col(m);
    // ---- K2 op families: add one line each (declared in bind.h) ----
    bind_pool(m);
    bind_softmax(m);
    bind_elementwise(m);
    bind_vector(m);
    bind_deform(m);
    // ---- end K2 ----
    bind_gemm(m);
    bind_winograd(m);
}
