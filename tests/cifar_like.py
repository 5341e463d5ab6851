"""CIFAR-10-format batches without a download: the embedded 8x8 digits
scaled to 32x32, on a background whose colour depends on the class, with
per-pixel noise, written as the binary records CIFAR-10 ships (one label
byte, then 1024 red, 1024 green, 1024 blue bytes). A learnable data set in
the cifar reader's format, not a claim about real CIFAR-10.

    python tests/cifar_like.py DIR      # then: sprint train --data DIR --model SPEC (x0 32, m0 3)
"""
import sys
from pathlib import Path

import numpy as np

# a CIFAR-shaped net small enough for tests: 32x32x3 in, 10 classes
SMALL_SPEC = {"name": "cifar-small", "x0": 32, "m0": 3, "c": 3, "convs": [[8, 2], [16, 2]], "fcs": [32, 10]}


def digits_as_cifar(out_dir, n_train=None, seed=0):
    """Write data_batch_1.bin and test_batch.bin into ``out_dir``;
    returns (n_train, n_test)."""
    from PIL import Image
    from engine.data import load_dataset
    from engine.checkpoint import atomic_write
    from engine.data.readers import CIFAR_RECORD
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tint = rng.uniform(0.1, 0.5, (10, 3))          # the background colour of each class
    train, test = load_dataset("digits")
    n = {}
    for name, ds in (("data_batch_1.bin", train), ("test_batch.bin", test)):
        x, y = ds.x, ds.y
        if name.startswith("data") and n_train:
            x, y = x[:n_train], y[:n_train]
        rec = np.zeros((len(y), CIFAR_RECORD), np.uint8)
        rec[:, 0] = y
        for i, img in enumerate(x[:, 0]):
            big = np.asarray(Image.fromarray((img * 255).astype(np.uint8)).resize((32, 32), Image.BILINEAR))
            rgb = tint[y[i]][:, None, None] * 255 + big[None] * 0.6 + rng.normal(0, 12, (3, 32, 32))
            rec[i, 1:] = np.clip(rgb, 0, 255).astype(np.uint8).ravel()
        atomic_write(out_dir / name, rec.tobytes())
        n[name] = len(y)
    return n["data_batch_1.bin"], n["test_batch.bin"]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/cifar_like.py DIR")
    n_train, n_test = digits_as_cifar(sys.argv[1])
    print(f"wrote {n_train:,} train / {n_test:,} test images in {sys.argv[1]} "
          f"(train on them: sprint train --model cifar --data {sys.argv[1]} --format cifar)")
