// engine._sprint_cpu: im2col family. Outputs are passed in (written fully).
#include "bind.h"
#include "im2col.h"

using namespace sprint;
using namespace sprint::bind;

namespace {

// Validates x (B,C,H,W) float32 and the window; returns the full geometry.
ConvGeom geom_from(const py::array& x, const char* xname, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw) {
    ConvGeom g{x.shape(0), x.shape(1), x.shape(2), x.shape(3),
               check_int(kh, "kh", 1), check_int(kw, "kw", 1),
               check_int(sh, "sh", 1), check_int(sw, "sw", 1),
               check_int(ph, "ph", 0), check_int(pw, "pw", 0), 0, 0};
    if (const char* err = conv_geom_check(g)) value_error(std::string(err) + " (" + xname + " shape " + shape_str(x) + ")");
    return g;
}

void im2col(py::handle x_, py::handle cols_, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw) {
    py::array x = check_array<float>(x_, "x", 4);
    py::array cols = check_array<float>(cols_, "cols", 2, true);
    const ConvGeom g = geom_from(x, "x", kh, kw, sh, sw, ph, pw);
    check_shape(cols, "cols", {g.K(), g.B * g.P()});
    check_no_overlap(x, "x", cols, "cols");
    const float* xp = cptr<float>(x);
    float* cp = mptr<float>(cols);
    py::gil_scoped_release nogil;
    cpu::im2col(xp, cp, g);
}

void col2im(py::handle cols_, py::handle x_, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw) {
    py::array cols = check_array<float>(cols_, "cols", 2);
    py::array x = check_array<float>(x_, "x", 4, true);
    const ConvGeom g = geom_from(x, "x", kh, kw, sh, sw, ph, pw);
    check_shape(cols, "cols", {g.K(), g.B * g.P()});
    check_no_overlap(x, "x", cols, "cols");
    const float* cp = cptr<float>(cols);
    float* xp = mptr<float>(x);
    py::gil_scoped_release nogil;
    cpu::col2im(cp, xp, g);
}

void cnhw_to_nchw(py::handle yt_, py::object bias_, py::handle y_) {
    py::array y = check_array<float>(y_, "y", 3, true);
    const i64 B = y.shape(0), M = y.shape(1), P = y.shape(2);
    py::array yt = check_array<float>(yt_, "yt", 2);
    check_shape(yt, "yt", {M, checked_size("y batch * plane (B*P)", {B, P})});
    check_no_overlap(yt, "yt", y, "y");
    const float* bp = nullptr;
    py::array bias;
    if (!bias_.is_none()) {
        bias = check_array<float>(bias_, "bias", 1);
        check_shape(bias, "bias", {M});
        check_no_overlap(bias, "bias", y, "y");
        bp = cptr<float>(bias);
    }
    const float* src = cptr<float>(yt);
    float* dst = mptr<float>(y);
    py::gil_scoped_release nogil;
    cpu::cnhw_to_nchw(src, bp, dst, B, M, P);
}

void nchw_to_cnhw(py::handle y_, py::handle out_, py::object db_, bool accumulate) {
    py::array y = check_array<float>(y_, "y", 3);
    const i64 B = y.shape(0), M = y.shape(1), P = y.shape(2);
    py::array out = check_array<float>(out_, "out", 2, true);
    check_shape(out, "out", {M, checked_size("y batch * plane (B*P)", {B, P})});
    check_no_overlap(y, "y", out, "out");
    float* dbp = nullptr;
    py::array db;
    if (!db_.is_none()) {
        db = check_array<float>(db_, "db", 1, true);
        check_shape(db, "db", {M});
        check_no_overlap(db, "db", out, "out");
        check_no_overlap(db, "db", y, "y");
        dbp = mptr<float>(db);
    }
    const float* src = cptr<float>(y);
    float* dst = mptr<float>(out);
    py::gil_scoped_release nogil;
    cpu::nchw_to_cnhw(src, dst, dbp, accumulate, B, M, P);
}

void channel_sum(py::handle y_, py::handle db_, bool accumulate) {
    py::array y = check_array<float>(y_, "y", 3);
    py::array db = check_array<float>(db_, "db", 1, true);
    const i64 B = y.shape(0), M = y.shape(1), P = y.shape(2);
    check_shape(db, "db", {M});
    check_no_overlap(db, "db", y, "y");
    const float* src = cptr<float>(y);
    float* dst = mptr<float>(db);
    py::gil_scoped_release nogil;
    cpu::channel_sum(src, dst, accumulate, B, M, P);
}

void add_channel_bias(py::handle y_, py::handle bias_) {
    py::array y = check_array<float>(y_, "y", 3, true);
    py::array bias = check_array<float>(bias_, "bias", 1);
    const i64 B = y.shape(0), M = y.shape(1), P = y.shape(2);
    check_shape(bias, "bias", {M});
    check_no_overlap(bias, "bias", y, "y");
    const float* bp = cptr<float>(bias);
    float* dst = mptr<float>(y);
    py::gil_scoped_release nogil;
    cpu::add_channel_bias(dst, bp, B, M, P);
}

}  // namespace

void bind_im2col(py::module_& m) {
    m.def("im2col", &im2col, py::arg("x"), py::arg("cols"), py::arg("kh"), py::arg("kw"), py::arg("sh"),
          py::arg("sw"), py::arg("ph"), py::arg("pw"),
          "cols (C*kh*kw, B*OH*OW) <- x (B,C,H,W) float32; row (c,i,j), column (n,oh,ow).");
    m.def("col2im", &col2im, py::arg("cols"), py::arg("x"), py::arg("kh"), py::arg("kw"), py::arg("sh"),
          py::arg("sw"), py::arg("ph"), py::arg("pw"),
          "x (B,C,H,W) <- adjoint of im2col applied to cols (gather, deterministic).");
    m.def("cnhw_to_nchw", &cnhw_to_nchw, py::arg("yt"), py::arg("bias"), py::arg("y"),
          "y (B,M,P) <- yt (M,B*P) transposed + bias (M,) or None.");
    m.def("nchw_to_cnhw", &nchw_to_cnhw, py::arg("y"), py::arg("out"), py::arg("db") = py::none(),
          py::arg("accumulate") = false,
          "out (M,B*P) <- y (B,M,P) transposed; db (M,) or None gets the per-channel sums.");
    m.def("channel_sum", &channel_sum, py::arg("y"), py::arg("db"), py::arg("accumulate") = false,
          "db (M,) (+)= sum of y (B,M,P) over B and P.");
    m.def("add_channel_bias", &add_channel_bias, py::arg("y"), py::arg("bias"),
          "y (B,M,P) += bias (M,) in place.");
}
