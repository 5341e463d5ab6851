"""One function per op, forward and backward: validate (TypeError/ValueError
naming the argument), then dispatch to the C++ extension (CPU) or the CUDA
kernels (GPU). Arrays are arrays of the current backend (engine.backend),
float32 C-contiguous unless said; ``out=`` buffers are written fully.

The ops, by family (each family: kernels/<op>.cu, csrc/<op>.cpp,
engine/ops/<op>.py and tests/test_<op>.py):"""
from __future__ import annotations

from engine.ops.conv import col2im, conv2d_backward, conv2d_forward, conv_out_size, im2col
from engine.ops.deform import deform, identity_params
from engine.ops.elementwise import bias_act, relu_backward, relu_forward
from engine.ops.gemm import gemm
from engine.ops.linear import linear_backward, linear_forward
from engine.ops.pool import maxpool_backward, maxpool_forward, pool_out_shape
from engine.ops.softmax import softmax_xent
from engine.ops.vector import axpy, momentum_step, scale, sgd_update, sum_into

__all__ = [
    # matrix product, convolution and fully connected (gemm.py, conv.py, linear.py)
    "gemm", "im2col", "col2im", "conv_out_size", "conv2d_forward", "conv2d_backward",
    "linear_forward", "linear_backward",
    # elementwise.py
    "relu_forward", "relu_backward", "bias_act",
    # pool.py
    "maxpool_forward", "maxpool_backward", "pool_out_shape",
    # softmax.py
    "softmax_xent",
    # vector.py: the optimizer's and SPRINT's updater's flat-vector updates
    "axpy", "scale", "sum_into", "momentum_step", "sgd_update",
    # deform.py: DeformImage
    "deform", "identity_params",
]
