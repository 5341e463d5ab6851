"""One function per op, forward and backward: validate (TypeError/ValueError
naming the argument), then dispatch to the C++ extension (CPU) or the CUDA
kernels (GPU). Arrays are arrays of the current backend (engine.backend),
float32 C-contiguous unless said; ``out=`` buffers are written fully."""
from __future__ import annotations

import importlib

from engine.ops.conv import (col2im, conv2d_backward, conv2d_forward, conv_out_size, im2col,
                             linear_backward, linear_forward)
from engine.ops.gemm import gemm

__all__ = ["gemm", "im2col", "col2im", "conv_out_size", "conv2d_forward", "conv2d_backward",
           "linear_forward", "linear_backward"]

# Op families by K2; each module lists its public functions in __all__.
_FAMILIES = ("elementwise", "pool", "softmax", "vector", "deform")

_mod = None
for _fam in _FAMILIES:
    try:
        _mod = importlib.import_module(f"engine.ops.{_fam}")
    except ModuleNotFoundError as _e:  # family not written yet; other import errors surface
        if _e.name != f"engine.ops.{_fam}":
            raise
        continue
    for _name in getattr(_mod, "__all__", ()):
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)
del _fam, _mod
