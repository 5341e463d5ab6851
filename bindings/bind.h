// Shared pybind11 helpers and the list of per-op binding functions.
//
// Each op family <op> provides
//   bindings/bind_<op>.cpp       void bind_<op>(pybind11::module_&)       -> engine._sprint_cpu
//   bindings/bind_<op>_cuda.cpp  void bind_<op>_cuda(pybind11::module_&)  -> engine._sprint_cuda
// CMake globs both patterns; add the call to module_cpu.cpp / module_cuda.cpp.
//
// CPU bindings take numpy arrays (never converted or copied: a wrong dtype,
// rank, shape or a non-contiguous array raises TypeError/ValueError naming the
// argument) and release the GIL around the kernel. CUDA bindings take device
// pointers and a stream as integers (uintptr_t) and contain no CUDA code.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#include "sizes.h"

namespace py = pybind11;

// ---- registration (one pair per op family) --------------------------------
void bind_im2col(py::module_& m);
void bind_im2col_cuda(py::module_& m);
// K2: pool, softmax, elementwise, vector, deform
void bind_pool(py::module_& m);
void bind_pool_cuda(py::module_& m);
void bind_softmax(py::module_& m);
void bind_softmax_cuda(py::module_& m);
void bind_elementwise(py::module_& m);
void bind_elementwise_cuda(py::module_& m);
void bind_vector(py::module_& m);
void bind_vector_cuda(py::module_& m);
void bind_deform(py::module_& m);
void bind_deform_cuda(py::module_& m);
void bind_gemm(py::module_& m);
void bind_winograd(py::module_& m);

namespace sprint {
namespace bind {

using sprint::kMaxDim;
using sprint::kMaxElems;

[[noreturn]] inline void value_error(const std::string& msg) { throw py::value_error(msg); }
[[noreturn]] inline void type_error(const std::string& msg) { throw py::type_error(msg); }

inline std::string shape_str(const py::array& a) {
    std::ostringstream s;
    s << "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
    s << (a.ndim() == 1 ? ",)" : ")");
    return s.str();
}

// NumPy may hand out distinct but equivalent dtype objects (a '>u1' made
// native, a dtype unpickled from a file), so dtypes are compared by value.
template <typename T>
inline bool dtype_is(const py::array& a) {
    return py::isinstance<py::array_t<T, 0>>(a);
}

// Checks that `obj` is a numpy array of dtype T, rank `ndim` (-1: any),
// C-contiguous, and (if `writable`) writeable. Returns it as py::array.
template <typename T>
py::array check_array(const py::handle& obj, const char* name, int ndim = -1, bool writable = false) {
    if (!py::isinstance<py::array>(obj))
        type_error(std::string(name) + " must be a numpy array, got " +
                   std::string(py::str(py::type::of(obj).attr("__name__"))));
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!dtype_is<T>(a))
        type_error(std::string(name) + " must have dtype " + std::string(py::str(py::dtype::of<T>())) +
                   ", got " + std::string(py::str(a.dtype())));
    if (ndim >= 0 && a.ndim() != ndim)
        value_error(std::string(name) + " must be " + std::to_string(ndim) + "-D, got shape " + shape_str(a));
    if (!(a.flags() & py::array::c_style))
        value_error(std::string(name) + " must be C-contiguous");
    if (writable && !a.writeable())
        value_error(std::string(name) + " must be writeable");
    return a;
}

// Requires a.shape == expected exactly. Expected sizes come from
// checked_size()/the geometry checks; a negative one (an unchecked overflow)
// never matches anything.
inline void check_shape(const py::array& a, const char* name, std::initializer_list<std::int64_t> expected) {
    bool ok = std::int64_t(expected.size()) == a.ndim();
    py::ssize_t i = 0;
    for (auto e : expected) {
        if (ok && (e < 0 || a.shape(i) != e)) ok = false;
        ++i;
    }
    if (!ok) {
        std::ostringstream s;
        s << name << " must have shape (";
        i = 0;
        for (auto e : expected) {
            s << (i++ ? ", " : "");
            if (e >= 0) s << e; else s << "<overflow>";
        }
        s << (expected.size() == 1 ? ",)" : ")") << ", got " << shape_str(a);
        value_error(s.str());
    }
}

// The product of sizes (e.g. the element count B*M*P of a shape) or
// ValueError naming `what` when it overflows or a size is negative. The one
// place where bindings multiply sizes (see csrc/sizes.h).
inline std::int64_t checked_size(const char* what, std::initializer_list<std::int64_t> dims) {
    const std::int64_t n = sprint::size_product(dims);
    if (n < 0) value_error(std::string(what) + " is too large (or has a negative size)");
    return n;
}

inline std::int64_t check_int(std::int64_t v, const char* name, std::int64_t lo, std::int64_t hi = kMaxDim) {
    if (v < lo || v > hi)
        value_error(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "], got " + std::to_string(v));
    return v;
}

template <typename T>
const T* cptr(const py::array& a) { return static_cast<const T*>(a.data()); }
template <typename T>
T* mptr(py::array& a) { return static_cast<T*>(a.mutable_data()); }

// Requires two arrays not to share memory (outputs must not alias inputs).
inline void check_no_overlap(const py::array& a, const char* an, const py::array& b, const char* bn) {
    auto lo_a = reinterpret_cast<std::uintptr_t>(a.data());
    auto lo_b = reinterpret_cast<std::uintptr_t>(b.data());
    auto hi_a = lo_a + std::uintptr_t(a.nbytes());
    auto hi_b = lo_b + std::uintptr_t(b.nbytes());
    if (a.nbytes() && b.nbytes() && lo_a < hi_b && lo_b < hi_a)
        value_error(std::string(an) + " and " + bn + " must not overlap");
}

// CUDA bindings: device pointers arrive as integers; 0 is refused.
inline void check_ptr(std::uintptr_t p, const char* name) {
    if (p == 0) value_error(std::string(name) + " is a null device pointer");
}

// Turns a launcher's cudaError_t (as int) into RuntimeError.
void raise_cuda_error(int code, const char* what);

// A real scalar argument that must be a finite float32 (learning rate, alpha...).
inline float finite_f32(double v, const char* name) {
    const float f = float(v);
    if (!std::isfinite(f))
        value_error(std::string(name) + " must be a finite float32, got " + std::to_string(v));
    return f;
}

// CUDA bindings: a device pointer received as an integer.
template <typename T>
T* dptr(std::uintptr_t p) { return reinterpret_cast<T*>(p); }

// CUDA bindings: runs a launcher (returning a cudaError_t as int) without the
// GIL, then raises RuntimeError on error.
template <typename F>
void launch_nogil(const char* what, F&& f) {
    int e;
    {
        py::gil_scoped_release nogil;
        e = f();
    }
    raise_cuda_error(e, what);
}

// An optional float32 bias of shape (M,) for the output y: nullptr for None,
// else its data, the array kept alive in `keep` while the kernel runs.
inline const float* optional_bias(const py::handle& bias, std::int64_t M, const py::array& y, py::array& keep) {
    if (bias.is_none()) return nullptr;
    keep = check_array<float>(bias, "bias", 1);
    check_shape(keep, "bias", {M});
    check_no_overlap(y, "y", keep, "bias");
    return cptr<float>(keep);
}

// Runs f (returns nullptr or an error message) without the GIL, then raises its error.
template <class F>
void call_nogil(F f) {
    const char* err;
    {
        py::gil_scoped_release nogil;
        err = f();
    }
    if (err) value_error(err);
}

}  // namespace bind
}  // namespace sprint
