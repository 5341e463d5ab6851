"""The ranges of predict / simulate / tune / plan's sizes (engine.perf.cli_ranges):
a size no run can have is one error line naming its option, a legal one far
outside what the profile measured is priced with a warning; ordinary sizes
say nothing."""
import pytest

from engine import cli


def _err(capsys):
    return capsys.readouterr().err.strip().splitlines()


def _one_error(capsys, *fragments):
    err = _err(capsys)
    assert len(err) == 1 and err[0].startswith("sprint: error: "), err
    for f in fragments:
        assert f in err[0], err[0]


BASE = ["--no-calibrate", "--no-layers"]


@pytest.mark.parametrize("argv, where", [
    (["predict", "--model", "cnn-a", "--nodes", "100000000", "--subbatch", "8"], "(--nodes)"),
    (["predict", "--model", "tiny", "--nodes", "100", "--workers", "3", "--subbatch", "1"], "(--nodes)"),
    (["predict", "--model", "tiny", "--nodes", "2", "--subbatch", "100000"], "(--subbatch)"),
    (["predict", "--model", "tiny", "--nodes", "2", "--subbatch", "20", "--n-file", "10"], "(--subbatch)"),
    (["predict", "--model", "tiny", "--parallel", "pipeline", "--stages", "2", "--replicas", "200",
      "--subbatch", "8"], "(--replicas)"),
    (["predict", "--model", "tiny", "--parallel", "downpour", "--nodes", "1000000", "--subbatch", "8"], "(--nodes)"),
])
def test_more_workers_or_samples_than_the_epoch_is_refused(argv, where, capsys):
    assert cli.main(argv + BASE) == 2
    _one_error(capsys, "samples of an epoch", where)


def test_simulate_refuses_them_before_simulating(capsys):
    assert cli.main(["simulate", "--model", "tiny", "--nodes", "100000", "--subbatch", "8", "--no-calibrate"]) == 2
    _one_error(capsys, "more than the 256 samples", "(--nodes)")


def test_tune_refuses_a_target_beyond_the_epoch(capsys):
    assert cli.main(["tune", "--model", "cnn-a", "--target-minibatch", "1e12", "--no-calibrate"]) == 2
    _one_error(capsys, "more than the 1,281,167 samples", "(--target-minibatch)")
    assert cli.main(["tune", "--model", "tiny", "--target-minibatch", "300", "--no-calibrate"]) == 2
    _one_error(capsys, "at most 256", "(--target-minibatch)")
    assert cli.main(["tune", "--model", "tiny", "--target-minibatch", "30", "--max-nodes", "100000000",
                     "--no-calibrate"]) == 2
    _one_error(capsys, "(--max-nodes)")


def _no_calibration(monkeypatch):
    from engine.perf import calibrate

    def started(*a, **kw):
        raise AssertionError("the calibration started")
    monkeypatch.setattr(calibrate, "check", started)


def test_an_endless_calibration_is_refused(capsys, monkeypatch):
    _no_calibration(monkeypatch)
    assert cli.main(["predict", "--model", "tiny", "--nodes", "2", "--subbatch", "8",
                     "--calibrate-seconds", "1e9"]) == 2
    _one_error(capsys, "at most 600 s", "(--calibrate-seconds)")


def test_far_beyond_the_measured_ranks_warns_and_still_predicts(capsys):
    assert cli.main(["predict", "--model", "cifar", "--nodes", "4096", "--subbatch", "8"] + BASE) == 0
    out = capsys.readouterr()
    warn = [l for l in out.err.splitlines() if "warning" in l]
    assert len(warn) == 1 and "--nodes 4,096" in warn[0] and "timed at up to 4 ranks" in warn[0], warn
    assert "T_Epoch" in out.out


def test_an_epoch_shorter_than_one_round_warns(capsys):
    assert cli.main(["predict", "--model", "tiny", "--nodes", "20", "--workers", "2", "--subbatch", "8"] + BASE) == 0
    err = capsys.readouterr().err
    assert "= 320 samples is more than the epoch's 256" in err


def test_a_long_simulation_says_so_first(capsys, monkeypatch):
    from engine.perf import cli_ranges
    monkeypatch.setattr(cli_ranges, "SIMULATED_STEPS_PER_S", 1.0)      # every simulation is "long"
    assert cli.main(["simulate", "--model", "tiny", "--nodes", "2", "--subbatch", "8", "--updates", "5",
                     "--no-calibrate"]) == 0
    err = capsys.readouterr().err
    assert "worker steps to simulate" in err and "45 updates" in err


@pytest.mark.parametrize("argv", [
    ["predict", "--model", "cifar", "--nodes", "16", "--workers", "2", "--subbatch", "8"] + BASE,
    ["predict", "--model", "tiny", "--nodes", "4", "--workers", "2", "--subbatch", "8"] + BASE,
    ["tune", "--model", "tiny", "--target-minibatch", "30", "--no-calibrate"],
])
def test_ordinary_sizes_say_nothing(argv, capsys):
    assert cli.main(argv) in (0, 1)
    assert "warning" not in capsys.readouterr().err


def test_plan_checks_its_sizes_too(capsys, monkeypatch):
    assert cli.main(["plan", "--model", "tiny", "--gpus", "128", "--no-calibrate"]) == 0
    err = [l for l in _err(capsys) if "warning" in l]
    assert len(err) == 1 and "--gpus 128: the profile's allreduce was timed at up to 4 ranks" in err[0], err
    _no_calibration(monkeypatch)
    assert cli.main(["plan", "--model", "tiny", "--gpus", "2", "--calibrate-seconds", "1e9"]) == 2
    _one_error(capsys, "at most 600 s", "(--calibrate-seconds)")


def test_plan_columns_stay_apart_at_a_huge_batch():
    # batch 1e8 over 4 devices: 'img/s' and 'ms/batch' ran together ('432,208231370.113')
    from engine.perf.plan import format_plan, make_plan
    plan, ev, base, ranked, prof = make_plan("tiny", 4, 100_000_000)
    rows = format_plan(plan, ev, base, ranked, prof).splitlines()[-len(ranked):]
    for c, row in zip(ranked, rows):
        assert f" {c.throughput:,.0f} " in row, row


@pytest.mark.parametrize("extra, where", [
    (["--parallel", "pipeline", "--stages", "2", "--overlap", "2"], "(--overlap)"),
    (["--parallel", "downpour", "--nodes", "3", "--round-trip", "-1"], "(--round-trip)"),
    (["--parallel", "sandblaster", "--nodes", "3", "--slow-factor", "0"], "(--slow-factor)"),
])
def test_strategy_values_outside_their_model_are_refused(extra, where, capsys):
    # each was priced: a negative round trip gave 'server utilisation -0.00'
    assert cli.main(["predict", "--model", "tiny", "--subbatch", "8"] + extra + BASE) == 2
    _one_error(capsys, where)


def test_long_downpour_simulations_and_tune_searches_say_so_first(capsys, monkeypatch):
    from engine.perf import cli_ranges
    monkeypatch.setattr(cli_ranges, "DOWNPOUR_STEPS_PER_S", 0.01)
    monkeypatch.setattr(cli_ranges, "CONFIGURATIONS_PER_S", 0.01)
    assert cli.main(["simulate", "--model", "tiny", "--parallel", "downpour", "--nodes", "2", "--subbatch", "8",
                     "--steps", "3", "--no-calibrate"]) == 0
    assert "2 replicas x 3 steps to simulate" in capsys.readouterr().err
    assert cli.main(["tune", "--model", "tiny", "--target-minibatch", "8", "--max-nodes", "1", "--max-subbatch", "1",
                     "--max-workers", "2", "--no-calibrate"]) in (0, 1)
    assert "2 configurations to price" in capsys.readouterr().err


def test_plan_refuses_a_search_beyond_the_memory_before_any_of_its_seconds(capsys, monkeypatch):
    """`plan --gpus 100000` computed for seconds, then died of a 4 GiB numpy
    allocation; now the size of its largest cost table is judged first."""
    _no_calibration(monkeypatch)
    from engine.perf import layerwise

    def built(*a, **kw):
        raise AssertionError("the cost tables were built")
    monkeypatch.setattr(layerwise, "cost_graph", built)
    assert cli.main(["plan", "--model", "cifar", "--gpus", "100000"]) == 2
    _one_error(capsys, "on 100,000 devices needs a cost table of", "GiB of memory free here", "(--gpus)")


def test_plan_size_is_judged_against_the_memory_free(capsys):
    from engine.errors import RunError
    from engine.perf import cli_ranges, layerwise
    largest, total = cli_ranges.plan_tables("tiny", 64, 2048)
    nodes = layerwise.graph_nodes("tiny")
    n = [len(layerwise.configs(v, 64, 2048)) for v in nodes]
    assert largest == max(a * b * 64 for a, b in zip(n, n[1:])) and total >= largest > 0
    need = largest * cli_ranges.PLAN_BYTES_PER_ENTRY
    assert cli_ranges.check_plan_size("tiny", 64, 2048, free=need) == ""
    with pytest.raises(RunError, match="more than the 0.0 GiB"):
        cli_ranges.check_plan_size("tiny", 64, 2048, free=need - 1)
    assert cli_ranges.check_plan_size("tiny", 4000, 128000, free=1 << 60) == ""    # 96 M entries, 19 s
    warn = cli_ranges.check_plan_size("tiny", 16000, 512000, free=1 << 60)
    assert warn == ("--gpus 16,000: the layer-wise search's cost tables hold 911,104,000 entries, about 3 min "
                    "to build at this machine's pace"), warn


def test_tune_leaves_out_configurations_whose_first_round_outruns_the_epoch(capsys):
    """On tiny's 256 samples the tuner chose 1 node x 4 workers x 192
    (768 samples before every worker stepped once) and searched 256 x 2 x 1.

    N_GPU is fixed at 4 (--workers 4), not searched over 1..4 (--max-workers
    4): the grid still holds both kinds (1 x 4 x 192, 256 x 4 x 1) and the
    filter is one test of N_Node x N_GPU x N_Subbatch whatever N_GPU; the
    1..4 search priced 451 configurations, 71 s a call on a 2-core AMD VM
    (the 2-worker ones 0.8 s each), this one 84."""
    import json
    from engine.perf.tune import NODE_GRID, SUBBATCH_GRID
    argv = ["tune", "--model", "tiny", "--target-minibatch", "250", "--tolerance", "0.5",
            "--max-nodes", "256", "--workers", "4", "--no-calibrate"]
    assert cli.main(argv + ["--top", "2000", "--json"]) == 0
    cands = json.loads(capsys.readouterr().out)
    assert cands and any(c["feasible"] for c in cands)
    assert max(c["n_node"] * c["n_gpu"] * c["n_subbatch"] for c in cands) <= 256
    inside = {(n, 4, s) for n in NODE_GRID for s in SUBBATCH_GRID if n <= 256 and n * 4 * s <= 256}
    assert {(c["n_node"], c["n_gpu"], c["n_subbatch"]) for c in cands} == inside
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    beyond = sum(n <= 256 and n * 4 * s > 256 for n in NODE_GRID for s in SUBBATCH_GRID)
    assert beyond > 0 and f"{beyond} more left out: N_Node x N_GPU x N_Subbatch more than the epoch's 256 samples" \
        in out, out


def test_tune_with_no_configuration_inside_the_epoch_is_one_error(capsys):
    assert cli.main(["tune", "--model", "tiny", "--target-minibatch", "1", "--n-file", "1", "--workers", "2",
                     "--max-nodes", "1", "--no-calibrate"]) == 2
    _one_error(capsys, "more workers x N_Subbatch than the 1 samples", "(--n-file)")


@pytest.mark.parametrize("out, where", [("/proc/sprint-plan.json", "(/proc)")])
def test_plan_refuses_an_unwritable_out_before_its_search(tmp_path, capsys, monkeypatch, out, where):
    """`plan --out /proc/x.json` searched, then said 'no such file or folder
    (/proc/x.json)'."""
    _no_calibration(monkeypatch)
    from engine.perf import layerwise

    def built(*a, **kw):
        raise AssertionError("the cost tables were built")
    monkeypatch.setattr(layerwise, "cost_graph", built)
    assert cli.main(["plan", "--model", "tiny", "--gpus", "2", "--out", out]) == 2
    _one_error(capsys, "cannot write into this folder", where)
