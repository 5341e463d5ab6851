// engine._sprint_cpu: the engine's SGEMM and the implicit-GEMM convolution
// (csrc/gemm.h). `isa` = "" uses $SPRINT_CPU_ISA, then the best the CPU has.
#include "bind_isa.h"
#include "gemm.h"

#include <utility>

using namespace sprint;
using namespace sprint::bind;
namespace G = sprint::gemm;
using G::i64;

namespace {

void sgemm(py::handle a_, py::handle b_, py::handle c_, bool trans_a, bool trans_b, double alpha, double beta,
           const std::string& isa) {
    py::array a = check_array<float>(a_, "a", 2);
    py::array b = check_array<float>(b_, "b", 2);
    py::array c = check_array<float>(c_, "out", 2, true);
    const i64 m = trans_a ? a.shape(1) : a.shape(0), k = trans_a ? a.shape(0) : a.shape(1);
    const i64 kb = trans_b ? b.shape(1) : b.shape(0), n = trans_b ? b.shape(0) : b.shape(1);
    if (k != kb)
        value_error("b: inner dimensions differ: op(a) is " + std::to_string(m) + "x" + std::to_string(k) +
                    ", op(b) is " + std::to_string(kb) + "x" + std::to_string(n));
    check_shape(c, "out", {m, n});
    check_no_overlap(c, "out", a, "a");
    check_no_overlap(c, "out", b, "b");
    const float al = finite_f32(alpha, "alpha"), be = finite_f32(beta, "beta");
    const G::Isa i = pick_isa(isa);
    const float *ap = cptr<float>(a), *bp = cptr<float>(b);
    float* cp = mptr<float>(c);
    const i64 lda = a.shape(1), ldb = b.shape(1);
    call_nogil([&] { return G::sgemm(i, trans_a, trans_b, m, n, k, al, ap, lda, bp, ldb, be, cp, n); });
}

G::Conv conv_geom(const py::array& x, i64 M, i64 kh, i64 kw, i64 sh, i64 sw, i64 ph, i64 pw) {
    G::Conv g{x.shape(0), x.shape(1), x.shape(2), x.shape(3), check_int(M, "M", 1), check_int(kh, "kh", 1),
              check_int(kw, "kw", 1), check_int(sh, "sh", 1), check_int(sw, "sw", 1), check_int(ph, "ph", 0),
              check_int(pw, "pw", 0), 0, 0};
    if (g.C < 1 || g.H < 1 || g.W < 1) value_error("x must have C, H, W >= 1, got shape " + shape_str(x));
    if (g.H + 2 * g.ph < g.kh || g.W + 2 * g.pw < g.kw)
        value_error("w: kernel larger than the padded input (x shape " + shape_str(x) + ")");
    g.OH = (g.H + 2 * g.ph - g.kh) / g.sh + 1;
    g.OW = (g.W + 2 * g.pw - g.kw) / g.sw + 1;
    return g;
}

// x (B, C, H, W) and w (M, C, kh, kw) checked, and their geometry.
struct ConvArgs {
    py::array x, w;
    G::Conv g;
};
ConvArgs conv_args(py::handle x_, py::handle w_, i64 sh, i64 sw, i64 ph, i64 pw) {
    py::array x = check_array<float>(x_, "x", 4);
    py::array w = check_array<float>(w_, "w", 4);
    const G::Conv g = conv_geom(x, w.shape(0), w.shape(2), w.shape(3), sh, sw, ph, pw);
    check_shape(w, "w", {g.M, g.C, g.kh, g.kw});
    return {x, w, g};
}

void conv_forward(py::handle x_, py::handle w_, py::object bias_, py::handle y_, i64 sh, i64 sw, i64 ph, i64 pw,
                  bool relu, const std::string& isa) {
    auto [x, w, g] = conv_args(x_, w_, sh, sw, ph, pw);
    py::array y = check_array<float>(y_, "y", 4, true);
    check_shape(y, "y", {g.B, g.M, g.OH, g.OW});
    check_no_overlap(y, "y", x, "x");
    check_no_overlap(y, "y", w, "w");
    py::array bias;
    const float* bp = optional_bias(bias_, g.M, y, bias);
    const G::Isa i = pick_isa(isa);
    const float *xp = cptr<float>(x), *wp = cptr<float>(w);
    float* yp = mptr<float>(y);
    call_nogil([&, g = g] { return G::conv_forward(i, g, xp, wp, bp, relu, yp); });
}

// dw (overwritten, or accumulated: dw's chains continued) and, if dx is not
// None (stride 1 only), dx.
void conv_backward(py::handle x_, py::handle w_, py::handle dy_, py::handle dw_, py::object dx_, i64 sh, i64 sw,
                   i64 ph, i64 pw, const std::string& isa, bool accumulate, py::object db_) {
    auto [x, w, g] = conv_args(x_, w_, sh, sw, ph, pw);
    py::array dy = check_array<float>(dy_, "dy", 4);
    py::array dw = check_array<float>(dw_, "dw", 4, true);
    check_shape(dy, "dy", {g.B, g.M, g.OH, g.OW});
    check_shape(dw, "dw", {g.M, g.C, g.kh, g.kw});
    for (auto* in : {&x, &w, &dy}) check_no_overlap(dw, "dw", *in, "an input");
    float* dxp = nullptr;
    py::array dx;
    if (!dx_.is_none()) {
        dx = check_array<float>(dx_, "dx", 4, true);
        check_shape(dx, "dx", {g.B, g.C, g.H, g.W});
        for (auto* in : {&x, &w, &dy, &dw}) check_no_overlap(dx, "dx", *in, "another argument");
        if (g.sh != 1 || g.sw != 1) value_error("dx: the implicit dX needs stride 1 (sh, sw)");
        dxp = mptr<float>(dx);
    }
    float* dbp = nullptr;
    py::array db;
    if (!db_.is_none()) {
        db = check_array<float>(db_, "db", 1, true);
        check_shape(db, "db", {g.M});
        for (auto* in : {&x, &w, &dy, &dw}) check_no_overlap(db, "db", *in, "another argument");
        if (dxp) check_no_overlap(db, "db", dx, "another argument");
        dbp = mptr<float>(db);
    }
    const G::Isa i = pick_isa(isa);
    const float *xp = cptr<float>(x), *wp = cptr<float>(w), *dyp = cptr<float>(dy);
    float* dwp = mptr<float>(dw);
    call_nogil([&, g = g] {  // (a structured binding is not captured by reference in C++17)
        const char* err = G::conv_backward_w(i, g, xp, dyp, dwp, accumulate, dbp);
        return !err && dxp ? G::conv_backward_x(i, g, wp, dyp, dxp) : err;
    });
}

// The kernel the implicit dW runs for this geometry (gemm_conv.cpp's table).
std::string conv_dw_kernel(py::handle x_, py::handle w_, i64 sh, i64 sw, i64 ph, i64 pw, const std::string& isa) {
    auto [x, w, g] = conv_args(x_, w_, sh, sw, ph, pw);
    return G::conv_backward_w_kernel(pick_isa(isa), g);
}

py::dict gemm_info(const std::string& isa) {
    const G::Isa i = pick_isa(isa);
    const G::Blocking b = G::blocking(i);
    py::dict d;
    d["isa"] = G::isa_name(i);
    d["mr"] = b.mr;
    d["nr"] = b.nr;
    d["mc"] = b.mc;
    d["kc"] = b.kc;
    d["nc"] = b.nc;
    d["l1d_bytes"] = b.l1d;
    d["l2_bytes"] = b.l2;
    const G::ConvTiles t = G::conv_tiles(i);
    py::dict conv;
    for (const auto& [key, v] : {std::pair<const char*, int>{"dw_mr", t.dw_mr}, {"dw_nr", t.dw_nr}, {"dw_l", t.dw_l},
                                 {"lanes_l", t.lanes_l}, {"lanes_mb", t.lanes_mb}, {"lanes_tb", t.lanes_tb}})
        conv[key] = v;
    d["conv"] = conv;
    py::list sup;
    for (G::Isa s : {G::Isa::avx512, G::Isa::avx2, G::Isa::generic})
        if (G::isa_supported(s)) sup.append(G::isa_name(s));
    d["supported"] = sup;
    return d;
}

}  // namespace

void bind_gemm(py::module_& m) {
    m.def("sgemm", &sgemm, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("trans_a") = false,
          py::arg("trans_b") = false, py::arg("alpha") = 1.0, py::arg("beta") = 0.0, py::arg("isa") = "",
          "out = beta * out + (alpha op(a)) @ op(b) (row-major; beta 0 overwrites; each element one FMA chain "
          "over k from beta * out).");
    m.def("conv2d_implicit_forward", &conv_forward, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("y"),
          py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("relu") = false,
          py::arg("isa") = "", "y = conv(x, w) + bias [ReLU]: implicit GEMM, no column matrix.");
    m.def("conv2d_implicit_backward", &conv_backward, py::arg("x"), py::arg("w"), py::arg("dy"), py::arg("dw"),
          py::arg("dx"), py::arg("sh"), py::arg("sw"), py::arg("ph"), py::arg("pw"), py::arg("isa") = "", py::arg("accumulate") = false,
          py::arg("db") = py::none(),
          "dw (and dx if given, stride 1; db, dy's channel sums, if given) of conv(x, w): implicit GEMMs, no column "
          "matrix; accumulate adds to dw and db.");
    m.def("conv2d_implicit_dw_kernel", &conv_dw_kernel, py::arg("x"), py::arg("w"), py::arg("sh"), py::arg("sw"),
          py::arg("ph"), py::arg("pw"), py::arg("isa") = "",
          "'lanes' (small K: dW in vector lanes) or 'taps' (the tap kernel): the kernel the implicit dW runs for x "
          "and w.");
    m.def("fma_peak", [](i64 iters, int threads, const std::string& isa) {
        check_int(iters, "iters", 1, i64(1) << 24);  // a benchmark, not a way to hang the process
        check_int(threads, "threads", 1, 4096);
        const G::Isa i = pick_isa(isa);
        py::gil_scoped_release nogil;
        return G::fma_peak(i, iters, threads);
    }, py::arg("iters"), py::arg("threads"), py::arg("isa"),
          "Runs 12 independent FMA chains per thread (`iters` iterations each); returns the flops executed.");
    m.def("gemm_profile", [](bool on) {
        double pack = 0, kernel = 0;
        G::profile_take(pack, kernel);
        G::set_profiling(on);
        py::dict d;
        d["pack_s"] = pack;
        d["kernel_s"] = kernel;
        return d;
    }, py::arg("on"),
          "Returns (and clears) the thread-seconds spent packing and in the micro-kernel loops since the last "
          "call, then turns the profile on or off.");
    m.def("gemm_info", &gemm_info, py::arg("isa"),
          "The ISA (\"\" = $SPRINT_CPU_ISA or the best), micro-tile and cache blocking the SGEMM uses, the convolution "
          "kernels' tiles (conv), and the ISAs this CPU supports.");
}
