"""Does the calibration read the speed a training step sees? (issue 15)

    /work/coord/cpu-exclusive python bench/calibration_transfer.py --live 6 --back 4 --out F.jsonl   # ~3.5 min
    python bench/calibration_transfer.py --report F.jsonl[,G.jsonl] [--profile P]    # no timing
    python bench/calibration_transfer.py --passes R.jsonl      # R: calibration_drift.py --history --rows R.jsonl

``--live`` takes ``--back`` calibrations back to back, then rounds of: a
calibration, warm one-thread steps of tiny and cifar at the batches the
profile's records timed (``STEPS``), and 2.5-s runner runs of seen nets
(``RUNS``), one JSON line each. ``--report`` says how far a calibration's
parts scatter from call to call (back to back and interleaved with the runs)
against their blocks' ``u``, and per run the truth (measured T_GPU over the
profile's own prediction) and each rescaling rule's error (``RULES``).
``--passes`` asks the saved validations whether a pass's calibration tracks
that pass's measured times within a configuration (a slope near 1: signal;
near 0: its pass-to-pass scatter is noise).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SPECS = Path(__file__).resolve().parent / "specs"
# Runner runs (net, N_Subbatch, ranks): the fitted grid's nets and set 13's (seen).
RUNS = (("tiny", 8, 1), ("cifar", 4, 1), (str(SPECS / "heldout_m3.json"), 12, 1),
        (str(SPECS / "heldout_fc2.json"), 12, 1), (str(SPECS / "heldout_m3.json"), 12, 2))
# Warm one-thread net steps at the batches the profile's records keep (kind net_step).
STEPS = (("tiny", 1), ("tiny", 4), ("tiny", 16), ("cifar", 1), ("cifar", 4))
# (per-unit scale, per-call scale) from the kernel and Python parts' ratios K and P;
# None: calibrate.compare as it is.
RULES = {"none": lambda k, p: (1.0, 1.0), "by part (now)": None, "one = kernel": lambda k, p: (k, k),
         "per-call sqrt(K P)": lambda k, p: (k, (k * p) ** 0.5)}


def spread(values) -> float:
    """Relative standard deviation (of the logs) of repeated measurements."""
    v = np.log(np.asarray(values, float))
    return float(np.std(v, ddof=1)) if len(v) > 1 else 0.0


def pooled(recs, value) -> float:
    """``spread`` of ``value(rec)`` within each file of ``recs`` (one call of
    --live: one state of the host), pooled over the files."""
    groups = {}
    for r in recs:
        groups.setdefault(r.get("file", 0), []).append(np.log(value(r)))
    dev = [x - np.mean(g) for g in groups.values() if len(g) > 1 for x in g]
    dof = sum(len(g) - 1 for g in groups.values() if len(g) > 1)
    return float(np.sqrt(np.sum(np.square(dev)) / dof)) if dof else 0.0


def ratios(cal, then) -> dict:
    """A calibration's parts over a profile's stored ones."""
    return {k: cal[k + "_s"] / then[k + "_s"] for k in ("kernel", "python", "wall") if cal.get(k + "_s")
            and then.get(k + "_s")}


def rule_errors(rounds, uc, then) -> dict:
    """{run: {rule: [error of each round]}}: a run's T_GPU predicted as
    k U + kc C (U, C: the profile's per-unit and per-call parts, ``uc``)
    with (k, kc) from that round's calibration by each of ``RULES``, against
    the round's measured T_GPU."""
    from engine.perf.calibrate import compare
    out = {}
    for run, (u, c) in uc.items():
        for rnd in rounds:
            if run not in rnd["runs"]:
                continue
            r = ratios(rnd["cal"], then)
            for name, fn in RULES.items():
                if fn is None:
                    chk = compare({"calibration": then}, None, rnd["cal"])
                    k, kc = chk.scale, chk.call_scale if chk.call_scale is not None else chk.scale
                else:
                    k, kc = fn(r["kernel"], r["python"])
                out.setdefault(run, {}).setdefault(name, []).append((k * u + kc * c) / rnd["runs"][run] - 1)
    return out


def split(run, prof):
    """(U, C): the profile's T_GPU of a run key ``net|N_Subbatch|ranks`` in
    its per-unit and per-call parts (T_GPU is linear in the two scales)."""
    from engine.perf.profile import Profile
    from validate_runs import predicted
    net, sub, ranks = run.split("|")
    t = {}
    for kc in (1.0, 2.0):
        p = Profile(prof.data, prof.source)
        p.call_scale = kc
        t[kc] = predicted(net, int(ranks), 1, int(sub), p, 20_000, sim=False)["T_GPU"]
    return 2 * t[1.0] - t[2.0], t[2.0] - t[1.0]


def report(files, profile, records=None):
    from engine.perf.profile import Profile
    prof = Profile.load(profile)
    then = prof.data["fingerprint"]["calibration"]
    recs = [dict(json.loads(line), file=i) for i, f in enumerate(files) for line in Path(f).read_text().splitlines()]
    rounds = [r for r in recs if r["kind"] == "round"]
    print(f"profile {prof.source}, calibration of {then.get('date')}")
    for kind, rs in (("back to back", [r for r in recs if r["kind"] == "back"]), ("interleaved", rounds)):
        if len(rs) < 2:
            continue
        cells = []
        for part in ("kernel", "python", "wall"):
            x = [ratios(r["cal"], then)[part] for r in rs]
            u = np.median([r["cal"].get("u" if part == "wall" else "u_" + part, 0) for r in rs])
            cells.append(f"{part} x{np.median(x):.3f} sd {100 * pooled(rs, lambda r: ratios(r['cal'], then)[part]):.1f}"
                         f" % (blocks' u {100 * u:.1f} %)")
        if all(r["cal"].get("compute_s") for r in rs):
            cells.append(f"compute sd {100 * pooled(rs, lambda r: r['cal']['compute_s']):.1f} %")
        print(f"{kind} ({len(rs)} calls; sd within each file, pooled): " + "; ".join(cells))
    if not rounds:
        return
    uc = {run: split(run, prof) for run in dict.fromkeys(k for r in rounds for k in r["runs"])}
    errs = rule_errors(rounds, uc, then)
    print("runs: truth = measured / the profile's T_GPU; each rule's error, median over the rounds [min, max]")
    means = {name: [] for name in RULES}
    for run, (u, c) in uc.items():
        truth = [r["runs"][run] / (u + c) for r in rounds if run in r["runs"]]
        cells = []
        for name, e in errs[run].items():
            means[name].append(abs(np.median(e)))
            cells.append(f"{name} {100 * np.median(e):+.1f} [{100 * min(e):+.0f}, {100 * max(e):+.0f}]")
        print(f"  {os.path.basename(run):24s} per-call share {c / (u + c):.2f}, truth x{np.median(truth):.3f} "
              f"[{min(truth):.3f}, {max(truth):.3f}] | " + " | ".join(cells))
    print("mean |median error| %: " + ", ".join(f"{n} {100 * np.mean(v):.1f}" for n, v in means.items()))
    steps = {k: [r["steps"][k] for r in rounds if k in r.get("steps", {})]
             for k in dict.fromkeys(k for r in rounds for k in r.get("steps", {}))}
    ref = _record_steps(records) if records else {}
    print("warm steps: " + "; ".join(f"{k} {1e3 * np.median(v):.3f} ms" + (
        f" x{np.median(v) / ref[k]:.3f} the records'" if k in ref else "") for k, v in steps.items()))


def _record_steps(path) -> dict:
    try:
        recs = json.loads(Path(path).read_text())["records"]
    except (OSError, KeyError, ValueError):
        return {}
    return {f"{r['model']}|{r['n_subbatch']}": r["t"] for r in recs if r["kind"] == "net_step"}


def passes(rows) -> dict:
    """Per saved set (rows of calibration_drift.py --history): within each
    configuration, each pass's log deviation of the prediction at its own
    calibration's raw part ratios against its measured T_GPU's; the slope and
    correlation over the set, and the spread left with and without it."""
    out = {}
    for x in rows:
        if not x["parts"] or "kernel" not in x["parts"][0] or len(x["runs"]) != len(x["parts"]):
            continue
        m = [r.get("T_GPU") for r in x["runs"]]
        if len(m) < 2 or not all(m):
            continue
        p = np.log([p["kernel"] * x["U"]["T_GPU"] + p["python"] * x["C"]["T_GPU"] for p in x["parts"]])
        m = np.log(m)
        a = out.setdefault(x["run"], ([], []))
        a[0].extend(p - p.mean())
        a[1].extend(m - m.mean())
    res = {}
    for run, (p, m) in list(out.items()) + [("all", tuple(sum((list(v[i]) for v in out.values()), [])
                                                           for i in (0, 1)))]:
        p, m = np.array(p), np.array(m)
        res[run] = {"n": len(p), "slope": float(p @ m / (p @ p)), "corr": float(np.corrcoef(p, m)[0, 1]) if np.std(m) * np.std(p) > 0 else 0.0,
                    "sd_applied": float(np.std(m - p)), "sd": float(np.std(m)), "sd_calibration": float(np.std(p))}
    return res


def net_step(name, n, rng):
    """One one-thread training step of net ``name`` at batch ``n`` on random
    data, as a call (its time does not depend on the values)."""
    from engine.net import Net
    from engine.spec import get_spec
    sp = get_spec(name)
    net = Net(sp, seed=0)
    x = rng.standard_normal((n,) + sp.input_shape).astype(np.float32)
    y = rng.integers(0, sp.n_classes, n)
    return lambda: net.loss_and_grad(x, y)


def timed(fn, sec=0.5):
    """Seconds per call of ``fn``, warm (one call first), over at least
    ``sec`` and 3 calls."""
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < sec or n < 3:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def live(rounds, back, out):
    from engine.perf.calibrate import calibration_step
    from engine.perf.sweep_runner import runner_job, synthetic_npz
    from engine.perf.timing import set_threads
    set_threads(1)
    rng = np.random.default_rng(0)
    steps = {f"{net}|{n}": net_step(net, n, rng) for net, n in STEPS}
    stamp = lambda kind, i: {"kind": kind, "i": i, "utc": time.strftime("%H:%M:%S", time.gmtime()),
                             "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="calibration-transfer-") as tmp, open(out, "a") as f:
        def put(rec):
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(json.dumps(rec)[:160], flush=True)
        for i in range(back):
            put(dict(stamp("back", i), cal=calibration_step()))
        data = {}
        for net, _, _ in RUNS:
            if net not in data:
                data[net] = Path(tmp) / f"{Path(net).stem}.npz"
                synthetic_npz(net, data[net], 200_000 if net == "tiny" else 20_000)
        for i in range(rounds):
            rec = dict(stamp("round", i), cal=calibration_step(), runs={})
            rec["steps"] = {k: timed(fn) for k, fn in steps.items()}
            for net, sub, ranks in RUNS:
                st = runner_job(net, data[net], sub, ranks, 1, 2.5, Path(tmp) / f"{Path(net).stem}-{ranks}-{i}", 120)
                rec["runs"][f"{net}|{sub}|{ranks}"] = st["T_GPU"]
            put(rec)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--live", type=int, default=0, metavar="ROUNDS")
    ap.add_argument("--back", type=int, default=4, help="--live: calibrations back to back first")
    ap.add_argument("--out", default="calibration_transfer.jsonl")
    ap.add_argument("--report", metavar="F[,G]")
    ap.add_argument("--profile", default=str(Path(__file__).resolve().parents[1] / "engine/perf/default_profile.json"))
    ap.add_argument("--records", default=str(Path(__file__).resolve().parent / "profiles/cpu_test14_records.json"),
                    help="--report: the records whose one-thread net steps the warm steps are compared with")
    ap.add_argument("--passes", metavar="ROWS")
    a = ap.parse_args(argv)
    if a.live:
        live(a.live, a.back, a.out)
    if a.report:
        report(a.report.split(","), a.profile, a.records)
    if a.passes:
        rows = [json.loads(line) for line in Path(a.passes).read_text().splitlines()]
        for run, r in passes(rows).items():
            print(f"{run:9s} {r['n']:4d} pass deviations: slope {r['slope']:+.2f}, corr {r['corr']:+.2f}; "
                  f"calibration's sd {100 * r['sd_calibration']:.1f} %, measured sd {100 * r['sd']:.1f} %, "
                  f"{100 * r['sd_applied']:.1f} % if applied")
    if not (a.live or a.report or a.passes):
        ap.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
