"""Cost models of the DistBelief strategies (engine.parallel.downpour and
engine.parallel.sandblaster), beside SPRINT's in engine.perf.model.

Downpour (closed form). A replica's step is its gradient (the same LoadImage,
DeformImage and ComputeGradient prices as an ASGD worker, host sharing
included), plus every ``fetch_every`` steps a fetch (each server copies its
shard out, the message crosses shared memory -- two copies -- and the
replica copies it in) and every ``push_every`` steps a push (pack, send;
the server receives it and applies SGD or Adagrad to its shard). A server
is a single queue (a fetch right after the replica's own push waits for
that push's apply: one sender's messages stay in order); its busy time per
replica step is

    b = (recv + apply) / push_every + (copy out + send) / fetch_every

for 1/S of the vector, so with R replicas its utilisation is
``rho = R b / T_step``; a fetch waits ``(R-1)/R rho b / (2 (1 - rho))``
on average (M/D/1 behind the other replicas' requests). At ``rho >= 1`` the
servers bound the job: ``images/s = N_Subbatch / b`` per server-queue.
Staleness of a push: the other R-1 replicas push ``1/push_every`` times per
step, during the steps between the push's last fetch and its apply (``gap``,
averaged over the fetch/push cycle): ``(R - 1) gap / push_every``.

Priced from copies, an uncontended fetch is far cheaper than it is: a
message above MPI's eager limit moves in steps that each wait for the other
side's next poll, and the server's numpy Adagrad costs more than its vector
passes. ``bench/ps_probe.py`` measures the three transport numbers -- an
uncontended fetch after the replica's own push, a push, and the server's
busy time per step -- with a real server and replica whose gradient is
free, and :func:`predict` takes them (``fetch_time``, ``push_time``,
``server_time``) in place of the priced ones; the compute and the queueing
stay the model's. :func:`simulate` plays R replicas and one shard queue out
event by event (the shards are symmetric).

With R > 1 replicas on one host a fetch costs far more than that queue
says: a push crosses to the server in rendezvous steps at the pushing
replica's 0.2 ms polls while the server, inside a blocking Recv, serves
nobody else, and with 1 + R ranks on fewer cores the replicas that must
poll wait for a core. No closed form here prices that; ``bench/ps_probe.py
--compute`` under 1 + R ranks measures it (R real replicas pushing a free
gradient and computing a thrown-away digits gradient per step), and
:func:`predict` takes that fetch with ``fetch_contended=True``: the probed
fetch already holds its wait behind the other replicas, so the M/D/1 wait
is not added again.

Sandblaster's model is :mod:`engine.perf.sandblaster`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.argtypes import nonneg_int, positive_int
from engine import spec as spec_mod
from engine.errors import counted

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


def positive_ints(**kw):
    for name, v in kw.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name.replace('_', ' ')} must be a positive int, got {v!r} "
                             f"(--{name.replace('_', '-')})")


class Prices:
    """What both DistBelief models price the same way: a replica's gradient
    of ``n_subbatch`` samples (an ASGD worker's LoadImage, DeformImage and
    ComputeGradient, host sharing included) and the vector moves, where a
    message crosses shared memory as two copies."""

    def __init__(self, spec, replicas, n_subbatch, profile, ranks_per_host=1):
        from .model import N_FILE, step_costs
        self.spec = spec_mod.get_spec(spec)
        self.profile = profile
        c = step_costs(self.spec, replicas, 1, n_subbatch, profile, ranks_per_host=ranks_per_host)
        self.n = spec_mod.n_params(self.spec)
        self.slow = c["_slowdown"][0]
        self.gradient = {"LoadImage": c["load"][0], "DeformImage": c["deform"][0],
                         "ComputeGradient": c["compute_gradient"][0]}
        self.n_file = N_FILE.get(self.spec.name, 50000)

    def copy(self, m):
        pr = self.profile
        return self.slow * pr.term("copy_cold" if pr.has("copy_cold") else "copy", m)

    def vec(self, m, name="axpy"):
        return self.slow * self.profile.term(name, m)

    def send(self, m):
        return 2 * self.copy(m)


def predict(spec, n_node: int, n_gpu: int = 1, n_subbatch: int = 32, profile=None, servers: int = 1,
            fetch_every: int = 1, push_every: int = 1, server_opt: str = "adagrad", n_file=None,
            ranks_per_host: int = 1, round_trip: float | None = None, fetch_time: float | None = None,
            push_time: float | None = None, server_time: float | None = None, fetch_contended: bool = False,
            epoch_end: float = 0.0, **_ignored) -> DownpourPrediction:
    """Downpour with ``n_node`` replicas (one worker each) and ``servers``
    shards; ``ranks_per_host`` replicas share one host's cores (all of them
    when validating on one machine); ``round_trip`` seconds from a fetch
    request to its reply beyond the copies (None: POLL, an idle host).

    Measured instead of priced, where given (bench/ps_probe.py runs a real
    server and replica whose gradient is free, at fetch_every = push_every
    = 1): ``fetch_time`` an uncontended fetch after the replica's push,
    ``push_time`` a push, ``server_time`` the server's busy seconds per
    replica step. The queueing of R replicas is still the model's, unless
    ``fetch_contended``: ``fetch_time`` was measured with the R replicas
    pushing and computing beside each other (bench/ps_probe.py --compute
    under 1+R ranks), which already holds what a fetch waits behind the
    others' pushes, so no queue wait is added to it. ``epoch_end``: seconds
    server 0 spends at each epoch's end evaluating the test set and writing
    the checkpoint, serving nobody: every replica's next fetch waits for it,
    so an epoch lasts that much longer (images/s and T_Epoch include it;
    ``t_step`` is the steady step)."""
    from .profile import Profile
    if profile is None:
        profile = Profile.load()
    positive_ints(servers=servers, fetch_every=fetch_every, push_every=push_every)
    if server_opt not in APPLY_PASSES:
        raise ValueError(f"server optimizer must be one of {sorted(APPLY_PASSES)}, got {server_opt!r}")
    R, S = int(n_node), int(servers)
    pr = Prices(spec, R, n_subbatch, profile, ranks_per_host)
    sp, n, copy, vec, send = pr.spec, pr.n, pr.copy, pr.vec, pr.send
    ns = n / S
    rt = POLL if round_trip is None else float(round_trip)
    replica = {**pr.gradient, "Accumulate": vec(n, "add")}
    srv = {"ReceivePush": send(ns) / push_every, "Apply": APPLY_PASSES[server_opt] * vec(ns) / push_every,
           "ReplyFetch": (copy(ns) + send(ns)) / fetch_every}
    # MPI keeps one sender's messages in order: a fetch right after the
    # replica's own push is served once that push is applied
    lcm = fetch_every * push_every // math.gcd(fetch_every, push_every)
    own = max(0.0, (srv["ReceivePush"] + srv["Apply"]) * push_every - rt / 2) * fetch_every / lcm
    if server_time is not None:
        srv = {"Measured": float(server_time)}
    b = sum(srv.values())
    fetch0 = copy(n) + rt + own if fetch_time is None else float(fetch_time)
    push0 = copy(n) if push_time is None else float(push_time)
    t_fixed = sum(replica.values()) + fetch0 / fetch_every + push0 / push_every
    bound = R * b >= t_fixed            # offered load >= 1: the servers set the pace
    # M/D/1 wait of a fetch behind the other R - 1 replicas' requests (its
    # own push is already in fetch0): a single replica never queues
    wait = (lambda t: 0.0) if fetch_contended and fetch_time is not None else \
        (lambda t: (R - 1) / R * (R * b / t) * b / (2 * (1 - R * b / t)))
    if bound:
        t = R * b
        rho = R * b / t_fixed
        w = t - t_fixed
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
    replica["Fetch"] = (fetch0 + w) / fetch_every if not bound else fetch0 / fetch_every + (t - t_fixed)
    replica["Push"] = push0 / push_every
    n_file = n_file or pr.n_file
    ips = n_file / (n_file * t / (R * n_subbatch) + float(epoch_end))
    return DownpourPrediction(model=sp.name, servers=S, replicas=R, n_subbatch=n_subbatch, n_param=n,
                              n_file=n_file, fetch_every=fetch_every, push_every=push_every,
                              server_opt=server_opt, replica=replica, server=srv, t_step=t, rho=rho,
                              images_per_s=ips, staleness=(R - 1) * _gap(fetch_every, push_every) / push_every,
                              t_epoch=n_file / ips, server_bound=bound,
                              extra={"slowdown": pr.slow, "round_trip": rt, "fetch_contended": bool(fetch_contended),
                                     "epoch_end": float(epoch_end)})


def term_lines(title, terms: dict, extra=()) -> list:
    """A titled block of 'name  x.xxx ms' lines (both models print theirs so)."""
    return [title] + [f"  {k:<16}{1e3 * v:9.3f} ms" for k, v in terms.items()] + list(extra)


def format_prediction(p: DownpourPrediction, per_layer: bool = True, **_ignored) -> str:
    ms = lambda s: f"{1e3 * s:9.3f} ms"
    lines = [f"downpour {p.model}: {counted(p.servers, 'server')} x {counted(p.replicas, 'replica')}, "
             f"N_Subbatch {p.n_subbatch}, "
             f"N_Param {p.n_param:,}, {p.server_opt}, fetch every {p.fetch_every}, push every {p.push_every}",
             *term_lines("replica step (per step):", p.replica),
             *term_lines("one server (busy time per replica step):", p.server)]
    lines.append(f"T_step {ms(p.t_step)}   server utilisation {p.rho:.2f}"
                 f"{'  (server-bound)' if p.server_bound else ''}   images/s {p.images_per_s:,.0f}   "
                 f"staleness {p.staleness:.2f}   T_Epoch {p.t_epoch:.3g} s")
    return "\n".join(lines)




# ---- discrete-event simulation -------------------------------------------------
class Simulation(dict):
    """A simulation's numbers, its closed form under ``prediction``."""

    def as_dict(self) -> dict:
        return {k: (v.as_dict() if hasattr(v, "as_dict") else v) for k, v in self.items()}


def simulate(spec, n_node: int, n_gpu: int = 1, n_subbatch: int = 32, profile=None, steps: int = 40,
             seed: int = 0, cv: float | None = None, **kw) -> Simulation:
    """R replicas and one shard's FIFO queue played out for ``steps`` steps
    per replica (the S shards are symmetric: each sees every request with
    1/S of the vector). A replica's compute varies by ``cv`` (gamma; None:
    the profile's measured SGEMM spread, 0.1 without one); the
    server serves in arrival order, so a push's staleness is the pushes that
    arrived between its fetch's service and its own. Returns images/s,
    staleness, utilisation and the mean fetch time, beside the closed form."""
    import heapq

    import numpy as np
    p = predict(spec, n_node, n_gpu, n_subbatch, profile, **kw)
    R, fe, pe = p.replicas, p.fetch_every, p.push_every
    rng = np.random.default_rng(seed)
    t_grad = sum(v for k, v in p.replica.items() if k not in ("Fetch", "Push"))
    copy_n = p.replica["Push"] * pe                  # one copy of the whole vector
    if "Measured" in p.server:          # measured per step at fe = pe = 1: one reply and one push
        c_fetch = c_push = p.server["Measured"] / 2
    else:
        c_fetch, c_push = p.server["ReplyFetch"] * fe, (p.server["ReceivePush"] + p.server["Apply"]) * pe
    rt = p.extra["round_trip"]
    if cv is None:
        from .profile import Profile
        cv = Profile.resolve(profile).cv("sgemm") or 0.1
    shape = 1.0 / cv ** 2 if cv > 0 else None
    draw = (lambda: t_grad * rng.gamma(shape, 1.0 / shape)) if shape else (lambda: t_grad)
    free, pushes, busy, fetch_wait, n_fetch, t_end = 0.0, 0, 0.0, 0.0, 0, 0.0
    fetched, asked, stale = [0] * R, [0.0] * R, []
    events, order = [], [0]

    def at(t, *what):
        order[0] += 1
        heapq.heappush(events, (t, order[0], *what))

    def compute(t, i, k):
        t += draw()
        if (k + 1) % pe == 0:                        # push: the replica goes on at once
            t += copy_n
            at(t, "push", i, k)
        at(t, "step", i, k + 1)

    for i in range(R):
        at(0.0, "step", i, 0)
    while events:
        t, _, kind, i, k = heapq.heappop(events)
        if kind == "step":
            if k == steps:
                t_end = max(t_end, t)
            elif k % fe == 0:                        # the request reaches the polling server
                asked[i] = t
                at(t + rt / 2, "fetch", i, k)
            else:
                compute(t, i, k)
        elif kind == "fetch":
            free = max(t, free) + c_fetch
            busy += c_fetch
            fetched[i] = pushes
            done = free + rt / 2 + copy_n
            fetch_wait += done - asked[i]
            n_fetch += 1
            compute(done, i, k)
        else:
            free = max(t, free) + c_push
            busy += c_push
            stale.append(pushes - fetched[i])
            pushes += 1
    t_end = max(t_end, free)
    return Simulation(replicas=R, servers=p.servers, steps=steps, cv=cv, time=t_end,
                      images_per_s=R * steps * p.n_subbatch / t_end,
                      staleness=float(np.mean(stale)) if stale else 0.0, utilisation=busy / t_end,
                      fetch_s=fetch_wait / max(n_fetch, 1), prediction=p)


def format_simulation(sim: dict, explain_terms: bool = False, **_ignored) -> str:
    p = sim["prediction"]
    rows = [("images/s", sim["images_per_s"], p.images_per_s, ",.0f"),
            ("staleness", sim["staleness"], p.staleness, ".2f"),
            ("server utilisation", sim["utilisation"], min(p.rho, 1.0), ".2f"),
            ("fetch ms", 1e3 * sim["fetch_s"], 1e3 * p.replica["Fetch"] * p.fetch_every, ".3f")]
    lines = [f"downpour {p.model}: {counted(p.servers, 'server')} x {counted(p.replicas, 'replica')}, "
             f"N_Subbatch {p.n_subbatch}: {counted(sim['steps'], 'step')} per replica simulated ({sim['time']:.4g} s)",
             f"{'':<20}{'simulated':>12}{'closed form':>14}"]
    lines += [f"{name:<20}{format(a, f):>12}{format(b, f):>14}" for name, a, b, f in rows]
    return "\n".join(lines)


# ---- `sprint predict | simulate --parallel downpour` ----------------------------
def add_cli_arguments(parser):
    add_server_arguments(parser)
    add_once(parser, "--fetch-every", type=positive_int, default=1,
             help="downpour: replicas fetch every n steps (default 1)")
    add_once(parser, "--push-every", type=positive_int, default=1,
             help="downpour: replicas push every n steps (default 1)")
    add_once(parser, "--server-opt", choices=sorted(APPLY_PASSES), default="adagrad",
             help="downpour: the servers' optimizer (default adagrad)")


def add_server_arguments(parser):
    """The options both DistBelief models take."""
    add_once(parser, "--servers", type=positive_int, default=1,
             help="downpour, sandblaster: parameter-server ranks S (default 1)")
    add_once(parser, "--round-trip", type=float, default=None,
             help="downpour, sandblaster: seconds from a request to its reply beyond the copies "
                  "(default: one polling interval, an idle host; bench/distbelief_bench.py measures it)")


def add_simulate_arguments(parser):
    add_once(parser, "--steps", type=positive_int, default=40,
             help="downpour: simulated steps per replica (default 40)")
    add_once(parser, "--seed", type=nonneg_int, default=0, help="seed of the simulated steps (default 0)")
    add_once(parser, "--cv", type=float, default=None, help="spread of every step (default: measured)")


def cli_kwargs(args) -> dict:
    kw = {"servers": args.servers, "fetch_every": args.fetch_every, "push_every": args.push_every,
          "server_opt": args.server_opt, "round_trip": args.round_trip}
    if hasattr(args, "steps"):
        kw.update(steps=args.steps, seed=args.seed, cv=args.cv)
    return kw


def add_once(parser, flag, **kw):
    """Add ``flag`` unless another strategy's module already did (both
    DistBelief models take --servers and --round-trip)."""
    if flag not in getattr(parser, "_option_string_actions", {}):
        parser.add_argument(flag, **kw)
