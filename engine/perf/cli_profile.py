"""``sprint profile``: sweep this machine's kernels and fit a profile, or
refit one from saved records, or measure only the sections fitted on top of
an existing profile (``--update``). A thin wrapper over engine.perf's sweep
and fit; every failure is one ``sprint: error:`` line naming its file or
option."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from engine.argtypes import positive_float, positive_int
from engine.errors import Interrupted, RunError

from . import calibrate

# What `sprint profile` writes without --out: the working directory's, where
# predict, tune, simulate, plan and `sprint info --stages` read it when no
# --profile is given (``profile_option``).
DEFAULT_OUT = "profile.json"
PROFILE_HELP = (f"machine profile JSON (default: $SPRINT_PROFILE where set, empty for the shipped one; else "
                f"./{DEFAULT_OUT} where `sprint profile` wrote one, else the shipped one)")


def profile_option(given, command):
    """The profile a command line uses: ``given`` (--profile); without one,
    $SPRINT_PROFILE where set (empty: the shipped one, whatever the folder
    holds -- the test suite sets it so); else ./profile.json where `sprint
    profile` left it, said on stderr -- a user who has just swept this
    machine expects its profile, not the shipped one of the build machine
    (until 2026-12-07 predict read the shipped one and its warning named the
    checkout's profiles, not the one just made); else None, the shipped one.
    A ./profile.json that is no machine profile is named and passed over,
    not an error of a command that never named it."""
    if given is None and "SPRINT_PROFILE" in os.environ:
        return os.environ["SPRINT_PROFILE"] or None
    if given is not None or not Path(DEFAULT_OUT).is_file():
        return given
    from .profile import Profile
    try:
        Profile.load(DEFAULT_OUT)
    except RunError as e:
        print(f"sprint {command}: warning: ./{DEFAULT_OUT} is passed over, {e.what}; predicting from the "
              "shipped profile", file=sys.stderr)
        return None
    print(f"sprint {command}: note: predicting from ./{DEFAULT_OUT}, which `sprint profile` wrote here "
          "(--profile chooses another)", file=sys.stderr)
    return DEFAULT_OUT


def written(out) -> str:
    """The line that says where a profile went and how to predict from it."""
    how = ("predict, tune, simulate and plan read it from this folder without --profile"
           if Path(out) == Path(DEFAULT_OUT) else f"--profile {out} predicts from it")
    return f"profile written to {out} ({how})"


def _read_records(path):
    """Saved sweep records (``--records``), or one error line naming the file."""
    if not Path(path).exists():
        from engine.errors import MissingFile
        raise MissingFile("no such file for --from-records (`sprint profile --records FILE` writes one)", path)
    try:
        data = json.loads(Path(path).read_text())
    except UnicodeDecodeError:
        raise RunError("not sweep records (not a text file)", path) from None
    except json.JSONDecodeError as e:
        raise RunError(f"not sweep records (not valid JSON: {e})", path) from None
    data = {"records": data} if isinstance(data, list) else data
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise RunError("not sweep records (no \"records\" list; `sprint profile --records FILE` writes one)", path)
    return data


def _write_json(path, obj):
    from engine.checkpoint import atomic_write
    atomic_write(path, json.dumps(obj))


def check_outputs(*paths):
    """Refuse an output that cannot be written before a sweep of minutes, not
    after it (the sweep would be lost). Nothing is left behind: a missing
    folder is made when its file is written (atomic_write), and here only
    the nearest folder that exists is tried, so a command refused later (a
    bad --only, no mpiexec) leaves no empty folder, as a refused train
    leaves no run folder."""
    for path in paths:
        if path is None:
            continue
        p = Path(path)
        if p.is_dir():
            raise RunError("is a folder, not a file", path)
        folder = p.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise RunError("not a folder", folder)
        # a file made and removed: os.access says yes to root everywhere (/proc, a
        # read-only mount), and the sweep's minutes were lost at its end
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".sprint-write-check-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise RunError(f"cannot write into this folder ({e.strerror})", folder) from None


# Sections measured on top of an existing profile's prices: ``--update`` adds
# them alone (the pipeline section without --only).
ON_TOP = ("pipeline", "calibration")


def _update_calibration(args, prof) -> int:
    """``--update PROFILE --only calibration``: this machine's calibration
    (every part of ``calibrate.PARTS``) replaces the profile's, the old one
    kept beside it. Run right after a sweep made in several ``--only``
    parts, each of which stored only its own calibration, or to add a part
    a profile was swept without; refused for a profile of another machine."""
    from .calibrate import PARTS, calibration_step, merge_calibrations
    from .fingerprint import differing, fingerprint
    if args.from_records:
        raise RunError("the calibration is measured, not refitted from records", "--from-records")
    old = prof.data.get("fingerprint") or {}
    here = fingerprint()
    differs = differing(old, here)
    if differs:
        raise RunError("the profile was measured on another machine or software (" + ", ".join(
            f"{k} {a!r} there, {b!r} here" for k, (a, b) in differs.items()) + "): its prices do not match "
            "this machine's calibration; run `sprint profile`", args.update)
    # Two, as a sweep's before and after: their difference is the noise a later check allows.
    both = merge_calibrations([calibration_step(args.calibrate_seconds) for _ in range(2)])
    if old.get("calibration"):
        both["replaced"] = {k: v for k, v in old["calibration"].items() if k not in ("before", "after", "replaced")}
    prof.data["fingerprint"] = dict(old or here, calibration=both)
    out = Path(args.out or args.update)
    prof.save(out)
    print("calibration: " + ", ".join(f"{k.split('_')[0]} {1e3 * both[k]:.4f} ms" for k in ("wall_s",) + PARTS if k in both)
          + (f"; x{both['wall_s'] / both['replaced']['wall_s']:.3f} the one it replaces" if "replaced" in both else ""))
    print(written(out))
    return 0


def _update_profile(args, only) -> int:
    """``sprint profile --update PROFILE``: measure the ON_TOP sweeps (or refit
    them from ``--from-records``) and write their sections into PROFILE."""
    from .pipeline_probe import fit_section, sweep_pipeline
    from .profile import Profile
    bad = [n for n in only or () if n not in ON_TOP]
    if bad:
        raise RunError(f"only {', '.join(ON_TOP)} can be added to an existing profile, not {', '.join(bad)}",
                       "--only")
    prof = Profile.load(args.update)
    check_outputs(args.out or args.update, args.records)
    if only and "calibration" in only:
        if len(only) > 1:
            raise RunError("--only calibration is measured alone", "--only")
        return _update_calibration(args, prof)
    if args.from_records:
        recs = _read_records(args.from_records)["records"]
    else:
        check_mpiexec(["pipeline"], "refit the section from saved records with --from-records")
        recs = sweep_pipeline(profile=prof, log=lambda m: print(m, file=sys.stderr, flush=True))
        if args.records:
            _write_json(args.records, {"records": recs})
    try:
        prof.data["pipeline"] = fit_section(prof, recs)
    except ValueError as e:
        raise RunError(str(e), args.from_records or args.update) from None
    out = Path(args.out or args.update)
    prof.save(out)
    sec = prof.data["pipeline"]
    ex = sec["executor"]
    print(f"pipeline section: per pass {1e3 * ex['per_pass']:.3f} ms, cold x{1 + ex['cold']:.2f}, per instruction "
          f"{1e3 * ex['per_instruction']:.3f} ms, shared x{1 + ex['shared']:.2f}"
          + ("" if sec.get("shared_fitted") else " (not measured: the ranks fit the cores)")
          + "; kernels x " + ", ".join(f"{ex.get(k, 1.0):.2f} {k.replace('_f', ' fwd').replace('_b', ' bwd')}"
                                       for k in ("conv_f", "conv_b", "other_f", "other_b"))
          + f", eager size {sec.get('p2p', {}).get('eager_bytes', '?')} B; host at x{sec['calibration_ratio']:.2f} "
          f"the profile's calibration (stored rescaled)")
    print(written(out))
    return 0


def _fit_pipeline(prof, records):
    """The fresh profile's pipeline section, when its sweep ran."""
    if any(r.get("kind") == "pipeline_run" for r in records):
        from .pipeline_probe import fit_section
        from .profile import Profile
        prof["pipeline"] = fit_section(Profile(prof), records)


def _check_skipped(data, only, old):
    """Say each sweep that did not run; when none of the ``--only`` sweeps
    ran, the profile would be the old one or empty: an error, not a file."""
    before = len(old.get("skipped", [])) if old else 0
    new = data.get("skipped", [])[before:]
    for msg in new:
        print(f"sprint profile: warning: sweep {msg}; the profile has no fits from it", file=sys.stderr)
    if only and {m.split(":", 1)[0] for m in new} >= set(only):
        raise RunError("none of the sweeps ran (" + "; ".join(new) + ")", "--only")


def check_mpiexec(names, how):
    """Refuse the sweeps that run under mpiexec where it is missing, before
    the others' minutes (each said a raw FileNotFoundError at its turn)."""
    from .sweep import NEEDS_MPIEXEC
    need = [n for n in names if n in NEEDS_MPIEXEC]
    if need and shutil.which("mpiexec") is None:
        one = len(need) == 1
        raise RunError(f"mpiexec is not on PATH, and the sweep{'' if one else 's'} {', '.join(need)} "
                       f"run{'s' if one else ''} under it: install an MPI (MPICH or Open MPI), or "
                       + how.format(them="it" if one else "them"), "PATH")


class SweepInterrupted(Interrupted):
    """Ctrl-C during the sweeps: where the ones done are kept and how to go on."""

    def __init__(self, line):
        KeyboardInterrupt.__init__(self, line)


def _keep_interrupted(args, e):
    """Ctrl-C in a sweep of up to half an hour lost every sweep done: they go to
    --records (else beside --out) with the command that runs the rest."""
    partial, left = getattr(e, "partial", None), getattr(e, "left", None)
    if not partial or not partial.get("records") or not left:
        return
    out = args.out or DEFAULT_OUT
    keep = args.records or str(Path(out).with_suffix("")) + ".records.json"
    _write_json(keep, partial)
    rest = ["sprint", "profile"] + ["--quick"] * bool(args.quick) + [
        "--from-records", keep, "--only", ",".join(left), "--records", keep, "--out", out]
    rest += ["--threads", str(args.threads)] * (args.threads != 1) + ["--machine", args.machine] * bool(args.machine)
    raise SweepInterrupted(f"interrupted in sweep {left[0]}; the sweeps done are kept in {keep}: run the rest with "
                           + " ".join(map(shlex.quote, rest))) from None


def cmd_profile(args) -> int:
    from . import fit, sweep
    from .profile import Profile
    # a trailing comma (--only "conv ops,") was an unknown sweep ''
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    if args.update:
        return _update_profile(args, only)
    if args.plots and Path(args.plots).exists() and not Path(args.plots).is_dir():
        raise RunError("--plots takes a folder for the PNGs, not a file", args.plots)
    check_outputs(args.out or DEFAULT_OUT, args.records, args.plots and Path(args.plots) / "x.png")
    old = _read_records(args.from_records) if args.from_records else None
    if old is not None and only is None:
        data = old
    else:
        from engine import backend
        try:
            names = sweep.selection(backend.get_backend().name, only, not args.no_allreduce, not args.no_contention)
        except ValueError as e:
            raise RunError(str(e), "--only") from None
        check_mpiexec(names, "leave {them} out of --only" if only
                      else "skip {them} with --no-allreduce --no-contention")
        log = (lambda m: print(m, file=sys.stderr, flush=True))
        try:
            data = sweep.run_all(quick=args.quick, threads=args.threads, allreduce=not args.no_allreduce,
                                 contention=not args.no_contention, log=log, only=only, merge=old)
        except KeyboardInterrupt as e:
            _keep_interrupted(args, e)
            raise
        if args.records:
            _write_json(args.records, data)
        _check_skipped(data, only, old)
    from engine import backend
    from .sweep_drift import sweep_reference, warning
    if said := warning(data.get("meta", {})):
        print("sprint profile: warning: " + said, file=sys.stderr)
    prof = fit.fit_profile(data["records"], machine=args.machine, backend=backend.get_backend().name)
    prof["sweep"] = {k: v for k, v in data.get("meta", {}).items() if k != "fingerprint"}
    if fp := data.get("meta", {}).get("fingerprint"):
        # The records were measured over the whole sweep: their calibration is
        # the marks' with the closing one (sweep_drift.sweep_reference).
        ref = sweep_reference(fp.get("calibration") or {}, data["meta"])
        prof["fingerprint"] = dict(fp, calibration=ref) if ref else fp
    prof["skipped"] = data.get("skipped", [])
    _fit_pipeline(prof, data["records"])
    out = args.out or DEFAULT_OUT
    kept = _keep_steady(out) if said else None
    Profile(prof).save(out)
    print(fit.format_errors(prof))
    if args.plots:
        from . import plots
        for f in plots.plot_fits(data["records"], prof, args.plots):
            print(f"wrote {f}")
    print(written(out))
    if kept:
        print(f"sprint profile: note: {out} held a profile swept while the host was steady; kept as {kept}: "
              f"pass --profile {kept} to predict from it (calibrated, a steady profile four days old priced a "
              "two-state host's runs about as well as or better than one swept there the same hour: "
              "bench/RESULTS.md section 4, set 30)", file=sys.stderr)
    return 0


def _keep_steady(out) -> str | None:
    """Before a sweep the host moved through (``sweep_drift.warning``, said
    by the caller) replaces ``out``: if ``out`` holds a profile whose own
    sweep did not move, copy it (atomically) beside it as
    ``<name>.steady.json`` and say where.
    On the two-state Xeon VM of 2026-12-06 such a profile, calibrated, priced
    held-out runs about as well as or better than a profile swept there the
    same hour (bench/RESULTS.md section 4, sets 23-28 seen and set 30), so
    replacing it with the new one could lose the better of the two."""
    from .sweep_drift import spread, warning
    p = Path(out)
    if not p.is_file():
        return None
    try:
        text = p.read_text()
        meta = json.loads(text)["sweep"]
    except (OSError, ValueError, KeyError, TypeError):
        return None               # not a profile, or one without marks: nothing known steady
    if not isinstance(meta, dict) or spread(meta) is None or warning(meta) is not None:
        return None
    from engine.checkpoint import atomic_write
    kept = p.with_name(p.stem + ".steady" + p.suffix)
    atomic_write(kept, text)          # byte for byte
    return str(kept)


def register(sub):
    from .sweep import SWEEPS
    p = sub.add_parser("profile", help="sweep the kernels and fit a machine profile (SPEC section 4)")
    p.add_argument("--quick", action="store_true", help="small grids (about 30 minutes on 2 cores; --only picks parts)")
    p.add_argument("--out", default=None,
                   help=f"profile JSON to write (default {DEFAULT_OUT}, which predict, tune, simulate and plan "
                        "then read without --profile)")
    p.add_argument("--records", default=None, help="also save the raw sweep records here")
    p.add_argument("--from-records", default=None, help="refit saved records instead of sweeping")
    p.add_argument("--threads", type=positive_int, default=1, help="BLAS/OpenMP threads while sweeping (default 1)")
    p.add_argument("--machine", default=None, help="machine description stored in the profile")
    p.add_argument("--no-allreduce", action="store_true",
                   help="skip the sweeps of allreduce and the pipeline (mpiexec jobs)")
    p.add_argument("--no-contention", action="store_true",
                   help="skip the core-sharing sweeps (the loop overhead and the mpiexec jobs of contention)")
    p.add_argument("--only", default=None,
                   help="comma list of sweeps to run (with --from-records: re-run them and keep the "
                        "rest of the saved records): " + ", ".join(SWEEPS))
    p.add_argument("--plots", default=None, help="directory for PNGs of each fit against its sweep")
    p.add_argument("--update", default=None, metavar="PROFILE",
                   help="measure only the sections fitted on top of an existing profile (" + ", ".join(ON_TOP) +
                        ": the pipeline executor's costs and message table; with --only calibration: this "
                        "machine's calibration, measured now) and write them into PROFILE "
                        "(or --out); with --from-records: refit them from saved records")
    p.add_argument("--calibrate-seconds", type=positive_float, default=calibrate.SECONDS,
                   help=f"length in seconds of each of the two calibrations of --update --only calibration "
                        f"(default {calibrate.SECONDS:g})")
    p.set_defaults(func=cmd_profile)
