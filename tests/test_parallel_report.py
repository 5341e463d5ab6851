"""sprint report: table and PNG from a measured asgd_stats.json."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from toy import SoftmaxSource, init_weights, make_data  # noqa: E402

from engine.parallel.asgd import ASGD, ASGDConfig  # noqa: E402
from engine.parallel import cli as pcli  # noqa: E402
from engine.parallel.report import load_stats, summary_table  # noqa: E402


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
