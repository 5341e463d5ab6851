"""Run metrics: one JSON object per epoch in ``metrics.jsonl``, and a running
mean / throughput meter for the progress bar.

The file is a copy: the checkpoint carries the same records (its
``history``), and a run rebuilds metrics.jsonl from it at every start, so a
kill between the two writes loses no line."""
from __future__ import annotations

import json
import time
from pathlib import Path

from engine.errors import MissingFile, RunError

# the fields of a record that sprint plot draws
NUMBERS = ("epoch", "train_loss", "test_loss", "train_acc", "test_acc")


class Meter:
    """Running sums over an epoch: mean loss, accuracy, images per second."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.loss_sum = 0.0
        self.correct = 0
        self.seen = 0
        self.t0 = time.perf_counter()

    def add(self, loss, n_correct, n):
        self.loss_sum += float(loss) * n
        self.correct += int(n_correct)
        self.seen += int(n)

    @property
    def loss(self):
        return self.loss_sum / self.seen if self.seen else float("nan")

    @property
    def acc(self):
        return self.correct / self.seen if self.seen else float("nan")

    @property
    def elapsed(self):
        return time.perf_counter() - self.t0

    @property
    def images_per_s(self):
        e = self.elapsed
        return self.seen / e if e > 0 else 0.0


def _lines(records) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


def write(path, records) -> Path:
    """Replace ``path`` by ``records``, atomically (the file is never rewritten
    in place: a kill leaves the old or the new list)."""
    from .checkpoint import atomic_write
    return atomic_write(path, _lines(records))


def append(path, record: dict):
    """Add one record (the whole file is rewritten atomically)."""
    path = Path(path)
    write(path, (read(path) if path.exists() else []) + [record])


def read(path) -> list:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.exists():
        raise MissingFile("no metrics.jsonl: not a run folder", path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RunError("not a text file, as a run's metrics are", path) from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise RunError(f"line {i} is not JSON ({getattr(e, 'msg', e)})", path) from None
            # each line one epoch's record: plot said "list indices must be integers" of a list
            if not isinstance(rec, dict) or type(rec.get("epoch")) is not int or not all(
                    v is None or type(v) in (int, float) for k, v in rec.items() if k in NUMBERS):
                raise RunError(f"line {i} is not an epoch's record (a JSON object with an integer \"epoch\" "
                               f"and numbers for {', '.join(NUMBERS[1:])})", path)
            out.append(rec)
    return out


def truncate(path, epochs_kept: int):
    """Keep the records of the first ``epochs_kept`` epochs (a resumed run
    rewrites whatever came after its checkpoint)."""
    path = Path(path)
    if not path.exists():
        return
    write(path, [r for r in read(path) if r.get("epoch", 0) <= epochs_kept])
