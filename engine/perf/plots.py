"""PNGs: each fit against its sweep, and predicted against measured values."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.plot import save_png

DPI = 110


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _parity(ax, meas, pred, held, title):
    meas, pred, held = np.asarray(meas), np.asarray(pred), np.asarray(held, bool)
    lo = min(meas.min(), pred.min()) * 0.8
    hi = max(meas.max(), pred.max()) * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [lo * 1.1, hi * 1.1], "k:", lw=0.5)
    ax.plot([lo, hi], [lo / 1.1, hi / 1.1], "k:", lw=0.5)
    ax.loglog(meas[~held], pred[~held], ".", ms=3, label="fitted")
    if held.any():
        ax.loglog(meas[held], pred[held], "x", ms=4, color="C3", label="held out")
    ax.set_xlabel("measured (s)")
    ax.set_ylabel("model (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)


def plot_fits(records, prof: dict, out_dir) -> list:
    """One PNG per fitted term: SGEMM variants as parity plots, linear terms
    as time against size with the fitted line. Returns the files written."""
    from .fit import predict_sgemm
    plt = _plt()
    out = Path(out_dir)
    files = []
    variants = prof.get("sgemm", {}).get("variants", {})
    if variants:
        fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 4), squeeze=False)
        for ax, (var, v) in zip(axes[0], sorted(variants.items())):
            regs = [(r["rule"], r["coef"]) for r in v["regimes"]]
            rs = [r for r in records if r.get("kind") == "sgemm" and r.get("trans", "nn") == var]
            _parity(ax, [r["t"] for r in rs], [predict_sgemm(regs, r["m"], r["n"], r["k"]) for r in rs],
                    [r.get("holdout", False) for r in rs], f"SGEMM {var}: {len(regs)} regime(s)")
        fig.tight_layout()
        files.append(save_png(fig, out / "fit_sgemm.png", dpi=DPI))
    terms = prof.get("terms", {})
    names = sorted(n for n in terms if any(r.get("kind") == n for r in records))
    if names:
        cols = 4
        rows = -(-len(names) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3 * rows), squeeze=False)
        for ax, name in zip(axes.ravel(), names):
            rs = [r for r in records if r.get("kind") == name]
            x = np.array([r["x"] for r in rs], float)
            t = np.array([r["t"] for r in rs])
            h = np.array([r.get("holdout", False) for r in rs])
            ax.loglog(x[~h], t[~h], ".", ms=3)
            if h.any():
                ax.loglog(x[h], t[h], "x", color="C3", ms=4)
            xs = np.geomspace(max(x.min(), 1), x.max(), 50)
            from .profile import Profile
            pr = Profile(prof)
            if "coef" in terms[name]:    # pooling: priced on its whole shape (pool_cost), not one size
                ax.loglog(x, [pr.term(name, (r["x"], 0, r["planes"], r["h"], r["p"])) for r in rs], "k+", ms=3)
            else:
                ax.loglog(xs, [pr.term(name, v) for v in xs], "k-", lw=0.8)
            e = terms[name]["error"]["holdout"]
            ax.set_title(f"{name}" + (f" (held-out med {100 * e['median']:.1f} %)" if e.get("n") else ""),
                         fontsize=8)
            ax.set_xlabel(terms[name].get("unit", "elements"), fontsize=7)
        for ax in axes.ravel()[len(names):]:
            ax.axis("off")
        fig.tight_layout()
        files.append(save_png(fig, out / "fit_terms.png", dpi=DPI))
    ar = [r for r in records if r.get("kind") == "allreduce"]
    if ar and "allreduce" in prof:
        from .profile import Profile
        p = Profile(prof)
        fig, ax = plt.subplots(figsize=(4.5, 3.6))
        for i, n in enumerate(sorted({r["n_node"] for r in ar})):
            rs = sorted((r for r in ar if r["n_node"] == n), key=lambda r: r["n_param"])
            P = np.array([r["n_param"] for r in rs], float)
            ax.loglog(P, [r["t"] for r in rs], "o", ms=3, color=f"C{i}", label=f"{n} ranks")
            ax.loglog(P, [p.allreduce_bw(n, v) for v in P], "-", color=f"C{i}", lw=0.8)
        ax.set_xlabel("N_Param (float32)")
        ax.set_ylabel("Allreduce (s)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        files.append(save_png(fig, out / "fit_allreduce.png", dpi=DPI))
    return files


def plot_validation(rows, path) -> Path:
    """Predicted against measured for the validation grid: one panel per quantity.

    ``rows``: dicts with ``measured`` and ``predicted`` sub-dicts keyed by quantity.
    """
    plt = _plt()
    keys = [k for k in ("T_GPU", "T_Update", "T_Epoch", "N_Minibatch_avg", "staleness")
            if any(k in r["measured"] for r in rows)]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.6), squeeze=False)
    for ax, k in zip(axes[0], keys):
        pts = [(r["measured"][k], r["predicted"][k], r.get("model", "")) for r in rows
               if r["measured"].get(k) and r["predicted"].get(k)]
        if not pts:
            ax.axis("off")
            continue
        m = np.array([p[0] for p in pts])
        q = np.array([p[1] for p in pts])
        lo, hi = min(m.min(), q.min()) * 0.8, max(m.max(), q.max()) * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for i, name in enumerate(sorted({p[2] for p in pts})):
            sel = np.array([p[2] == name for p in pts])
            ax.loglog(m[sel], q[sel], "o", ms=4, color=f"C{i}", label=name)
        err = np.median(np.abs(q - m) / m)
        ax.set_title(f"{k}: median |err| {100 * err:.1f} %", fontsize=9)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, path, dpi=DPI)
