"""Checkpoints: one .npz holding the arrays of a state dict plus its other
values as JSON, written to a temporary file in the same directory and renamed
over the old one, so a crash leaves either the old or the new file, never a
half-written one."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

_META = "__meta__.json"


def _split(state, prefix, arrays):
    """Nested dict -> JSON-able dict, arrays moved to ``arrays`` under dotted keys."""
    out = {}
    for k, v in state.items():
        if not isinstance(k, str) or "." in k or k == _META:
            raise ValueError(f"checkpoint keys must be str without '.', got {k!r}")
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out[k] = _split(v, key + ".", arrays)
        elif isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__"):
            arrays[key] = _host(v)
            out[k] = {"__array__": key}
        else:
            out[k] = v
    return out


def _join(meta, arrays):
    out = {}
    for k, v in meta.items():
        if isinstance(v, dict) and set(v) == {"__array__"}:
            out[k] = arrays[v["__array__"]]
        elif isinstance(v, dict):
            out[k] = _join(v, arrays)
        else:
            out[k] = v
    return out


def _host(a):
    if isinstance(a, np.ndarray):
        return a
    from engine import backend
    return backend.to_host(a)


def save(path, state: dict):
    """Write ``state`` (nested dicts of arrays and JSON values) atomically to ``path``."""
    path = Path(path)
    arrays = {}
    meta = _split(state, "", arrays)
    payload = dict(arrays)
    payload[_META] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load(path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.npz"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    with np.load(path, allow_pickle=False) as z:
        if _META not in z.files:
            raise ValueError(f"{path} is not a sprint checkpoint (no {_META})")
        meta = json.loads(z[_META].tobytes().decode())
        arrays = {k: z[k] for k in z.files if k != _META}
    return _join(meta, arrays)
