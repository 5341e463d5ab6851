"""What bench/fuzz.py calls: every public function of engine.ops (CPU
backend; their valid calls are in bench/fuzz_ops.py) and every raw binding
of engine._sprint_cpu and engine._sprint_cuda, each with a generator of
valid calls (random small shapes) and a rule for the shapes a successful
call must return. A call is the valid one, mutated (wrong dtype, rank,
shape, strides, read-only, aliasing, NaN/Inf, huge, negative or
non-integer sizes, empty arrays with huge dimensions...), or fully random
arguments. Call k of seed s depends on (s, k) only, so any failure replays
alone (bench/fuzz.py --replay k)."""
from __future__ import annotations

import inspect
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fuzz_ops import OPS, conv_case, out_size, v_bias_act, v_relu_backward, v_relu_forward

GUARD = 64            # guard bytes on both sides of every array the fuzzer makes
SENTINEL = 0xA5
HUGE = [1 << 31, (1 << 31) - 1, 1 << 62, (1 << 63) - 1, 1 << 63, -(1 << 40), -1, 0, 1 << 60, 1 << 20]
DTYPES = [np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_, np.complex64]


def huge_empty(shape, dtype=np.float32):
    """An empty array whose other dimensions are as large as NumPy allows
    (their product times the item size must stay below 2^63)."""
    shape = list(shape)
    while True:
        try:
            return np.empty(shape, dtype)
        except ValueError:
            i = max(range(len(shape)), key=lambda j: shape[j])
            shape[i] >>= 8


class Arrays:
    """Arrays carved from byte buffers between guard zones: a write outside
    an array shows up in intact()."""

    def __init__(self, rng):
        self.rng = rng
        self.buffers = []

    def new(self, shape, dtype=np.float32, fill="normal", contiguous=True, writable=True):
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        if np.prod(shape, dtype=object) * dtype.itemsize > 1 << 22:  # made from huge dims: keep them, empty
            i = max(range(len(shape)), key=lambda j: shape[j])
            return huge_empty(shape[:i] + (0,) + shape[i + 1:], dtype)
        full = shape if contiguous or not shape else shape[:-1] + (max(1, shape[-1]) * 2,)
        n = int(np.prod(full, dtype=np.int64)) if all(full) else 0
        base = np.full(n * dtype.itemsize + 2 * GUARD, SENTINEL, np.uint8)
        a = base[GUARD:GUARD + n * dtype.itemsize].view(dtype).reshape(full)
        if n and fill == "normal":
            if dtype.kind in "fc":
                a[...] = self.rng.standard_normal(full)
            else:
                a[...] = self.rng.integers(0, 5, size=full)
        if not contiguous and shape:
            a = a[..., ::2]
        a.flags.writeable = writable
        self.buffers.append(base)
        return a

    def like(self, a, **kw):
        b = self.new(a.shape, a.dtype, fill="none", **kw)
        b.flags.writeable = True
        b[...] = a
        b.flags.writeable = kw.get("writable", True)
        return b

    def intact(self) -> bool:
        return all((b[:GUARD] == SENTINEL).all() and (b[-GUARD:] == SENTINEL).all() for b in self.buffers)

# ---- raw bindings: argument kinds from the pybind11 signatures --------------

def binding_kinds(fn) -> list[tuple[str, str]]:
    """[(name, kind)], kind in array|int|float|bool|seq|any, from fn.__doc__."""
    first = (fn.__doc__ or "").strip().splitlines()[0]
    m = re.match(r"\w+\((.*)\)\s*->", first)
    params = []
    for part in re.split(r",\s*(?=\w+:)", m.group(1)) if m and m.group(1) else []:
        name, _, ann = part.partition(":")
        ann = ann.split("=")[0]
        kind = ("int" if "SupportsInt" in ann or ann.strip() == "int" else "float" if "SupportsFloat" in ann
                else "bool" if "bool" in ann else "seq" if "Sequence" in ann else "any" if "object" in ann
                else "array")
        params.append((name.strip(), kind))
    return params


def _f(A, *shape):
    return A.new(shape)


def _labels(A, rng, n, k, dtype):
    a = A.new((n,), dtype, fill="none")
    a[...] = rng.integers(0, k, n)
    return a


# The raw CPU bindings cpu_binding_valid() can call validly; others get mutated
# random calls only (and a note in the report).
CPU_VALID = ("im2col", "col2im", "cnhw_to_nchw", "nchw_to_cnhw", "channel_sum", "add_channel_bias",
             "maxpool_forward", "maxpool_backward", "softmax_xent", "relu_forward", "relu_backward", "bias_act",
             "axpy", "scale", "sum_into", "momentum_step", "sgd_update", "deform")


def cpu_binding_valid(name, rng, A):
    """A valid call of engine._sprint_cpu.<name> with random small shapes, or None."""
    if name in ("im2col", "col2im"):
        N, C, H, W, kh, kw, sh, sw, ph, pw = conv_case(rng, A)
        cols = _f(A, C * kh * kw, N * out_size(H, kh, sh, ph) * out_size(W, kw, sw, pw))
        x = _f(A, N, C, H, W)
        return [x, cols, kh, kw, sh, sw, ph, pw] if name == "im2col" else [cols, x, kh, kw, sh, sw, ph, pw]
    B, M, P = (int(v) for v in rng.integers(0, 4, 3))
    if name == "cnhw_to_nchw":
        return [_f(A, M, B * P), _f(A, M) if rng.random() < 0.5 else None, _f(A, B, M, P)]
    if name == "nchw_to_cnhw":
        return [_f(A, B, M, P), _f(A, M, B * P), _f(A, M) if rng.random() < 0.5 else None, bool(rng.random() < 0.5)]
    if name == "channel_sum":
        return [_f(A, B, M, P), _f(A, M), bool(rng.random() < 0.5)]
    if name == "add_channel_bias":
        return [_f(A, B, M, P), _f(A, M)]
    if name in ("maxpool_forward", "maxpool_backward"):
        N, C, H, W, kh, kw, sh, sw, ph, pw = conv_case(rng, A, pool=True)
        ys = (N, C, out_size(H, kh, sh, ph), out_size(W, kw, sw, pw))
        am = A.new(ys, np.int32, fill="none")
        am[...] = rng.integers(-1, H * W + 1, am.shape)
        if name == "maxpool_forward":
            return [_f(A, N, C, H, W), _f(A, *ys), am, kh, kw, sh, sw, ph, pw]
        return [_f(A, *ys), am, _f(A, N, C, H, W), kh, kw, sh, sw, ph, pw]
    if name == "softmax_xent":
        N, K = int(rng.integers(1, 5)), int(rng.integers(1, 40))
        return [_f(A, N, K), _labels(A, rng, N, K, rng.choice([np.int32, np.int64])), _f(A, N, K), _f(A, N, K),
                _f(A, N)]
    if name in ("relu_forward", "relu_backward", "bias_act"):
        (args, kw) = {"relu_forward": v_relu_forward, "relu_backward": v_relu_backward, "bias_act": v_bias_act}[name](rng, A)
        out = kw.get("out")
        out = A.new(args[0].shape) if out is None else out
        return args + [out] + ([kw["relu"]] if name == "bias_act" else [])
    if name in ("conv2d_implicit_forward", "conv2d_implicit_backward", "conv2d_implicit_dw_kernel"):
        N, C, H, W, kh, kw, sh, sw, ph, pw = conv_case(rng, A)
        M = int(rng.integers(1, 5))
        ys = (N, M, out_size(H, kh, sh, ph), out_size(W, kw, sw, pw))
        x, w = _f(A, N, C, H, W), _f(A, M, C, kh, kw)
        if name == "conv2d_implicit_dw_kernel":
            return [x, w, sh, sw, ph, pw, ""]
        if name == "conv2d_implicit_forward":
            return [x, w, _f(A, M) if rng.random() < 0.5 else None, _f(A, *ys), sh, sw, ph, pw,
                    bool(rng.random() < 0.5), ""]
        dx = _f(A, N, C, H, W) if sh == sw == 1 else None
        return [x, w, _f(A, *ys), _f(A, M, C, kh, kw), dx, sh, sw, ph, pw, ""]
    if name.startswith("conv2d_winograd_"):  # 3x3 stride 1, pads 0-2, F(2,3) or F(4,3)
        from engine import _sprint_cpu as ext
        N, C, M = (int(v) for v in rng.integers(1, 5, 3))
        p, t = int(rng.integers(0, 3)), int(rng.choice([2, 4]))
        H, W = (max(3 - 2 * p, int(v)) for v in rng.integers(1, 12, 2))
        dx = name.endswith("backward_x")
        if name == "conv2d_winograd_workspace":
            return [N, C, H, W, M, p, p, t, bool(rng.random() < 0.5)]
        ws = _f(A, ext.conv2d_winograd_workspace(N, C, H, W, M, p, p, t, dx))
        x, w, y = _f(A, N, C, H, W), _f(A, M, C, 3, 3), _f(A, N, M, H + 2 * p - 2, W + 2 * p - 2)
        if dx:
            return [w, y, x, p, p, t, ws, ""]
        return [x, w, _f(A, M) if rng.random() < 0.5 else None, y, p, p, bool(rng.random() < 0.5), t, ws, ""]
    if name == "sgemm":
        m, n, k = (int(v) for v in rng.integers(1, 40, 3))
        ta, tb = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        return [_f(A, *((k, m) if ta else (m, k))), _f(A, *((n, k) if tb else (k, n))), _f(A, m, n), ta, tb,
                float(rng.standard_normal()), float(rng.standard_normal()), ""]
    if name == "gemm_info":
        return [str(rng.choice(["", "generic"]))]
    if name == "gemm_profile":
        return [False]
    if name == "fma_peak":  # a few iterations: the loop length is the argument
        return [int(rng.integers(1, 100)), int(rng.integers(1, 3)), str(rng.choice(["", "generic"]))]
    if name in OPS and name in ("axpy", "scale", "sum_into", "momentum_step", "sgd_update", "deform"):
        args, _ = OPS[name][0](rng, A)
        if name == "deform":
            x, params, (oh, ow), mean, std = args
            return [x, params, mean, std, _f(A, x.shape[0], x.shape[1], oh, ow)]
        return args
    return None


def cuda_binding_valid(kinds, rng):
    """Plausible arguments of an engine._sprint_cuda launcher: nonzero fake
    pointers and small sizes (only used when no device is present: the launch
    then fails with a CUDA error and no memory is touched)."""
    args = []
    for name, kind in kinds:
        if kind == "int":
            small = name in ("kh", "kw", "sh", "sw", "ph", "pw", "stream") or len(name) <= 2
            args.append(0 if name in ("stream", "ph", "pw") else int(rng.integers(1, 4)) if small else 4096 * int(rng.integers(1, 9)))
        elif kind == "float":
            args.append(0.5)
        elif kind == "bool":
            args.append(bool(rng.random() < 0.5))
        elif kind == "seq":
            args.append([4096 * int(v) for v in rng.integers(1, 9, int(rng.integers(1, 10)))])
        else:
            args.append(4096)
    return args


@dataclass
class Target:
    name: str                 # e.g. "ops.im2col", "cpu.im2col", "cuda.im2col"
    fn: Callable
    kinds: list               # [(param name, kind)]
    valid: Callable           # (rng, A) -> (args, kwargs) or None
    shape: Callable | None    # result rule (ops only)
    errors: tuple             # exception types a rejected call may raise


def op_kinds(fn) -> list[tuple[str, str]]:
    kinds = []
    for p in inspect.signature(fn).parameters.values():
        n = p.name
        kind = ("array" if n in ("a", "b", "x", "w", "dy", "y", "cols", "logits", "labels", "params", "mean", "std",
                                 "argmax", "delta", "upd", "v", "g") or n.endswith("out") else
                "seq" if n == "bufs" else "shape" if n.endswith("_shape") else
                "pair" if n in ("stride", "pad", "k", "out_hw") else
                "bool" if n in ("trans_a", "trans_b", "need_dx", "relu") else
                "float" if n in ("alpha", "beta", "nu", "lr", "momentum", "weight_decay") else
                "skip" if n == "xp" else "int")
        kinds.append((n, kind))
    return kinds


REJECT = (TypeError, ValueError, OverflowError, MemoryError)


class CudaError(Exception):
    """Marker: a RuntimeError that names a CUDA error counts as a rejection."""


# ---- the ops' GPU path on the CPU ------------------------------------------------
# The ops take their RawModule path with NumPy arrays and each launch runs the
# real kernels/*.cu compiled as sequential C++ (tests/k2_support.py's shim: one
# thread, so grid-stride loops visit every index): the GPU path's validation,
# launch arguments and kernel index arithmetic, fuzzed without a GPU. Softmax
# needs warp shuffles and is not emulated.
EMU_FAMILIES = ("im2col", "pool", "elementwise", "vector", "deform")
EMU_OPS = ("im2col", "col2im", "conv2d_forward", "conv2d_backward", "relu_forward", "relu_backward", "bias_act",
           "maxpool_forward", "maxpool_backward", "axpy", "scale", "sum_into", "momentum_step", "sgd_update", "deform")


# A launch over more elements is refused (as a MemoryError, counted as a
# rejection): one CPU thread runs the emulated kernel, and legitimately large
# outputs (a 2 GB cols from a huge pad) would read as hangs.
EMU_MAX_LAUNCH = 1 << 23


class EmulationLimit(MemoryError):
    pass


def emulated_backend():
    """A Backend whose raw_launch runs the emulated kernels; the libraries are
    built once per source version into a shared temp folder (atomically, so
    concurrent fuzz children reuse them)."""
    import ctypes
    import hashlib
    import os
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from engine import backend
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import k2_support

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise OSError("no C++ compiler")
    kdir = backend.kernel_dir()
    shim = k2_support._SHIM + "\n#define __shared__ static\n"
    h = hashlib.sha256(shim.encode())
    for f in sorted(kdir.glob("*.cu*")):
        h.update(f.read_bytes())
    cache = Path(tempfile.gettempdir()) / f"sprint_fuzz_emu_{h.hexdigest()[:16]}"
    cache.mkdir(exist_ok=True)
    libs = []
    for fam in EMU_FAMILIES:
        lib = cache / f"lib{fam}.so"
        if not lib.exists():
            (cache / "shim.h").write_text(shim)
            tmp = cache / f".lib{fam}.{os.getpid()}.so"
            subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-include", str(cache / "shim.h"),
                            "-x", "c++", str(kdir / f"{fam}.cu"), "-I", str(kdir), "-o", str(tmp)],
                           check=True, capture_output=True)
            os.replace(tmp, lib)
        libs.append(ctypes.CDLL(str(lib)))

    def raw_launch(kernel, args, n=None, grid=None, block=256):
        if n is not None and n > EMU_MAX_LAUNCH:
            raise EmulationLimit(f"{kernel}: {n} elements are too many to emulate on one CPU thread")
        for lib in libs:
            if hasattr(lib, kernel):
                return k2_support.kernel_call(lib, kernel, *args)
        raise AssertionError(f"kernel {kernel} is not emulated")

    be = backend.Backend("gpu", np, None, "rawmodule")
    be.raw_launch = raw_launch
    return be


def _on_backend(be, fn):
    import functools

    from engine import backend

    @functools.wraps(fn)
    def call(*args, **kwargs):
        old = backend._current
        backend._current = be
        try:
            return fn(*args, **kwargs)
        finally:
            backend._current = old
    return call


def targets(kinds=("ops", "cpu", "cuda")) -> tuple[list[Target], list[str]]:
    """The fuzz targets, sorted by name, and notes on what was left out."""
    import engine.ops as ops
    from engine import backend
    backend.set_backend("cpu")
    notes = []
    out = []
    if "ops" in kinds:
        for name in ops.__all__:
            fn = getattr(ops, name)
            if name not in OPS:
                notes.append(f"ops.{name}: no valid-call generator, random calls only")
            gen, rule = OPS.get(name, (lambda r, A: None, None))
            out.append(Target(f"ops.{name}", fn, op_kinds(fn), gen, rule, REJECT))
    if "cpu" in kinds:
        from engine import _sprint_cpu as m
        for name in sorted(dir(m)):
            fn = getattr(m, name)
            if name.startswith("_") or not callable(fn) or name in ("get_num_threads", "set_num_threads"):
                continue
            if name in ("fma_peak",):  # a benchmark probe: it runs as many iterations as asked (2^31: minutes)
                notes.append(f"cpu.{name}: not fuzzed (runs as long as its iteration count asks)")
                continue
            if name not in CPU_VALID:
                notes.append(f"cpu.{name}: no valid-call generator, random and mutated calls only")
            out.append(Target(f"cpu.{name}", fn, binding_kinds(fn),
                              lambda r, A, n=name: (lambda a: None if a is None else (a, {}))(cpu_binding_valid(n, r, A)),
                              None, REJECT))
    if "cuda" in kinds:
        try:
            from engine import _sprint_cuda as c
        except ImportError:
            notes.append("cuda: engine._sprint_cuda is not built")
            c = None
        if c is not None and c.device_count() > 0:
            notes.append("cuda: a device is present, raw launchers are not fuzzed (fake pointers would be used)")
        elif c is not None:
            for name in sorted(dir(c)):
                fn = getattr(c, name)
                if name.startswith("_") or not callable(fn) or name in ("device_count", "synchronize"):
                    continue
                k = binding_kinds(fn)
                out.append(Target(f"cuda.{name}", fn, k, lambda r, A, k=k: (cuda_binding_valid(k, r), {}), None,
                                  REJECT + (CudaError,)))
    if "emu" in kinds:
        try:
            be = emulated_backend()
        except (OSError, subprocess.CalledProcessError) as e:
            notes.append(f"emu: the CUDA sources could not be built for the CPU ({e})")
            be = None
        for name in EMU_OPS if be is not None else ():
            fn = _on_backend(be, getattr(ops, name))
            out.append(Target(f"emu.{name}", fn, op_kinds(fn), OPS[name][0], OPS[name][1], REJECT))
    if "selftest" in kinds:  # targets that crash or hang on purpose: the fuzzer must catch them
        import ctypes
        import os
        import time
        for name, fn in (("segfault", lambda *a: ctypes.string_at(0)), ("abort", lambda *a: os.abort()),
                         ("hang", lambda *a: time.sleep(3600)), ("bad_exception", lambda *a: {}["missing"])):
            out.append(Target(f"selftest.{name}", fn, [], lambda r, A: ([], {}), None, REJECT))
    return sorted(out, key=lambda t: t.name), notes
