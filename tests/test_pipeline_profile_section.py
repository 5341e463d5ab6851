"""The profile's ``pipeline`` section (engine.perf.pipeline_probe): the fit
recovering a known executor from timers made with it on a host running at
another speed than the profile's, the section used by default and rescaled
by the calibration, profiles without it, and ``sprint profile --update``."""
import json
from dataclasses import replace

import pytest

from engine import cli
from engine import spec as spec_mod
from engine.perf import pipeline as P
from engine.perf import pipeline_probe as PP
from engine.perf.profile import Profile

TRUE = P.Executor(per_pass=1.2e-4, cold=0.15, per_instruction=4e-5, shared=0.3)
CAL = 0.01          # the profile's calibration step, seconds


def _profile():
    prof = Profile.synthetic()
    prof.data["fingerprint"] = {"calibration": {"wall_s": CAL}}
    return prof


def _run(net, K, sched, prof, ex, cores, shared, ratio):
    """A pipeline_run record whose timers are what ``ex`` predicts on a host
    ``ratio`` x slower than ``prof``'s calibration."""
    host = Profile(prof.data, prof.source)
    host.time_scale = ratio
    parts = P.balanced_partition(net, K, 32, 4, prof)
    run = {"kind": "pipeline_run", "net": net, "model": net, "K": K, "schedule": sched, "M": 4, "batch": 32,
           "epochs": 1, "partition": [list(p) for p in parts], "n_mb": 16, "shared": shared,
           "calibration": {"wall_s": ratio * CAL}}
    costs = P.stage_costs(net, parts, 32, 4, host, executor=ex, schedule=sched, oversubscribed=shared)
    passes = PP.predicted_passes(dict(run, stages=[]), host, ex, cores)
    n = {"fwd": 16, "bwd": 16, "update": 16 if sched != "gpipe" else 4}
    stages = []
    for c, (f, b) in zip(costs, passes):
        s = {"layers": list(c.layers), "bubble": 0.0, "fwd_mean": f, "bwd_mean": b, "update_mean": c.t_u,
             "wait_mean": 0.0, "wait_total": 0.0, "wait_count": 0}
        for q, t in (("fwd", f), ("bwd", b), ("update", c.t_u)):
            s[f"{q}_count"], s[f"{q}_total"] = n[q], n[q] * t
        s["wall_s"] = s["fwd_total"] + s["bwd_total"] + s["update_total"] + c.t_x * sum(n.values())
        stages.append(s)
    return dict(run, stages=stages)


def _records(ratio, cores=2):
    ping = {"kind": "pipeline_p2p", "bytes": [256, 8192], "times": [ratio * 1e-4, ratio * 5e-4], "eager_bytes": 256}
    prof = _profile()
    runs = [_run(n, K, s, prof, TRUE, cores, False, ratio) for n, K, s in PP.FIT_CONFIGS]
    runs += [_run(n, K, s, prof, TRUE, cores, True, ratio) for n, K, s in PP.SHARED_CONFIGS]
    return [ping] + runs


@pytest.mark.parametrize("ratio", [1.0, 1.7])
def test_fit_recovers_the_executor_in_the_profiles_time_base(ratio):
    sec = PP.fit_section(_profile(), _records(ratio), cores=2)
    ex = sec["executor"]
    assert sec["calibration_ratio"] == pytest.approx(ratio)
    assert ex["per_pass"] == pytest.approx(TRUE.per_pass, rel=1e-6)
    assert ex["cold"] == pytest.approx(TRUE.cold, abs=1e-6)
    assert ex["per_instruction"] == pytest.approx(TRUE.per_instruction, rel=1e-6)
    assert ex["shared"] == pytest.approx(TRUE.shared, abs=0.03)
    # the message table too is stored as the profile's host would run it
    assert sec["p2p"]["times"] == pytest.approx([1e-4, 5e-4])
    assert sec["shared_fitted"] and ["digits", 4, "gpipe"] in sec["fitted_on"]


def test_predict_uses_the_section_rescaled_with_the_profile():
    prof = _profile()
    prof.data["pipeline"] = {"executor": vars(TRUE), "p2p": {"bytes": [256, 8192], "times": [1e-4, 5e-4],
                                                              "eager_bytes": 256}}
    kw = dict(stages=2, n_subbatch=32, schedule="1f1b")
    got = P.predict("digits", profile=prof, **kw)
    want = P.predict("digits", profile=prof, executor=TRUE, **kw)
    assert got.t_minibatch == pytest.approx(want.t_minibatch) and not got.extra["notes"]
    assert got.extra["executor"] == vars(TRUE)
    geoms = spec_mod.layers(spec_mod.get_spec("digits"))
    act = 8 * spec_mod._prod(geoms[got.partition[0][1] - 1].out_shape)
    assert got.costs[0].t_c == pytest.approx(P.p2p_time(prof, act)) and got.costs[0].t_h > 0
    # a host 2x slower: kernels, the executor's seconds and the messages all double
    slow = Profile(prof.data, prof.source)
    slow.time_scale = 2.0
    s = P.predict("digits", profile=slow, **kw)
    for a, b in zip(got.costs, s.costs):
        assert (b.t_f, b.t_b, b.t_x, b.t_c, b.t_h) == pytest.approx((2 * a.t_f, 2 * a.t_b, 2 * a.t_x, 2 * a.t_c,
                                                                     2 * a.t_h))
    # an explicit executor overrides the section
    other = replace(TRUE, per_pass=0.0)
    assert P.predict("digits", profile=prof, executor=other, **kw).extra["executor"]["per_pass"] == 0.0


def test_a_profile_without_the_section_still_predicts_and_says_what_is_missing():
    prof = _profile()
    p = P.predict("digits", stages=2, n_subbatch=32, profile=prof)
    assert p.extra["executor"] is None and p.throughput > 0
    (note,) = p.extra["notes"]
    assert "no pipeline section" in note and "sprint profile --update" in note
    assert "note: " + note in P.format_prediction(p)


def test_sprint_profile_update_writes_the_section_from_saved_records(tmp_path, capsys):
    src, recs = tmp_path / "p.json", tmp_path / "r.json"
    _profile().save(src)
    recs.write_text(json.dumps({"records": _records(1.3)}))
    out = tmp_path / "out.json"
    assert cli.main(["profile", "--update", str(src), "--from-records", str(recs), "--out", str(out)]) == 0
    assert "pipeline section: per pass 0.120 ms" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["pipeline"]["executor"]["per_pass"] == pytest.approx(TRUE.per_pass, rel=1e-6)
    assert d["terms"] == json.loads(src.read_text())["terms"] and "pipeline" not in json.loads(src.read_text())
    assert cli.main(["profile", "--update", str(src), "--only", "sgemm"]) == 2
    assert "only pipeline, calibration can be added" in capsys.readouterr().err
    recs.write_text(json.dumps({"records": []}))
    assert cli.main(["profile", "--update", str(src), "--from-records", str(recs)]) == 2
    assert capsys.readouterr().err.strip() == f"sprint: error: no pipeline runs among the records ({recs})"


def test_kind_factors_recovered_where_each_pass_holds_one_kind():
    ex = P.Executor(per_pass=1e-4, cold=0.1)
    want = {"conv_f": 0.9, "conv_b": 0.75, "other_f": 1.2}
    kernels = {"conv_f": [2e-4, 5e-4], "conv_b": [4e-4, 9e-4], "other_f": [1e-4, 3e-4]}
    passes = [(kind, k, 1e-5, 1.1 * want[kind] * k + 1e-5 + 1e-4) for kind, ks in kernels.items() for k in ks]
    got = P.fit_kind_factors(ex, passes)
    for kind, f in want.items():
        assert getattr(got, kind) == pytest.approx(f, rel=1e-9)
    assert got.other_b == 1.0 and (got.per_pass, got.cold) == (ex.per_pass, ex.cold)


def test_kind_factors_price_conv_and_other_layers_apart():
    ex = P.Executor(per_pass=1e-4, conv_b=0.5, other_f=2.0)
    parts = [(0, 2), (2, 4)]                    # digits: conv1, conv2 | fc1, fc2
    prof = _profile()
    base = P.stage_costs("digits", parts, 32, 4, prof)
    got = P.stage_costs("digits", parts, 32, 4, prof, executor=ex)
    n_f, n_b = P.executor_copies("gpipe")
    copy = [prof.term("copy", c.params) for c in base]
    assert got[0].t_f == pytest.approx(base[0].t_f + n_f * copy[0] + 1e-4)
    assert got[0].t_b == pytest.approx(0.5 * base[0].t_b + n_b * copy[0] + 1e-4)
    assert got[1].t_f == pytest.approx(2.0 * base[1].t_f + n_f * copy[1] + 1e-4)
    assert got[1].t_b == pytest.approx(base[1].t_b + n_b * copy[1] + 1e-4)
    # a section written before the factors loads with all of them 1
    old = P.Executor.load({"executor": {"per_pass": 1e-4, "cold": 0.0, "per_instruction": 0.0, "shared": 0.0}})
    assert (old.conv_f, old.conv_b, old.other_f, old.other_b) == (1.0, 1.0, 1.0, 1.0)


def test_fit_with_kind_factors_reproduces_the_runs_it_was_fitted_on():
    true = replace(TRUE, conv_b=0.8, other_f=1.15)
    prof = _profile()
    runs = [_run(n, K, s, prof, true, 2, False, 1.0) for n, K, s in PP.FIT_CONFIGS]
    ex = P.Executor.load(PP.fit_section(prof, runs, cores=2))
    for r in runs:
        for s, (f, b) in zip(r["stages"], PP.predicted_passes(r, prof, ex, 2)):
            assert f == pytest.approx(s["fwd_mean"], rel=0.03) and b == pytest.approx(s["bwd_mean"], rel=0.03)
