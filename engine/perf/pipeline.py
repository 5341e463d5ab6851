"""Cost model and simulator of pipelined model parallelism
(engine.parallel.pipeline): per-stage times from the machine profile, the
partition that balances them, the bubble and the throughput of each
schedule, and a discrete-event simulation of the instruction lists for up
to 64 stages (with replicas).

Per stage k (layers [lo, hi), micro-batch of b = ceil(B / M) samples):

* ``t_f[k]``, ``t_b[k]``: the profile's kernel times of those layers' forward
  and backward passes (engine.perf.model.compute_gradient_terms, the same
  rows the ASGD model prices), the softmax and loss on the last stage;
* ``t_u[k]``: the momentum update over the stage's slice (three passes over
  it, priced as the profile's vector ops), plus the allreduce of that slice
  among the D replicas;
* ``t_c[k]``: sending the stage's output activation (forward) or input
  gradient (backward) to a neighbour. Profiles have no point-to-point fit;
  it is priced as a two-rank allreduce of the same size (``p2p`` in the
  profile overrides: ``{"latency": s, "per_byte": s}``).

Closed forms (balanced stages, t = max_k(t_f + t_b)): gpipe's mini-batch
takes (M + K - 1) t plus the update, so its bubble is (K-1)/(M+K-1); 1f1b
and dualpipe keep every stage busy in steady state, one micro-batch per
max_k(t_f + t_b + t_u), and pay a fill/drain only at each epoch's flush.
The simulator plays the real instruction lists (pipeline_schedule) with
these durations; with ``cores`` (a CPU host shared by the ranks) the
running stages share the cores (processor sharing), which is how the
ranks of a one-machine run actually progress.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from engine import spec as spec_mod
from engine.parallel import pipeline_schedule as S


def _profile(profile):
    if profile is None:
        from .profile import Profile
        profile = Profile.load()
    return profile


def layer_times(spec, n: int, profile=None) -> list:
    """[(layer, t_fwd, t_bwd)] for a batch of ``n`` on ``profile``."""
    from .model import compute_gradient_terms
    profile = _profile(profile)
    sp = spec_mod.get_spec(spec)
    acc = {g.name: [0.0, 0.0] for g in spec_mod.layers(sp)}
    for name, pas, _kern, _size, t in compute_gradient_terms(sp, n, profile):
        if pas == "fwd":
            acc[name][0] += t
        elif pas == "bwd":
            acc[name][1] += t
        else:                      # per-layer overhead, split over the passes
            acc[name][0] += t / 2
            acc[name][1] += t / 2
    return [(name, f, b) for name, (f, b) in acc.items()]


def balanced_partition(spec, K: int, batch: int, microbatches: int = 4, profile=None) -> list:
    """K contiguous layer ranges minimising the largest stage's predicted
    forward + backward time (ties: the smaller largest parameter slice)."""
    sp = spec_mod.get_spec(spec)
    geoms = spec_mod.layers(sp)
    n = len(geoms)
    if not 1 <= K <= n:
        raise ValueError(f"--stages must be between 1 and the {n} layers of {sp.name}, got {K}")
    b = max(1, math.ceil(batch / microbatches))
    cost = [f + bw for _, f, bw in layer_times(sp, b, profile)]
    mem = [g.n_params for g in geoms]
    pre_c, pre_m = [0.0], [0]
    for c, m in zip(cost, mem):
        pre_c.append(pre_c[-1] + c)
        pre_m.append(pre_m[-1] + m)
    INF = (math.inf, math.inf)
    # best[j][i]: (max stage time, max stage params) of layers [0, i) in j stages
    best = [[INF] * (n + 1) for _ in range(K + 1)]
    cut = [[0] * (n + 1) for _ in range(K + 1)]
    best[0][0] = (0.0, 0)
    for j in range(1, K + 1):
        for i in range(j, n - (K - j) + 1):
            for h in range(j - 1, i):
                prev = best[j - 1][h]
                if prev == INF:
                    continue
                cand = (max(prev[0], pre_c[i] - pre_c[h]), max(prev[1], pre_m[i] - pre_m[h]))
                if cand < best[j][i]:
                    best[j][i], cut[j][i] = cand, h
    parts, i = [], n
    for j in range(K, 0, -1):
        h = cut[j][i]
        parts.append((h, i))
        i = h
    return parts[::-1]


def p2p_time(profile, n_floats: int) -> float:
    p2p = profile.data.get("p2p")
    if p2p:
        return float(p2p["latency"]) + 4 * n_floats * float(p2p["per_byte"])
    try:
        return profile.allreduce_bw(2, n_floats)
    except ValueError:
        return 0.0


@dataclass
class StageCost:
    layers: tuple
    params: int
    t_f: float
    t_b: float
    t_u: float
    t_c: float          # one activation/gradient message to the next stage


def stage_costs(spec, parts, batch: int, microbatches: int, profile=None, replicas: int = 1) -> list:
    profile = _profile(profile)
    sp = spec_mod.get_spec(spec)
    geoms = spec_mod.layers(sp)
    b = max(1, math.ceil(batch / microbatches))
    lt = layer_times(sp, b, profile)
    vec = lambda name, n: profile.term(name, n) if profile.has(name) else 0.0
    out = []
    for lo, hi in parts:
        n_p = sum(g.n_params for g in geoms[lo:hi])
        t_u = vec("scale", n_p) + vec("sub", n_p) + vec("add", n_p)
        if replicas > 1:
            try:
                t_u += profile.allreduce_bw(replicas, n_p)
            except ValueError:
                pass
        act = b * spec_mod._prod(geoms[hi - 1].out_shape)
        out.append(StageCost(tuple(g.name for g in geoms[lo:hi]), n_p, sum(t[1] for t in lt[lo:hi]),
                             sum(t[2] for t in lt[lo:hi]), t_u, p2p_time(profile, act) if hi < len(geoms) else 0.0))
    return out


def simulate(costs, schedule: str, microbatches: int, n_mb: int, cores=None, overlap: float = 0.0) -> dict:
    """Play the stages' instruction lists over ``n_mb`` micro-batches.

    Returns makespan, per-stage busy time and bubble (idle share of the
    makespan). ``overlap``: share of the shorter pass of a dualpipe pair hidden
    under the longer (0 on a CPU rank, up to 1 with two GPU streams).
    ``cores``: None when each stage owns its processor, else the cores the
    running stages share equally."""
    K = len(costs)
    lists = [S.schedule(schedule, K, k, n_mb, microbatches) for k in range(K)]

    def work(k, op):
        c = costs[k]
        if op.kind == "F":
            return c.t_f
        if op.kind == "B":
            return c.t_b
        if op.kind == "FB":
            return max(c.t_f, c.t_b) + (1.0 - overlap) * min(c.t_f, c.t_b)
        return c.t_u

    pos = [0] * K
    f_ready = [dict() for _ in range(K)]      # (stage, mb) -> time its activation arrives at stage+1
    b_ready = [dict() for _ in range(K)]      # time the gradient from stage k arrives at k-1
    running = {}                               # k -> [remaining work, op]
    busy = [0.0] * K
    arrivals = []                              # heap of pending message arrival times
    now = 0.0

    def deps_met(k, op):
        if op.kind in ("F", "FB") and k > 0 and f_ready[k - 1].get(op.mb, math.inf) > now + 1e-15:
            return False
        bmb = op.mb2 if op.kind == "FB" else (op.mb if op.kind == "B" else None)
        if bmb is not None and k < K - 1 and b_ready[k + 1].get(bmb, math.inf) > now + 1e-15:
            return False
        return True

    while True:
        for k in range(K):
            if k not in running and pos[k] < len(lists[k]) and deps_met(k, lists[k][pos[k]]):
                op = lists[k][pos[k]]
                running[k] = [work(k, op), op]
        if not running:
            if all(pos[k] >= len(lists[k]) for k in range(K)):
                break
            if not arrivals:
                raise RuntimeError("pipeline simulation deadlocked")
            now = heapq.heappop(arrivals)
            continue
        rate = 1.0 if cores is None else min(1.0, cores / len(running))
        dt = min(r[0] for r in running.values()) / rate
        if arrivals and arrivals[0] < now + dt:
            dt = arrivals[0] - now
            heapq.heappop(arrivals)
        now += dt
        for k in list(running):
            r = running[k]
            r[0] -= dt * rate
            busy[k] += dt * rate
            if r[0] <= 1e-15:
                op = r[1]
                del running[k]
                pos[k] += 1
                c = costs[k]
                if op.kind in ("F", "FB") and k < K - 1:
                    f_ready[k][op.mb] = now + c.t_c
                    heapq.heappush(arrivals, now + c.t_c)
                bmb = op.mb2 if op.kind == "FB" else (op.mb if op.kind == "B" else None)
                if bmb is not None and k > 0:
                    t_c = costs[k - 1].t_c
                    b_ready[k][bmb] = now + t_c
                    heapq.heappush(arrivals, now + t_c)
    return {"makespan": now, "busy": busy, "bubble": [1.0 - b / now if now else 0.0 for b in busy]}


@dataclass
class PipelinePrediction:
    model: str
    stages: int
    replicas: int
    schedule: str
    microbatches: int
    batch: int
    partition: list
    costs: list
    bubble_gpipe: float            # (K-1)/(M+K-1)
    t_minibatch: float             # seconds per mini-batch of B (per replica), steady state
    throughput: float              # images per second, all replicas
    t_epoch: float
    bubble: list = field(default_factory=list)   # simulated, per stage
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d["costs"] = [vars(c) for c in self.costs]
        return d


def predict(spec, n_node: int = None, n_gpu: int = 1, n_subbatch: int = 32, profile=None, stages=None,
            replicas: int = 1, schedule: str = "gpipe", microbatches: int = 4, partition=None,
            n_file=None, cores=None, overlap: float = 0.0, n_mb=None, **_ignored) -> PipelinePrediction:
    """One configuration: ``stages`` x ``replicas`` ranks (``n_node`` when
    ``stages`` is not given), mini-batch ``n_subbatch`` per replica."""
    from .model import N_FILE
    profile = _profile(profile)
    sp = spec_mod.get_spec(spec)
    K = int(stages or (n_node or 1) // max(1, replicas))
    if partition is None:
        partition = balanced_partition(sp, K, n_subbatch, microbatches, profile)
    costs = stage_costs(sp, partition, n_subbatch, microbatches, profile, replicas)
    M = min(microbatches, n_subbatch)
    if n_mb is None:
        n_mb = M * max(4, math.ceil(2 * K / M))
    sim = simulate(costs, schedule, M, n_mb, cores=cores, overlap=overlap)
    t_mb = sim["makespan"] * M / n_mb
    if schedule != "gpipe":
        # steady state: the fill/drain is paid once per epoch, not per stream of n_mb
        fill = simulate(costs, schedule, M, 2 * n_mb, cores=cores, overlap=overlap)["makespan"] - sim["makespan"]
        t_mb = fill * M / n_mb
    n_file = n_file or N_FILE.get(sp.name, 50000)
    thr = replicas * n_subbatch / t_mb if t_mb > 0 else math.inf
    return PipelinePrediction(sp.name, K, replicas, schedule, M, n_subbatch, list(partition), costs,
                              (K - 1) / (M + K - 1), t_mb, thr, n_file / thr, sim["bubble"],
                              {"simulated_micro_batches": n_mb, "cores": cores, "overlap": overlap})


def format_prediction(p: PipelinePrediction, per_layer: bool = True, explain_terms: bool = False) -> str:
    from engine.parallel.stage import format_partition
    lines = [f"{p.model}: {p.stages} stage(s) x {p.replicas} replica(s), schedule {p.schedule}, "
             f"{p.microbatches} micro-batch(es) of mini-batch {p.batch}, partition {format_partition(p.partition)}",
             f"{'stage':>5} {'layers':<24}{'params':>12}{'fwd ms':>9}{'bwd ms':>9}{'upd ms':>9}"
             f"{'send ms':>9}{'bubble':>8}"]
    for k, c in enumerate(p.costs):
        lines.append(f"{k:>5} {','.join(c.layers):<24}{c.params:>12,}{1e3 * c.t_f:>9.3f}{1e3 * c.t_b:>9.3f}"
                     f"{1e3 * c.t_u:>9.3f}{1e3 * c.t_c:>9.3f}{100 * p.bubble[k]:>7.1f}%")
    lines.append(f"mini-batch {1e3 * p.t_minibatch:.3f} ms, {p.throughput:,.1f} img/s, T_Epoch "
                 f"{p.t_epoch:.4g} s; GPipe bubble (K-1)/(M+K-1) = {100 * p.bubble_gpipe:.1f} %")
    if explain_terms:
        lines.append("fwd/bwd: the stage's layers' kernels on one micro-batch (profile); upd: momentum "
                     "update of its slice (+ replica allreduce); send: one activation message; bubble: "
                     "idle share of a simulated stream")
    return "\n".join(lines)


def add_info_options(p):
    """``sprint info MODEL --stages K [--microbatches M] [--partition ...]``."""
    g = p.add_argument_group("pipeline (with --stages)")
    g.add_argument("--stages", type=int, default=None, help="show the partition into K pipeline stages")
    g.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per mini-batch (--batch; default min(4, batch))")
    g.add_argument("--partition", default=None, help="layer ranges to show instead of the balanced ones")
    g.add_argument("--schedule", choices=S.SCHEDULES, default="gpipe", help="schedule whose bubble is simulated")
    g.add_argument("--profile", default=None, help="machine profile JSON (default: the shipped one)")


def info_table(spec, args) -> str:
    """Each stage's layers, predicted time and memory, and the bubble."""
    from engine.parallel.stage import parse_partition
    from .profile import Profile
    sp = spec_mod.get_spec(spec)
    n = len(spec_mod.layers(sp))
    K = int(args.stages)
    if not 1 <= K <= n:
        raise ValueError(f"--stages must be between 1 and the {n} layers of {sp.name}, got {K}")
    m = args.microbatches or min(4, args.batch)
    if not 1 <= m <= args.batch:
        raise ValueError(f"--microbatches must be between 1 and --batch ({args.batch}), got {m}")
    parts = parse_partition(args.partition, n) if args.partition else None
    if parts is not None and len(parts) != K:
        raise ValueError(f"--partition has {len(parts)} stages, --stages says {K}")
    prof = Profile.load(args.profile)
    p = predict(sp, stages=K, n_subbatch=args.batch, profile=prof, schedule=args.schedule,
                microbatches=m, partition=parts)
    b = max(1, math.ceil(args.batch / p.microbatches))
    geoms = spec_mod.layers(sp)
    lines = [format_prediction(p)]
    lines.append(f"{'stage':>5}{'weights+grad+velocity MB':>26}{'activations MB (in flight)':>28}")
    for k, (lo, hi) in enumerate(p.partition):
        live = S.in_flight(S.schedule(p.schedule, K, k, 4 * K * p.microbatches, p.microbatches))
        act = sum(b * spec_mod._prod(g.out_shape) for g in geoms[lo:hi]) * 4 * live / 2 ** 20
        lines.append(f"{k:>5}{3 * 4 * p.costs[k].params / 2 ** 20:>26.2f}{act:>20.2f} ({live:>3})")
    lines.append(f"times from profile {prof.source}; with --predict stash each in-flight micro-batch also "
                 f"keeps a copy of its stage's weights")
    return "\n".join(lines)
