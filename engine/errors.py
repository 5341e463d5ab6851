"""The errors a run reports to its user, each saying what went wrong and
where (a file or an option); the CLI prints each as one
``sprint: error: <what> (<where>)`` line. Any exception with ``what`` and
``where`` attributes is printed that way."""
from __future__ import annotations


class RunError(ValueError):
    """Something about the run's inputs or folder is wrong: ``what`` (``where``)."""

    def __init__(self, what: str, where=None):
        self.what, self.where = what, (str(where) if where is not None else None)
        super().__init__(f"{what} ({self.where})" if self.where else what)


class Diverged(FloatingPointError):
    """The training loss became NaN or Inf. ``lr`` None: the strategy
    chooses its own steps (no --lr to lower)."""

    def __init__(self, loss, epoch, step, lr, run_dir=None, last_epoch=None):
        self.loss, self.epoch, self.step, self.lr = loss, epoch, step, lr
        self.run_dir, self.last_epoch = run_dir, last_epoch
        kept = (f"; the checkpoint of epoch {last_epoch} stays in {run_dir}"
                if run_dir and last_epoch else "")
        at = f"epoch {epoch}, step {step}" if step is not None else f"epoch {epoch}"
        super().__init__(f"training diverged: the loss became {loss} at {at}{kept}{lower_lr(lr)}")


def counted(n, noun: str, plural: str = None, fmt: str = "") -> str:
    """'1 epoch', '2 epochs': a count in a message, its noun agreeing
    (``plural`` where it is not noun + s: 'batch', 'batches'; ``fmt``: the
    count's format, ',' for thousands)."""
    return f"{n:{fmt}} {noun if n == 1 else (plural or noun + 's')}"


def lower_lr(lr) -> str:
    return f"; try a lower learning rate (--lr, now {lr:g})" if lr is not None else ""


class NotRecovered(Diverged):
    """The training loss went over ``limit`` (a multiple of a blind guess's,
    ``guess``) and the run ended no better than a blind guess: it diverged
    without a NaN. Said when the run ends, so a run that comes back is not
    stopped."""

    def __init__(self, peak, peak_epoch, last, last_epoch, guess, limit, lr, run_dir=None):
        self.loss, self.epoch, self.step, self.lr = last, last_epoch, None, lr
        self.run_dir, self.last_epoch = run_dir, last_epoch
        over = f"over {limit:g} times a blind guess's {guess:.2f}"
        if not last <= limit * guess:        # NaN too
            what = f"the training loss was {last:.3g} in the last epoch ({last_epoch}), {over}"
        else:
            what = (f"the training loss reached {peak:.3g} in epoch {peak_epoch} ({over}) and ended at "
                    f"{last:.3g} in epoch {last_epoch}, no better than a blind guess")
        where = f" (its epochs: {run_dir}/metrics.jsonl)" if run_dir else ""
        FloatingPointError.__init__(self, f"training diverged: {what}{where}{lower_lr(lr)}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: ``epoch`` epochs are safe in ``run_dir``; a job
    of ``ranks`` MPI ranks resumes under mpiexec with as many."""

    def __init__(self, epoch: int, run_dir=None, ranks: int = 1):
        self.epoch, self.run_dir = int(epoch), (str(run_dir) if run_dir else None)
        if self.run_dir and self.epoch:
            msg = f"interrupted after epoch {self.epoch}; {resume_with(self.run_dir, ranks)}"
        elif self.run_dir:
            msg = f"interrupted before the first epoch ended; nothing to resume in {self.run_dir}"
        else:
            msg = f"interrupted after epoch {self.epoch}"
        super().__init__(msg)

    def __str__(self):
        return self.args[0]


def resume_with(run_dir, ranks: int = 1) -> str:
    """How a stopped run continues: a job of ``ranks`` MPI ranks under mpiexec with as many."""
    launcher = f"mpiexec -n {ranks} " if ranks > 1 else ""
    return f"resume with: {launcher}sprint train --resume {run_dir}"


class MissingFile(RunError, FileNotFoundError):
    """A file or folder the run needs does not exist."""


# ---- Ctrl-C that Python dropped ------------------------------------------------
# Python raises KeyboardInterrupt wherever the main thread is when SIGINT
# comes; where that is a callback (an import lock's weakref while modules
# load, a __del__) it is printed as "Exception ignored" and lost: that rank
# trained on to the end, or waited for peers that had stopped. The CLI's
# handler (watch_ctrl_c) also keeps a flag, cleared where a KeyboardInterrupt
# is caught (ctrl_c_handled); raise_if_ctrl_c, called before a run starts and
# at each MPI wait of the main thread, raises a dropped one again.
#
# Under mpiexec a rank's Ctrl-C is held (recorded, not raised) from the
# start until MPI is up on it (release_ctrl_c, before a run): every rank
# then meets the others in MPI_Init and the job ends as one. A rank that
# left before MPI_Init (a KeyboardInterrupt while its modules loaded, or
# one that left numpy half-imported and the exit path failing on it) hung
# the job for good: its peers spun in MPI_Init waiting for it.
_ctrl_c = False
_held = False


def watch_ctrl_c(hold: bool = False) -> None:
    """``hold``: hold a Ctrl-C until release_ctrl_c (a rank under mpiexec)."""
    import signal
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return                      # someone else's handler (an embedding program): theirs
    global _held
    _held = hold

    def on_sigint(signum, frame):
        global _ctrl_c
        _ctrl_c = True
        if not _held:
            raise KeyboardInterrupt
    signal.signal(signal.SIGINT, on_sigint)
    import sys
    before = sys.unraisablehook

    def unraisable(u):
        # the dropped KeyboardInterrupt's "Exception ignored" traceback: it is raised again
        if not (isinstance(u.exc_value, KeyboardInterrupt) and _ctrl_c):
            before(u)
    sys.unraisablehook = unraisable


def ctrl_c_handled() -> None:
    global _ctrl_c
    _ctrl_c = False


def deferring_ctrl_c():
    """A context in which Ctrl-C is recorded, not raised, and raised on
    leaving it: around MPI_Init. There a SIGINT cut MPICH's system calls
    (the rank crashed: mpiexec said 'Segmentation fault', exit 11), or its
    KeyboardInterrupt came out of the import machinery half-way through
    mpi4py's module. SIGINT is blocked in this thread meanwhile and its
    Python handler only records it (main thread only; an ignored or default
    SIGINT is left as it is). Held (watch_ctrl_c), it is raised by
    release_ctrl_c instead."""
    import contextlib
    import signal
    import threading

    @contextlib.contextmanager
    def deferred():
        before = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or before in (
                signal.SIG_IGN, signal.SIG_DFL, None):
            yield
            return
        got = []
        signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)     # a pending SIGINT comes now, recorded
            signal.signal(signal.SIGINT, before)
        if got:
            global _ctrl_c
            _ctrl_c = True
            if not _held:           # held: release_ctrl_c raises it
                raise KeyboardInterrupt
    return deferred()


def release_ctrl_c() -> None:
    """MPI is up on this rank: raise a held Ctrl-C, and any later one at once."""
    global _held
    _held = False
    raise_if_ctrl_c()


def raise_if_ctrl_c() -> None:
    """Raise the KeyboardInterrupt of a Ctrl-C no handler caught (main thread only:
    a worker or updater thread leaves it to the main thread)."""
    if _ctrl_c:
        import threading
        if threading.current_thread() is threading.main_thread():
            ctrl_c_handled()
            raise KeyboardInterrupt
