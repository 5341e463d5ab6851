"""What the ASGD workers need from the engine: Net.loss_and_grad in several
threads at once (each its own Net) gives the same gradients as one at a time
(no shared scratch buffers in the kernels), and NetSource walks its shard."""
import threading

import numpy as np
import pytest

from engine.net import Net


def _batches(spec_shape, n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, *spec_shape)).astype(np.float32), rng.integers(0, 10, 8))
            for _ in range(n)]


def test_concurrent_gradients_equal_sequential():
    nets = [Net("digits", seed=s) for s in (1, 2, 3)]
    data = [_batches(nets[0].spec.input_shape, 6, s) for s in range(3)]
    ref = []
    for net, batches in zip(nets, data):
        ref.append([(net.loss_and_grad(x, y), net.grads.copy()) for x, y in batches])
    got = [None] * 3
    barrier = threading.Barrier(3)

    def work(i):
        barrier.wait()
        got[i] = [(nets[i].loss_and_grad(x, y), nets[i].grads.copy()) for x, y in data[i]]

    ths = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    for r, g in zip(ref, got):
        for (lr_, gr), (lg, gg) in zip(r, g):
            assert lr_ == lg
            np.testing.assert_array_equal(gr, gg)


def test_net_source_walks_its_shard_epoch_after_epoch():
    from engine.data import DeformConfig, Loader, load_dataset
    from engine.parallel.runner import NetSource
    train, _ = load_dataset("digits")
    net = Net("digits", seed=0)
    loader = Loader(train, 100, shuffle=True, seed=3, deform=DeformConfig(out_hw=(net.spec.x0,) * 2),
                    prefetch=0, rank=1, world=3)
    src = NetSource(net, loader)
    shard = loader.indices()
    seen = []
    while src.epoch == 0:
        x, y = src.load()
        seen.append(y)
    # the first batch of epoch 1 was drawn; epoch 0 covered the shard exactly once
    ys = np.concatenate(seen[:-1])
    assert len(ys) == len(shard)
    np.testing.assert_array_equal(ys, train.y[shard])
    x, y = src.deform(src.load())
    step = src.compute((x, y))
    assert step.n == len(y) and step.grad is net.grads and np.isfinite(step.loss)
