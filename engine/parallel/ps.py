"""The sharded parameter server shared by Downpour SGD and Sandblaster L-BFGS
(DistBelief, Dean et al. NIPS 2012; seed 003).

Server ranks ``0..S-1`` each own one contiguous, size-balanced shard
``[lo, hi)`` of the flat parameter vector; replica ranks ``S..`` talk to every
shard with non-blocking point-to-point MPI. A message is one float32 vector:
a header of float64 values (stored in the first ``2 * HDR`` float32 slots, so
counts and versions stay exact) followed by the shard's slice. MPI keeps the
messages of one sender to one receiver in order, which is what makes "push,
then fetch" see its own push without any extra synchronisation.

Here: the shard geometry, the message packing and small polling helpers, so
that waiting ranks sleep between tests instead of spinning on cores the
workers need; the per-shard update rules are engine.parallel.ps_optim.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from engine.argtypes import nonneg_int, positive_int

from .ps_optim import SERVER_OPTS
from engine.errors import counted

# Message tags (one namespace for both strategies).
FETCH, WEIGHTS, PUSH, DONE, SNAP, SNAP_REPLY, DIVERGED = 11, 12, 13, 14, 15, 16, 17
REQ, TASK, SLICE, CMD, CMD_REPLY = 21, 22, 23, 24, 25     # Sandblaster's coordinator
HDR = 6            # float64 header slots at the head of every packed vector
POLL = 2e-4        # seconds between tests of a pending request (CPU runs share cores)


def shard_bounds(n: int, servers: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) of each server, sizes differing by at most one."""
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if n < servers:
        raise ValueError(f"{n} parameters cannot be split over {servers} servers")
    base, extra = divmod(n, servers)
    out, lo = [], 0
    for s in range(servers):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def packed(n: int) -> np.ndarray:
    """An empty message buffer for a slice of n parameters."""
    return np.zeros(2 * HDR + n, np.float32)


def header(buf: np.ndarray) -> np.ndarray:
    """The float64 header view of a packed buffer (writable)."""
    return buf[:2 * HDR].view(np.float64)


def body(buf: np.ndarray) -> np.ndarray:
    return buf[2 * HDR:]


# The watchdog this rank's polling loops feed while it serves or trains
# (PSJob.serving): a replica waiting on a frozen server still ticks, so only
# a main thread that stopped looping is taken for stuck.
_WATCHDOG = [None]


def alive():
    """The main thread's sign of life (every polling loop calls it)."""
    w = _WATCHDOG[0]
    if w is not None:
        w.tick()


def nap(poll: float = POLL):
    """A polling loop's sleep, leaving the core to the workers."""
    time.sleep(poll)
    alive()


def wait_all(reqs, poll: float = POLL) -> float:
    """Wait for mpi4py requests by polling with sleeps; returns seconds waited."""
    from mpi4py import MPI
    reqs = [r for r in reqs if r is not None]
    if not reqs:
        return 0.0
    t0 = time.perf_counter()
    if poll <= 0:
        MPI.Request.Waitall(reqs)
    else:
        while not MPI.Request.Testall(reqs):
            nap(poll)
    return time.perf_counter() - t0


def fetch_all(comm, inbox, request, poll: float = POLL) -> None:
    """Ask every shard for its slice (``request``: an mpi4py buffer spec)
    and wait for shard s's packed reply in ``inbox[s]``."""
    from mpi4py import MPI
    reqs = []
    for s, buf in enumerate(inbox):
        reqs.append(comm.Irecv([buf, MPI.FLOAT], source=s, tag=WEIGHTS))
        reqs.append(comm.Isend(request, dest=s, tag=FETCH))
    wait_all(reqs, poll)


def assemble_into(weights, bounds, inbox, staging=None) -> None:
    """Every shard's reply body into the full vector ``weights``; a device
    vector is filled through the host vector ``staging``."""
    host = weights if isinstance(weights, np.ndarray) else (
        staging if staging is not None else np.empty(weights.shape, np.float32))
    for (lo, hi), buf in zip(bounds, inbox):
        host[lo:hi] = body(buf)
    if host is not weights:
        from ._xp import array_module
        weights[...] = array_module(weights).asarray(host, dtype=weights.dtype)


def push_all(comm, bounds, outbox, vec, heads) -> list:
    """Send shard s its part of ``vec`` behind the header values
    ``heads[s]``; returns the send requests."""
    from mpi4py import MPI
    reqs = []
    for s, (lo, hi) in enumerate(bounds):
        buf = outbox[s]
        h = header(buf)
        h[:] = 0
        h[:len(heads[s])] = heads[s]
        body(buf)[:] = vec[lo:hi]
        reqs.append(comm.Isend([buf, MPI.FLOAT], dest=s, tag=PUSH))
    return reqs


def pump(comm, handlers: dict) -> bool:
    """Hand every message that has arrived to ``handlers[tag](source)`` (which
    receives it); True when there was any."""
    from mpi4py import MPI
    st = MPI.Status()
    got = False
    while comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st):
        handlers[st.Get_tag()](st.Get_source())
        got = True
    return got


def recv_poll(comm, source, tag, poll: float = POLL):
    """comm.recv (a pickled object) without MPICH's busy wait."""
    from mpi4py import MPI
    st = MPI.Status()
    while not comm.Iprobe(source=source, tag=tag, status=st):
        nap(poll)
    return comm.recv(source=st.Get_source(), tag=tag)


def role_name(rank: int, servers: int) -> str:
    return f"server {rank}" if rank < servers else f"replica {rank - servers}"


def role_map(servers: int, size: int, bounds) -> str:
    """One line naming every rank's role (a killed rank is reported by pid;
    with the rank map this says which server or replica it was)."""
    parts = [f"rank {s}: server {s} [{lo}, {hi})" for s, (lo, hi) in enumerate(bounds)]
    parts += [f"rank {r}: {role_name(r, servers)}" for r in range(servers, size)]
    return "; ".join(parts)


# ---- `sprint train` options of the parameter-server strategies ------------------
_PS = ("downpour", "sandblaster")
# (flag, key in TrainConfig.extra, argparse keywords, strategies it applies to)
TRAIN_OPTIONS = (
    ("--servers", "servers", dict(metavar="S", type=positive_int,
                                  help="downpour, sandblaster: parameter-server ranks S; the other mpiexec ranks are "
                                       "model replicas (default 1)"), _PS),
    ("--fetch-every", "fetch_every", dict(metavar="N", type=positive_int,
                                          help="downpour: replicas fetch the weights every n steps (default 1)"),
     ("downpour",)),
    ("--push-every", "push_every", dict(metavar="N", type=positive_int,
                                        help="downpour: replicas push their summed gradients every n steps "
                                             "(default 1)"), ("downpour",)),
    ("--server-opt", "server_opt", dict(choices=sorted(SERVER_OPTS),
                                        help="downpour: the servers' optimizer (default adagrad)"), ("downpour",)),
    ("--slice", "slice", dict(metavar="N", type=positive_int,
                              help="sandblaster: samples per slice handed to a replica (default 32; --batch is the "
                                   "L-BFGS batch)"), ("sandblaster",)),
    ("--history", "history", dict(metavar="M", type=positive_int, help="sandblaster: L-BFGS pairs kept (default 10)"),
     ("sandblaster",)),
    ("--no-backup", "backup", dict(action="store_const", const=False,
                                   help="sandblaster: no backup copies of late slices (a static-split baseline "
                                        "with --slice = batch / replicas)"), ("sandblaster",)),
    ("--slow-rank", "slow_rank", dict(metavar="R", type=nonneg_int,
                                      help="downpour, sandblaster (benchmarking aid): this replica rank sleeps (F-1) x "
                                           "its compute time after each step"), _PS),
    ("--slow-factor", "slow_factor", dict(metavar="F", type=float, help="the F of --slow-rank (default 2)"), _PS),
)


def add_train_options(parser, strategy):
    """``strategy``'s own options; one shared by both is added by the first
    it applies to (the strategy table calls each strategy's module)."""
    for flag, key, kw, strategies in TRAIN_OPTIONS:
        if strategies[0] == strategy:
            parser.add_argument(flag, dest="ps_" + key, default=None, **kw)


def extra_from_args(args, strategy) -> dict:
    """The ``cfg.extra`` entries of ``strategy``'s options given on the
    command line. Under another --parallel, the options given that do not
    apply to it are returned too (by the first strategy they apply to), so
    that the caller refuses them, naming them."""
    chosen = getattr(args, "parallel", None)
    out = {}
    for flag, key, _, strategies in TRAIN_OPTIONS:
        v = getattr(args, "ps_" + key, None)
        if v is None or strategy not in strategies:
            continue
        if chosen == strategy or (chosen not in strategies and strategies[0] == strategy):
            out[key] = v
    return out


# ---- what a parameter-server run of the engine shares --------------------------
def launch(cfg, mode, body):
    """``body(job)`` on every rank of a Downpour or Sandblaster job, inside the
    engine's session (device, data, run folder, watchdog) and abort rules."""
    from engine.session import Session
    from .abort import run_guarded

    def in_session(cfg, comm):
        with Session(cfg, comm) as s:
            return body(PSJob(s, cfg, mode, comm))
    return run_guarded(in_session, cfg)


class PSJob:
    """Ranks' roles, the net and data, evaluation and checkpoints of a
    Downpour or Sandblaster run (``mode``) over the session ``s``. Server 0
    evaluates, logs and writes; every rank holds the data (replicas train on
    it, and all ranks prove they agree on it at start)."""

    def __init__(self, s, cfg, mode, comm):
        import sys
        from engine.net import Net
        from engine.optim import make_schedule
        from . import comm as _comm
        from ._xp import to_host
        from .runner import _check_ranks_agree
        self.s, self.cfg, self.mode, self.comm = s, cfg, mode, comm
        extra = dict(cfg.extra or {})
        self.S = int(extra.get("servers", 1))
        if not isinstance(comm, _comm.MPIComm) or comm.size < self.S + 1:
            raise ValueError(f"--parallel {mode} needs mpiexec -n S+R with S = {counted(self.S, 'server')} and at "
                             f"least one replica, got {counted(comm.size, 'process', 'processes')} (--servers)")
        self.R, self.rank = comm.size - self.S, comm.rank
        self.is_server = self.rank < self.S
        self.be, self.spec = s.backend, s.spec
        self.train_ds, self.test_ds, self.deform = s.train_ds, s.test_ds, s.deform
        try:
            _check_ranks_agree(comm, cfg, self.spec, self.train_ds, self.test_ds)
        except _comm.ConfigMismatch as e:
            if self.rank == 0:
                print(f"sprint: error: {e}", file=sys.stderr, flush=True)
            e.reported_by_root = True
            comm.barrier()
            raise
        if s.gpu and comm.size > 1:
            _comm.select_device(comm)       # each rank of a host its own GPU (round robin)
        net0 = Net(self.spec, seed=cfg.seed)
        self.n_param = int(net0.n_params)
        self.bounds = shard_bounds(self.n_param, self.S)
        pids = comm.rank_map()
        s.watchdog.roles = {r: role_name(r, self.S) for r in range(comm.size)}
        if self.rank == 0:
            print(f"sprint: {pids}\nsprint: {mode} roles: {role_map(self.S, comm.size, self.bounds)}",
                  file=sys.stderr, flush=True)
        state = s.load_state()
        if cfg.resume and state.get("mode") != mode:
            raise ValueError(f"checkpoint is from a {state.get('mode')!r} run, not {mode!r} (--resume)")
        self.state = state if cfg.resume else None        # init_from gives weights only
        self.w0 = (np.asarray(state["params"], np.float32) if state is not None
                   else to_host(net0.params).astype(np.float32))
        self.n_file = len(self.train_ds)
        self.start_samples = int(state["samples"]) if cfg.resume else 0
        self.start_epoch = self.start_samples // self.n_file
        self.sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
        self.max_samples = int(extra.get("max_samples", cfg.epochs * self.n_file))
        self.last_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, cfg.stop_after)
        s.start(self.start_epoch)
        self.run_dir = s.run
        self._t_epoch = time.perf_counter()
        self._eval_net = None

    @contextlib.contextmanager
    def serving(self):
        """This rank's role loop (serve or train) under the watchdog's
        progress check: a main thread that stops polling for --timeout
        seconds names itself and ends the job. Left before the closing
        collectives, where ranks wait for each other without ticking."""
        _WATCHDOG[0] = self.s.watchdog
        try:
            with self.s.watchdog.progress():
                yield
        finally:
            _WATCHDOG[0] = None

    def net(self):
        from engine.net import Net
        return Net(self.spec, seed=self.cfg.seed)

    def evaluate(self, w):
        """(loss, accuracy) of the full vector ``w`` on the whole test set."""
        from engine.session import evaluate
        if self._eval_net is None:
            self._eval_net = self.net()
        self._eval_net.set_flat(w)
        return evaluate(self._eval_net, self.test_ds, self.cfg.eval_batch, self.deform)

    def end_epoch(self, epoch, w, opt_state: dict, counters: dict, window):
        """Server 0: evaluate, then the session checkpoints, logs and prints."""
        seen, tr_loss, tr_acc = window
        now = time.perf_counter()
        test_loss, test_acc = self.evaluate(w)
        rec = {"epoch": int(epoch), "step": int(counters.get("step", 0)),
               "lr": float(self.sched(epoch)), "train_loss": tr_loss, "train_acc": tr_acc,
               "test_loss": test_loss, "test_acc": test_acc,
               "images_per_s": seen / (now - self._t_epoch) if now > self._t_epoch else 0.0,
               "time": now - self.s.t0, "skipped": self.train_ds.skipped + self.test_ds.skipped,
               "parallel": self.mode, "servers": self.S, "replicas": self.R}
        state = {"params": np.asarray(w, np.float32), "opt": opt_state, "mode": self.mode, "epoch": int(epoch),
                 "samples": int(counters.get("samples", 0)), "step": int(counters.get("step", 0)),
                 "servers": self.S, "replicas": self.R, "spec": self.spec.to_dict(),
                 "spec_hash": self.spec.hash(), "deform": self.deform.to_dict(),
                 "rng": {"seed": int(self.cfg.seed), "next_epoch": int(epoch)}}
        state.update({k: v for k, v in counters.items() if k not in state})
        self.s.end_epoch(rec, state, every_rank=False)     # the other ranks serve or train on
        self._t_epoch = time.perf_counter()
        return epoch >= self.last_epoch

    def diverged(self, loss, samples):
        """The Diverged of a run whose loss became ``loss`` after ``samples``
        applied samples (server 0's count, which every rank is told): the
        same line on every rank. Server 0 checkpointed each epoch it crossed."""
        epoch = samples / self.n_file
        saved = max(self.s.saved_epoch, int(samples) // self.n_file)
        return self.s.diverged(loss, int(epoch) + 1, None, float(self.sched(epoch)), saved=saved)

    def finish(self, stats: dict, w_final):
        """Every rank: the result dict; rank 0 also writes ``<mode>_stats.json``."""
        self.s.write_stats(f"{self.mode}_stats.json", stats)
        net = self.net()
        if w_final is not None:
            net.set_flat(w_final)
        return self.s.result(net, int(stats.get("samples", 0) // self.n_file), stats=stats, rank=self.rank,
                             n_node=self.comm.size)
