"""Every kernels/*.cu compiles for sm_90 with nvcc (the compiled-module path)
and with NVRTC exactly as CuPy RawModule would compile it (the run-time path).
Neither needs a GPU."""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import shutil
import subprocess

import pytest

from engine import backend

KERNELS = backend.kernel_files()
IDS = [f.name for f in KERNELS]


def _nvcc() -> str | None:
    cand = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return cand if os.path.isfile(cand) else shutil.which("nvcc")


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found (CUDA toolkit not installed)")
@pytest.mark.parametrize("cu", KERNELS, ids=IDS)
def test_nvcc_compiles_kernel_for_sm90(cu, tmp_path):
    out = tmp_path / (cu.stem + ".cubin")
    r = subprocess.run([_nvcc(), "-std=c++17", "-arch=sm_90", "-cubin", "-Werror", "all-warnings",
                        "-I", str(cu.parent), "-o", str(out), str(cu)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"nvcc failed on {cu.name}:\n{r.stderr}"
    assert out.stat().st_size > 0


def _find_nvrtc() -> str | None:
    paths = []
    spec = importlib.util.find_spec("nvidia")  # PyPI nvidia-cuda-nvrtc
    for root in (spec.submodule_search_locations if spec else []):
        paths += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    paths += sorted(glob.glob(os.path.join(cuda, "lib64", "libnvrtc.so*")))
    paths = [p for p in paths if "builtins" not in p]
    if paths:
        return paths[0]
    return ctypes.util.find_library("nvrtc")


class NVRTC:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)

    def _check(self, code: int, what: str, log: str = "") -> None:
        if code != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            msg = self.lib.nvrtcGetErrorString(code).decode()
            raise AssertionError(f"{what}: {msg}\n{log}")

    def compile(self, source: str, name: str, options: list[str]) -> str:
        lib = self.lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            code = lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            self._check(code, f"NVRTC compile of {name}", log.value.decode(errors="replace"))
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
            return ptx.value.decode()
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


NVRTC_PATH = _find_nvrtc()


@pytest.mark.skipif(NVRTC_PATH is None,
                    reason="libnvrtc not found: pip install 'nvidia-cuda-nvrtc>=13,<14' (in the [test] extra)")
@pytest.mark.parametrize("cu", KERNELS, ids=IDS)
def test_nvrtc_compiles_kernel_as_rawmodule_would(cu):
    src = backend.prepared_source(cu)
    ptx = NVRTC(NVRTC_PATH).compile(src, cu.name, ["--gpu-architecture=compute_90", *backend.NVRTC_OPTIONS])
    for name in backend.kernel_names(src):
        assert f".entry {name}(" in ptx, f"{name} missing from the PTX of {cu.name}"


def test_nvrtc_reports_errors():
    if NVRTC_PATH is None:
        pytest.skip("libnvrtc not found")
    with pytest.raises(AssertionError, match="NVRTC compile"):
        NVRTC(NVRTC_PATH).compile('extern "C" __global__ void k() { undefined_symbol(); }', "bad.cu",
                                  ["--gpu-architecture=compute_90"])


def test_cuda_module_built_when_nvcc_present():
    """The build compiles engine._sprint_cuda whenever nvcc is found (SPRINT_CUDA=auto)."""
    if _nvcc() is None or os.environ.get("SPRINT_CUDA", "auto") in ("0", "off"):
        pytest.skip("CUDA build not expected")
    spec = importlib.util.find_spec("engine._sprint_cuda")
    assert spec is not None, "engine._sprint_cuda missing although nvcc is present: rebuild with pip install -e ."
