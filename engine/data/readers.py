"""Readers: each turns a source into a (train, test) pair of Datasets.

Sources: the embedded digits, a class-per-folder image tree (ImageNet's
layout, tree.py), MNIST IDX files, CIFAR-10 binary batches and ``.npz``
archives (binary.py).  load_dataset holds the rules every source follows:
images of another size than the network's are an error unless ``resize``;
a test set of another size than the training set likewise; NaN/Inf images
are an error unless ``skip_bad``; unreadable image files are skipped and named.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from engine.errors import MissingFile, RunError, counted

from .dataset import Dataset
from .binary import CIFAR_CLASSES, CIFAR_RECORD, load_cifar, load_mnist, load_npz, read_idx  # noqa: F401
from .tree import LAZY_FILES, decode_many, load_tree  # noqa: F401

FORMATS = ("digits", "tree", "mnist", "cifar", "npz")
_ALIASES = {"folder": "tree", "imagefolder": "tree", "dir": "tree", "idx": "mnist",
            "cifar10": "cifar", "cifar-10": "cifar"}
DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")


def load_dataset(source="digits", fmt=None, size=None, channels=None, test_fraction=0.2,
                 split_seed=0, lazy=None, resize=False, skip_bad=False, verbose=False, suggest_model=True):
    """(train, test) Datasets from ``source``.

    ``fmt`` is one of FORMATS (guessed from the source when None).  ``size`` is
    the side of the network's square input: images of another size are an
    error unless ``resize`` (an image tree is then decoded at ``size``, an
    in-memory set is scaled by the deformation on the device).  ``channels``
    is the mode an image tree is decoded in; ``lazy`` makes a tree decode its
    images batch by batch.  NaN/Inf images are an error unless ``skip_bad``,
    which leaves them out with a warning (and, for CIFAR-10, whole truncated
    batch files).  Unreadable files are named in a warning (all of them when
    ``verbose``).  Sources without their own test set are split
    deterministically (``test_fraction``, ``split_seed``).  ``suggest_model``:
    a size error names the presets that take the data (not for a network
    fixed by a checkpoint, as sprint eval's).
    """
    if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1):
        raise ValueError(f"size must be a positive int, got {size!r}")
    try:
        fmt = detect_format(source) if fmt is None else _ALIASES.get(fmt, fmt)
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
        train, test = _read(source, fmt, size, channels, test_fraction, split_seed, lazy, resize, skip_bad,
                            verbose)
    except FileNotFoundError:
        raise
    except OSError as e:     # permissions, I/O errors: one message naming what could not be read
        raise RunError(f"cannot read it ({e.strerror or e})", e.filename or source) from None
    check_sizes(train, test, size, resize, source, suggest_model)
    return train, test


def _read(source, fmt, size, channels, test_fraction, split_seed, lazy, resize, skip_bad, verbose):
    if fmt == "digits":
        return load_digits(test_fraction, split_seed)
    path = Path(source)
    if not path.exists():
        raise MissingFile("no such file or folder for --data", source)
    if fmt == "tree":
        if not path.is_dir():
            raise RunError("an image tree is a directory, this is a file", path)
        return load_tree(path, size=size, channels=channels, test_fraction=test_fraction,
                         split_seed=split_seed, lazy=lazy, resize=resize, verbose=verbose)
    if fmt == "mnist":
        return load_mnist(path, skip_bad=skip_bad)
    if fmt == "cifar":
        return load_cifar(path, skip_bad=skip_bad, verbose=verbose)
    return load_npz(path, test_fraction, split_seed, skip_bad=skip_bad)


def check_sizes(train, test, size, resize, source, suggest_model=True):
    """Images must be the network's size (``size``) and the test set the
    training set's, unless ``resize``; resizing needs square images."""
    hw = [tuple(ds.shape[1:]) for ds in (train, test)]
    if resize:
        for ds, (h, w) in zip((train, test), hw):
            if h != w:
                raise ValueError(f"{source} ({ds.name}): images are {h}x{w}; only square images can be "
                                 f"resized to the network's square input")
        return
    for ds, (h, w) in zip((train, test), hw):
        if size is not None and (h, w) != (size, size):
            # --resize alone was said: to the default digits net (8x8) that meant
            # CIFAR-10 scaled down to 8x8, where a --model was forgotten
            raise ValueError(f"{source} ({ds.name}): images are {h}x{w} but the network takes {size}x{size}; "
                             + (f"{model_for(ds)}, or pass --resize" if suggest_model else "pass --resize")
                             + " to scale them")
    if hw[0] != hw[1]:
        raise RunError(f"test images ({test.name}) are {hw[1][0]}x{hw[1][1]} but training images "
                       f"({train.name}) are {hw[0][0]}x{hw[0][1]}; pass --resize to scale both "
                       "to the network's input", source)


def model_for(ds) -> str:
    """'give --model cifar (the preset for 32x32x3 images of 10 classes)': the
    presets that take ``ds`` as it is, for a message about a net that does not."""
    from engine.errors import counted
    from engine.spec import PRESETS
    c, h, w = ds.shape
    kind = f"{h}x{w}x{c} images of {counted(ds.n_classes, 'class', 'classes')}"
    fit = [n for n, s in PRESETS.items() if (s.m0, s.x0, s.x0, s.n_classes) == (c, h, w, ds.n_classes)]
    if not fit:
        return f"give a --model that takes {kind} (a spec file; no preset does)"
    return f"give --model {' or '.join(fit)} (the preset{'s' if len(fit) > 1 else ''} for {kind})"


def detect_format(source) -> str:
    if str(source) == "digits":
        return "digits"
    p = Path(source)
    if not p.exists():
        raise MissingFile("no such file or folder for --data", source)
    if p.is_file():
        if p.suffix == ".npz":
            return "npz"
        if "ubyte" in p.name or p.name.endswith(("idx1", "idx3")):
            return "mnist"
        if p.suffix == ".bin":
            return "cifar"
        raise RunError(f"cannot tell the data's format: name it with --format, one of "
                       f"{', '.join(FORMATS)}", p)
    if not p.is_dir():
        raise RunError("neither a file nor a directory", p)
    names = [q.name for q in p.iterdir()]
    if any("ubyte" in n for n in names):
        return "mnist"
    if any(n.endswith(".bin") for n in names) or "cifar-10-batches-bin" in names:
        return "cifar"
    if any(q.is_dir() for q in p.iterdir()):
        return "tree"
    raise RunError(f"cannot tell the format of the data in this folder: name it with --format, one of "
                   f"{', '.join(FORMATS)}", p)


def check_test_fraction(v) -> None:
    """The share of a source without a test set kept for testing (TrainConfig's
    test_fraction, a run's config.json): a number in (0, 1)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 < v < 1:
        raise ValueError(f"test_fraction must be a number in (0, 1), got {v!r}")


def split_indices(n, test_fraction, seed, name):
    check_test_fraction(test_fraction)
    if n < 2:
        raise RunError(f"{counted(n, 'sample')} cannot be split into train and test", name)
    perm = np.random.default_rng(seed).permutation(n)
    n_test = min(max(1, int(round(n * test_fraction))), n - 1)
    return perm[n_test:], perm[:n_test]


def split(x, y, n_classes, test_fraction, seed, name, classes=()):
    """Deterministic shuffled train/test split of one labelled array."""
    tr, te = split_indices(len(x), test_fraction, seed, name)
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
