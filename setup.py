"""Build of the SPRINT engine's compiled modules: setuptools drives CMake.

Environment:
  SPRINT_CUDA=0|1|auto   build engine._sprint_cuda (auto: when nvcc is found).
                         With 1 a missing nvcc is an error; a CUDA compile error
                         always fails the build.
  SPRINT_BUILD_JOBS=N    parallel compile jobs (default: CPU count).
  CMAKE_ARGS             extra arguments for the CMake configure step.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def find_nvcc() -> str | None:
    for cand in (os.environ.get("CUDACXX"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
                 shutil.which("nvcc")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def cuda_wanted() -> tuple[bool, str | None]:
    mode = os.environ.get("SPRINT_CUDA", "auto").strip().lower()
    if mode not in ("0", "1", "auto", "off", "on"):
        sys.exit(f"SPRINT_CUDA must be 0, 1 or auto, not {mode!r}")
    if mode in ("0", "off"):
        return False, None
    nvcc = find_nvcc()
    if nvcc is None and mode in ("1", "on"):
        sys.exit("SPRINT_CUDA=1 but nvcc was not found (set CUDACXX or CUDA_HOME)")
    return nvcc is not None, nvcc


class CMakeExtension(Extension):
    def __init__(self, name: str, target: str):
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    """Configure once, then build each extension's CMake target into the folder
    setuptools expects (the source tree for editable installs)."""

    def build_extension(self, ext: CMakeExtension) -> None:
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        out_dir.mkdir(parents=True, exist_ok=True)
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        use_cuda, nvcc = cuda_wanted()
        cfg = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DSPRINT_OUTPUT_DIR={out_dir}",
            f"-DSPRINT_CUDA={'ON' if use_cuda else 'OFF'}",
        ]
        if nvcc:
            cfg.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        cfg += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        jobs = os.environ.get("SPRINT_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(cfg, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", ext.target,
                        "--parallel", jobs], check=True)
        built = out_dir / Path(self.get_ext_filename(ext.name)).name
        if not built.exists():
            raise RuntimeError(f"CMake did not produce {built}")


def extensions() -> list[CMakeExtension]:
    exts = [CMakeExtension("engine._sprint_cpu", "_sprint_cpu")]
    if cuda_wanted()[0]:
        exts.append(CMakeExtension("engine._sprint_cuda", "_sprint_cuda"))
    return exts


setup(
    # kernels/*.cu ship as data (engine.kernels) so CuPy RawModule can compile
    # the same sources at run time on a machine without nvcc.
    packages=find_packages(include=["engine", "engine.*"]) + ["engine.kernels"],
    package_dir={"engine.kernels": "kernels"},
    package_data={"engine.kernels": ["*.cu", "*.cuh"],
                  "engine.data": ["digits.csv.gz", "DIGITS_LICENSE.txt"],
                  "engine.perf": ["*.json"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
