// engine._sprint_cuda: DeformImage (pointers as ints; params validated by the caller).
#include "bind.h"
#include "cuda_launch.h"

using namespace sprint;
using namespace sprint::bind;

namespace {
using uptr = std::uintptr_t;
}  // namespace

void bind_deform_cuda(py::module_& m) {
    m.def("deform", [](uptr x, bool x_uint8, uptr params, uptr mean, uptr stdv, uptr out, i64 N, i64 C, i64 H, i64 W,
                       i64 OH, i64 OW, uptr stream) {
        DeformGeom g{};
        if (const char* err = deform_geom_make(N, C, H, W, OH, OW, &g)) value_error(err);
        check_ptr(x, "x"); check_ptr(params, "params"); check_ptr(mean, "mean"); check_ptr(stdv, "std");
        check_ptr(out, "out");
        launch_nogil("deform", [&] {
            return x_uint8 ? cuda::deform_u8(dptr<const std::uint8_t>(x), dptr<const float>(params),
                                             dptr<const float>(mean), dptr<const float>(stdv), dptr<float>(out), g,
                                             stream)
                           : cuda::deform_f32(dptr<const float>(x), dptr<const float>(params),
                                              dptr<const float>(mean), dptr<const float>(stdv), dptr<float>(out), g,
                                              stream);
        });
    }, py::arg("x"), py::arg("x_uint8"), py::arg("params"), py::arg("mean"), py::arg("std"), py::arg("out"),
       py::arg("N"), py::arg("C"), py::arg("H"), py::arg("W"), py::arg("OH"), py::arg("OW"), py::arg("stream") = 0,
       "out (N,C,OH,OW) float32 <- deform of x (N,C,H,W) uint8 (x_uint8) or float32 by params (N,4)");
}
