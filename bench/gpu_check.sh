#!/usr/bin/env bash
# One script for the lent GPU (< 6 min): build with CUDA, run the `gpu` tests
# (compiled module and RawModule vs the CPU kernels), the GPU selfcheck with
# both kernel paths and the GPU benchmarks, then print a short table.
#
#   bash bench/gpu_check.sh            # results in $OUT (if set) or bench/results
#
# Needs: nvcc (CUDA 13), CuPy for CUDA 13 (pip install cupy-cuda13x), pytest,
# pytest-benchmark, setuptools, pybind11 already installed.
set -euo pipefail

cd "$(dirname "$0")/.."
RESULTS="${OUT:-bench/results}"
mkdir -p "$RESULTS"
START=$SECONDS
FAILED=0

log() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - START))" "$*"; }
step() {  # step NAME TIMEOUT CMD...: run, keep going on failure, remember it
    local name=$1 limit=$2
    shift 2
    log "$name"
    if ! timeout "$limit" "$@" 2>&1 | tee "$RESULTS/gpu_check_${name}.log"; then
        log "$name FAILED"
        FAILED=$((FAILED + 1))
    fi
}

log "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || {
    echo "gpu_check: nvidia-smi failed: no GPU here" >&2
    exit 2
}
python -c "import cupy; print('cupy', cupy.__version__, 'devices', cupy.cuda.runtime.getDeviceCount())" || {
    echo "gpu_check: CuPy is not importable: pip install cupy-cuda13x" >&2
    exit 2
}

# A CUDA compile error must stop everything.
log "build (SPRINT_CUDA=1)"
SPRINT_CUDA=1 SPRINT_BUILD_JOBS="$(nproc)" timeout 300 \
    python -m pip install -e . --no-build-isolation --no-deps -q
python -c "from engine import _sprint_cuda as m; print('engine._sprint_cuda devices:', m.device_count())"

step tests 150 python -m pytest -q -m gpu -rs -p no:cacheprovider tests/
step selfcheck_compiled 60 env SPRINT_KERNELS=compiled python -m engine.cli --device gpu selfcheck
step selfcheck_rawmodule 60 env SPRINT_KERNELS=rawmodule python -m engine.cli --device gpu selfcheck
step asgd_two_streams 90 python bench/parallel_gpu_check.py --seconds 15
step bench 150 python -m pytest -q -s -m gpu -p no:cacheprovider --benchmark-only \
    --benchmark-min-rounds=3 --benchmark-max-time=0.2 \
    bench/test_bench_im2col.py bench/test_bench_gemm.py bench/test_bench_conv.py \
    bench/test_bench_train.py

log "summary"
python - "$RESULTS" <<'PY'
import json, sys
from pathlib import Path

res = Path(sys.argv[1])
local = Path("bench/results")
def load(name):
    for d in (res, local):
        p = d / name
        if p.is_file():
            return json.loads(p.read_text())
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
w = max(len(a) for a, _ in rows) if rows else 10
print("-" * (w + 40))
for a, b in rows or [("(no GPU benchmark results)", "")]:
    print(f"{a:<{w}}  {b}")
print("-" * (w + 40))
PY

for f in tests selfcheck_compiled selfcheck_rawmodule bench; do
    if [ -f "$RESULTS/gpu_check_$f.log" ]; then
        printf '%-20s %s\n' "$f" "$(tail -n 1 "$RESULTS/gpu_check_$f.log")"
    fi
done
log "done, $FAILED step(s) failed"
exit "$FAILED"
