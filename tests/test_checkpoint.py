"""Checkpoints: nested state round trip, atomic replacement."""
import json
import os

import numpy as np
import pytest

from engine import checkpoint


def _state(seed):
    rng = np.random.default_rng(seed)
    return {"params": rng.standard_normal(100).astype(np.float32), "epoch": seed, "step": 10 * seed,
            "optim": {"velocity": rng.standard_normal(100).astype(np.float32), "lr": 0.1,
                      "schedule": {"kind": "cosine", "lr": 0.1, "epochs": 3.0, "final_lr": 0.0}},
            "rng": {"seed": 7, "next_epoch": seed}, "note": None, "ids": np.arange(5, dtype=np.int64)}


def _equal(a, b):
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], dict):
            _equal(a[k], b[k])
        elif isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
        else:
            assert a[k] == b[k]


def test_round_trip_nested_state(tmp_path):
    s = _state(3)
    checkpoint.save(tmp_path / "ck.npz", s)
    _equal(checkpoint.load(tmp_path / "ck.npz"), s)
    checkpoint.save(tmp_path / "checkpoint.npz", s)
    _equal(checkpoint.load(tmp_path), s)       # a run directory


def test_crash_while_writing_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ck.npz"
    checkpoint.save(path, _state(1))
    real = np.savez

    def dies_half_way(f, **arrays):
        real(f, **{k: v for i, (k, v) in enumerate(arrays.items()) if i < 1})
        raise KeyboardInterrupt("killed while writing")
    monkeypatch.setattr(np, "savez", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(path, _state(2))
    monkeypatch.undo()
    _equal(checkpoint.load(path), _state(1))
    assert os.listdir(tmp_path) == ["ck.npz"]   # no temporary left behind


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "nope.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(2))
    with pytest.raises(ValueError, match="not a sprint checkpoint"):
        checkpoint.load(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="keys"):
        checkpoint.save(tmp_path / "x.npz", {"a.b": 1})
    # a text file given for a checkpoint: np.load took it for a pickle and the
    # error spoke of "pickled (object) data" and allow_pickle
    (tmp_path / "notes.txt").write_text("garbage\n")
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load(tmp_path / "notes.txt")
    assert str(e.value) == f"not a sprint checkpoint (not an .npz file) ({tmp_path / 'notes.txt'})"


def test_written_files_get_the_permissions_open_would_give(tmp_path):
    """mkstemp's temporary is 0600: every run file (checkpoint, config,
    metrics, plots) came out unreadable to the user's group."""
    from engine.checkpoint import atomic_write
    old = os.umask(0o027)
    try:
        new = atomic_write(tmp_path / "new.json", "{}")
        assert new.stat().st_mode & 0o777 == 0o640
        os.chmod(new, 0o600)                     # a mode the user chose stays
        atomic_write(new, "{}")
        assert new.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


BENCH_WRITE = """
import importlib.util, json, resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # an over-limit write fails with EFBIG instead
out = Path(sys.argv[1])
spec = importlib.util.spec_from_file_location("bench_conftest", sys.argv[2])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
bench.RESULTS = out
bench.save_json("r.json", {"rows": [1, 2, 3]})
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))   # the disk fills up during the next write
try:
    bench.save_json("r.json", {"rows": list(range(100000))})
except OSError as e:
    print(e.filename)
"""


def test_a_benchmark_killed_mid_write_leaves_its_previous_results(tmp_path):
    """bench/ wrote its JSON with write_text (a full disk or a kill left a
    truncated file) or a fixed-name temporary it left behind; now through
    checkpoint.write_json, temp + fsync + rename like the run folder."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "code.py").write_text(BENCH_WRITE)
    p = subprocess.run([sys.executable, str(tmp_path / "code.py"), str(tmp_path / "out"),
                        str(root / "bench/conftest.py")],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(root)))
    assert p.returncode == 0 and p.stdout.strip() == str(tmp_path / "out" / "r.json"), p.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["r.json"]
    assert json.loads((tmp_path / "out" / "r.json").read_text()) == {"rows": [1, 2, 3]}
