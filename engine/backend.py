"""Choice of the compute backend: CPU (NumPy + ``engine._sprint_cpu``) or GPU
(CuPy + the CUDA kernels + cuBLAS through CuPy).

Selection: ``set_backend('auto'|'cpu'|'gpu')``, else ``$SPRINT_DEVICE``, else
auto (GPU when CuPy sees a device). On the GPU the kernels come from the
compiled module ``engine._sprint_cuda`` when it imports and sees a device,
else from the very same ``kernels/*.cu`` sources compiled at run time by CuPy
``RawModule`` (NVRTC); ``$SPRINT_KERNELS=compiled|rawmodule`` forces one.

RawModule kernel arguments follow kernels/common.cuh: pointers (CuPy arrays),
``long long`` for every integer or flag, ``float`` for real scalars;
:meth:`Backend.raw_launch` converts Python ints/bools/floats accordingly.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The C++ kernels (OpenMP) alternate with OpenBLAS (its own threads) many times
# per layer; OpenMP threads that spin-wait after a region steal the cores the
# next SGEMM needs (measured: whole cifar conv fwd+bwd up to ~2x slower on 2
# cores). Sleep instead, unless the user chose otherwise. Must be set before
# libgomp loads, i.e. before engine._sprint_cpu is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Launch rule of the 1-D kernels; must match kernels/common.cuh.
BLOCK = 256
MAX_BLOCKS = 1 << 20

_CHOICES = ("auto", "cpu", "gpu")


class BackendError(RuntimeError):
    """The requested backend cannot run here (no GPU, no extension): a user's
    setup problem with a message to show, not a bug."""

_KERNEL_MODES = ("compiled", "rawmodule")


def grid_1d(n: int) -> int:
    """Blocks of a grid-stride launch over n items (csrc/launch_util.cuh rule)."""
    return max(1, min((int(n) + BLOCK - 1) // BLOCK, MAX_BLOCKS))


# ---- kernel sources (package data) ----------------------------------------

def kernel_dir() -> Path:
    """Folder holding kernels/*.cu: the installed copy (engine/kernels) or,
    in an editable install / source checkout, the repository's kernels/."""
    here = Path(__file__).resolve().parent
    for cand in (here / "kernels", here.parent / "kernels"):
        if (cand / "common.cuh").is_file():
            return cand
    raise FileNotFoundError(f"kernels/*.cu not found next to {here} (broken install?)")


def kernel_files() -> list[Path]:
    return sorted(kernel_dir().glob("*.cu"))


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def prepared_source(path: str | os.PathLike) -> str:
    """The source NVRTC compiles: local ``#include "x.cuh"`` lines replaced by
    the header text (CuPy's cache key covers the code string, not headers
    pulled in with -I, so inlining keeps the cache honest)."""
    path = Path(path)
    seen: set[Path] = set()

    def expand(p: Path) -> str:
        if p in seen:  # #pragma once semantics
            return ""
        seen.add(p)
        text = p.read_text()

        def sub(m: re.Match) -> str:
            inc = p.parent / m.group(1)
            if not inc.is_file():
                raise FileNotFoundError(f"{p.name}: included file {m.group(1)} not found")
            return expand(inc)

        return _INCLUDE_RE.sub(sub, text).replace("#pragma once", "")

    return expand(path)


NVRTC_OPTIONS = ("--std=c++17",)


def kernel_names(source: str) -> list[str]:
    return re.findall(r'extern\s+"C"\s+__global__\s+void\s+(\w+)', source)


# ---- the backend object -----------------------------------------------------

@dataclass
class Backend:
    name: str                      # 'cpu' | 'gpu'
    xp: Any                        # numpy | cupy
    ext: Any                       # engine._sprint_cpu | engine._sprint_cuda | RawKernels
    kernels: str                   # 'cpp' | 'compiled' | 'rawmodule'
    _local: threading.local = field(default_factory=threading.local, repr=False)

    @property
    def is_gpu(self) -> bool:
        return self.name == "gpu"

    # GPU helpers (meaningless on CPU) ------------------------------------
    def stream_ptr(self) -> int:
        return int(self.xp.cuda.get_current_stream().ptr) if self.is_gpu else 0

    @staticmethod
    def ptr(a) -> int:
        """Device pointer of a CuPy array (0 for None)."""
        return 0 if a is None else int(a.data.ptr)

    def raw_launch(self, kernel: str, args, n: int | None = None, grid: int | None = None,
                   block: int = BLOCK) -> None:
        """Launch a RawModule kernel: grid from n (grid-stride rule) or given."""
        fn = self.ext.function(kernel)
        g = grid if grid is not None else grid_1d(n)
        fn((int(g),), (int(block),), tuple(_raw_arg(a) for a in args))

    # Per-thread scratch buffers, grown on demand and reused: big fresh
    # allocations page-fault on every call, which costs as much as the kernel.
    def workspace(self, key: str, n: int, dtype=np.float32):
        cache = getattr(self._local, "ws", None)
        if cache is None:
            cache = self._local.ws = {}
        buf = cache.get((key, np.dtype(dtype)))
        if buf is None or buf.size < n:
            buf = self.xp.empty(max(int(n), 1), dtype=dtype)
            cache[(key, np.dtype(dtype))] = buf
        return buf[:n]

    def release_workspace(self) -> None:
        self._local.ws = {}


def _raw_arg(a):
    if isinstance(a, (bool, np.bool_)):
        return np.int64(bool(a))
    if isinstance(a, (int, np.integer)):
        return np.int64(a)
    if isinstance(a, (float, np.floating)):
        return np.float32(a)
    return a


class RawKernels:
    """kernels/*.cu compiled by CuPy RawModule (NVRTC) on first use."""

    def __init__(self, cupy):
        self._cp = cupy
        self._modules: dict[Path, Any] = {}
        self._where: dict[str, Path] = {}
        for f in kernel_files():
            for k in kernel_names(f.read_text()):
                self._where[k] = f
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return sorted(self._where)

    def function(self, name: str):
        f = self._where.get(name)
        if f is None:
            raise KeyError(f"no kernel {name!r} in {kernel_dir()}")
        with self._lock:
            mod = self._modules.get(f)
            if mod is None:
                mod = self._cp.RawModule(code=prepared_source(f), options=NVRTC_OPTIONS)
                self._modules[f] = mod
        return mod.get_function(name)


_state = threading.Lock()
_current: Backend | None = None
_requested: str | None = None


def _env_choice() -> str:
    v = os.environ.get("SPRINT_DEVICE", "auto").strip().lower() or "auto"
    if v not in _CHOICES:
        raise ValueError(f"SPRINT_DEVICE must be one of {_CHOICES}, got {v!r}")
    return v


def _gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        return f"CuPy is not importable ({type(e).__name__}: {e}); install cupy-cuda13x"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"CuPy sees no CUDA device ({type(e).__name__}: {e})"
    return None if n > 0 else "CuPy sees no CUDA device (device count 0)"


def _make_cpu() -> Backend:
    try:
        from engine import _sprint_cpu
    except ImportError as e:
        raise BackendError("the C++ extension engine._sprint_cpu is not built: run "
                           "`pip install -e .` in the repository") from e
    return Backend("cpu", np, _sprint_cpu, "cpp")


def _make_gpu() -> Backend:
    reason = _gpu_unavailable_reason()
    if reason:
        raise BackendError(f"GPU backend requested but unavailable: {reason}. "
                           "Use --device cpu / SPRINT_DEVICE=cpu.")
    import cupy
    mode = os.environ.get("SPRINT_KERNELS", "").strip().lower()
    if mode and mode not in _KERNEL_MODES:
        raise ValueError(f"SPRINT_KERNELS must be one of {_KERNEL_MODES}, got {mode!r}")
    if mode in ("", "compiled"):
        try:
            from engine import _sprint_cuda
            if _sprint_cuda.device_count() > 0:
                return Backend("gpu", cupy, _sprint_cuda, "compiled")
            why = "sees no device"
        except ImportError as e:
            why = f"is not importable ({e})"
        if mode == "compiled":
            raise BackendError(f"SPRINT_KERNELS=compiled but engine._sprint_cuda {why}")
    return Backend("gpu", cupy, RawKernels(cupy), "rawmodule")


def set_backend(kind: str = "auto") -> Backend:
    """Select the backend now ('auto' | 'cpu' | 'gpu'); returns it."""
    global _current, _requested
    if kind is None:
        kind = "auto"
    if not isinstance(kind, str) or kind.lower() not in _CHOICES:
        raise ValueError(f"device must be one of {_CHOICES}, got {kind!r}")
    kind = kind.lower()
    with _state:
        if kind == "cpu":
            be = _make_cpu()
        elif kind == "gpu":
            be = _make_gpu()
        else:
            be = _make_gpu() if _gpu_unavailable_reason() is None else _make_cpu()
        _current, _requested = be, kind
    return be


def get_backend() -> Backend:
    """The current backend (chosen from $SPRINT_DEVICE on first use)."""
    be = _current
    return be if be is not None else set_backend(_env_choice())


def _cuda():
    """The GPU backend's ``cuda`` namespace (cupy.cuda), or None on the CPU."""
    be = get_backend()
    return getattr(be.xp, "cuda", None) if be.is_gpu else None


def follow_device():
    """A function that makes the thread calling it use the GPU the calling
    thread uses now. The CUDA runtime's current device is per thread and a
    new thread starts on device 0, so a rank's helper threads (data loader,
    workers) must adopt the rank's GPU before they allocate or launch.
    A no-op on the CPU."""
    cuda = _cuda()
    if cuda is None:
        return lambda: None
    dev = int(cuda.runtime.getDevice())
    return lambda: cuda.Device(dev).use()


def synchronize():
    """Wait for the work queued on the calling thread's current stream (a
    no-op on the CPU): due before device arrays change threads, since
    another thread's stream may not wait for this one."""
    cuda = _cuda()
    if cuda is not None:
        cuda.get_current_stream().synchronize()


def asarray(a, dtype=np.float32):
    """A C-contiguous array of the current backend (copies only if needed)."""
    xp = get_backend().xp
    return xp.ascontiguousarray(xp.asarray(a, dtype=dtype))


def to_host(a) -> np.ndarray:
    """A NumPy array (device arrays are copied to the host)."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)
    return get() if callable(get) else np.asarray(a)


def source_digest() -> str:
    """Hash of all kernel sources (for logs / cache keys)."""
    h = hashlib.sha256()
    for f in kernel_files():
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def describe() -> str:
    be = get_backend()
    s = f"{be.name} ({be.kernels})"
    if be.name == "cpu":
        s += f", {be.ext.get_num_threads()} OpenMP threads"
    return s
