"""Array file formats: MNIST IDX (gzipped or not), CIFAR-10 binary batches and
``.npz`` archives.

Every problem with a file -- missing, a folder, truncated, bad gzip, a header
that declares more than the file can hold -- is a ValueError naming it.  A
gzipped IDX file is decompressed as a stream and never beyond the size its
header declares, and that size is checked first against MAX_IDX_BYTES and
against what a deflate stream of the file's length can expand to.
"""
from __future__ import annotations

import gzip
import zipfile
import zlib
from pathlib import Path

import numpy as np

from engine.errors import MissingFile, RunError

from .dataset import Dataset, warn, warn_skipped

MAX_IDX_BYTES = 8 << 30      # a sane ceiling: MNIST's largest file is 47 MB
DEFLATE_MAX_RATIO = 1032     # deflate's best case: 258 bytes per 2-bit code
_READ_ERRORS = (OSError, EOFError, zlib.error)


def require_file(path: Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise MissingFile("no such data file", path)
    if not path.is_file():
        raise RunError("is a directory, expected a file" if path.is_dir() else "not a regular file", path)
    return path


def check_finite(x, y, where, skip_bad):
    """(x, y, number left out): NaN/Inf images are an error naming ``where``,
    or left out (with a warning) when ``skip_bad``."""
    if x.dtype.kind != "f" or len(x) == 0:
        return x, y, 0
    bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    n = int(bad.sum())
    if not n:
        return x, y, 0
    first = int(np.flatnonzero(bad)[0])
    if not skip_bad:
        raise RunError(f"{n} of {len(x)} images hold NaN or Inf (the first is image {first}); "
                       "pass --skip-bad to leave them out", where)
    warn(f"left out {n} of {len(x)} images holding NaN or Inf (--skip-bad) ({where})")
    return x[~bad], y[~bad], n


# ---- MNIST IDX ------------------------------------------------------------
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_MAX_DIMS = 8


def read_idx(path, max_bytes=None) -> np.ndarray:
    """One IDX file (gzipped or not, told by its first bytes) as an array."""
    path = require_file(path)
    max_bytes = MAX_IDX_BYTES if max_bytes is None else max_bytes
    gz = False
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with (gzip.open if gz else open)(path, "rb") as f:
            return _read_idx_stream(f, path, gz, max_bytes)
    except _READ_ERRORS as e:
        raise RunError(f"cannot read it ({'bad or truncated gzip: ' if gz else ''}{e})", path) from None


def _read_exact(f, n, path, what):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise RunError(f"truncated: {what} needs {n} bytes, the file holds {got}", path)
        got += k
    return buf


def _read_idx_stream(f, path, gz, max_bytes):
    head = bytes(_read_exact(f, 4, path, "the IDX header"))
    if head[0] != 0 or head[1] != 0 or head[2] not in _IDX_TYPES:
        raise RunError("not an IDX file (bad magic number)", path)
    ndim = head[3]
    if not 1 <= ndim <= _IDX_MAX_DIMS:
        raise RunError(f"IDX header declares {ndim} dimensions (1 to {_IDX_MAX_DIMS} expected)", path)
    dims = tuple(int(d) for d in np.frombuffer(bytes(_read_exact(f, 4 * ndim, path, "the shape")), ">i4"))
    dt = np.dtype(_IDX_TYPES[head[2]])
    if min(dims) < 0:
        raise RunError(f"IDX header declares a negative size {dims}", path)
    n = 1
    for d in dims:
        n *= d
    nbytes, off = n * dt.itemsize, 4 + 4 * ndim
    if nbytes > max_bytes:
        raise RunError(f"IDX header declares shape {dims}, {nbytes:,} bytes, more than the "
                       f"{max_bytes:,} this reader accepts (corrupt header?)", path)
    size = path.stat().st_size
    if gz and nbytes > DEFLATE_MAX_RATIO * size + (1 << 16):
        raise RunError(f"IDX header declares {nbytes:,} bytes of shape {dims}, but a gzip file of "
                       f"{size:,} bytes cannot hold that much (corrupt header)", path)
    if not gz and size != off + nbytes:
        raise RunError(f"expected {nbytes} data bytes for shape {dims}, found {size - off} "
                       f"({'truncated' if size < off + nbytes else 'trailing data'} or corrupt)", path)
    data = _read_exact(f, nbytes, path, f"shape {dims}")
    if f.read(1):
        raise RunError(f"more data than its header declares for shape {dims} (corrupt)", path)
    # .type: numpy's canonical native dtype (a byte-swapped-then-native dtype is
    # an equal but distinct object, which identity checks in bindings reject)
    return np.frombuffer(data, dt, n).reshape(dims).astype(dt.newbyteorder("=").type)


def load_mnist(path: Path, skip_bad=False):
    """A directory with train-images/train-labels/t10k-images/t10k-labels IDX files."""
    d = path if path.is_dir() else path.parent
    found = {}
    for f in sorted(d.iterdir()):
        n = f.name.lower()
        part = "train" if "train" in n else "test" if ("t10k" in n or "test" in n) else None
        kind = "images" if ("images" in n or "idx3" in n) else "labels" if ("labels" in n or "idx1" in n) else None
        if part and kind and "ubyte" in n:
            found.setdefault((part, kind), f)
    missing = [f"{p}-{k}" for p in ("train", "test") for k in ("images", "labels") if (p, k) not in found]
    if missing:
        # a file given (ok.npz --format mnist) is read as its folder's IDX files: say so, not just '(.)'
        raise RunError(f"MNIST IDX files missing: {missing}" + ("" if path.is_dir() else
                       f" in {d}, the folder of the file given"), path)
    arrays = {key: read_idx(f) for key, f in found.items()}
    for part in ("train", "test"):
        f, y = found[(part, "labels")], arrays[(part, "labels")]
        if y.ndim != 1 or y.dtype.kind not in "iu" or (len(y) and y.min() < 0):
            raise RunError(f"labels must be one non-negative integer per image, got {y.dtype} {y.shape}", f)
    ytr = arrays[("train", "labels")].astype(np.int64)
    n_classes = int(ytr.max()) + 1 if len(ytr) else 0
    out = []
    for part in ("train", "test"):
        f = found[(part, "images")]
        x, y = arrays[(part, "images")], arrays[(part, "labels")].astype(np.int64)
        if x.ndim != 3 or len(x) != len(y):
            raise RunError(f"images of shape {x.shape} do not match the {len(y)} labels of "
                           f"{found[(part, 'labels')].name}", f)
        if len(y) and y.max() >= n_classes:
            raise RunError(f"label {int(y.max())} outside the {n_classes} classes "
                           "of the training labels", found[(part, 'labels')])
        x = x[:, None] if x.dtype == np.uint8 else x[:, None].astype(np.float32)
        x, y, n_bad = check_finite(x, y, f, skip_bad)
        out.append(Dataset(x, y, n_classes, f"{d.name}/{part}", classes=[str(i) for i in range(n_classes)],
                           bad_samples=n_bad))
    return out[0], out[1]


# ---- CIFAR-10 binary --------------------------------------------------------
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def load_cifar(path: Path, skip_bad=False, verbose=False):
    """``data_batch_*.bin`` + ``test_batch.bin`` (records of 1 label byte + 3072
    pixels).  A batch file that is not whole records is an error naming it, or
    skipped and named when ``skip_bad``."""
    d = path if path.is_dir() else path.parent
    if (d / "cifar-10-batches-bin").is_dir():
        d = d / "cifar-10-batches-bin"
    parts = {"train": sorted(d.glob("data_batch_*.bin")), "test": sorted(d.glob("test_batch*.bin"))}
    for part, files in parts.items():
        if not files:
            raise RunError(f"no CIFAR-10 {'data_batch_*.bin' if part == 'train' else 'test_batch.bin'} files", d)
    out = []
    for part, files in parts.items():
        xs, ys, bad = [], [], []
        for f in files:
            rec = _cifar_records(require_file(f), skip_bad)
            if rec is None:
                bad.append(str(f))
                continue
            ys.append(rec[:, 0].astype(np.int64))
            xs.append(rec[:, 1:].reshape(-1, 3, 32, 32))
        x = np.concatenate(xs) if xs else np.zeros((0, 3, 32, 32), np.uint8)
        y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
        out.append(Dataset(x, y, 10, f"cifar10/{part}", skipped=len(bad), classes=CIFAR_CLASSES,
                           skipped_files=bad))
        warn_skipped(out[-1], verbose)
    return out[0], out[1]


def _cifar_records(f, skip_bad):
    size = f.stat().st_size
    if size == 0 or size % CIFAR_RECORD:
        if skip_bad:
            return None
        raise RunError(f"{size:,} bytes is not a whole number of {CIFAR_RECORD}-byte CIFAR-10 records "
                       "(truncated or corrupt); pass --skip-bad to leave the file out", f)
    try:
        rec = np.fromfile(f, np.uint8).reshape(-1, CIFAR_RECORD)
    except OSError as e:
        raise RunError(f"cannot read it ({e})", f) from None
    if rec[:, 0].max() >= len(CIFAR_CLASSES):
        raise RunError(f"label {int(rec[:, 0].max())} outside the {len(CIFAR_CLASSES)} classes", f)
    return rec


# ---- npz ------------------------------------------------------------------------
_NPZ_ERRORS = _READ_ERRORS + (ValueError, KeyError, zipfile.BadZipFile, MemoryError)


def load_npz(path: Path, test_fraction=0.2, split_seed=0, skip_bad=False):
    """Keys ``x_train, y_train, x_test, y_test`` (or ``x, y``, split here); optional
    ``n_classes``.  Images (N,H,W), (N,C,H,W) or (N,H,W,C); uint8 or float."""
    from .readers import split
    path = require_file(path)
    try:
        _check_npz_members(path)
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            if {"x_train", "y_train", "x_test", "y_test"} <= keys:
                parts = {p: (z[f"x_{p}"], z[f"y_{p}"]) for p in ("train", "test")}
            elif {"x", "y"} <= keys:
                parts = {"all": (z["x"], z["y"])}
            else:
                parts = None
            n_classes = z["n_classes"] if "n_classes" in keys else None
    except _NPZ_ERRORS as e:
        raise RunError(f"not a readable .npz archive ({type(e).__name__}: {e})", path) from None
    if parts is None:
        raise RunError(f"npz needs x_train/y_train/x_test/y_test or x/y arrays, has {sorted(keys)}", path)
    if n_classes is not None:
        if n_classes.shape != () or n_classes.dtype.kind not in "iu" or not 0 < n_classes < 2**31:
            raise RunError(f"n_classes must be one positive integer, got {n_classes!r}", path)
        n_classes = int(n_classes)
    checked = {}
    for p, (x, y) in parts.items():
        sfx = "" if p == "all" else f"_{p}"
        nx, ny = (len(a) if np.ndim(a) else "no" for a in (x, y))
        if nx != ny or nx == "no":
            raise RunError(f"x{sfx} holds {nx} images but y{sfx} holds {ny} labels", path)
        x, y, n_bad = check_finite(_nchw(x, path), _labels(y, path), f"x{sfx} in {path}", skip_bad)
        checked[p] = (x, y, n_bad)
    if n_classes is None:
        n_classes = max((int(y.max()) + 1 for _, y, _ in checked.values() if len(y)), default=0)
    if "all" in checked:
        x, y, n_bad = checked["all"]
        tr, te = split(x, y, n_classes, test_fraction, split_seed, path.stem)
        tr.bad_samples = n_bad
        return tr, te
    return tuple(Dataset(x, y, n_classes, f"{path.stem}/{p}", bad_samples=n_bad)
                 for p, (x, y, n_bad) in checked.items())


def _check_npz_members(path):
    """Refuse, before any array is allocated, a member whose .npy header
    declares more bytes than the member holds or whose length is more than
    deflate can expand its compressed size to."""
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.file_size > DEFLATE_MAX_RATIO * info.compress_size + (1 << 16):
                raise ValueError(f"member {info.filename} claims {info.file_size:,} bytes from "
                                 f"{info.compress_size:,} compressed (corrupt)")
            if not info.filename.endswith(".npy"):
                continue
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(f))
                declared = dtype.itemsize
                for d in shape:
                    declared *= d
                if declared > info.file_size:
                    raise ValueError(f"member {info.filename} declares shape {shape} of {dtype}, "
                                     f"{declared:,} bytes, but holds {info.file_size:,} (truncated or corrupt)")


def _labels(y, path):
    y = np.asarray(y)
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer)
                           or (y.dtype.kind == "f" and np.isfinite(y).all() and np.all(np.mod(y, 1) == 0))):
        raise RunError(f"labels must be a 1-d integer array, got {y.dtype} {y.shape}", path)
    if len(y) and (y.min() < 0 or y.max() >= 2**31):
        raise RunError(f"labels must be in [0, 2**31), got {y.min()} .. {y.max()}", path)
    return y.astype(np.int64)


def _nchw(x, path):
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[3] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
        x = x.transpose(0, 3, 1, 2)
    elif x.ndim != 4:
        raise RunError(f"images must be (N,H,W), (N,C,H,W) or (N,H,W,C), got {x.shape}", path)
    if x.dtype == np.uint8:
        return np.ascontiguousarray(x)
    if np.issubdtype(x.dtype, np.floating):
        with np.errstate(over="ignore"):   # float64 beyond float32's range becomes Inf: check_finite says so
            return np.ascontiguousarray(x, dtype=np.float32)
    if np.issubdtype(x.dtype, np.integer) and x.min(initial=0) >= 0 and x.max(initial=0) <= 255:
        return np.ascontiguousarray(x, dtype=np.uint8)
    raise RunError(f"images must be uint8 or float, got {x.dtype}", path)
