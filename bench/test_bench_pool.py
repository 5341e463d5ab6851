"""Max pooling forward (values + argmax) and backward on the pooled layers
of the reference net (batch 32; 2x2 stride 2) and an overlapping 3x3/2
window, as GB/s against a numpy.copyto of the input timed interleaved with
it; PyTorch CPU max_pool2d (with indices) on the same shapes when
installed (optional, never required).

    pytest bench/test_bench_pool.py --benchmark-only   (SPRINT_BENCH_THREADS=n: OpenMP threads)
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import adaptive_median, in_fresh_process, torch_available
from engine import backend, ops
from k2_bandwidth import measure, use_cpu

# (N, C, H, W) of the conv outputs that are pooled in the `cifar` reference net
SHAPES = [(32, 64, 32, 32), (32, 128, 16, 16), (32, 256, 8, 8)]
WINDOWS = [(2, 2, 0), (3, 2, 1)]  # (k, stride, pad)


@pytest.fixture(scope="module", autouse=True)
def _cpu():
    use_cpu()


def _traffic(shape, k, s, p):
    """Bytes in + out: forward reads x, writes y and argmax; backward reads
    dy and argmax (once per overlapping window) and writes dx."""
    N, C, OH, OW = ops.pool_out_shape(shape, k, s, p)
    x_bytes = 4 * int(np.prod(shape))
    return x_bytes, x_bytes + 8 * N * C * OH * OW


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: "k{}s{}p{}".format(*w))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_maxpool(benchmark, summary, direction, shape, window):
    k, s, p = window
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y, am = ops.maxpool_forward(x, k, s, p)
    dy = np.ones_like(y)
    dx = np.empty_like(x)
    if direction == "forward":
        fn = lambda: ops.maxpool_forward(x, k, s, p, out=y, argmax_out=am)  # noqa: E731
    else:
        fn = lambda: ops.maxpool_backward(dy, am, shape, k, s, p, out=dx)  # noqa: E731
    benchmark.group = f"maxpool {direction}"
    x_bytes, moved = _traffic(shape, k, s, p)
    measure(benchmark, fn, moved, x_bytes, summary=summary, op=f"maxpool_{direction}",
           shape=shape, window=window)


def torch_pool_seconds(shape, threads):
    """Median seconds of PyTorch's max_pool2d (2x2/2, with indices); run in a
    process of its own (conftest.py says why)."""
    import torch
    from conftest import adaptive_median
    torch.set_num_threads(threads)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    return adaptive_median(lambda: torch.nn.functional.max_pool2d(x, 2, 2, return_indices=True), min_reps=15)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_maxpool_torch_reference(benchmark, summary, shape):
    if not torch_available():
        pytest.skip("PyTorch is not installed (optional reference)")
    threads = backend.get_backend().ext.get_num_threads()
    t = benchmark.pedantic(in_fresh_process, args=("torch", "test_bench_pool", "torch_pool_seconds",
                                                   list(shape), threads),
                           kwargs={"threads": threads}, rounds=1, iterations=1)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y, am = ops.maxpool_forward(x, 2, 2, 0)
    ours = adaptive_median(lambda: ops.maxpool_forward(x, 2, 2, 0, out=y, argmax_out=am), min_reps=15)
    benchmark.extra_info.update(torch_seconds=t, engine_seconds=ours, engine_vs_torch=t / ours)
    summary(f"maxpool 2x2/2 {'x'.join(map(str, shape))}: engine {ours * 1e6:8.1f} us, "
            f"PyTorch max_pool2d (own process) {t * 1e6:8.1f} us -> engine {t / ours:.2f} x torch")
