"""Pipeline cost model: the simulator against closed forms (up to 64 stages),
the balanced partition against brute force, processor sharing, info --stages."""
import itertools
import math

import pytest

from engine.perf import pipeline as P
from engine.perf import pipeline_sim as PS
from engine.perf.profile import Profile


def _equal(K, tf=1e-3, tb=2e-3, tu=0.0, tc=0.0):
    return [P.StageCost(("x",), 1, tf, tb, tu, tc) for _ in range(K)]


@pytest.mark.parametrize("K,M", [(1, 1), (2, 4), (4, 4), (8, 16), (64, 32)])
def test_gpipe_simulation_has_the_fill_drain_bubble(K, M):
    tf, tb = 1e-3, 2e-3
    r = PS.play(_equal(K, tf, tb), "gpipe", M, 2 * M)
    assert r["makespan"] == pytest.approx(2 * (M + K - 1) * (tf + tb), rel=1e-9)
    for b in r["bubble"]:
        assert b == pytest.approx((K - 1) / (M + K - 1), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipe"])
@pytest.mark.parametrize("K", [2, 8, 64])
def test_steady_state_schedules_lose_only_the_flush(schedule, K):
    tf = tb = 1e-3
    n = 2 * K
    r = PS.play(_equal(K, tf, tb), schedule, 1, n)
    work = n * (tf + tb)
    # one fill and one drain: at most 2 (K - 1) passes of idle per stage
    assert work <= r["makespan"] <= work + 2 * (K - 1) * (tf + tb) + 1e-12
    longer = PS.play(_equal(K, tf, tb), schedule, 1, 2 * n)["makespan"]
    assert longer - r["makespan"] == pytest.approx(n * (tf + tb), rel=1e-9)


def test_messages_delay_the_pipeline_by_their_latency():
    K, M, tc = 3, 2, 5e-4
    a = PS.play(_equal(K), "gpipe", M, M)["makespan"]
    b = PS.play(_equal(K, tc=tc), "gpipe", M, M)["makespan"]
    assert b == pytest.approx(a + 2 * (K - 1) * tc, rel=1e-9)


def test_shared_cores_slow_the_running_stages():
    costs = _equal(4)
    own = PS.play(costs, "1f1b", 1, 32)["makespan"]
    shared = PS.play(costs, "1f1b", 1, 32, cores=2)["makespan"]
    work = 32 * 4 * 3e-3
    assert shared >= work / 2 - 1e-12 and shared > own


def test_queued_cores_run_each_pass_whole_and_processor_sharing_stretches_it():
    costs = _equal(4)
    q = PS.play(costs, "1f1b", 1, 32, cores=2)
    for k in range(4):
        assert q["wall"][k]["F"] == pytest.approx(32 * 1e-3, rel=1e-12)
        assert q["wall"][k]["B"] == pytest.approx(32 * 2e-3, rel=1e-12)
    # one core: every pass of every stage in turn, nothing overlapped
    one = PS.play(costs, "1f1b", 1, 32, cores=1)
    assert one["makespan"] == pytest.approx(32 * 4 * 3e-3, rel=1e-12)
    ps = PS.play(costs, "1f1b", 1, 32, cores=2, sharing="ps")
    assert max(w["F"] for w in ps["wall"]) > 32 * 1e-3 * 1.01
    with pytest.raises(ValueError, match="sharing"):
        PS.play(costs, "1f1b", 1, 4, cores=2, sharing="fair")


@pytest.mark.parametrize("model,K", [("digits", 2), ("digits", 3), ("cifar", 3), ("cifar", 5)])
def test_balanced_partition_is_optimal(model, K):
    prof = Profile.load()
    times = [f + b for _, f, b in P.layer_times(model, 8, prof)]
    n = len(times)

    def worst(parts):
        return max(sum(times[lo:hi]) for lo, hi in parts)
    best = min(worst(list(zip((0,) + c, c + (n,)))) for c in itertools.combinations(range(1, n), K - 1))
    got = P.balanced_partition(model, K, 32, 4, prof)
    assert got[0][0] == 0 and got[-1][1] == n and len(got) == K
    assert worst(got) == pytest.approx(best, rel=1e-12)


def test_prediction_and_info_table(capsys):
    from engine.cli import main
    p = P.predict("cifar", stages=4, n_subbatch=32, schedule="gpipe", microbatches=4)
    assert len(p.costs) == 4 and p.throughput > 0 and math.isfinite(p.t_epoch)
    assert p.bubble_gpipe == pytest.approx(3 / 7)
    assert main(["info", "cifar", "--batch", "32", "--stages", "3", "--partition", "0:2,2:5,5:8"]) == 0
    out = capsys.readouterr().out
    assert "partition 0:2,2:5,5:8" in out and "the ideal bubble of GPipe and 1F1B, (K-1)/(M+K-1) = " in out and "activations MB" in out
    assert main(["info", "cifar", "--stages", "3", "--partition", "0:2,2:8"]) != 0
    assert "--partition 0:2,2:8 has 2 stages, --stages says 3" in capsys.readouterr().err


def test_info_stages_says_when_the_profile_misprices_the_layers_once(monkeypatch, capsys):
    """`sprint info MODEL --stages K` priced the stages from conv fits swept
    on another path without a word (predict/simulate/tune/plan warn)."""
    from engine.cli import main
    from engine.perf.profile import Profile
    monkeypatch.setenv("SPRINT_GEMM", "blas")          # the shipped profile's conv fits were swept on the engine's
    warning = Profile.load().path_warning("cifar")
    assert warning
    assert main(["info", "cifar", "--stages", "2"]) == 0
    assert capsys.readouterr().err.splitlines() == [f"sprint info: warning: {warning}"]
    monkeypatch.delenv("SPRINT_GEMM")
    monkeypatch.delenv("SPRINT_CONV_ALGO", raising=False)
    if not Profile.load().path_warning("cifar"):       # the path it was swept on: nothing to say
        assert main(["info", "cifar", "--stages", "2"]) == 0 and capsys.readouterr().err == ""
