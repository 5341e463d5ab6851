"""Strict data inputs: size mismatches need resize, NaN/Inf need skip_bad,
every bad file is a ValueError naming it, decompression stays within the
declared size, symlink loops are no classes, unreadable files are named,
and the rank agreement check sees every sample."""
import gzip
import os
import shutil
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.data import Dataset, FileDataset, load_dataset, read_idx
from engine.data import binary
from engine.parallel.runner import _check_ranks_agree, _data_fingerprint

sys.path.insert(0, str(Path(__file__).parent))
from mnist_like import NAMES, write_idx  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _mnist_dir(d, side=28, n=(40, 10), dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    for part, k in zip(("train", "test"), n):
        write_idx(d / NAMES[(part, "images")], rng.integers(0, 256, (k, side, side)).astype(dtype))
        write_idx(d / NAMES[(part, "labels")], np.arange(k) % 10)
    return d


def _idx_header(shape, code=0x08):
    return struct.pack(">BBBB", 0, 0, code, len(shape)) + struct.pack(f">{len(shape)}i", *shape)


# ---- sizes -------------------------------------------------------------------------
def test_a_size_mismatch_is_an_error_unless_resize(tmp_path):
    d = _mnist_dir(tmp_path / "m")
    with pytest.raises(ValueError, match=r"28x28 but the network takes 8x8.*--resize"):
        load_dataset(d, size=8)
    tr, te = load_dataset(d, size=8, resize=True)       # kept as is: the deform scales on the device
    assert tr.shape == (1, 28, 28) and len(te) == 10
    tr, _ = load_dataset(d, size=28)
    assert tr.shape == (1, 28, 28)
    assert load_dataset("digits", size=8)[0].shape == (1, 8, 8)   # the default pair needs no flag
    np.savez(tmp_path / "two.npz", x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.arange(4) % 2,
             x_test=np.zeros((2, 6, 6), np.uint8), y_test=[0, 1])
    with pytest.raises(ValueError, match=r"test images.*6x6 but training images.*8x8"):
        load_dataset(tmp_path / "two.npz")
    assert load_dataset(tmp_path / "two.npz", size=8, resize=True)[1].shape == (1, 6, 6)
    np.savez(tmp_path / "rect.npz", x=np.zeros((4, 8, 6), np.uint8), y=np.arange(4) % 2)
    with pytest.raises(ValueError, match="8x6; only square"):
        load_dataset(tmp_path / "rect.npz", size=8, resize=True)


def _png_tree(root, sides, bad=0):
    for k, cls in enumerate(("a", "b")):
        (root / cls).mkdir(parents=True)
        for i, s in enumerate(sides):
            Image.fromarray(np.full((s, s, 3), 40 + 150 * k, np.uint8)).save(root / cls / f"{i}.png")
    for i in range(bad):
        (root / "a" / f"bad{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    return root


def test_image_tree_sizes_need_resize_eager_and_lazy(tmp_path):
    root = _png_tree(tmp_path / "t", [8, 8, 8, 12])
    with pytest.raises(ValueError, match=r"^image is 12x12 but the network takes 8x8.*--resize.* \(\S*3.png\)$"):
        load_dataset(root, size=8, test_fraction=0.5)
    tr, te = load_dataset(root, size=8, test_fraction=0.5, resize=True)
    assert tr.shape == te.shape == (3, 8, 8) and len(tr) + len(te) == 8
    lazy, _ = load_dataset(root, size=8, test_fraction=0.5, lazy=True)
    with pytest.raises(ValueError, match=r"^image is 12x12.*--resize.* \(\S*3.png\)$"):
        lazy.take(np.arange(len(lazy)))
    lazy, _ = load_dataset(root, size=8, test_fraction=0.5, lazy=True, resize=True)
    assert lazy.take(np.arange(len(lazy)))[0].shape == (len(lazy), 3, 8, 8)


def test_cli_size_mismatch_is_one_line_and_resize_trains(tmp_path):
    d = _mnist_dir(tmp_path / "m", n=(64, 16))
    env = dict(os.environ, SPRINT_DEVICE="cpu")
    cmd = [sys.executable, "-m", "engine.cli", "train", "--data", str(d), "--epochs", "1", "--no-progress",
           "--out", str(tmp_path / "run")]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    err = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and "error:" in err[0] and "28x28 but the network takes 8x8" in err[0], p.stderr
    p = subprocess.run(cmd + ["--resize"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 0 and "epoch   1" in p.stdout, p.stderr
    # eval follows the run's recorded --resize on the run's own data; a bare
    # checkpoint (no config.json beside it) needs the flag again
    ev = [sys.executable, "-m", "engine.cli", "eval", str(tmp_path / "run"), "--data", str(d)]
    p = subprocess.run(ev, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 0 and "(16 images)" in p.stdout, p.stderr
    shutil.copy(tmp_path / "run" / "checkpoint.npz", tmp_path / "bare.npz")
    ev = [sys.executable, "-m", "engine.cli", "eval", str(tmp_path / "bare.npz"), "--data", str(d)]
    p = subprocess.run(ev, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 2 and "--resize" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(ev + ["--resize"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 0 and "(16 images)" in p.stdout, p.stderr


# ---- NaN / Inf -------------------------------------------------------------------
def test_nan_and_inf_are_refused_or_skipped_and_counted(tmp_path, capsys):
    x = np.random.default_rng(0).random((30, 1, 4, 4))
    x[3, 0, 1, 1], x[17, 0, 0, 0] = np.nan, np.inf
    x[20, 0, 2, 2] = 1e300                   # finite in float64, Inf in float32
    np.savez(tmp_path / "bad.npz", x=x, y=np.arange(30) % 2)
    with pytest.raises(ValueError, match=r"^3 of 30 images hold NaN or Inf.*--skip-bad.* \(x in \S*bad.npz\)$"):
        load_dataset(tmp_path / "bad.npz")
    tr, te = load_dataset(tmp_path / "bad.npz", skip_bad=True)
    assert len(tr) + len(te) == 27 and tr.bad_samples == 3
    assert np.isfinite(tr.x).all() and np.isfinite(te.x).all()
    assert "left out 3 of 30 images holding NaN or Inf" in capsys.readouterr().err
    d = _mnist_dir(tmp_path / "f", side=4, dtype=np.uint8)
    xf = np.ones((10, 4, 4), np.float32)
    xf[5, 1, 1] = -np.inf
    (d / NAMES[("test", "images")]).write_bytes(gzip.compress(_idx_header(xf.shape, 0x0D) + xf.astype(">f4").tobytes()))
    with pytest.raises(ValueError, match=r"^1 of 10 images hold NaN or Inf.* \(\S*t10k-images-idx3-ubyte.gz\)$"):
        load_dataset(d)
    assert len(load_dataset(d, skip_bad=True)[1]) == 9


# ---- bad files ---------------------------------------------------------------------
def test_bad_files_are_value_errors_naming_the_file(tmp_path):
    np.savez(tmp_path / "len.npz", x_train=np.zeros((5, 4, 4)), y_train=np.zeros(4, int),
             x_test=np.zeros((2, 4, 4)), y_test=np.zeros(2, int))
    with pytest.raises(ValueError, match=r"^x_train holds 5 images but y_train holds 4 labels \(\S*len.npz\)$"):
        load_dataset(tmp_path / "len.npz")
    np.savez(tmp_path / "len2.npz", x=np.zeros((5, 4, 4)), y=np.zeros(7, int))
    with pytest.raises(ValueError, match=r"^x holds 5 images but y holds 7 labels.* \(\S*len2.npz\)$"):
        load_dataset(tmp_path / "len2.npz")
    np.savez(tmp_path / "ok.npz", x=np.zeros((50, 4, 4)), y=np.arange(50) % 2)
    raw = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "flip.npz").write_bytes(raw[:200] + bytes(b ^ 0xFF for b in raw[200:400]) + raw[400:])
    for name in ("cut.npz", "flip.npz"):
        with pytest.raises(ValueError, match=name):
            load_dataset(tmp_path / name)
    (tmp_path / "dir.npz").mkdir()
    with pytest.raises(ValueError, match=r"^is a directory.* \(\S*dir.npz\)$"):
        load_dataset(tmp_path / "dir.npz", fmt="npz")
    d = _mnist_dir(tmp_path / "m", side=4)
    img = d / NAMES[("train", "images")]
    good = img.read_bytes()
    img.write_bytes(good[:-20])                                    # truncated gzip stream
    with pytest.raises(ValueError,
                       match=r"^cannot read it \(bad or truncated gzip.* \(\S*train-images-idx3-ubyte.gz\)$"):
        load_dataset(d)
    img.write_bytes(good[:10] + bytes(40) + good[50:])            # corrupt deflate data
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.gz"):
        load_dataset(d)
    img.unlink()
    img.mkdir()                                                    # a folder where the file should be
    with pytest.raises(ValueError, match=r"^is a directory.* \(\S*train-images-idx3-ubyte.gz\)$"):
        load_dataset(d, fmt="mnist")
    raw_idx = tmp_path / "r.idx"
    raw_idx.write_bytes(_idx_header((3, 2, 2)) + bytes(12) + b"extra")
    with pytest.raises(ValueError, match=r"^expected 12 data bytes.*trailing data.* \(\S*r.idx\)$"):
        read_idx(raw_idx)
    raw_idx.write_bytes(_idx_header((3, 2, 2))[:6])
    with pytest.raises(ValueError, match=r"^truncated.* \(\S*r.idx\)$"):
        read_idx(raw_idx)
    raw_idx.write_bytes(struct.pack(">BBBBi", 0, 0, 8, 1, -5))
    with pytest.raises(ValueError, match="negative"):
        read_idx(raw_idx)
    (tmp_path / "data_batch_1.bin").mkdir()
    (tmp_path / "test_batch.bin").write_bytes(bytes(3073))
    with pytest.raises(ValueError, match=r"^is a directory.* \(\S*data_batch_1.bin\)$"):
        load_dataset(tmp_path, fmt="cifar")


def test_gzip_decompression_stops_at_the_declared_size(tmp_path):
    # a small file whose header declares 2 GiB: refused before any decompression
    bomb = tmp_path / "bomb-images-idx3-ubyte.gz"
    bomb.write_bytes(gzip.compress(_idx_header((2**31 // 784, 28, 28)) + bytes(1 << 20)))
    assert bomb.stat().st_size < 10_000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"declares 2,147,\d+,\d+ bytes.*cannot hold that much"):
            read_idx(bomb)
        # a plausible header (1 MiB) over a 64 MiB stream: only the declared bytes are read
        bomb.write_bytes(gzip.compress(_idx_header((1 << 20,)) + bytes(64 << 20), compresslevel=1))
        tracemalloc.reset_peak()
        with pytest.raises(ValueError, match="more data than its header declares"):
            read_idx(bomb)
        assert tracemalloc.get_traced_memory()[1] < 8 << 20
    finally:
        tracemalloc.stop()
    with pytest.raises(ValueError, match="more than the 1,000 this reader accepts"):
        read_idx(bomb, max_bytes=1000)


# ---- trees: loops and unreadable files ---------------------------------------------------
def test_symlink_loops_are_not_classes(tmp_path):
    root = _png_tree(tmp_path / "t", [8] * 4)
    (root / "loop").symlink_to(root, target_is_directory=True)
    (root / "a2").symlink_to(root / "a", target_is_directory=True)      # a second name of class a
    (root / "up").symlink_to(tmp_path, target_is_directory=True)         # above the root
    ext = tmp_path / "elsewhere" / "c"
    ext.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(ext / "0.png")
    (root / "c").symlink_to(ext, target_is_directory=True)              # a class stored elsewhere: kept
    (root / "b" / "link.png").symlink_to(root / "b" / "0.png")           # symlinked files are followed
    tr, te = load_dataset(root, size=8, test_fraction=0.5)
    assert tr.classes == ["a", "b", "c"]
    assert len(tr) + len(te) == 4 + 5 + 1
    split = tmp_path / "s"
    for part in ("train", "val"):
        _png_tree(split / part, [8, 8])
    (split / "train" / "self").symlink_to(split / "train", target_is_directory=True)
    (split / "val" / "root").symlink_to(split, target_is_directory=True)
    tr, te = load_dataset(split, size=8)
    assert tr.classes == ["a", "b"] and len(tr) == len(te) == 4


def test_unreadable_files_are_named(tmp_path, capsys):
    root = _png_tree(tmp_path / "t", [8] * 3, bad=7)
    tr, _ = load_dataset(root, size=8, test_fraction=0.5)
    err = capsys.readouterr().err
    assert tr.skipped == 7 and len(tr.skipped_files) == 7
    assert "7 unreadable files skipped: " in err and "(and 2 more; -v names them all)" in err
    assert sum(f"bad{i}.jpg" in err for i in range(7)) == 5
    load_dataset(root, size=8, test_fraction=0.5, verbose=True)
    err = capsys.readouterr().err
    assert sum(f"bad{i}.jpg" in err for i in range(7)) == 7
    lazy, _ = load_dataset(root, size=8, test_fraction=0.5, lazy=True)
    lazy.take(np.arange(len(lazy)))
    lazy.take(np.arange(len(lazy)))                              # each file is named once
    err = capsys.readouterr().err
    assert lazy.skipped == sum(f.name.startswith("bad") for f in map(Path, lazy.files))
    assert err.count("cannot read") == min(lazy.skipped, 5)


def test_cli_v_names_every_unreadable_file(tmp_path):
    root = _png_tree(tmp_path / "t", [8] * 6, bad=7)
    (tmp_path / "net.json").write_text('{"x0": 8, "m0": 3, "convs": [[2, 2]], "fcs": [2]}')
    p = subprocess.run([sys.executable, "-m", "engine.cli", "train", "--model", str(tmp_path / "net.json"),
                        "--data", str(root), "--epochs", "1", "--no-progress", "--out", str(tmp_path / "r"), "-v"],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, SPRINT_DEVICE="cpu"), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "7 unreadable files skipped" in p.stderr and "more" not in p.stderr
    assert all(f"bad{i}.jpg" in p.stderr for i in range(7))


def test_dataset_repr_is_short():
    ds = Dataset(np.zeros((1000, 1, 28, 28), np.uint8), np.arange(1000) % 10, 10, "mnist/train")
    assert repr(ds) == "Dataset('mnist/train', n=1000, shape=(1, 28, 28), uint8, 10 classes)"
    fd = FileDataset(["a.png", "b.png"], [0, 1], 2, 32, 3, "t/train")
    assert repr(fd) == "FileDataset('t/train', n=2, shape=(3, 32, 32), files, 2 classes)"


# ---- rank agreement ---------------------------------------------------------------------
def test_data_fingerprint_sees_every_sample():
    rng = np.random.default_rng(0)
    ds = Dataset(rng.integers(0, 256, (320, 1, 8, 8)).astype(np.uint8), rng.integers(0, 10, 320), 10)
    ref = _data_fingerprint(ds)
    assert _data_fingerprint(Dataset(ds.x.copy(), ds.y.copy(), 10)) == ref
    for i in (1, 7, 163, 319):                     # none a multiple of a sampling stride
        x = ds.x.copy()
        x[i, 0, 3, 5] ^= 1
        assert _data_fingerprint(Dataset(x, ds.y, 10)) != ref
        y = ds.y.copy()
        y[i] = (y[i] + 1) % 10
        assert _data_fingerprint(Dataset(ds.x, y, 10)) != ref
    f1 = FileDataset(["a.png", "b.png"], [0, 1], 2, 8)
    assert _data_fingerprint(f1) != _data_fingerprint(FileDataset(["a.png", "c.png"], [0, 1], 2, 8))


# ---- the mnist preset on IDX files ------------------------------------------------------
def test_mnist_preset_learns_28x28_idx_digits(tmp_path):
    """A short run of the preset on synthetic MNIST-shaped IDX files: each class a
    bright stroke in its own row band and half, in noise, so only a working
    28x28 pipeline learns it."""
    import engine
    rng = np.random.default_rng(0)
    d = tmp_path / "mnist"
    d.mkdir()
    for part, n in (("train", 400), ("test", 100)):
        y = rng.integers(0, 10, n)
        x = rng.integers(0, 60, (n, 28, 28))
        for i, k in enumerate(y):
            r, c = 2 + 5 * (k % 5) + rng.integers(-1, 2), 14 * (k // 5) + rng.integers(0, 3)
            x[i, r:r + 2, c:c + 11] = 255
        write_idx(d / NAMES[(part, "images")], x)
        write_idx(d / NAMES[(part, "labels")], y)
    res = engine.train(model="mnist", data=str(d), epochs=2, batch=16, progress=False, verbose=False,
                       device="cpu", warmup=0.5)
    assert res["n_params"] == 206_922 and res["test_acc"] >= 0.9


def test_disagreeing_rank_data_is_named():
    from engine.parallel.comm import ConfigMismatch, LocalComm
    from engine.spec import get_spec
    from engine.train import TrainConfig
    rng = np.random.default_rng(1)
    train = Dataset(rng.integers(0, 256, (320, 1, 8, 8)).astype(np.uint8), np.arange(320) % 10, 10, "d/train")
    test = Dataset(train.x[:40], train.y[:40], 10, "d/test")
    x = train.x.copy()
    x[201, 0, 0, 0] ^= 255                        # rank 1 holds one other image

    class Rank1Differs(LocalComm):
        def allgather_obj(self, obj):
            if isinstance(obj, dict) and "train" in obj:
                from engine.parallel.runner import _data_summary
                return [obj, {**obj, "train": _data_summary(Dataset(x, train.y, 10, "d/train"))}]
            return [obj, obj]

    _check_ranks_agree(LocalComm(), TrainConfig(), get_spec("digits"), train, test)
    with pytest.raises(ConfigMismatch, match=r"ranks disagree on data: train: rank 0 'd/train: 320 images 1x8x8, "
                                             r"sha256 (\w+)', rank 1 'd/train: 320 images 1x8x8, sha256 (?!\1)\w+'; "
                                             r"refusing to start"):
        _check_ranks_agree(Rank1Differs(), TrainConfig(), get_spec("digits"), train, test)


def test_deform_config_is_strict():
    from engine.data import DeformConfig
    for bad in (dict(crop_pad=1.5), dict(crop_pad=True), dict(scale=(1.0, float("inf"))),
                dict(mean=(float("nan"),)), dict(std=(float("inf"),)), dict(out_hw=(8.5, 8)), dict(out_hw=(8,))):
        with pytest.raises(ValueError):
            DeformConfig(**bad)
    assert DeformConfig(crop_pad=np.int64(2), out_hw=[8, 8]).out_hw == (8, 8)


# ---- byte-flipped files ---------------------------------------------------------------------
def test_byte_flipped_files_load_or_fail_with_a_named_value_error(tmp_path):
    """Every corruption either still loads or is one ValueError naming the file:
    no IndexError, no MemoryError, no zlib/zipfile/EOF traceback."""
    rng = np.random.default_rng(0)
    srcs = {}
    m = _mnist_dir(tmp_path / "m", side=6, n=(20, 10))
    srcs["mnist-gz"] = (m, m / NAMES[("train", "images")])
    r = tmp_path / "raw"
    r.mkdir()
    for (part, kind), name in NAMES.items():
        (r / name[:-3]).write_bytes(gzip.decompress((m / name).read_bytes()))
    srcs["mnist-raw"] = (r, r / NAMES[("train", "labels")][:-3])
    np.savez(tmp_path / "a.npz", x=rng.random((20, 6, 6)).astype(np.float32), y=np.arange(20) % 3)
    srcs["npz"] = (tmp_path / "a.npz", tmp_path / "a.npz")
    c = tmp_path / "c"
    c.mkdir()
    for name, n in (("data_batch_1.bin", 3), ("test_batch.bin", 2)):
        rec = rng.integers(0, 256, (n, binary.CIFAR_RECORD)).astype(np.uint8)
        rec[:, 0] %= 10
        rec.tofile(c / name)
    srcs["cifar"] = (c, c / "data_batch_1.bin")
    outcomes = {}
    for kind, (src, victim) in srcs.items():
        good = victim.read_bytes()
        for trial in range(40):
            bad = bytearray(good)
            for pos in rng.integers(0, len(bad), rng.integers(1, 4)):
                bad[pos] ^= 1 << int(rng.integers(0, 8))
            cut = len(bad) if trial % 4 else int(rng.integers(0, len(bad)))
            victim.write_bytes(bytes(bad[:cut]))
            try:
                load_dataset(src)
                outcomes[kind, "loaded"] = outcomes.get((kind, "loaded"), 0) + 1
            except ValueError as e:
                assert victim.name in str(e) or str(victim.parent) in str(e), (kind, str(e))
                outcomes[kind, "refused"] = outcomes.get((kind, "refused"), 0) + 1
        victim.write_bytes(good)
    assert all(outcomes.get((k, "refused"), 0) > 0 for k in srcs), outcomes


def test_os_errors_are_value_errors_naming_the_file(tmp_path, monkeypatch):
    from engine.data import readers
    np.savez(tmp_path / "a.npz", x=np.zeros((4, 4, 4), np.float32), y=np.arange(4) % 2)

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(readers, "load_npz", denied)
    with pytest.raises(ValueError, match=r"^cannot read it \(Permission denied\) \(\S*a.npz\)$"):
        load_dataset(tmp_path / "a.npz")
    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(ValueError, match=r"cannot read it \(Permission denied\)"):
        load_dataset(tmp_path)


def test_npz_member_declaring_more_than_it_holds_is_refused_before_allocation(tmp_path):
    import zipfile
    hdr = {"descr": "<f4", "fortran_order": False, "shape": (1 << 22, 1024, 1024)}   # 16 PiB
    body = b"\x93NUMPY\x01\x00"
    h = repr(hdr).encode()
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    body += len(h).to_bytes(2, "little") + h + bytes(4096)
    with zipfile.ZipFile(tmp_path / "big.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", body)
        zf.writestr("y.npy", body)
    with pytest.raises(ValueError, match=r"^not a readable .npz archive .*x.npy declares shape "
                                         r"\(4194304, 1024, 1024\).* \(\S*big.npz\)$"):
        load_dataset(tmp_path / "big.npz")


def test_a_class_folder_without_images_is_warned_of(tmp_path, capsys):
    """An empty class folder (a typo, images one level deeper) still counted as
    a class: the net got an output no training image teaches, in silence."""
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(4):
            Image.fromarray(np.full((8, 8), 40 * i + (c == "b"), np.uint8)).save(tmp_path / c / f"{i}.png")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "nested").mkdir()
    train, test = load_dataset(str(tmp_path), "tree")
    assert train.n_classes == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"sprint: warning: 1 class folder without an image file: c; the network still gets an output "
                   f"for each, which no training image teaches ({tmp_path})"], err
    (tmp_path / "c" / "nested").rmdir()
    shutil.copy(tmp_path / "a" / "0.png", tmp_path / "c" / "0.png")
    load_dataset(str(tmp_path), "tree")
    assert capsys.readouterr().err == ""


def test_mnist_given_a_file_names_it_and_the_folder_searched(tmp_path):
    """`--data ok.npz --format mnist` said 'MNIST IDX files missing: [...] (.)'."""
    from engine.errors import RunError
    f = tmp_path / "ok.npz"
    np.savez(f, x=np.zeros((2, 1, 8, 8), np.float32), y=np.zeros(2, np.int64))
    with pytest.raises(RunError) as e:
        load_dataset(str(f), "mnist")
    assert str(e.value) == (f"MNIST IDX files missing: ['train-images', 'train-labels', 'test-images', "
                            f"'test-labels'] in {tmp_path}, the folder of the file given ({f})"), str(e.value)
    with pytest.raises(RunError) as e:
        load_dataset(str(tmp_path), "mnist")
    assert str(e.value).endswith(f"'test-labels'] ({tmp_path})"), str(e.value)
