"""An in-memory labelled image set: x (N, C, H, W) uint8 or float32, y int64;
and its lazy twin for image trees too large for memory."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from engine.errors import RunError, counted

NAMED_SKIPS = 5        # unreadable files named in a warning unless verbose
_name_all = False


def name_all_skipped(on=True):
    """Name every unreadable file in warnings, not only the first NAMED_SKIPS
    (``sprint train -v``; the readers' ``verbose=True`` does it per call)."""
    global _name_all
    _name_all = bool(on)


def warn(msg):
    """One ``sprint: warning:`` line on stderr (the CLI's error lines' twin)."""
    print(f"sprint: warning: {msg}", file=sys.stderr, flush=True)


def skipped_note(files, verbose=False, total=None) -> str:
    """'N unreadable files skipped: a, b, c (and K more; -v names them all)'."""
    total = len(files) if total is None else total
    shown = list(files) if verbose or _name_all else list(files)[:NAMED_SKIPS]
    more = total - len(shown)
    return (f"{counted(total, 'unreadable file')} skipped: {', '.join(shown)}"
            + (f" (and {more} more; -v names them all)" if more > 0 else ""))


def warn_skipped(ds, verbose=False):
    if ds.skipped:
        warn(f"{skipped_note(ds.skipped_files, verbose, ds.skipped)} ({ds.name})")


@dataclass
class Dataset:
    """Images ``x`` (N, C, H, W) uint8 or float32 in memory and labels ``y``."""
    x: np.ndarray
    y: np.ndarray
    n_classes: int
    name: str = ""
    skipped: int = 0                       # unreadable/corrupt files left out
    classes: list = field(default_factory=list)
    skipped_files: list = field(default_factory=list)   # their names
    bad_samples: int = 0                   # images with NaN/Inf left out (skip_bad)

    def __post_init__(self):
        x = np.asarray(self.x)
        self.x = np.ascontiguousarray(x, dtype=x.dtype.type)   # canonical dtype object
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if self.x.ndim != 4:
            raise RunError(f"x must be (N, C, H, W), got shape {self.x.shape}", self.name)
        if self.x.dtype not in (np.uint8, np.float32):
            raise TypeError(f"x must be uint8 or float32, got {self.x.dtype} ({self.name or 'dataset'})")
        if len(self.x) == 0:
            raise RunError("dataset is empty"
                           + (f" ({self.skipped} unreadable files skipped)" if self.skipped else ""), self.name)
        if self.y.shape != (len(self.x),):
            raise RunError(f"{len(self.x)} images but labels of shape {self.y.shape}", self.name)
        self.n_classes = int(self.n_classes)
        bad = (self.y < 0) | (self.y >= self.n_classes)
        if bad.any():
            raise RunError(f"label {int(self.y[bad][0])} outside the "
                           f"{self.n_classes} classes", self.name)

    def __len__(self):
        return len(self.x)

    def __repr__(self):
        return _repr(self, f"{self.x.dtype}")

    @property
    def shape(self):
        """(C, H, W) of one sample."""
        return tuple(self.x.shape[1:])

    def take(self, idx):
        """LoadImage: (x, y) of the samples ``idx``."""
        return self.x[idx], self.y[idx]

    def subset(self, idx, name=None) -> "Dataset":
        """The samples ``idx`` as a new Dataset."""
        return Dataset(self.x[idx], self.y[idx], self.n_classes, name or self.name,
                       classes=list(self.classes))

    def channel_stats(self):
        """Per-channel mean and std in the units deform normalises (uint8 / 255)."""
        x = self.x.astype(np.float64)
        if self.x.dtype == np.uint8:
            x /= 255.0
        mean = x.mean(axis=(0, 2, 3))
        std = x.std(axis=(0, 2, 3))
        return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


class FileDataset:
    """A class-per-folder image set too large for memory: images are decoded
    (and resized) when a batch is taken.  A file that fails to decode is left
    out of its batch and counted once in ``skipped``."""

    def __init__(self, files, y, n_classes, size, channels=3, name="", classes=(), resize=True,
                 verbose=False):
        self.files = [str(f) for f in files]
        self.resize = bool(resize)     # else an image of another size than ``size`` is an error
        self.verbose = verbose         # name every unreadable file, not only the first few
        self.y = np.ascontiguousarray(y, dtype=np.int64)
        self.n_classes = int(n_classes)
        self.name = name
        self.classes = list(classes)
        self.size = int(size)
        self.mode = {1: "L", 3: "RGB"}[channels]
        self._bad = {}
        if not self.files:
            raise RunError("dataset is empty", name)
        if self.y.shape != (len(self.files),):
            raise RunError(f"{len(self.files)} files but labels of shape {self.y.shape}", name)
        bad = (self.y < 0) | (self.y >= self.n_classes)
        if bad.any():
            raise RunError(f"label {int(self.y[bad][0])} outside the {self.n_classes} classes", name)

    def __len__(self):
        return len(self.files)

    def __repr__(self):
        return _repr(self, "files")

    @property
    def shape(self):
        return (1 if self.mode == "L" else 3, self.size, self.size)

    @property
    def skipped(self):
        return len(self._bad)

    @property
    def skipped_files(self):
        return sorted(self._bad.values())

    def take(self, idx):
        from .tree import SizeMismatch, decode_many
        idx = np.asarray(idx)
        imgs = decode_many([self.files[i] for i in idx], self.size, self.mode, self.resize)
        ok = [j for j, im in enumerate(imgs) if im is not None]
        for j, im in enumerate(imgs):
            if isinstance(im, SizeMismatch):
                raise RunError(f"image is {im.size[0]}x{im.size[1]} but the network takes "
                               f"{self.size}x{self.size}; pass --resize to scale the images",
                               self.files[idx[j]])
            if im is None and int(idx[j]) not in self._bad:
                self._bad[int(idx[j])] = self.files[idx[j]]
                if self.verbose or _name_all or len(self._bad) <= NAMED_SKIPS:
                    warn(f"cannot read {self.files[idx[j]]}; skipped ({self.name})")
                elif len(self._bad) == NAMED_SKIPS + 1:
                    warn(f"more unreadable files; they are counted, -v names them ({self.name})")
        x = np.zeros((len(ok),) + self.shape, np.uint8)
        for k, j in enumerate(ok):
            x[k] = imgs[j].transpose(2, 0, 1) if imgs[j].ndim == 3 else imgs[j][None]
        return x, self.y[idx[ok]]

    def subset(self, idx, name=None) -> "FileDataset":
        return FileDataset([self.files[i] for i in idx], self.y[idx], self.n_classes, self.size,
                           self.shape[0], name or self.name, self.classes, self.resize, self.verbose)

    def channel_stats(self, sample=512):
        """Mean/std estimated on a fixed sample of the images."""
        idx = np.random.default_rng(0).permutation(len(self))[:sample]
        x, _ = self.take(np.sort(idx))
        if len(x) == 0:
            raise RunError(f"none of {len(idx)} sampled images could be read", self.name)
        return Dataset(x, np.zeros(len(x)), 1).channel_stats()


def _repr(ds, kind):
    return (f"{type(ds).__name__}({ds.name or 'unnamed'!r}, n={len(ds)}, shape={ds.shape}, {kind}, "
            f"{ds.n_classes} classes" + (f", {ds.skipped} skipped" if ds.skipped else "") + ")")
