"""The run folder: config.json, metrics.jsonl, checkpoint.npz and a
strategy's stats file, each written atomically (engine.checkpoint.atomic_write).

config.json carries a run id that the checkpoint repeats, so ``--resume``
refuses a checkpoint copied in from another run. metrics.jsonl is rebuilt
from the checkpoint's history at every start: the checkpoint is the record.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from engine import checkpoint as _ckpt
from engine import metrics as _metrics
from engine.errors import RunError

CHECKPOINT = "checkpoint.npz"
CONFIG = "config.json"
METRICS = "metrics.jsonl"
# files whose temporaries a killed writer may leave behind
WRITTEN = (CHECKPOINT, CONFIG, METRICS, "*_stats.json")


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def read_json(path):
    """A JSON file's value; errors name the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RunError("not a text file", path) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RunError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", path) from None
    except RecursionError:
        raise RunError("JSON nested too deeply", path) from None


class RunDir:
    def __init__(self, path):
        self.path = Path(path)

    def __str__(self):
        return str(self.path)

    def file(self, name) -> Path:
        return self.path / name

    def prepare(self) -> list:
        """Create the folder; remove temporaries of writes that a kill cut short."""
        if self.path.exists() and not self.path.is_dir():
            raise RunError("the run directory is a file", self.path)
        from engine.cli import make_out_folder
        make_out_folder(self.path, "the run directory")
        return _ckpt.remove_stale_temps(self.path, WRITTEN)

    def refuse_a_run(self) -> None:
        """A new run never replaces another: a folder whose checkpoint holds
        trained epochs is refused (one with a config alone, a run stopped
        before its first epoch ended, holds nothing to lose)."""
        if self.file(CHECKPOINT).exists():
            from engine.errors import resume_with
            from engine.parallel.launcher import launcher_world_size
            # under mpiexec, the resume that runs it again on as many ranks
            raise RunError(f"already holds a trained run ({CHECKPOINT}); "
                           f"{resume_with(self.path, launcher_world_size())}, or choose another --out", self.path)
        # `--out .` in a project folder replaced its own config.json (and a
        # metrics.jsonl) without a word: only a run's own files are rewritten
        theirs = [name for name in (CONFIG, METRICS) if self.file(name).exists()]
        if theirs and not self._holds_run_config():
            raise RunError(f"holds {' and '.join(theirs)} of something other than a sprint run, which a run "
                           f"would replace; choose another --out (a new or empty folder)", self.path)

    def _holds_run_config(self) -> bool:
        try:
            d = read_json(self.file(CONFIG))
        except (OSError, RunError):
            return False
        return isinstance(d, dict) and isinstance(d.get("train"), dict)

    def clean(self) -> list:
        """Remove temporaries a killed writer left (the folder may not exist yet)."""
        return _ckpt.remove_stale_temps(self.path, WRITTEN)

    def write_json(self, name, obj, indent=None) -> Path:
        return _ckpt.write_json(self.file(name), obj, indent=indent)

    def read_config(self) -> dict:
        d = read_json(self.file(CONFIG))
        if not isinstance(d, dict):
            raise RunError("not a run config (expected a JSON object)", self.file(CONFIG))
        return d

    def write_config(self, config: dict) -> Path:
        return self.write_json(CONFIG, config, indent=2)

    def write_metrics(self, history) -> Path:
        return _metrics.write(self.file(METRICS), history)

    def save_checkpoint(self, state: dict) -> Path:
        return _ckpt.save(self.file(CHECKPOINT), state)

    def load_checkpoint(self, arrays: bool = True) -> dict:
        path = self.file(CHECKPOINT)
        return _ckpt.load(path) if arrays else _ckpt.load_meta(path)

    def legacy_history(self, epochs: int) -> list:
        """Metrics of a run whose checkpoint predates the history it now carries."""
        try:
            return [r for r in _metrics.read(self.file(METRICS)) if r.get("epoch", 0) <= epochs]
        except (FileNotFoundError, ValueError):
            return []
