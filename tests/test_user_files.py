"""Files the CLI writes where the user says (`plan --out`, `plot --out`,
`report --png`): written atomically (temp + rename), a missing folder made,
and a failure one `sprint: error:` line naming the user's path, never the
temporary file beside it."""
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")
ENV.pop("SPRINT_DEBUG", None)


def sprint(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=cwd)


def one_error_line(p, *fragments):
    lines = p.stderr.strip().splitlines()
    assert p.returncode not in (0, None) and len(lines) == 1 and lines[0].startswith("sprint: error: "), p.stderr
    assert ".tmp" not in lines[0], lines[0]
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


PLAN = ("plan", "--model", "tiny", "--gpus", "2", "--no-calibrate")


def test_plan_out_into_a_missing_folder_makes_it_and_a_bad_out_names_itself(tmp_path):
    from engine.perf.layerwise import Plan
    out = tmp_path / "new" / "deeper" / "plan.json"
    p = sprint(*PLAN, "--out", out)
    assert p.returncode == 0, p.stderr
    assert Plan.load(out).devices == 2
    assert [f.name for f in out.parent.iterdir()] == ["plan.json"]        # no temporary left
    (tmp_path / "afile").write_text("x")
    one_error_line(sprint(*PLAN, "--out", tmp_path / "afile" / "plan.json"),
                   f"not a folder ({tmp_path / 'afile' / 'plan.json'})")
    # a folder is refused before the search, as a usage error (it was exit 1, after the search)
    p = sprint(*PLAN, "--out", tmp_path / "new")
    one_error_line(p, f"is a folder, not a file; --out takes the plan's file name (e.g. plan.json) "
                      f"({tmp_path / 'new'})")
    assert p.returncode == 2 and p.stdout == ""
    assert sorted(f.name for f in tmp_path.iterdir()) == ["afile", "new"]


def _fail_midway(monkeypatch):
    """savefig that writes half a file, then meets a full disk."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    def half(self, fname, *a, **kw):
        if hasattr(fname, "write"):
            fname.write(b"\x89PNG half")
        else:
            Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", half)


def test_a_failed_plot_leaves_the_previous_png_whole_and_names_it(tmp_path, monkeypatch):
    from engine import metrics
    from engine.plot import plot_run
    run = tmp_path / "run"
    metrics.write(run / "metrics.jsonl", [{"epoch": 1, "train_loss": 1.0, "test_loss": 1.1, "train_acc": 0.5,
                                           "test_acc": 0.4}])
    first = plot_run(run)
    before = {p.name: p.read_bytes() for p in first}
    assert all(b.startswith(b"\x89PNG") and len(b) > 1000 for b in before.values())
    _fail_midway(monkeypatch)
    with pytest.raises(OSError) as e:
        plot_run(run)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(run / "loss.png")
    assert {p.name: p.read_bytes() for p in first} == before
    assert sorted(f.name for f in run.iterdir()) == ["accuracy.png", "loss.png", "metrics.jsonl"]


def test_a_failed_report_png_leaves_no_half_file(tmp_path, monkeypatch):
    from engine.parallel.report import plot_distributions
    st = {"mode": "sync", "model": "tiny", "n_node": 1, "n_gpu": 1, "steps": []}
    png = tmp_path / "r.png"
    _fail_midway(monkeypatch)
    with pytest.raises(OSError) as e:
        plot_distributions(st, png)
    assert e.value.filename == str(png)
    assert list(tmp_path.iterdir()) == []


def test_plot_out_that_is_a_file_is_one_line_naming_it(tmp_path):
    from engine import metrics
    run = tmp_path / "run"
    metrics.write(run / "metrics.jsonl", [{"epoch": 1, "train_loss": 1.0, "test_loss": 1.1, "train_acc": 0.5,
                                           "test_acc": 0.4}])
    (tmp_path / "afile").write_text("x")
    # said as the output it is (a bare "no such file or folder (/proc/x)" read as a missing input)
    assert one_error_line(sprint("plot", run, "--out", tmp_path / "afile")) == \
        f"sprint: error: cannot create the folder for the plots (--out): not a folder ({tmp_path / 'afile'})"
    one_error_line(sprint("plot", run, "--out", tmp_path / "curves.png"), "the folder for loss.png and accuracy.png",
                   f"({tmp_path / 'curves.png'})")
    assert not (tmp_path / "curves.png").exists()


def test_a_run_directory_that_cannot_be_made_says_it_is_the_out(tmp_path):
    """`train --out` under a file (or in /proc) was refused as "no such file
    or folder" / "not a folder" of the path alone, read as a missing input."""
    (tmp_path / "afile").write_text("x")
    run = tmp_path / "afile" / "run"
    line = one_error_line(sprint("train", "--epochs", "1", "--out", run))
    assert line == f"sprint: error: cannot create the run directory (--out): not a folder ({run})"
