"""The ``sprint`` command line: one subcommand per job, each registered by the
module that does the work, so this file holds no logic of its own besides
the one error path: every failure is one ``sprint: error: <what> (<where>)``
line on stderr and a non-zero exit (``--debug`` adds the traceback); Ctrl-C
says how to resume and exits 130."""
from __future__ import annotations

import argparse
import errno
import contextlib
import importlib
import os
import re
import sys

# (module, function) pairs; each function gets the subparsers object and adds
# its own subcommand(s) with ``set_defaults(func=...)``.
_REGISTRARS = [
    ("engine.train_cli", "register"),       # train, eval, plot, info
    ("engine.parallel.cli", "register"),    # report
    ("engine.perf.cli", "register"),        # profile, predict, tune, simulate
    ("engine.selfcheck", "register"),       # selfcheck
    ("engine.perf.plan", "register"),       # plan
]

EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("sprint-engine")
    except Exception:
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse that raises its complaint instead of printing usage and
    exiting, so that it is one ``sprint: error:`` line like every other
    failure (and said once under mpiexec). Subcommand parsers are of this
    class too (argparse makes them of the parent's)."""

    def error(self, message):
        from engine.errors import RunError
        m = re.fullmatch(r"argument (\S+): (.*)", message, re.S)
        if m:                          # a bad value: the option names where
            raise RunError(m.group(2), m.group(1))
        raise RunError(f"{message}; `{self.prog} --help` lists the options")

    def parse_args(self, args=None, namespace=None):
        # arguments left over belong to the subcommand's line: its parser says so
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            owner = subs[0].choices.get(getattr(ns, "command", None), self) if subs else self
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sprint", description="SPRINT CNN training engine")
    p.add_argument("--version", action="version", version=f"sprint {_version()}")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None,
                   help="compute backend (default: $SPRINT_DEVICE or auto)")
    p.add_argument("--debug", action="store_true", default=bool(os.environ.get("SPRINT_DEBUG")),
                   help="show the traceback of an error (also $SPRINT_DEBUG=1)")
    # a subcommand that runs across MPI ranks says so (train); the others refuse
    # mpiexec rather than run once per rank
    p.set_defaults(across_ranks=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod, fn in _REGISTRARS:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        getattr(m, fn)(sub)
    return p


# What an OSError means for the user, by errno.
_OS_HINTS = {
    errno.EFBIG: "file too large (the file size limit, ulimit -f, was reached)",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOTDIR: "not a folder",
    errno.ENOENT: "no such file or folder",
}


def describe(e: BaseException) -> str:
    """One line: what went wrong (where)."""
    what, where = getattr(e, "what", None), getattr(e, "where", None)
    if what is None and isinstance(e, OSError) and (e.strerror or e.errno):
        what = _OS_HINTS.get(e.errno) or e.strerror or str(e)
        where = e.filename
    elif isinstance(e, MemoryError):
        what = f"out of memory{f' ({e})' if str(e) else ''}"
    elif what is None:
        what = str(e) or type(e).__name__
        if not isinstance(e, (ValueError, TypeError, LookupError, ArithmeticError, RuntimeError, OSError)):
            what = f"{type(e).__name__}: {what}"
    line = (f"{what} ({where})" if where else str(what)) + getattr(e, "after", "")    # what a run keeps
    return " ".join(line.split())


def make_out_folder(folder, what, option="--out"):
    """``folder`` (and its parents) made for an output option; a failure is
    one error naming ``what`` could not be created and why: said bare, "no
    such file or folder (/proc/x)" read as if an input were missing."""
    from engine.checkpoint import make_folder
    from engine.errors import RunError
    try:
        return make_folder(folder)
    except OSError as e:
        raise RunError(f"cannot create {what} ({option}): {describe(e)}", None) from None


def is_usage_error(e: BaseException) -> bool:
    """A mistake in what the user gave (exit 2, no traceback), not a failure."""
    from engine.backend import BackendError
    return isinstance(e, (ValueError, TypeError, FileNotFoundError, BackendError))


def _job_size() -> int:
    from engine.parallel.launcher import launcher_world_size
    return launcher_world_size()


@contextlib.contextmanager
def _said_by_rank_0():
    """Under mpiexec every rank parses the same command line: only rank 0
    prints the help or the version."""
    from engine.parallel.launcher import launcher_rank
    if _job_size() > 1 and launcher_rank() != 0:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            yield
    else:
        yield


def _stdout_closed() -> bool:
    """The program reading our output (``| head``) went away: a write to
    stdout failed with EPIPE, which said only 'Broken pipe' and where not.
    poll() reports POLLERR on a pipe whose reading end is closed."""
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _output_closed() -> str:
    # what is left in stdout's buffer would fail again at exit ("Exception ignored")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return "the program reading sprint's output stopped reading it (broken pipe) (stdout)"


def _fail(e: BaseException, debug: bool) -> int:
    """The one ``sprint: error:`` line of ``e`` and its exit status. Under
    mpiexec it is said once for the job (by rank 0, or by the rank that alone
    met it) and ends every rank: cleanly when every rank failed alike, else by
    MPI_Abort (engine.parallel.abort.abort_once)."""
    if debug:
        import traceback
        traceback.print_exc()
    code = EXIT_USAGE if is_usage_error(e) else EXIT_FAILED
    quiet = bool(getattr(e, "reported_by_root", False))     # rank 0 said it
    closed = isinstance(e, BrokenPipeError) and _stdout_closed()
    line = f"sprint: error: {_output_closed() if closed else describe(e)}"
    if not debug and _job_size() > 1:
        from engine.parallel.abort import abort_once
        from engine.parallel.comm import get_comm
        try:
            comm = get_comm()
        except Exception:          # no communicator to end the job with: each rank says it
            comm = None
        if comm is not None:
            abort_once(comm, line, code, quiet=quiet)
    if not quiet:
        print(line, file=sys.stderr, flush=True)
    return code


def _interrupted(e: KeyboardInterrupt, debug: bool) -> int:
    """Ctrl-C: a run says where it stopped and how to resume (Interrupted);
    before a run began (its modules loading, the command line parsed) there
    is nothing to say but that. Under mpiexec every rank got it: the ranks
    end together and rank 0 alone says it (a run's ranks end in
    engine.parallel.abort instead)."""
    from engine.errors import Interrupted, ctrl_c_handled
    ctrl_c_handled()
    if debug:
        import traceback
        traceback.print_exc()
    line = str(e) if isinstance(e, Interrupted) else "interrupted"
    if _job_size() > 1:
        # The other ranks may sit in MPI_Init, which returns only once every
        # rank called it: a rank that left before it hung the job for good
        # (mpiexec waiting on a rank spinning in MPI_Init). Join them, and
        # leave together (abort_once: rank 0 says the line, exit 130 each).
        from engine.parallel.abort import abort_once
        from engine.parallel.comm import get_comm
        try:
            comm = get_comm()
        except Exception:          # no communicator to end the job with
            comm = None
        if comm is not None:
            abort_once(comm, line, EXIT_INTERRUPTED, quiet=comm.rank != 0)
        from engine.parallel.launcher import launcher_rank
        if launcher_rank() != 0:
            return EXIT_INTERRUPTED
    print(line, file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def main(argv=None) -> int:
    from engine.errors import raise_if_ctrl_c, watch_ctrl_c
    from engine.parallel.launcher import launched_under_mpi, world_size_said
    # a rank of a job: its Ctrl-C is held until MPI is up (engine.errors)
    watch_ctrl_c(hold=launched_under_mpi() and (world_size_said() or 1) > 1)
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    debug = bool(os.environ.get("SPRINT_DEBUG")) or "--debug" in argv
    try:
        parser = build_parser()
        with _said_by_rank_0():
            args = parser.parse_args(argv)
            if not getattr(args, "func", None):
                parser.print_help()
                return EXIT_USAGE
    except KeyboardInterrupt as e:
        return _interrupted(e, debug)
    except Exception as e:
        return _fail(e, debug)
    from engine import backend
    debug = args.debug
    if debug:  # the ranks' abort path reads it too (engine.parallel.abort.abort_on_error)
        os.environ["SPRINT_DEBUG"] = "1"
    try:
        n = _job_size()
        if n > 1 and not args.across_ranks:
            from engine.errors import RunError
            raise RunError(f"sprint {args.command} runs in one process; run it without mpiexec "
                           f"({n} ranks were started)")
        if args.device:
            backend.set_backend(args.device)
        raise_if_ctrl_c()             # one the module imports above dropped
        rc = args.func(args)
    except KeyboardInterrupt as e:
        return _interrupted(e, debug)
    except Exception as e:
        return _fail(e, debug)
    return int(rc or 0)


def _exit(code: int):
    """``sys.exit(code)``, except for a failing process of one MPI rank
    started by ``python -m mpi4py`` (README's mpiexec lines). mpi4py's runner
    turns a non-zero SystemExit into MPI_Abort at exit, so `mpiexec -n 1
    python -m mpi4py -m engine.cli train --parallel downpour` followed its
    one error line with MPICH's 'Abort(2) on node 0 (rank 0 in comm 0):
    application called MPI_Abort(...)' and left its /dev/shm/mpich_shm_*
    file behind (removed only by MPI_Finalize). Such a rank finalizes MPI
    and leaves through the C library's exit, as the ranks of a larger job
    that failed alike do (engine.parallel.abort); a job of several ranks
    has ended there already."""
    mpi = sys.modules.get("mpi4py.MPI")
    if code and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() \
            and mpi.COMM_WORLD.Get_size() == 1:
        from engine.parallel import comm as comm_mod
        from engine.parallel.abort import _leave_registered_with_launcher
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        close = getattr(comm_mod._COMM, "_close_failure_channel", None)
        if close is not None:
            close()                 # as at a normal exit: else MPICH reports the pending duplicates
        mpi.Finalize()
        _leave_registered_with_launcher(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
