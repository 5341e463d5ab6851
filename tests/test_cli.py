"""The real ``sprint`` entry point in subprocesses, as a user runs it."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine import checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _cmd():
    exe = shutil.which("sprint")
    return [exe] if exe else [sys.executable, "-m", "engine.cli"]


def sprint(*args, check=True, timeout=300):
    env = dict(os.environ, SPRINT_DEVICE="cpu")
    p = subprocess.run(_cmd() + [str(a) for a in args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"sprint {' '.join(map(str, args))} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`sprint train` with the defaults (digits preset, embedded digits)."""
    out = tmp_path_factory.mktemp("cli") / "default"
    t = time.perf_counter()
    p = sprint("train", "--out", out, "--progress")
    return out, p, time.perf_counter() - t


def test_default_train_reaches_97_percent(default_run):
    out, p, seconds = default_run
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["test_acc"] >= 0.97, recs[-1]
    assert "test_acc" in p.stdout and "done:" in p.stdout
    assert "img_s" in p.stderr and "loss" in p.stderr     # the progress bar
    print(f"default sprint train: {100 * recs[-1]['test_acc']:.2f} % in {seconds:.1f} s")


def test_eval_and_plot(default_run):
    out, _, _ = default_run
    acc = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["test_acc"]
    p = sprint("eval", out / "checkpoint.npz", "--data", "digits")
    assert f"accuracy {100 * acc:.2f} %" in p.stdout
    p = sprint("plot", out, "--out", out / "png")
    for name in ("loss.png", "accuracy.png"):
        f = out / "png" / name
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 5000
        assert str(f) in p.stdout


def test_sigkill_and_resume_ends_bit_identical(default_run, tmp_path):
    ref, _, _ = default_run
    out = tmp_path / "killed"
    proc = subprocess.Popen(_cmd() + ["train", "--out", str(out), "--no-progress", "--quiet"], cwd=ROOT,
                            env=dict(os.environ, SPRINT_DEVICE="cpu"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done = checkpoint.load(out)["epoch"]
    total = json.loads((ref / "config.json").read_text())["train"]["epochs"]
    assert 2 <= done < total   # killed after its second checkpoint, before the end
    sprint("train", "--resume", out, "--no-progress")
    a, b = checkpoint.load(ref), checkpoint.load(out)
    assert b["epoch"] == total and a["step"] == b["step"]
    assert a["params"].tobytes() == b["params"].tobytes()
    assert a["optim"]["velocity"].tobytes() == b["optim"]["velocity"].tobytes()
    assert len(metrics.read_text().splitlines()) == total


def test_train_a_spec_file_on_an_image_tree_reports_the_corrupt_file(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(0)
    for part in ("train", "val"):
        for k, cls in enumerate(("a", "b")):
            d = tmp_path / "tree" / part / cls
            d.mkdir(parents=True)
            for i in range(4):
                img = rng.integers(0, 60, (10, 10, 3)) + 150 * k
                Image.fromarray(img.astype(np.uint8)).save(d / f"{i}.jpg")
    (tmp_path / "tree" / "train" / "a" / "bad.jpg").write_bytes(b"\xff\xd8 truncated")
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"x0": 8, "m0": 3, "c": 3, "convs": [[4, 2]], "fcs": [2]}))
    p = sprint("info", spec)
    assert "net: input 3x8x8" in p.stdout
    out = tmp_path / "run"
    p = sprint("train", "--model", spec, "--data", tmp_path / "tree", "--epochs", "2", "--out", out,
               "--no-progress", "--flip", "--lr", "0.02", "--resize")   # 10x10 images, an 8x8 net
    lines = [l for l in p.stdout.splitlines() if l.startswith("epoch")]
    assert len(lines) == 2 and all("(1 unreadable file skipped)" in l for l in lines)
    assert [json.loads(l)["skipped"] for l in (out / "metrics.jsonl").read_text().splitlines()] == [1, 1]


def test_info_prints_the_table():
    p = sprint("info", "cifar", "--batch", "32")
    assert "conv2/p2" in p.stdout and "fc2" in p.stdout
    assert "N_Param = 3,248,202 (SPEC formula: 3,248,202)" in p.stdout


def test_errors_are_messages_not_tracebacks(tmp_path):
    for args, msg in [(("train", "--model", "nonet"), "neither a preset"),
                      (("train", "--data", tmp_path / "missing"), f"no such file or folder for --data ({tmp_path / 'missing'})"),
                      (("eval", tmp_path / "nothing.npz"), "no such checkpoint file"),
                      (("plot", tmp_path / "none"), f"no metrics.jsonl: not a run folder ({tmp_path / 'none'})"),
                      (("info", "cifar", "--batch", "0"), "--batch")]:
        p = sprint(*args, check=False)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"train": {"epochs": 1}}))
    p = sprint("train", "--resume", tmp_path / "run", "--lr", "0.3", check=False)
    assert p.returncode == 2 and "--lr" in p.stderr


def _in_fresh_python(code):
    """Run ``code`` in a new interpreter (what a module import loads is only
    seen from a clean ``sys.modules``); fails the test if it raises."""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_import_engine_is_light():
    """`import engine` loads no NumPy and no extension; attributes load on use."""
    code = ("import sys, engine; assert 'numpy' not in sys.modules and 'engine._sprint_cpu' not in sys.modules; "
            "assert engine.spec.get_spec('tiny').n_classes == 3; "
            "assert callable(engine.train) and engine.Net.__name__ == 'Net' and engine.SGD.__name__ == 'SGD'; "
            "import engine.train as t; assert engine.train is t and callable(engine.train); "
            "assert engine.data.load_dataset is not None")
    _in_fresh_python(code)


def test_building_the_cli_loads_no_scipy_optimizers_and_perf_names_load_on_use():
    """Building every subcommand's options (``sprint train`` does it too)
    imports no SciPy optimizer: the model's fits import it where they fit
    (0.3 s of every start on the Xeon VM, 0.7 s on the AMD one); engine.perf's
    names and submodules load on use."""
    code = ("import sys; from engine.cli import build_parser; build_parser(); "
            "assert 'scipy.optimize' not in sys.modules, sorted(m for m in sys.modules if m.startswith('scipy')); "
            "import engine.perf as perf; assert perf.Profile.__name__ == 'Profile' and callable(perf.predict); "
            "assert perf.tune.__name__ == 'engine.perf.tune'; "
            "import pytest; pytest.raises(AttributeError, getattr, perf, 'no_such_name')")
    _in_fresh_python(code)


def test_every_perf_module_imports_first():
    """Each engine.perf module imports on its own, first of the package (a
    tool or a test may start anywhere): no module-level import cycle. The
    engine's Python modules are dropped from sys.modules before each import
    (the compiled extensions and third-party packages kept), so one
    interpreter checks them all."""
    code = ("import importlib, pkgutil, sys, engine.perf as p\n"
            "names = sorted(m.name for m in pkgutil.iter_modules(p.__path__))\n"
            "assert 'fit_steps' in names and 'fit_report' in names, names\n"
            "for n in names:\n"
            "    for k in [k for k in sys.modules if k.split('.')[0] == 'engine' and '_sprint' not in k]:\n"
            "        del sys.modules[k]\n"
            "    importlib.import_module('engine.perf.' + n)\n")
    _in_fresh_python(code)
