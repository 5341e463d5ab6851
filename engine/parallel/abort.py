"""How a failure on one rank ends the whole MPI job instead of leaving the
other ranks waiting in a collective: a rank's last words on stderr, the
hooks that turn an uncaught exception in any thread into a job-wide abort
naming the rank, ``abort_on_error`` / ``run_guarded`` around a strategy's
body, and ``abort_once`` for a mistake in the job's inputs, said once for
the job (the CLI uses it for what it refuses before a run is set up). The
collectives themselves are in engine.parallel.comm; the heartbeat watchdog
that ends a job whose rank fell silent is engine.session.watchdog."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from .comm import Comm, ConfigMismatch, get_comm

# seconds a rank other than 0 waits before reporting an input error (abort_once)
USAGE_ERROR_GRACE_S = 3.0


def say_before_abort(text: str):
    """Write ``text`` to stderr after whatever stdout holds, flushed: the
    last words of a rank before MPI_Abort."""
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
    comm = get_comm()
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
        if comm.size <= 1:
            raise
        # a peer may sit in a blocking collective that never returns once this
        # rank leaves: say how to resume (rank 0) and end the whole job
        if comm.rank == 0:
            say_before_abort(f"{e or 'interrupted'}\n")
        comm.abort("interrupted", code=130, report=False)
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
            if is_usage_error(e):
                abort_once(comm, f"sprint: error: {describe(e)}", EXIT_USAGE)
            # the loss is reduced over the ranks: all of them diverge at the same
            # step. A full disk, a file size limit or memory running out is the
            # machine's, not a bug: one line naming the file, no traceback.
            if isinstance(e, (Diverged, OSError, MemoryError)):
                abort_once(comm, f"sprint: error: {describe(e)}", EXIT_FAILED)
        import traceback
        # the line naming the rank first: it is what the other ranks' logs need
        report_failure(comm.rank, comm.size, f"{type(e).__name__}: {e}")
        traceback.print_exc()
        comm.abort(f"{type(e).__name__}: {e}", report=False)


def abort_once(comm: Comm, line: str, code: int):
    """End the whole job with exit ``code`` after saying ``line`` once. A
    mistake in the job's inputs is usually made on every rank alike, so
    rank 0 says it at once and the others wait USAGE_ERROR_GRACE_S first:
    when rank 0 has it too, its abort ends them before they say it again;
    when it does not (a file only this rank cannot read), they say it
    naming their rank."""
    if comm.rank:
        time.sleep(USAGE_ERROR_GRACE_S)
        line = f"{line} (rank {comm.rank} of {comm.size})"
    say_before_abort(line + "\n")
    comm.abort(line, code=code, report=False)
