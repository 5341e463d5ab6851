"""The ``sprint`` command line: one subcommand per job, each registered by the
module that does the work, so this file holds no logic of its own."""
from __future__ import annotations

import argparse
import importlib
import sys

# (module, function) pairs; each function gets the subparsers object and adds
# its own subcommand(s) with ``set_defaults(func=...)``.
_REGISTRARS = [
    ("engine.train_cli", "register"),       # train, eval, plot, info
    ("engine.parallel.cli", "register"),    # report
    ("engine.perf.cli", "register"),        # profile, predict, tune, simulate
    ("engine.selfcheck", "register"),       # selfcheck
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sprint", description="SPRINT CNN training engine")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None,
                   help="compute backend (default: $SPRINT_DEVICE or auto)")
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


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from engine import backend
    try:
        if args.device:
            backend.set_backend(args.device)
        rc = args.func(args)
    except (ValueError, TypeError, FileNotFoundError, backend.BackendError) as e:
        print(f"sprint {args.command}: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
