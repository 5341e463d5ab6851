"""Build of the SPRINT engine's compiled modules: setuptools drives CMake.

Environment:
  SPRINT_CUDA=0|1|auto   build engine._sprint_cuda (auto: when nvcc is found).
                         With 1 a missing nvcc is an error; a CUDA compile error
                         always fails the build.
  SPRINT_BUILD_JOBS=N    parallel compile jobs (default: CPU count).
  CMAKE_ARGS             extra arguments for the CMake configure step.

The CMake build folder is build/cmake-<python tag> in the source tree and is
kept between installs: a second `pip install -e .` recompiles only what changed
(delete the folder to force a clean build).
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


def _stable_pybind11(build_dir: Path) -> str:
    """pybind11's CMake config and headers copied (mtimes kept) into the build
    folder. pip builds in an isolated environment whose path changes on every
    install; pointing CMake there would change every binding's include flags
    and recompile them each time."""
    import pybind11

    src = Path(pybind11.get_cmake_dir()).parents[2]          # .../pybind11
    dst = build_dir / f"pybind11-{pybind11.__version__}"
    if not (dst / "share").is_dir() or not (dst / "include").is_dir():
        tmp = build_dir / f".pybind11-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for part in ("include", "share"):
            shutil.copytree(src / part, tmp / part)         # copy2: mtimes kept
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    return str(dst / "share" / "cmake" / "pybind11")


def _cached_generator(build_dir: Path) -> str | None:
    cache = build_dir / "CMakeCache.txt"
    if cache.exists():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith("CMAKE_GENERATOR:INTERNAL="):
                return line.split("=", 1)[1]
    return None


class CMakeBuild(build_ext):
    """Configure once into a stable folder of the source tree,
    ``build/cmake-<python tag>``, then build each extension's CMake target and
    copy it where setuptools expects it (the source tree for editable installs).

    The folder outlives the temporary directories of ``pip install -e .``, so a
    reinstall with no source change only re-links nothing and copies two files
    (seconds), and a changed source recompiles only what depends on it. A
    folder that no longer configures (moved tree, other generator) is wiped and
    configured afresh."""

    _configured: set[Path] = set()

    def _configure(self, build_dir: Path) -> None:
        if build_dir in self._configured:
            return
        use_cuda, nvcc = cuda_wanted()

        def args() -> list[str]:
            cfg = [
                "cmake", "-S", str(ROOT), "-B", str(build_dir),
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DPython_EXECUTABLE={sys.executable}",
                f"-Dpybind11_DIR={_stable_pybind11(build_dir)}",
                f"-DSPRINT_OUTPUT_DIR={build_dir / 'out'}",
                f"-DSPRINT_CUDA={'ON' if use_cuda else 'OFF'}",
            ]
            if nvcc:
                cfg.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
            return cfg + shlex.split(os.environ.get("CMAKE_ARGS", ""))

        want_gen = os.environ.get("CMAKE_GENERATOR")
        if want_gen and _cached_generator(build_dir) not in (None, want_gen):
            shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        cfg = args()
        # Same arguments as last time: `cmake --build` re-runs the configure
        # step itself when CMakeLists.txt or a globbed source list changed.
        stamp = build_dir / "configure-args.txt"
        if (build_dir / "CMakeCache.txt").exists() and stamp.exists() and stamp.read_text() == repr(cfg):
            self._configured.add(build_dir)
            return
        if subprocess.run(cfg).returncode != 0:
            if not (build_dir / "CMakeCache.txt").exists():
                raise RuntimeError("CMake configure failed")
            print(f"CMake configure failed with the cache in {build_dir}: configuring afresh", flush=True)
            shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True)
            cfg = args()
            subprocess.run(cfg, check=True)
        stamp.write_text(repr(cfg))
        self._configured.add(build_dir)

    def build_extension(self, ext: CMakeExtension) -> None:
        build_dir = ROOT / "build" / f"cmake-{sys.implementation.cache_tag}"
        self._configure(build_dir)
        jobs = os.environ.get("SPRINT_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build_dir), "--target", ext.target,
                        "--parallel", jobs], check=True)
        name = Path(self.get_ext_filename(ext.name)).name
        built = build_dir / "out" / name
        if not built.exists():
            raise RuntimeError(f"CMake did not produce {built}")
        dest = Path(self.get_ext_fullpath(ext.name)).resolve()
        dest.parent.mkdir(parents=True, exist_ok=True)
        # temp + rename: a running process keeps its mapped copy intact
        tmp = dest.with_name(f".{name}.{os.getpid()}.tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, dest)


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
