// engine._sprint_cpu: DeformImage (scale, crop offset, flip, bilinear, normalise).
#include <cmath>

#include "bind.h"
#include "deform.h"

using namespace sprint;
using namespace sprint::bind;

namespace {

void check_params(const py::array& params) {
    const float* p = cptr<float>(params);
    for (py::ssize_t n = 0; n < params.shape(0); ++n) {
        const float* r = p + 4 * n;
        if (!(std::isfinite(r[0]) && r[0] > 0.0f))
            value_error("params[" + std::to_string(n) + ", 0] (scale) must be finite and > 0, got " + std::to_string(r[0]));
        for (int j = 1; j < 4; ++j)
            if (!std::isfinite(r[j]))
                value_error("params[" + std::to_string(n) + ", " + std::to_string(j) + "] must be finite");
    }
}

void check_stats(const py::array& mean, const py::array& stdv) {
    const float* m = cptr<float>(mean);
    const float* s = cptr<float>(stdv);
    for (py::ssize_t c = 0; c < mean.shape(0); ++c) {
        if (!std::isfinite(m[c])) value_error("mean[" + std::to_string(c) + "] must be finite");
        if (!(std::isfinite(s[c]) && s[c] > 0.0f)) value_error("std[" + std::to_string(c) + "] must be finite and > 0");
    }
}

void deform(py::handle x_, py::handle params_, py::handle mean_, py::handle std_, py::handle out_) {
    if (!py::isinstance<py::array>(x_)) type_error("x must be a numpy array");
    const bool u8 = dtype_is<uint8_t>(py::reinterpret_borrow<py::array>(x_));
    py::array x = u8 ? check_array<uint8_t>(x_, "x", 4) : check_array<float>(x_, "x", 4);
    py::array params = check_array<float>(params_, "params", 2);
    py::array mean = check_array<float>(mean_, "mean", 1);
    py::array stdv = check_array<float>(std_, "std", 1);
    py::array out = check_array<float>(out_, "out", 4, true);
    const int64_t N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
    const int64_t OH = out.shape(2), OW = out.shape(3);
    DeformGeom g{};
    if (const char* err = deform_geom_make(N, C, H, W, OH, OW, &g))
        value_error(std::string(err) + " (x shape " + shape_str(x) + ", out shape " + shape_str(out) + ")");
    check_shape(out, "out", {N, C, OH, OW});
    check_shape(params, "params", {N, 4});
    check_shape(mean, "mean", {C});
    check_shape(stdv, "std", {C});
    check_no_overlap(x, "x", out, "out");
    check_no_overlap(params, "params", out, "out");
    check_no_overlap(mean, "mean", out, "out");
    check_no_overlap(stdv, "std", out, "out");
    check_params(params);
    check_stats(mean, stdv);
    const float* pp = cptr<float>(params);
    const float* mp = cptr<float>(mean);
    const float* sp = cptr<float>(stdv);
    float* op = mptr<float>(out);
    const void* xp = x.data();
    py::gil_scoped_release nogil;
    if (u8) cpu::deform(static_cast<const uint8_t*>(xp), pp, mp, sp, op, g);
    else cpu::deform(static_cast<const float*>(xp), pp, mp, sp, op, g);
}

}  // namespace

void bind_deform(py::module_& m) {
    m.def("deform", &deform, py::arg("x"), py::arg("params"), py::arg("mean"), py::arg("std"), py::arg("out"),
          "out (N,C,OH,OW) float32 <- x (N,C,H,W) uint8|float32 sampled at the affine map of "
          "params (N,4) = [scale, dy, dx, flip], bilinear, zero outside, (v[/255] - mean[c]) / std[c].");
}
