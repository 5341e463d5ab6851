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


HOSTS = ROOT / "tests" / "mpi" / "hosts.py"


def _job(tmp_path, n=2, hosts=None):
    run = tmp_path / "run"
    how = ["-m", "engine.cli"] if hosts is None else [str(HOSTS), ",".join(hosts)]
    p = subprocess.Popen(["mpiexec", "-n", str(n), sys.executable, *how, "train", "--parallel", "sync",
                          "--epochs", "200", "--out", str(run), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    first = p.stderr.readline()
    pids = dict((int(r), int(pid)) for r, pid in re.findall(r"rank (\d+) pid (\d+)", first))
    if hosts is not None:               # the emulation took: the job says its ranks' hosts
        assert all(f"rank {r} pid {pids.get(r)}@{h}" in first for r, h in enumerate(hosts)), first
    return p, run, pids


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")
@pytest.mark.parametrize("n, victim, hosts", [
    (2, 1, None), (2, 0, None), (3, 2, None),
    # a job across hosts (emulated: the ranks' host names differ), which had no watcher
    (3, 2, ("localhost", "localhost", "127.0.0.1")), (3, 0, ("localhost", "127.0.0.1", "127.0.0.1")),
])
def test_a_rank_killed_outright_is_named_with_the_epoch_kept(tmp_path, n, victim, hosts):
    p, run, pids = _job(tmp_path, n, hosts)
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


def _watcher(size, note="", token=None, connected=None):
    """The watcher on a thread, and ``size`` (or ``connected``) connected ranks (sockets of this process)."""
    import socket
    import threading
    addr = f"\0sprint-deathwatch-test-{os.getpid()}-{time.monotonic_ns()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(addr)
    listener.listen(size)
    r, w = os.pipe()
    job = {"size": size, "address": addr, "note": note, **({"token": token} if token else {})}
    th = threading.Thread(target=deathwatch.watch, args=(job, listener, w),
                          kwargs={"accept_s": 10.0}, daemon=True)
    th.start()
    ranks = []
    for i in range(size if connected is None else connected):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr)
        s.sendall(f"rank {i}{' ' + token if token else ''}\n".encode())
        ranks.append(s)
    time.sleep(0.3)                      # every rank accepted

    def said():
        th.join(10)
        assert not th.is_alive()
        os.close(w)
        return os.read(r, 10000).decode()
    said.address = addr
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


def test_across_hosts_a_connection_without_the_token_is_no_rank():
    """A job across hosts listens on TCP, where anyone may connect: only a
    connection that said 'rank R TOKEN' is a rank's, and only a rank's
    'quiet' silences the watcher."""
    import socket
    ranks, said = _watcher(2, token="t0k", connected=1)
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(said.address)
    stranger.sendall(b"rank 0 guess\nquiet\nsaved ; forged\n")
    time.sleep(0.2)
    stranger.close()                     # closes first: not a rank, says nothing
    time.sleep(0.2)
    ranks[0].close()
    assert said() == deathwatch._line([0], 2, "")


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
