"""Ctrl-C in a terminal running `mpiexec -n N sprint train --parallel ...`:
SIGINT to the whole process group while one rank is busy and the others wait
for it in MPI. Every strategy must end with exit 130 and the one resume hint
line, without MPI_Abort (MPICH's 'Abort(130)' line, or nothing at all when
the launcher kills the job before that line is out) and without a traceback;
`--resume` then continues the run.

The layer-wise executor waited for its collectives inside MPI's C calls
(Alltoallv, Allreduce): a rank sitting there for a peer that the Ctrl-C had
stopped never saw its own, and after abort_once's grace the job ended in
MPI_Abort (seen on b15b1a2 with the layerwise case below)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import checkpoint

ROOT = Path(__file__).resolve().parents[1]
STALL = ROOT / "tests" / "mpi" / "ctrlc_stall.py"
pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]

# strategy -> (ranks, train options, the rank that stalls, in which function, at which call):
# the stall comes in epoch 2 or later, so that there is an epoch to resume
CASES = {
    "asgd": (2, ["--parallel", "asgd"], 0, "engine.parallel.asgd:ASGD._wait_for_grads", 60),
    "downpour": (3, ["--parallel", "downpour"], 0, "engine.parallel.downpour:DownpourServer._apply", 100),
    "sandblaster": (3, ["--parallel", "sandblaster"], 1,
                    "engine.parallel.sandblaster_replica:SandReplica.fetch", 10),
    "gpipe": (2, ["--parallel", "pipeline", "--pipe-schedule", "gpipe"], 0,
              "engine.parallel.pipeline:StageExecutor._update", 60),
    # 1F1B and DualPipe update after every micro-batch (4 per batch, 180 an epoch)
    "1f1b": (2, ["--parallel", "pipeline", "--pipe-schedule", "1f1b"], 1,
             "engine.parallel.pipeline:StageExecutor._update", 300),
    "dualpipe": (2, ["--parallel", "pipeline", "--pipe-schedule", "dualpipe"], 1,
                 "engine.parallel.pipeline:StageExecutor._update", 300),
    "layerwise": (2, ["--parallel", "layerwise", "--batch", "64", "--plan", "{plan}"], 0,
                  "engine.parallel.layerwise:LayerwiseExecutor._forward", 100),
}


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu", OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="120")
    env.pop("SPRINT_DEBUG", None)
    return env


def _layerwise_plan(tmp_path) -> str:
    plan = tmp_path / "plan.json"
    p = subprocess.run([sys.executable, "-m", "engine.cli", "plan", "--model", "digits", "--gpus", "2",
                        "--no-calibrate", "--write", "model", "--out", str(plan)],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    return str(plan)


def _ctrl_c_while_stalled(n, rank, target, k, argv):
    """Run ctrlc_stall.py; once its rank stalled and the others reached their
    wait for it, Ctrl-C as a terminal sends it: to every process of the
    foreground group, mpiexec and the ranks. (Popen, stdout, stderr)."""
    p = subprocess.Popen(["mpiexec", "-n", str(n), sys.executable, "-m", "mpi4py", str(STALL), str(rank), target,
                          str(k), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         cwd=ROOT, start_new_session=True)
    try:
        while "stalled" not in p.stdout.readline():
            assert p.poll() is None, p.stderr.read()
        time.sleep(1.0)                      # the other ranks reach their wait for the stalled one
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    return p, out, err


@pytest.mark.parametrize("strategy", list(CASES))
def test_ctrl_c_under_mpiexec_while_a_peer_waits_in_mpi_says_how_to_resume(tmp_path, strategy):
    n, opts, rank, target, k = CASES[strategy]
    if "{plan}" in opts:
        opts = [o.replace("{plan}", _layerwise_plan(tmp_path)) for o in opts]
    run = tmp_path / "run"
    p, out, err = _ctrl_c_while_stalled(n, rank, target, k, ["train", *opts, "--epochs", "30", "--no-progress",
                                                             "--out", str(run)])
    assert p.returncode == 130, out[-2000:] + err
    # ctrlc_stall.py says 'MPI_Abort called' on the rank that calls it, before the launcher can cut any line
    assert "MPI_Abort called" not in err and "Abort(" not in out + err and "Traceback" not in err, out[-2000:] + err
    lines = [ln for ln in err.splitlines() if not re.match(r"sprint: (rank 0 pid|\w+ roles:)", ln)]
    assert len(lines) == 1, err
    m = re.fullmatch(rf"interrupted after epoch (\d+); resume with: mpiexec -n {n} sprint train --resume "
                     rf"{re.escape(str(run))}", lines[0])
    assert m, err
    epoch = int(m.group(1))
    assert checkpoint.load(run)["epoch"] == epoch
    p = subprocess.run(["mpiexec", "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "engine.cli", "train",
                        "--resume", str(run), "--epochs", str(epoch + 1), "--no-progress"],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    assert checkpoint.load(run)["epoch"] == epoch + 1


DROPPED = ROOT / "tests" / "mpi" / "ctrlc_dropped.py"


@pytest.mark.parametrize("parallel,rank", [("sync", 1), ("sync", 0), ("pipeline", 1)])
def test_a_ctrl_c_that_python_dropped_on_one_rank_still_ends_the_job_as_one(tmp_path, parallel, rank):
    """Python drops a KeyboardInterrupt raised in a callback (seen in an
    import lock's weakref while the modules loaded, 1 of 24 early Ctrl-Cs):
    that rank trained on, or its peers waited in abort_once for it and the
    job ended in MPI_Abort. The CLI's handler keeps a flag that the next MPI
    wait of that rank raises again."""
    run = tmp_path / "run"
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "mpi4py", str(DROPPED), str(rank),
                        "engine.session.session:Session.report", "2", "train", "--parallel", parallel,
                        "--epochs", "30", "--no-progress", "--out", str(run)],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    out, err = p.stdout, p.stderr
    assert "dropped" in out, out[-2000:] + err
    assert p.returncode == 130, out[-2000:] + err
    assert "MPI_Abort called" not in err and "Abort(" not in out + err and "Traceback" not in err, out[-2000:] + err
    lines = [ln for ln in err.splitlines() if not re.match(r"sprint: rank 0 pid", ln)]
    assert len(lines) == 1 and re.fullmatch(r"interrupted after epoch \d+; resume with: mpiexec -n 2 sprint train "
                                            rf"--resume {re.escape(str(run))}", lines[0]), err
    assert checkpoint.load(run)["epoch"] < 30


def test_ctrl_c_while_a_peer_waits_for_the_watchdog_to_be_set_up(tmp_path):
    """Every rank builds its heartbeat communicator and gathers the ranks'
    hosts and pids at the same point: rank 1 waited in MPI's C Dup and
    allgather for rank 0 (here stalled in the gethostname between them) and
    never saw the Ctrl-C; the job ended in MPI_Abort."""
    p, out, err = _ctrl_c_while_stalled(2, 0, "socket:gethostname", 1, ["train", "--parallel", "sync",
                                                                         "--no-progress", "--out", str(tmp_path / "run")])
    assert p.returncode == 130, out[-2000:] + err
    assert "MPI_Abort called" not in err and "Abort(" not in out + err and "Traceback" not in err, out[-2000:] + err
    assert err.splitlines() == ["interrupted"], err


INIT = ROOT / "tests" / "mpi" / "ctrlc_init.py"


def test_a_ctrl_c_before_mpi_init_on_one_rank_and_inside_it_on_another_ends_the_job_as_one(tmp_path):
    """Ctrl-C in the first half second of `mpiexec -n N sprint train`: a
    rank that met it while its modules loaded left at once, before MPI_Init,
    and its peers spun in MPI_Init for good, waiting for it (mpiexec hung;
    5 of 24 runs of bench/ctrlc.py --mpiexec 2 --early); and a SIGINT inside
    MPI_Init could crash the rank there. Now a rank holds its Ctrl-C until
    MPI is up, MPI_Init is not cut, and the ranks end together."""
    run = tmp_path / "run"
    env = dict(_env(), MPIEXEC_TIMEOUT="40")
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, str(INIT), str(tmp_path), "train", "--parallel", "sync",
                        "--epochs", "2", "--no-progress", "--out", str(run)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    out, err = p.stdout, p.stderr
    assert p.returncode == 130, out[-2000:] + err
    assert "Abort(" not in out + err and "Traceback" not in err and "BAD TERMINATION" not in out, out[-2000:] + err
    assert err.splitlines() == ["interrupted"] and "epoch" not in out, out[-2000:] + err
