"""The sharded parameter server shared by Downpour SGD and Sandblaster L-BFGS
(DistBelief, Dean et al. NIPS 2012; seed 003).

Server ranks ``0..S-1`` each own one contiguous, size-balanced shard
``[lo, hi)`` of the flat parameter vector; replica ranks ``S..`` talk to every
shard with non-blocking point-to-point MPI. A message is one float32 vector:
a header of float64 values (stored in the first ``2 * HDR`` float32 slots, so
counts and versions stay exact) followed by the shard's slice. MPI keeps the
messages of one sender to one receiver in order, which is what makes "push,
then fetch" see its own push without any extra synchronisation.

Here: the shard geometry, the message packing, the per-shard optimizers
(momentum SGD and Adagrad) and small polling helpers, so that waiting ranks
sleep between tests instead of spinning on cores the workers need.
"""
from __future__ import annotations

import time

import numpy as np

# Message tags (one namespace for both strategies).
FETCH, WEIGHTS, PUSH, DONE, SNAP, SNAP_REPLY = 11, 12, 13, 14, 15, 16
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
            time.sleep(poll)
    return time.perf_counter() - t0


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
        time.sleep(poll)
    return comm.recv(source=st.Get_source(), tag=tag)


# ---- per-shard optimizers -----------------------------------------------------
class ShardSGD:
    """v = mu v - lr (g + k wd w); w += v, where g is the sum of k replica
    gradients (a push of k accumulated steps decays the weights k times): with
    k = 1 exactly the engine's single-process SGD step."""
    kind = "sgd"

    def __init__(self, n, momentum=0.9, weight_decay=0.0):
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.v = np.zeros(n, np.float32)

    def apply(self, w, g, lr, k=1):
        g = g + (k * self.weight_decay) * w if self.weight_decay else g
        self.v *= np.float32(self.momentum)
        self.v -= np.float32(lr) * g
        w += self.v

    def state(self):
        return {"velocity": self.v}

    def load(self, st):
        self.v[...] = st["velocity"]


class ShardAdagrad:
    """DistBelief's per-parameter learning rates: h += g^2; w -= lr g / sqrt(h)
    (g with k * wd * w folded in), h starting at ``init`` so that the first
    steps are not lr-sized in every coordinate."""
    kind = "adagrad"

    def __init__(self, n, weight_decay=0.0, init=0.1, eps=1e-10):
        self.weight_decay, self.eps = float(weight_decay), float(eps)
        self.h = np.full(n, init, np.float32)

    def apply(self, w, g, lr, k=1):
        g = g + (k * self.weight_decay) * w if self.weight_decay else g
        self.h += g * g
        w -= np.float32(lr) * g / (np.sqrt(self.h) + np.float32(self.eps))

    def state(self):
        return {"accumulator": self.h}

    def load(self, st):
        self.h[...] = st["accumulator"]


SERVER_OPTS = {"sgd": ShardSGD, "adagrad": ShardAdagrad}


def make_server_opt(kind, n, momentum=0.9, weight_decay=0.0):
    if kind == "sgd":
        return ShardSGD(n, momentum, weight_decay)
    if kind == "adagrad":
        return ShardAdagrad(n, weight_decay)
    raise ValueError(f"server optimizer must be one of {sorted(SERVER_OPTS)}, got {kind!r} (--server-opt)")


def role_map(servers: int, size: int, bounds) -> str:
    """One line naming every rank's role (a killed rank is reported by pid;
    with the rank map this says which server or replica it was)."""
    parts = [f"rank {s}: server {s} [{lo}, {hi})" for s, (lo, hi) in enumerate(bounds)]
    parts += [f"rank {r}: replica {r - servers}" for r in range(servers, size)]
    return "; ".join(parts)


# ---- `sprint train` options of the parameter-server strategies ------------------
_PS = ("downpour", "sandblaster")
# (flag, key in TrainConfig.extra, argparse keywords, strategies it applies to)
TRAIN_OPTIONS = (
    ("--servers", "servers", dict(type=int, help="downpour, sandblaster: parameter-server ranks S; the other "
                                                 "mpiexec ranks are model replicas (default 1)"), _PS),
    ("--fetch-every", "fetch_every", dict(type=int, help="downpour: replicas fetch the weights every n steps "
                                                         "(default 1)"), ("downpour",)),
    ("--push-every", "push_every", dict(type=int, help="downpour: replicas push their summed gradients every "
                                                       "n steps (default 1)"), ("downpour",)),
    ("--server-opt", "server_opt", dict(choices=sorted(SERVER_OPTS),
                                        help="downpour: the servers' optimizer (default adagrad)"), ("downpour",)),
    ("--slice", "slice", dict(type=int, help="sandblaster: samples per slice handed to a replica (default 32; "
                                             "--batch is the L-BFGS batch)"), ("sandblaster",)),
    ("--history", "history", dict(type=int, help="sandblaster: L-BFGS pairs kept (default 10)"), ("sandblaster",)),
    ("--no-backup", "backup", dict(action="store_const", const=False,
                                   help="sandblaster: no backup copies of late slices (a static-split baseline "
                                        "with --slice = batch / replicas)"), ("sandblaster",)),
    ("--slow-rank", "slow_rank", dict(type=int, help="downpour, sandblaster (benchmarking aid): this replica "
                                                     "rank sleeps (F-1) x its compute time after each step"), _PS),
    ("--slow-factor", "slow_factor", dict(type=float, help="the F of --slow-rank (default 2)"), _PS),
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
class PSJob:
    """Ranks' roles, the net and data, the run folder, evaluation and
    checkpoints of a Downpour or Sandblaster run (``mode``). Server 0 is the
    one that evaluates, logs and writes; every rank holds the data (replicas
    train on it, and all ranks prove they agree on it at start)."""

    def __init__(self, cfg, mode, comm=None):
        import json
        import sys
        from pathlib import Path
        from engine import checkpoint as ckpt, metrics as _metrics
        from engine.net import Net
        from engine.optim import make_schedule
        from engine.spec import get_spec
        from engine.train import CHECKPOINT, CONFIG, METRICS, prepare_data, setup_device
        from . import comm as _comm
        from .runner import _check_ranks_agree
        self.cfg, self.mode = cfg, mode
        self.comm = comm if comm is not None else _comm.get_comm()
        extra = dict(cfg.extra or {})
        self.S = int(extra.get("servers", 1))
        if not isinstance(self.comm, _comm.MPIComm) or self.comm.size < self.S + 1:
            raise ValueError(f"--parallel {mode} needs mpiexec -n S+R with S = {self.S} server(s) and at "
                             f"least one replica, got {self.comm.size} process(es) (--servers)")
        self.R = self.comm.size - self.S
        self.rank = self.comm.rank
        self.is_server = self.rank < self.S
        self.be = setup_device(cfg)
        self.spec = get_spec(cfg.model)
        self.train_ds, self.test_ds, self.deform = prepare_data(cfg, self.spec)
        try:
            _check_ranks_agree(self.comm, cfg, self.spec, self.train_ds, self.test_ds)
        except _comm.ConfigMismatch as e:
            if self.rank == 0:
                print(f"sprint: {e}", file=sys.stderr, flush=True)
            self.comm.barrier()
            raise
        net0 = Net(self.spec, seed=cfg.seed)
        self.n_param = int(net0.n_params)
        self.bounds = shard_bounds(self.n_param, self.S)
        roles = role_map(self.S, self.comm.size, self.bounds)
        pids = self.comm.rank_map()
        if self.rank == 0:
            print(f"sprint: {pids}\nsprint: {mode} roles: {roles}", file=sys.stderr, flush=True)
        self.state = None
        if cfg.resume:
            self.state = self.comm.bcast_obj(ckpt.load(Path(cfg.resume) / CHECKPOINT) if self.rank == 0 else None)
            if self.state.get("spec_hash") != self.spec.hash():
                raise ValueError(f"checkpoint was written for another network ({cfg.resume})")
            if self.state.get("mode") != mode:
                raise ValueError(f"checkpoint is from a {self.state.get('mode')!r} run, not {mode!r} ({cfg.resume})")
        from ._xp import to_host
        self.w0 = (np.asarray(self.state["params"], np.float32) if self.state is not None
                   else to_host(net0.params).astype(np.float32))
        self.start_samples = int(self.state["samples"]) if self.state else 0
        self.n_file = len(self.train_ds)
        self.start_epoch = self.start_samples // self.n_file
        self.sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
        self.max_samples = int(extra.get("max_samples", cfg.epochs * self.n_file))
        self.last_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, cfg.stop_after)
        self.run_dir = Path(cfg.out) if cfg.out else (Path(cfg.resume) if cfg.resume else None)
        self._ckpt, self._metrics = ckpt, _metrics
        self._paths = (CHECKPOINT, METRICS)
        if self.rank == 0 and self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            _atomic_text(self.run_dir / CONFIG, json.dumps({"train": cfg.to_dict(), "spec": self.spec.to_dict(),
                                                            "deform": self.deform.to_dict()}, indent=2))
            _metrics.truncate(self.run_dir / METRICS, self.start_epoch)
        self.history = []
        self.t0 = time.perf_counter()
        self._t_epoch = self.t0
        self._eval_net = None

    def net(self):
        from engine.net import Net
        return Net(self.spec, seed=self.cfg.seed)

    def evaluate(self, w):
        """(loss, accuracy) of the full vector ``w`` on the whole test set."""
        from engine.train import evaluate
        if self._eval_net is None:
            self._eval_net = self.net()
        self._eval_net.set_flat(w)
        return evaluate(self._eval_net, self.test_ds, self.cfg.eval_batch, self.deform)

    def end_epoch(self, epoch, w, opt_state: dict, counters: dict, window):
        """Server 0: evaluate, log a metrics line, write the checkpoint."""
        seen, tr_loss, tr_acc = window
        now = time.perf_counter()
        test_loss, test_acc = self.evaluate(w)
        rec = {"epoch": int(epoch), "step": int(counters.get("step", 0)),
               "lr": float(self.sched(epoch)), "train_loss": tr_loss, "train_acc": tr_acc,
               "test_loss": test_loss, "test_acc": test_acc,
               "images_per_s": seen / (now - self._t_epoch) if now > self._t_epoch else 0.0,
               "time": now - self.t0, "skipped": self.train_ds.skipped + self.test_ds.skipped,
               "parallel": self.mode, "servers": self.S, "replicas": self.R}
        self.history.append(rec)
        if self.run_dir is not None:
            self.save(epoch, w, opt_state, counters)
            self._metrics.append(self.run_dir / self._paths[1], rec)
        if self.cfg.verbose:
            print(f"epoch {epoch:3d}  train_loss {tr_loss:.4f}  test_loss {test_loss:.4f}  "
                  f"test_acc {100 * test_acc:6.2f} %  {rec['images_per_s']:,.0f} img/s  {rec['time']:.1f} s",
                  flush=True)
        self._t_epoch = time.perf_counter()
        return epoch >= self.last_epoch

    def save(self, epoch, w, opt_state, counters):
        if self.run_dir is None:
            return
        st = {"params": np.asarray(w, np.float32), "opt": opt_state, "mode": self.mode, "epoch": int(epoch),
              "samples": int(counters.get("samples", 0)), "step": int(counters.get("step", 0)),
              "servers": self.S, "replicas": self.R, "spec": self.spec.to_dict(),
              "spec_hash": self.spec.hash(), "deform": self.deform.to_dict(),
              "rng": {"seed": int(self.cfg.seed), "next_epoch": int(epoch)}}
        st.update({k: v for k, v in counters.items() if k not in st})
        self._ckpt.save(self.run_dir / self._paths[0], st)

    def finish(self, stats: dict, w_final):
        """Every rank: the result dict; rank 0 also writes ``<mode>_stats.json``."""
        import json
        if self.rank == 0 and self.run_dir is not None:
            _atomic_text(self.run_dir / f"{self.mode}_stats.json", json.dumps(stats))
        final = self.history[-1] if self.history else {}
        net = None
        if self.rank == 0:
            net = self.net()
            net.set_flat(w_final)
            if not self.history:
                final = dict(zip(("test_loss", "test_acc"), self.evaluate(w_final)))
        return {"run_dir": str(self.run_dir) if self.run_dir else None,
                "epochs": int(stats.get("samples", 0) // self.n_file), "history": self.history,
                "test_acc": final.get("test_acc"), "test_loss": final.get("test_loss"),
                "train_loss": final.get("train_loss"), "time_s": time.perf_counter() - self.t0,
                "n_params": self.n_param, "net": net, "stats": stats, "rank": self.rank,
                "n_node": self.comm.size}


def _atomic_text(path, text):
    import os
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
