"""sprint report: table and PNG from a measured asgd_stats.json or
sync_stats.json (sync: allreduce per step and throughput over time)."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from toy import SoftmaxSource, init_weights, make_data  # noqa: E402

from engine.parallel.asgd import ASGD, ASGDConfig  # noqa: E402
from engine.parallel import cli as pcli  # noqa: E402
from engine.parallel.report import load_stats, summary_table, throughput_over_time  # noqa: E402
from engine.parallel.sync import SyncConfig, SyncSGD  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    x, y, k = make_data(n=200)
    a = ASGD(None, init_weights(x.shape[1], k),
             [SoftmaxSource(x, y, k, 4, shard=(t, 2), delay=0.0005) for t in range(2)],
             ASGDConfig(lr=0.05, max_samples=800)).run()
    (d / "asgd_stats.json").write_text(json.dumps(a.stats({"n_subbatch": 4, "model": "toy"})))
    return d


def test_table_reports_measured_numbers(run_dir):
    st = load_stats(run_dir)
    text = summary_table(st)
    assert f"N_Minibatch_avg measured {np.mean(st['minibatch']):.2f}" in text
    for name in ("FetchWeights", "ComputeGradient", "LockGradient", "SumGradient", "Allreduce", "UpdateWeights"):
        assert name in text
    assert "staleness mean" in text


def test_cli_writes_png(run_dir, capsys):
    import argparse
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    pcli.register(sub)
    args = p.parse_args(["report", str(run_dir)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    png = run_dir / "parallel_report.png"
    assert "T_GPU" in out and png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_missing_stats_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="asgd_stats.json"):
        load_stats(tmp_path)


def test_report_of_what_is_not_a_parallel_run_is_one_line(tmp_path, capsys):
    from engine import cli
    one = tmp_path / "one"                       # a one-process run: config.json, no statistics
    one.mkdir()
    (one / "config.json").write_text(json.dumps({"model": "digits", "mode": "layerwise"}))
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "sync_stats.json").write_text('{"mode": "sync", "n_no')
    cases = ((one, "no statistics of a parallel run", "pipeline_stats.json", f"({one})"),
             (one / "config.json", "not the statistics of a parallel run", f"({one / 'config.json'})"),
             (torn, "not a readable statistics file", f"({torn / 'sync_stats.json'})"),
             (tmp_path / "none", "no such run directory", f"({tmp_path / 'none'})"))
    for target, *fragments in cases:
        assert cli.main(["report", str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("sprint: error: "), err
        assert all(f in err[0] for f in fragments), err[0]
    assert not list(tmp_path.rglob("*.png"))


@pytest.fixture(scope="module")
def sync_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("sync")
    x, y, k = make_data(n=200)
    s = SyncSGD(None, init_weights(x.shape[1], k),
                [SoftmaxSource(x, y, k, 4, shard=(t, 2)) for t in range(2)],
                SyncConfig(lr=0.05, max_steps=30)).run()
    (d / "sync_stats.json").write_text(json.dumps(s.stats({"n_subbatch": 4, "model": "toy"})))
    return d


def test_sync_stats_keep_a_per_step_record(sync_dir):
    st = load_stats(sync_dir)
    ser = st["series"]
    assert st["steps"] == 30 and all(len(ser[k]) == 30 for k in ("t", "samples", "allreduce", "step"))
    assert ser["samples"] == [8 * (i + 1) for i in range(30)]          # 2 workers x 4 per step
    assert np.all(np.diff(ser["t"]) > 0) and ser["t"][-1] <= st["wall_s"] + 1e-6
    assert np.all(np.asarray(ser["allreduce"]) <= np.asarray(ser["step"]))
    assert np.mean(ser["allreduce"]) == pytest.approx(st["timers"]["Allreduce"]["mean"], abs=1e-7)  # rounded to 0.1 us
    assert "% of a step" in summary_table(st)


def test_throughput_over_time_is_samples_per_second_of_each_window():
    t = np.arange(1, 101) * 0.01                 # a step every 10 ms ...
    samples = np.arange(1, 101) * 8              # ... of 8 images: 800 img/s
    mid, rate = throughput_over_time(t, samples, windows=10)
    assert len(rate) == 10 and np.allclose(rate, 800.0)
    t2 = t.copy()
    t2[50:] += 1.0                               # a 1 s pause (an evaluation) after step 50
    mid, rate = throughput_over_time(t2, samples, windows=99)
    assert rate.min() == pytest.approx(8 / 1.01) and np.median(rate) == pytest.approx(800.0)
    assert throughput_over_time([0.1], [8])[1].size == 0


def test_sync_png_draws_allreduce_per_step_and_throughput(sync_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from engine.parallel import report
    st = load_stats(sync_dir)
    fig, axes = plt.subplots(1, 2)
    report._plot_sync(st, axes)
    step_line, ar_line = axes[0].lines
    np.testing.assert_allclose(ar_line.get_ydata(), np.asarray(st["series"]["allreduce"]) * 1e3)
    np.testing.assert_allclose(step_line.get_ydata(), np.asarray(st["series"]["step"]) * 1e3)
    mid, rate = throughput_over_time(st["series"]["t"], st["series"]["samples"])
    np.testing.assert_allclose(axes[1].lines[0].get_ydata(), rate)
    assert not axes[0].texts and not axes[1].texts          # no "no data" panel
    plt.close(fig)
    old = {k: v for k, v in st.items() if k != "series"}    # written before the per-step record
    fig, axes = plt.subplots(1, 2)
    report._plot_sync(old, axes)
    assert "no per-step record" in axes[0].texts[0].get_text()
    plt.close(fig)
    png = report.plot_distributions(st, sync_dir / "r.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
