"""The class-per-folder image tree (ImageNet's layout): ``root/train/<class>/*``
+ ``root/val|test/<class>/*``, or ``root/<class>/*`` split deterministically.

Symlinked files are followed; a symlinked directory is followed only when it
leads somewhere not already visited (its real path), so a link back to the
root or to another class never becomes an extra class.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from engine.errors import RunError

from .dataset import Dataset, FileDataset, skipped_note, warn_skipped

_TRAIN_DIRS = ("train",)
_TEST_DIRS = ("val", "test", "valid", "validation")
LAZY_FILES = 20000   # trees with more files are decoded batch by batch


class SizeMismatch:
    """What _decode returns for an image of another size than asked (no resize)."""

    def __init__(self, size):
        self.size = size


def load_tree(root: Path, size=None, channels=None, test_fraction=0.2, split_seed=0, lazy=None,
              resize=False, verbose=False):
    """(train, test) of an image tree.  Images are decoded with Pillow at
    ``size`` x ``size`` (default: the first image's side); an image of another
    size is an error unless ``resize``, which scales it.  All images are decoded
    at once, or per batch when ``lazy`` (default: more than LAZY_FILES files).
    Unreadable files are skipped and named in a warning (all of them when
    ``verbose``)."""
    from .readers import split_indices
    root = Path(root)
    mode = {None: "RGB", 3: "RGB", 1: "L"}.get(channels)
    if mode is None:
        # said "channels must be 1 or 3 for an image tree, got 2" of `--model tiny --data TREE`
        raise RunError(f"an image tree is decoded to 1 channel (grey) or 3 (RGB), and the network takes "
                       f"{channels}: give a --model of 1 or 3 channels", root)
    train_dir = next((root / d for d in _TRAIN_DIRS if (root / d).is_dir()), None)
    test_dir = next((root / d for d in _TEST_DIRS if (root / d).is_dir()), None)
    if train_dir is not None and test_dir is None:
        raise RunError("has train/ but no val/ or test/ directory", root)
    parts = [(root, root.name)] if train_dir is None else [(train_dir, f"{root.name}/train"),
                                                           (test_dir, f"{root.name}/{test_dir.name}")]
    above = {os.path.realpath(root)} | {os.path.realpath(d) for d, _ in parts}
    classes = list(_class_dirs(parts[0][0], above))
    listed = []
    for d, name in parts:
        found = _class_dirs(d, above, allow_empty=True)
        extra = sorted(set(found) - set(classes))
        if extra:
            raise RunError(f"classes {extra} are not among the {len(classes)} training classes", d)
        listed.append(_list_tree(found, classes))
    empty = [c for k, c in enumerate(classes) if not np.any(listed[0][1] == k)]
    if empty:
        # the class count (the net's outputs) still counts them: a typo'd or nested folder trained silently
        from engine.errors import counted
        from .dataset import warn
        warn(f"{counted(len(empty), 'class folder')} without an image file: {', '.join(empty[:5])}"
             + (f" (and {len(empty) - 5} more)" if len(empty) > 5 else "")
             + f"; the network still gets an output for each, which no training image teaches ({parts[0][0]})")
    first = _first_size(listed[0][0])
    if first is None:
        raise RunError("dataset is empty (no readable image; "
                       f"{skipped_note([str(f) for f in listed[0][0]], verbose)})", parts[0][0])
    if size is None:
        size = first[1][0]
    if not resize and first[1] != (size, size):
        _mismatch(first[0], first[1], size, 1)
    if lazy is None:
        lazy = sum(len(f) for f, _ in listed) > LAZY_FILES
    out = []
    for (d, name), (files, labels) in zip(parts, listed):
        if lazy:
            out.append(FileDataset(files, labels, len(classes), size, 1 if mode == "L" else 3, name, classes,
                                   resize=resize, verbose=verbose))
            continue
        x, y, bad = _decode_tree(files, labels, size, mode, resize)
        if len(x) == 0:
            raise RunError(f"dataset is empty ({len(bad)} unreadable files skipped)", name)
        out.append(Dataset(x, y, len(classes), name, skipped=len(bad), classes=classes, skipped_files=bad))
        warn_skipped(out[-1], verbose)
    if len(out) == 1:
        tr, te = split_indices(len(out[0]), test_fraction, split_seed, root.name)
        ds = out[0]
        train, test = ds.subset(tr, f"{root.name}/train"), ds.subset(te, f"{root.name}/test")
        if not lazy:
            train.skipped, train.skipped_files = ds.skipped, ds.skipped_files
        return train, test
    return out[0], out[1]


def _mismatch(path, wh, size, count):
    more = f" (and {count - 1} more images of other sizes)" if count > 1 else ""
    raise RunError(f"image is {wh[0]}x{wh[1]} but the network takes {size}x{size}{more}; "
                   f"pass --resize to scale the images", path)


def _class_dirs(d: Path, seen, allow_empty=False):
    """{class name: folder} of ``d``; a folder whose real path is ``seen`` (the
    root, the split folders or another class) is left out."""
    out, real = {}, set(seen)
    for q in sorted(d.iterdir()):
        if q.name.startswith(".") or not q.is_dir():
            continue
        r = os.path.realpath(q)
        if r in real or any(r == a or a.startswith(r + os.sep) for a in seen):
            continue     # a loop (a link to the root or above) or a second name of one class
        real.add(r)
        out[q.name] = q
    if not out and not allow_empty:
        raise RunError(f"no class folders found (expected {d}/<class>/<image files>)", d)
    return out


def _list_tree(found, classes):
    files, labels = [], []
    for k, c in enumerate(classes):
        sub = found.get(c)
        if sub is not None:
            for f in sorted(sub.iterdir()):
                if f.is_file() and not f.name.startswith("."):
                    files.append(f)
                    labels.append(k)
    return files, np.asarray(labels, np.int64)


def _decode_tree(files, labels, size, mode, resize):
    imgs = decode_many(files, size, mode, resize)
    wrong = [i for i, im in enumerate(imgs) if isinstance(im, SizeMismatch)]
    if wrong:
        _mismatch(files[wrong[0]], imgs[wrong[0]].size, size, len(wrong))
    ok = [i for i, im in enumerate(imgs) if im is not None]
    bad = [str(files[i]) for i, im in enumerate(imgs) if im is None]
    x = np.zeros((len(ok), 3 if mode == "RGB" else 1, size, size), np.uint8)
    for j, i in enumerate(ok):
        x[j] = imgs[i].transpose(2, 0, 1) if imgs[i].ndim == 3 else imgs[i][None]
    return x, labels[ok], bad


_POOL = None


def decode_many(files, size, mode, resize=True):
    """Decode (and resize, when ``resize``) in a thread pool (Pillow releases the
    GIL); None for each file that cannot be read, a SizeMismatch for each of
    another size when not ``resize``."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor
        from engine.parallel.threads import usable_cores
        # the cores this process may run on (taskset, a container's CPU set), not the host's
        _POOL = ThreadPoolExecutor(max_workers=min(8, 2 * usable_cores()),
                                   thread_name_prefix="sprint-decode")
    return list(_POOL.map(lambda f: _decode(f, size, mode, resize), files))


def _first_size(files):
    """(file, (width, height)) of the first readable image, or None."""
    from PIL import Image
    for f in files:
        try:
            with Image.open(f) as im:
                return f, im.size
        except Exception:
            continue
    return None


def _decode(path, size, mode, resize):
    from PIL import Image
    try:
        with Image.open(path) as im:
            if im.size != (size, size):
                if not resize:
                    return SizeMismatch(im.size)
                im = im.convert(mode).resize((size, size), Image.BILINEAR)
            return np.asarray(im.convert(mode), np.uint8)
    except Exception:   # any decode failure means "unreadable": skip and count
        return None
