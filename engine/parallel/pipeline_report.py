"""``sprint report RUN_DIR`` for a pipeline run: per-stage forward, backward,
update, wait and idle (bubble) time, the weight versions the micro-batches
met, and SpecTrain's prediction error against the stale version."""
from __future__ import annotations

import numpy as np
from engine.errors import counted

STATS_FILE = "pipeline_stats.json"


def _ms(t):
    return 1e3 * t


def summary_table(st: dict) -> str:
    lines = [f"mode pipeline   model {st.get('model')}   {counted(st.get('stages'), 'stage')} x "
             f"{counted(st.get('replicas'), 'replica')}   schedule {st.get('schedule')}   predict {st.get('predict')}   "
             f"micro-batches {st.get('microbatches')} of mini-batch {st.get('n_subbatch')}",
             f"partition {st.get('partition')}   samples {st.get('samples')}   wall {st.get('wall_s', 0):.2f} s   "
             f"throughput {st.get('samples', 0) / st['wall_s'] if st.get('wall_s') else 0:,.1f} img/s", "",
             f"{'stage':>5}{'rep':>4}  {'layers':<20}{'fwd ms':>9}{'bwd ms':>9}{'upd ms':>9}{'wait ms':>9}"
             f"{'busy s':>9}{'idle s':>9}{'bubble':>8}{'s_fwd':>7}{'|W_stale-W|':>13}{'|W_hat-W|':>11}{'ratio':>7}"]
    for s in st.get("per_stage", []):
        t = s.get("timers", {})
        mean = lambda n: _ms(t.get(n, {}).get("mean", 0.0))
        wait_total = t.get("wait", {}).get("total", 0.0)
        trace = s.get("trace", [])
        sf = np.mean([r["s_fwd"] for r in trace]) if trace else 0.0
        es, eh, ratio = s.get("err_stale_mean"), s.get("err_hat_mean"), s.get("err_ratio")
        lines.append(f"{s['stage']:>5}{s.get('replica', 0):>4}  {','.join(s.get('layers', [])):<20}"
                     f"{mean('fwd'):>9.3f}{mean('bwd'):>9.3f}{mean('update'):>9.3f}{_ms(wait_total):>9.1f}"
                     f"{s.get('busy_s', 0):>9.3f}{s.get('wall_s', 0) - s.get('busy_s', 0):>9.3f}"
                     f"{100 * s.get('bubble', 0):>7.1f}%{sf:>7.2f}"
                     f"{'' if es is None else f'{es:.4g}':>13}{'' if eh is None else f'{eh:.4g}':>11}"
                     f"{'' if ratio is None else f'{ratio:.3f}':>7}")
    lines += ["", "wait: total time blocked on activations/gradients/labels; idle = stream wall - busy "
                  "(fwd + bwd + update); s_fwd: mean updates between a forward and its own update; "
                  "|W_stale - W|, |W_hat - W|: distance of the forward's version and of SpecTrain's "
                  "prediction to the weights its update was applied to"]
    return "\n".join(lines)


def plot_values(st: dict) -> dict:
    """The series ``report.plot_distributions`` draws: forward staleness of
    every traced micro-batch and the samples per update."""
    trace = [r for s in st.get("per_stage", []) for r in s.get("trace", [])]
    return {"staleness": [r["s_fwd"] for r in trace], "minibatch": st.get("minibatch", [])}
