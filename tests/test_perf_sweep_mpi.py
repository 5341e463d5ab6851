"""The host-sharing sweeps behind CPU profiles, run for real under mpiexec
(short and small: what they record, not how fast anything is)."""
import shutil

import pytest

from engine.perf import fit, sweep
from engine.perf.profile import Profile

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]


def _cfg():
    cfg = sweep.mode_config(True)
    cfg["repeats"] = 3
    return cfg


def test_runner_contention_sweep_records_the_runner_and_fits():
    recs = sweep.sweep_contention_runner(_cfg(), pairs=((1, 1), (2, 1)), workloads=(("tiny", 4),),
                                         seconds=0.6)
    assert [(r["ranks"], r["workers"]) for r in recs] == [(1, 1), (2, 1)]
    for r in recs:
        assert r["source"] == "runner" and r["model"] == "tiny" and r["n_subbatch"] == 4
        assert r["t"] > 0 and r["rel"] > 0 and r["solo_cpu"] > 0 and r["solo_wall"] > 0
        assert set(r["updater"]) == set(sweep.UPDATER_WORK) and set(r["worker"]) == set(sweep.WORKER_SMALL)
        assert all(v >= 0 for v in list(r["updater"].values()) + list(r["worker"].values()))
    assert recs[0]["rel"] == 1.0
    # The fit re-anchors them on the model's own step (a synthetic profile
    # here) and prices every pair with the median of the (1, 1) runs.
    prof = Profile.synthetic(backend="cpu").data
    prof["contention"] = {"entries": [dict(r) for r in recs]}
    fit.anchor_contention(prof)
    es = prof["contention"]["entries"]
    assert [e["host_solo"] for e in es] == [r["host"] for r in recs]
    assert es[0]["host"] == es[1]["host"] > 0
    assert es[1]["ratio"] == pytest.approx(es[1]["rel"] * es[1]["host"])


def test_contention_child_times_the_allreduce_from_the_last_arrival():
    recs = sweep.sweep_contention(_cfg(), pairs=((2, 1),), workloads=(("tiny", 4),), seconds=0.6)
    (r,) = recs
    assert r["source"] == "child" and r["allreduce"] is not None and r["allreduce"] > 0


def test_allreduce_sweep_waits_like_the_runner():
    from engine.parallel.runner import CPU_MPI_POLL
    cfg = _cfg()
    cfg.update(ranks=(2,), allreduce_exp=(10,))
    (r,) = sweep.sweep_allreduce(cfg, timeout=120)
    assert r["poll"] == CPU_MPI_POLL and r["n_node"] == 2 and r["t"] > 0
