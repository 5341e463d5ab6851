"""``sprint report RUN_DIR`` for a layer-wise run (engine.parallel.layerwise_run):
the plan's split of every layer, the parameters each rank held, and the
measured step time beside the plan's prediction."""
from __future__ import annotations

from engine.errors import counted

STATS_FILE = "layerwise_stats.json"


def is_layerwise(st: dict) -> bool:
    # by what the table needs (files written before they carried a mode have it too)
    return st.get("mode", "layerwise") == "layerwise" and isinstance(st.get("plan"), dict) \
        and isinstance(st.get("params_held"), list)


def summary_table(st: dict) -> str:
    plan = st.get("plan") or {}
    held = st.get("params_held") or []
    n = st.get("n_params") or 0
    meas, pred = st.get("step_s_median"), st.get("predicted_step_s")
    lines = [f"mode layerwise   model {plan.get('model')}   {counted(st.get('ranks'), 'rank')}, plan for "
             f"{counted(plan.get('devices'), 'device')}   batch {plan.get('batch')}   steps {st.get('steps')}",
             "step median " + (f"{1e3 * meas:.3f} ms" if meas else "?") + "   predicted "
             + (f"{1e3 * pred:.3f} ms" if pred else "? (the plan holds no prediction)")
             + (f"   measured / predicted {meas / pred:.2f}" if meas and pred else ""), "",
             f"{'layer':<12}{'(n, c, h, w)':>16}{'devices':>9}"]
    for layer in plan.get("layers", []):
        cfg = tuple(layer.get(k, 1) for k in "nchw")
        lines.append(f"{layer.get('name', '?'):<12}{str(cfg):>16}{cfg[0] * cfg[1] * cfg[2] * cfg[3]:>9}")
    lines += ["", f"{'rank':>4}{'parameters held':>17}{'share':>8}"]
    lines += [f"{r:>4}{p:>17,}{100 * p / n if n else 0:>7.1f}%" for r, p in enumerate(held)]
    return "\n".join(lines)


def plot(st: dict, axes) -> None:
    held = st.get("params_held") or []
    ax = axes[0]
    ax.bar(range(len(held)), held, color="#4477aa")
    ax.set_xlabel("rank")
    ax.set_ylabel("parameters held")
    ax.set_title("parameter slices per rank")
    ax = axes[1]
    meas, pred = st.get("step_s_median"), st.get("predicted_step_s")
    vals = [(k, 1e3 * v) for k, v in (("measured (median)", meas), ("predicted", pred)) if v]
    ax.bar([k for k, _ in vals], [v for _, v in vals], color=["#228833", "#cc3311"][:len(vals)])
    ax.set_ylabel("ms per step")
    ax.set_title("step time")
