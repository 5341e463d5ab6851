// engine._sprint_cuda: softmax + cross-entropy + gradient (pointers as ints).
#include "bind.h"
#include "cuda_launch.h"

using namespace sprint;
using namespace sprint::bind;

namespace {
using uptr = std::uintptr_t;
}  // namespace

void bind_softmax_cuda(py::module_& m) {
    m.def("softmax_xent", [](uptr logits, uptr labels, uptr probs, uptr dlogits, uptr row_loss, i64 N, i64 K,
                             uptr stream) {
        check_int(N, "N", 1, kMaxDim);
        check_int(K, "K", 1, kMaxDim - 1);
        checked_size("N * K", {N, K});
        check_ptr(logits, "logits"); check_ptr(labels, "labels"); check_ptr(probs, "probs");
        check_ptr(dlogits, "dlogits"); check_ptr(row_loss, "row_loss");
        const float inv_n = float(1.0 / double(N));
        launch_nogil("softmax_xent", [&] {
            return cuda::softmax_xent_f32(dptr<const float>(logits), dptr<const std::int64_t>(labels),
                                          dptr<float>(probs), dptr<float>(dlogits), dptr<float>(row_loss), N, K,
                                          inv_n, stream);
        });
    }, py::arg("logits"), py::arg("labels"), py::arg("probs"), py::arg("dlogits"), py::arg("row_loss"), py::arg("N"),
       py::arg("K"), py::arg("stream") = 0,
       "probs, dlogits = (probs - onehot)/N (N,K), row_loss (N,) <- logits (N,K) float32, labels (N,) int64 "
       "(validated by the caller; a bad label gives a NaN row loss, never a bad read)");
}
