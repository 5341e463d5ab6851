// engine._sprint_cuda: max pooling forward/backward (pointers as ints).
#include "bind.h"
#include "cuda_launch.h"

using namespace sprint;
using namespace sprint::bind;

namespace {
using uptr = std::uintptr_t;

PoolGeom geom(i64 N, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw) {
    check_int(N, "N", 0, kMaxDim);
    check_int(C, "C", 0, kMaxDim);
    PoolGeom g{};
    if (const char* err = pool_geom_make(checked_size("N * C", {N, C}), H, W, kh, kw, sh, sw, ph, pw, &g)) value_error(err);
    return g;
}
}  // namespace

void bind_pool_cuda(py::module_& m) {
    m.def("maxpool_forward", [](uptr x, uptr y, uptr argmax, i64 N, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh,
                                i64 sw, i64 ph, i64 pw, uptr stream) {
        const PoolGeom g = geom(N, C, H, W, kh, kw, sh, sw, ph, pw);
        check_ptr(x, "x"); check_ptr(y, "y"); check_ptr(argmax, "argmax");
        launch_nogil("maxpool_forward", [&] {
            return cuda::maxpool_fwd_f32(dptr<const float>(x), dptr<float>(y), dptr<std::int32_t>(argmax), g, stream);
        });
    }, py::arg("x"), py::arg("y"), py::arg("argmax"), py::arg("N"), py::arg("C"), py::arg("H"), py::arg("W"),
       py::arg("kh"), py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("stream") = 0,
       "y, argmax (N,C,OH,OW) <- max pooling of x (N,C,H,W); argmax int32 = h*W + w");

    m.def("maxpool_backward", [](uptr dy, uptr argmax, uptr dx, i64 N, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh,
                                 i64 sw, i64 ph, i64 pw, uptr stream) {
        const PoolGeom g = geom(N, C, H, W, kh, kw, sh, sw, ph, pw);
        check_ptr(dy, "dy"); check_ptr(argmax, "argmax"); check_ptr(dx, "dx");
        launch_nogil("maxpool_backward", [&] {
            return cuda::maxpool_bwd_f32(dptr<const float>(dy), dptr<const std::int32_t>(argmax), dptr<float>(dx), g,
                                         stream);
        });
    }, py::arg("dy"), py::arg("argmax"), py::arg("dx"), py::arg("N"), py::arg("C"), py::arg("H"), py::arg("W"),
       py::arg("kh"), py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("stream") = 0,
       "dx (N,C,H,W) <- gather of dy over the windows whose argmax is each pixel (deterministic)");
}
