"""SGD with momentum and weight decay on the flat vector; schedules."""
import math

import numpy as np
import pytest

from engine.net import Net
from engine.optim import (SGD, constant, cosine, make_schedule, schedule_from_dict, step, warmup)


def test_sgd_matches_float64_recurrence_over_steps():
    rng = np.random.default_rng(0)
    n = 1001
    w = rng.standard_normal(n).astype(np.float32)
    g = np.zeros(n, np.float32)
    opt = SGD(w, g, lr=0.1, momentum=0.9, weight_decay=1e-3, schedule=cosine(0.1, 4))
    w64, v64 = w.astype(np.float64), np.zeros(n)
    for k in range(6):
        g[...] = rng.standard_normal(n)
        e = k * 0.5
        lr = opt.step(e)
        assert lr == pytest.approx(0.05 * (1 + math.cos(math.pi * min(e / 4, 1))))
        v64 = 0.9 * v64 - lr * (g + 1e-3 * w64)
        w64 = w64 + v64
    np.testing.assert_allclose(w, w64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt.velocity, v64, rtol=1e-4, atol=1e-6)
    assert opt.steps == 6


def test_sgd_on_net_uses_its_flat_vectors():
    net = Net("tiny")
    opt = SGD(net, lr=0.5, momentum=0.0)
    before = net.get_flat()
    net.grads[...] = 1.0
    opt.step()
    np.testing.assert_allclose(net.params, before - 0.5, rtol=0, atol=1e-6)
    np.testing.assert_allclose(net.views[("conv1", "b")], before[57 - 3:57] - 0.5, atol=1e-6)


def test_state_dict_round_trip_continues_identically():
    rng = np.random.default_rng(1)
    w = rng.standard_normal(50).astype(np.float32)
    g = rng.standard_normal(50).astype(np.float32)
    a = SGD(w.copy(), g, lr=0.1, momentum=0.9, schedule=warmup(step(0.1, every=2), 1))
    for _ in range(3):
        a.step(a.steps * 0.4)
    b = SGD(a.params.copy(), g, lr=1.0, momentum=0.0)
    b.load_state_dict(a.state_dict())
    assert b.momentum == 0.9 and b.schedule.to_dict() == a.schedule.to_dict() and b.steps == 3
    for _ in range(3):
        a.step(a.steps * 0.4)
        b.step(b.steps * 0.4)
    assert np.array_equal(a.params, b.params) and np.array_equal(a.velocity, b.velocity)
    with pytest.raises(ValueError, match="velocity shape"):
        SGD(np.zeros(3, np.float32), np.zeros(3, np.float32)).load_state_dict(a.state_dict())


def test_schedules():
    assert constant(0.3)(17.5) == 0.3
    s = step(1.0, every=2, gamma=0.5)
    assert [s(e) for e in (0, 1.99, 2, 4.5)] == [1.0, 1.0, 0.5, 0.25]
    m = step(1.0, milestones=[3, 1], gamma=0.1)
    assert m(0.5) == 1.0 and m(1) == pytest.approx(0.1) and m(3.2) == pytest.approx(0.01)
    c = cosine(2.0, 10, final_lr=0.2)
    assert c(0) == 2.0 and c(5) == pytest.approx(1.1) and c(10) == pytest.approx(0.2) and c(12) == pytest.approx(0.2)
    wu = warmup(constant(1.0), 2, start_factor=0.1)
    assert wu(0) == pytest.approx(0.1) and wu(1) == pytest.approx(0.55) and wu(2) == 1.0 and wu(9) == 1.0
    wc = warmup(cosine(1.0, 1), 1)   # warm-up as long as the run still learns
    assert wc(0.5) == pytest.approx(0.5 * 0.5) and wc(0.25) == pytest.approx(0.25 * cosine(1.0, 1)(0.25))
    for sched in (s, m, c, wu, make_schedule("cosine", 0.1, 5, warmup_epochs=1)):
        again = schedule_from_dict(sched.to_dict())
        assert [again(e) for e in np.linspace(0, 12, 25)] == [sched(e) for e in np.linspace(0, 12, 25)]
    assert make_schedule("step", 1.0, 9)(3) == pytest.approx(0.1)


def test_bad_arguments():
    z = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="lr"):
        SGD(z, z.copy(), lr=0)
    with pytest.raises(ValueError, match="equal flat"):
        SGD(z, np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="grads"):
        SGD(z)
    for m in (-1, 1.0, 2, float("nan")):
        with pytest.raises(ValueError, match=f"momentum must be in \\[0, 1\\), got {m}"):
            SGD(z, z.copy(), momentum=m)
    for wd in (-1e-4, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="weight_decay must be finite and >= 0"):
            SGD(z, z.copy(), weight_decay=wd)
    with pytest.raises(ValueError, match="schedule must be"):
        make_schedule("linear", 0.1, 3)
    with pytest.raises(ValueError, match="exactly one"):
        step(0.1)
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_from_dict({"kind": "exp"})
