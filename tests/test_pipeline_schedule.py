"""Pipeline schedules, versions and the stage split, without MPI."""
import itertools

import numpy as np
import pytest

from engine.net import Net
from engine.parallel import pipeline_schedule as S
from engine.parallel.pipeline import micro_sizes, split_micro
from engine.parallel.stage import Stage, even_partition, parse_partition, format_partition


@pytest.mark.parametrize("name", S.SCHEDULES)
@pytest.mark.parametrize("K", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n_mb", [1, 2, 5, 11])
def test_schedules_complete_deadlock_free_and_versions_match_closed_form(name, K, n_mb):
    m = 3
    lists = [S.schedule(name, K, k, n_mb, m) for k in range(K)]
    order = S.check(lists)
    assert len(order) == sum(map(len, lists))
    for k, ops in enumerate(lists):
        f = [op.mb for op in ops if op.kind in ("F", "FB")]
        b = [op.mb for op in ops if op.kind == "B"] + [op.mb2 for op in ops if op.kind == "FB"]
        assert sorted(f) == list(range(n_mb)) and sorted(b) == list(range(n_mb))
        n_upd = sum(op.kind == "U" for op in ops)
        assert n_upd == (len(S.groups(n_mb, m)) if name == "gpipe" else n_mb)
        for i, (vf, vb, tgt) in S.versions(name, ops, m).items():
            assert (tgt - vf, tgt - vb) == S.s_closed_form(name, K, k, i), (k, i, vf, vb, tgt)


def test_in_flight_micro_batches_per_schedule():
    K, n = 4, 20
    for k in range(K):
        assert S.in_flight(S.schedule("gpipe", K, k, n, 5)) == 5
        assert S.in_flight(S.schedule("1f1b", K, k, n)) == K - k
        assert S.in_flight(S.schedule("dualpipe", K, k, n)) == 2 * (K - 1 - k) + 1


def test_a_wrong_order_is_caught_as_deadlock():
    lists = [S.schedule("1f1b", 2, k, 3) for k in range(2)]
    lists[1] = [S.Op("B", 0)] + [op for op in lists[1] if op != S.Op("B", 0)]
    with pytest.raises(RuntimeError, match="deadlock"):
        S.check(lists)


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="--schedule"):
        S.schedule("zigzag", 2, 0, 4)


def _partitions(n, K):
    for cuts in itertools.combinations(range(1, n), K - 1):
        b = (0, *cuts, n)
        yield list(zip(b[:-1], b[1:]))


@pytest.mark.parametrize("model", ["digits", "tiny"])
def test_every_partition_of_stages_equals_the_whole_net(model):
    # the same kernels on the same inputs in the same order: equal to float32 rounding
    net = Net(model, seed=1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, *net.spec.input_shape)).astype(np.float32)
    y = rng.integers(0, net.spec.n_classes, 6)
    loss, _ = net.loss_and_grad(x, y)
    n = len(net.layers)
    for K in range(1, n + 1):
        for parts in _partitions(n, K):
            stages = [Stage(model, lo, hi, seed=1) for lo, hi in parts]
            assert np.array_equal(np.concatenate([s.params for s in stages]), net.params)
            h, ctxs = x, []
            for s in stages:
                h, c = s.forward(h)
                ctxs.append(c)
            l2, _, d = stages[-1].loss_grad(h, y)
            for s, c in zip(stages[::-1], ctxs[::-1]):
                d = s.backward(c, d)
            assert d is None
            assert abs(l2 - loss) < 1e-6
            g = np.concatenate([s.grads for s in stages])
            assert np.abs(g - net.grads).max() < 1e-6, format_partition(parts)


def test_two_micro_batches_in_flight_keep_their_own_caches():
    st = Stage("digits", 0, 4, seed=2)
    net = Net("digits", seed=2)
    rng = np.random.default_rng(1)
    xa, xb = rng.normal(size=(2, 3, 1, 8, 8)).astype(np.float32)
    ya, yb = rng.integers(0, 10, (2, 3))
    oa, ca = st.forward(xa)
    ob, cb = st.forward(xb)
    st.backward(ca, st.loss_grad(oa, ya)[2])
    net.loss_and_grad(xa, ya)
    assert np.abs(st.grads - net.grads).max() < 1e-6
    st.backward(cb, st.loss_grad(ob, yb)[2])
    net.loss_and_grad(xb, yb)
    assert np.abs(st.grads - net.grads).max() < 1e-6


def test_partition_parsing_and_checks():
    assert parse_partition("0:1,1:3,3:4", 4) == [(0, 1), (1, 3), (3, 4)]
    for bad in ("0:2,3:4", "0:2,2:3", "1:4", "0:2,2:2,2:4", "a:b", "0-2"):
        with pytest.raises(ValueError, match="^--partition "):     # names the option it came from
            parse_partition(bad, 4)
    assert even_partition(8, 3) == [(0, 3), (3, 5), (5, 8)]
    with pytest.raises(ValueError, match="--stages"):
        even_partition(4, 5)


@pytest.mark.parametrize("n,b,m", [(23, 10, 4), (7, 10, 4), (30, 10, 3), (9, 4, 8)])
def test_micro_sizes_follow_split_micro(n, b, m):
    sizes, minis = micro_sizes(n, b, m)
    x = np.arange(n)
    got = [len(xs) for lo in range(0, n, b) for xs, _ in split_micro(x[lo:lo + b], x[lo:lo + b], m)]
    assert got == sizes and sum(sizes) == n and sum(minis) == n and min(sizes) >= 1


@pytest.mark.parametrize("argv,msg", [
    (["--schedule", "1f1b"], "1f1b is a pipeline schedule (add --parallel pipeline); the learning-rate schedules "
                             "are constant, step and cosine (--schedule)"),
    (["--parallel", "pipeline", "--schedule", "1f1b", "--pipe-schedule", "gpipe"],
     "two pipeline schedules: --schedule 1f1b and --pipe-schedule gpipe (--schedule)"),
    (["--parallel", "asgd", "--pipe-schedule", "1f1b"],
     "applies to --parallel pipeline only, not to --parallel asgd (--pipe-schedule)"),
])
def test_schedule_takes_the_pipeline_names_only_with_a_pipeline(argv, msg, tmp_path, capsys):
    from engine.cli import main
    assert main(["train", "--epochs", "1", "--out", str(tmp_path / "r"), *argv]) == 2
    assert capsys.readouterr().err.strip() == f"sprint: error: {msg}"
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("n_ranks,said", [(1, "not 1 rank"), (3, "not 3 ranks")])
def test_stages_that_need_another_job_size_say_the_ranks_in_words(n_ranks, said):
    from engine.parallel.pipeline_run import options
    from engine.session import TrainConfig
    cfg = TrainConfig(parallel="pipeline", extra={"stages": 2}, progress=False)
    with pytest.raises(ValueError) as e:
        options(cfg, n_ranks)
    assert str(e.value) == f"--stages 2 x --replicas 1 needs mpiexec -n 2, {said}"


def test_a_pipeline_run_parses_its_partition_once(tmp_path, capsys, monkeypatch):
    """--partition was parsed and checked in options() and again in
    choose_partition(); options() now returns the ranges the run uses."""
    import json
    from engine import cli
    from engine.parallel import stage
    calls = []
    parse = stage.parse_partition
    monkeypatch.setattr(stage, "parse_partition", lambda text, n: calls.append(text) or parse(text, n))
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    assert cli.main(["train", "--parallel", "pipeline", "--stages", "1", "--partition", "0:4", "--epochs", "1",
                     "--out", str(run), "--no-progress", "--quiet"]) == 0, capsys.readouterr().err
    assert calls == ["0:4"]
    assert json.loads((run / "pipeline_stats.json").read_text())["partition"] == "0:4"
