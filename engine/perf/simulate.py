"""Discrete-event simulation of SPRINT's Algorithm 1 (workers) and 2 (updaters).

Every worker and updater is a generator process on one heap-ordered clock;
locks are FCFS queues; the allreduce is a barrier over all nodes followed by
its bandwidth term. Step durations are drawn from gamma distributions whose
means are the profile's fitted terms and whose coefficients of variation are
the measured spreads, so lock waits, fetch decisions, the per-update count of
non-empty buffers and the barrier *emerge* instead of being assumed: that is
what lets ``compare`` name the closed-form assumption that breaks.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from . import model as model_mod
from .slice_wait import growth


class _Draw:
    """Buffered gamma samples per step: one numpy call per 4096 draws."""

    def __init__(self, rng, mean, cv, block=4096):
        self.rng, self.mean, self.cv, self.block = rng, float(mean), float(cv), block
        self.buf, self.i = None, block

    def __call__(self):
        if self.cv <= 0 or self.mean <= 0:
            return self.mean
        if self.i >= self.block:
            k = 1.0 / (self.cv * self.cv)
            self.buf = self.rng.gamma(k, self.mean / k, self.block)
            self.i = 0
        v = self.buf[self.i]
        self.i += 1
        return v


class _Lock:
    __slots__ = ("held", "queue")

    def __init__(self):
        self.held = False
        self.queue = []


@dataclass
class SimResult:
    t_gpu: float
    t_update: float
    n_minibatch_avg: float
    staleness: float
    t_epoch: float
    t_barrier: float
    p_fetch: float
    p_nonempty: float
    waits: dict
    updates: int
    worker_steps: int
    sim_time: float
    wall_s: float = 0.0
    staleness_hist: list = field(default_factory=list)
    minibatch_std: float = 0.0

    def as_dict(self, wall=True):
        d = dict(self.__dict__)
        if not wall:
            d.pop("wall_s")
        return d


class _Sim:
    def __init__(self):
        self.now = 0.0
        self.heap = []
        self.seq = 0

    def at(self, t, proc, value=None):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, proc, value))

    def start(self, proc):
        self.at(self.now, proc)

    # A process yields ("delay", dt) | ("acquire", lock) | ("release", lock) | ("barrier", bar)
    def step(self, proc, value):
        while True:
            try:
                cmd, arg = proc.send(value)
            except StopIteration:
                return
            value = None
            if cmd == "delay":
                self.at(self.now + arg, proc)
                return
            if cmd == "acquire":
                if arg.held:
                    arg.queue.append((proc, self.now))
                    return
                arg.held = True
                value = 0.0
                continue
            if cmd == "release":
                if arg.queue:
                    nxt, t0 = arg.queue.pop(0)
                    self.at(self.now, nxt, self.now - t0)
                else:
                    arg.held = False
                continue
            if cmd == "barrier":
                arg.arrive(self, proc)
                return
            if cmd == "park":      # resumed by a _Signal
                return
            raise ValueError(f"unknown simulation command {cmd!r}")

    def run(self, until_fn):
        while self.heap and not until_fn():
            t, _, proc, value = heapq.heappop(self.heap)
            self.now = t
            self.step(proc, value)


class _Barrier:
    """Allreduce: everybody leaves together, the bandwidth term after the last arrives."""

    def __init__(self, n, duration):
        self.n, self.duration = n, duration
        self.waiting = []

    def arrive(self, sim, proc):
        self.waiting.append((proc, sim.now))
        if len(self.waiting) == self.n:
            d = self.duration()
            end = sim.now + d
            for p, t0 in self.waiting:
                sim.at(end, p, sim.now - t0)   # resumes with its barrier wait
            self.waiting = []


class _Signal:
    """The updater waiting for a deposit (min_grads): woken by the next one."""

    def __init__(self):
        self.waiter = None

    def fire(self, sim):
        if self.waiter is not None:
            proc, t0 = self.waiter
            self.waiter = None
            sim.at(sim.now, proc, sim.now - t0)


def simulate(spec, n_node: int, n_gpu: int, n_subbatch: int, profile=None, n_updates: int = 400,
             warmup: int = 40, seed: int = 0, cv=None, n_file=None, ranks_per_host: int = 1,
             impl=model_mod.ENGINE_IMPL, min_worker_steps: int = 0,
             max_events: int = 50_000_000, slowdown=None) -> SimResult:
    """Simulate ``n_updates`` global updates after ``warmup`` (and at least
    ``min_worker_steps`` measured worker iterations); return the measured stats.

    ``cv``: override every step's spread (a number, e.g. 0 for deterministic
    steps, or {step: cv} for some); default: the profile's measured spread.
    ``impl``: the same implementation switches as the closed form.
    ``slowdown``: the host slowdown the closed form solved for this
    configuration (``Prediction.slowdown``), when the caller has it.
    """
    import time as _time
    from .profile import Profile
    wall0 = _time.perf_counter()
    profile = Profile.resolve(profile)
    # The host slowdown depends on the updaters' share of the cores, which
    # the closed form solves for; the simulation runs at that slowdown.
    slow = slowdown if slowdown is not None else model_mod.predict(
        spec, n_node, n_gpu, n_subbatch, profile, ranks_per_host=ranks_per_host, impl=impl).slowdown
    base = model_mod.step_costs(spec, n_node, n_gpu, n_subbatch, profile, ranks_per_host, impl, slow)
    if base["_slice_beta"][0] > 0:
        # The time-slice wait that grows with the step, at the closed form's T_GPU.
        t_gpu = model_mod._predict(spec, n_node, n_gpu, n_subbatch, profile, ranks_per_host=ranks_per_host,
                                   impl=impl, slowdown=slow).t_gpu
        bw = base["allreduce_bw"]
        base["allreduce_bw"] = (bw[0] + growth(base["_slice_beta"][0], base.get("_slice_t0", (math.inf,))[0], t_gpu), bw[1])
    rng = np.random.default_rng(seed)

    def mk(name):
        spread = base[name][1] if cv is None else cv.get(name, base[name][1]) if isinstance(cv, dict) else cv
        return _Draw(rng, base[name][0], spread)
    d = {k: mk(k) for k in base if not k.startswith("_")}
    n_file = base["_n_file"][0] if n_file is None else n_file

    sim = _Sim()
    state = {"updates": 0, "done": False}
    stats = {"w_iter": [], "u_iter": [], "stale": [], "fetch": 0, "fetch_chances": 0,
             "nonempty": 0, "buf_checks": 0, "barrier": [], "w_lockW": [], "w_lockG": [],
             "u_lockG": [], "u_lockW": [], "u_wait": [], "samples": 0, "t0": None, "mb_acc": {}}
    measuring = lambda: state["updates"] >= warmup
    bar = _Barrier(n_node, d["allreduce_bw"])
    procs = {}

    for node in range(n_node):
        nd = {"lw": _Lock(), "locks": [_Lock() for _ in range(n_gpu)], "bufs": [None] * n_gpu,
              "pending": [], "version": 0, "signal": _Signal(), "full": 0}

        def worker(nd=nd, t=None):
            own = -1
            while not state["done"]:
                t_start = sim.now
                if nd["version"] != own:
                    # The runner checks the version before taking the lock.
                    w = yield ("acquire", nd["lw"])
                    if measuring():
                        stats["w_lockW"].append(w)
                    own = nd["version"]
                    yield ("delay", d["fetch"]())
                    yield ("release", nd["lw"])
                    if measuring():
                        stats["fetch"] += 1
                if measuring():
                    stats["fetch_chances"] += 1
                yield ("delay", d["compute"]())
                w = yield ("acquire", nd["locks"][t])
                if measuring():
                    stats["w_lockG"].append(w)
                if nd["bufs"][t] is None:
                    yield ("delay", d["deposit_set"]())
                    nd["bufs"][t] = [own]
                    nd["full"] += 1
                else:
                    yield ("delay", d["deposit_add"]())
                    nd["bufs"][t].append(own)
                yield ("release", nd["locks"][t])
                nd["signal"].fire(sim)
                if measuring():
                    stats["w_iter"].append(sim.now - t_start)

        def updater(nd=nd, node=node):
            while not state["done"]:
                t_start = sim.now
                if nd["full"] < impl.min_grads:
                    nd["signal"].waiter = (procs[node], sim.now)
                    w = yield ("park", None)
                    if measuring():
                        stats["u_wait"].append(w)
                elif measuring():
                    stats["u_wait"].append(0.0)
                got = []
                for t in range(n_gpu):
                    w = yield ("acquire", nd["locks"][t])
                    if measuring():
                        stats["u_lockG"].append(w)
                        stats["buf_checks"] += 1
                    taken = nd["bufs"][t]
                    if taken is not None:
                        first = not got
                        yield ("delay", d["sum_cs_first" if first else "sum_cs_add"]())
                        nd["bufs"][t] = None
                        nd["full"] -= 1
                        got += taken
                        if measuring():
                            stats["nonempty"] += 1
                    yield ("release", nd["locks"][t])
                    if taken is not None:
                        yield ("delay", d["sum_out_first" if first else "sum_out_add"]())
                if not got:
                    yield ("delay", d["sum_zero"]())
                yield ("delay", d["add_momentum"]())
                nd["pending"] = got
                w = yield ("barrier", bar)
                if measuring():
                    stats["barrier"].append(w)
                yield ("delay", d["update_momentum"]())
                w = yield ("acquire", nd["lw"])
                if measuring():
                    stats["u_lockW"].append(w)
                yield ("delay", d["update_weights"]())
                # Every node publishes the same new vector: versions advance
                # in step, node 0 counts the global updates.
                nd["version"] += 1
                applied = nd["version"]
                yield ("release", nd["lw"])
                yield ("delay", d["updater_loop"]())
                if node == 0:
                    state["updates"] += 1
                    if state["updates"] == warmup:
                        stats["t0"] = sim.now
                        stats["samples"] = 0
                if measuring() and stats["t0"] is not None:
                    stats["stale"] += [applied - v - 1 for v in nd["pending"]]
                    stats["samples"] += len(nd["pending"]) * n_subbatch
                    stats["mb_acc"][applied] = stats["mb_acc"].get(applied, 0) + len(nd["pending"]) * n_subbatch
                if measuring():
                    stats["u_iter"].append(sim.now - t_start)
                if state["updates"] >= warmup + n_updates and len(stats["w_iter"]) >= min_worker_steps:
                    state["done"] = True

        for t in range(n_gpu):
            sim.start(worker(t=t))
        proc = updater()
        procs[node] = proc
        sim.start(proc)

    events = [0]

    def until():
        events[0] += 1
        return state["done"] or events[0] > max_events

    sim.run(until)
    elapsed = sim.now - (stats["t0"] or 0.0)
    mb = list(stats["mb_acc"].values())
    mean = lambda v: float(np.mean(v)) if len(v) else 0.0
    thr = stats["samples"] / elapsed if elapsed > 0 else 0.0
    hist = np.bincount(np.asarray(stats["stale"], int)).tolist() if stats["stale"] else []
    return SimResult(
        t_gpu=mean(stats["w_iter"]), t_update=mean(stats["u_iter"]), n_minibatch_avg=mean(mb),
        staleness=mean(stats["stale"]), t_epoch=n_file / thr if thr > 0 else math.inf,
        t_barrier=mean(stats["barrier"]),
        p_fetch=stats["fetch"] / max(stats["fetch_chances"], 1),
        p_nonempty=stats["nonempty"] / max(stats["buf_checks"], 1),
        waits={"worker_LockWeights": mean(stats["w_lockW"]) * stats["fetch"] / max(stats["fetch_chances"], 1),
               "worker_LockGradient": mean(stats["w_lockG"]),
               "updater_LockGradient": mean(stats["u_lockG"]) * n_gpu,
               "updater_LockWeights": mean(stats["u_lockW"]),
               "updater_WaitGradient": mean(stats["u_wait"])},
        updates=state["updates"] - warmup, worker_steps=len(stats["w_iter"]), sim_time=elapsed,
        wall_s=_time.perf_counter() - wall0, staleness_hist=hist,
        minibatch_std=float(np.std(mb)) if mb else 0.0)


# Which closed-form assumption each quantity rests on, for ``compare``.
_ASSUMPTIONS = {
    "t_barrier": "X_i ~ Binomial(N_GPU, p) independent across nodes (worker phases random w.r.t. the "
                 "updater); correlated or phase-locked workers break it",
    "waits": "random arrival at a lock (P(busy) = T_cs/T_iteration, half the section left); "
             "FCFS queues of several waiters and phase locking break it",
    "p_fetch": "fetch iff LatestWeights changed, P = min(T_GPU/T_Update, 1): exact for a periodic updater",
    "n_minibatch_avg": "throughput identity N*G*S*T_Update/T_GPU: exact in expectation once T_GPU and "
                       "T_Update are right",
    "staleness": "periodic updater with random phase: E = G/T_Update + 1",
    "wait": "mean-field wait for one gradient: one state (waited or not) and worker phases uniform "
            "given it, the same for every node; with spread, nodes drift between waiting for "
            "their own deposit and waiting at the barrier",
}


def compare(pred, sim: SimResult, tol: float = 0.05):
    """Rows (quantity, closed form, simulation, rel. diff, assumption if |diff| > tol)."""
    pw = pred.worker["LockWeights"] + pred.worker["LockGradient"]
    sw = sim.waits["worker_LockWeights"] + sim.waits["worker_LockGradient"]
    pairs = [("T_GPU", pred.t_gpu, sim.t_gpu, "waits"),
             ("T_Update", pred.t_update, sim.t_update, "t_barrier"),
             ("T_Barrier", pred.t_barrier, sim.t_barrier, "t_barrier"),
             ("P(fetch)", pred.p_fetch, sim.p_fetch, "p_fetch"),
             ("P(non-empty)", pred.p_nonempty, sim.p_nonempty, "t_barrier"),
             ("worker lock wait", pw, sw, "waits"),
             ("WaitGradient", pred.updater.get("WaitGradient", 0.0), sim.waits["updater_WaitGradient"], "wait"),
             ("N_Minibatch_avg", pred.n_minibatch_avg, sim.n_minibatch_avg, "n_minibatch_avg"),
             ("staleness", pred.staleness, sim.staleness, "staleness"),
             ("T_Epoch", pred.t_epoch, sim.t_epoch, "n_minibatch_avg")]
    rows = []
    for name, a, b, key in pairs:
        scale = max(abs(a), abs(b), 1e-300)
        diff = (a - b) / abs(b) if b else (0.0 if a == 0 else math.inf)
        # Tiny absolute terms (lock waits of ns against ms steps) are noise, not a failed assumption.
        material = abs(a - b) > 1e-2 * max(pred.t_gpu, pred.t_update) \
            if name.startswith(("T_B", "worker", "Wait")) \
            else abs(a - b) > tol * scale
        rows.append((name, a, b, diff, _ASSUMPTIONS[key] if material else ""))
    return rows


def format_compare(rows) -> str:
    out = [f"{'quantity':<18}{'closed form':>14}{'simulated':>14}{'diff':>9}"]
    notes = []
    for name, a, b, diff, why in rows:
        out.append(f"{name:<18}{a:>14.6g}{b:>14.6g}{100 * diff:>8.1f}%" + ("  *" if why else ""))
        if why and why not in notes:
            notes.append(why)
    if notes:
        out.append("")
        out.append("* closed form and simulation disagree; the assumption that breaks:")
        out += [f"  - {n}" for n in notes]
    return "\n".join(out)
