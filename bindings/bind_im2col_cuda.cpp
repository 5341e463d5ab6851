// engine._sprint_cuda: im2col family launchers. Pointers/streams are ints.
#include "bind.h"
#include "cuda_launch.h"

using namespace sprint;
using namespace sprint::bind;

namespace {

using uptr = std::uintptr_t;

ConvGeom geom(i64 B, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw) {
    ConvGeom g{check_int(B, "B", 0, kMaxElems), check_int(C, "C", 1, kMaxElems), check_int(H, "H", 1, kMaxElems),
               check_int(W, "W", 1, kMaxElems),
               check_int(kh, "kh", 1), check_int(kw, "kw", 1), check_int(sh, "sh", 1), check_int(sw, "sw", 1),
               check_int(ph, "ph", 0), check_int(pw, "pw", 0), 0, 0};
    if (const char* err = conv_geom_check(g)) value_error(err);
    return g;
}

void check_bmp(i64 B, i64 M, i64 P) {
    check_int(B, "B", 0, kMaxElems);
    check_int(M, "M", 1, kMaxElems);
    check_int(P, "P", 1, kMaxElems);
    checked_size("B*M*P", {B, M, P});
}

}  // namespace

void bind_im2col_cuda(py::module_& m) {
    m.def("im2col", [](uptr x, uptr cols, i64 B, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph,
                       i64 pw, uptr stream) {
        const ConvGeom g = geom(B, C, H, W, kh, kw, sh, sw, ph, pw);
        check_ptr(x, "x");
        check_ptr(cols, "cols");
        py::gil_scoped_release nogil;
        const int e = cuda::im2col_f32(reinterpret_cast<const float*>(x), reinterpret_cast<float*>(cols), g, stream);
        py::gil_scoped_acquire gil;
        raise_cuda_error(e, "im2col");
    }, py::arg("x"), py::arg("cols"), py::arg("B"), py::arg("C"), py::arg("H"), py::arg("W"), py::arg("kh"),
       py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("stream") = 0);

    m.def("col2im", [](uptr cols, uptr x, i64 B, i64 C, i64 H, i64 W, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph,
                       i64 pw, uptr stream) {
        const ConvGeom g = geom(B, C, H, W, kh, kw, sh, sw, ph, pw);
        check_ptr(x, "x");
        check_ptr(cols, "cols");
        py::gil_scoped_release nogil;
        const int e = cuda::col2im_f32(reinterpret_cast<const float*>(cols), reinterpret_cast<float*>(x), g, stream);
        py::gil_scoped_acquire gil;
        raise_cuda_error(e, "col2im");
    }, py::arg("cols"), py::arg("x"), py::arg("B"), py::arg("C"), py::arg("H"), py::arg("W"), py::arg("kh"),
       py::arg("kw"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("stream") = 0);

    m.def("cnhw_to_nchw", [](uptr yt, uptr bias, uptr y, i64 B, i64 M, i64 P, uptr stream) {
        check_bmp(B, M, P);
        check_ptr(yt, "yt");
        check_ptr(y, "y");
        py::gil_scoped_release nogil;
        const int e = cuda::cnhw_to_nchw_f32(reinterpret_cast<const float*>(yt), reinterpret_cast<const float*>(bias),
                                             reinterpret_cast<float*>(y), B, M, P, stream);
        py::gil_scoped_acquire gil;
        raise_cuda_error(e, "cnhw_to_nchw");
    }, py::arg("yt"), py::arg("bias"), py::arg("y"), py::arg("B"), py::arg("M"), py::arg("P"),
       py::arg("stream") = 0, "bias = 0 means no bias.");

    m.def("nchw_to_cnhw", [](uptr y, uptr out, i64 B, i64 M, i64 P, uptr stream) {
        check_bmp(B, M, P);
        check_ptr(y, "y");
        check_ptr(out, "out");
        py::gil_scoped_release nogil;
        const int e = cuda::nchw_to_cnhw_f32(reinterpret_cast<const float*>(y), reinterpret_cast<float*>(out), B, M,
                                             P, stream);
        py::gil_scoped_acquire gil;
        raise_cuda_error(e, "nchw_to_cnhw");
    }, py::arg("y"), py::arg("out"), py::arg("B"), py::arg("M"), py::arg("P"), py::arg("stream") = 0);

    m.def("channel_sum", [](uptr y, uptr db, bool accumulate, i64 B, i64 M, i64 P, uptr stream) {
        check_bmp(B, M, P);
        check_ptr(y, "y");
        check_ptr(db, "db");
        py::gil_scoped_release nogil;
        const int e = cuda::channel_sum_f32(reinterpret_cast<const float*>(y), reinterpret_cast<float*>(db),
                                            accumulate, B, M, P, stream);
        py::gil_scoped_acquire gil;
        raise_cuda_error(e, "channel_sum");
    }, py::arg("y"), py::arg("db"), py::arg("accumulate"), py::arg("B"), py::arg("M"), py::arg("P"),
       py::arg("stream") = 0);

    m.def("add_channel_bias", [](uptr y, uptr bias, i64 B, i64 M, i64 P, uptr stream) {
        check_bmp(B, M, P);
        check_ptr(y, "y");
        check_ptr(bias, "bias");
        py::gil_scoped_release nogil;
        const int e = cuda::add_channel_bias_f32(reinterpret_cast<float*>(y), reinterpret_cast<const float*>(bias), B,
                                                 M, P, stream);
        py::gil_scoped_acquire gil;
        raise_cuda_error(e, "add_channel_bias");
    }, py::arg("y"), py::arg("bias"), py::arg("B"), py::arg("M"), py::arg("P"), py::arg("stream") = 0);
}
