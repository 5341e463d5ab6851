"""Vector ops of the optimizer and SPRINT's updater over N_Param sizes, as
GB/s against a numpy.copyto of one buffer timed interleaved with it. The
medians go to bench/results/vector_sweep.json ({"machine", "backend",
"records": [{op, n, seconds, gbps, memcpy_gbps, ratio_vs_memcpy}]}, the
layout of the other sweeps) for the performance model (T_Update terms).

    pytest bench/test_bench_vector.py --benchmark-only
    SPRINT_BENCH_THREADS=1 pytest bench/test_bench_vector.py --benchmark-only
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import backend, ops
from engine.spec import get_spec, n_params
from conftest import interleaved, machine_info, save_json
from k2_bandwidth import measure, use_cpu

RESULTS = "vector_sweep.json"  # in bench/results/
# powers of 4 from 1K to 16M floats, plus the N_Param of two presets
SIZES = sorted({4 ** e for e in range(5, 13)} | {n_params(get_spec("digits")), n_params(get_spec("cifar"))})
N_SUM = 4  # buffers summed by sum_into (SPRINT's SumGradient over 4 workers)

# floats moved per element: reads + writes
TRAFFIC = {"memcpy": 2, "axpy": 3, "momentum_step": 5, "sum_into": N_SUM + 1}

_records: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _write_sweep():
    use_cpu()
    yield
    if _records:
        save_json(RESULTS, {"machine": machine_info(), "backend": "cpu", "records": _records})


def _case(op, n, xp=np):
    rng = np.random.default_rng(n)
    bufs = [xp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(N_SUM + 1)]
    if op == "memcpy":
        return lambda: xp.copyto(bufs[1], bufs[0])
    if op == "axpy":
        return lambda: ops.axpy(1e-3, bufs[0], bufs[1])
    if op == "momentum_step":
        return lambda: ops.momentum_step(bufs[0], bufs[1], bufs[2], 0.9)
    return lambda: ops.sum_into(bufs[N_SUM], bufs[:N_SUM])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", list(TRAFFIC))
def test_vector_op(benchmark, summary, op, n):
    benchmark.group = f"vector {op}"
    r = measure(benchmark, _case(op, n), TRAFFIC[op] * 4 * n, 4 * n, summary=summary, op=op, n=n)
    _records.append({"op": op, "n": n, **r})


@pytest.mark.gpu
def test_gpu_vector_sweep(benchmark, summary):
    """The same ops on the GPU (device-to-device copy as the baseline), timed
    with a stream synchronize; saved as bench/results/vector_sweep_gpu.json."""
    import cupy
    sync = cupy.cuda.get_current_stream().synchronize

    def sweep():
        recs = []
        for n in SIZES + [1 << 26]:
            fns = {op: _case(op, n, cupy) for op in TRAFFIC}
            t = interleaved(fns, reps=15, sync=sync)
            for op, s in t.items():
                gbps = TRAFFIC[op] * 4 * n / s / 1e9
                recs.append({"op": op, "n": n, "seconds": s, "gbps": round(gbps, 2),
                             "ratio_vs_memcpy": round(t["memcpy"] / s * TRAFFIC[op] / 2, 3)})
        return recs

    try:
        backend.set_backend("gpu")
        recs = benchmark.pedantic(sweep, rounds=1, iterations=1)
        save_json("vector_sweep_gpu.json", {"machine": machine_info(), "backend": "gpu", "records": recs})
        big = {r["op"]: r for r in recs if r["n"] == 1 << 26}
        summary("GPU vector ops at 64M floats: " + ", ".join(
            f"{op} {r['gbps']:.0f} GB/s ({r['ratio_vs_memcpy']:.2f} of copy)" for op, r in big.items()))
    finally:
        backend.set_backend("cpu")
