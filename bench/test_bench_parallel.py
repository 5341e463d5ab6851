"""The ASGD machinery's own cost on the cifar parameter vector (N_Param =
3.2 M), against a numpy.copyto of one N_Param buffer timed interleaved in the
same run:

* updater step with two non-empty worker buffers (SumGradient, AddMomentum,
  a local Allreduce, UpdateMomentum, UpdateWeights) -- the T_Update floor;
* worker hand-over: ComputeUpdateVal + UpdateGradient into an empty buffer.

    pytest bench/test_bench_parallel.py --benchmark-only
The end-to-end numbers (throughput, wait shares, allreduce over -n 1..4,
sync vs ASGD) come from bench/parallel_bench.py and bench/parallel_allreduce.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import interleaved
from engine.parallel.asgd import ASGD, ASGDConfig
from engine.spec import get_spec, n_params

N = n_params(get_spec("cifar"))


class _Fixed:
    """Worker source stub: never run as a thread here, only holds buffers."""

    def __init__(self):
        self.weights = np.zeros(N, np.float32)


@pytest.fixture(scope="module")
def asgd():
    rng = np.random.default_rng(0)
    a = ASGD(None, rng.standard_normal(N).astype(np.float32), [_Fixed(), _Fixed()],
             ASGDConfig(lr=0.01, momentum=0.9, min_grads=0))
    a._grad = rng.standard_normal(N).astype(np.float32)
    return a


def _fill(a):
    for b in a.bufs:
        b.data[...] = a._grad
        b.empty = False
        b.n, b.grads, b.versions = 16, 1, [a.version]


def _handover(a, upd):
    # ComputeUpdateVal + UpdateGradient as a worker does them (buffer empty: swap)
    np.multiply(a._grad, -0.01, out=upd)
    buf = a.bufs[0]
    with buf.lock:
        buf.data, upd = upd, buf.data
        buf.empty = True        # reset so the next call swaps again
    return upd


def test_updater_step_vs_memcpy(benchmark, asgd, summary):
    src, dst = np.ones(N, np.float32), np.empty(N, np.float32)
    upd = np.empty(N, np.float32)

    def update():
        _fill(asgd)
        asgd._update()

    def fill_only():
        _fill(asgd)

    med = interleaved({"update": update, "fill": fill_only, "memcpy": lambda: np.copyto(dst, src),
                       "handover": lambda: _handover(asgd, upd)}, reps=9)
    step = med["update"] - med["fill"]
    ratio = step / med["memcpy"]
    hand = med["handover"] / med["memcpy"]
    benchmark.extra_info.update({"n_param": N, "update_s": step, "memcpy_s": med["memcpy"],
                                 "update_vs_memcpy": ratio, "handover_vs_memcpy": hand})
    benchmark.pedantic(update, rounds=3, iterations=1)
    summary(f"ASGD updater step (2 buffers, cifar N_Param {N:,}): {1e3 * step:.2f} ms = {ratio:.1f}x memcpy; "
            f"worker hand-over {hand:.1f}x memcpy")
    # sum of 2 buffers + momentum slice + delta: a handful of passes over N_Param
    assert ratio < 20
