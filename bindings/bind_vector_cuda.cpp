// engine._sprint_cuda: vector ops on flat float32 device buffers (pointers as ints).
#include <vector>

#include "bind.h"
#include "cuda_launch.h"

using namespace sprint;
using namespace sprint::bind;

namespace {
using uptr = std::uintptr_t;
constexpr int64_t kMaxN = kMaxElems;
}  // namespace

void bind_vector_cuda(py::module_& m) {
    m.def("axpy", [](double alpha, uptr x, uptr y, i64 n, uptr stream) {
        const float a = finite_f32(alpha, "alpha");
        check_ptr(x, "x"); check_ptr(y, "y"); check_int(n, "n", 0, kMaxN);
        launch_nogil("axpy", [&] { return cuda::axpy_f32(dptr<float>(y), dptr<const float>(x), a, n, stream); });
    }, py::arg("alpha"), py::arg("x"), py::arg("y"), py::arg("n"), py::arg("stream") = 0, "y += alpha * x");

    m.def("scale", [](double alpha, uptr x, i64 n, uptr stream) {
        const float a = finite_f32(alpha, "alpha");
        check_ptr(x, "x"); check_int(n, "n", 0, kMaxN);
        launch_nogil("scale", [&] { return cuda::scale_f32(dptr<float>(x), a, n, stream); });
    }, py::arg("alpha"), py::arg("x"), py::arg("n"), py::arg("stream") = 0, "x *= alpha");

    m.def("sum_into", [](uptr out, py::sequence bufs, i64 n, uptr stream) {
        check_ptr(out, "out"); check_int(n, "n", 0, kMaxN);
        if (py::len(bufs) == 0) value_error("bufs must hold at least one buffer");
        std::vector<const float*> ptrs;
        for (size_t i = 0; i < py::len(bufs); ++i) {
            const std::string name = "bufs[" + std::to_string(i) + "]";
            if (!py::isinstance<py::int_>(bufs[i])) type_error(name + " must be a device pointer (int)");
            uptr p = 0;
            try {
                p = bufs[i].cast<uptr>();
            } catch (const py::cast_error&) {
                value_error(name + " is not a valid device pointer");
            }
            check_ptr(p, name.c_str());
            if (i > 0 && p == out) value_error("out may alias bufs[0] only, not " + name);
            ptrs.push_back(dptr<const float>(p));
        }
        launch_nogil("sum_into", [&] {
            return cuda::sum_into_f32(dptr<float>(out), ptrs.data(), int(ptrs.size()), n, stream);
        });
    }, py::arg("out"), py::arg("bufs"), py::arg("n"), py::arg("stream") = 0,
       "out = bufs[0] + bufs[1] + ... (device pointers; out may be bufs[0])");

    m.def("momentum_step", [](uptr w, uptr delta, uptr upd, double nu, i64 n, uptr stream) {
        const float nu_f = finite_f32(nu, "nu");
        check_ptr(w, "w"); check_ptr(delta, "delta"); check_ptr(upd, "upd"); check_int(n, "n", 0, kMaxN);
        launch_nogil("momentum_step", [&] {
            return cuda::momentum_step_f32(dptr<float>(w), dptr<float>(delta), dptr<const float>(upd), nu_f, n, stream);
        });
    }, py::arg("w"), py::arg("delta"), py::arg("upd"), py::arg("nu"), py::arg("n"), py::arg("stream") = 0,
       "delta = nu * delta + upd; w += delta");

    m.def("sgd_update", [](uptr w, uptr v, uptr g, double lr, double momentum, double wd, i64 n, uptr stream) {
        const float lr_f = finite_f32(lr, "lr"), mom_f = finite_f32(momentum, "momentum"), wd_f = finite_f32(wd, "weight_decay");
        check_ptr(w, "w"); check_ptr(v, "v"); check_ptr(g, "g"); check_int(n, "n", 0, kMaxN);
        launch_nogil("sgd_update", [&] {
            return cuda::sgd_update_f32(dptr<float>(w), dptr<float>(v), dptr<const float>(g), lr_f, mom_f, wd_f, n,
                                        stream);
        });
    }, py::arg("w"), py::arg("v"), py::arg("g"), py::arg("lr"), py::arg("momentum"), py::arg("weight_decay"),
       py::arg("n"), py::arg("stream") = 0, "v = momentum * v - lr * (g + weight_decay * w); w += v");
}
