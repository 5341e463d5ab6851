"""Statistics of the parameter-server strategies (Downpour, Sandblaster):
the job's ``<mode>_stats.json`` assembled from every rank's stats, and the
tables ``sprint report RUN`` prints for them."""
from __future__ import annotations

import numpy as np

STATS_FILES = {"downpour": "downpour_stats.json", "sandblaster": "sandblaster_stats.json"}


def summarize_downpour(servers: list[dict], replicas: list[dict], extra=None) -> dict:
    stal = [s for sv in servers for s in sv["staleness"]]
    queue = [q for sv in servers for q in sv["queue"]]
    wall = max([r["wall_s"] for r in replicas] + [0.0])
    out = {"mode": "downpour", "servers": servers, "replicas": replicas,
           "n_server": len(servers), "n_replica": len(replicas),
           "samples": servers[0]["samples"] if servers else 0,
           "wall_s": wall, "staleness": stal, "queue": queue,
           "staleness_mean": float(np.mean(stal)) if stal else 0.0,
           "queue_mean": float(np.mean(queue)) if queue else 0.0,
           "pushes_applied": int(servers[0]["applied"]) if servers else 0,
           "pushes_sent": sum(r["pushes"] for r in replicas)}
    if extra:
        out.update(extra)
    return out


def _ms(t):
    return f"{1e3 * t:9.3f}"


def _timer(r, name):
    return r.get("timers", {}).get(name, {}).get("mean", 0.0)


def _head(st):
    thr = st.get("samples", 0) / st["wall_s"] if st.get("wall_s") else 0.0
    return [f"mode {st['mode']}   model {st.get('model', '?')}   servers {st.get('n_server')}   "
            f"replicas {st.get('n_replica')}   N_Subbatch {st.get('n_subbatch', '?')}   "
            f"N_Param {st.get('n_param', '?')}",
            f"samples {st.get('samples')}   wall {st.get('wall_s', 0):.2f} s   throughput {thr:,.1f} img/s"]


def downpour_table(st: dict) -> str:
    lines = _head(st)
    add = lines.append
    stal = np.asarray(st.get("staleness", []), float)
    q = np.asarray(st.get("queue", []), float)
    add(f"server optimizer {st.get('server_opt')}   fetch every {st.get('fetch_every')}   "
        f"push every {st.get('push_every')}   pushes sent {st.get('pushes_sent')}   "
        f"applied (server 0) {st.get('pushes_applied')}")
    add(f"staleness (server versions between fetch and apply): mean {stal.mean() if stal.size else 0:.2f}  "
        f"median {np.median(stal) if stal.size else 0:.0f}  max {stal.max() if stal.size else 0:.0f}   "
        f"queue length mean {q.mean() if q.size else 0:.2f}  max {q.max() if q.size else 0:.0f}")
    add("")
    add(f"{'replica':<8}{'steps':>7}{'pushes':>8}{'fetch ms':>10}{'compute ms':>11}{'push ms':>9}"
        f"{'wait ms':>9}{'slow':>6}{'dropped':>8}")
    for r in st.get("replicas", []):
        add(f"{r['replica']:<8}{r['steps']:>7}{r['pushes']:>8}{_ms(_timer(r, 'Fetch')):>10}"
            f"{_ms(_timer(r, 'Compute')):>11}{_ms(_timer(r, 'Push')):>9}{_ms(_timer(r, 'Wait')):>9}"
            f"{r.get('slow_factor', 1):>6g}{r.get('grads_discarded_at_stop', 0):>8}")
    add("")
    add(f"{'server':<8}{'shard':>18}{'applied':>9}{'apply ms':>10}{'queue':>7}{'staleness':>10}{'idle s':>8}")
    for s in st.get("servers", []):
        sq, ss = s.get("queue") or [0], s.get("staleness") or [0]
        shard = f"[{s['lo']}, {s['hi']})"
        add(f"{s['server']:<8}{shard:>18}{s['applied']:>9}{_ms(s['apply']['mean']):>10}"
            f"{np.mean(sq):>7.2f}{np.mean(ss):>10.2f}{s['idle_s']:>8.2f}")
    return "\n".join(lines)


def summarize_sandblaster(servers: list[dict], replicas: list[dict], extra=None) -> dict:
    coord = servers[0]["coordinator"]
    bt = coord["batch_times"]
    out = {"mode": "sandblaster", "servers": servers, "replicas": replicas, "coordinator": coord,
           "n_server": len(servers), "n_replica": len(replicas), "samples": coord["samples"],
           "wall_s": coord["wall_s"], "batches": coord["batches"],
           "batch_time_mean": float(np.mean(bt)) if bt else 0.0,
           "batch_time_median": float(np.median(bt)) if bt else 0.0,
           "duplicates": coord["duplicates"], "reissued": coord["reissued"],
           "shard_duplicates": sum(s["duplicates"] for s in servers),
           "slices": sum(r["slices"] for r in replicas)}
    if extra:
        out.update(extra)
    return out


def sandblaster_table(st: dict) -> str:
    lines = _head(st)
    add = lines.append
    c = st["coordinator"]
    tr = np.asarray(c.get("trials", []), float)
    add(f"L-BFGS batch {st.get('n_subbatch')}   slice {st.get('slice')}   history {st.get('history')}   "
        f"backup tasks {'on' if st.get('backup') else 'off'}   batches {st.get('batches')}   "
        f"evaluations {c.get('evaluations')}   line-search trials mean {tr.mean() if tr.size else 0:.2f}")
    add(f"batch time mean {_ms(st.get('batch_time_mean', 0))} ms   median {_ms(st.get('batch_time_median', 0))} ms"
        f"   slices re-issued {st.get('reissued')}   duplicates dropped: coordinator {st.get('duplicates')}, "
        f"shards {st.get('shard_duplicates')}")
    if c.get("loss"):
        add(f"objective first {c['loss'][0]:.6f}   last {c['loss'][-1]:.6f}")
    add("")
    add(f"{'replica':<8}{'slices':>8}{'stale':>7}{'wait ms':>9}{'fetch ms':>10}{'compute ms':>11}"
        f"{'push ms':>9}{'slow':>6}")
    for r in st.get("replicas", []):
        add(f"{r['replica']:<8}{r['slices']:>8}{r.get('stale_tasks', 0):>7}{_ms(_timer(r, 'WaitTask')):>9}"
            f"{_ms(_timer(r, 'Fetch')):>10}{_ms(_timer(r, 'Compute')):>11}{_ms(_timer(r, 'Push')):>9}"
            f"{r.get('slow_factor', 1):>6g}")
    return "\n".join(lines)


TABLES = {"downpour": downpour_table, "sandblaster": sandblaster_table}


def summary_table(st: dict) -> str:
    return TABLES[st["mode"]](st)
