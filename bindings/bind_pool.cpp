// engine._sprint_cpu: max pooling forward (with argmax) and backward (gather).
#include "bind.h"
#include "pool.h"

using namespace sprint;
using namespace sprint::bind;

namespace {

// Geometry from an (N, C, H, W) array; errors name the argument.
PoolGeom geom_from(const py::array& x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
    PoolGeom g{};
    // an empty array may have huge dims: 0 planes if any dimension is 0
    const int64_t planes = x.size() == 0 ? 0 : checked_size("x planes (N*C)", {x.shape(0), x.shape(1)});
    if (const char* err = pool_geom_make(planes, x.shape(2), x.shape(3), kh, kw, sh, sw, ph, pw, &g))
        value_error(std::string(err) + " (x shape " + shape_str(x) + ", k=(" + std::to_string(kh) + ", " +
                    std::to_string(kw) + "), stride=(" + std::to_string(sh) + ", " + std::to_string(sw) +
                    "), pad=(" + std::to_string(ph) + ", " + std::to_string(pw) + "))");
    return g;
}

void maxpool_forward(py::handle x_, py::handle y_, py::handle argmax_, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                     int64_t ph, int64_t pw) {
    py::array x = check_array<float>(x_, "x", 4);
    py::array y = check_array<float>(y_, "y", 4, true);
    py::array am = check_array<std::int32_t>(argmax_, "argmax", 4, true);
    const PoolGeom g = geom_from(x, kh, kw, sh, sw, ph, pw);
    check_shape(y, "y", {x.shape(0), x.shape(1), g.OH, g.OW});
    check_shape(am, "argmax", {x.shape(0), x.shape(1), g.OH, g.OW});
    check_no_overlap(x, "x", y, "y");
    check_no_overlap(x, "x", am, "argmax");
    check_no_overlap(y, "y", am, "argmax");
    const float* xp = cptr<float>(x);
    float* yp = mptr<float>(y);
    std::int32_t* ap = mptr<std::int32_t>(am);
    py::gil_scoped_release nogil;
    cpu::maxpool_fwd_f32(xp, yp, ap, g);
}

void maxpool_backward(py::handle dy_, py::handle argmax_, py::handle dx_, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw) {
    py::array dy = check_array<float>(dy_, "dy", 4);
    py::array am = check_array<std::int32_t>(argmax_, "argmax", 4);
    py::array dx = check_array<float>(dx_, "dx", 4, true);
    const PoolGeom g = geom_from(dx, kh, kw, sh, sw, ph, pw);
    check_shape(dy, "dy", {dx.shape(0), dx.shape(1), g.OH, g.OW});
    check_shape(am, "argmax", {dx.shape(0), dx.shape(1), g.OH, g.OW});
    check_no_overlap(dy, "dy", dx, "dx");
    check_no_overlap(am, "argmax", dx, "dx");
    const float* dyp = cptr<float>(dy);
    const std::int32_t* ap = cptr<std::int32_t>(am);
    float* dxp = mptr<float>(dx);
    py::gil_scoped_release nogil;
    cpu::maxpool_bwd_f32(dyp, ap, dxp, g);
}

}  // namespace

void bind_pool(py::module_& m) {
    m.def("maxpool_forward", &maxpool_forward, py::arg("x"), py::arg("y"), py::arg("argmax"), py::arg("kh"),
          py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"),
          "y, argmax (N,C,OH,OW) <- max pooling of x (N,C,H,W); argmax = h*W + w in the plane (int32).");
    m.def("maxpool_backward", &maxpool_backward, py::arg("dy"), py::arg("argmax"), py::arg("dx"), py::arg("kh"),
          py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"),
          "dx (N,C,H,W) <- sum of dy over the windows whose argmax is each pixel (gather, deterministic).");
}
