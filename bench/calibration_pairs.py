"""Does the calibration bridge the drift between a profile's day and a run's? (issue 15)

    python bench/calibration_pairs.py --profile P.json --sets 9,10,15 [--rows F.jsonl]   # no timing

Every saved validation run of the seen ``--sets`` is predicted with ``--profile``
(records of one day and hour, refitted by this code) whatever profile it was
judged against then: a pair (profile of time A, runs of time B). T_GPU and
T_Epoch are linear in the profile's two scales (``time_scale`` k on per-unit
costs, ``call_scale`` kc on per-call ones), so each configuration is
predicted at (1, 1) and (1, 2) once (kept in ``--rows``, JSON lines, with each
pass's calibration) and every rescaling rule is scored as k U + kc C from
the profile's stored calibration and the pass's, without predicting again.
Reported per set: each rule's mean / median |error| (each configuration the
median of its runs against the prediction at the median of its passes'
scales, as validate_model.py --rescore scores it), the parts' ratios and the
truth (measured over the unscaled prediction).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results"
QTYS = ("T_GPU", "T_Epoch")


def split_uc(r, prof):
    """({quantity: U}, {quantity: C}): a saved row's T_GPU and T_Epoch as
    ``prof`` prices them, in their per-unit and per-call parts (predicted at
    call scales 1 and 2: every time here is linear in the two scales, to
    0.1 % for T_Update, 0.001 % for these)."""
    from engine.perf.profile import Profile
    from validate_runs import predicted, row_n_file
    t = {}
    for kc in (1.0, 2.0):
        p = Profile(prof.data, prof.source)
        p.call_scale = kc
        t[kc] = predicted(r["model"], r["n_node"], r["n_gpu"], r["n_subbatch"], p, row_n_file(r), sim=False)
    C = {q: t[2.0][q] - t[1.0][q] for q in QTYS}
    return {q: t[1.0][q] - C[q] for q in QTYS}, C


def rows_of(profile, sets, rows_file):
    """Each configuration of the saved runs of ``sets`` (test set numbers)
    predicted by ``profile`` split into U and C, with the measured times and
    each pass's calibration (``now``); cached in ``rows_file`` per (profile, file)."""
    from engine.perf.profile import Profile
    prof = Profile.load(profile)
    rows_file = Path(rows_file)
    done = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    seen = {(x["profile"], x["file"]) for x in done}
    for s in sets:
        for f in sorted(glob.glob(str(RESULTS / f"validation_test{s}_*_s*.json"))):
            if not re.search(r"_s\d+\.json$", f) or (str(profile), os.path.basename(f)) in seen:
                continue
            d = json.loads(Path(f).read_text())
            nows = [c.get("now") for c in d.get("calibrations") or []]
            new = []
            for r in d["rows"]:
                U, C = split_uc(r, prof)
                new.append({"profile": str(profile), "file": os.path.basename(f), "set": int(s), "net": r["model"],
                            "config": [r["n_node"], r["n_gpu"], r["n_subbatch"]], "U": U, "C": C,
                            "meas": {q: r["measured"].get(q) for q in QTYS}, "nows": nows})
            with open(rows_file, "a") as out:
                out.writelines(json.dumps(x) + "\n" for x in new)
            done += new
            print(f"{os.path.basename(f)}: {len(new)} rows", file=sys.stderr, flush=True)
    return [x for x in done if x["profile"] == str(profile) and x["set"] in set(map(int, sets))]


def rules(then):
    """{rule: fn(now) -> (k, kc)}: none, and ``calibrate.compare`` as it is now."""
    from engine.perf.calibrate import compare

    def current(now):
        chk = compare({"calibration": then}, None, now)
        return chk.scale, chk.scale if chk.call_scale is None else chk.call_scale
    return {"none": lambda now: (1.0, 1.0), "calibrated": current}


def score(rows, then, which=None):
    """{set: {rule: (mean, median |error|) of T_GPU, T_Epoch}} plus the parts' ratios.
    Each set's scales are the median over all its files' passes, as
    ``validate_model.py --rescore`` merges a set's files."""
    out = {}
    fns = which or rules(then)
    for s in sorted({x["set"] for x in rows}):
        xs = [x for x in rows if x["set"] == s and all(x["nows"])]
        nows = list({x["file"]: x["nows"] for x in xs}.values())
        nows = [n for ns in nows for n in ns]
        res = {}
        for name, fn in fns.items():
            k, kc = np.median([fn(n) for n in nows], axis=0)
            cells = []
            for q in QTYS:
                e = []
                for x in xs:
                    if x["meas"][q]:
                        e.append((k * x["U"][q] + kc * x["C"][q]) / x["meas"][q] - 1)
                e = np.abs(e)
                cells.append((100 * float(np.mean(e)), 100 * float(np.median(e))))
            res[name] = cells
        parts = {p: float(np.median([n[p + "_s"] / then[p + "_s"] for x in xs for n in x["nows"]
                                     if n.get(p + "_s") and then.get(p + "_s")] or [np.nan]))
                 for p in ("kernel", "python", "compute")}
        truth = float(np.median([x["meas"]["T_GPU"] / (x["U"]["T_GPU"] + x["C"]["T_GPU"]) for x in xs]))
        share = float(np.median([x["C"]["T_GPU"] / (x["U"]["T_GPU"] + x["C"]["T_GPU"]) for x in xs]))
        out[s] = {"rules": res, "parts": parts, "truth": truth, "call_share": share, "n": len(xs)}
    return out


def print_scores(sc, profile):
    print(f"profile {profile}")
    for s, v in sc.items():
        parts = " ".join(f"{p} x{r:.3f}" for p, r in v["parts"].items() if r == r)
        cells = " | ".join(f"{n}: T_GPU {a[0]:.1f}/{a[1]:.1f} T_Epoch {b[0]:.1f}/{b[1]:.1f}"
                           for n, (a, b) in v["rules"].items())
        print(f"set {s:2d} ({v['n']:2d}) truth x{v['truth']:.3f} per-call share {v['call_share']:.2f} "
              f"[{parts}] | {cells}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--sets", required=True, help="seen test sets, comma separated")
    ap.add_argument("--rows", default="calibration_pairs.jsonl")
    a = ap.parse_args(argv)
    from engine.perf.profile import Profile
    then = Profile.load(a.profile).data["fingerprint"]["calibration"]
    rows = rows_of(a.profile, a.sets.split(","), a.rows)
    print_scores(score(rows, then), a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
