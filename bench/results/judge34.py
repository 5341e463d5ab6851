"""Set 34's per-variant numbers: calibrated T_GPU / T_Epoch mean |err| (all, and over the 1x2, 2x1,
2x2 pairs), and FetchWeights+LoadImage(+LockWeights) mean signed error as a share of T_GPU per pair.
usage: PYTHONPATH=<tree> python judge34.py PROFILE PART.json..."""
import json, os, sys, collections
import numpy as np
sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"], "bench"))
from validate_runs import calibrated                      # noqa: E402
from engine.perf.profile import Profile                   # noqa: E402
prof = Profile.load(sys.argv[1])
err = collections.defaultdict(list)
fl = collections.defaultdict(list)
for f in sys.argv[2:]:
    d = json.load(open(f))
    rows = calibrated(d["rows"], prof, d.get("calibrations") or [])[0]
    for r in rows:
        k = f"{r['n_node']}x{r['n_gpu']}"
        m, p = r["measured"], r["predicted"]
        for q in ("T_GPU", "T_Epoch"):
            e = p[q] / m[q] - 1
            err[(q, "all")].append(e)
            err[(q, k)].append(e)
            if k in ("1x2", "2x1", "2x2"):
                err[(q, "within")].append(e)
        ms, ps = m["steps"], p["steps"]
        s = sum(ps[x] - ms[x] for x in ("FetchWeights", "LoadImage", "LockWeights"))
        fl[k].append(s / m["T_GPU"])
mean = lambda v: 100 * float(np.mean(np.abs(v)))   # noqa: E731
print("calibrated mean |err|: T_GPU %.1f %%, T_Epoch %.1f %%; over 1x2/2x1/2x2: T_GPU %.1f %%, T_Epoch %.1f %%" % (
    mean(err[("T_GPU", "all")]), mean(err[("T_Epoch", "all")]), mean(err[("T_GPU", "within")]), mean(err[("T_Epoch", "within")])))
print("T_GPU by sharing, mean |err| / mean signed: " + ", ".join(
    f"{k} {mean(err[('T_GPU', k)]):.1f} / {100 * np.mean(err[('T_GPU', k)]):+.1f} %" for k in ("1x1", "1x2", "2x1", "2x2", "3x1", "3x2")))
print("FetchWeights + LoadImage, predicted - measured, mean share of T_GPU: " + ", ".join(
    f"{k} {100 * np.mean(v):+.1f} %" for k, v in sorted(fl.items())))
