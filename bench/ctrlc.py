"""Ctrl-C at random moments of `sprint train` (default 50 runs): every run
must end with exit 130 and the resume line (or 'interrupted before the first
epoch ended') within --limit seconds; a hang is a failure.

    python bench/ctrlc.py [--runs 50] [--seed 0] [--limit 30]
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


def one(run_dir, delay, limit):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")
    p = subprocess.Popen([sys.executable, "-m", "engine.cli", "train", "--out", str(run_dir), "--epochs", "4",
                          "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # see tests/test_cli_faults.py
    p.stdout.readline()
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    t = time.monotonic()
    try:
        _, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return "hang", None
    took = time.monotonic() - t
    last = (err.strip().splitlines() or [""])[-1]
    ok = p.returncode == 130 and "Traceback" not in err and (
        re.fullmatch(rf"interrupted after epoch \d+; resume with: sprint train --resume {re.escape(str(run_dir))}",
                     last) or last.startswith("interrupted before the first epoch ended")
        or (p.returncode == 0 and last == ""))
    return ("ok" if ok else f"bad rc {p.returncode}: {last!r}"), took


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=float, default=30.0, help="seconds a run may take to stop after SIGINT")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    outcomes, worst = {}, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            delay = rng.uniform(0.0, 8.0)      # 4 digits epochs take about 8 s here
            res, took = one(Path(tmp) / f"run{i}", delay, args.limit)
            outcomes[res] = outcomes.get(res, 0) + 1
            worst = max(worst, took or 0.0)
            print(f"run {i + 1:3d}: SIGINT after {delay:4.2f} s -> {res}"
                  + (f" in {took:.2f} s" if took is not None else ""), flush=True)
    print(f"{args.runs} runs: {outcomes}; slowest stop {worst:.2f} s")
    return 0 if set(outcomes) == {"ok"} else 1


if __name__ == "__main__":
    sys.exit(main())
