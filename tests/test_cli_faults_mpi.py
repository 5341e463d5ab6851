"""`sprint` under mpiexec as a user meets its failures: one `sprint: error:`
line for the whole job (not a traceback per rank), every rank ended when one
fails or diverges, the last good checkpoint kept, Ctrl-C that says how to
resume, and no MPICH shared-memory segment left behind (the one-process
failures: test_cli_faults.py)."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import checkpoint

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")


def _mpiexec(*ranks, timeout=90):
    """mpiexec with one argument list per rank group ([n, args...] each)."""
    env = dict(ENV, MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1")
    env.pop("SPRINT_DEBUG", None)
    cmd = ["mpiexec"]
    for n, *args in ranks:
        cmd += [":"] * (len(cmd) > 1) + ["-n", str(n), sys.executable, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    out = p.stdout + p.stderr
    return p, out, [ln for ln in out.splitlines() if ln.startswith("sprint: error: ")]


MPI_TRAIN = ["-m", "mpi4py", "-m", "engine.cli", "train", "--no-progress", "--epochs", "1"]
needs_mpiexec = pytest.mark.skipif(__import__("shutil").which("mpiexec") is None, reason="mpiexec not on PATH")


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.parametrize("n,args,fragment", [
    (2, ["--parallel", "sync", "--data", "TMP/missing"], "no such file or folder for --data (TMP/missing)"),
    (3, ["--parallel", "pipeline", "--stages", "2"], "needs mpiexec -n 2, not 3 ranks"),
    # refused by the CLI before any run is set up
    (2, ["--parallel", "sync", "--lr", "nan"], "lr must be finite and > 0, got nan (--lr)"),
    (2, ["--parallel", "sync", "--epochs", "x"], "invalid int value: 'x' (--epochs)"),
    (2, ["--parallel", "sync", "--bogus"], "unrecognized arguments: --bogus"),
    (2, ["--max-pending", "2"], "applies to --parallel asgd only (--max-pending)"),
])
def test_an_input_mistake_under_mpiexec_is_one_error_line_not_a_traceback_per_rank(tmp_path, n, args, fragment):
    """Every rank meets the same mistake: rank 0 reports it, the job ends
    with exit 2, no rank prints a traceback or says it again, and no rank
    calls MPI_Abort (MPICH added its own 'Abort(2) on node 0' line)."""
    # TMP: this test's own folder (a fixed path such as /nonexistent may exist on some machine)
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    fragment = fragment.replace("TMP", str(tmp_path))
    p, out, errors = _mpiexec([n, *MPI_TRAIN, "--out", tmp_path / "run", *args])
    assert p.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert len(errors) == 1 and fragment in errors[0], out[-3000:]
    assert p.stderr.splitlines() == errors, p.stderr
    assert "(rank " not in errors[0] and not (tmp_path / "run").exists()


LATE_LEAVER = """
import subprocess, sys, time
from mpi4py import MPI
from engine.parallel import abort
from engine.parallel.comm import get_comm
comm = get_comm()
real = MPI.Finalize
def late():
    real()
    if comm.rank == 1:
        time.sleep(1.5)       # a loaded host: this rank leaves MPI_Finalize well after the others
        print("rank 1 left MPI_Finalize", flush=True)
MPI.Finalize = late
if comm.rank != 1:
    # holds this rank's stdout and stderr (not its PMI socket) past its exit: the launcher
    # then sees that socket close before it reaps the rank, every time, not by chance
    subprocess.Popen(["sleep", "2"])
abort.abort_once(comm, "sprint: error: the same mistake on every rank", 2)
"""


@pytest.mark.mpi
@needs_mpiexec
def test_a_rank_leaving_finalize_last_is_not_killed_by_the_launcher(tmp_path):
    """MPICH's launcher SIGKILLs the job when a rank's PMI socket closes
    before the PMI finalize that MPICH defers to a C atexit hook: a rank
    leaving by os._exit got the ones still in MPI_Finalize killed (exit 9,
    the 'BAD TERMINATION' banner), the launcher race of an input mistake."""
    (tmp_path / "late.py").write_text(LATE_LEAVER)
    p, out, errors = _mpiexec([3, "-m", "mpi4py", tmp_path / "late.py"])
    assert p.returncode == 2 and "BAD TERMINATION" not in out and "Killed" not in out, out[-3000:]
    assert p.stdout == "rank 1 left MPI_Finalize\n", out[-3000:]      # not killed on its way out
    assert p.stderr.splitlines() == ["sprint: error: the same mistake on every rank"], out[-3000:]


@pytest.mark.mpi
@needs_mpiexec
def test_under_mpiexec_without_mpi4py_a_cli_mistake_is_said_once_and_ends_every_rank(tmp_path):
    """`mpiexec -n 2 sprint ...` (MPI not yet initialised when the CLI refuses)."""
    p, out, errors = _mpiexec([2, "-m", "engine.cli", "train", "--parallel", "sync", "--lr", "-1",
                               "--out", tmp_path / "run"], timeout=60)
    assert p.returncode == 2 and len(errors) == 1 and "got -1.0 (--lr)" in errors[0], out[-3000:]
    assert p.stderr.splitlines() == errors, p.stderr


@pytest.mark.mpi
@needs_mpiexec
def test_divergence_under_mpiexec_is_one_error_line_not_a_traceback_per_rank(tmp_path):
    p, out, errors = _mpiexec([2, *MPI_TRAIN, "--parallel", "sync", "--lr", "1e30", "--out", tmp_path / "run"])
    assert p.returncode == 1 and "Traceback" not in out and " failed: " not in out, out[-3000:]
    assert len(errors) == 1 and "training diverged: the loss became nan at epoch 1" in errors[0], out[-3000:]
    assert "Abort(" not in out, out[-3000:]       # every rank diverged alike: no MPI_Abort


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.parametrize("n,args", [(2, ["--schedule", "gpipe"]), (3, ["--schedule", "1f1b"]),
                                    (2, ["--schedule", "dualpipe"]),
                                    (4, ["--schedule", "dualpipe", "--replicas", "2"])])
def test_a_pipeline_divergence_ends_every_stage_with_one_line(tmp_path, n, args):
    """The loss lives on the last stage only: it raised there alone, the
    job ended in MPI_Abort (its banner under the line, which named neither
    the epoch nor the step, and numpy's overflow warnings from the stages'
    weight norms). Now the last stage hands the NaN back through the
    gradients and the replicas' allreduce, and every stage stops at the
    same update with the same line."""
    p, out, errors = _mpiexec([n, *MPI_TRAIN, "--parallel", "pipeline", *args, "--lr", "1e30",
                               "--out", tmp_path / "run"])
    assert p.returncode == 1 and "Traceback" not in out and "Warning" not in out, out[-3000:]
    assert "Abort(" not in out and " failed: " not in out, out[-3000:]
    assert len(errors) == 1 and re.fullmatch(r"sprint: error: training diverged: the loss became (nan|inf) at "
                                             r"epoch 1, step \d+; try a lower learning rate \(--lr, now .*\)",
                                             errors[0]), out[-3000:]
    assert [ln for ln in p.stderr.splitlines() if not ln.startswith("sprint: rank 0 pid ")] == errors, p.stderr


def _one_divergence_line(p, out, fragment=r"the loss became (nan|inf) at epoch 1"):
    """Every rank stopped alike: one line, exit 1, no MPI_Abort, no traceback."""
    assert p.returncode == 1 and "Traceback" not in out and "Warning" not in out, out[-3000:]
    assert "Abort(" not in out and " failed: " not in out, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("sprint: error: ")]
    assert len(errors) == 1 and re.fullmatch(rf"sprint: error: training diverged: {fragment}; try a lower "
                                             rf"learning rate \(--lr, now .*\)", errors[0]), out[-3000:]
    said = [ln for ln in p.stderr.splitlines() if not re.match(r"sprint: (rank 0 pid |downpour roles: )", ln)]
    assert said == errors, p.stderr


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.parametrize("n,args", [(2, []), (4, ["--servers", "2"])])
def test_a_downpour_divergence_ends_every_rank_with_one_line(tmp_path, n, args):
    """The loss lives on a Downpour replica only: it raised there alone and
    the job ended in MPI_Abort (MPICH's banner under a line naming the rank).
    Now the replica tells server 0, which stops the run and tells every
    replica (in its fetch replies) and shard (with its final snapshot
    request), and every rank raises the same Diverged."""
    p, out, errors = _mpiexec([n, *MPI_TRAIN, "--parallel", "downpour", *args, "--lr", "1e30",
                               "--out", tmp_path / "run"])
    _one_divergence_line(p, out)


# a `sprint` whose replica on the last rank gets an Inf loss once epoch 1's checkpoint is written
LATE_INF = """
import os, sys
from engine.net import Net
real = Net.loss_and_grad
run = sys.argv[sys.argv.index("--out") + 1]
def poisoned(self, x, y):
    loss, correct = real(self, x, y)
    if os.path.exists(os.path.join(run, "checkpoint.npz")):
        loss = float("inf")
    return loss, correct
if os.environ.get("PMI_RANK") == os.environ.get("SPRINT_TEST_POISONED_RANK"):
    Net.loss_and_grad = poisoned
from engine.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.parametrize("n,poisoned,args", [(5, 4, ["--parallel", "downpour", "--servers", "2"]),
                                             (3, 1, ["--parallel", "sync"]),
                                             (3, 1, ["--parallel", "asgd", "--workers", "2"])])
def test_a_rank_alone_diverging_ends_the_job_keeping_the_last_checkpoint(tmp_path, monkeypatch, n, poisoned, args):
    """One rank's loss becomes Inf in epoch 2, the others' does not: it raised
    there alone, and the job ended in MPI_Abort (its banner under a line
    naming that rank). Downpour: the replica tells server 0, which tells the
    other replicas and shards; ASGD and sync: the rank puts the Inf into the
    update's allreduce, which every rank then raises at. Every rank ends on
    the same line naming the checkpoint that stays."""
    (tmp_path / "late.py").write_text(LATE_INF)
    run = tmp_path / "run"
    monkeypatch.setitem(ENV, "SPRINT_TEST_POISONED_RANK", str(poisoned))
    p, out, errors = _mpiexec([n, "-m", "mpi4py", tmp_path / "late.py", "train", "--no-progress", "--epochs", "3",
                               *args, "--out", run])
    _one_divergence_line(p, out, rf"the loss became inf at epoch 2; the checkpoint of epoch 1 stays in {run}")
    assert checkpoint.load(run)["epoch"] == 1


# a `sprint` whose training loss is a million times the real one (the gradients are
# the real ones), in every epoch, or (SPRINT_TEST_INFLATE=first) until epoch 1's checkpoint
INFLATED = """
import os, sys
from engine.net import Net
real = Net.loss_and_grad
run = sys.argv[sys.argv.index("--out") + 1]
def inflated(self, x, y):
    loss, correct = real(self, x, y)
    if os.environ["SPRINT_TEST_INFLATE"] == "always" or not os.path.exists(os.path.join(run, "checkpoint.npz")):
        loss *= 1e6
    return loss, correct
Net.loss_and_grad = inflated
from engine.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.mpi
@needs_mpiexec
@pytest.mark.parametrize("n,args", [(2, ["--parallel", "sync"]), (3, ["--parallel", "downpour"]),
                                    (3, ["--parallel", "sandblaster"])])
def test_under_mpiexec_a_run_that_ends_diverged_without_a_nan_says_so_last_and_exits_1(tmp_path, monkeypatch,
                                                                                       n, args):
    """Its last line was 'done:' and its exit 0 (a warning per epoch the only
    sign). A parameter server's epochs are on rank 0 alone: it judges, and
    every rank ends on its line."""
    (tmp_path / "inflated.py").write_text(INFLATED)
    monkeypatch.setitem(ENV, "SPRINT_TEST_INFLATE", "always")
    run = tmp_path / "run"
    p, out, errors = _mpiexec([n, "-m", "mpi4py", tmp_path / "inflated.py", "train", "--no-progress", "--epochs", "1",
                               *args, "--out", run])
    assert p.returncode == 1 and "Traceback" not in out and "Abort(" not in out and "done:" not in out, out[-3000:]
    lr = "" if "sandblaster" in args else r"; try a lower learning rate \(--lr, now .*\)"
    assert len(errors) == 1 and re.fullmatch(rf"sprint: error: training diverged: the training loss was \S+ in the "
                                             rf"last epoch \(1\), over 10 times a blind guess's 2.30 \(its epochs: "
                                             rf"{run}/metrics.jsonl\){lr}", errors[0]), out[-3000:]
    assert p.stderr.splitlines()[-1] == errors[0], p.stderr
    assert checkpoint.load(run)["epoch"] == 1         # kept: the user may look at it


@pytest.mark.mpi
@needs_mpiexec
def test_under_mpiexec_a_run_that_came_back_is_not_stopped(tmp_path, monkeypatch):
    (tmp_path / "inflated.py").write_text(INFLATED)
    monkeypatch.setitem(ENV, "SPRINT_TEST_INFLATE", "first")
    run = tmp_path / "run"
    p, out, errors = _mpiexec([2, "-m", "mpi4py", tmp_path / "inflated.py", "train", "--no-progress", "--epochs", "2",
                               "--parallel", "sync", "--out", run])
    assert p.returncode == 0 and not errors and "done: 2 epochs" in p.stdout, out[-3000:]
    assert "epoch 1: the training loss" in p.stderr, p.stderr      # said when it happened


@pytest.mark.mpi
@needs_mpiexec
def test_a_one_process_command_under_mpiexec_is_refused_once(tmp_path):
    """`mpiexec -n 2 sprint info` printed the table twice (eval evaluated twice)."""
    p, out, errors = _mpiexec([2, "-m", "mpi4py", "-m", "engine.cli", "info", "tiny"])
    assert p.returncode == 2 and "N_Param" not in out, out[-3000:]
    assert errors == ["sprint: error: sprint info runs in one process; run it without mpiexec (2 ranks were started)"]
    assert p.stderr.splitlines() == errors, p.stderr


def _cli_whose_checkpoint_write(does: str) -> str:
    """A `sprint` script whose checkpoint.npz writes first run ``does``; a
    rank says 'MPI_Abort called' before it calls MPI_Abort (said_abort.py)."""
    return f"""
import errno, sys, time
sys.path.insert(0, {str(ROOT / "tests" / "mpi")!r})
import said_abort
from engine import checkpoint
real = checkpoint.atomic_write
def patched(path, write):
    if str(path).endswith("checkpoint.npz"):
        {does}
    return real(path, write)
checkpoint.atomic_write = patched
from engine.cli import main
sys.exit(main(sys.argv[1:]))
"""


FULL_DISK = _cli_whose_checkpoint_write('raise OSError(errno.ENOSPC, "No space left on device", str(path))')


@pytest.mark.mpi
@needs_mpiexec
def test_a_full_disk_under_mpiexec_is_one_error_line_naming_the_file(tmp_path):
    (tmp_path / "full.py").write_text(FULL_DISK)
    run = tmp_path / "run"
    p, out, errors = _mpiexec([2, "-m", "mpi4py", tmp_path / "full.py", "train", "--parallel", "sync", "--epochs", "1",
                               "--no-progress", "--out", run])
    assert p.returncode == 1 and "Traceback" not in out and " failed: " not in out, out[-3000:]
    assert errors == [f"sprint: error: no space left on the device ({run / 'checkpoint.npz'})"], out[-3000:]
    # rank 0 alone writes the file; rank 1 learns of its error rather than wait for it in a collective
    # until MPI_Abort ends the job (after abort_once's grace) with MPICH's own 'Abort(1) on node 0'
    # line, a line MPICH may lose: the rank that calls MPI_Abort says so first
    assert "MPI_Abort called" not in out and "Abort(" not in out, out[-3000:]


@pytest.mark.mpi
@needs_mpiexec
def test_a_mistake_on_one_rank_only_names_it_and_ends_the_job(tmp_path):
    run = tmp_path / "run"
    p, out, errors = _mpiexec([1, *MPI_TRAIN, "--parallel", "sync", "--out", run],
                              [1, *MPI_TRAIN, "--parallel", "sync", "--out", run, "--lr", "nan"])
    assert p.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert errors == ["sprint: error: lr must be finite and > 0, got nan (--lr) (rank 1 of 2)"], out[-3000:]


@pytest.mark.mpi
@needs_mpiexec
def test_under_mpiexec_help_is_printed_once_and_debug_keeps_every_ranks_traceback(tmp_path):
    p, out, _ = _mpiexec([2, *MPI_TRAIN, "--help"])
    assert p.returncode == 0 and p.stdout.count("usage: sprint train") == 1, out[-3000:]
    p, out, errors = _mpiexec([2, "-m", "mpi4py", "-m", "engine.cli", "--debug", "train", "--parallel", "sync",
                               "--lr", "nan", "--out", tmp_path / "run"])
    # each rank prints its own; the first abort may cut another's short
    assert p.returncode == 2 and "Traceback" in out and errors, out[-3000:]


# Ctrl-C comes while rank 0 writes, the other rank waiting for it
SLOW_CHECKPOINT = _cli_whose_checkpoint_write('print("writing the checkpoint", flush=True); time.sleep(20)')


@pytest.mark.mpi
@needs_mpiexec
def test_ctrl_c_under_mpiexec_while_rank_0_writes_says_how_to_resume(tmp_path):
    """Rank 1 waited for rank 0's checkpoint inside MPI's C wait, where it
    never saw its Ctrl-C: the job ended in MPI_Abort and MPICH's
    'Abort(130) on node 1' line instead of the ranks ending it together."""
    (tmp_path / "slow.py").write_text(SLOW_CHECKPOINT)
    run = tmp_path / "run"
    env = dict(ENV, MPIEXEC_TIMEOUT="60", OMP_NUM_THREADS="1")
    env.pop("SPRINT_DEBUG", None)
    p = subprocess.Popen(["mpiexec", "-n", "2", sys.executable, "-m", "mpi4py", str(tmp_path / "slow.py"), "train",
                          "--parallel", "sync", "--epochs", "2", "--no-progress", "--out", str(run)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while "writing the checkpoint" not in p.stdout.readline():
            assert p.poll() is None, p.stderr.read()
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Abort(" not in out + err and "Traceback" not in err, out + err
    assert "MPI_Abort called" not in err, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("sprint: rank 0 pid")]
    assert lines == [f"interrupted before the first epoch ended; nothing to resume in {run}"], err


SEGMENTS_THEN_ABORT = """
import re, time
from engine.parallel.comm import get_comm
comm = get_comm()
comm.world.Barrier()   # not comm.barrier(): its first collective unlinks the segment already
print("segments", *sorted(set(re.findall(r"/dev/shm/mpich_shm_\\S+", open("/proc/self/maps").read()))), flush=True)
comm.world.Barrier()
if comm.rank == 1:
    comm.abort("sprint: error: rank 1 gives up", 3)
time.sleep(30)                # until the launcher ends this rank
"""


@pytest.mark.mpi
@needs_mpiexec
def test_an_aborted_job_leaves_no_mpich_segment_in_dev_shm(tmp_path):
    """MPICH unlinks its /dev/shm bootstrap segment only in MPI_Finalize:
    every job ended by MPI_Abort (a dead, frozen or failing rank) left 2-3 MiB
    there for good."""
    (tmp_path / "abort.py").write_text(SEGMENTS_THEN_ABORT)
    p, out, errors = _mpiexec([2, "-m", "mpi4py", tmp_path / "abort.py"])
    assert p.returncode != 0 and "rank 1 gives up" in out, out[-3000:]
    seen = {s for ln in p.stdout.splitlines() if ln.startswith("segments") for s in ln.split()[1:]}
    assert seen, out[-3000:]            # MPICH maps one here: else the test shows nothing
    assert not [s for s in seen if os.path.exists(s)], (seen, out[-3000:])


def test_unlink_mpich_segments_takes_only_mpich_files_this_process_maps(tmp_path):
    from engine.parallel.launcher import unlink_mpich_segments
    mine = f"/dev/shm/mpich_shm_sprinttest_{os.getpid()}_0"
    other = tmp_path / "mpich_shm_elsewhere_0"
    for path in (mine, other):
        open(path, "w").close()
    maps = tmp_path / "maps"
    maps.write_text(f"7f0-7f1 rw-s 00000000 00:1a 42  {mine}\n"
                    f"7f1-7f2 rw-s 00000000 00:1a 43  {other}\n"
                    "7f2-7f3 r-xp 00000000 00:1a 44  /usr/lib/libc.so.6\n7f3-7f4 rw-p 00000000 00:00 0\n")
    try:
        assert unlink_mpich_segments(str(maps)) == [mine]
        assert not os.path.exists(mine) and other.exists()
        assert unlink_mpich_segments(str(tmp_path / "no-maps")) == []
    finally:
        if os.path.exists(mine):
            os.unlink(mine)


SEGMENTS_THEN_KILLED = """
import os, re, signal, time
from engine.parallel.comm import get_comm
comm = get_comm()
comm.barrier()
print("segments", *sorted(set(re.findall(r"/dev/shm/mpich_shm_\\S+", open("/proc/self/maps").read()))), flush=True)
comm.barrier()
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)     # no rank gets to MPI_Abort: the launcher kills the rest
time.sleep(30)
"""


@pytest.mark.mpi
@needs_mpiexec
def test_a_job_killed_from_outside_leaves_no_mpich_segment_in_dev_shm(tmp_path):
    (tmp_path / "killed.py").write_text(SEGMENTS_THEN_KILLED)
    p, out, errors = _mpiexec([2, "-m", "mpi4py", tmp_path / "killed.py"])
    assert p.returncode != 0, out[-3000:]
    seen = {s for ln in p.stdout.splitlines() if ln.startswith("segments") for s in ln.split()[1:]}
    assert seen, out[-3000:]
    assert not [s for s in seen if os.path.exists(s)], (seen, out[-3000:])
