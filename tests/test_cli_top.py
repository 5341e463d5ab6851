"""The top-level ``sprint`` dispatcher, run as a user runs it."""
import importlib.util
import subprocess
import sys

import pytest


def sprint(*args):
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_help_lists_every_subcommand():
    r = sprint("--help")
    assert r.returncode == 0
    for cmd in ("train", "eval", "plot", "info", "report", "profile", "predict", "tune", "simulate",
                "selfcheck"):
        assert f"    {cmd}" in r.stdout, cmd


def test_no_command_prints_help_and_fails():
    r = sprint()
    assert r.returncode == 2 and "usage: sprint" in r.stdout


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_gpu_without_cupy_is_a_clear_error():
    r = sprint("--device", "gpu", "info", "tiny")
    assert r.returncode == 2
    assert "GPU backend requested but unavailable" in r.stderr and "Traceback" not in r.stderr


def test_info_prints_n_param():
    r = sprint("info", "cifar")
    assert r.returncode == 0 and "3,248,202" in r.stdout


def test_asgd_defaults_differ_from_sync(monkeypatch):
    """`--parallel asgd` without lr/momentum gets the stale-gradient-safe
    defaults of the strategy table; anything the user gives wins; the Python
    API resolves the same table."""
    from engine import train_cli
    from engine.errors import RunError
    from engine.session import TrainConfig, get_strategy
    seen = {}

    def fake_train(cfg):
        seen["cfg"] = cfg
        return {"rank": 1}

    monkeypatch.setattr("engine.train.train", fake_train)
    p = __import__("engine.cli", fromlist=["build_parser"]).build_parser()
    args = p.parse_args(["train", "--parallel", "asgd", "--lr", "0.01", "--out", "x"])
    assert train_cli.cmd_train(args) == 0
    cfg = seen["cfg"]
    asgd = get_strategy("asgd")
    assert cfg.lr == 0.01 and cfg.momentum == asgd.defaults["momentum"] == 0.0
    assert cfg.epochs == 12 and cfg.extra["max_pending"] == 2
    api = TrainConfig(parallel="asgd")
    assert (api.lr, api.momentum, api.epochs, api.extra["max_pending"]) == (0.02, 0.0, 12, 2)
    assert (TrainConfig().lr, TrainConfig().momentum, TrainConfig(parallel="sync").epochs) == (0.05, 0.9, 10)
    args = p.parse_args(["train", "--max-pending", "3", "--out", "x"])
    with pytest.raises(RunError, match="max-pending"):
        train_cli.cmd_train(args)


def test_the_parallel_and_perf_layers_declare_their_options_without_the_cli():
    """Their count types come from engine.argtypes: importing a strategy (and
    adding its options to a parser) must not import the command line."""
    code = ("import argparse, sys\n"
            "import engine.parallel.ps, engine.parallel.pipeline_run as pr, engine.perf.strategies as st\n"
            "p = argparse.ArgumentParser(); p.add_argument('--schedule'); pr.add_train_options(p)\n"
            "st.add_options(argparse.ArgumentParser(), 'simulate')\n"
            "assert 'engine.cli' not in sys.modules, sorted(m for m in sys.modules if m.startswith('engine'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args", [("info", "cifar"), ("train", "--epochs", "1")])
def test_output_into_a_closed_pipe_says_what_was_closed(args, tmp_path):
    """`sprint report RUN | head` said 'sprint: error: Broken pipe' and
    where not (it can be a file too)."""
    p = subprocess.Popen([sys.executable, "-m", "engine.cli", *args, *(("--out", tmp_path / "run")
                          if args[0] == "train" else ())], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()                     # the reader went away before the first line
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1
    assert err == "sprint: error: the program reading sprint's output stopped reading it (broken pipe) (stdout)\n"
