// engine._sprint_cpu: vector ops on flat float32 buffers, in place.
#include <vector>

#include "bind.h"
#include "vector.h"

using namespace sprint;
using namespace sprint::bind;

namespace {

py::array flat(py::handle a, const char* name, bool writable) {
    return check_array<float>(a, name, 1, writable);
}

void same_len(const py::array& a, const char* an, const py::array& b, const char* bn) {
    if (a.shape(0) != b.shape(0))
        value_error(std::string(bn) + " must have the length of " + an + " (" +
                    std::to_string(a.shape(0)) + "), got " + std::to_string(b.shape(0)));
}


void axpy(double alpha, py::handle x_, py::handle y_) {
    const float a = finite_f32(alpha, "alpha");
    py::array x = flat(x_, "x", false), y = flat(y_, "y", true);
    same_len(x, "x", y, "y");
    check_no_overlap(x, "x", y, "y");
    const float* xp = cptr<float>(x);
    float* yp = mptr<float>(y);
    py::gil_scoped_release nogil;
    cpu::axpy_f32(yp, xp, a, y.shape(0));
}

void scale(double alpha, py::handle x_) {
    const float a = finite_f32(alpha, "alpha");
    py::array x = flat(x_, "x", true);
    float* xp = mptr<float>(x);
    py::gil_scoped_release nogil;
    cpu::scale_f32(xp, a, x.shape(0));
}

void sum_into(py::handle out_, py::sequence bufs_) {
    py::array out = flat(out_, "out", true);
    if (py::len(bufs_) == 0) value_error("bufs must hold at least one buffer");
    std::vector<py::array> keep;  // holds references while the GIL is released
    std::vector<const float*> ptrs;
    for (size_t i = 0; i < py::len(bufs_); ++i) {
        const std::string name = "bufs[" + std::to_string(i) + "]";
        keep.push_back(flat(bufs_[i], name.c_str(), false));
        same_len(out, "out", keep.back(), name.c_str());
        if (i > 0 || keep.back().data() != out.data())  // out may be bufs[0] itself
            check_no_overlap(out, "out", keep.back(), name.c_str());
        ptrs.push_back(cptr<float>(keep.back()));
    }
    float* op = mptr<float>(out);
    const int64_t n = out.shape(0);
    py::gil_scoped_release nogil;
    cpu::sum_into_f32(op, ptrs.data(), int(ptrs.size()), n);
}

void momentum_step(py::handle w_, py::handle delta_, py::handle upd_, double nu) {
    const float nu_f = finite_f32(nu, "nu");
    py::array w = flat(w_, "w", true), delta = flat(delta_, "delta", true), upd = flat(upd_, "upd", false);
    same_len(w, "w", delta, "delta");
    same_len(w, "w", upd, "upd");
    check_no_overlap(w, "w", delta, "delta");
    check_no_overlap(w, "w", upd, "upd");
    check_no_overlap(delta, "delta", upd, "upd");
    float* wp = mptr<float>(w);
    float* dp = mptr<float>(delta);
    const float* up = cptr<float>(upd);
    py::gil_scoped_release nogil;
    cpu::momentum_step_f32(wp, dp, up, nu_f, w.shape(0));
}

void sgd_update(py::handle w_, py::handle v_, py::handle g_, double lr, double momentum, double wd) {
    const float lr_f = finite_f32(lr, "lr"), mom_f = finite_f32(momentum, "momentum"), wd_f = finite_f32(wd, "weight_decay");
    py::array w = flat(w_, "w", true), v = flat(v_, "v", true), g = flat(g_, "g", false);
    same_len(w, "w", v, "v");
    same_len(w, "w", g, "g");
    check_no_overlap(w, "w", v, "v");
    check_no_overlap(w, "w", g, "g");
    check_no_overlap(v, "v", g, "g");
    float* wp = mptr<float>(w);
    float* vp = mptr<float>(v);
    const float* gp = cptr<float>(g);
    py::gil_scoped_release nogil;
    cpu::sgd_update_f32(wp, vp, gp, lr_f, mom_f, wd_f, w.shape(0));
}

}  // namespace

void bind_vector(py::module_& m) {
    m.def("axpy", &axpy, py::arg("alpha"), py::arg("x"), py::arg("y"), "y += alpha * x (1-D float32).");
    m.def("scale", &scale, py::arg("alpha"), py::arg("x"), "x *= alpha (1-D float32).");
    m.def("sum_into", &sum_into, py::arg("out"), py::arg("bufs"),
          "out = bufs[0] + bufs[1] + ... summed left to right (out may be bufs[0]).");
    m.def("momentum_step", &momentum_step, py::arg("w"), py::arg("delta"), py::arg("upd"), py::arg("nu"),
          "delta = nu * delta + upd; w += delta.");
    m.def("sgd_update", &sgd_update, py::arg("w"), py::arg("v"), py::arg("g"), py::arg("lr"),
          py::arg("momentum"), py::arg("weight_decay"),
          "v = momentum * v - lr * (g + weight_decay * w); w += v.");
}
