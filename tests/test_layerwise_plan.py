"""``sprint plan``: the layer-wise table, the plan file it writes, and the
ranking of every registered strategy under one profile."""
import json

import pytest

from engine.cli import main
from engine.perf import layerwise as L
from engine.perf import plan as P


def test_plan_cli_writes_an_executable_plan_and_ranks_every_strategy(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "cifar", "--gpus", "4", "--profile", "h200", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "datasheet figures, not measured" in text and "over pure data parallel" in text
    plan = L.Plan.load(out)
    L.check_plan(plan, "cifar", ranks=4, batch=128)
    assert main(["plan", "--model", "cifar", "--gpus", "4", "--profile", "h200", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    names = [c["strategy"] for c in d["strategies"]]
    for key, _ in P.STRATEGIES:                 # every registered strategy answers
        assert any(n.startswith(key) or key in n.replace("-", "") for n in names), key
    thr = [c["throughput"] for c in d["strategies"]]
    assert thr == sorted(thr, reverse=True)
    best = next(c for c in d["strategies"] if c["strategy"] == "layer-wise optimum")
    for c in d["strategies"]:
        if c["strategy"].startswith("layer-wise"):
            assert best["throughput"] >= c["throughput"] * (1 - 1e-12)
    # the layer-wise optimum is never slower than pure data or model parallelism under the model
    assert d["plan"]["predicted"]["step_s"] <= min(d["data_parallel_step_s"], d["model_parallel_step_s"])
    sync = next(c for c in d["strategies"] if c["strategy"] == "sync")
    assert sync["throughput"] > 0 and sync["comm_bytes"] > 0


def test_a_new_strategy_plugs_in_with_one_entry(monkeypatch):
    def fake(spec, n_dev, batch, profile):
        return [P.Candidate("fake", "x", 1e12, batch / 1e12, 0.0)]
    monkeypatch.setattr(P, "fake_candidates", fake, raising=False)
    monkeypatch.setattr(P, "STRATEGIES", P.STRATEGIES + [("fake", "engine.perf.plan:fake_candidates")])
    ranked = P.rank_strategies(L.spec_mod.get_spec("digits"), 2, 16, P.h200_datasheet())
    assert ranked[0].strategy == "fake"


def test_plan_errors_name_the_option(capsys):
    assert main(["plan", "--model", "digits", "--gpus", "0"]) == 2
    assert "--gpus" in capsys.readouterr().err
    assert main(["plan", "--model", "digits", "--gpus", "3", "--batch", "16"]) == 0
    assert "sync" in (out := capsys.readouterr().out) and "not priced: batch 16 does not split over 3" in out
    assert main(["plan", "--model", "nonet", "--gpus", "2"]) == 2
    assert "nonet" in capsys.readouterr().err
