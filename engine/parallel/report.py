"""``sprint report RUN_DIR``: the measured ASGD / sync statistics of a run as a
table, and a PNG of what matters for the mode: the staleness and
effective-minibatch distributions of ASGD; the allreduce time per step and
the throughput over time of sync SGD."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from engine.plot import save_png

from .runner import STATS
from .timers import UPDATER_STEPS, WORKER_STEPS
from engine.errors import counted


def _why_no_stats(run_dir) -> str:
    """'' or, for a parallel run stopped before its end (Ctrl-C, a dead rank),
    that its statistics come at the end: the run's folder said only 'a
    one-process run writes none' of a run of two ranks."""
    try:
        train = json.loads((run_dir / "config.json").read_text())["train"]
        mode, planned = train["parallel"], train["epochs"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    if not mode or mode == "none":      # one process: it writes none, stopped or not
        return ""
    from engine.errors import counted
    done = 0
    try:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            done = max(done, int(json.loads(line).get("epoch", 0)))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return (f"no statistics yet: a run of --parallel {mode} writes them when it ends, and this one stopped after "
            f"{counted(done, 'epoch')} of {planned}; run it to its end with sprint train --resume {run_dir} "
            f"(under mpiexec, as many ranks)")


def load_stats(run_dir) -> dict:
    """The statistics file of a parallel run (or that file itself): one error
    naming the folder or file when there is none or it is not readable."""
    from engine.errors import MissingFile, RunError
    from . import layerwise_report
    from .pipeline_report import STATS_FILE as _PIPE   # pipelines: engine.parallel.pipeline_report
    from .ps_report import STATS_FILES                 # Downpour, Sandblaster: engine.parallel.ps_report
    run_dir = Path(run_dir)
    names = (STATS["asgd"], STATS["sync"], _PIPE, *STATS_FILES.values(), layerwise_report.STATS_FILE)
    path = run_dir if run_dir.is_file() else next((run_dir / n for n in names if (run_dir / n).exists()), None)
    if path is None:
        if not run_dir.is_dir():
            raise MissingFile("no such run directory or statistics file", run_dir)
        if not (run_dir / "config.json").exists():     # was told "a one-process run writes none"
            raise MissingFile(f"not a run folder (no config.json, no statistics file: {', '.join(names)}): sprint "
                              f"report takes the --out folder of a parallel run, or its statistics file", run_dir)
        raise MissingFile(_why_no_stats(run_dir) or f"no statistics of a parallel run ({', '.join(names)}); "
                          f"a one-process run writes none", run_dir)
    try:
        st = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"not a readable statistics file ({e})", path) from None
    if isinstance(st, dict) and layerwise_report.is_layerwise(st):
        return {**st, "mode": "layerwise"}
    modes = ("asgd", "sync", "pipeline", *STATS_FILES)
    if not isinstance(st, dict) or st.get("mode", "asgd" if "T_GPU" in st else None) not in modes:
        raise RunError("not the statistics of a parallel run", path)
    return st


def _ms(s):
    return f"{1e3 * s:10.3f}"


def summary_table(st: dict) -> str:
    from . import ps_report
    if st.get("mode") == "layerwise":
        from .layerwise_report import summary_table as layerwise_table
        return layerwise_table(st)
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
        ar = st.get("timers", {}).get("Allreduce")
        if ar and st.get("T_Step"):
            add(f"Allreduce {_ms(ar['mean']).strip()} ms per step (median {_ms(ar['median']).strip()} ms), "
                f"{100 * ar['mean'] / st['T_Step']:.1f} % of a step")
    timers = st.get("timers", {})
    add("")
    add(f"{'step':<18}{'mean ms':>12}{'median ms':>12}{'count':>10}")
    known = list(WORKER_STEPS) + list(UPDATER_STEPS)
    for name in known + sorted(set(timers) - set(known)):
        if name in timers:
            t = timers[name]
            add(f"{name:<18}{_ms(t['mean']):>12}{_ms(t['median']):>12}{t['count']:>10}")
    return "\n".join(lines)


def throughput_over_time(t, samples, windows=40):
    """(window mid-times, images/s in each window) from per-step end times and
    cumulative sample counts; windows of equal step counts."""
    t = np.asarray(t, float)
    samples = np.asarray(samples, float)
    if t.size < 2:
        return np.zeros(0), np.zeros(0)
    edges = np.unique(np.linspace(0, t.size - 1, min(windows, t.size - 1) + 1).round().astype(int))
    dt = np.diff(t[edges])
    ok = dt > 0
    rate = np.diff(samples[edges])[ok] / dt[ok]
    return 0.5 * (t[edges][:-1] + t[edges][1:])[ok], rate


def _plot_sync(st: dict, axes) -> None:
    ser = st.get("series") or {}
    ar = np.asarray(ser.get("allreduce", []), float) * 1e3
    step = np.asarray(ser.get("step", []), float) * 1e3
    ax = axes[0]
    if ar.size:
        x = np.arange(1, ar.size + 1)
        if step.size == ar.size:
            ax.plot(x, step, lw=0.8, color="#bbbbbb", label=f"whole step (mean {step.mean():.2f} ms)")
        ax.plot(x, ar, lw=0.8, color="#4477aa", label=f"Allreduce (mean {ar.mean():.2f} ms)")
        ax.set_ylim(bottom=0)
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no per-step record\n(sync_stats.json older than this report)",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step (rank 0)")
    ax.set_ylabel("ms")
    ax.set_title("allreduce time per step")
    ax = axes[1]
    mid, rate = throughput_over_time(ser.get("t", []), ser.get("samples", []))
    if rate.size:
        ax.plot(mid, rate, marker=".", color="#228833")
        ax.axhline(st["samples"] / st["wall_s"] if st.get("wall_s") else 0, color="#cc3311", ls="--",
                   label="whole run")
        ax.set_ylim(bottom=0)
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no per-step record", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("images / s (all ranks)")
    ax.set_title("throughput over time")


def _plot_asgd(st: dict, axes) -> None:
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


def plot_distributions(st: dict, path) -> Path:
    """The report's PNG at ``path``: ASGD's staleness and minibatch
    distributions, or sync's allreduce per step and throughput over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if st.get("mode") == "pipeline":
        from .pipeline_report import plot_values
        st = {**st, **plot_values(st)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    if st.get("mode") == "layerwise":
        from .layerwise_report import plot as plot_layerwise
        plot_layerwise(st, axes)
        fig.suptitle(f"layerwise {(st.get('plan') or {}).get('model', '')}: {counted(st.get('ranks'), 'rank')}")
    else:
        (_plot_sync if st.get("mode") == "sync" else _plot_asgd)(st, axes)
        fig.suptitle(f"{st.get('mode', 'asgd')} {st.get('model', '')}: N_Node {st.get('n_node')} x "
                     f"N_GPU {st.get('n_gpu')}, N_Subbatch {st.get('n_subbatch', '?')}")
    fig.tight_layout()
    return save_png(fig, path, dpi=100)
