"""A rank killed outright (kill -9, the out-of-memory killer, a crash in C)
under `mpiexec ... sprint train`: MPICH's launcher SIGKILLs every other rank
at once, so before engine.parallel.deathwatch the job ended on mpiexec's
'BAD TERMINATION' banner alone, naming a pid. Now one `sprint: error:` line names the
rank, the epoch kept and the resume command."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.parallel import deathwatch

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu", OMP_NUM_THREADS="1",
           OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT="120")


def _job(tmp_path, n=2):
    run = tmp_path / "run"
    p = subprocess.Popen(["mpiexec", "-n", str(n), sys.executable, "-m", "engine.cli", "train", "--parallel", "sync",
                          "--epochs", "200", "--out", str(run), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    pids = dict((int(r), int(pid)) for r, pid in re.findall(r"rank (\d+) pid (\d+)", p.stderr.readline()))
    return p, run, pids


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")
@pytest.mark.parametrize("n, victim", [(2, 1), (2, 0), (3, 2)])
def test_a_rank_killed_outright_is_named_with_the_epoch_kept(tmp_path, n, victim):
    p, run, pids = _job(tmp_path, n)
    try:
        assert len(pids) == n, pids
        for line in p.stdout:
            if line.startswith("epoch   2/"):
                break
        os.kill(pids[victim], signal.SIGKILL)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("sprint")]     # the rank -> pid map was read
    assert len(lines) == 1, err[-3000:]
    epoch = int(re.search(r"epoch (\d+) is saved", lines[0]).group(1))
    assert epoch >= 2
    note = f"; epoch {epoch} is saved: resume with: mpiexec -n {n} sprint train --resume {run}"
    # on a loaded host the launcher's kill of the others may come before the
    # watcher wakes: then it names the ranks gone by then, the victim among them
    m = re.fullmatch(r"sprint: error: (?:rank (\d+)|one of ranks ([\d, ]+)) of \d+ died .*", lines[0])
    dead = [int(m.group(1))] if m.group(1) else [int(r) for r in m.group(2).split(", ")]
    assert victim in dead and lines[0] + "\n" == deathwatch._line(dead, n, note), err[-3000:]
    from engine.checkpoint import load
    assert load(run)["epoch"] >= epoch


def _watcher(size, note=""):
    """The watcher on a thread, and ``size`` connected ranks (sockets of this process)."""
    import socket
    import threading
    addr = f"\0sprint-deathwatch-test-{os.getpid()}-{time.monotonic_ns()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(addr)
    listener.listen(size)
    r, w = os.pipe()
    th = threading.Thread(target=deathwatch.watch, args=({"size": size, "address": addr, "note": note}, listener, w),
                          kwargs={"accept_s": 10.0}, daemon=True)
    th.start()
    ranks = []
    for i in range(size):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr)
        s.sendall(f"rank {i}\n".encode())
        ranks.append(s)
    time.sleep(0.3)                      # every rank accepted

    def said():
        th.join(10)
        assert not th.is_alive()
        os.close(w)
        return os.read(r, 10000).decode()
    return ranks, said


def test_the_first_rank_gone_is_named_with_what_the_run_keeps():
    ranks, said = _watcher(3)
    ranks[0].sendall(b"saved ; epoch 1 is saved\nsaved ; epoch 2 is saved: resume with: X\n")
    time.sleep(0.2)
    ranks[2].close()                     # killed: its connection closes first
    time.sleep(0.3)
    for s in ranks[:2]:
        s.close()                        # the launcher's kill of the others
    assert said() == deathwatch._line([2], 3, "; epoch 2 is saved: resume with: X")


def test_a_rank_that_leaves_on_purpose_keeps_it_silent():
    ranks, said = _watcher(2)
    ranks[1].sendall(b"quiet\n")         # its own line said (or a clean end)
    ranks[1].close()
    time.sleep(0.2)
    ranks[0].close()
    assert said() == ""


def test_the_line():
    assert deathwatch._line([2], 3, "") == ("sprint: error: rank 2 of 3 died without a word (killed by a signal, e.g. "
                                            "kill -9 or the out-of-memory killer, or crashed); the job ended\n")
    assert deathwatch._line([0, 2], 3, "; x") == (
        "sprint: error: one of ranks 0, 2 of 3 died without a word (killed by a signal, e.g. kill -9 or the "
        "out-of-memory killer, or crashed) and mpiexec killed the others; the job ended; x\n")
