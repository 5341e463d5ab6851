"""Softmax + cross-entropy + gradient over (N, K): classifier heads of the
presets (K = 10) and ImageNet-sized ones (K = 1000), as GB/s against a
numpy.copyto of the logits timed interleaved with it; NumPy's own
vectorised softmax on the same shapes for reference.

    pytest bench/test_bench_softmax.py --benchmark-only   (SPRINT_BENCH_THREADS=n: OpenMP threads)
"""
from __future__ import annotations

import numpy as np
import pytest

from engine import ops
from k2_bandwidth import measure, use_cpu

SHAPES = [(32, 10), (128, 10), (1024, 10), (32, 1000), (256, 1000), (1024, 1000)]


@pytest.fixture(scope="module", autouse=True)
def _cpu():
    use_cpu()


def _case(n, k):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, k)) * 3).astype(np.float32), rng.integers(0, k, n)


def _numpy_softmax_xent(z, y):
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True)
    p = e / s
    loss = float(np.mean(np.log(s[:, 0]) - (z[np.arange(len(y)), y] - m[:, 0])))
    d = p.copy()
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    return loss, d, p


@pytest.mark.parametrize("impl", ["engine", "numpy"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_softmax_xent(benchmark, summary, shape, impl):
    z, y = _case(*shape)
    if impl == "engine":
        d, p = np.empty_like(z), np.empty_like(z)
        fn = lambda: ops.softmax_xent(z, y, dlogits_out=d, probs_out=p)  # noqa: E731
    else:
        fn = lambda: _numpy_softmax_xent(z, y)  # noqa: E731
    benchmark.group = f"softmax_xent {shape[0]}x{shape[1]}"
    # reads logits, writes probs and dlogits
    measure(benchmark, fn, 3 * z.nbytes, z.nbytes, summary=summary, op=f"softmax_xent_{impl}",
            shape=shape)
