"""Ctrl-C at random moments of `sprint train` (default 50 runs): every run
must end with exit 130 and the resume line (or 'interrupted before the first
epoch ended', or just 'interrupted' before a run began) within --limit
seconds; a hang is a failure.

    python bench/ctrlc.py [--runs 50] [--seed 0] [--limit 30]
    python bench/ctrlc.py --mpiexec 3 --parallel downpour [--early 0.1,0.6]

With --mpiexec N the job runs as a terminal's would: in a process group of
its own, which the SIGINT goes to whole (mpiexec, its proxy and every rank,
as Ctrl-C in a terminal does). --early A,B sends it A-B seconds after
mpiexec starts (the ranks still importing, in MPI_Init or setting up),
instead of 0-8 s after the first line.
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(run_dir, delay, limit, ranks=0, parallel=None, early=False):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")
    cmd = [sys.executable, "-m", "engine.cli", "train", "--out", str(run_dir), "--epochs", "4", "--no-progress"]
    if ranks:
        cmd = ["mpiexec", "-n", str(ranks), *cmd, "--parallel", parallel]
        env.update(OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(int(limit) + 60))
    # SIGINT's default in the child: see tests/test_cli_faults.py
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         preexec_fn=lambda: (os.setpgrp(), signal.signal(signal.SIGINT, signal.SIG_DFL)))
    if not early:
        p.stdout.readline()
    time.sleep(delay)
    os.killpg(p.pid, signal.SIGINT)          # the whole group, as a terminal's Ctrl-C
    t = time.monotonic()
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return "hang", None
    took = time.monotonic() - t
    said = [ln for ln in err.strip().splitlines() if not re.match(r"sprint: (rank 0 pid |\w+ roles: )", ln)]
    last = (said or [""])[-1]
    launcher = rf"mpiexec -n {ranks} " if ranks else ""
    ok = p.returncode == 130 and "Traceback" not in err and len(said) == 1 and (
        re.fullmatch(rf"interrupted after epoch \d+; resume with: {launcher}sprint train --resume "
                     rf"{re.escape(str(run_dir))}", last)
        or last.startswith("interrupted before the first epoch ended") or last == "interrupted")
    ok = ok or (p.returncode == 0 and not said and "done:" in out)     # it had ended before the signal
    return ("ok" if ok else f"bad rc {p.returncode}: {said[-3:]!r}"), took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=float, default=30.0, help="seconds a run may take to stop after SIGINT")
    ap.add_argument("--mpiexec", type=int, default=0, metavar="N", help="run under mpiexec -n N")
    ap.add_argument("--parallel", default="sync", help="the strategy under --mpiexec (default sync)")
    ap.add_argument("--early", metavar="A,B", help="SIGINT A-B s after the start, not 0-8 s after the first line")
    args = ap.parse_args()
    lo, hi = map(float, args.early.split(",")) if args.early else (0.0, 8.0)
    rng = random.Random(args.seed)
    outcomes, worst = {}, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            delay = rng.uniform(lo, hi)      # 4 digits epochs took about 8 s (session 10)
            res, took = one(Path(tmp) / f"run{i}", delay, args.limit, args.mpiexec, args.parallel,
                            bool(args.early))
            outcomes[res] = outcomes.get(res, 0) + 1
            worst = max(worst, took or 0.0)
            print(f"run {i + 1:3d}: SIGINT after {delay:4.2f} s -> {res}"
                  + (f" in {took:.2f} s" if took is not None else ""), flush=True)
    print(f"{args.runs} runs: {outcomes}; slowest stop {worst:.2f} s")
    return 0 if set(outcomes) == {"ok"} else 1


if __name__ == "__main__":
    sys.exit(main())
