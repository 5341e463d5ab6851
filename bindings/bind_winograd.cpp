// engine._sprint_cpu: the Winograd convolution F(m x m, 3 x 3) for 3x3
// stride-1 layers (csrc/winograd.h). `isa` = "" uses $SPRINT_CPU_ISA, then
// the best the CPU has (the SGEMM's selection). The workspace is the
// caller's (engine/ops/conv_winograd.py takes it from the backend's
// workspace, under its limit): conv2d_winograd_workspace says how much.
#include "bind_isa.h"
#include "winograd.h"

using namespace sprint;
using namespace sprint::bind;
namespace W = sprint::winograd;
using W::i64;

namespace {

i64 tile_of(i64 tile) {
    if (tile != 2 && tile != 4) value_error("tile must be 2 or 4, got " + std::to_string(tile));
    return tile;
}

// The geometry of a 3x3 stride-1 layer over input (B, C, H, W) with M filters.
W::Conv geom(i64 B, i64 C, i64 H, i64 Wd, i64 M, i64 ph, i64 pw) {
    W::Conv g{check_int(B, "B", 1), check_int(C, "C", 1), check_int(H, "H", 1), check_int(Wd, "W", 1),
              check_int(M, "M", 1), 3, 3, 1, 1, check_int(ph, "ph", 0, 2), check_int(pw, "pw", 0, 2), 0, 0};
    if (g.H + 2 * g.ph < 3 || g.W + 2 * g.pw < 3) value_error("w: kernel larger than the padded input");
    g.OH = g.H + 2 * g.ph - 2;
    g.OW = g.W + 2 * g.pw - 2;
    return g;
}

// x (B, C, H, W), w (M, C, 3, 3), the workspace; their geometry.
W::Conv checked(const py::array& x, const py::array& w, const py::array& ws, i64 ph, i64 pw) {
    const W::Conv g = geom(x.shape(0), x.shape(1), x.shape(2), x.shape(3), w.shape(0), ph, pw);
    check_shape(w, "w", {g.M, g.C, 3, 3});
    check_no_overlap(ws, "workspace", x, "x");
    check_no_overlap(ws, "workspace", w, "w");
    return g;
}

void forward(py::handle x_, py::handle w_, py::object bias_, py::handle y_, i64 ph, i64 pw, bool relu, i64 tile,
             py::handle ws_, const std::string& isa) {
    py::array x = check_array<float>(x_, "x", 4), w = check_array<float>(w_, "w", 4);
    py::array y = check_array<float>(y_, "y", 4, true), ws = check_array<float>(ws_, "workspace", 1, true);
    const W::Conv g = checked(x, w, ws, ph, pw);
    const int m = int(tile_of(tile));
    check_shape(y, "y", {g.B, g.M, g.OH, g.OW});
    for (auto* in : {&x, &w, &ws}) check_no_overlap(y, "y", *in, "another argument");
    py::array bias;
    const float* bp = optional_bias(bias_, g.M, y, bias);
    if (bp) check_no_overlap(ws, "workspace", bias, "bias");
    const gemm::Isa i = pick_isa(isa);
    const float *xp = cptr<float>(x), *wp = cptr<float>(w);
    float *yp = mptr<float>(y), *wsp = mptr<float>(ws);
    const i64 n = ws.shape(0);
    call_nogil([&] { return W::conv_forward(i, m, g, xp, wp, bp, relu, yp, wsp, n); });
}

void backward_x(py::handle w_, py::handle dy_, py::handle dx_, i64 ph, i64 pw, i64 tile, py::handle ws_,
                const std::string& isa) {
    py::array w = check_array<float>(w_, "w", 4), dy = check_array<float>(dy_, "dy", 4);
    py::array dx = check_array<float>(dx_, "dx", 4, true), ws = check_array<float>(ws_, "workspace", 1, true);
    const W::Conv g = checked(dx, w, ws, ph, pw);
    const int m = int(tile_of(tile));
    check_shape(dy, "dy", {g.B, g.M, g.OH, g.OW});
    for (auto* in : {&w, &dy, &ws}) check_no_overlap(dx, "dx", *in, "another argument");
    check_no_overlap(ws, "workspace", dy, "dy");
    const gemm::Isa i = pick_isa(isa);
    const float *wp = cptr<float>(w), *dyp = cptr<float>(dy);
    float *dxp = mptr<float>(dx), *wsp = mptr<float>(ws);
    const i64 n = ws.shape(0);
    call_nogil([&] { return W::conv_backward_x(i, m, g, wp, dyp, dxp, wsp, n); });
}

}  // namespace

void bind_winograd(py::module_& m) {
    m.def("conv2d_winograd_workspace", [](i64 B, i64 C, i64 H, i64 Wd, i64 M, i64 ph, i64 pw, i64 tile, bool dx) {
        const W::Conv g = geom(B, C, H, Wd, M, ph, pw);
        const int t = int(tile_of(tile));
        return dx ? W::dx_workspace_floats(g, t) : W::workspace_floats(g, t);
    }, py::arg("B"), py::arg("C"), py::arg("H"), py::arg("W"), py::arg("M"), py::arg("ph"), py::arg("pw"),
          py::arg("tile"), py::arg("dx"),
          "Floats of workspace the Winograd forward (or, dx, the dX) of a 3x3 stride-1 layer needs with the "
          "running thread count; 0 when its sizes overflow.");
    m.def("conv2d_winograd_forward", &forward, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("y"),
          py::arg("ph"), py::arg("pw"), py::arg("relu"), py::arg("tile"), py::arg("workspace"), py::arg("isa") = "",
          "y = conv(x, w) + bias [ReLU] for a 3x3 stride-1 layer: Winograd F(tile x tile, 3x3).");
    m.def("conv2d_winograd_backward_x", &backward_x, py::arg("w"), py::arg("dy"), py::arg("dx"), py::arg("ph"),
          py::arg("pw"), py::arg("tile"), py::arg("workspace"), py::arg("isa") = "",
          "dx of a 3x3 stride-1 layer: the Winograd convolution of dy with the flipped, transposed filters.");
}
