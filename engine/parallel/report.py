"""``sprint report RUN_DIR``: the measured ASGD / sync statistics of a run as a
table, and a PNG of the staleness and effective-minibatch distributions."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .runner import STATS
from .timers import UPDATER_STEPS, WORKER_STEPS


def load_stats(run_dir) -> dict:
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return json.loads(run_dir.read_text())
    for name in (STATS["asgd"], STATS["sync"]):
        p = run_dir / name
        if p.exists():
            return json.loads(p.read_text())
    from .pipeline_report import STATS_FILE as _PIPE   # pipelines: engine.parallel.pipeline_report
    if (run_dir / _PIPE).exists():
        return json.loads((run_dir / _PIPE).read_text())
    # parameter-server strategies (Downpour, Sandblaster): engine.parallel.ps_report
    from .ps_report import STATS_FILES
    for name in STATS_FILES.values():
        if (run_dir / name).exists():
            return json.loads((run_dir / name).read_text())
    raise FileNotFoundError(f"no {STATS['asgd']} or {STATS['sync']} in {run_dir}")


def _ms(s):
    return f"{1e3 * s:10.3f}"


def summary_table(st: dict) -> str:
    from . import ps_report
    if st.get("mode") == "pipeline":
        from .pipeline_report import summary_table as pipeline_table
        return pipeline_table(st)
    if st.get("mode") in ps_report.TABLES:
        return ps_report.summary_table(st)
    lines = []
    add = lines.append
    mode = st.get("mode", "asgd")
    add(f"mode {mode}   model {st.get('model', '?')}   N_Node {st.get('n_node')}   N_GPU {st.get('n_gpu')}   "
        f"N_Subbatch {st.get('n_subbatch', '?')}   N_Param {st.get('n_param', '?')}")
    add(f"samples {st.get('samples')}   wall {st.get('wall_s', 0):.2f} s   "
        f"throughput {st.get('samples', 0) / st['wall_s'] if st.get('wall_s') else 0:,.1f} img/s")
    if mode == "asgd":
        n_pred = (st["n_node"] * st["n_gpu"] * st.get("n_subbatch", 0) * st["T_Update"] / st["T_GPU"]
                  if st.get("T_GPU") else float("nan"))
        stal = np.asarray(st.get("staleness", []), float)
        mb = np.asarray(st.get("minibatch", []), float)
        add(f"T_GPU {_ms(st['T_GPU'])} ms   T_Update {_ms(st['T_Update'])} ms   updates {st.get('updates')}")
        add(f"N_Minibatch_avg measured {st.get('N_Minibatch_avg', 0):.2f}   "
            f"(N_Node N_GPU N_Subbatch T_Update/T_GPU = {n_pred:.2f})   "
            f"median {np.median(mb) if mb.size else 0:.0f}  max {mb.max() if mb.size else 0:.0f}")
        add(f"staleness mean {stal.mean() if stal.size else 0:.2f}  median "
            f"{np.median(stal) if stal.size else 0:.0f}  max {stal.max() if stal.size else 0:.0f}   "
            f"gradients produced {st.get('gradients_produced')}  dropped at stop "
            f"{st.get('gradients_discarded_at_stop')}")
        add(f"worker time waiting (LockGradient + FetchWeights) {100 * st.get('worker_wait_share', 0):.2f} %   "
            f"on locks only {100 * st.get('lock_wait_share', 0):.2f} %")
    else:
        add(f"T_Step {_ms(st.get('T_Step', 0))} ms   T_GPU {_ms(st.get('T_GPU', 0))} ms   steps {st.get('steps')}"
            f"   buckets {st.get('buckets')}")
    timers = st.get("timers", {})
    add("")
    add(f"{'step':<18}{'mean ms':>12}{'median ms':>12}{'count':>10}")
    known = list(WORKER_STEPS) + list(UPDATER_STEPS)
    for name in known + sorted(set(timers) - set(known)):
        if name in timers:
            t = timers[name]
            add(f"{name:<18}{_ms(t['mean']):>12}{_ms(t['median']):>12}{t['count']:>10}")
    return "\n".join(lines)


def plot_distributions(st: dict, path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if st.get("mode") == "pipeline":
        from .pipeline_report import plot_values
        st = {**st, **plot_values(st)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "staleness", "staleness (weight versions)"),
                           (axes[1], "minibatch", "effective minibatch (samples per update)")):
        vals = np.asarray(st.get(key, []), float)
        if vals.size:
            hi = int(vals.max())
            bins = np.arange(-0.5, hi + 1.5) if hi < 60 else 60
            ax.hist(vals, bins=bins, color="#4477aa")
            ax.axvline(vals.mean(), color="#cc3311", ls="--", label=f"mean {vals.mean():.2f}")
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(label)
        ax.set_ylabel("count")
    fig.suptitle(f"{st.get('mode', 'asgd')} {st.get('model', '')}: N_Node {st.get('n_node')} x "
                 f"N_GPU {st.get('n_gpu')}, N_Subbatch {st.get('n_subbatch', '?')}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
