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

    def sequential():
        from engine.parallel.threads import limit_this_thread
        limit_this_thread(1)      # same thread counts as the workers: same summation order
        for net, batches in zip(nets, data):
            ref.append([(net.loss_and_grad(x, y), net.grads.copy()) for x, y in batches])

    t = threading.Thread(target=sequential)
    t.start()
    t.join()
    got = [None] * 3
    barrier = threading.Barrier(3)

    def work(i):
        from engine.parallel.threads import limit_this_thread
        limit_this_thread(1)
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


def _digits_source(seed=0):
    from engine.data import DeformConfig, Loader, load_dataset
    from engine.parallel.runner import NetSource
    train, _ = load_dataset("digits")
    net = Net("digits", seed=seed)
    deform = DeformConfig(out_hw=(net.spec.x0,) * 2).with_stats(train)
    return NetSource(net, Loader(train, 32, shuffle=True, seed=5, deform=deform, prefetch=0), threads=1)


def test_one_worker_asgd_on_the_engine_is_engine_sgd_step_by_step():
    """Lockstep ASGD with one worker on the real Net == engine.SGD (momentum
    0.9, weight decay) from the same state on the same batch, each of 25
    updates, to 1e-6; and the whole trajectory stays within float32 drift."""
    from engine.optim import SGD
    from engine.parallel.asgd import ASGD, ASGDConfig
    lr, nu, wd, steps = 0.05, 0.9, 5e-4, 25
    src = _digits_source()
    w0 = src.net.params.copy()
    a = ASGD(None, w0, [src], ASGDConfig(lr=lr, momentum=nu, weight_decay=wd, max_updates=steps,
                                         lockstep=True, trace=True)).run()
    ws = np.array(a.trace_weights)
    assert ws.shape[0] == steps + 1 and np.abs(ws[-1] - ws[0]).max() > 1e-2

    replay = _digits_source()            # same shard, same order, same deformation
    net = replay.net
    opt = SGD(net, lr=lr, momentum=nu, weight_decay=wd)
    worst = 0.0
    for k in range(steps):
        batch = replay.deform(replay.load())
        net.set_flat(ws[k])
        opt.velocity[...] = ws[k] - ws[k - 1] if k else 0.0
        net.loss_and_grad(*batch)
        opt.step()
        worst = max(worst, float(np.abs(net.params - ws[k + 1]).max()))
    assert worst <= 1e-6, worst

    # free trajectory of engine SGD alone, from w0
    replay = _digits_source()
    opt = SGD(replay.net, lr=lr, momentum=nu, weight_decay=wd)
    for k in range(steps):
        replay.net.loss_and_grad(*replay.deform(replay.load()))
        opt.step()
    assert float(np.abs(replay.net.params - ws[-1]).max()) < 1e-4


@pytest.fixture
def gpu_backend():
    from engine import backend
    before = backend.get_backend().name
    backend.set_backend("gpu")
    yield backend
    backend.set_backend(before)


@pytest.mark.gpu
def test_gpu_asgd_one_worker_is_sgd_and_two_workers_on_two_streams(gpu_backend):
    """On one GPU: lockstep ASGD == engine SGD step by step (device buffers,
    per-worker streams), then two free-running workers on their own streams."""
    from engine.optim import SGD
    from engine.parallel.asgd import ASGD, ASGDConfig
    to_host, xp = gpu_backend.to_host, gpu_backend.get_backend().xp
    lr, nu, wd, steps = 0.05, 0.9, 5e-4, 10

    def gpu_source():
        src = _digits_source()
        src.gpu, src.threads = True, None
        return src

    src = gpu_source()
    a = ASGD(None, src.net.params.copy(), [src],
             ASGDConfig(lr=lr, momentum=nu, weight_decay=wd, max_updates=steps, lockstep=True, trace=True)).run()
    ws = np.array(a.trace_weights)
    replay = _digits_source()
    net = replay.net
    opt = SGD(net, lr=lr, momentum=nu, weight_decay=wd)
    for k in range(steps):
        batch = replay.deform(replay.load())
        net.set_flat(ws[k])
        opt.velocity[...] = xp.asarray(ws[k] - ws[k - 1] if k else np.zeros_like(ws[0]))
        net.loss_and_grad(*batch)
        opt.step()
        assert float(np.abs(to_host(net.params) - ws[k + 1]).max()) <= 1e-5, k

    srcs = [gpu_source() for _ in range(2)]
    b = ASGD(None, srcs[0].net.params.copy(), srcs, ASGDConfig(lr=0.01, momentum=0.9, max_updates=40)).run()
    st = b.stats()
    assert st["updates"] == 40 and sum(st["minibatch"]) == st["samples"]
    assert np.isfinite(to_host(b.latest)).all() and np.isfinite(b.last_loss)
    assert st["timers"]["ComputeGradient"]["count"] >= 40
