// engine._sprint_cpu: softmax fused with cross-entropy and its gradient.
#include "bind.h"
#include "softmax.h"

using namespace sprint;
using namespace sprint::bind;

namespace {

// Every label must be a class index; the kernel reads logits[label].
template <typename L>
void check_labels(const py::array& labels, int64_t K) {
    const L* lp = cptr<L>(labels);
    for (py::ssize_t i = 0; i < labels.shape(0); ++i)
        if (lp[i] < 0 || int64_t(lp[i]) >= K)
            value_error("labels[" + std::to_string(i) + "] = " + std::to_string(int64_t(lp[i])) +
                        " is outside 0.." + std::to_string(K - 1));
}

double softmax_xent(py::handle logits_, py::handle labels_, py::handle probs_, py::handle dlogits_,
                    py::handle row_loss_, double grad_scale) {
    py::array logits = check_array<float>(logits_, "logits", 2);
    const int64_t N = logits.shape(0), K = logits.shape(1);
    if (N < 1) value_error("logits must hold at least one row, got shape " + shape_str(logits));
    check_int(K, "logits classes (K)", 1, INT32_MAX);
    if (!py::isinstance<py::array>(labels_)) type_error("labels must be a numpy array");
    const auto larr = py::reinterpret_borrow<py::array>(labels_);
    const bool is64 = dtype_is<int64_t>(larr);
    if (!is64 && !dtype_is<int32_t>(larr))
        type_error("labels must have dtype int32 or int64, got " + std::string(py::str(larr.dtype())));
    py::array labels = is64 ? check_array<int64_t>(labels_, "labels", 1) : check_array<int32_t>(labels_, "labels", 1);
    check_shape(labels, "labels", {N});
    py::array probs = check_array<float>(probs_, "probs", 2, true);
    py::array dlogits = check_array<float>(dlogits_, "dlogits", 2, true);
    py::array row_loss = check_array<float>(row_loss_, "row_loss", 1, true);
    check_shape(probs, "probs", {N, K});
    check_shape(dlogits, "dlogits", {N, K});
    check_shape(row_loss, "row_loss", {N});
    const py::array* outs[] = {&probs, &dlogits, &row_loss};
    const char* names[] = {"probs", "dlogits", "row_loss"};
    for (int i = 0; i < 3; ++i) {
        check_no_overlap(logits, "logits", *outs[i], names[i]);
        check_no_overlap(labels, "labels", *outs[i], names[i]);
        for (int j = i + 1; j < 3; ++j) check_no_overlap(*outs[i], names[i], *outs[j], names[j]);
    }
    if (is64) check_labels<int64_t>(labels, K); else check_labels<int32_t>(labels, K);
    const float* lp = cptr<float>(logits);
    float* pp = mptr<float>(probs);
    float* dp = mptr<float>(dlogits);
    float* rp = mptr<float>(row_loss);
    // grad_scale < 0: 1/N, the gradient of the mean; a micro-batch passes 1/(its mini-batch)
    const float inv_n = grad_scale < 0 ? float(1.0 / double(N)) : finite_f32(grad_scale, "grad_scale");
    const void* lab = labels.data();
    py::gil_scoped_release nogil;
    return is64 ? cpu::softmax_xent_f32(lp, static_cast<const int64_t*>(lab), pp, dp, rp, N, int(K), inv_n)
                : cpu::softmax_xent_f32(lp, static_cast<const int32_t*>(lab), pp, dp, rp, N, int(K), inv_n);
}

}  // namespace

void bind_softmax(py::module_& m) {
    m.def("softmax_xent", &softmax_xent, py::arg("logits"), py::arg("labels"), py::arg("probs"),
          py::arg("dlogits"), py::arg("row_loss"), py::arg("grad_scale") = -1.0,
          "probs = softmax(logits), dlogits = (probs - onehot(labels)) * grad_scale (default 1/N), "
          "row_loss = -log probs[label]; "
          "returns the mean loss. logits (N,K) float32, labels (N,) int32|int64 in 0..K-1.");
}
