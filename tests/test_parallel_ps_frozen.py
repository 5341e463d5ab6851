"""A frozen rank of a parameter-server job (Downpour, Sandblaster) ends the
job within the watchdog's --timeout with one line naming its rank and role.

Two ways to freeze: SIGSTOP (the whole process stops, its heartbeats too:
the lowest rank still answering names it) and a main thread that sleeps
forever while the process's threads run (its heartbeats go on: the rank's
own progress check names it). tests/mpi/ps_train.py injects either at the
N-th step of the chosen rank (SPRINT_TEST_FAULT)."""
import json
import os
import re
import shutil
import signal
import time

import pytest

from test_parallel_mpi import run_mpi
from test_watchdog_mpi import _alive

pytestmark = [pytest.mark.mpi, pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]
TIMEOUT = 4


# (strategy, rank, how, role): each strategy loses a server once and a
# replica once, one frozen by SIGSTOP and one by a stuck main loop
CASES = [("downpour", 0, "stop", "server 0"), ("downpour", 2, "hang", "replica 1"),
         ("sandblaster", 2, "stop", "replica 1"), ("sandblaster", 0, "hang", "server 0")]


@pytest.mark.parametrize("strategy,rank,how,role", CASES)
def test_frozen_server_or_replica_ends_the_job_naming_rank_and_role(tmp_path, strategy, rank, how, role):
    cfg = {"epochs": 500, "batch": 64, "progress": False, "verbose": False, "timeout": TIMEOUT,
           "out": str(tmp_path / "run"), "extra": {"servers": 1, "slice": 16} if strategy == "sandblaster"
           else {"servers": 1}}
    rc, out, dt = run_mpi(3, "ps_train.py", strategy, json.dumps(cfg), timeout=60,
                          env={"SPRINT_TEST_FAULT": f"{rank}:30:{how}"})
    pid = re.search(rf"FAULT {how} PID (\d+)", out)
    try:
        assert pid, out[-3000:]
        # launch and 30 steps, then the timeout and the abort: far below the launcher's 60 s
        assert rc != 0 and dt < 45, (dt, out[-3000:])
        errors = [line for line in out.splitlines() if line.startswith("sprint: error:")]
        what = "stopped answering" if how == "stop" else "made no progress"
        assert len(errors) == 1 and f"rank {rank} of 3 ({role}) {what}" in errors[0], out[-3000:]
        quiet = int(re.search(r"for (\d+) s", errors[0]).group(1))
        assert TIMEOUT <= quiet <= TIMEOUT + 3 and f"--timeout {TIMEOUT}" in errors[0], errors
        time.sleep(0.5)
        assert not _alive(int(pid.group(1))), "the frozen rank was left behind"
    finally:
        if pid and _alive(int(pid.group(1))):
            os.kill(int(pid.group(1)), signal.SIGKILL)
