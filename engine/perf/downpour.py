"""Cost models of the DistBelief strategies (engine.parallel.downpour and
engine.parallel.sandblaster), beside SPRINT's in engine.perf.model.

Downpour (closed form). A replica's step is its gradient (the same LoadImage,
DeformImage and ComputeGradient prices as an ASGD worker, host sharing
included), plus every ``fetch_every`` steps a fetch (each server copies its
shard out, the message crosses shared memory -- two copies -- and the
replica copies it in) and every ``push_every`` steps a push (pack, send;
the server receives it and applies SGD or Adagrad to its shard). A server
is a single queue: its busy time per replica step is

    b = (recv + apply) / push_every + (copy out + send) / fetch_every

for 1/S of the vector, so with R replicas its utilisation is
``rho = R b / T_step``; a fetch waits ``rho b / (2 (1 - rho))`` on average
(M/D/1) plus half a polling interval of the idle server. At ``rho >= 1`` the
servers bound the job: ``images/s = N_Subbatch / b`` per server-queue.
Staleness of a push: the other R-1 replicas push ``1/push_every`` times per
step, during the steps between the push's last fetch and its apply (``gap``,
averaged over the fetch/push cycle): ``(R - 1) gap / push_every``.

Sandblaster (closed form and simulation). An evaluation of a batch of K
slices on replicas slowed by factors f_i takes ``K t / sum(1/f_i)`` when
slices are handed out on request (plus the last slice's tail, cut by a
backup copy on the fastest idle replica), and ``max_i f_i ceil(K/R) t`` with
a static 1/R split; :func:`simulate_sandblaster` plays the dispatch out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine import spec as spec_mod

POLL = 2e-4     # engine.parallel.ps.POLL: the serving loop's sleep when idle
APPLY_PASSES = {"sgd": 4, "adagrad": 6}   # vector passes over a shard per push


@dataclass
class DownpourPrediction:
    model: str
    servers: int
    replicas: int
    n_subbatch: int
    n_param: int
    n_file: int
    fetch_every: int
    push_every: int
    server_opt: str
    replica: dict            # step -> seconds per replica step
    server: dict             # seconds per replica step at one server
    t_step: float
    rho: float
    images_per_s: float
    staleness: float
    t_epoch: float
    server_bound: bool
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _gap(fetch_every, push_every):
    """Mean steps between a push and the fetch its weights came from."""
    cyc = fetch_every * push_every // math.gcd(fetch_every, push_every)
    gaps = [j - ((j - 1) // fetch_every) * fetch_every for j in range(push_every, cyc + 1, push_every)]
    return sum(gaps) / len(gaps)


def predict(spec, n_node: int, n_gpu: int = 1, n_subbatch: int = 32, profile=None, servers: int = 1,
            fetch_every: int = 1, push_every: int = 1, server_opt: str = "adagrad", n_file=None,
            ranks_per_host: int = 1, **_ignored) -> DownpourPrediction:
    """Downpour with ``n_node`` replicas (one worker each) and ``servers``
    shards; ``ranks_per_host`` replicas share one host's cores (all of them
    when validating on one machine)."""
    from .model import N_FILE, step_costs
    from .profile import Profile
    if profile is None:
        profile = Profile.load()
    for name, v in (("servers", servers), ("fetch_every", fetch_every), ("push_every", push_every)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r} (--{name.replace('_', '-')})")
    if server_opt not in APPLY_PASSES:
        raise ValueError(f"server optimizer must be one of {sorted(APPLY_PASSES)}, got {server_opt!r}")
    sp = spec_mod.get_spec(spec)
    R, S = int(n_node), int(servers)
    c = step_costs(sp, R, 1, n_subbatch, profile, ranks_per_host=ranks_per_host)
    n = spec_mod.n_params(sp)
    ns = n / S
    slow = c["_slowdown"][0]
    copy = lambda m: slow * profile.term("copy_cold" if profile.has("copy_cold") else "copy", m)
    vec = lambda m: slow * profile.term("axpy", m)
    send = lambda m: 2 * copy(m)                      # through shared memory: in and out
    replica = {"LoadImage": c["load"][0], "DeformImage": c["deform"][0],
               "ComputeGradient": c["compute_gradient"][0], "Accumulate": profile.term("add", n) * slow}
    srv = {"ReceivePush": send(ns) / push_every, "Apply": APPLY_PASSES[server_opt] * vec(ns) / push_every,
           "ReplyFetch": (copy(ns) + send(ns)) / fetch_every}
    b = sum(srv.values())
    t_fixed = sum(replica.values()) + (copy(n) + POLL) / fetch_every + copy(n) / push_every
    bound = R * b >= t_fixed            # offered load >= 1: the servers set the pace
    wait = lambda t: (R * b / t) * b / (2 * (1 - R * b / t)) + POLL / 2
    if bound:
        t = R * b
        rho = R * b / t_fixed
        w = t - t_fixed + POLL / 2
    else:
        # t = t_fixed + wait(t) / fetch_every; the right side falls as t grows: bisect
        lo, hi = max(t_fixed, R * b * (1 + 1e-12)), 2 * max(t_fixed, R * b)
        while hi - t_fixed - wait(hi) / fetch_every < 0:
            hi *= 2
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if mid - t_fixed - wait(mid) / fetch_every < 0 else (lo, mid)
        t = hi
        rho, w = R * b / t, wait(t)
    replica["Fetch"] = (copy(n) + POLL + w) / fetch_every if not bound else \
        (copy(n) + POLL) / fetch_every + (t - t_fixed)
    replica["Push"] = copy(n) / push_every
    ips = R * n_subbatch / t
    n_file = n_file or N_FILE.get(sp.name, 50000)
    return DownpourPrediction(model=sp.name, servers=S, replicas=R, n_subbatch=n_subbatch, n_param=n,
                              n_file=n_file, fetch_every=fetch_every, push_every=push_every,
                              server_opt=server_opt, replica=replica, server=srv, t_step=t, rho=rho,
                              images_per_s=ips, staleness=(R - 1) * _gap(fetch_every, push_every) / push_every,
                              t_epoch=n_file / ips, server_bound=bound, extra={"slowdown": slow})


def format_prediction(p: DownpourPrediction, per_layer: bool = True, **_ignored) -> str:
    ms = lambda s: f"{1e3 * s:9.3f} ms"
    lines = [f"downpour {p.model}: {p.servers} server(s) x {p.replicas} replica(s), N_Subbatch {p.n_subbatch}, "
             f"N_Param {p.n_param:,}, {p.server_opt}, fetch every {p.fetch_every}, push every {p.push_every}",
             "replica step (per step):"]
    lines += [f"  {k:<16}{ms(v)}" for k, v in p.replica.items()]
    lines.append("one server (busy time per replica step):")
    lines += [f"  {k:<16}{ms(v)}" for k, v in p.server.items()]
    lines.append(f"T_step {ms(p.t_step)}   server utilisation {p.rho:.2f}"
                 f"{'  (server-bound)' if p.server_bound else ''}   images/s {p.images_per_s:,.0f}   "
                 f"staleness {p.staleness:.2f}   T_Epoch {p.t_epoch:.3g} s")
    return "\n".join(lines)


# ---- Sandblaster --------------------------------------------------------------
def sandblaster_eval_time(n_slices: int, t_slice: float, factors, backup: bool = True, static: bool = False):
    """Closed form: seconds to evaluate one batch of ``n_slices`` slices on
    replicas slowed by ``factors`` (1 = nominal speed)."""
    f = [float(x) for x in factors]
    if static:
        return max(f) * math.ceil(n_slices / len(f)) * t_slice
    rate = sum(1.0 / x for x in f)
    tail = min(f) * t_slice if backup else max(f) * t_slice
    return max(n_slices - len(f), 0) * t_slice / rate + tail


def simulate_sandblaster(n_slices: int, t_slice: float, factors, backup: bool = True, static: bool = False,
                         overhead: float = 0.0) -> dict:
    """Discrete-event play of one evaluation: slices handed to whichever
    replica is free (each request costing ``overhead``), a late slice copied
    to an idle replica once out longer than a nominal slice (first copy
    wins), or a static split of ceil(K/R) slices each."""
    f = [float(x) for x in factors]
    R = len(f)
    if static:
        per = [len(range(i, n_slices, R)) for i in range(R)]
        return {"time": max(p * (f[i] * t_slice + overhead) for i, p in enumerate(per)), "duplicates": 0,
                "slices": per}
    free = [0.0] * R
    finish = {}
    start = {}
    done_by = [0] * R
    nxt = 0
    dup = 0
    while nxt < n_slices:
        i = min(range(R), key=lambda j: free[j])
        start[nxt] = free[i] + overhead
        free[i] = finish[nxt] = start[nxt] + f[i] * t_slice
        done_by[i] += 1
        nxt += 1
    if backup:
        for i in sorted(range(R), key=lambda j: free[j]):
            late = [s for s in finish if finish[s] > free[i] + overhead + f[i] * t_slice
                    and free[i] - start[s] > t_slice]
            if late:
                s = min(late, key=lambda k: start[k])
                copy_done = free[i] + overhead + f[i] * t_slice
                finish[s] = min(finish[s], copy_done)
                free[i] = copy_done
                dup += 1
    return {"time": max(finish.values()) if finish else 0.0, "duplicates": dup, "slices": done_by}
