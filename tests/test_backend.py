"""Backend selection, kernel sources as package data, array helpers."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from engine import backend


def test_cpu_backend_is_available_and_default_here():
    be = backend.set_backend("cpu")
    assert be.name == "cpu" and be.xp is np and be.kernels == "cpp"
    assert be.ext.__name__ == "engine._sprint_cpu"
    assert backend.get_backend() is be
    assert be.ext.get_num_threads() >= 1


def test_bad_choice_is_a_value_error():
    with pytest.raises(ValueError, match="device"):
        backend.set_backend("tpu")


def test_gpu_request_without_gpu_is_a_clear_runtime_error():
    if backend._gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="GPU backend requested but unavailable"):
        backend.set_backend("gpu")
    assert backend.get_backend().name == "cpu"  # unchanged


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_env_variable_selects_backend():
    r = _run("from engine import backend; print(backend.get_backend().name)", SPRINT_DEVICE="cpu")
    assert r.returncode == 0 and r.stdout.strip() == "cpu", r.stderr
    r = _run("from engine import backend; backend.get_backend()", SPRINT_DEVICE="nonsense")
    assert r.returncode != 0 and "SPRINT_DEVICE" in r.stderr
    if backend._gpu_unavailable_reason() is not None:
        r = _run("from engine import backend; backend.get_backend()", SPRINT_DEVICE="gpu")
        assert r.returncode != 0 and "GPU backend requested" in r.stderr


def test_auto_falls_back_to_cpu_without_gpu():
    if backend._gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present")
    assert backend.set_backend("auto").name == "cpu"


def test_kernel_sources_are_found_and_prepared_for_nvrtc():
    files = backend.kernel_files()
    assert "im2col.cu" in {f.name for f in files}
    for f in files:
        src = backend.prepared_source(f)
        assert '#include "' not in src, f"{f.name}: local include left for NVRTC"
        assert "#pragma once" not in src
        names = backend.kernel_names(src)
        assert names, f"{f.name} declares no extern \"C\" __global__ kernel"
    assert "sprint_im2col_f32" in backend.kernel_names(backend.prepared_source(backend.kernel_dir() / "im2col.cu"))


def test_prepared_source_inlines_header_content(tmp_path):
    (tmp_path / "h.cuh").write_text("#pragma once\n#define MAGIC 42\n")
    (tmp_path / "k.cu").write_text('#include "h.cuh"\n#include "h.cuh"\nextern "C" __global__ void k() {}\n')
    src = backend.prepared_source(tmp_path / "k.cu")
    assert src.count("MAGIC 42") == 1 and "include" not in src


def test_grid_rule():
    assert backend.grid_1d(0) == 1
    assert backend.grid_1d(256) == 1
    assert backend.grid_1d(257) == 2
    assert backend.grid_1d(1 << 40) == backend.MAX_BLOCKS


def test_asarray_and_to_host():
    backend.set_backend("cpu")
    a = backend.asarray([[1, 2], [3, 4]])
    assert a.dtype == np.float32 and a.flags.c_contiguous
    f = np.asfortranarray(np.ones((3, 2), np.float32))
    assert backend.asarray(f).flags.c_contiguous
    assert backend.to_host(a) is a


def test_workspace_is_reused_and_grows():
    be = backend.set_backend("cpu")
    a = be.workspace("t", 10)
    b = be.workspace("t", 5)
    assert np.shares_memory(a, b) and b.size == 5
    c = be.workspace("t", 100)
    assert c.size == 100


def test_cuda_module_import_is_optional():
    """engine._sprint_cuda may or may not import on a machine without a GPU;
    when it does, it reports the device count without crashing."""
    try:
        from engine import _sprint_cuda
    except ImportError as e:
        pytest.skip(f"engine._sprint_cuda not built/importable: {e}")
    n = _sprint_cuda.device_count()
    assert n >= 0
    if n == 0:
        with pytest.raises(RuntimeError, match="CUDA error"):
            _sprint_cuda.im2col(1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="null device pointer"):
        _sprint_cuda.im2col(0, 1, 1, 1, 3, 3, 3, 3, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="kh"):
        _sprint_cuda.im2col(1, 1, 1, 1, 3, 3, 0, 3, 1, 1, 0, 0)


@pytest.mark.gpu
def test_gpu_backend_prefers_compiled_and_honours_override(monkeypatch):
    monkeypatch.delenv("SPRINT_KERNELS", raising=False)
    try:
        be = backend.set_backend("gpu")
        assert be.name == "gpu" and be.kernels in ("compiled", "rawmodule")
        monkeypatch.setenv("SPRINT_KERNELS", "rawmodule")
        assert backend.set_backend("gpu").kernels == "rawmodule"
        monkeypatch.setenv("SPRINT_KERNELS", "bogus")
        with pytest.raises(ValueError, match="SPRINT_KERNELS"):
            backend.set_backend("gpu")
    finally:
        backend.set_backend("cpu")
