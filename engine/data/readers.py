"""Readers: each turns a source into a (train, test) pair of Datasets.

Sources: the embedded digits, a class-per-folder image tree (ImageNet's
layout), MNIST IDX files, CIFAR-10 binary batches and ``.npz`` archives.
Files that cannot be decoded are skipped and counted in ``Dataset.skipped``;
an empty result or labels outside the class list raise ValueError.
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from .dataset import Dataset, FileDataset

FORMATS = ("digits", "tree", "mnist", "cifar", "npz")
_ALIASES = {"folder": "tree", "imagefolder": "tree", "dir": "tree", "idx": "mnist",
            "cifar10": "cifar", "cifar-10": "cifar"}
DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")


def load_dataset(source="digits", fmt=None, size=None, channels=None, test_fraction=0.2,
                 split_seed=0, lazy=None):
    """(train, test) Datasets from ``source``.

    ``fmt`` is one of FORMATS (guessed from the source when None).  ``size`` and
    ``channels`` only matter for image trees, whose files differ in size and mode;
    ``lazy`` makes a tree decode its images batch by batch (see load_tree).
    Sources without their own test set are split deterministically
    (``test_fraction``, ``split_seed``).
    """
    fmt = detect_format(source) if fmt is None else _ALIASES.get(fmt, fmt)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if fmt == "digits":
        return load_digits(test_fraction, split_seed)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"data source {str(source)!r} does not exist")
    if fmt == "tree":
        return load_tree(path, size=size, channels=channels, test_fraction=test_fraction,
                         split_seed=split_seed, lazy=lazy)
    if fmt == "mnist":
        return load_mnist(path)
    if fmt == "cifar":
        return load_cifar(path)
    return load_npz(path, test_fraction, split_seed)


def detect_format(source) -> str:
    if str(source) == "digits":
        return "digits"
    p = Path(source)
    if not p.exists():
        raise FileNotFoundError(f"data source {str(source)!r} does not exist")
    if p.is_file():
        if p.suffix == ".npz":
            return "npz"
        if "ubyte" in p.name or p.name.endswith(("idx1", "idx3")):
            return "mnist"
        if p.suffix == ".bin":
            return "cifar"
        raise ValueError(f"cannot tell the format of {p}; pass fmt= one of {FORMATS}")
    names = [q.name for q in p.iterdir()]
    if any("ubyte" in n for n in names):
        return "mnist"
    if any(n.endswith(".bin") for n in names) or "cifar-10-batches-bin" in names:
        return "cifar"
    if any(q.is_dir() for q in p.iterdir()):
        return "tree"
    raise ValueError(f"cannot tell the format of directory {p}; pass fmt= one of {FORMATS}")


def _split_indices(n, test_fraction, seed, name):
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if n < 2:
        raise ValueError(f"{name}: {n} samples cannot be split into train and test")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = min(max(1, int(round(n * test_fraction))), n - 1)
    return perm[n_test:], perm[:n_test]


def split(x, y, n_classes, test_fraction, seed, name, classes=()):
    """Deterministic shuffled train/test split of one labelled array."""
    tr, te = _split_indices(len(x), test_fraction, seed, name)
    return (Dataset(x[tr], y[tr], n_classes, f"{name}/train", classes=list(classes)),
            Dataset(x[te], y[te], n_classes, f"{name}/test", classes=list(classes)))


# ---- digits ---------------------------------------------------------------
def load_digits(test_fraction=0.2, split_seed=0):
    """UCI optical digits (1797 8x8 images, values 0..16) scaled to [0, 1]."""
    with gzip.open(DIGITS_FILE, "rt") as f:
        a = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x = (a[:, :64] / 16.0).reshape(-1, 1, 8, 8).astype(np.float32)
    y = a[:, 64].astype(np.int64)
    return split(x, y, 10, test_fraction, split_seed, "digits", classes=[str(i) for i in range(10)])


# ---- class-per-folder image tree -----------------------------------------
_TRAIN_DIRS = ("train",)
_TEST_DIRS = ("val", "test", "valid", "validation")


LAZY_FILES = 20000   # trees with more files are decoded batch by batch


def load_tree(root: Path, size=None, channels=None, test_fraction=0.2, split_seed=0, lazy=None):
    """``root/train/<class>/*`` + ``root/val|test/<class>/*``, or ``root/<class>/*``
    split deterministically.  Images are decoded with Pillow and resized to
    ``size`` x ``size`` (default: the first image's size): all at once, or per
    batch when ``lazy`` (default: more than LAZY_FILES files)."""
    root = Path(root)
    mode = {None: "RGB", 3: "RGB", 1: "L"}.get(channels)
    if mode is None:
        raise ValueError(f"channels must be 1 or 3 for an image tree, got {channels}")
    train_dir = next((root / d for d in _TRAIN_DIRS if (root / d).is_dir()), None)
    test_dir = next((root / d for d in _TEST_DIRS if (root / d).is_dir()), None)
    if train_dir is not None and test_dir is None:
        raise ValueError(f"{root}: has train/ but no val/ or test/ directory")
    parts = [(root, root.name)] if train_dir is None else [(train_dir, f"{root.name}/train"),
                                                           (test_dir, f"{root.name}/{test_dir.name}")]
    classes = _class_dirs(parts[0][0])
    listed = []
    for d, name in parts:
        extra = sorted(set(_class_dirs(d, allow_empty=True)) - set(classes))
        if extra:
            raise ValueError(f"{d}: classes {extra} are not among the {len(classes)} training classes")
        listed.append(_list_tree(d, classes))
    if size is None:
        size = _first_size(listed[0][0])
    if size is None:
        raise ValueError(f"{parts[0][0]}: dataset is empty (no readable image)")
    if lazy is None:
        lazy = sum(len(f) for f, _ in listed) > LAZY_FILES
    out = []
    for (d, name), (files, labels) in zip(parts, listed):
        if lazy:
            out.append(FileDataset(files, labels, len(classes), size, 1 if mode == "L" else 3, name, classes))
            continue
        x, y, bad = _decode_tree(files, labels, size, mode)
        if len(x) == 0:
            raise ValueError(f"{name}: dataset is empty ({len(bad)} unreadable files skipped)")
        out.append(Dataset(x, y, len(classes), name, skipped=len(bad), classes=classes, skipped_files=bad))
    if len(out) == 1:
        tr, te = _split_indices(len(out[0]), test_fraction, split_seed, root.name)
        ds = out[0]
        train, test = ds.subset(tr, f"{root.name}/train"), ds.subset(te, f"{root.name}/test")
        if not lazy:
            train.skipped, train.skipped_files = ds.skipped, ds.skipped_files
        return train, test
    return out[0], out[1]


def _class_dirs(d: Path, allow_empty=False):
    classes = sorted(q.name for q in d.iterdir() if q.is_dir() and not q.name.startswith("."))
    if not classes and not allow_empty:
        raise ValueError(f"{d}: no class folders found (expected {d}/<class>/<image files>)")
    return classes


def _list_tree(d: Path, classes):
    files, labels = [], []
    for k, c in enumerate(classes):
        sub = d / c
        if sub.is_dir():
            for f in sorted(sub.iterdir()):
                if f.is_file() and not f.name.startswith("."):
                    files.append(f)
                    labels.append(k)
    return files, np.asarray(labels, np.int64)


def _decode_tree(files, labels, size, mode):
    imgs = decode_many(files, size, mode)
    ok = [i for i, im in enumerate(imgs) if im is not None]
    bad = [str(files[i]) for i, im in enumerate(imgs) if im is None]
    x = np.zeros((len(ok), 3 if mode == "RGB" else 1, size, size), np.uint8)
    for j, i in enumerate(ok):
        x[j] = imgs[i].transpose(2, 0, 1) if imgs[i].ndim == 3 else imgs[i][None]
    return x, labels[ok], bad


_POOL = None


def decode_many(files, size, mode):
    """Decode and resize in a thread pool (Pillow releases the GIL); None for
    each file that cannot be read."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor
        _POOL = ThreadPoolExecutor(max_workers=min(8, 2 * (os.cpu_count() or 1)),
                                   thread_name_prefix="sprint-decode")
    return list(_POOL.map(lambda f: _decode(f, size, mode), files))


def _first_size(files):
    from PIL import Image
    for f in files:
        try:
            with Image.open(f) as im:
                return im.size[0]
        except Exception:
            continue
    return None


def _decode(path, size, mode):
    from PIL import Image
    try:
        with Image.open(path) as im:
            im = im.convert(mode)
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, np.uint8)
    except Exception:   # any decode failure means "unreadable": skip and count
        return None


# ---- MNIST IDX ------------------------------------------------------------
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path) -> np.ndarray:
    """One IDX file (gzipped or not) as an array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    ndim = data[3]
    dims = np.frombuffer(data, ">i4", ndim, 4).astype(np.int64)
    dt = np.dtype(_IDX_TYPES[data[2]])
    n = int(np.prod(dims))
    off = 4 + 4 * ndim
    if len(data) - off != n * dt.itemsize:
        raise ValueError(f"{path}: expected {n * dt.itemsize} data bytes for shape {tuple(dims)}, "
                         f"found {len(data) - off} (truncated or corrupt)")
    # .type: numpy's canonical native dtype (a byte-swapped-then-native dtype is
    # an equal but distinct object, which identity checks in bindings reject)
    return np.frombuffer(data, dt, n, off).reshape(tuple(dims)).astype(dt.newbyteorder("=").type)


def load_mnist(path: Path):
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
        raise ValueError(f"{d}: MNIST IDX files missing: {missing}")
    arrays = {key: read_idx(f) for key, f in found.items()}
    ytr = arrays[("train", "labels")].astype(np.int64)
    n_classes = int(ytr.max()) + 1
    out = []
    for part in ("train", "test"):
        x, y = arrays[(part, "images")], arrays[(part, "labels")].astype(np.int64)
        if x.ndim != 3 or len(x) != len(y):
            raise ValueError(f"{d}: {part} images of shape {x.shape} do not match {len(y)} labels")
        x = x[:, None] if x.dtype == np.uint8 else x[:, None].astype(np.float32)
        out.append(Dataset(x, y, n_classes, f"{d.name}/{part}", classes=[str(i) for i in range(n_classes)]))
    return out[0], out[1]


# ---- CIFAR-10 binary --------------------------------------------------------
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def load_cifar(path: Path):
    """``data_batch_*.bin`` + ``test_batch.bin`` (records of 1 label byte + 3072 pixels);
    a batch file of the wrong size is skipped and counted."""
    d = path if path.is_dir() else path.parent
    if (d / "cifar-10-batches-bin").is_dir():
        d = d / "cifar-10-batches-bin"
    parts = {"train": sorted(d.glob("data_batch_*.bin")), "test": sorted(d.glob("test_batch*.bin"))}
    for part, files in parts.items():
        if not files:
            raise ValueError(f"{d}: no CIFAR-10 {'data_batch_*.bin' if part == 'train' else 'test_batch.bin'} files")
    out = []
    for part, files in parts.items():
        xs, ys, bad = [], [], []
        for f in files:
            raw = np.fromfile(f, np.uint8)
            if raw.size == 0 or raw.size % CIFAR_RECORD:
                bad.append(str(f))
                continue
            rec = raw.reshape(-1, CIFAR_RECORD)
            ys.append(rec[:, 0].astype(np.int64))
            xs.append(rec[:, 1:].reshape(-1, 3, 32, 32))
        x = np.concatenate(xs) if xs else np.zeros((0, 3, 32, 32), np.uint8)
        y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
        out.append(Dataset(x, y, 10, f"cifar10/{part}", skipped=len(bad), classes=CIFAR_CLASSES,
                           skipped_files=bad))
    return out[0], out[1]


# ---- npz ------------------------------------------------------------------------
def load_npz(path: Path, test_fraction=0.2, split_seed=0):
    """Keys ``x_train, y_train, x_test, y_test`` (or ``x, y``, split here); optional
    ``n_classes``.  Images (N,H,W), (N,C,H,W) or (N,H,W,C); uint8 or float."""
    with np.load(path, allow_pickle=False) as z:
        keys = set(z.files)
        if {"x_train", "y_train", "x_test", "y_test"} <= keys:
            parts = {p: (z[f"x_{p}"], z[f"y_{p}"]) for p in ("train", "test")}
        elif {"x", "y"} <= keys:
            parts = {"all": (z["x"], z["y"])}
        else:
            raise ValueError(f"{path}: npz needs x_train/y_train/x_test/y_test or x/y arrays, has {sorted(keys)}")
        n_classes = int(z["n_classes"]) if "n_classes" in keys else None
    parts = {p: (_nchw(x, path), _labels(y, path)) for p, (x, y) in parts.items()}
    if n_classes is None:
        n_classes = int(max(y.max() for _, y in parts.values() if len(y))) + 1 if any(
            len(y) for _, y in parts.values()) else 0
    if "all" in parts:
        return split(*parts["all"], n_classes, test_fraction, split_seed, path.stem)
    return tuple(Dataset(*parts[p], n_classes, f"{path.stem}/{p}") for p in ("train", "test"))


def _labels(y, path):
    y = np.asarray(y)
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or np.all(np.mod(y, 1) == 0)):
        raise ValueError(f"{path}: labels must be a 1-d integer array, got {y.dtype} {y.shape}")
    return y.astype(np.int64)


def _nchw(x, path):
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[3] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
        x = x.transpose(0, 3, 1, 2)
    elif x.ndim != 4:
        raise ValueError(f"{path}: images must be (N,H,W), (N,C,H,W) or (N,H,W,C), got {x.shape}")
    if x.dtype == np.uint8:
        return np.ascontiguousarray(x)
    if np.issubdtype(x.dtype, np.floating):
        return np.ascontiguousarray(x, dtype=np.float32)
    if np.issubdtype(x.dtype, np.integer) and x.min(initial=0) >= 0 and x.max(initial=0) <= 255:
        return np.ascontiguousarray(x, dtype=np.uint8)
    raise ValueError(f"{path}: images must be uint8 or float, got {x.dtype}")
