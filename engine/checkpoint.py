"""Checkpoints and atomic files.

Every file of a run folder is written by :func:`atomic_write`: to a
temporary file beside the target (``NAME.XXXX.tmp``), flushed and fsynced,
renamed over the target and the folder fsynced, so a crash, a kill or a full
disk leaves either the old or the new file, never a half-written one.

A checkpoint is one .npz holding the arrays of a state dict plus its other
values as JSON (``__meta__.json``)."""
from __future__ import annotations

import errno
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from engine.errors import MissingFile, RunError

_META = "__meta__.json"
NAME = "checkpoint.npz"


class CheckpointError(RunError):
    """A checkpoint that cannot be read: missing, corrupt, truncated or not ours."""


def fsync_dir(path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass    # some file systems refuse fsync on folders; the rename still stands
    finally:
        os.close(fd)


def make_folder(folder) -> Path:
    """``folder`` and its parents; a file in the way is ENOTDIR naming
    ``folder`` (mkdir says "File exists", which misleads)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder)) from None
    return folder


def _umask() -> int:
    """The process's umask, read without changing it (Linux), else by the
    set-and-restore that other systems need."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The permissions the written file gets: the old file's, or those
    open() would give a new one (mkstemp's temporary is 0600, which made
    every run file unreadable to the rest of a group)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def write_json(path, obj, **dumps) -> Path:
    """``obj`` as JSON (json.dumps with ``dumps``) in ``path``, written
    atomically: a benchmark or run killed mid-write leaves the old file."""
    return atomic_write(path, json.dumps(obj, **dumps))


def atomic_write(path, write) -> Path:
    """Write ``path`` through ``write(binary file)`` (or bytes/str given
    directly) via temp file + fsync + rename + folder fsync. An OSError names
    ``path``, never the temporary file, and leaves no temporary file behind."""
    path = Path(path)
    if isinstance(write, str):
        write = write.encode()
    if isinstance(write, (bytes, bytearray)):
        blob = bytes(write)
        write = lambda f: f.write(blob)  # noqa: E731
    tmp = None
    try:
        make_folder(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def remove_stale_temps(folder, names) -> list:
    """Delete ``NAME.*.tmp`` files that a killed writer left in ``folder``."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for name in names:
        for p in folder.glob(f"{name}.*.tmp"):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


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


def _join(meta, arrays, path):
    out = {}
    for k, v in meta.items():
        if isinstance(v, dict) and set(v) == {"__array__"}:
            if v["__array__"] not in arrays:
                raise CheckpointError(f"checkpoint metadata names a missing array {v['__array__']!r}", path)
            out[k] = arrays[v["__array__"]]
        elif isinstance(v, dict):
            out[k] = _join(v, arrays, path)
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
    arrays = {}
    meta = _split(state, "", arrays)
    payload = dict(arrays)
    payload[_META] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    return atomic_write(path, lambda f: np.savez(f, **payload))


def _resolve(path) -> Path:
    given = Path(path)
    path = given / NAME if given.is_dir() else given
    if not path.exists():
        # a mistyped run folder was 'no checkpoint', as if the run were there without one
        raise MissingFile("no checkpoint" if given.is_dir() else "no such checkpoint file or run folder", path)
    if not path.is_file():
        raise CheckpointError("not a file", path)
    return path


def _read(path, arrays: bool):
    # np.load takes a file that is not a zip for a pickle or a .npy and says
    # "contains pickled (object) data" of a text file given for a checkpoint
    with open(path, "rb") as f:
        head = f.read(4)
    if head and not b"PK\x03\x04".startswith(head):
        raise CheckpointError("not a sprint checkpoint (not an .npz file)", path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files") or _META not in z.files:
                raise CheckpointError(f"not a sprint checkpoint (no {_META})", path)
            meta = json.loads(z[_META].tobytes().decode())
            if not isinstance(meta, dict):
                raise CheckpointError("checkpoint metadata is not an object", path)
            data = {k: z[k] for k in z.files if k != _META} if arrays else None
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError, UnicodeDecodeError,
            RecursionError, __import__("zlib").error) as e:
        raise CheckpointError(f"corrupt or truncated checkpoint ({type(e).__name__}: {e})", path) from None
    return meta, data


def load(path) -> dict:
    """The state dict saved at ``path`` (a checkpoint file or a run folder)."""
    path = _resolve(path)
    meta, arrays = _read(path, True)
    return _join(meta, arrays, path)


def check_params(state: dict, spec, where) -> None:
    """Refuse a checkpoint whose parameter vector (or the optimizer's
    momentum beside it) is not its network's length -- cut or edited by hand:
    the net said 'set_flat: v must have shape (151306,), got (10,)' and ASGD
    'could not broadcast input array from shape (7,)', neither naming the file."""
    from engine import spec as spec_mod
    n = spec_mod.n_params(spec)
    optim = state.get("optim") if isinstance(state.get("optim"), dict) else {}
    for what, a in (("parameter", state.get("params")), ("momentum", state.get("momentum")),
                    ("momentum", optim.get("velocity"))):
        shape = getattr(a, "shape", None)
        if (a is not None or what == "parameter") and shape != (n,):
            raise CheckpointError(f"corrupt checkpoint: its {what} vector has shape {shape}, network {spec.name!r} "
                                  f"has {n:,} parameters", where)


def load_meta(path) -> dict:
    """The JSON values of a checkpoint, arrays left out (cheap for big nets)."""
    path = _resolve(path)
    meta, _ = _read(path, False)
    return meta
