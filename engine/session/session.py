"""One training run's shared life, whatever the strategy: device, data,
weights to start from, the run folder, evaluation, per-epoch records and
output. A strategy builds its trainers between ``load_state`` and
``start``, then calls ``end_epoch`` after each epoch."""
from __future__ import annotations

import sys
import time

from engine.errors import Diverged, Interrupted, NotRecovered, RunError

from .rundir import CHECKPOINT, RunDir, new_run_id
from .setup import batch_note, check_memory, evaluate_sharded, prepare_data, setup_device


class Session:
    def __init__(self, cfg, comm=None):
        from engine.parallel.comm import LocalComm
        from engine.spec import get_spec
        from .watchdog import Watchdog
        self.cfg = cfg
        self.comm = comm if comm is not None else LocalComm()
        self.root = self.comm.rank == 0
        self.t0 = time.perf_counter()
        self.watchdog = Watchdog(self.comm, cfg.timeout)
        self.watchdog.saved = self._saved_note
        self.backend = setup_device(cfg)
        self.gpu = getattr(self.backend, "name", "cpu") == "gpu"
        if not cfg.resume and self.comm.size > 1:
            # rank 0's folder: a default name is claimed there (train_cli), and
            # ranks that write files of their own (pipeline stages) must agree
            cfg.out = self.comm.bcast_obj(cfg.out)
        if cfg.out and not cfg.resume:
            self._on_root(RunDir(cfg.out).refuse_a_run)
        self.spec = get_spec(cfg.model)
        self.train_ds, self.test_ds, self.deform = prepare_data(cfg, self.spec)
        check_memory(cfg, self.spec, self.backend, len(self.train_ds))
        note = batch_note(cfg, self.train_ds)
        if note and self.root:
            from engine.data.dataset import warn
            warn(note)
        path = cfg.out or cfg.resume
        self.run = RunDir(path) if path else None
        if self.run is not None and self.root:
            self.run.clean()
        self.history: list = []
        self.first_new = 0         # history[first_new:] are this invocation's epochs
        self.saved_epoch = 0       # last epoch whose checkpoint is on disk
        self.run_id = None
        self.planned_epochs = None   # epochs the resumed run had planned
        self.show_progress = (cfg.progress if cfg.progress is not None
                              else bool(getattr(sys.stderr, "isatty", lambda: False)()))

    def close(self, ok: bool = True):
        self.watchdog.close(ok)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            from engine.errors import ctrl_c_handled
            ctrl_c_handled()
        self.close(ok=exc_type is None)
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            # every strategy's Ctrl-C says how to resume, not only those that ask for it
            raise self.interrupted() from None
        return False

    # ---- where the weights come from -------------------------------------------
    def load_state(self, weights: bool = True) -> dict | None:
        """The checkpoint to resume from (cfg.resume), or one whose weights start
        this run (cfg.init_from, state with 'params' only), or None. Read on rank
        0, shared with every rank; errors are raised on every rank.
        ``weights=False``: resume from the checkpoint's values without its
        arrays (a strategy whose ranks read their own weight files)."""
        cfg = self.cfg
        if cfg.resume:
            state = self._on_root(lambda: self._read_resume(weights))
            self.history = list(state.get("history") or [])
            self.first_new = len(self.history)
            self.saved_epoch = int(state.get("epoch", 0))
            self._tell_watcher()
            self.run_id = state.get("run_id")
            self.planned_epochs = state.pop("planned_epochs", None)
        elif cfg.init_from:
            state = self._on_root(self._read_init)
        else:
            state = None
        if self.run_id is None:
            self.run_id = self.comm.bcast_obj(new_run_id() if self.root else None)
        return state

    def _read_resume(self, weights: bool = True) -> dict:
        rd = RunDir(self.cfg.resume)
        config = rd.read_config()
        if not rd.file(CHECKPOINT).exists():
            # a run stopped before its first epoch ended ('nothing to resume in DIR'): --resume
            # said 'no such checkpoint file or run folder' of a folder that is there
            raise RunError(f"holds no checkpoint ({CHECKPOINT}), so nothing to resume (a run stopped before its "
                           f"first epoch ended saves none); start it anew with sprint train --out {rd.path}", rd.path)
        state = rd.load_checkpoint(arrays=weights)
        self._check_spec(state, rd.file(CHECKPOINT), need_params=weights)
        want, got = config.get("run_id"), state.get("run_id")
        if want and got and want != got:
            raise RunError(f"the checkpoint belongs to run {got}, the folder to run {want}; to start a new "
                           f"run from those weights use --init-from", rd.file(CHECKPOINT))
        state["run_id"] = want or got
        planned = (config.get("train") or {}).get("epochs")
        state["planned_epochs"] = planned if isinstance(planned, int) else None
        if not state.get("history"):
            state["history"] = rd.legacy_history(int(state.get("epoch", 0)))
        return state

    def _read_init(self) -> dict:
        from engine import checkpoint as _ckpt
        state = _ckpt.load(self.cfg.init_from)
        self._check_spec(state, self.cfg.init_from)
        return {"params": state["params"]}

    def _check_spec(self, state, where, need_params: bool = True):
        if state.get("spec_hash") != self.spec.hash():
            from engine.spec import PRESETS
            name = (state.get("spec") or {}).get("name") if isinstance(state.get("spec"), dict) else None
            # --init-from a cifar run without --model started a digits run from it
            hint = (f"; give --model {name}" if self.cfg.init_from and name in PRESETS
                    and PRESETS[name].hash() == state.get("spec_hash") else "")
            raise RunError(f"the checkpoint was written for model {name!r}, not {self.spec.name!r}{hint}", where)
        if need_params and "params" not in state:
            raise RunError("the checkpoint holds no parameters", where)
        if need_params:
            from engine.checkpoint import check_params
            check_params(state, self.spec, where)

    def _on_root(self, fn):
        """fn() on rank 0; its result, or its error, on every rank."""
        if self.comm.size == 1:
            return fn()
        if self.root:
            try:
                value = fn()
            except (RunError, OSError, ValueError) as e:
                self.comm.bcast_obj(("error", str(e)))
                raise
            return self.comm.bcast_obj(("ok", value))[1]
        kind, value = self.comm.bcast_obj(None)
        if kind == "error":
            e = RunError(value)
            e.reported_by_root = True     # the CLI prints it once, on rank 0
            raise e
        return value

    # ---- the run folder --------------------------------------------------------
    def start(self, start_epoch: int = 0):
        """Write config.json and metrics.jsonl (from the checkpoint's history)."""
        from engine.errors import counted, raise_if_ctrl_c
        raise_if_ctrl_c()           # one dropped while the run was set up: no epoch begins
        self.history = [r for r in self.history if r.get("epoch", 0) <= start_epoch]
        self.first_new = len(self.history)
        idle = self.cfg.resume and start_epoch >= self.cfg.epochs
        if idle:
            self.log(f"the run already has {counted(start_epoch, 'epoch')} (--epochs {self.cfg.epochs}): nothing to "
                     f"train; a larger --epochs continues it")
        self._say_replanned(start_epoch)
        if self.run is None:
            return

        def write():
            self.run.prepare()
            if not idle:
                # a resume that trains nothing keeps the saved options: `--resume --epochs 1` of a
                # 2-epoch run saved epochs 1, and the next plain --resume said "(--epochs 1)"
                self.run.write_config({"run_id": self.run_id, "train": self.cfg.to_dict(),
                                       "spec": self.spec.to_dict(), "deform": self.deform.to_dict()})
            self.run.write_metrics(self.history)
        self._root_writes(write)

    def _say_replanned(self, start_epoch):
        """Resuming with another --epochs re-plans the schedule for the new
        total, as if the run had started with it (the epochs already trained
        keep their rates): say so, with the rate the next epoch starts at."""
        cfg, old = self.cfg, self.planned_epochs
        if not cfg.resume or old is None or old == cfg.epochs or cfg.schedule == "constant":
            return
        from engine.optim import make_schedule
        sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
        if start_epoch < cfg.epochs:
            self.log(f"--epochs {cfg.epochs} (was {old}): the {cfg.schedule} schedule is re-planned for "
                     f"{cfg.epochs} epochs as if the run had started with them; epoch {start_epoch + 1} "
                     f"starts at lr {sched(start_epoch):.3g}")

    def end_epoch(self, rec: dict, state: dict | None, every_rank: bool = True):
        """Record an epoch: checkpoint (carrying the whole history) first, then
        metrics.jsonl, then the line on stdout. ``every_rank``: all ranks
        record it (False: only a parameter server's rank 0 does)."""
        self.history.append(rec)
        if self.run is not None:
            epoch = int(rec["epoch"])

            def write():          # rank 0's state (a layer-wise run gathers it there only)
                if state is not None:
                    self.run.save_checkpoint(dict(state, history=list(self.history), run_id=self.run_id))
                    self.saved_epoch = epoch
                    self.run.write_metrics(self.history)
            try:
                self._root_writes(write, every_rank)
            except OSError as e:
                # a full disk or a size limit: the epochs before stay whole
                # (atomic writes), which the error line alone did not say
                e.after = self._saved_note()
                raise
            if state is not None:
                self.saved_epoch = epoch
                self._tell_watcher()
        self.report(rec)
        self._warn_if_diverging(rec)

    # a training loss this many times a blind guess's (ln C) is a run that diverges
    DIVERGING = 10.0

    def _guess(self) -> float:
        """The training loss of a blind guess: ln C for C classes."""
        import math
        return math.log(max(2, self.spec.fcs[-1]))

    def _over(self, loss) -> bool:
        import math
        return loss is not None and not loss <= self.DIVERGING * self._guess()     # NaN too

    def _lr(self):
        """The lr a divergence names; None where --lr sets no step (Sandblaster's line search)."""
        from .registry import get_strategy
        return self.cfg.lr if get_strategy(self.cfg.parallel).lr else None

    def _warn_if_diverging(self, rec: dict):
        """A loss that grows without becoming Inf or NaN is not stopped (the
        run may come back), but it is said: the accuracy at chance that comes
        with it is otherwise left to be noticed. The run's end judges it
        (not_recovered)."""
        import math
        loss = rec.get("train_loss")
        if not self.root or loss is None or not math.isfinite(loss) or not self._over(loss):
            return
        from engine.data.dataset import warn
        lr = self._lr()
        warn(f"epoch {rec.get('epoch')}: the training loss {loss:.3g} is over {self.DIVERGING:g} times a blind "
             f"guess's ({self._guess():.2f} for {self.spec.fcs[-1]} classes): the run is diverging"
             + (f"; a lower --lr (now {lr:g}) may help" if lr is not None else ""))

    def not_recovered(self) -> NotRecovered | None:
        """A run whose training loss went over DIVERGING times a blind
        guess's (or became NaN/Inf without stopping it: Sandblaster's line
        search steps around such points) and whose last epoch is still no
        better than a blind guess diverged, although no NaN stopped it: the
        run's end says so (its last line, exit 1), on every rank alike. A
        run that came back under a guess's loss is left alone (Lightning's
        EarlyStopping and Keras' TerminateOnNaN do not stop on a large loss
        by default either; this stops nothing, it judges the end)."""
        verdict = None
        if self.root:
            losses = [(r.get("train_loss"), r.get("epoch")) for r in self.history
                      if r.get("train_loss") is not None]
            over = [(loss, epoch) for loss, epoch in losses if self._over(loss)]
            if over and not losses[-1][0] < self._guess():
                peak = max(over, key=lambda le: le[0] if le[0] == le[0] else float("inf"))
                verdict = (peak, losses[-1])
        if self.comm.size > 1:
            verdict = self.comm.bcast_obj(verdict)
        if verdict is None:
            return None
        (peak, peak_epoch), (last, last_epoch) = verdict
        return NotRecovered(peak, peak_epoch, last, last_epoch, self._guess(), self.DIVERGING, self._lr(),
                            str(self.run) if self.run else None)

    def write_stats(self, name, stats: dict):
        if self.run is not None:
            self._root_writes(lambda: self.run.write_json(name, stats))

    def _root_writes(self, write, every_rank: bool = True):
        """Rank 0 writes the run folder. When every rank gets here, its error
        (a full disk) is raised on all of them (_on_root): the others would
        wait for it in their next collective, and the job end in MPI_Abort
        instead of the one line."""
        if every_rank:
            self._on_root(write)
        elif self.root:
            write()

    # ---- evaluation and output -------------------------------------------------
    def evaluate(self, net):
        """(loss, accuracy) on the whole test set, each rank a shard."""
        return evaluate_sharded(self.comm, net, self.test_ds, self.cfg.eval_batch, self.deform)

    def log(self, msg: str):
        if self.root and self.cfg.verbose:
            print(msg, flush=True)

    def progress(self, total, desc, unit="batch", initial=0):
        """A tqdm bar on stderr (rank 0, when shown), else None."""
        if not (self.root and self.show_progress):
            return None
        from tqdm import tqdm
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=False, file=sys.stderr,
                    dynamic_ncols=True)

    def report(self, rec: dict, bar=None):
        if not (self.root and self.cfg.verbose):
            return
        if bar is not None:
            bar.clear()
        print(epoch_line(rec, self.cfg.epochs), flush=True)

    # ---- endings ---------------------------------------------------------------
    def diverged(self, loss, epoch, step, lr, saved=None) -> Diverged:
        """``saved``: the last checkpointed epoch, where this rank does not
        write them (a parameter server's replicas). The lr named is the
        run's --lr: the schedule's rate at that step (`--lr 1e9` diverged
        "now 6.6e+07", in warmup) is not a value the user gave."""
        lr = self._lr() if lr is not None else None
        return Diverged(loss, epoch, step, lr, run_dir=str(self.run) if self.run else None,
                        last_epoch=self.saved_epoch if saved is None else saved)

    def _saved_note(self) -> str:
        """'; epoch 5 is saved: resume with: ...' for a run that ends on a
        silent rank (said by the watchdog's thread: no file is read) or a
        failed write."""
        from engine.errors import resume_with
        if self.run is None or not self.saved_epoch:
            return ""
        return f"; epoch {self.saved_epoch} is saved: {resume_with(self.run, self.comm.size)}"

    def _tell_watcher(self):
        """Rank 0 keeps the death watcher (engine.parallel.deathwatch) told what
        the run keeps: a rank killed outright is reported by it."""
        if self.root and self.comm.size > 1:
            from engine.parallel import deathwatch
            deathwatch.saved(self._saved_note())

    def interrupted(self) -> Interrupted:
        epoch = self.saved_epoch
        if self.run is not None and self.root:
            # Ctrl-C can land between a checkpoint's rename and the update of
            # saved_epoch (faster epochs make that likelier): the file is the truth
            try:
                epoch = max(epoch, int(self.run.load_checkpoint(arrays=False).get("epoch", 0)))
            except (OSError, ValueError):
                pass
        return Interrupted(epoch, str(self.run) if self.run else None, ranks=self.comm.size)

    def result(self, net, epochs: int, **more) -> dict:
        """What the run returns (every rank calls it); a run that diverged
        without a NaN raises NotRecovered instead."""
        bad = self.not_recovered()
        if bad is not None:
            raise bad
        new = self.history[self.first_new:]
        # nothing new (a resume of a finished run): the run's own last epoch
        final = (new or self.history or [{}])[-1]
        out = {"run_dir": str(self.run) if self.run else None, "epochs": int(epochs), "history": new,
               "test_acc": final.get("test_acc"), "test_loss": final.get("test_loss"),
               "train_loss": final.get("train_loss"), "time_s": time.perf_counter() - self.t0,
               "n_params": net.n_params, "net": net}
        out.update(more)
        return out


def epoch_line(rec: dict, epochs: int | None = None) -> str:
    ep = f"{rec['epoch']:3d}" + (f"/{epochs}" if epochs else "")
    line = (f"epoch {ep}  train_loss {rec['train_loss']:.4f}  test_loss {rec['test_loss']:.4f}  "
            f"test_acc {100 * rec['test_acc']:6.2f} %  {rec['images_per_s']:,.0f} img/s  "
            f"time {rec['time']:.1f} s")
    if rec.get("skipped"):
        from engine.errors import counted
        line += f"  ({counted(rec['skipped'], 'unreadable file')} skipped)"
    return line
