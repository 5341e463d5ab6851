"""Every training strategy on a real GPU, each against the same job on the CPU
(for bench/gpu_check.sh; the tests run the same jobs on the emulated GPU):

    python bench/gpu_strategies.py [--out DIR] [--epochs 1] [--timeout 90]

One process, sync (1 and 2 workers), ASGD, GPipe, 1F1B with weight stashing,
DualPipe + SpecTrain (2 stages x 2 replicas), Downpour and Sandblaster, all
with `sprint train --device gpu` under `mpiexec`, all ranks on the GPUs there
are (round robin: on one GPU every rank shares it). The CPU twins run at the
same time, one thread per rank. For the strategies whose result does not
depend on timing the final weights must agree with the CPU run's; GPipe must
also agree with the one-GPU-process run. Prints one JSON line per job, a
table last, and exits 1 if a job failed or disagreed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COMMON = ["--model", "digits", "--batch", "32", "--schedule", "constant", "--lr", "0.05", "--seed", "3"]
# cuBLAS and the engine's SGEMM sum in different orders; over one epoch of
# 45 steps their weights stay within this of each other (the emulated-GPU
# tests see 1e-5 to 1e-4)
WEIGHT_TOL = 1e-3
EMULATED = False
# (name, ranks, extra arguments, compare with: "cpu", "one" or None for timing-dependent runs)
JOBS = [
    ("one", 0, [], "cpu"),
    ("sync-w1", 2, ["--parallel", "sync", "--workers", "1"], "cpu"),
    ("sync-w2", 2, ["--parallel", "sync", "--workers", "2"], "cpu"),
    ("asgd-w2", 2, ["--parallel", "asgd", "--workers", "2"], None),
    ("gpipe", 2, ["--parallel", "pipeline", "--pipe-schedule", "gpipe", "--microbatches", "2"], "one"),
    ("1f1b-stash", 2, ["--parallel", "pipeline", "--pipe-schedule", "1f1b", "--predict", "stash",
                       "--microbatches", "4"], "cpu"),
    ("dualpipe-spectrain", 4, ["--parallel", "pipeline", "--stages", "2", "--replicas", "2",
                               "--pipe-schedule", "dualpipe", "--predict", "spectrain", "--microbatches", "2"], None),
    ("downpour-seq", 2, ["--parallel", "downpour", "--servers", "1", "--server-opt", "sgd",
                         "--fetch-every", "1", "--push-every", "1"], "cpu"),
    ("downpour", 4, ["--parallel", "downpour", "--servers", "2"], None),
    ("sandblaster", 3, ["--parallel", "sandblaster", "--servers", "1", "--batch", "128", "--slice", "32"], None),
]


def command(device, ranks, args, run):
    # --emulated: the GPU jobs on tests/gpu_emu.py's stand-in for CuPy (a dry run of this script on a machine
    # without a GPU; slow, so give it a small --timeout budget per job only with care)
    cli = [str(ROOT / "tests" / "gpu_boot.py")] if device == "gpu" and EMULATED else ["-m", "engine.cli"]
    cmd = [sys.executable, *(["-m", "mpi4py"] if ranks else []), *cli, "train", "--device", device,
           "--no-progress", "--out", str(run), *COMMON, *args]
    return ["mpiexec", "-n", str(ranks), *cmd] if ranks else cmd


def start(device, ranks, args, run, timeout, log):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT=str(timeout))
    if device == "cpu":
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.Popen(command(device, ranks, args, run), stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT)


def result(run):
    """(final weights, last metrics row) of a run folder, or (None, None)."""
    from engine.checkpoint import load
    try:
        w = np.asarray(load(run / "checkpoint.npz")["params"], np.float64)
        return w, json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"gpu_strategies: no result in {run}: {type(e).__name__}: {e}", file=sys.stderr)
        return None, None


def run_all(tasks, max_ranks, timeout, out):
    """Run (device, name, ranks, args) tasks, as many at once as fit in
    max_ranks processes; returns {(device, name): (rc, wall s)}."""
    pending, running, done = list(tasks), [], {}
    while pending or running:
        used = sum(max(1, r) for _, _, r, _, _, _ in running)
        while pending and (not running or used + max(1, pending[0][2]) <= max_ranks):
            dev, name, ranks, args = pending.pop(0)
            log = open(out / f"{name}-{dev}.log", "w")
            running.append((dev, name, ranks, start(dev, ranks, args, out / f"{name}-{dev}", timeout, log), log,
                            time.monotonic()))
            used += max(1, ranks)
        time.sleep(0.2)
        for t in list(running):
            dev, name, ranks, p, log, t0 = t
            rc = p.poll()
            if rc is None and time.monotonic() - t0 > timeout + 30:
                p.kill()
                rc = "timeout"
            if rc is not None:
                log.close()
                running.remove(t)
                done[(dev, name)] = (rc, time.monotonic() - t0)
    return done


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/gpu_strategies")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=90, help="seconds per job")
    from engine.parallel.threads import usable_cores
    ap.add_argument("--max-ranks", type=int, default=usable_cores(),
                    help="processes at once over all jobs (1 job at a time: 0)")
    ap.add_argument("--emulated", action="store_true", help="GPU jobs on the emulated GPU (a dry run)")
    ap.add_argument("--data", help="a data file for every job (default: the built-in digits)")
    a = ap.parse_args()
    global EMULATED
    EMULATED = a.emulated
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--epochs", str(a.epochs)] + (["--data", str(Path(a.data).resolve())] if a.data else [])
    # the GPU jobs, and the CPU twins of those compared with the CPU, share the machine: walls and img/s
    # are those of a crowded machine (--max-ranks 0 runs one job at a time)
    tasks = [("gpu", n, r, args + extra) for n, r, args, _ in JOBS]
    tasks += [("cpu", n, r, args + extra) for n, r, args, cmp in JOBS if cmp == "cpu"]
    done = run_all(tasks, a.max_ranks, a.timeout, out)
    rows, ok = [], True
    for name, ranks, args, cmp in JOBS:
        rc, wall = done[("gpu", name)]
        w, m = result(out / f"{name}-gpu")
        row = {"job": name, "ranks": ranks or 1, "rc": rc, "wall_s": round(wall, 1),
               "test_acc": m and m["test_acc"], "images_per_s": m and m["images_per_s"],
               "finite": bool(w is not None and np.isfinite(w).all())}
        good = rc == 0 and row["finite"]
        if cmp is not None and good:
            ref = out / (f"{name}-cpu" if cmp == "cpu" else "one-gpu")
            w_ref, m_ref = result(ref)
            if w_ref is None:
                row["vs"], good = f"{cmp}: reference run failed ({ref.name}.log)", False
            else:
                d = float(np.abs(w - w_ref).max())
                row.update(vs=cmp, max_weight_diff=d, ref_test_acc=m_ref["test_acc"])
                good = d <= WEIGHT_TOL
        row["ok"] = good
        ok &= good
        rows.append(row)
        print(json.dumps(row), flush=True)
    from engine.checkpoint import write_json
    write_json(out / "gpu_strategies.json", rows, indent=1)
    print(f"{'job':<20}{'ranks':>6}{'ok':>5}{'wall s':>8}{'acc %':>8}{'img/s':>9}  vs reference")
    for r in rows:
        acc = f"{100 * r['test_acc']:.2f}" if r["test_acc"] is not None else "-"
        ips = f"{r['images_per_s']:.0f}" if r["images_per_s"] is not None else "-"
        vs = (f"{r['vs']}: max|dw| {r['max_weight_diff']:.1e}, acc {100 * r['ref_test_acc']:.2f}"
              if "max_weight_diff" in r else r.get("vs", ""))
        print(f"{r['job']:<20}{r['ranks']:>6}{'yes' if r['ok'] else 'NO':>5}{r['wall_s']:>8}{acc:>8}{ips:>9}  {vs}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
