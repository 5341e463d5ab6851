"""Readers on small generated files, the digits split, deformation config and
the prefetching loader."""
import gzip
import struct
import threading

import numpy as np
import pytest
from PIL import Image

from engine.data import Dataset, DeformConfig, Loader, detect_format, load_dataset, read_idx
from engine.data import readers


# ---- generators -----------------------------------------------------------------
COLORS = {"cat": (250, 10, 10), "dog": (10, 10, 250)}


def _image(path, color, size, fmt):
    rng = np.random.default_rng(abs(hash(str(path))) % 2**32)
    a = np.clip(np.array(color)[None, None] + rng.integers(-5, 6, (size[1], size[0], 3)), 0, 255)
    Image.fromarray(a.astype(np.uint8)).save(path, fmt)


def _tree(root, parts=("train", "val"), per_class=3, corrupt=True):
    for part in parts:
        for cls, color in COLORS.items():
            d = root / part / cls if part else root / cls
            d.mkdir(parents=True)
            for i in range(per_class):
                _image(d / f"{i}.jpg" if i % 2 else d / f"{i}.png", color, (12 + 3 * i, 10 + i),
                       "JPEG" if i % 2 else "PNG")
    if corrupt:
        bad = root / (parts[0] or "") / "cat" / "broken.jpg"
        bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" + bytes(40))
    return root


def _idx(path, arr, code):
    head = struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    data = head + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    (gzip.open if str(path).endswith(".gz") else open)(path, "wb").write(data)


# ---- image tree -----------------------------------------------------------------
def test_image_tree_resizes_labels_and_counts_the_corrupt_jpeg(tmp_path):
    root = _tree(tmp_path / "imgs")
    assert detect_format(root) == "tree"
    tr, te = load_dataset(root, size=8, resize=True)
    assert tr.x.shape == (6, 3, 8, 8) and tr.x.dtype == np.uint8 and te.x.shape == (6, 3, 8, 8)
    assert tr.skipped == 1 and tr.skipped_files[0].endswith("broken.jpg") and te.skipped == 0
    assert tr.classes == ["cat", "dog"] and tr.n_classes == 2
    red = tr.x[:, 0].mean(axis=(1, 2)) > tr.x[:, 2].mean(axis=(1, 2))
    assert np.array_equal(red, tr.y == 0)
    g, _ = load_dataset(root, fmt="tree", size=5, channels=1, resize=True)
    assert g.x.shape == (6, 1, 5, 5)


def test_the_decode_pool_takes_the_cores_this_process_may_use(monkeypatch):
    """Its threads were 2 x os.cpu_count, the host's cores, where the rest of
    the engine counts those of the affinity mask (usable_cores)."""
    import os
    from engine.data import tree
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(tree, "_POOL", None)        # restored after the test
    assert tree.decode_many([], 4, "RGB") == []
    try:
        assert tree._POOL._max_workers == 2
    finally:
        tree._POOL.shutdown()


def test_lazy_image_tree_decodes_per_batch_and_counts_once(tmp_path):
    root = _tree(tmp_path / "imgs")
    eager, _ = load_dataset(root, size=8, resize=True)
    tr, te = load_dataset(root, size=8, lazy=True, resize=True)
    assert len(tr) == 7 and tr.skipped == 0 and tr.shape == (3, 8, 8)   # nothing decoded yet
    ld = Loader(tr, 3, shuffle=False, prefetch=0)
    for epoch in range(2):
        ld.set_epoch(epoch)
        xs = [np.asarray(x) for x, _ in ld]
        assert sum(map(len, xs)) == 6 and tr.skipped == 1 and tr.skipped_files[0].endswith("broken.jpg")
    got = np.concatenate(xs)
    np.testing.assert_allclose(got, eager.x / 255.0, atol=1e-6)   # same pixels as the eager reader
    mean, std = tr.channel_stats()
    np.testing.assert_allclose(mean, eager.channel_stats()[0], rtol=1e-5)
    sub = load_dataset(tmp_path / "imgs" / "train", size=8, lazy=True, test_fraction=0.3, resize=True)
    assert [type(d).__name__ for d in sub] == ["FileDataset"] * 2 and len(sub[0]) + len(sub[1]) == 7


def test_image_tree_without_split_dirs_is_split_deterministically(tmp_path):
    root = _tree(tmp_path / "flat", parts=("",), per_class=5, corrupt=False)
    a_tr, a_te = load_dataset(root, size=6, test_fraction=0.3, resize=True)
    b_tr, b_te = load_dataset(root, size=6, test_fraction=0.3, resize=True)
    assert len(a_tr) + len(a_te) == 10 and len(a_te) == 3
    assert np.array_equal(a_te.x, b_te.x) and np.array_equal(a_tr.y, b_tr.y)


def test_image_tree_errors(tmp_path):
    root = _tree(tmp_path / "mismatch")
    (root / "val" / "bird").mkdir()
    _image(root / "val" / "bird" / "0.png", (0, 200, 0), (8, 8), "PNG")
    with pytest.raises(ValueError, match=r"bird.*not among"):
        load_dataset(root, size=8, resize=True)
    empty = tmp_path / "empty"
    (empty / "a").mkdir(parents=True)
    (empty / "a" / "x.jpg").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="empty.*1 unreadable"):
        load_dataset(empty, fmt="tree", size=4, resize=True)
    with pytest.raises(ValueError, match="no class folders"):
        (tmp_path / "none").mkdir()
        readers.load_tree(tmp_path / "none")


# ---- MNIST IDX --------------------------------------------------------------------
@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx(tmp_path, gz):
    rng = np.random.default_rng(0)
    ext = ".gz" if gz else ""
    xtr, ytr = rng.integers(0, 256, (7, 5, 5)).astype(np.uint8), np.arange(7) % 4
    xte, yte = rng.integers(0, 256, (3, 5, 5)).astype(np.uint8), np.array([3, 0, 1])
    _idx(tmp_path / f"train-images-idx3-ubyte{ext}", xtr, 0x08)
    _idx(tmp_path / f"train-labels-idx1-ubyte{ext}", ytr.astype(np.uint8), 0x08)
    _idx(tmp_path / f"t10k-images-idx3-ubyte{ext}", xte, 0x08)
    _idx(tmp_path / f"t10k-labels-idx1-ubyte{ext}", yte.astype(np.uint8), 0x08)
    assert detect_format(tmp_path) == "mnist"
    tr, te = load_dataset(tmp_path)
    assert np.array_equal(tr.x[:, 0], xtr) and np.array_equal(tr.y, ytr) and tr.n_classes == 4
    assert np.array_equal(te.x[:, 0], xte) and np.array_equal(te.y, yte)
    (x, y), = list(Loader(te, 3, shuffle=False))   # big-endian file -> native arrays the ops accept
    np.testing.assert_allclose(x[:, 0], xte / 255.0, atol=1e-6)


def test_idx_types_and_corruption(tmp_path):
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4) - 5
    _idx(tmp_path / "a.idx", a, 0x0C)
    assert np.array_equal(read_idx(tmp_path / "a.idx"), a)
    f = np.linspace(0, 1, 6, dtype=np.float32)
    _idx(tmp_path / "f.idx.gz", f, 0x0D)
    assert np.array_equal(read_idx(tmp_path / "f.idx.gz"), f)
    raw = (tmp_path / "a.idx").read_bytes()
    (tmp_path / "short.idx").write_bytes(raw[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short.idx")
    (tmp_path / "bad.idx").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad.idx")
    (tmp_path / "train-images-idx3-ubyte").write_bytes(raw)
    with pytest.raises(ValueError, match="missing"):
        load_dataset(tmp_path, fmt="mnist")


# ---- CIFAR-10 binary -------------------------------------------------------------------
def _cifar_file(path, labels, rng):
    rec = np.zeros((len(labels), readers.CIFAR_RECORD), np.uint8)
    rec[:, 0] = labels
    rec[:, 1:] = rng.integers(0, 256, (len(labels), 3072))
    rec.tofile(path)
    return rec


def test_cifar_binary_batches_and_a_corrupt_one(tmp_path):
    rng = np.random.default_rng(0)
    r1 = _cifar_file(tmp_path / "data_batch_1.bin", [0, 9, 3], rng)
    r2 = _cifar_file(tmp_path / "data_batch_2.bin", [5, 5], rng)
    rt = _cifar_file(tmp_path / "test_batch.bin", [1, 2], rng)
    (tmp_path / "data_batch_3.bin").write_bytes(bytes(100))   # truncated batch
    assert detect_format(tmp_path) == "cifar"
    with pytest.raises(ValueError, match=r"^100 bytes is not a whole number.*--skip-bad.* \(\S*data_batch_3.bin\)$"):
        load_dataset(tmp_path)
    tr, te = load_dataset(tmp_path, skip_bad=True)
    assert tr.skipped_files == [str(tmp_path / "data_batch_3.bin")]
    assert tr.skipped == 1 and te.skipped == 0 and len(tr) == 5 and tr.n_classes == 10
    assert np.array_equal(tr.y, [0, 9, 3, 5, 5]) and np.array_equal(te.y, [1, 2])
    # record layout: 1024 red, then green, then blue, row-major
    assert tr.x[1, 1, 0, 2] == r1[1, 1 + 1024 + 2] and tr.x[4, 2, 31, 31] == r2[1, -1]
    assert np.array_equal(te.x.reshape(2, -1), rt[:, 1:])
    (tmp_path / "test_batch.bin").unlink()
    _cifar_file(tmp_path / "test_batch.bin", [11], rng)
    with pytest.raises(ValueError, match=r"^label 11 outside the 10 classes.* \(\S*test_batch.bin\)$"):
        load_dataset(tmp_path, fmt="cifar", skip_bad=True)


# ---- npz -----------------------------------------------------------------------
def test_npz_layouts_split_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (10, 6, 6, 3)).astype(np.uint8)   # NHWC
    y = np.arange(10) % 3
    np.savez(tmp_path / "a.npz", x_train=x[:7], y_train=y[:7], x_test=x[7:], y_test=y[7:])
    tr, te = load_dataset(tmp_path / "a.npz")
    assert tr.x.shape == (7, 3, 6, 6) and np.array_equal(tr.x, x[:7].transpose(0, 3, 1, 2))
    assert tr.n_classes == 3 and np.array_equal(te.y, y[7:])
    np.savez(tmp_path / "b.npz", x=rng.random((20, 4, 4)), y=np.arange(20) % 2)
    tr, te = load_dataset(tmp_path / "b.npz", test_fraction=0.25)
    assert tr.x.dtype == np.float32 and tr.x.shape == (15, 1, 4, 4) and len(te) == 5
    np.savez(tmp_path / "c.npz", x=x, y=y + 1, n_classes=3)
    with pytest.raises(ValueError, match="outside the 3 classes"):
        load_dataset(tmp_path / "c.npz")
    np.savez(tmp_path / "d.npz", images=x)
    with pytest.raises(ValueError, match="x_train"):
        load_dataset(tmp_path / "d.npz")
    np.savez(tmp_path / "e.npz", x_train=x[:0], y_train=y[:0], x_test=x, y_test=y)
    with pytest.raises(ValueError, match="empty"):
        load_dataset(tmp_path / "e.npz")
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="fmt must be"):
        load_dataset(tmp_path / "a.npz", fmt="hdf5")


# ---- digits ------------------------------------------------------------------
def test_embedded_digits_split():
    tr, te = load_dataset("digits")
    tr2, te2 = load_dataset()
    assert len(tr) + len(te) == 1797 and len(te) == 359
    assert tr.x.shape[1:] == (1, 8, 8) and tr.x.dtype == np.float32
    assert 0 <= tr.x.min() and tr.x.max() == 1.0
    assert np.array_equal(te.x, te2.x) and np.array_equal(tr.y, tr2.y)
    assert set(np.unique(te.y)) == set(range(10))
    rows = {r.tobytes() for r in tr.x.reshape(len(tr), -1)}
    assert sum(r.tobytes() in rows for r in te.x.reshape(len(te), -1)) < 5   # (rare duplicate images)


# ---- deformation config ------------------------------------------------------
def test_deform_config():
    cfg = DeformConfig(crop_pad=2, flip=True, scale=(0.9, 1.1))
    assert cfg.augments and not cfg.eval().augments and cfg.eval().out_hw == cfg.out_hw
    p = cfg.draw(np.random.default_rng(0), 500, (8, 8), (4, 4))
    assert p.shape == (500, 4) and p.dtype == np.float32
    assert 0.45 <= p[:, 0].min() and p[:, 0].max() <= 0.55   # resize 8->4 times jitter
    assert set(np.unique(p[:, 1])) == {-2, -1, 0, 1, 2} and set(np.unique(p[:, 3])) == {0, 1}
    ds = Dataset(np.full((4, 2, 3, 3), 51, np.uint8), np.zeros(4), 1)
    m = DeformConfig().with_stats(ds)
    assert m.mean == pytest.approx((0.2, 0.2)) and min(m.std) > 0
    for bad in (dict(crop_pad=-1), dict(scale=(1.2, 1.1)), dict(std=(0.0,))):
        with pytest.raises(ValueError):
            DeformConfig(**bad)


# ---- loader ---------------------------------------------------------------------
def _indexed(n, c=1, side=4):
    x = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None, None], (n, c, side, side)).copy()
    return Dataset(x, np.arange(n) % 3, 3)


def _ids(batches):
    return [np.asarray(x)[:, 0, 0, 0].astype(int).tolist() for x, _ in batches]


def test_loader_covers_each_sample_once_and_is_deterministic():
    ds = _indexed(23)
    ld = Loader(ds, 5, seed=4)
    first = _ids(ld)
    assert [len(b) for b in first] == [5, 5, 5, 5, 3] and len(ld) == 5
    assert sorted(sum(first, [])) == list(range(23))
    assert _ids(Loader(ds, 5, seed=4)) == first
    assert _ids(Loader(ds, 5, seed=4, prefetch=0)) == first
    ld.set_epoch(1)
    assert _ids(ld) != first
    for x, y in Loader(ds, 5, seed=4):
        assert x.dtype == np.float32 and np.array_equal(y, np.asarray(x)[:, 0, 0, 0].astype(int) % 3)
    assert _ids(Loader(ds, 5, shuffle=False))[0] == [0, 1, 2, 3, 4]
    assert len(Loader(ds, 5, drop_last=True)) == 4 and sum(map(len, _ids(Loader(ds, 5, drop_last=True)))) == 20


def test_loader_shards_are_disjoint():
    ds = _indexed(30)
    shards = [sum(_ids(Loader(ds, 4, seed=1, rank=r, world=3)), []) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(30)) and all(len(s) == 10 for s in shards)
    with pytest.raises(ValueError, match="rank"):
        Loader(ds, 4, rank=3, world=3)
    with pytest.raises(ValueError, match="empty"):
        Loader(_indexed(2), 4, rank=2, world=3)


def test_loader_normalises_and_deforms_deterministically():
    rng = np.random.default_rng(0)
    ds = Dataset(rng.integers(0, 256, (6, 3, 8, 8)).astype(np.uint8), np.zeros(6), 1)
    norm = DeformConfig(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.5))
    (x, _), = list(Loader(ds, 6, shuffle=False, deform=norm))
    ref = (ds.x / 255.0 - np.array(norm.mean)[:, None, None]) / np.array(norm.std)[:, None, None]
    np.testing.assert_allclose(x, ref, rtol=1e-5, atol=1e-5)
    aug = DeformConfig(crop_pad=2, flip=True, mean=norm.mean, std=norm.std)
    a = np.asarray(next(iter(Loader(ds, 6, deform=aug, seed=3)))[0])
    b = np.asarray(next(iter(Loader(ds, 6, deform=aug, seed=3)))[0])
    assert np.array_equal(a, b) and a.shape == (6, 3, 8, 8)
    small = DeformConfig(out_hw=(4, 4))
    assert next(iter(Loader(ds, 2, deform=small)))[0].shape == (2, 3, 4, 4)


def test_loader_thread_errors_surface_and_early_break_stops_thread():
    ds = _indexed(40)
    ld = Loader(ds, 4, prefetch=1)

    def boom(*a):
        raise OSError("disk gone")
    ld.load = boom
    with pytest.raises(OSError, match="disk gone"):
        list(ld)
    before = threading.active_count()
    for i, _ in enumerate(Loader(ds, 2, prefetch=1)):
        if i == 1:
            break
    assert threading.active_count() == before
    with pytest.raises(ValueError, match="batch"):
        Loader(ds, 0)
    with pytest.raises(TypeError, match="deform"):
        Loader(ds, 2, deform={"crop_pad": 1})
