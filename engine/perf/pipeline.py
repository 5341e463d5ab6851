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
* ``executor`` (:class:`Executor`: by default the profile's ``pipeline``
  section, which ``sprint profile`` measures (engine.perf.pipeline_probe);
  zero, with a note, for a profile without one; its seconds rescale with
  the profile's ``time_scale``): what a pass costs inside the executor
  beyond its kernels. The profile is
  swept on warm caches, one kernel after another; inside a pipeline a pass
  starts after the rank slept in a receive's polling loop and ran its other
  passes and message copies, and its kernels re-load their data from colder
  caches: ``(1 + cold)`` x the profile's price (a pass timed alone after a
  0.5 ms sleep or after touching 8 MB takes 1.1-1.9x its warm time, more
  for the small ones), and x a factor per layer kind and direction
  (``conv_f``, ``conv_b``, ``other_f``, ``other_b``: fitted on the probe's
  stages that hold one kind only; the shipped CPU profile prices conv
  backwards 20-55 % above what they take inside the pipeline and the other
  passes within 20 %, so one factor for all cannot fit both). ``per_pass``: the executor's Python around each
  timed pass. :func:`executor_copies`: the executor's own passes over the
  stage's weights inside the timers (the trace's checksum, the stale copy,
  the gradient copy), priced as the profile's ``copy``. ``per_instruction``:
  the executor's untimed work around every instruction (posting receives,
  testing sends), ``t_x``. ``shared``: when the ranks outnumber the cores
  every pass and instruction costs ``(1 + shared)`` x beyond the queueing
  for cores the simulator plays: the waiting ranks' polls wake on the busy
  cores and evict the running pass's caches (2 passes on 2 cores run
  ~1.05-1.3x slower beside one polling process, measured).

Closed forms (balanced stages, t = max_k(t_f + t_b)): gpipe's mini-batch
takes (M + K - 1) t plus the update, so its bubble is (K-1)/(M+K-1); 1f1b
and dualpipe keep every stage busy in steady state, one micro-batch per
max_k(t_f + t_b + t_u), and pay a fill/drain only at each epoch's flush.
The simulator (engine.perf.pipeline_sim.play) plays the real instruction
lists (pipeline_schedule) with these durations; with ``cores`` (a CPU host
shared by the ranks) at most ``cores`` stages run at once, the others
waiting for a core (pipeline_sim: a pass is shorter than the OS scheduler's
time slice), which is how the ranks of a one-machine run progress.

The bottom of the module is this strategy's row of the strategy table
(engine.perf.strategies): ``sprint predict|simulate --parallel pipeline``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from engine import spec as spec_mod

from .pipeline_executor import KINDS, Executor, executor_copies, fit_executor, fit_kind_factors  # noqa: F401
from .pipeline_sim import closed_form, play


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


def p2p_table(profile):
    """The profile's point-to-point table: a top-level ``p2p`` (an override)
    or its ``pipeline`` section's; None when it has neither."""
    return profile.data.get("p2p") or (profile.data.get("pipeline") or {}).get("p2p")


def p2p_time(profile, n_floats: int) -> float:
    """One message of ``n_floats`` between neighbouring stages: the ``p2p``
    table a ping-pong measured (``{"bytes": [...], "times": [...]}``,
    interpolated, extrapolated from its last two points) or its linear fit
    (``{"latency": s, "per_byte": s}``), rescaled with the profile's times
    (``time_scale``); else a two-rank allreduce."""
    p2p, k = p2p_table(profile), profile.time_scale
    if p2p and "bytes" in p2p:
        import numpy as np
        x, y, b = list(map(float, p2p["bytes"])), list(map(float, p2p["times"])), 4.0 * n_floats
        if b > x[-1] and len(x) > 1:
            return k * (y[-1] + (b - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2]))
        return k * float(np.interp(b, x, y))
    if p2p:
        return k * (float(p2p["latency"]) + 4 * n_floats * float(p2p["per_byte"]))
    try:
        return profile.allreduce_bw(2, n_floats)
    except ValueError:
        return 0.0


def rendezvous_time(profile, n_floats: int) -> float:
    """The handshake part of a message above MPI's eager size (the p2p
    table's ``eager_bytes``): its time beyond a small message's. Its data
    moves only when the sender calls MPI again, so a sender that starts its
    next pass before the handshake is done holds it until that pass ends
    (engine.perf.pipeline_sim.play); 0 for an eager message."""
    p2p = p2p_table(profile) or {}
    if "eager_bytes" not in p2p or 4 * n_floats <= float(p2p["eager_bytes"]):
        return 0.0
    return max(0.0, p2p_time(profile, n_floats) - profile.time_scale * float(p2p["times"][0]))


@dataclass
class StageCost:
    layers: tuple
    params: int
    t_f: float
    t_b: float
    t_u: float
    t_c: float          # one activation/gradient message to the next stage
    t_x: float = 0.0    # the executor's untimed work around every instruction
    t_h: float = 0.0    # t_c's rendezvous handshake (rendezvous_time; 0: an eager message)


def kind_split(geoms, lt, lo, hi):
    """((conv, other) forward, (conv, other) backward) kernel seconds of
    layers [lo, hi) (``lt``: layer_times' rows)."""
    conv = [g.kind == "conv" for g in geoms[lo:hi]]
    pick = lambda i, c: sum(t[i] for t, is_c in zip(lt[lo:hi], conv) if is_c == c)
    return (pick(1, True), pick(1, False)), (pick(2, True), pick(2, False))


def stage_costs(spec, parts, batch: int, microbatches: int, profile=None, replicas: int = 1,
                executor: Executor = None, schedule: str = "gpipe", predict_mode: str = "none",
                oversubscribed: bool = False) -> list:
    """Each stage's StageCost; ``oversubscribed``: the ranks outnumber the
    cores (the executor's ``shared`` slowdown applies)."""
    profile = _profile(profile)
    ex = (executor or Executor()).scaled(profile.time_scale)
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
        t_f, t_b = sum(t[1] for t in lt[lo:hi]), sum(t[2] for t in lt[lo:hi])
        sh = 1.0 + (ex.shared if oversubscribed else 0.0)
        if executor is not None:
            n_f, n_b = executor_copies(schedule, predict_mode)
            kf, kb = kind_split(geoms, lt, lo, hi)
            t_f = sh * (ex.kernels(kf[0], kf[1], "f") + n_f * vec("copy", n_p) + ex.per_pass)
            t_b = sh * (ex.kernels(kb[0], kb[1], "b") + n_b * vec("copy", n_p) + ex.per_pass)
        out.append(StageCost(tuple(g.name for g in geoms[lo:hi]), n_p, t_f, t_b, sh * t_u,
                             p2p_time(profile, act) if hi < len(geoms) else 0.0, sh * ex.per_instruction,
                             rendezvous_time(profile, act) if hi < len(geoms) else 0.0))
    return out


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


def weight_costs(costs, profile, schedule: str, predict_mode: str) -> list:
    """Costs with what ``--predict`` adds to each pass (engine.parallel.
    pipeline.StageExecutor._weights_for): stash copies the weights at each
    forward; spectrain copies them and adds s times the velocity (a scale
    and an add) before the forward and again before the backward."""
    if predict_mode in (None, "none") or schedule == "gpipe":
        return costs
    vec = lambda name, n: profile.term(name, n) if profile.has(name) else 0.0
    out = []
    for c in costs:
        copy = vec("copy", c.params)
        if predict_mode == "stash":
            out.append(replace(c, t_f=c.t_f + copy))
        else:
            extra = copy + vec("scale", c.params) + vec("add", c.params)
            out.append(replace(c, t_f=c.t_f + extra, t_b=c.t_b + extra))
    return out


def shared_cores(profile, n_ranks: int, ranks_per_host: int = 1, cores=None):
    """The processors the simulated stages share: ``cores`` if given; else,
    when ``ranks_per_host`` > 1 ranks share a host of the profile's cores,
    the pool of all such hosts (every running stage gets an equal share);
    else None (each stage its own processor)."""
    if cores is not None or ranks_per_host <= 1:
        return cores
    return profile.cores * n_ranks / min(ranks_per_host, n_ranks)


def predict(spec, n_node: int = None, n_gpu: int = 1, n_subbatch: int = 32, profile=None, stages=None,
            replicas: int = 1, schedule: str = "gpipe", microbatches: int = 4, partition=None,
            n_file=None, cores=None, overlap: float = 0.0, n_mb=None, predict_mode: str = "none",
            ranks_per_host: int = 1, executor=None, **_ignored) -> PipelinePrediction:
    """One configuration: ``stages`` x ``replicas`` ranks (``n_node`` when
    ``stages`` is not given), mini-batch ``n_subbatch`` per replica."""
    from .model import N_FILE
    profile = _profile(profile)
    sp = spec_mod.get_spec(spec)
    replicas = max(1, int(replicas or 1))
    K = int(stages or (n_node or 1) // replicas)
    if partition is None:
        partition = balanced_partition(sp, K, n_subbatch, microbatches, profile)
    notes = []
    if executor is not None and not isinstance(executor, Executor):
        executor = Executor.load(executor)
    if executor is None:
        executor = Executor.of_profile(profile)
        if executor is None:
            notes.append(f"{profile.source} has no pipeline section (written before profiles measured the "
                         "pipeline executor): stage times are its kernels alone, without the executor's own "
                         "costs per pass and instruction (on the CPU host they measured 0.1-0.3 ms a pass) "
                         + ("or a measured message table" if p2p_table(profile) is None else "")
                         + "; `sprint profile --update PROFILE` adds it")
    cores = shared_cores(profile, K * replicas, ranks_per_host, cores)
    over = cores is not None and K * replicas > cores
    costs = stage_costs(sp, partition, n_subbatch, microbatches, profile, replicas, executor, schedule,
                        predict_mode, over)
    costs = weight_costs(costs, profile, schedule, predict_mode)
    M = min(microbatches, n_subbatch)
    if n_mb is None:
        n_mb = M * max(4, math.ceil(2 * K / M))
    sim = play(costs, schedule, M, n_mb, cores=cores, overlap=overlap)
    t_mb = sim["makespan"] * M / n_mb
    if schedule != "gpipe":
        # steady state: the fill/drain is paid once per epoch, not per stream of n_mb
        fill = play(costs, schedule, M, 2 * n_mb, cores=cores, overlap=overlap)["makespan"] - sim["makespan"]
        t_mb = fill * M / n_mb
    n_file = n_file or N_FILE.get(sp.name, 50000)
    thr = replicas * n_subbatch / t_mb if t_mb > 0 else math.inf
    return PipelinePrediction(sp.name, K, replicas, schedule, M, n_subbatch, list(partition), costs,
                              (K - 1) / (M + K - 1), t_mb, thr, n_file / thr, sim["bubble"],
                              {"simulated_micro_batches": n_mb, "cores": cores, "overlap": overlap,
                               "predict": predict_mode or "none",
                               "executor": vars(executor) if executor is not None else None,
                               "notes": notes})


@dataclass
class PipelineSimulation:
    prediction: PipelinePrediction
    closed: dict                  # pipeline_sim.closed_form
    sim: dict                     # pipeline_sim.play over the stream
    minibatches: int
    cv: float
    seed: int
    wall_s: float

    @property
    def closed_stream(self) -> float:
        """The closed form of the whole simulated stream: gpipe pays its
        fill/drain in every mini-batch; 1f1b and dualpipe once, when the
        first micro-batch crosses every stage and back."""
        return self.minibatches * self.closed["t_minibatch"] + self.closed["fill_drain"]

    def as_dict(self) -> dict:
        return {"simulation": dict(self.sim, minibatches=self.minibatches, cv=self.cv, seed=self.seed,
                                   wall_s=self.wall_s),
                "closed_form": dict(self.closed, stream=self.closed_stream),
                "prediction": self.prediction.as_dict()}


def simulate(spec, n_node: int = None, n_gpu: int = 1, n_subbatch: int = 32, profile=None, updates: int = 50,
             cv: float = 0.0, seed: int = 0, **kw) -> PipelineSimulation:
    """Play ``updates`` mini-batches of the configuration ``predict`` prices
    (its costs, partition and core sharing), each pass's duration drawn with
    spread ``cv``, beside the closed forms."""
    import time
    if updates < 1:
        raise ValueError(f"--updates must be >= 1, got {updates}")
    if cv is not None and cv < 0:
        raise ValueError(f"--cv must be >= 0, got {cv}")
    t0 = time.perf_counter()
    p = predict(spec, n_node, n_gpu, n_subbatch, profile, **kw)
    cores, overlap = p.extra["cores"], p.extra["overlap"]
    sim = play(p.costs, p.schedule, p.microbatches, updates * p.microbatches, cores, overlap, cv or 0.0, seed)
    cf = closed_form(p.costs, p.schedule, p.microbatches, cores, overlap)
    return PipelineSimulation(p, cf, sim, updates, cv or 0.0, seed, time.perf_counter() - t0)


# The command-line half of this strategy's row in the strategy table
# (engine.perf.strategies), `sprint info --stages` and the printed tables,
# kept apart for size.
from .pipeline_cli import (add_cli_arguments, add_info_options, add_simulate_arguments,  # noqa: E402,F401
                           cli_kwargs, format_prediction, format_simulation, info_table)
