"""The ``sprint`` command line: one subcommand per job, each registered by the
module that does the work, so this file holds no logic of its own besides
the one error path: every failure is one ``sprint: error: <what> (<where>)``
line on stderr and a non-zero exit (``--debug`` adds the traceback); Ctrl-C
says how to resume and exits 130."""
from __future__ import annotations

import argparse
import errno
import importlib
import os
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sprint", description="SPRINT CNN training engine")
    p.add_argument("--version", action="version", version=f"sprint {_version()}")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None,
                   help="compute backend (default: $SPRINT_DEVICE or auto)")
    p.add_argument("--debug", action="store_true", default=bool(os.environ.get("SPRINT_DEBUG")),
                   help="show the traceback of an error (also $SPRINT_DEBUG=1)")
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
    line = f"{what} ({where})" if where else str(what)
    return " ".join(line.split())


def is_usage_error(e: BaseException) -> bool:
    """A mistake in what the user gave (exit 2, no traceback), not a failure."""
    from engine.backend import BackendError
    return isinstance(e, (ValueError, TypeError, FileNotFoundError, BackendError))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    from engine import backend
    from engine.errors import Interrupted
    if args.debug:  # the ranks' abort path reads it too (engine.parallel.comm.abort_on_error)
        os.environ["SPRINT_DEBUG"] = "1"
    try:
        if args.device:
            backend.set_backend(args.device)
        rc = args.func(args)
    except KeyboardInterrupt as e:
        if args.debug:
            import traceback
            traceback.print_exc()
        print(str(e) if isinstance(e, Interrupted) else "interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Exception as e:
        if args.debug:
            import traceback
            traceback.print_exc()
        if not getattr(e, "reported_by_root", False):
            print(f"sprint: error: {describe(e)}", file=sys.stderr, flush=True)
        return EXIT_USAGE if is_usage_error(e) else EXIT_FAILED
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
