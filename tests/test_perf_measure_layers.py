"""--measure-layers (engine.perf.measure_layers): the net's own layer passes,
timed here, price ComputeGradient in place of the fitted per-layer terms;
the sharing and queueing model around them stays as it is."""
import pytest

from engine import cli
from engine import spec as spec_mod
from engine.errors import RunError
from engine.perf import measure_layers, model
from engine.perf.profile import Profile


def _known_passes(net, n):
    """A distinct, known time for every layer pass (not the machine's)."""
    return {(g.name, pas): (i + 1) * 1e-4 + (j + 1) * 1e-5 + n * 1e-6
            for i, g in enumerate(spec_mod.layers(spec_mod.get_spec(net), n)) for j, pas in enumerate(("fwd", "bwd"))}


def _measured_profile(net, n, backend="cpu"):
    prof = Profile.synthetic(backend=backend)
    prof.layer_measure = measure_layers.LayerMeasure()
    prof.layer_measure.put(net, n, _known_passes(net, n))
    return prof


@pytest.mark.parametrize("net", ["digits", spec_mod.NetSpec("k11", 40, 2, 11, ((6, 2), (12, 2)), (40, 10))])
def test_measured_passes_replace_the_fitted_terms_and_the_loss_stays(net):
    n = 6
    prof = _measured_profile(net, n)
    sp = spec_mod.get_spec(net)
    rows = model.compute_gradient_terms(sp, n, prof)
    fitted = model.compute_gradient_terms(sp, n, prof, measured=False)
    known = _known_passes(net, n)
    assert {(r[0], r[1]): r[4] for r in rows if r[1] != "loss"} == known
    assert all(r[2] == "measured" for r in rows if r[1] != "loss")
    assert [r for r in rows if r[1] == "loss"] == [r for r in fitted if r[1] == "loss"] != []
    # ComputeGradient moves by exactly the passes' difference times the host's slowdown
    got = model.step_costs(sp, 2, 2, n, prof, ranks_per_host=2)
    ref = model.step_costs(sp, 2, 2, n, Profile(prof.data), ranks_per_host=2)
    slow = got["_slowdown"][0]
    assert slow == ref["_slowdown"][0]          # the net's place among the sweeps: the fitted share
    diff = sum(known.values()) - sum(r[4] for r in fitted if r[1] != "loss")
    assert got["compute_gradient"][0] - ref["compute_gradient"][0] == pytest.approx(slow * diff, rel=1e-9)
    p = model.predict(sp, 1, 1, n, prof)
    assert p.t_gpu > sum(known.values())


def test_measure_passes_times_every_layer_of_the_net():
    got = measure_layers.measure_passes("tiny", 3, seconds=0.05, min_repeats=3, max_repeats=5)
    want = {(g.name, pas) for g in spec_mod.layers(spec_mod.get_spec("tiny"), 3) for pas in ("fwd", "bwd")}
    assert set(got) == want and all(t > 0 for t in got.values())
    m = measure_layers.LayerMeasure(seconds=0.05, min_repeats=3, max_repeats=5)
    first = m.times("tiny", 3)
    assert m.times("tiny", 3) is first            # timed once per net and batch size


def test_a_profile_of_another_backend_is_refused():
    with pytest.raises(RunError, match="measure-layers"):
        measure_layers.enable(Profile.synthetic(backend="gpu"))
    with pytest.raises(ValueError):
        measure_layers.LayerMeasure(seconds=0)


def test_predict_measure_layers_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "p.json"
    Profile.synthetic(backend="cpu").save(path)
    args = ["predict", "--model", "tiny", "--nodes", "1", "--workers", "1", "--subbatch", "4", "--profile",
            str(path), "--no-calibrate", "--json"]
    assert cli.main(args) == 0
    fitted = capsys.readouterr().out
    assert cli.main(args + ["--measure-layers"]) == 0
    import json
    got = json.loads(capsys.readouterr().out)
    assert {r[2] for r in got["layers"] if r[1] != "loss"} == {"measured"}
    assert got["t_gpu"] != json.loads(fitted)["t_gpu"]
