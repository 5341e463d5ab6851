"""SGEMM with row-major semantics: the one place that handles transposes and
alpha/beta. CPU: `gemm_impl()` -- $SPRINT_GEMM=engine|blas, default engine
(the faster one measured, RESULTS.md section 2) -- picks the engine's own
BLIS-style SGEMM (csrc/gemm.h; micro-kernel chosen by the CPU's features,
$SPRINT_CPU_ISA forces one) or NumPy's matmul (OpenBLAS). The engine sums
each element of C as one chain in k order whatever the shape, and beta = 1
continues it: a micro-batch's rows equal the whole batch's, and gradients
accumulated micro-batch by micro-batch equal the whole batch's, bit for bit
(OpenBLAS gives neither). GPU: cuBLAS through CuPy."""
from __future__ import annotations

import os

import numpy as np

from engine.backend import get_backend
from engine.ops._check import check_array, check_bool, check_float, out_array


GEMM_IMPLS = ("engine", "blas")
DEFAULT_GEMM = "engine"


def gemm_impl() -> str:
    """The CPU SGEMM in force: $SPRINT_GEMM (engine|blas), else DEFAULT_GEMM."""
    env = os.environ.get("SPRINT_GEMM", "") or DEFAULT_GEMM
    if env not in GEMM_IMPLS:
        raise ValueError(f"SPRINT_GEMM must be one of {', '.join(GEMM_IMPLS)}, got {env!r}")
    return env


def gemm(a, b, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
         beta: float = 0.0, out=None):
    """out = alpha * op(a) @ op(b) + beta * out, op(x) = x.T if trans_x.

    a, b: 2-D float32 C-contiguous. out (m, n) is required when beta != 0;
    with beta == 0 it is overwritten (NaN in out does not propagate).
    """
    be = get_backend()
    xp = be.xp
    check_array("a", a, ndim=2)
    check_array("b", b, ndim=2)
    trans_a, trans_b = check_bool("trans_a", trans_a), check_bool("trans_b", trans_b)
    alpha, beta = check_float("alpha", alpha), check_float("beta", beta)
    A = a.T if trans_a else a
    B = b.T if trans_b else b
    m, k = A.shape
    k2, n = B.shape
    if k != k2:
        raise ValueError(f"b: inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n}")
    if beta != 0.0 and out is None:
        raise ValueError("out is required when beta != 0")
    out = out_array("out", out, (m, n))
    if any(out is x or (out.size and xp.may_share_memory(out, x)) for x in (a, b)):
        raise ValueError("out must not overlap a or b")
    if k == 0:  # empty inner dimension: the product is zero
        if beta == 0.0:
            out.fill(0)
        else:
            out *= np.float32(beta)
        return out
    if be.kernels == "cpp" and gemm_impl() == "engine":
        be.ext.sgemm(a, b, out, trans_a, trans_b, alpha, beta)
        return out
    if beta != 0.0 and xp.__name__ == "cupy":
        from cupy import cublas
        cublas.gemm("T" if trans_a else "N", "T" if trans_b else "N", a, b, out=out,
                    alpha=alpha, beta=beta)
        return out
    if beta == 0.0:
        xp.matmul(A, B, out=out)
        if alpha != 1.0:
            out *= np.float32(alpha)
        return out
    tmp = be.workspace("gemm_tmp", m * n).reshape(m, n)
    xp.matmul(A, B, out=tmp)
    if beta != 1.0:
        out *= np.float32(beta)
    if alpha != 1.0:
        tmp *= np.float32(alpha)
    out += tmp
    return out
