"""Per-layer error of a profile's layer terms with each net held out.

For each net of the profile's ``layer_pass`` records, the per-layer terms
(``fit_steps.fit_layer_terms``) are refitted without that net's records and
price its passes; the errors over all nets are reported (median and mean
|error|, per net and per role). The op fits still contain the net's own
shapes (the op sweeps time the seen nets' layers): this holds out the
layer-term fit, not the op sweeps. Times nothing.

    python bench/layer_terms_holdout.py --profile bench/profiles/cpu_test11.json \
        --records bench/profiles/cpu_test11_records.json

``--validations``: saved bench/validate_model.py runs whose measured layer
passes (their ``layers`` rows) are priced too, grouped by file prefix (one
test set); a net with records is priced by the fit without them, the
others by the fit on all. ``--refill-keys``: the layer-term keys fitted
with the refill terms (engine/perf/l2_refill.py; its REFILL_KEYS by default).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def holdout_errors(prof: dict, records, refill_keys=None) -> list:
    """[(net, batch, layer, pass, role, relative error)] with each net held out."""
    from engine.perf.l2_refill import REFILL_KEYS
    refill_keys = REFILL_KEYS if refill_keys is None else refill_keys
    from engine import spec as spec_mod
    from engine.perf import fit  # noqa: F401  (fit and fit_steps import each other)
    from engine.perf.fit_steps import fit_layer_terms
    from engine.perf.layer_cost import compute_gradient_terms, layer_term_keys
    from engine.perf.profile import Profile
    lp = [r for r in records if r.get("kind") == "layer_pass" and r.get("t", 0) > 0]
    decay = [r for r in records if r.get("kind") == "refill_decay"]
    base = {k: v for k, v in prof.items() if k != "layer_terms"}
    out = []
    for net in sorted({r["model"] for r in lp}):
        # Scored: the plain passes (a gapped one's step has an idle gap the model's step has not).
        mine = [r for r in lp if r["model"] == net and not r.get("gap")]
        # The refill-decay records (no net's) stay: they give the terms' tau.
        p = Profile(dict(base, layer_terms=fit_layer_terms(base, [r for r in lp if r["model"] != net] + decay,
                                                           refill_keys)))
        sp = spec_mod.get_spec(mine[0].get("spec") or net)
        geoms = spec_mod.layers(sp)
        at = {g.name: (i, g.kind) for i, g in enumerate(geoms)}
        for n in sorted({r["n_subbatch"] for r in mine}):
            pred = defaultdict(float)
            for layer, pas, _, _, t in compute_gradient_terms(sp, n, p):
                pred[(layer, pas)] += t
            for r in mine:
                if r["n_subbatch"] == n:
                    i, kind = at[r["layer"]]
                    role = layer_term_keys(kind, i, len(geoms), r["pass"])[0]
                    out.append((net, n, r["layer"], r["pass"], role,
                                (pred[(r["layer"], r["pass"])] - r["t"]) / r["t"]))
    return out


def validation_errors(prof: dict, records, files, refill_keys=None) -> dict:
    """{file group: [relative error]} of the saved runs' measured layer
    passes (``files``), each net held out of the layer-term fit."""
    from engine.perf.l2_refill import REFILL_KEYS
    refill_keys = REFILL_KEYS if refill_keys is None else refill_keys
    from bench.validate_runs import layer_predictions
    from engine import spec as spec_mod
    from engine.perf import fit  # noqa: F401  (fit and fit_steps import each other)
    from engine.perf.fit_steps import fit_layer_terms
    from engine.perf.profile import Profile
    base = {k: v for k, v in prof.items() if k != "layer_terms"}
    nets = {r["model"] for r in records if r.get("kind") == "layer_pass"}
    fits, out = {}, defaultdict(list)
    for f in files:
        for row in json.loads(Path(f).read_text())["layers"]:
            net = spec_mod.get_spec(row["model"]).name
            if net not in fits:
                fits[net] = Profile(dict(base, layer_terms=fit_layer_terms(
                    base, [r for r in records if r.get("model") != net or net not in nets], refill_keys)))
            got = layer_predictions(row["model"], row["n_subbatch"], fits[net]).get((row["layer"], row["pass"]), 0.0)
            out[Path(f).name.rsplit("_", 2)[0]].append(got / row["measured"] - 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--records", required=True)
    ap.add_argument("--validations", default="", help="comma list of saved validate_model.py runs")
    ap.add_argument("--refill-keys", default=None,
                    help="comma list of layer-term keys fitted with the refills (default: l2_refill.REFILL_KEYS; "
                         "'' for none)")
    a = ap.parse_args(argv)
    prof = json.loads(Path(a.profile).read_text())
    recs = json.loads(Path(a.records).read_text())["records"]
    keys = None if a.refill_keys is None else tuple(k for k in a.refill_keys.split(",") if k)
    errs = holdout_errors(prof, recs, keys)
    if not errs:
        print("layer_terms_holdout: error: no layer_pass records", file=sys.stderr)
        return 1
    e = np.abs([x[-1] for x in errs])
    print(f"each net held out of the layer-term fit: median |err| {100 * np.median(e):.1f} %, "
          f"mean {100 * np.mean(e):.1f} % over {len(e)} passes")
    for col, label in ((0, "net"), (4, "role")):
        groups = defaultdict(list)
        for x in errs:
            groups[x[col]].append(abs(x[-1]))
        print(f"  by {label}: " + ", ".join(f"{k} {100 * np.median(v):.1f}/{100 * np.mean(v):.1f}"
                                           for k, v in sorted(groups.items())))
    if a.validations:
        got = validation_errors(prof, recs, a.validations.split(","), keys)
        for group, v in sorted(got.items(), key=lambda kv: (len(kv[0]), kv[0])):    # test5 before test10
            print(f"saved {group}: median |err| {100 * np.median(np.abs(v)):.1f} %, mean "
                  f"{100 * np.mean(np.abs(v)):.1f} % over {len(v)} passes (nets with records held out)")
        e = np.abs([x for v in got.values() for x in v])
        print(f"saved, all: median |err| {100 * np.median(e):.1f} %, mean {100 * np.mean(e):.1f} % over {len(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
