#!/usr/bin/env bash
# One script for a lent GPU: build with CUDA, then, each step under its own
# time limit and all within one budget, the `gpu` tests (compiled module and
# RawModule against the CPU kernels), the GPU selfcheck with both kernel
# paths, the main job on the GPU, every training strategy on the GPU against
# its CPU twin, the engine against PyTorch + cuDNN, the GPU benchmarks, ASGD
# with two streams and compute-sanitizer's memcheck; a short table last.
#
#   bash bench/gpu_check.sh                    # every step
#   GPU_CHECK_STEPS="bench asgd" bash bench/gpu_check.sh   # only these (after the build)
#   GPU_CHECK_BUDGET=400 ...                   # seconds for everything (default 420)
#
# Results: $OUT/gpu_check.tar.gz (every log and JSON) and $OUT/summary.txt when
# $OUT is set (the device tool brings back at most 8 files), else bench/results.
# On the device tool's H200 image, which has no MPI library: first, on the
# machine you call from, `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 --platform
# manylinux1_x86_64 -d .whl mpich==5.0.2 mpi4py==4.1.2`, carry `.whl`, and
# start the command with `python3 -m pip install -q --no-index --no-deps
# --force-reinstall .whl/*.whl;`.
# Needs: nvcc (CUDA 13), CMake, a C++17 compiler, CuPy for CUDA 13, pytest,
# pytest-benchmark, mpi4py + an MPI (mpiexec), PyTorch with CUDA for the cuDNN
# comparison (skipped without it).
set -uo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$(command -v python3 || command -v python)}
if ! command -v python >/dev/null; then  # tests and tools call `python`
    mkdir -p /tmp/gpu_check_bin && ln -sf "$PY" /tmp/gpu_check_bin/python && export PATH=/tmp/gpu_check_bin:$PATH
fi
if [ -n "${OUT:-}" ]; then RESULTS=$(mktemp -d /tmp/gpu_check.XXXX); else RESULTS=bench/results; fi
mkdir -p "$RESULTS"
BUDGET=${GPU_CHECK_BUDGET:-420}
STEPS=${GPU_CHECK_STEPS:-tests selfcheck_compiled selfcheck_rawmodule train strategies cudnn bench asgd sanitizer}
START=$SECONDS
FAILED=0
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

log() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - START))" "$*" | tee -a "$RESULTS/summary.txt"; }
pack() {  # everything into one file for the device tool
    if [ -n "${OUT:-}" ]; then
        cp bench/results/*_gpu.json "$RESULTS"/ 2>/dev/null
        tar czf "$OUT/gpu_check.tar.gz" --exclude="*.npz" -C "$RESULTS" . && cp "$RESULTS/summary.txt" "$OUT/summary.txt"
    fi
}
trap pack EXIT
step() {  # step NAME LIMIT CMD...: run if chosen and time is left, keep going on failure
    local name=$1 limit=$2 left
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    left=$((BUDGET - (SECONDS - START) - 10))
    if [ "$left" -lt 20 ]; then
        log "$name SKIPPED (budget spent)"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    log "$name (limit ${limit}s)"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    local rc=$?
    tail -n 12 "$RESULTS/$name.log"
    if [ $rc -ne 0 ]; then
        FAILED=$((FAILED + 1))
        log "$name FAILED (exit $rc$([ $rc -eq 124 ] && echo ', out of time'), $((SECONDS - t0))s)"
    else
        log "$name ok ($((SECONDS - t0))s)"
    fi
}

log "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader \
    | tee -a "$RESULTS/summary.txt" || { log "nvidia-smi failed: no GPU here"; exit 2; }
"$PY" -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())" \
    2>&1 | tee -a "$RESULTS/summary.txt" || { log "CuPy is not importable: pip install cupy-cuda13x"; exit 2; }
(nvcc --version | tail -n 2; g++ --version | head -n 1; cmake --version | head -n 1; command -v mpiexec) \
    >>"$RESULTS/summary.txt" 2>&1

# A CUDA compile error stops everything.
log "build (SPRINT_CUDA=1)"
if ! SPRINT_CUDA=1 SPRINT_BUILD_JOBS="$(nproc)" timeout 300 "$PY" setup.py -q build_ext --inplace \
        >"$RESULTS/build.log" 2>&1; then
    tail -n 40 "$RESULTS/build.log"
    log "build FAILED"
    exit 3
fi
"$PY" -c "from engine import _sprint_cuda as m; print('engine._sprint_cuda devices:', m.device_count())" \
    2>&1 | tee -a "$RESULTS/summary.txt"
log "build ok"

step tests 150 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider tests/
step selfcheck_compiled 60 env SPRINT_KERNELS=compiled "$PY" -m engine.cli --device gpu selfcheck
step selfcheck_rawmodule 60 env SPRINT_KERNELS=rawmodule "$PY" -m engine.cli --device gpu selfcheck
step train 60 "$PY" -m engine.cli train --device gpu --no-progress --out "$RESULTS/main_job"
step strategies 150 "$PY" bench/gpu_strategies.py --out "$RESULTS/strategies" --timeout 90
step cudnn 120 "$PY" bench/gpu_vs_cudnn.py --out "$RESULTS/gpu_vs_cudnn.json" --reps 30
step bench 150 "$PY" -m pytest -q -s -m gpu -p no:cacheprovider --benchmark-only \
    --benchmark-min-rounds=3 --benchmark-max-time=0.2 \
    bench/test_bench_im2col.py bench/test_bench_gemm.py bench/test_bench_conv.py bench/test_bench_train.py
step asgd 60 "$PY" bench/parallel_gpu_check.py --seconds 8
# out-of-bounds and misaligned accesses in the compiled kernels (cuBLAS's own are not checked)
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
step sanitizer 120 env SPRINT_KERNELS=compiled "$SANITIZER" --tool memcheck --error-exitcode 9 \
    --check-api-memory-access yes "$PY" -m engine.cli --device gpu selfcheck

log "summary"
"$PY" - "$RESULTS" <<'PY' | tee -a "$RESULTS/summary.txt"
import json, sys
from pathlib import Path

res = Path(sys.argv[1])
def load(name):
    for d in (res, Path("bench/results")):
        if (d / name).is_file():
            return json.loads((d / name).read_text())
    return None

rows = []
g = load("sgemm_sweep_gpu.json")
if g:
    best = max(g["records"], key=lambda r: r["gflops"])
    rows.append(("SGEMM best (cuBLAS)", f"{best['gflops']:.0f} GFLOP/s at {best['m']}x{best['n']}x{best['k']}"))
c = load("conv_cifar_gpu.json")
if c:
    t_c = sum(r["conv_s"] for r in c["layers"]); t_g = sum(r["sgemm_s"] for r in c["layers"])
    fl = sum(r["flops"] for r in c["layers"])
    rows.append((f"conv fwd+bwd cifar b32 ({c['backend']})",
                 f"{fl / t_c / 1e9:.0f} GFLOP/s = {t_g / t_c:.2f} x SGEMM"))
i = load("im2col_sweep_gpu.json")
if i:
    r = [x for x in i["records"] if x["name"] == "cifar-conv2"][0]
    rows.append(("im2col cifar-conv2", f"{r['im2col_gbps']:.0f} GB/s = {r['im2col_vs_memcpy']:.2f} x memcpy"))
    rows.append(("col2im cifar-conv2", f"{r['col2im_gbps']:.0f} GB/s = {r['col2im_vs_memcpy']:.2f} x memcpy"))
d = load("gpu_vs_cudnn.json")
if d:
    for r in d["rows"]:
        if r["case"].startswith("step"):
            for k in ("compiled", "rawmodule"):
                if f"{k}_s" in r:
                    rows.append((f"cifar {r['case']} {k} vs cuDNN fp32",
                                 f"{1e3 * r[k + '_s']:.2f} ms vs {1e3 * r['cudnn_fp32_s']:.2f} ms = "
                                 f"{r[k + '_vs_cudnn_fp32']:.2f}x"))
s = res / "strategies" / "gpu_strategies.json"
if s.is_file():
    st = json.loads(s.read_text())
    rows.append(("strategies on the GPU", f"{sum(r['ok'] for r in st)}/{len(st)} ok: "
                 + ", ".join(r["job"] for r in st if not r["ok"])))
w = max((len(a) for a, _ in rows), default=10)
print("-" * (w + 50))
for a, b in rows or [("(no GPU benchmark results)", "")]:
    print(f"{a:<{w}}  {b}")
print("-" * (w + 50))
PY
log "done, $FAILED step(s) failed"
exit "$FAILED"
