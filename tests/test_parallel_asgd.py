"""ASGD / sync trainers in one process (no MPI): SPRINT == momentum SGD with
one worker, bookkeeping, stats, and the small helpers."""
import os
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from toy import SoftmaxSource, init_weights, make_data, softmax_grad  # noqa: E402

from engine.parallel.asgd import ASGD, ASGDConfig  # noqa: E402
from engine.parallel.comm import ConfigMismatch, LocalComm, config_hash  # noqa: E402
from engine.parallel.sync import SyncConfig, SyncSGD, bucket_bounds  # noqa: E402
from engine.parallel.timers import StepTimers, summarize  # noqa: E402

LR, NU, WD, B = 0.1, 0.9, 1e-3, 16


def sgd_reference(w0, x, y, k, steps):
    """Plain momentum SGD (v = nu v - lr (g + wd w); w += v), same batch order."""
    w, v, pos, out = w0.copy(), np.zeros_like(w0), 0, [w0.copy()]
    t = w0.dtype.type
    for _ in range(steps):
        idx = (pos + np.arange(B)) % len(y)
        pos = (pos + B) % len(y)
        g, _, _ = softmax_grad(w, x[idx], y[idx], k)
        v = t(NU) * v - t(LR) * (g + t(WD) * w)
        w = w + v
        out.append(w.copy())
    return np.array(out)


def run_lockstep(dtype, steps=60):
    x, y, k = make_data(seed=5)
    w0 = init_weights(x.shape[1], k, dtype=dtype)
    src = SoftmaxSource(x, y, k, B, dtype=dtype)
    cfg = ASGDConfig(lr=LR, momentum=NU, weight_decay=WD, max_updates=steps, lockstep=True, trace=True)
    a = ASGD(None, w0, [src], cfg).run()
    return a, np.array(a.trace_weights), sgd_reference(w0, x, y, k, steps), (x, y, k)


def test_one_worker_asgd_is_momentum_sgd_float64():
    a, got, ref, _ = run_lockstep(np.float64)
    assert got.shape == ref.shape
    assert np.abs(ref[-1] - ref[0]).max() > 0.5          # it trained
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
    assert np.abs(got - ref).max() < 1e-12
    assert a.staleness == [0] * 60 and a.minibatch == [B] * 60


def test_one_worker_asgd_is_momentum_sgd_float32_step_by_step():
    """float32: each ASGD update equals one SGD step from the same state to 1e-6
    (the trajectories then agree to float32 rounding growth)."""
    a, got, ref, (x, y, k) = run_lockstep(np.float32)
    t = np.float32
    for s in range(1, len(got) - 1):
        w, v = got[s], got[s] - got[s - 1]
        idx = (s * B + np.arange(B)) % len(y)
        g, _, _ = softmax_grad(w, x[idx], y[idx], k)
        one = w + (t(NU) * v - t(LR) * (g + t(WD) * w))
        assert np.abs(one - got[s + 1]).max() <= 1e-6, s
    assert np.abs(got - ref).max() < 1e-4


def test_free_running_workers_conserve_every_update():
    x, y, k = make_data(n=300, d=4, k=3, seed=2)
    W = 4
    srcs = [SoftmaxSource(x, y, k, 2, shard=(t, W), tag_prefix=(t,), record=True, dtype=np.float64)
            for t in range(W)]
    w0 = init_weights(4, k, dtype=np.float64)
    a = ASGD(None, w0, srcs, ASGDConfig(lr=0.05, momentum=NU, max_samples=4000, trace=True)).run()
    rec = {t: v for s in srcs for t, v in s.record.items()}
    applied = [t for u in a.trace_tags for t in u]
    assert len(applied) == len(set(applied))
    assert set(applied) | set(a.discarded["tags"]) == set(rec)
    ws = np.array(a.trace_weights)
    delta = np.zeros_like(ws[0])
    for u, tags in enumerate(a.trace_tags):
        upd = sum((-0.05 * rec[t][1] for t in tags), np.zeros_like(delta))
        np.testing.assert_allclose(ws[u + 1], ws[u] + NU * delta + upd, rtol=0, atol=1e-10)
        delta = ws[u + 1] - ws[u]
    st = a.stats()
    assert st["gradients_produced"] == len(rec)
    assert sum(st["minibatch"]) == 2 * len(applied) == st["samples"]
    assert st["N_Minibatch_avg"] == pytest.approx(np.mean(st["minibatch"]))
    assert len(st["staleness"]) == len(applied) and min(st["staleness"]) >= 0
    for name in ("FetchWeights", "LoadImage", "DeformImage", "ComputeGradient", "ComputeUpdateVal",
                 "LockGradient", "UpdateGradient", "SumGradient", "AddMomentum", "Allreduce",
                 "UpdateWeights"):
        assert st["timers"][name]["count"] > 0, name
    assert st["timers"]["ComputeGradient"]["count"] == len(rec)
    assert st["timers"]["Allreduce"]["count"] == st["updates"]
    assert 0 < st["T_GPU"] and 0 < st["T_Update"]


def test_worker_exception_surfaces_in_updater():
    x, y, k = make_data(n=100)

    class Bad(SoftmaxSource):
        def compute(self, batch):
            if self.count == 3:
                raise ZeroDivisionError("boom")
            return super().compute(batch)

    a = ASGD(None, init_weights(x.shape[1], k), [Bad(x, y, k, 4), SoftmaxSource(x, y, k, 4)],
             ASGDConfig(lr=0.01, max_seconds=30))
    with pytest.raises(RuntimeError, match="worker 0 on rank 0 failed: ZeroDivisionError: boom"):
        a.run()
    assert not any(t.name.startswith("sprint-asgd") for t in threading.enumerate())


def test_max_seconds_stops_and_bad_arguments():
    x, y, k = make_data(n=100)
    w0 = init_weights(x.shape[1], k)
    a = ASGD(None, w0, [SoftmaxSource(x, y, k, 4, delay=0.001)], ASGDConfig(lr=0.01, max_seconds=0.3)).run()
    assert 0.2 < a.wall < 5 and a.updates > 0
    with pytest.raises(ValueError, match="sources"):
        ASGD(None, w0, [], ASGDConfig())
    with pytest.raises(ValueError, match="w0"):
        ASGD(None, w0.reshape(1, -1), [SoftmaxSource(x, y, k, 4)], ASGDConfig())
    with pytest.raises(ValueError, match="min_grads"):
        ASGD(None, w0, [SoftmaxSource(x, y, k, 4)], ASGDConfig(min_grads=2))


def test_sync_two_workers_equals_double_batch():
    x, y, k = make_data(n=256, seed=4)
    w0 = init_weights(x.shape[1], k)
    cfg = SyncConfig(lr=0.1, momentum=0.9, weight_decay=1e-3, max_steps=10, trace=True, bucket_bytes=40)
    two = SyncSGD(None, w0, [SoftmaxSource(x, y, k, 8, shard=(0, 2)), SoftmaxSource(x, y, k, 8, shard=(1, 2))],
                  cfg).run()
    # one worker, batch 16 = the union of the two sub-batches of every step
    xs = np.concatenate([np.stack([x[0::2][i * 8:(i + 1) * 8], x[1::2][i * 8:(i + 1) * 8]]).reshape(16, -1)
                         for i in range(10)])
    ys = np.concatenate([np.concatenate([y[0::2][i * 8:(i + 1) * 8], y[1::2][i * 8:(i + 1) * 8]])
                         for i in range(10)])
    one = SyncSGD(None, w0, [SoftmaxSource(xs, ys, k, 16)], cfg).run()
    assert np.abs(np.array(one.trace_weights[-1]) - w0).max() > 0.1
    np.testing.assert_allclose(two.trace_weights, one.trace_weights, rtol=0, atol=1e-5)
    assert two.samples_total == 160 and len(two.buckets) > 1


def test_bucket_bounds_cover_vector_from_the_end():
    b = bucket_bounds(10, 4, 12)
    assert b == [(7, 10), (4, 7), (1, 4), (0, 1)]
    with pytest.raises(ValueError, match="bucket_bytes"):
        bucket_bounds(10, 4, 0)


def test_timers_and_summaries():
    t = StepTimers()
    for v in (0.1, 0.3, 0.2):
        t.add("A", v)
    with t("B"):
        pass
    s = t.summary()
    assert s["A"]["count"] == 3 and s["A"]["median"] == pytest.approx(0.2)
    assert s["A"]["mean"] == pytest.approx(0.2) and s["B"]["count"] == 1
    assert summarize([])["count"] == 0
    assert summarize([1.0, 3.0])["median"] == 2.0
    m = t.merge(t)
    assert m.summary()["A"]["count"] == 6


def test_local_comm_and_slices():
    c = LocalComm()
    v = np.arange(5, dtype=np.float32)
    assert c.allreduce_(v) is v and c.size == 1
    c.check_agreement("x", config_hash({"a": 1}))
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    with pytest.raises(ValueError, match="flat"):
        c.allreduce_(np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match="float32"):
        c.allreduce_(np.zeros(3, np.int32))

    class Fake(LocalComm):
        size = 3

    f = Fake()
    assert [f.slice_bounds(10, r) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]

    class Disagree(LocalComm):
        def allgather_obj(self, obj):
            return [obj, "other"]

    with pytest.raises(ConfigMismatch, match="rank 1: other"):
        Disagree().check_agreement("config hash", "mine")


def test_local_rank_from_launcher_variables(monkeypatch):
    from engine.parallel.comm import local_rank
    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert local_rank(LocalComm()) == 0
    monkeypatch.setenv("MPI_LOCALRANKID", "3")
    assert local_rank(LocalComm()) == 3
