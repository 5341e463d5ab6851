"""Does the calibration track the drift the nets feel? (issue 15, profile validity)

    python bench/calibration_drift.py --history [--runs fitted5,test12] [--rows F.jsonl]   # no timing, ~8 min
                                                    # of predictions for every seen set; in parts by --runs
    /work/coord/cpu-exclusive python bench/calibration_drift.py --live 3 --out F.jsonl   # ~1 min

``--history`` re-predicts every saved validation run of the seen sets
(the fitted grid of sessions 5-15, test sets 5-13) with this code and the
profile the run was judged against, and scores four rules of rescaling by
the calibration: none; the whole workload's ratio on every time; each
part's ratio whole beyond the 10 % band (the check before session 13); and
``calibrate.compare`` as it is now (the whole workload's ratio on the
per-unit costs, the Python part's on the per-call ones, each shrunk by its noise;
set 5 timed no parts: its whole ratio). Each configuration is scored as
the validation's headline (the median of its runs against the prediction
at the median of its passes' scales) and each pass against its own. It
also fits, per net, the slope of log(measured / predicted) on each part's
log ratio. T_GPU and T_Epoch are linear in the two scales (``time_scale``
k on the per-unit costs, ``call_scale`` kc on the per-call ones) to 0.001 %,
so each configuration is predicted twice, at (1, 1) and (1, 2), and every
rule is k U + kc C.

``--live`` times candidate calibration parts (the kernel and Python parts,
SGEMMs of 128-512, a 32 MiB copy, steps of cifar at batch 1 and 4) on core
0, core 1, unpinned and with the other core running the same part
(``pair``), and a 2-thread GEMM, beside 2.5 s one-rank runs of tiny
(N_Subbatch 8) and cifar (4) and one-thread steps of the seen heldout-d4
(14) and heldout-d8 (9), one JSON line a round.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = Path(__file__).resolve().parent / "profiles"
PART_KEYS = {"kernel": "kernel_s", "python": "python_s"}


# Profiles swept for a test set but never shipped: no saved run was judged against them.
NOT_SHIPPED = ("cpu_test12", "cpu_test14f", "cpu_test14s")


def _profiles():
    """{name: (date of its fit, fingerprint)} of the shipped test profiles that store a calibration."""
    out = {}
    for f in sorted(PROFILES.glob("cpu_test*.json")):
        if f.name.endswith("_records.json") or f.stem in NOT_SHIPPED:
            continue
        d = json.loads(f.read_text())
        fp = d.get("fingerprint") or {}
        if (fp.get("calibration") or {}).get("wall_s"):
            out[f.stem] = (d.get("date") or fp["calibration"]["date"], fp)
    return out


def _consistent(d, then):
    """Do a saved run's calibrations give ``then`` (a profile's) back? None: nothing to check."""
    got = [c["now"]["wall_s"] / c["ratio"] for c in d["calibrations"] if c.get("now") and c.get("ratio")]
    return None if not got else all(abs(g / then["wall_s"] - 1) < 1e-6 for g in got)


def _profile_of(d, profs):
    """The profile a saved run was judged against (``--profile`` named the
    shipped file, which changed with each session): the newest fitted before
    the run whose stored calibration the run's own measurements give back
    where it kept them (cpu_test11, 11r and 14 share one calibration)."""
    for name in sorted((n for n, (date, _) in profs.items() if date <= d["date"]), key=lambda n: profs[n][0],
                       reverse=True):
        if _consistent(d, profs[name][1]["calibration"]) is not False:
            return name
    raise ValueError(f"no profile of bench/profiles/ matches the run of {d['date']}")


def _now(c, then):
    """A pass's calibration; runs before the measurement was kept (set 7 and
    earlier) give it back from the ratios, with the median blocks' spread;
    runs before the parts were timed (set 5), the whole workload only."""
    if c.get("now"):
        return c["now"]
    if not c.get("parts"):
        return {"wall_s": c["ratio"] * then["wall_s"], "u": 0.004}
    return {"wall_s": c["ratio"] * then["wall_s"], "u": 0.004, "u_kernel": 0.003, "u_python": 0.009,
            **{v: c["parts"][k] * then[v] for k, v in PART_KEYS.items()}}


def _rules(then, now):
    """(k, kc): the scales of per-unit and per-call costs by each rule: none;
    the whole workload's ratio on every time (shrunk by its noise as the
    check does); each part's ratio whole beyond its band (the check before
    session 13; the band is ``_noise``'s, since session 16 with a
    calibration's call-to-call spread); ``calibrate.compare`` as it is now (by part, shrunk)."""
    from engine.perf.calibrate import _noise, _weight, compare
    r = now["wall_s"] / then["wall_s"]
    whole = r ** _weight(then, now, r)
    chk = compare({"calibration": then}, None, now)
    band = (r if abs(r - 1) > _noise(then, now) else 1.0,) * 2
    if chk.call_scale is not None:
        band = tuple(now[v] / then[v] if abs(now[v] / then[v] - 1) > _noise(then, now, "u_" + k) else 1.0
                     for k, v in PART_KEYS.items())
    return chk, {"none": (1.0, 1.0), "one ratio": (whole, whole), "band 10 %": band,
                 "by part (now)": (chk.scale, chk.scale if chk.call_scale is None else chk.call_scale)}


QTYS = ("T_GPU", "T_Epoch")


def history(tags, rows_file):
    """Every configuration of the saved runs of ``tags`` predicted with this
    code and the profile it was judged against, split into its per-unit and
    per-call parts, with each pass's scales by each rule; appended to
    ``rows_file`` (JSON lines; runs already there are not predicted again)
    and all of that file returned."""
    from calibration_pairs import split_uc
    from engine.perf.profile import Profile
    profs = _profiles()
    rows_file = Path(rows_file)
    done = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    seen = {x["file"] for x in done}
    for f in sorted(glob.glob(str(RESULTS / "validation_*.json"))):
        m = re.match(r"validation_((fitted|test)\d+)_", os.path.basename(f))
        if not m or m.group(1) not in tags or os.path.basename(f) in seen:
            continue
        d = json.loads(Path(f).read_text())
        if not d.get("date") or not d.get("calibrations"):
            continue
        name = _profile_of(d, profs)
        prof = Profile.load(PROFILES / f"{name}.json")
        then = prof.data["fingerprint"]["calibration"]
        if not all(c.get("parts") for c in d["calibrations"]):      # judged by the whole workload: so here
            then = {k: v for k, v in then.items() if not k.startswith(("kernel", "python", "compute", "u_"))}
        passes = [_rules(then, _now(c, then)) for c in d["calibrations"]]
        new = []
        for r in d["rows"]:
            U, C = split_uc(r, prof)
            new.append({"file": os.path.basename(f), "run": m.group(1), "net": r["model"], "profile": name,
                        "U": U, "C": C,
                        "meas": {q: r["measured"].get(q) for q in QTYS},
                        "runs": [{q: x.get(q) for q in QTYS} for x in r.get("runs", [])],
                        "parts": [chk.parts for chk, _ in passes], "rules": [ru for _, ru in passes]})
        with open(rows_file, "a") as out:
            out.writelines(json.dumps(x) + "\n" for x in new)
        done += new
        print(f"{os.path.basename(f)}: {name}", file=sys.stderr, flush=True)
    return [x for x in done if x["run"] in tags]


def _pred(x, q, scales):
    return scales[0] * x["U"][q] + scales[1] * x["C"][q]


def report(rows):
    """Per set, each rule: mean / median |error| of each configuration (the
    median of its runs against the prediction at the median of its passes'
    scales, the validation's headline) and of each pass against its own."""
    key = lambda s: (s[0], int(re.sub(r"\D", "", s)))
    sets = sorted({x["run"] for x in rows}, key=key)
    rules = list(rows[0]["rules"][0])
    for q in QTYS:
        print(f"\n{q}: mean / median |error| % of each configuration (median of its runs; the scales' median)")
        print(f"{'runs':9s} {'n':>3s} | " + " | ".join(f"{r:>15s}" for r in rules) + " | per pass, mean: "
              + " / ".join(rules))
        means = {r: [] for r in rules}
        for st in sets + ["all"]:
            xs = [x for x in rows if x["run"] == st or st == "all"]
            cells, passes = [], []
            for rule in rules:
                e = np.array([_pred(x, q, np.median([ru[rule] for ru in x["rules"]], axis=0)) / x["meas"][q] - 1
                              for x in xs if x["meas"][q]])
                ep = np.array([_pred(x, q, ru[rule]) / m[q] - 1 for x in xs
                               for ru, m in zip(x["rules"], x["runs"]) if m.get(q)])
                if st != "all":
                    means[rule].append(np.mean(abs(e)))
                cells.append(f"{100 * np.mean(abs(e)):6.1f} / {100 * np.median(abs(e)):4.1f}")
                passes.append(f"{100 * np.mean(abs(ep)):.1f}")
            print(f"{st:9s} {len(xs):3d} | " + " | ".join(cells) + " | " + " / ".join(passes))
        print(f"{'mean of the sets':13s} | " + " | ".join(f"{100 * np.mean(means[r]):15.2f}" for r in rules)
              + "   (sets better than none: " + ", ".join(
                  f"{r} {sum(a < b for a, b in zip(means[r], means['none']))}/{len(sets)}" for r in rules) + ")")
    # Per (run, net, pass): the median over configurations of log(measured /
    # unscaled prediction) against each part's log ratio, an intercept per net.
    by = {}
    for x in rows:
        for i, (parts, m) in enumerate(zip(x["parts"], x["runs"])):
            if parts.get("kernel") and m.get("T_GPU"):
                e = np.log(m["T_GPU"] / _pred(x, "T_GPU", (1, 1)))
                by.setdefault((x["run"], x["net"], i), []).append((parts, e))
    pts = [(k[1], np.log(v[0][0]["kernel"]), np.log(v[0][0]["python"]), np.median([e for _, e in v]))
           for k, v in by.items()]
    # Only nets run in several sessions: within one run the passes' ratios span a few per cent.
    runs_of = {}
    for run, net, _ in by:
        runs_of.setdefault(net, set()).add(run)
    pts = [p for p in pts if len(runs_of[p[0]]) > 1]
    if not pts:
        return
    print("\nslope of log(measured / predicted T_GPU) on a part's log ratio (median over each run's configurations;"
          " nets run in several sessions)")
    for net in sorted({p[0] for p in pts}) + [None]:
        sel = [p for p in pts if net is None or p[0] == net]
        y = np.array([p[3] for p in sel])
        nets = sorted({p[0] for p in sel})
        base = np.array([[1.0 * (p[0] == n) for n in nets] for p in sel])
        sd0 = np.std(y - base @ np.linalg.lstsq(base, y, rcond=None)[0])
        cells = [f"no part: resid sd {100 * sd0:.1f} %"]
        for j, part in ((1, "kernel"), (2, "python")):
            a = np.column_stack([base, [p[j] for p in sel]])
            b = np.linalg.lstsq(a, y, rcond=None)[0]
            cells.append(f"{part}: slope {b[-1]:.2f}, resid sd {100 * np.std(y - a @ b):.1f} %")
        print(f"  {net or 'all nets':8s} ({len(sel)} passes): " + "; ".join(cells))



def live(rounds, out):
    import tempfile
    import multiprocessing as mp
    from engine import ops
    from calibration_transfer import net_step, timed as timed_for
    from engine.perf.calibrate import calibration_step
    from engine.perf.sweep_runner import runner_job, runner_step_means, synthetic_npz
    from engine.perf.timing import set_threads
    set_threads(1)
    rng = np.random.default_rng(0)

    def gemm(m):
        a, b, c = (rng.standard_normal((m, m)).astype(np.float32) for _ in range(3))
        return lambda: ops.gemm(a, b, out=c)

    def copy(mib):
        s = rng.standard_normal(mib << 18).astype(np.float32)
        d = np.empty_like(s)
        return lambda: np.copyto(d, s)

    step = lambda name, n: net_step(name, n, rng)
    g192, c4 = gemm(192), copy(4)
    spec = lambda f: str(Path(__file__).resolve().parent / "specs" / f)
    parts = {"kernel": lambda: (g192(), c4()), "python": step("tiny", 8), "cifar4": step("cifar", 4),
             "cifar1": step("cifar", 1), "gemm128": gemm(128), "gemm256": gemm(256), "gemm512": gemm(512),
             "copy32": copy(32), "d4_14": step(spec("heldout_d4.json"), 14), "d8_9": step(spec("heldout_d8.json"), 9)}

    timed = lambda fn, sec=0.4: timed_for(fn, sec)

    def helper(conn):             # core 1: runs a part while the parent times it on core 0
        os.sched_setaffinity(0, {1})
        while (msg := conn.recv()) is not None:
            conn.send(timed(parts[msg[0]], msg[1]))
    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=helper, args=(child,), daemon=True)
    proc.start()
    every = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="calibration-drift-") as tmp, open(out, "a") as f:
        data = {}
        for net, n in (("tiny", 200_000), ("cifar", 20_000)):
            data[net] = Path(tmp) / f"{net}.npz"
            synthetic_npz(net, data[net], n)
        for rnd in range(rounds):
            rec = {"round": rnd, "utc": time.strftime("%H:%M:%S", time.gmtime()), "load": os.getloadavg()[0]}
            for core in (0, 1, None):
                os.sched_setaffinity(0, every if core is None else {core})
                for name, fn in parts.items():
                    rec[f"{name}@{'any' if core is None else core}"] = timed(fn)
            for name in ("kernel", "python", "gemm512", "copy32", "cifar1"):
                os.sched_setaffinity(0, {0})
                parent.send((name, 0.7))
                rec[f"{name}@pair0"] = timed(parts[name])
                rec[f"{name}@pair1"] = parent.recv()
            os.sched_setaffinity(0, every)
            rec["calibration"] = calibration_step()
            set_threads(2)
            rec["gemm512x2@any"] = timed(parts["gemm512"])
            set_threads(1)
            for net, n in (("tiny", 8), ("cifar", 4)):
                st = runner_job(net, data[net], n, 1, 1, 2.5, Path(tmp) / f"{net}-{rnd}", 120)
                rec[f"run_{net}"] = {"T_GPU": st["T_GPU"], "CG": runner_step_means(st["timers"])[0]["ComputeGradient"]}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print(json.dumps(rec), flush=True)
    parent.send(None)
    proc.join(5)

def anchor(profile, records, out):
    """Add the calibration's compute part to ``profile`` (a profile
    calibrated before it existed) referred to the era of its sweep: the
    records' one-thread net steps of cifar and tiny are timed now as the
    sweep timed them, two calibrations are taken, and the compute part's
    stored time is the one measured now divided by the median ratio
    (now / records) of cifar's steps, the net the part steps. Its
    uncertainty adds that ratio's spread. The kernel and Python parts stay
    as the profile recorded them; the ratios are kept (``compute_anchor``)."""
    from engine.perf.calibrate import calibration_step, merge_calibrations
    from engine.perf.profile import Profile
    from engine.perf.sweep import mode_config
    from engine.perf.sweep_kernels import sweep_net_steps
    from engine.perf.timing import set_threads, use_clock
    prof = Profile.load(profile)
    recs = json.loads(Path(records).read_text())
    then = {}
    for r in recs["records"]:
        if r["kind"] == "net_step" and r["model"] in ("cifar", "tiny") and r["clock"] == "cpu":
            then.setdefault(r["model"], {})[r["n_subbatch"]] = r["t"]
    set_threads(1)
    use_clock("cpu")
    ratios = {}
    for model, ts in then.items():
        # Timed by the sweep itself, at the records' batch sizes of this net only.
        cfg = dict(mode_config(recs["meta"].get("quick", True)), net_step_nets=(model,), net_batches=tuple(ts))
        for r in sweep_net_steps(cfg):
            t, was = r["t"], ts[r["n_subbatch"]]
            ratios[f"{model}/{r['n_subbatch']}"] = t / was
            print(f"{model} N_Subbatch {r['n_subbatch']}: {1e3 * t:.3f} ms now, {1e3 * was:.3f} ms in the records "
                  f"(x{t / was:.3f})", flush=True)
    use_clock("wall")
    both = merge_calibrations([calibration_step() for _ in range(2)])
    cif = np.array([v for k, v in ratios.items() if k.startswith("cifar/")])
    r_c = float(np.median(cif))
    u_r = float(np.std(cif, ddof=1) / np.sqrt(len(cif))) if len(cif) > 1 else 0.05
    cal = dict(prof.data["fingerprint"]["calibration"])
    cal.update(compute_s=both["compute_s"] / r_c, u_compute=float(np.hypot(both["u_compute"], u_r)),
               compute_anchor={"ratios": ratios, "cifar": r_c, "measured_s": both["compute_s"],
                               "u_measured": both["u_compute"], "date": both["date"], "records": str(records)})
    for k in ("before", "after"):
        if k in cal:
            cal[k] = dict(cal[k], compute_s=cal["compute_s"], u_compute=cal["u_compute"])
    prof.data["fingerprint"] = dict(prof.data["fingerprint"], calibration=cal)
    prof.save(out)
    print(f"compute part {1e3 * both['compute_s']:.3f} ms now (u {100 * both['u_compute']:.1f} %), cifar's steps "
          f"x{r_c:.3f} the records': stored {1e3 * cal['compute_s']:.3f} ms (u {100 * cal['u_compute']:.1f} %); "
          f"kernel part x{both['kernel_s'] / cal['kernel_s']:.3f}, Python part x{both['python_s'] / cal['python_s']:.3f} "
          f"the profile's; written to {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", action="store_true", help="rescore the saved runs (no timing)")
    ap.add_argument("--runs", default=",".join([f"fitted{i}" for i in (5, 6, 7, 8, 9, 10, 12, 13, 14, 15)]
                                               + [f"test{i}" for i in range(5, 14)]),
                    help="saved runs of --history (seen sets only)")
    ap.add_argument("--rows", default="calibration_history.jsonl",
                    help="--history: each run's predictions are kept here, so it can go in parts (--runs)")
    ap.add_argument("--live", type=int, default=0, metavar="ROUNDS", help="time the parts beside short runs")
    ap.add_argument("--out", default="calibration_drift.jsonl",
                    help="--live: JSON lines appended here; --anchor: the profile written")
    ap.add_argument("--anchor", nargs=2, metavar=("PROFILE", "RECORDS"),
                    help="add the compute part to PROFILE's calibration, referred to the era of RECORDS (its sweep)")
    a = ap.parse_args(argv)
    if a.history:
        report(history(set(a.runs.split(",")), a.rows))
    if a.live:
        live(a.live, a.out)
    if a.anchor:
        anchor(*a.anchor, a.out)
    if not (a.history or a.live or a.anchor):
        ap.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
