"""The pipeline executor under mpiexec: gpipe equals one process (K = 2, 3, 4
stages, and 2 stages x 2 replicas); 1f1b and dualpipe follow the version
trace their schedules imply under each --predict."""
import shutil

import pytest

from test_parallel_mpi import run_mpi

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]


@pytest.mark.parametrize("n,replicas", [(2, 1), (3, 1), (4, 1), (4, 2)])
def test_gpipe_gradients_and_weights_equal_one_process(n, replicas):
    rc, out, _ = run_mpi(n, "pipeline_equiv.py", "--replicas", replicas)
    assert rc == 0 and "PIPE GPIPE OK" in out, out[-3000:]


@pytest.mark.parametrize("schedule,predict,n", [("1f1b", "none", 3), ("1f1b", "stash", 4),
                                                ("1f1b", "spectrain", 3), ("dualpipe", "none", 3),
                                                ("dualpipe", "stash", 2), ("dualpipe", "spectrain", 4)])
def test_version_trace_matches_the_schedule(schedule, predict, n):
    rc, out, _ = run_mpi(n, "pipeline_equiv.py", "--schedule", schedule, "--predict", predict)
    assert rc == 0 and "PIPE TRACE OK" in out, out[-3000:]
