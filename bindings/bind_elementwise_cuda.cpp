// engine._sprint_cuda: ReLU forward/backward and fused bias + ReLU (pointers as ints).
#include "bind.h"
#include "cuda_launch.h"

using namespace sprint;
using namespace sprint::bind;

namespace {
using uptr = std::uintptr_t;
constexpr int64_t kMaxN = kMaxElems;
}  // namespace

void bind_elementwise_cuda(py::module_& m) {
    m.def("relu_forward", [](uptr x, uptr out, i64 n, uptr stream) {
        check_ptr(x, "x"); check_ptr(out, "out"); check_int(n, "n", 0, kMaxN);
        launch_nogil("relu_forward", [&] { return cuda::relu_fwd_f32(dptr<const float>(x), dptr<float>(out), n, stream); });
    }, py::arg("x"), py::arg("out"), py::arg("n"), py::arg("stream") = 0, "out = max(x, 0); out may be x");

    m.def("relu_backward", [](uptr y, uptr dy, uptr out, i64 n, uptr stream) {
        check_ptr(y, "y"); check_ptr(dy, "dy"); check_ptr(out, "out"); check_int(n, "n", 0, kMaxN);
        launch_nogil("relu_backward", [&] {
            return cuda::relu_bwd_f32(dptr<const float>(y), dptr<const float>(dy), dptr<float>(out), n, stream);
        });
    }, py::arg("y"), py::arg("dy"), py::arg("out"), py::arg("n"), py::arg("stream") = 0, "out = dy where y > 0 else 0");

    m.def("bias_act", [](uptr x, uptr b, uptr out, i64 outer, i64 channels, i64 inner, bool relu, uptr stream) {
        check_ptr(x, "x"); check_ptr(b, "b"); check_ptr(out, "out");
        check_int(outer, "outer", 0, kMaxDim);
        check_int(channels, "channels", 1, kMaxDim);
        check_int(inner, "inner", 1, kMaxDim);
        checked_size("outer * channels * inner", {outer, channels, inner});
        launch_nogil("bias_act", [&] {
            return cuda::bias_act_f32(dptr<const float>(x), dptr<const float>(b), dptr<float>(out), outer, channels,
                                      inner, relu, stream);
        });
    }, py::arg("x"), py::arg("b"), py::arg("out"), py::arg("outer"), py::arg("channels"), py::arg("inner"),
       py::arg("relu") = true, py::arg("stream") = 0,
       "out = x + b[c] (x viewed as (outer, channels, inner)), then ReLU if relu; out may be x");
}
