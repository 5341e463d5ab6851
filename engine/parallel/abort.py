"""How a failure on one rank ends the whole MPI job instead of leaving the
other ranks waiting in a collective: a rank's last words on stderr, the
hooks that turn an uncaught exception in any thread into a job-wide abort
naming the rank, ``abort_on_error`` / ``run_guarded`` around a strategy's
body, and ``abort_once`` for a mistake in the job's inputs, said once for
the job (the CLI uses it for what it refuses before a run is set up): when
every rank met it, the ranks agree on it (``end_job``) and exit cleanly,
without MPI_Abort and the launcher's own abort message. The
collectives themselves are in engine.parallel.comm; the heartbeat watchdog
that ends a job whose rank fell silent is engine.session.watchdog."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from .comm import Comm, ConfigMismatch, get_comm
from .waits import test_until

# seconds a rank other than 0 waits before reporting an input error (abort_once)
USAGE_ERROR_GRACE_S = 3.0


def say_before_abort(text: str):
    """Write ``text`` to stderr after whatever stdout holds, flushed: the
    last words of a rank before MPI_Abort."""
    from .deathwatch import quiet
    quiet()                  # this rank's death is explained: the death watcher stays silent
    try:
        sys.stdout.flush()
    except Exception:
        pass
    sys.stderr.write(text)
    sys.stderr.flush()


def report_failure(rank, size, message):
    say_before_abort(f"sprint: rank {rank} of {size} failed: {message}\n"
                     f"sprint: aborting all ranks because rank {rank} failed\n")


def install_abort_hooks(comm: Comm) -> None:
    """Make an uncaught exception in any thread end the whole job (naming the
    rank) instead of leaving the other ranks waiting in a collective."""
    if comm.size <= 1:
        return

    def _hook(exc_type, exc, tb):
        import traceback
        report_failure(comm.rank, comm.size, f"{exc_type.__name__}: {exc}")
        traceback.print_exception(exc_type, exc, tb)
        comm.abort(f"{exc_type.__name__}: {exc}", report=False)

    def _thread_hook(args):
        _hook(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = _hook
    threading.excepthook = _thread_hook


def run_guarded(body, cfg):
    """``body(cfg, comm)`` on this rank under the abort rules every MPI
    strategy shares: the job's communicator, the abort hooks, and an
    exception turned into a job-wide abort that names the rank."""
    from engine.errors import release_ctrl_c
    comm = get_comm()
    release_ctrl_c()         # one held until every rank's MPI was up: the job ends as one
    install_abort_hooks(comm)
    with abort_on_error(comm):
        return body(cfg, comm)


@contextlib.contextmanager
def abort_on_error(comm: Comm):
    """Turn an exception on this rank into a job-wide abort naming the rank,
    so the other ranks do not wait forever in the next collective. A
    ConfigMismatch is raised on every rank alike and is let through."""
    try:
        yield comm
    except KeyboardInterrupt as e:
        from engine.errors import ctrl_c_handled
        ctrl_c_handled()
        if comm.size <= 1:
            raise
        # rank 0 says how to resume; every rank that got the Ctrl-C ends
        # cleanly, and a peer that sits in a blocking collective that never
        # returns once this rank leaves is ended by MPI_Abort
        abort_once(comm, str(e) or "interrupted", 130, quiet=comm.rank != 0)
    except (ConfigMismatch, SystemExit):
        raise
    except BaseException as e:
        if comm.size <= 1:
            raise
        from engine.cli import EXIT_FAILED, EXIT_USAGE, describe, is_usage_error
        from engine.errors import Diverged
        if not os.environ.get("SPRINT_DEBUG"):
            # A mistake in the job's inputs (data, model, options, run folder),
            # as the CLI would report it: one line, no traceback.
            quiet = bool(getattr(e, "reported_by_root", False))    # rank 0 said it
            if is_usage_error(e):
                abort_once(comm, f"sprint: error: {describe(e)}", EXIT_USAGE, quiet)
            # A divergence (Diverged, or the FloatingPointError of a pipeline's
            # last stage or a Downpour replica, where the loss lives on that rank
            # alone), a full disk, a file size limit or memory running out is the
            # run's or the machine's, not a bug: one line, no traceback.
            if isinstance(e, (Diverged, FloatingPointError, OSError, MemoryError)):
                abort_once(comm, f"sprint: error: {describe(e)}", EXIT_FAILED, quiet)
        import traceback
        # the line naming the rank first: it is what the other ranks' logs need
        report_failure(comm.rank, comm.size, f"{type(e).__name__}: {e}")
        traceback.print_exc()
        comm.abort(f"{type(e).__name__}: {e}", report=False)


def abort_once(comm: Comm, line: str, code: int, quiet: bool = False):
    """End the whole job with exit ``code`` after saying ``line`` once. A
    mistake in the job's inputs is usually made on every rank alike: rank 0
    says it at once, and when every rank reaches here within
    USAGE_ERROR_GRACE_S (end_job) the job ends cleanly, each rank with the
    same exit status, and rank 0 adds any rank's different line. Otherwise
    (a rank that did not fail, or died, or froze) the job is aborted; a
    rank other than 0 then says its line naming its rank (a file only this
    rank cannot read). ``quiet``: rank 0 already said this rank's error."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        # the job is ending: a Ctrl-C now (mpiexec's forward of one already
        # met, a second press) must not cut the ranks' agreed exit short;
        # mpiexec itself ends the job at a second Ctrl-C
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if comm.rank == 0 and not quiet:
        say_before_abort(line + "\n")
    agreed = end_job(comm, "" if quiet else line, code)
    if agreed is None:
        if comm.rank and not quiet:
            say_before_abort(f"{line} (rank {comm.rank} of {comm.size})\n")
        comm.abort(line, code=code, report=False)
    codes, lines = agreed
    # the status of the first rank that said its error (rank 0's, usually):
    # the others may hold only its echo (reported_by_root)
    code = next((c for c, said in zip(codes, lines) if said), codes[0])
    if comm.rank == 0:
        for r, other in enumerate(lines):
            if other and other != line:
                say_before_abort(f"{other} (rank {r} of {comm.size})\n")
    _exit_together(comm, code)


# bytes of a rank's line that end_job carries (the rest is cut)
_LINE_BYTES = 2000


def end_job(comm: Comm, line: str, code: int, wait_s: float = None):
    """Meet the other ranks on the failure channel (MPIComm.open_failure_channel):
    (every rank's exit code, every rank's line) when all of them arrive within
    ``wait_s`` seconds, None when some rank does not (it runs on, died or
    froze: only MPI_Abort ends the job then). Non-blocking collectives with a
    deadline, so that a rank never waits here for one that will not come."""
    channel = getattr(comm, "failure_channel", None)
    if comm.size <= 1 or channel is None:
        return None
    import numpy as np
    MPI = comm.MPI
    mc, dup = channel
    deadline = time.monotonic() + (USAGE_ERROR_GRACE_S if wait_s is None else wait_s)
    if not test_until(dup, deadline):
        return None
    mine = np.zeros(8 + _LINE_BYTES, np.uint8)
    mine[:8] = np.frombuffer(np.int64(code).tobytes(), np.uint8)
    text = line.encode("utf-8", "replace")[:_LINE_BYTES]
    mine[8:8 + len(text)] = np.frombuffer(text, np.uint8)
    every = np.zeros((comm.size, mine.size), np.uint8)
    if not test_until(mc.Iallgather([mine, MPI.BYTE], [every, MPI.BYTE]), deadline):
        return None
    codes = [int(np.frombuffer(row[:8].tobytes(), np.int64)[0]) for row in every]
    lines = [row[8:].tobytes().rstrip(b"\0").decode("utf-8", "replace") for row in every]
    return codes, lines


def _exit_together(comm: Comm, code: int):
    """Every rank failed alike and knows it: leave through MPI_Finalize, which
    waits for the other ranks (their output is not cut short by a kill and
    the launcher prints no abort message), then exit with ``code`` through
    the C library's exit (_leave_registered_with_launcher). An alarm ends a
    process whose finalize would hang."""
    import signal
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    if hasattr(signal, "alarm"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(30)
    try:
        comm.settle()
        comm.MPI.Finalize()
    finally:
        _leave_registered_with_launcher(code)


def _leave_registered_with_launcher(code: int):
    """Exit with ``code`` through libc exit(), not os._exit. MPICH defers its
    PMI finalize to a C atexit hook (src/util/mpir_pmi.c), and MPICH's
    launcher (hydra's proxy, pmip_cb.c) SIGKILLs every process of the job
    the moment a rank's PMI socket closes without that finalize: os._exit
    skips the hook, so the first rank out killed the ranks still on their way
    out of MPI_Finalize (exit 9 and a 'BAD TERMINATION' banner, on a loaded
    host). The hook is called while this thread keeps the GIL (PyDLL), so no
    other Python thread runs during the C teardown."""
    from .deathwatch import quiet
    quiet()
    try:
        import ctypes
        ctypes.PyDLL(None).exit(int(code))
    finally:
        os._exit(code)
