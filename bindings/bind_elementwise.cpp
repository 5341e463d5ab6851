// engine._sprint_cpu: ReLU forward/backward and the fused bias-add + ReLU.
#include "bind.h"
#include "elementwise.h"

using namespace sprint;
using namespace sprint::bind;

namespace {

// Any-rank float32 arrays of the same shape as `ref`.
void same_shape(const py::array& ref, const char* rn, const py::array& a, const char* an) {
    bool ok = a.ndim() == ref.ndim();
    for (py::ssize_t i = 0; ok && i < a.ndim(); ++i) ok = a.shape(i) == ref.shape(i);
    if (!ok) value_error(std::string(an) + " must have the shape of " + rn + " " + shape_str(ref) + ", got " + shape_str(a));
}

// out may be the input itself (in place) but must not partially overlap it.
void same_or_disjoint(const py::array& a, const char* an, const py::array& b, const char* bn) {
    if (a.data() != b.data()) check_no_overlap(a, an, b, bn);
}

void relu_forward(py::handle x_, py::handle y_) {
    py::array x = check_array<float>(x_, "x"), y = check_array<float>(y_, "out", -1, true);
    same_shape(x, "x", y, "out");
    same_or_disjoint(x, "x", y, "out");
    const float* xp = cptr<float>(x);
    float* yp = mptr<float>(y);
    py::gil_scoped_release nogil;
    cpu::relu_fwd_f32(xp, yp, x.size());
}

void relu_backward(py::handle y_, py::handle dy_, py::handle dx_) {
    py::array y = check_array<float>(y_, "y"), dy = check_array<float>(dy_, "dy");
    py::array dx = check_array<float>(dx_, "out", -1, true);
    same_shape(y, "y", dy, "dy");
    same_shape(y, "y", dx, "out");
    same_or_disjoint(dy, "dy", dx, "out");
    same_or_disjoint(y, "y", dx, "out");
    const float* yp = cptr<float>(y);
    const float* dyp = cptr<float>(dy);
    float* dxp = mptr<float>(dx);
    py::gil_scoped_release nogil;
    cpu::relu_bwd_f32(yp, dyp, dxp, y.size());
}

void bias_act(py::handle x_, py::handle b_, py::handle y_, bool relu) {
    py::array x = check_array<float>(x_, "x"), b = check_array<float>(b_, "b", 1);
    py::array y = check_array<float>(y_, "out", -1, true);
    if (x.ndim() < 2) value_error("x must be at least 2-D (N, C, ...), got shape " + shape_str(x));
    same_shape(x, "x", y, "out");
    check_shape(b, "b", {x.shape(1)});
    same_or_disjoint(x, "x", y, "out");
    check_no_overlap(b, "b", y, "out");
    const int channels = int(check_int(x.shape(1), "x channels", 0, INT32_MAX));
    if (x.size() == 0) return;  // dims of an empty array may be huge: no products
    int64_t inner = 1;
    for (py::ssize_t i = 2; i < x.ndim(); ++i) inner *= x.shape(i);
    const int64_t outer = x.shape(0);
    const float* xp = cptr<float>(x);
    const float* bp = cptr<float>(b);
    float* yp = mptr<float>(y);
    py::gil_scoped_release nogil;
    cpu::bias_act_f32(xp, bp, yp, outer, channels, inner, relu);
}

}  // namespace

void bind_elementwise(py::module_& m) {
    m.def("relu_forward", &relu_forward, py::arg("x"), py::arg("out"),
          "out = max(x, 0), any shape float32; out may be x (NaN propagates).");
    m.def("relu_backward", &relu_backward, py::arg("y"), py::arg("dy"), py::arg("out"),
          "out = dy where y > 0 else 0.");
    m.def("bias_act", &bias_act, py::arg("x"), py::arg("b"), py::arg("out"), py::arg("relu") = true,
          "out = x + b[channel] (channel = axis 1), then ReLU if relu; out may be x.");
}
