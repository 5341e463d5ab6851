"""Cost model of Sandblaster L-BFGS (engine.parallel.sandblaster), beside
Downpour's (engine.perf.downpour, whose prices it shares).

One L-BFGS batch of B samples costs E evaluations of the objective and its
gradient -- on mini-batches the gradient at the current point plus one per
line-search trial (E = 1 + trials); on the full batch the accepted trial's
gradient is the next iteration's (E = trials) -- plus the shards' vector work
and the coordinator's commands.

An evaluation cuts B into K = ceil(B / slice) slices. Replica i spends

    t_i = task + f_i * gradient(slice) + push

on a slice: a request round trip to the coordinator, its gradient (f_i is its
slow factor, ``--slow-rank/--slow-factor``: the engine sleeps (f-1) x the
gradient's time) and packing and sending the slice gradient; it also fetches
the evaluation point once per evaluation. Handed out on request (the
engine's default) the K slices take

    T = (K - R)+ / sum_i (1 / t_i) + tail,

the last slice's tail being the fastest replica's ``min t_i`` when a late
slice is copied to an idle replica (backup tasks: the first result wins),
``max t_i`` without. A static split (``--slice B/R --no-backup``) gives each
replica one slice of B/R: ``T = max_i t_i(B/R)``. Each shard receives and
accumulates every slice (one send and one float64 add of 1/S of the vector)
and server 0 also handles three messages per slice as coordinator: an
evaluation takes at least K times that (server-bound). :func:`simulate`
plays the dispatch out event by event (:func:`simulate_eval`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.argtypes import nonneg_int, positive_int

from .downpour import POLL, Prices, Simulation, add_once, add_server_arguments, positive_ints, term_lines
from engine.errors import counted

# Busy seconds of server 0 per coordinator message (an mpi4py Iprobe and
# Recv or Isend and the handler's bookkeeping): an estimate for one core of
# this class of machine, not fitted; it only matters when slices are tiny.
MSG = 2e-5


@dataclass
class SandblasterPrediction:
    model: str
    servers: int
    replicas: int
    batch: int
    slice: int
    n_slices: int
    n_param: int
    n_file: int
    factors: list
    backup: bool
    static: bool
    evaluations: float       # objective + gradient evaluations per L-BFGS batch
    replica: dict            # step -> seconds per slice, nominal replica
    server: dict             # step -> busy seconds per slice at one shard (+ the coordinator at server 0)
    t_slice: list            # seconds per slice of each replica
    t_eval: float
    t_batch: float
    images_per_s: float
    t_epoch: float
    rho: float               # server 0's busy share during an evaluation
    server_bound: bool
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def eval_time(n_slices: int, t_slice: float, factors, backup: bool = True, static: bool = False,
              overhead: float = 0.0) -> float:
    """Closed form: seconds to evaluate ``n_slices`` slices on replicas whose
    slice takes ``overhead + f_i t_slice`` (static: replica i takes every
    R-th slice from the i-th)."""
    t = [overhead + float(f) * t_slice for f in factors]
    if static:
        return max(x * len(range(i, n_slices, len(t))) for i, x in enumerate(t))
    rate = sum(1.0 / x for x in t)
    return max(n_slices - len(t), 0) / rate + (min(t) if backup else max(t))


def simulate_eval(n_slices: int, t_slice: float, factors, backup: bool = True, static: bool = False,
                  overhead: float = 0.0) -> dict:
    """Discrete-event play of one evaluation: slices handed to whichever
    replica is free first, a late slice copied to an idle replica once out
    longer than a nominal slice (the first copy wins), or a static split
    (every R-th slice)."""
    f = [float(x) for x in factors]
    R = len(f)
    if static:
        per = [len(range(i, n_slices, R)) for i in range(R)]
        return {"time": max(p * (f[i] * t_slice + overhead) for i, p in enumerate(per)), "duplicates": 0,
                "slices": per}
    free = [0.0] * R
    finish, start = {}, {}
    done_by = [0] * R
    for s in range(n_slices):
        i = min(range(R), key=lambda j: free[j])
        start[s] = free[i] + overhead
        free[i] = finish[s] = start[s] + f[i] * t_slice
        done_by[i] += 1
    dup = 0
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


def replica_factors(replicas, servers=1, slow_rank=None, slow_factor=2.0, factors=None) -> list:
    """Each replica's slow factor: ``factors`` as given, or MPI rank
    ``slow_rank`` (a replica: ranks servers.. ) slowed by ``slow_factor``."""
    if factors is not None:
        f = [float(x) for x in factors]
        if len(f) != replicas or not all(x >= 1 for x in f):
            raise ValueError(f"factors must be {replicas} numbers >= 1, got {factors!r}")
        return f
    f = [1.0] * replicas
    if slow_rank is not None:
        if not servers <= int(slow_rank) < servers + replicas:
            raise ValueError(f"--slow-rank {slow_rank} is not a replica: replicas are MPI ranks {servers}.."
                             f"{servers + replicas - 1} (--slow-rank)")
        if not slow_factor >= 1:
            raise ValueError(f"slow factor must be >= 1, got {slow_factor} (--slow-factor)")
        f[int(slow_rank) - servers] = float(slow_factor)
    return f


def predict(spec, n_node: int, n_gpu: int = 1, n_subbatch: int = 32, profile=None, servers: int = 1,
            batch: int | None = None, slice: int | None = None, history: int = 10, backup: bool = True,
            static: bool = False, slow_rank=None, slow_factor: float = 2.0, factors=None, trials: float = 1.0,
            full_batch: bool | None = None, n_file=None, ranks_per_host: int = 1,
            round_trip: float | None = None, fetch_time: float | None = None, push_time: float | None = None,
            server_time: float | None = None, **_ignored) -> SandblasterPrediction:
    """Sandblaster with ``n_node`` replicas and ``servers`` shards: L-BFGS
    batches of ``batch`` samples (default 16 slices) in slices of ``slice``
    (default ``n_subbatch``); ``static`` prices the 1/R split baseline;
    ``trials`` line-search evaluations per batch (1 when the first step is
    accepted, as it mostly is).

    Measured instead of priced, where given (Downpour's transport through
    the same polling loops, bench/ps_probe.py): ``fetch_time`` one fetch of
    the point (the whole vector), ``push_time`` a replica's send of a slice
    gradient, ``server_time`` server 0's busy seconds per slice gradient it
    receives (the whole vector crossing in rendezvous steps while it sits in
    a blocking Recv, then one pass over it), and ``round_trip`` a request's
    round trip."""
    from .profile import Profile
    if profile is None:
        profile = Profile.load()
    R, S = int(n_node), int(servers)
    slice = int(n_subbatch if slice is None else slice)
    batch = int(16 * slice if batch is None else batch)
    positive_ints(servers=S, replicas=R, slice=slice, batch=batch, history=history)
    if not trials >= 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    f = replica_factors(R, S, slow_rank, slow_factor, factors)
    if static:
        slice, backup = math.ceil(batch / R), False
    K = math.ceil(batch / slice)
    pr = Prices(spec, R, slice, profile, ranks_per_host)
    n, ns = pr.n, pr.n / S
    rt = POLL if round_trip is None else float(round_trip)
    grad = sum(pr.gradient.values())
    replica = {"Task": rt + 2 * MSG, **pr.gradient,
               "Push": pr.vec(n, "scale") + pr.copy(n) if push_time is None else float(push_time)}
    fetch = pr.copy(n) + rt if fetch_time is None else float(fetch_time)   # once per replica and evaluation
    over = replica["Task"] + replica["Push"]
    t_i = [over + x * grad for x in f]
    t_eval = fetch + eval_time(K, grad, f, backup=backup, static=static, overhead=over)
    # server 0: its shard's receive and float64 accumulate, and the coordinator
    server = {"ReceiveSlice": pr.send(ns), "Accumulate": 2 * pr.vec(ns, "add"), "Coordinate": 3 * MSG}
    if server_time is not None:
        server = {"Measured": float(server_time) / S, "Coordinate": 3 * MSG}
    b0 = sum(server.values())
    bound = K * b0 >= t_eval
    t_eval = max(t_eval, K * b0)
    m = int(history)
    # per evaluation: the point x + t d, the gradient's scale and two dot
    # products, a command and its reply; per batch: the Gram row and column
    # (2m + 1 dots), the direction (2m + 1 axpys) and the accepted pair
    v_eval = 4 * pr.vec(ns) + rt
    v_batch = (4 * m + 4) * pr.vec(ns) + 2 * rt
    n_file = n_file or pr.n_file
    full = batch >= n_file if full_batch is None else bool(full_batch)
    E = trials if full else 1 + trials
    t_batch = E * (t_eval + v_eval) + v_batch
    ips = batch / t_batch
    return SandblasterPrediction(model=pr.spec.name, servers=S, replicas=R, batch=batch, slice=slice, n_slices=K,
                                 n_param=n, n_file=n_file, factors=f, backup=backup, static=static, evaluations=E,
                                 replica=replica, server=server, t_slice=t_i, t_eval=t_eval, t_batch=t_batch,
                                 images_per_s=ips, t_epoch=max(n_file, batch) / ips, rho=min(K * b0 / t_eval, 1.0),
                                 server_bound=bound, extra={"slowdown": pr.slow, "round_trip": rt, "fetch": fetch,
                                                            "gradient": grad, "overhead": over})


def format_prediction(p: SandblasterPrediction, per_layer: bool = True, **_ignored) -> str:
    ms = lambda s: f"{1e3 * s:9.3f} ms"
    how = "static 1/R split" if p.static else ("slices on request, backup tasks" if p.backup
                                               else "slices on request")
    lines = [f"sandblaster {p.model}: {counted(p.servers, 'server')} x {counted(p.replicas, 'replica')}, L-BFGS "
             f"batch {p.batch} in {counted(p.n_slices, 'slice')} of {p.slice}, {how}; slow factors {p.factors}",
             *term_lines("replica, per slice (nominal speed):", p.replica,
                         [f"  {'Fetch':<16}{ms(p.extra['fetch'])}  (once per evaluation)"]),
             *term_lines("server 0, busy per slice:", p.server)]
    lines.append(f"T_eval {ms(p.t_eval)}   evaluations/batch {p.evaluations:g}   T_batch {ms(p.t_batch)}   "
                 f"server utilisation {p.rho:.2f}{'  (server-bound)' if p.server_bound else ''}   "
                 f"images/s {p.images_per_s:,.0f}   T_Epoch {p.t_epoch:.3g} s")
    return "\n".join(lines)


# ---- `sprint simulate --parallel sandblaster` -------------------------------------
def simulate(spec, n_node: int, n_gpu: int = 1, n_subbatch: int = 32, profile=None, **kw) -> Simulation:
    """One evaluation played out with the model's slice times, on request and
    as the static split, against the closed forms."""
    p = predict(spec, n_node, n_gpu, n_subbatch, profile, **{**kw, "static": False})
    st = predict(spec, n_node, n_gpu, n_subbatch, profile, **{**kw, "static": True})
    g, over = p.extra["gradient"], p.extra["overhead"]
    sim = simulate_eval(p.n_slices, g, p.factors, backup=p.backup, overhead=over)
    sim_st = simulate_eval(st.n_slices, st.extra["gradient"], st.factors, static=True, overhead=st.extra["overhead"])
    return Simulation(prediction=p, static_prediction=st, eval=sim, static_eval=sim_st,
                      t_eval=p.extra["fetch"] + sim["time"], t_eval_static=st.extra["fetch"] + sim_st["time"])


def format_simulation(sim: dict, explain_terms: bool = False, **_ignored) -> str:
    p, st = sim["prediction"], sim["static_prediction"]
    ms = lambda s: f"{1e3 * s:10.3f}"
    return "\n".join([
        f"sandblaster {p.model}: {counted(p.replicas, 'replica')}, slow factors {p.factors}, one evaluation of "
        f"{counted(p.batch, 'sample')}",
        f"{'':<34}{'simulated ms':>13}{'closed form ms':>16}",
        f"{'slices of ' + str(p.slice) + ' on request':<34}{ms(sim['t_eval'])}   {ms(p.t_eval)}   "
        f"slices per replica {sim['eval']['slices']}, {sim['eval']['duplicates']} backup copies",
        f"{'static split of ' + str(st.slice):<34}{ms(sim['t_eval_static'])}   {ms(st.t_eval)}"])


# ---- `sprint predict | simulate --parallel sandblaster` ---------------------------
def add_cli_arguments(parser):
    add_server_arguments(parser)
    add_once(parser, "--batch", type=positive_int, default=None,
             help="sandblaster: the L-BFGS batch (default 16 slices)")
    add_once(parser, "--slice", type=positive_int, default=None,
             help="sandblaster: samples per slice (default --subbatch)")
    add_once(parser, "--history", type=positive_int, default=10, help="sandblaster: L-BFGS pairs kept (default 10)")
    add_once(parser, "--static", action="store_true", help="sandblaster: price the static 1/R split instead")
    add_once(parser, "--no-backup", dest="backup", action="store_false", default=True,
             help="sandblaster: no backup copies of late slices")
    add_once(parser, "--slow-rank", type=nonneg_int, default=None,
             help="downpour, sandblaster: this MPI rank (a replica) runs --slow-factor times slower")
    add_once(parser, "--slow-factor", type=float, default=2.0, help="the factor of --slow-rank (default 2)")
    add_once(parser, "--trials", type=float, default=1.0,
             help="sandblaster: line-search evaluations per batch (default 1)")


def cli_kwargs(args) -> dict:
    return {k: getattr(args, k) for k in ("servers", "batch", "slice", "history", "static", "backup", "slow_rank",
                                          "slow_factor", "trials", "round_trip")}
