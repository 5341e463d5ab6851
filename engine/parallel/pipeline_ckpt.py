"""Per-stage checkpoint files of a pipeline run (engine.parallel.pipeline_run).

A stage's weights and velocity live only on its ranks, so each stage saves
its own part and, on resume, each rank reads only its own stage's file. In
the one run folder, beside the session's files:

* ``stage{k}-e{E}.npz``: stage k's weight and velocity slices after epoch E
  and its update count, written atomically (temp + rename) by the stage's
  rank in replica 0 (the D replicas of a stage hold the same weights: their
  gradients are allreduced before every update);
* ``pipeline_manifest.json``: the stages, partition, schedule and, for each
  of the last two saved epochs, the step and the stage files.

An epoch is saved in this order: every stage file; then (rank 0) the
manifest; then the session's checkpoint.npz, which commits the epoch (its
history, and the whole weights gathered for evaluation, which ``sprint
eval`` and ``--init-from`` read); only then are the stage files that no
manifest entry names removed. A kill at any point leaves the files of the
epoch checkpoint.npz names: resume takes the manifest entry of that epoch.

Resume checks the manifest against the run (``--stages`` and
``--partition``, naming both) and each stage file against its stage. An
error on one rank ends every rank alike, printed once (ranks would
otherwise wait for it in the next collective).
"""
from __future__ import annotations

import re
import sys

from engine import checkpoint as _ckpt
from engine.errors import RunError, counted

from .comm import ConfigMismatch

MANIFEST = "pipeline_manifest.json"
KEEP = 2                           # manifest entries (epochs) whose files stay on disk
_STAGE_FILE = re.compile(r"^stage(\d+)-e(\d+)\.npz$")


def stage_file(k: int, epoch: int) -> str:
    return f"stage{k}-e{epoch}.npz"


def on_every_rank(comm, fn):
    """``fn()`` on every rank; an error on any of them is raised on all
    (printed once, by rank 0), so no rank waits for a failed one."""
    if comm.size == 1:
        return fn()
    try:
        value, err = fn(), None
    except (RunError, OSError, ValueError) as e:
        from engine.cli import describe
        value, err = None, describe(e)
    errs = [e for e in comm.allgather_obj(err) if e]
    if errs:
        if comm.rank == 0:
            print(f"sprint: error: {errs[0]}", file=sys.stderr, flush=True)
        e = ConfigMismatch(errs[0])
        e.reported_by_root = True
        raise e
    return value


# ---- saving ----------------------------------------------------------------------
def save_stage(run, k: int, epoch: int, stage, opt, run_id, spec_hash):
    from .pipeline import _host
    return _ckpt.save(run.file(stage_file(k, epoch)), {
        "params": _host(stage.params), "velocity": _host(opt.velocity), "steps": int(opt.steps),
        "stage": k, "layers": [stage.lo, stage.hi], "epoch": int(epoch), "run_id": run_id, "spec_hash": spec_hash})


def write_manifest(run, K: int, partition: str, schedule: str, epoch: int, step: int, run_id):
    """Add epoch ``epoch``'s entry, keeping the latest KEEP (rank 0)."""
    old = []
    if run.file(MANIFEST).exists():
        try:
            m = read_manifest(run)
            if m.get("stages") == K and m.get("partition") == partition:
                old = [e for e in m.get("entries", []) if e.get("epoch", 0) < epoch]
        except RunError:
            pass                   # an unreadable manifest is replaced by this epoch's
    entry = {"epoch": int(epoch), "step": int(step), "files": [stage_file(k, epoch) for k in range(K)]}
    return run.write_json(MANIFEST, {"stages": K, "partition": partition, "schedule": schedule, "run_id": run_id,
                                     "entries": (old + [entry])[-KEEP:]}, indent=1)


def prune(run, k: int):
    """Remove stage k's files that no manifest entry names (after the commit)."""
    named = {f for e in read_manifest(run).get("entries", []) for f in e.get("files", [])}
    for p in run.path.glob(f"stage{k}-e*.npz"):
        if _STAGE_FILE.match(p.name) and p.name not in named:
            p.unlink(missing_ok=True)
    _ckpt.remove_stale_temps(run.path, [f"stage{k}-e*.npz"] + ([MANIFEST] if k == 0 else []))


# ---- resuming --------------------------------------------------------------------
def read_manifest(run) -> dict:
    from engine.session.rundir import read_json
    path = run.file(MANIFEST)
    if not path.exists():
        raise RunError("no pipeline manifest: the run folder holds no per-stage checkpoint to resume from", path)
    m = read_json(path)
    if not isinstance(m, dict) or not isinstance(m.get("entries"), list) or "stages" not in m:
        raise RunError("not a pipeline manifest (expected stages, partition and entries)", path)
    return m


def manifest_partition(manifest, K: int, n_layers: int):
    """The partition the stage files hold, when they hold K stages (resume
    without --partition keeps it, even if a new balance would differ)."""
    from .stage import parse_partition
    if manifest.get("stages") != K:
        return None
    try:
        return parse_partition(manifest.get("partition"), n_layers)
    except ValueError:
        return None                # check_manifest names both partitions


def check_manifest(run, manifest, K: int, partition: str, epoch: int, replicas: int = 1) -> dict:
    """The manifest's entry for ``epoch`` (the epoch the session's checkpoint
    commits), after checking it describes this run's stages. A run saved on
    another stage count (resumed by another `mpiexec -n`) is told both ways
    on: its own rank count, or its weights into a new run on this one."""
    where = run.file(MANIFEST)
    saved_k, saved_p = manifest.get("stages"), manifest.get("partition")
    if saved_k != K:
        n_saved = f"{saved_k * replicas}" if isinstance(saved_k, int) else "N"
        here = K * replicas
        raise RunError(
            f"the run was saved as {counted(saved_k, 'stage')} (partition {saved_p}, {n_saved} ranks), and this "
            f"job asks for {counted(K, 'stage')} (partition {partition}, {counted(here, 'rank')}): a pipeline "
            f"resumes on the stages its files hold: mpiexec -n {n_saved} sprint train --resume {run.path}; to go "
            f"on with {counted(K, 'stage')}, start a new run from its weights: mpiexec -n {here} sprint train "
            f"--parallel pipeline --init-from {run.path} --out NEW_DIR (with the run's --model and data options)",
            where)
    if saved_p != partition:
        raise RunError(f"the run's stage files hold --partition {saved_p}; this run has --partition {partition} "
                       f"(resume with the saved partition, or start a new run with --init-from {run.path})", where)
    for e in manifest["entries"]:
        if e.get("epoch") == epoch and len(e.get("files", [])) == K:
            return e
    raise RunError(f"names no stage files of epoch {epoch}, the epoch the run's checkpoint.npz ends", where)


def load_stage(run, entry: dict, k: int, stage, run_id, spec_hash) -> dict:
    """Stage k's own file of ``entry``, checked against the stage."""
    path = run.file(entry["files"][k])
    if not path.exists():
        raise RunError(f"stage {k}'s checkpoint file is missing", path)
    state = _ckpt.load(path)
    if state.get("stage") != k or list(state.get("layers", [])) != [stage.lo, stage.hi] \
            or state.get("epoch") != entry["epoch"]:
        raise RunError(f"holds stage {state.get('stage')} (layers {state.get('layers')}, epoch "
                       f"{state.get('epoch')}), not stage {k} (layers {[stage.lo, stage.hi]}, epoch "
                       f"{entry['epoch']})", path)
    if state.get("spec_hash") != spec_hash or (run_id and state.get("run_id") not in (None, run_id)):
        raise RunError("belongs to another model or run", path)
    for key in ("params", "velocity"):
        if getattr(state.get(key), "shape", None) != (stage.n_params,):
            raise RunError(f"its {key} hold {getattr(state.get(key), 'shape', None)} values, stage {k} has "
                           f"{stage.n_params}", path)
    return state
