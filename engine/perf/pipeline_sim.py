"""Event simulation and closed forms of a pipeline's stages (engine.perf.pipeline).

Both work on a list of per-stage costs (``t_f``, ``t_b``, ``t_u``, ``t_c``:
engine.perf.pipeline.StageCost) and know nothing of the network, so tests
can feed them equal stages and check the textbook results.

:func:`play` runs the stages' real instruction lists (engine.parallel.
pipeline_schedule) on one clock: an instruction starts when its stage is
free and the messages it needs have arrived; a message arrives ``t_c``
after the pass that sends it ends. With ``cores`` (ranks sharing a CPU
host) at most that many stages run at once, each at full speed, and a stage
whose instruction is ready waits for a free core, first ready first served
(``sharing="queue"``, the default): a pass of 0.1-1 ms ends inside one of
the OS scheduler's time slices, so the kernel does not interleave two of
them on a core, and a rank waiting for a message sleeps in its polls. The
earlier ``sharing="ps"`` (every running stage gets an equal share of the
cores, passes stretched) priced 1f1b's passes on 4 ranks / 2 cores a
median 23 % off on the earlier session's runs, where the queue gives 16 %
(bench/RESULTS.md, "Pipelines");
with ``cv`` every instruction's duration is drawn from a gamma distribution
of that spread around its cost, as the ASGD simulator draws its steps. A
cost's ``t_x`` (the executor's untimed work around each instruction:
posting receives, testing sends, the loop) runs after each pass, on the
stage's processor but outside the pass's timer (``wall["X"]``); the pass's
messages leave when the pass ends. A message above MPI's eager size (its
cost's ``t_h`` > 0: the handshake part of ``t_c``) moves only while the
sender is inside MPI: when the sender's next pass can start before the
handshake is done, the data waits for that pass to end and arrives
``t_c - t_h`` later (not before ``t_c`` after it was sent); otherwise the
sender's polling moves it in ``t_c``. That hold is played only where ranks
share cores (``hold`` None: with ``cores``): with a core each, MPI's
receiver pulls a large message itself once the executor's next MPI call
has announced it, and the recorded 2-rank runs idle as if nothing were held
(bench/RESULTS.md, "Pipelines", held-out set 3). The closed forms leave
this out.

:func:`closed_form` is what the simulation should give when each stage has
its own processor and nothing varies: gpipe's fill-drain (a flow shop of M
identical jobs takes sum_k t_k + (M - 1) max_k t_k per direction) and the
steady state of 1f1b/dualpipe (the slowest stage's forward + backward +
update per micro-batch, messages hidden behind the in-flight micro-batches).
"""
from __future__ import annotations

import heapq
import math

from engine.parallel import pipeline_schedule as S


def pass_work(c, kind: str, overlap: float = 0.0) -> float:
    """Seconds of one instruction of stage cost ``c``. ``overlap``: share of
    the shorter pass of a dualpipe pair hidden under the longer (0 on a CPU
    rank, up to 1 with two GPU streams)."""
    if kind == "F":
        return c.t_f
    if kind == "B":
        return c.t_b
    if kind == "FB":
        return max(c.t_f, c.t_b) + (1.0 - overlap) * min(c.t_f, c.t_b)
    return c.t_u


def _phases(c, op, overlap, jitter):
    """[[remaining work, kind], ...] of one instruction: the pass, then the
    executor's untimed work around it."""
    out = [[pass_work(c, op.kind, overlap) * jitter(), op.kind]]
    t_x = getattr(c, "t_x", 0.0)
    if t_x > 0:
        out.append([t_x * jitter(), "X"])
    return out


def play(costs, schedule: str, microbatches: int, n_mb: int, cores=None, overlap: float = 0.0,
         cv: float = 0.0, seed: int = 0, sharing: str = "queue", hold=None) -> dict:
    """Play the stages' instruction lists over ``n_mb`` micro-batches.

    Returns makespan, per-stage busy time (work done) and bubble (the share
    of the makespan not working), and the wall time each stage spent running
    each kind of pass (``wall``: {"F": s, ...}; with shared cores a pass runs
    longer than its work) with their counts (``passes``), which is what a
    rank's own timers measure. ``cores``: None when each stage owns its
    processor, else the cores the stages share: ``sharing`` "queue" (at
    most ``cores`` instructions run, the others wait) or "ps" (all run,
    each at ``cores / running`` speed). ``hold``: play the rendezvous hold
    (None: only with ``cores``)."""
    if sharing not in ("queue", "ps"):
        raise ValueError(f"sharing must be 'queue' or 'ps', got {sharing!r}")
    hold = cores is not None if hold is None else hold
    K = len(costs)
    lists = [S.schedule(schedule, K, k, n_mb, microbatches) for k in range(K)]
    if cv and cv > 0:
        import numpy as np
        rng = np.random.default_rng(seed)
        shape = 1.0 / (cv * cv)
        jitter = lambda: float(rng.gamma(shape, 1.0 / shape))   # mean 1, spread cv
    else:
        jitter = lambda: 1.0

    pos = [0] * K
    f_ready = [dict() for _ in range(K)]      # mb -> time stage k's activation arrives at k+1
    b_ready = [dict() for _ in range(K)]      # mb -> time stage k's gradient arrives at k-1
    running = {}                               # k -> [op, phases left (_phases)]
    busy = [0.0] * K
    wall = [{} for _ in range(K)]              # k -> {kind: seconds running}
    passes = [{} for _ in range(K)]
    arrivals = []                              # heap of pending message arrival times
    held = [[] for _ in range(K)]              # k -> rendezvous messages waiting for k's next pass to end
    now = 0.0

    def ready_at(k, op):
        """When ``op``'s messages are in at stage k (inf: not yet sent)."""
        t = 0.0
        if op.kind in ("F", "FB") and k > 0:
            t = max(t, f_ready[k - 1].get(op.mb, math.inf))
        bmb = op.mb2 if op.kind == "FB" else (op.mb if op.kind == "B" else None)
        if bmb is not None and k < K - 1:
            t = max(t, b_ready[k + 1].get(bmb, math.inf))
        return t

    def send(k, box, mb, t_c, t_h, nxt):
        """Stage k's message (arriving in ``box[mb]``), sent now; ``nxt``
        the index of k's next instruction."""
        if hold and t_h > 0 and nxt < len(lists[k]):
            start = max(now + getattr(costs[k], "t_x", 0.0), ready_at(k, lists[k][nxt]))
            if start < now + t_h:
                held[k].append((box, mb, now, t_c, t_h))
                return
        box[mb] = now + t_c
        heapq.heappush(arrivals, now + t_c)

    def deps_met(k, op):
        if op.kind in ("F", "FB") and k > 0 and f_ready[k - 1].get(op.mb, math.inf) > now + 1e-15:
            return False
        bmb = op.mb2 if op.kind == "FB" else (op.mb if op.kind == "B" else None)
        if bmb is not None and k < K - 1 and b_ready[k + 1].get(bmb, math.inf) > now + 1e-15:
            return False
        return True

    since = {}                                 # k -> when its next instruction became ready (queue sharing)
    while True:
        for k in range(K):
            if k not in running and k not in since and pos[k] < len(lists[k]) and deps_met(k, lists[k][pos[k]]):
                since[k] = now
        for k in sorted(since, key=since.get):
            if sharing == "queue" and cores is not None and len(running) >= cores:
                break
            op = lists[k][pos[k]]
            running[k] = [op, _phases(costs[k], op, overlap, jitter)]
            del since[k]
        if not running:
            if all(pos[k] >= len(lists[k]) for k in range(K)):
                break
            if not arrivals:
                raise RuntimeError("pipeline simulation deadlocked")
            now = heapq.heappop(arrivals)
            continue
        rate = 1.0 if cores is None or sharing == "queue" else min(1.0, cores / len(running))
        dt = min(r[1][0][0] for r in running.values()) / rate
        if arrivals and arrivals[0] < now + dt:
            dt = arrivals[0] - now
            heapq.heappop(arrivals)
        now += dt
        for k in list(running):
            op, phases = running[k]
            ph = phases[0]
            ph[0] -= dt * rate
            busy[k] += dt * rate
            wall[k][ph[1]] = wall[k].get(ph[1], 0.0) + dt
            if ph[0] > 1e-15:
                continue
            phases.pop(0)
            if ph[1] == "X":
                if not phases:
                    del running[k]
                    pos[k] += 1
                continue
            passes[k][op.kind] = passes[k].get(op.kind, 0) + 1
            for box, mb, sent, t_c, t_h in held[k]:      # this pass held them: they move now
                box[mb] = max(sent + t_c, now + t_c - t_h)
                heapq.heappush(arrivals, box[mb])
            held[k] = []
            nxt = pos[k] + 1
            if not phases:
                del running[k]
                pos[k] += 1
            c = costs[k]
            if op.kind in ("F", "FB") and k < K - 1:
                send(k, f_ready[k], op.mb, c.t_c, getattr(c, "t_h", 0.0), nxt)
            bmb = op.mb2 if op.kind == "FB" else (op.mb if op.kind == "B" else None)
            if bmb is not None and k > 0:
                send(k, b_ready[k], bmb, costs[k - 1].t_c, getattr(costs[k - 1], "t_h", 0.0), nxt)
    return {"makespan": now, "busy": busy, "bubble": [1.0 - b / now if now else 0.0 for b in busy],
            "wall": wall, "passes": passes}


def _folded(c):
    t_x = getattr(c, "t_x", 0.0)
    if not t_x:
        return c
    from dataclasses import replace
    return replace(c, t_f=c.t_f + t_x, t_b=c.t_b + t_x, t_u=c.t_u + t_x, t_x=0.0)


def closed_form(costs, schedule: str, microbatches: int, cores=None, overlap: float = 0.0) -> dict:
    """Seconds per mini-batch of M micro-batches and each stage's idle share,
    in steady state (gpipe: every mini-batch fills and drains), and the
    extra seconds a stream pays once (``fill_drain``). Exact for equal
    stages (tested); with unequal ones an approximation (a stage's slack is
    counted along the first micro-batch's path only)."""
    M = microbatches
    # the executor's work after each instruction lengthens it (its messages
    # leave a little earlier than this counts: within t_x)
    costs = [_folded(c) for c in costs]
    if schedule == "gpipe":
        fwd = sum(c.t_f for c in costs) + (M - 1) * max(c.t_f for c in costs)
        bwd = sum(c.t_b for c in costs) + (M - 1) * max(c.t_b for c in costs)
        comm = 2 * sum(c.t_c for c in costs[:-1])
        # stage 0 ends the drain: its update delays the next mini-batch; a later
        # stage's update only where it outlasts the lead that stage has (its last
        # backward ended earlier, the next forward reaches it later)
        late, lead = 0.0, 0.0
        for c in costs:
            late = max(late, c.t_u - costs[0].t_u - lead)
            lead += c.t_f + c.t_b + 2 * c.t_c
        t_mb = fwd + bwd + comm + costs[0].t_u + late
        work = [M * (c.t_f + c.t_b) + c.t_u for c in costs]
    else:
        # 1f1b and dualpipe alike: one forward, one backward and one update
        # per micro-batch on every stage (dualpipe's pairs may overlap them)
        per = [pass_work(c, "FB", overlap) + c.t_u if schedule == "dualpipe"
               else c.t_f + c.t_b + c.t_u for c in costs]
        t_mb = M * max(per)
        work = [M * p for p in per]
    # the stream's fill and drain beyond its mini-batches: none for gpipe (paid
    # in each); for the others the first micro-batch's trip to the last stage
    # and back, less the slowest stage's own passes (counted in t_minibatch)
    fill = 0.0 if schedule == "gpipe" else (sum(c.t_f + c.t_b for c in costs) + 2 * sum(c.t_c for c in costs[:-1])
                                            - max(c.t_f + c.t_b for c in costs))
    if cores is not None:
        # shared processors: never faster than the total work spread over them
        t_mb = max(t_mb, sum(work) / cores)
    return {"t_minibatch": t_mb, "fill_drain": fill, "bubble": [max(0.0, 1.0 - w / t_mb) if t_mb else 0.0 for w in work],
            "bubble_gpipe": (len(costs) - 1) / (M + len(costs) - 1)}
