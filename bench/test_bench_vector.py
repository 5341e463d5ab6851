"""Vector ops of the optimizer and SPRINT's updater over N_Param sizes, as
GB/s against a numpy.copyto of one buffer timed interleaved with it. The
medians go to bench/results/vector_sweep.json ({"machine", "backend",
"records": [{op, n, seconds, gbps, memcpy_gbps, ratio_vs_memcpy}]}, the
layout of the other sweeps) for the performance model (T_Update terms).

    pytest bench/test_bench_vector.py --benchmark-only -s
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import backend, ops
from engine.spec import get_spec, n_params
from conftest import machine_info, save_json
from k2_bandwidth import measure

RESULTS = "vector_sweep.json"  # in bench/results/
# powers of 4 from 1K to 16M floats, plus the N_Param of two presets
SIZES = sorted({4 ** e for e in range(5, 13)} | {n_params(get_spec("digits")), n_params(get_spec("cifar"))})
N_SUM = 4  # buffers summed by sum_into (SPRINT's SumGradient over 4 workers)

# floats moved per element: reads + writes
TRAFFIC = {"memcpy": 2, "axpy": 3, "momentum_step": 5, "sum_into": N_SUM + 1}

_records: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _write_sweep():
    backend.set_backend("cpu")
    yield
    if _records:
        save_json(RESULTS, {"machine": machine_info(), "backend": "cpu", "records": _records})


def _case(op, n):
    rng = np.random.default_rng(n)
    bufs = [rng.standard_normal(n).astype(np.float32) for _ in range(N_SUM + 1)]
    if op == "memcpy":
        return lambda: np.copyto(bufs[1], bufs[0])
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
