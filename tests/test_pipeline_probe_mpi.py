"""``sprint profile --update`` with its pipeline sweep run for real under
mpiexec (engine.perf.pipeline_probe): the sweep's records, the section it
fits into a copy of the shipped profile, and predictions that use it. What
is recorded and fitted, not how fast anything is (a few seconds of digits)."""
import json
import math
import shutil

import numpy as np
import pytest

from engine import cli
from engine.perf import pipeline as P
from engine.perf import pipeline_probe as PP
from engine.parallel.threads import usable_cores
from engine.perf.profile import Profile

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]


def test_profile_update_sweeps_pipelines_under_mpiexec_and_fits_the_section(tmp_path, capsys):
    src, out, recs = tmp_path / "shipped.json", tmp_path / "updated.json", tmp_path / "records.json"
    shipped = Profile.load()
    shipped.data.pop("pipeline", None)
    shipped.save(src)
    assert cli.main(["profile", "--update", str(src), "--out", str(out), "--records", str(recs)]) == 0
    printed = capsys.readouterr()
    assert f"profile written to {out}" in printed.out
    cores = usable_cores()           # what sweep_pipeline counts

    # The records: one ping-pong table by size and one timed run per configuration.
    records = json.loads(recs.read_text())["records"]
    (ping,) = [r for r in records if r["kind"] == "pipeline_p2p"]
    assert ping["bytes"] == [4 * n for n in PP.PING_FLOATS] and all(t > 0 for t in ping["times"])
    assert ping["eager_bytes"] in ping["bytes"]
    runs = [r for r in records if r["kind"] == "pipeline_run"]
    configs = PP.FIT_CONFIGS + tuple(c for c in PP.SHARED_CONFIGS if c[1] > cores)
    assert [(r["net"], r["K"], r["schedule"]) for r in runs] == list(configs)
    for r in runs:
        assert r["calibration"]["wall_s"] > 0 and r["shared"] == (r["K"] > cores)
        bounds = [b for part in r["partition"] for b in part]     # contiguous stages over every layer
        assert len(r["stages"]) == r["K"] == len(r["partition"]) and bounds[0] == 0
        assert bounds[-1] == len(P.layer_times("digits", 8, shipped)) and all(
            a == b for a, b in zip(bounds[1:-1:2], bounds[2::2]))
        for s in r["stages"]:       # each stage ran every micro-batch forward and backward
            assert s["fwd_count"] == s["bwd_count"] == r["n_mb"] > 0 and s["fwd_mean"] > 0 and s["bwd_mean"] > 0

    # The section: only it was added; the kernel prices are the source's.
    d, before = json.loads(out.read_text()), json.loads(src.read_text())
    assert "pipeline" not in before and {k: v for k, v in d.items() if k != "pipeline"} == before
    sec = d["pipeline"]
    assert sec["fitted_on"] == [list(c) for c in configs] and sec["shared_fitted"] == any(c[1] > cores for c in configs)
    ex = P.Executor(**sec["executor"])
    assert all(math.isfinite(v) and v >= 0 for v in vars(ex).values())
    assert ex.per_pass < 0.05 and ex.per_instruction < 0.05 and sec["calibration_ratio"] > 0

    # Fitted on these runs, the model prices their unshared passes to within
    # a factor, pass by pass, and by the median of all of them much closer.
    # The section is stored in the profile's time base: at the host's speed
    # during the runs (time_scale) stage_costs rescales it with the kernels.
    prof = Profile.load(out)
    prof.time_scale = sec["calibration_ratio"]
    ratios = []
    for r in runs:
        if r["shared"]:
            continue
        for s, (pf, pb) in zip(r["stages"], PP.predicted_passes(r, prof, ex, cores)):
            ratios += [s["fwd_mean"] / pf, s["bwd_mean"] / pb]
    assert all(0.25 < q < 4 for q in ratios), ratios
    assert 0.7 < float(np.median(ratios)) < 1.4, ratios

    # predict uses the section by default: no "kernels alone" note.
    p = P.predict("digits", stages=2, n_subbatch=32, profile=prof)
    assert p.extra["executor"] is not None and not any("no pipeline section" in n for n in p.extra["notes"])
