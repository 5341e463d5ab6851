"""A job of one rank under README's launcher line (`mpiexec -n 1 python -m
mpi4py -m engine.cli ...`) that fails says its one error line and exits with
its status: mpi4py's runner turned the non-zero exit into MPI_Abort, which
added MPICH's 'Abort(2) on node 0 ...' line and left the job's
/dev/shm/mpich_shm_* file behind."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu", OMP_NUM_THREADS="1",
           OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT="60")


@pytest.mark.parametrize("argv, code, line", [
    (["train", "--parallel", "downpour", "--epochs", "1"], 2,
     "sprint: error: --parallel downpour needs mpiexec -n S+R with S = 1 server"),
    # relative to the test's own folder (cwd): a fixed absolute path may exist on some machine
    (["train", "--parallel", "sync", "--epochs", "1", "--data", "missing-data"], 2,
     "sprint: error: no such file or folder for --data (missing-data)"),
])
def test_one_rank_that_fails_says_one_line(tmp_path, argv, code, line):
    r = subprocess.run(["mpiexec", "-n", "1", sys.executable, "-m", "mpi4py", "-m", "engine.cli", *argv,
                        "--no-progress"], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=90)
    assert r.returncode == code, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(line), r.stderr
