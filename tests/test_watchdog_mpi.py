"""`sprint train` under mpiexec: a frozen rank ends the job within --timeout
+ 10 s with a line naming it; without --parallel it refuses to run one copy
per rank; a strategy registered by one row of the strategy table (pipeline)
trains from the command line with its own options."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu", OMP_NUM_THREADS="1",
           OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT="120")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_stopped_rank_ends_the_job_within_the_timeout_naming_it(tmp_path):
    timeout = 4
    p = subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "engine.cli", "train", "--parallel", "sync",
                          "--epochs", "200", "--timeout", str(timeout), "--out", str(tmp_path / "run"),
                          "--no-progress", "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    pid = None
    seen = []
    try:
        for line in p.stderr:         # rank 0 prints the rank -> pid map before training
            seen.append(line)
            m = re.search(r"rank 1 pid (\d+)", line)
            if m:
                pid = int(m.group(1))
                break
        assert pid, "".join(seen)
        time.sleep(0.5)
        os.kill(pid, signal.SIGSTOP)
        t = time.monotonic()
        _, err = p.communicate(timeout=timeout + 30)
        took = time.monotonic() - t
    finally:
        if p.poll() is None:
            p.kill()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert p.returncode != 0 and took < timeout + 10, (took, err[-2000:])
    assert re.search(rf"sprint: error: rank 1 of 2 stopped answering \(no heartbeat for \d+ s; --timeout {timeout}\)",
                     err), err[-2000:]
    time.sleep(1.0)
    assert not _alive(pid), "the stopped rank was left behind"


def test_train_without_a_strategy_under_a_launcher_refuses(tmp_path):
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "engine.cli", "train", "--out",
                        str(tmp_path / "run")], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if l.startswith("sprint: error:")]
    assert len(lines) == 1 and all("2 MPI ranks were started but no parallel strategy was chosen" in l and
                         "--parallel asgd | sync" in l for l in lines), p.stderr
    assert not (tmp_path / "run").exists()


def test_a_strategy_row_brings_its_own_cli_options(tmp_path):
    run = tmp_path / "run"
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "engine.cli", "train", "--parallel", "pipeline",
                        "--stages", "2", "--epochs", "1", "--out", str(run), "--no-progress"],
                       capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=180)
    assert p.returncode == 0 and "done: 1 epoch," in p.stdout, p.stderr[-2000:]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
    p = subprocess.run([sys.executable, "-m", "engine.cli", "train", "--stages", "2"], capture_output=True,
                       text=True, env=ENV, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == "sprint: error: applies to --parallel pipeline only (--stages)"


def test_a_rank_stopped_after_an_epoch_is_one_line_saying_how_to_resume(tmp_path):
    """A frozen rank's job ended with the watchdog's line and MPICH's 'Abort(1)
    on node 0 ... MPI_Abort(MPI_COMM_WORLD, 1)' after it; neither said that
    the epochs trained are kept, nor how to go on."""
    timeout, run = 4, tmp_path / "run"
    p = subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "engine.cli", "train", "--parallel", "sync",
                          "--epochs", "200", "--timeout", str(timeout), "--out", str(run), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    pid = None
    try:
        pid = int(re.search(r"rank 1 pid (\d+)", p.stderr.readline()).group(1))
        for line in p.stdout:
            if line.startswith("epoch   2/"):
                break
        os.kill(pid, signal.SIGSTOP)
        _, err = p.communicate(timeout=timeout + 30)
    finally:
        if p.poll() is None:
            p.kill()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert p.returncode != 0
    assert err.count("\n") == 1, err[-2000:]           # the line, and no MPICH line after it
    epoch = int(re.search(r"epoch (\d+) is saved", err).group(1))
    assert epoch >= 2 and err.startswith(f"sprint: error: rank 1 of 2 stopped answering"), err
    assert err.endswith(f"; --timeout {timeout}); ending the job; epoch {epoch} is saved: resume with: "
                        f"mpiexec -n 2 sprint train --resume {run}\n"), err
    from engine.checkpoint import load
    assert load(run)["epoch"] >= epoch
