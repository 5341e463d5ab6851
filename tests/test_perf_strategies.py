"""sprint predict | simulate --parallel NAME: the strategy table's dispatch,
each strategy's own options (refused under another), and the pipeline's
predict and simulate through the CLI against the library and closed forms."""
import json
import sys
import types

import pytest

from engine import cli
from engine.errors import RunError
from engine.perf import pipeline as P
from engine.perf import pipeline_sim as PS
from engine.perf import strategies
from engine.perf.profile import Profile

PROF = Profile.synthetic()
BASE = ["--model", "cifar", "--subbatch", "8", "--no-calibrate"]


@pytest.fixture()
def prof_file(tmp_path):
    p = tmp_path / "p.json"
    PROF.save(p)
    return str(p)


def _options(command):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return sub, sub.get_default("strategy_options")


def _owned(command):
    """(strategy, flag, action) of every strategy's own options."""
    sub, opts = _options(command)
    return [(o, max(a.option_strings, key=len), a) for a in sub._actions
            for o in opts["owners"].get(a.dest, [])]


def test_every_row_resolves_to_a_complete_module():
    assert {"asgd", "pipeline"} <= set(strategies.names())
    for name in strategies.names():
        mod = strategies.module(name)
        assert callable(mod.predict) and callable(mod.format_prediction), name
        if hasattr(mod, "simulate"):
            assert callable(mod.format_simulation), name
        for hook in ("add_cli_arguments", "add_simulate_arguments", "cli_kwargs"):
            assert callable(getattr(mod, hook, len)), (name, hook)
    with pytest.raises(ValueError, match="no cost model for strategy 'nope'"):
        strategies.module("nope")


@pytest.mark.parametrize("command", ["predict", "simulate"])
def test_every_rows_options_parse_under_it_and_are_refused_under_the_others(command, capsys):
    owned = _owned(command)
    assert any(o == "pipeline" and f == "--stages" for o, f, _ in owned)
    sub, opts = _options(command)
    for owner, flag, action in owned:
        value = [] if action.nargs == 0 else [str(action.choices[-1]) if action.choices else "2"]
        argv = [command, "--model", "cifar", "--subbatch", "8", flag, *value]
        for name in strategies.names():
            args = cli.build_parser().parse_args([*argv, "--parallel", name])
            if name in opts["owners"][action.dest]:
                try:
                    strategies.kwargs_from_args(name, args, args.strategy_options)
                except (RunError, ValueError) as e:          # its own checks may object to the value
                    assert "only, not to" not in str(e), (name, flag)
                continue
            with pytest.raises(RunError) as e:
                strategies.kwargs_from_args(name, args, args.strategy_options)
            msg = str(e.value)
            assert flag in msg and owner in msg.split(" only")[0] and f"not to --parallel {name}" in msg
            # the user sees one line naming both
            assert cli.main([*argv, "--parallel", name, "--nodes", "2"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("sprint: error: ") and flag in err[0], err


def test_refusal_names_every_foreign_option_once(capsys):
    assert cli.main(["predict", *BASE, "--nodes", "2", "--stages", "2", "--microbatches", "2"]) == 2
    assert capsys.readouterr().err.strip() == \
        "sprint: error: apply to --parallel pipeline only, not to --parallel asgd (--microbatches, --stages)"
    assert cli.main(["predict", "--parallel", "pipeline", *BASE, "--stages", "2", "--impl", "seed"]) == 2
    assert "(--impl)" in capsys.readouterr().err


def test_rows_run_through_the_cli_and_match_the_library(prof_file, capsys):
    for name in strategies.names():
        for alias in ("--parallel", "--strategy"):
            assert cli.main(["predict", alias, name, *BASE, "--nodes", "2", "--profile", prof_file, "--json"]) == 0
            got = json.loads(capsys.readouterr().out)
            assert got["t_epoch"] == pytest.approx(strategies.predict(name, "cifar", 2, 1, 8, PROF).t_epoch)


def test_pipeline_predict_cli_passes_its_options(prof_file, capsys):
    argv = ["predict", "--parallel", "pipeline", *BASE, "--profile", prof_file, "--stages", "3", "--replicas", "2",
            "--microbatches", "4", "--schedule", "1f1b", "--predict", "spectrain", "--partition", "0:2,2:5,5:8",
            "--ranks-per-host", "6"]
    assert cli.main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = P.predict("cifar", None, 1, 8, PROF, stages=3, replicas=2, microbatches=4, schedule="1f1b",
                     predict_mode="spectrain", partition=[(0, 2), (2, 5), (5, 8)], ranks_per_host=6)
    assert got["t_minibatch"] == pytest.approx(want.t_minibatch) and got["partition"] == [[0, 2], [2, 5], [5, 8]]
    assert got["extra"]["cores"] == pytest.approx(PROF.cores)     # six ranks on one host share its cores
    # spectrain prices its weight copies: slower than the live weights
    none = P.predict("cifar", None, 1, 8, PROF, stages=3, replicas=2, schedule="1f1b",
                     partition=[(0, 2), (2, 5), (5, 8)], ranks_per_host=6)
    assert all(a.t_f > b.t_f and a.t_b > b.t_b for a, b in zip(want.costs, none.costs))
    assert cli.main(argv[:-2] + ["--pipe-schedule", "1f1b"]) == 0            # the train spelling works too
    assert "schedule 1f1b" in capsys.readouterr().out


@pytest.mark.parametrize("argv,where", [
    (["--stages", "2", "--workers", "2"], "--workers"),
    (["--stages", "2", "--nodes", "3"], "--nodes"),
    (["--nodes", "5", "--replicas", "2"], "--nodes"),
    ([], "--stages"),
    (["--stages", "2", "--predict", "spectrain"], "--predict"),
    (["--stages", "2", "--microbatches", "9"], "--microbatches"),
    (["--stages", "2", "--partition", "0:2,2:5,5:8"], "--partition"),
])
def test_pipeline_cli_refuses_inconsistent_options(argv, where, capsys):
    assert cli.main(["predict", "--parallel", "pipeline", *BASE, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sprint: error: ") and err.endswith(f"({where})") and "\n" not in err


def test_nodes_stay_required_for_other_strategies(capsys):
    assert cli.main(["predict", *BASE]) == 2
    assert "required with --parallel asgd (--nodes)" in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "dualpipe"])
def test_pipeline_simulate_cli_matches_its_closed_form(schedule, prof_file, capsys):
    argv = ["simulate", "--parallel", "pipeline", *BASE, "--profile", prof_file, "--stages", "3",
            "--schedule", schedule, "--updates", "20", "--json"]
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    sim, cf = got["simulation"], got["closed_form"]
    assert sim["minibatches"] == 20 and len(sim["bubble"]) == 3
    assert sim["makespan"] == pytest.approx(cf["stream"], rel=0.02)
    # drawn durations: reproducible by seed, different across seeds
    a = [cli.main([*argv, "--cv", "0.3", "--seed", str(s)]) or json.loads(capsys.readouterr().out)
         for s in (1, 1, 2)]
    assert a[0]["simulation"]["makespan"] == a[1]["simulation"]["makespan"] != a[2]["simulation"]["makespan"]
    assert cli.main(argv[:-1] + ["--explain"]) == 0
    out = capsys.readouterr().out
    assert "closed form" in out and "the ideal bubble of GPipe and 1F1B, (K-1)/(M+K-1) = " in out and "stream s" in out


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "dualpipe"])
@pytest.mark.parametrize("K,M", [(1, 1), (2, 4), (4, 4), (8, 2)])
def test_closed_form_is_exact_for_equal_stages(schedule, K, M):
    costs = [P.StageCost(("x",), 1, 1e-3, 2e-3, 3e-4, 1e-4 if k < K - 1 else 0.0) for k in range(K)]
    n = 10
    cf = PS.closed_form(costs, schedule, M)
    got = PS.play(costs, schedule, M, n * M)["makespan"]
    assert got == pytest.approx(n * cf["t_minibatch"] + cf["fill_drain"], rel=1e-9)


def test_a_strategy_without_simulator_is_a_clear_error(monkeypatch, capsys):
    fake = types.ModuleType("fake_cost_model")
    fake.predict, fake.format_prediction = P.predict, P.format_prediction
    monkeypatch.setitem(sys.modules, "fake_cost_model", fake)
    monkeypatch.setitem(strategies.COST_MODELS, "nosim", "fake_cost_model")
    assert cli.main(["simulate", "--parallel", "nosim", *BASE, "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert "strategy nosim has a cost model (sprint predict) but no simulator" in err and "(--parallel)" in err
    assert cli.main(["predict", "--parallel", "nosim", *BASE, "--nodes", "2"]) == 0


def test_an_option_two_strategies_declare_belongs_to_both(monkeypatch, capsys):
    def row(name, default):
        m = types.ModuleType(name)
        m.predict, m.format_prediction = P.predict, P.format_prediction
        m.add_cli_arguments = lambda p: p.add_argument("--fake-servers", type=int, default=default, help=name)
        m.cli_kwargs = lambda a: {"n_node": 2, "seen": a.fake_servers}
        monkeypatch.setitem(sys.modules, name, m)
        monkeypatch.setitem(strategies.COST_MODELS, name, name)
    row("fake_a", 1)
    row("fake_b", 3)
    sub, opts = _options("predict")
    assert opts["owners"]["fake_servers"] == ["fake_a", "fake_b"]
    parse = lambda *a: cli.build_parser().parse_args(["predict", *BASE, *a])
    for name, want in (("fake_a", 1), ("fake_b", 3)):      # each with its own default
        args = parse("--parallel", name)
        assert strategies.kwargs_from_args(name, args, args.strategy_options)["seen"] == want
        args = parse("--parallel", name, "--fake-servers", "5")
        assert strategies.kwargs_from_args(name, args, args.strategy_options)["seen"] == 5
    args = parse("--fake-servers", "5")
    with pytest.raises(RunError, match="applies to --parallel fake_a / fake_b only, not to --parallel asgd"):
        strategies.kwargs_from_args("asgd", args, args.strategy_options)
