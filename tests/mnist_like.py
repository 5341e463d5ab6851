"""MNIST-like IDX files without a download: the embedded 8x8 digits scaled to
a 20x20 box centred in 28x28 (MNIST's own framing), written as the four
gzipped IDX files MNIST ships.  A realistic check of the mnist preset's
geometry and learning, not a claim about real MNIST.

    python tests/mnist_like.py DIR      # then: sprint train --model mnist --data DIR
"""
import gzip
import struct
import sys
from pathlib import Path

import numpy as np

NAMES = {("train", "images"): "train-images-idx3-ubyte.gz", ("train", "labels"): "train-labels-idx1-ubyte.gz",
         ("test", "images"): "t10k-images-idx3-ubyte.gz", ("test", "labels"): "t10k-labels-idx1-ubyte.gz"}


def write_idx(path, arr):
    """``arr`` (uint8) as an IDX file, gzipped when the name ends in .gz."""
    arr = np.ascontiguousarray(arr, np.uint8)
    data = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape) + arr.tobytes()
    from engine.checkpoint import atomic_write      # a killed run leaves no half file for the reader
    atomic_write(path, gzip.compress(data) if str(path).endswith(".gz") else data)


def digits_as_mnist(out_dir):
    """Write the four IDX files into ``out_dir``; returns (n_train, n_test)."""
    from PIL import Image
    from engine.data import load_dataset
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sets = dict(zip(("train", "test"), load_dataset("digits")))
    for part, ds in sets.items():
        x = np.zeros((len(ds), 28, 28), np.uint8)
        for i, img in enumerate(ds.x[:, 0]):
            big = Image.fromarray((img * 255).astype(np.uint8)).resize((20, 20), Image.BILINEAR)
            x[i, 4:24, 4:24] = np.asarray(big)
        write_idx(out_dir / NAMES[(part, "images")], x)
        write_idx(out_dir / NAMES[(part, "labels")], ds.y)
    return len(sets["train"]), len(sets["test"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/mnist_like.py DIR")
    n_train, n_test = digits_as_mnist(sys.argv[1])
    print(f"wrote {n_train:,} train / {n_test:,} test images in {sys.argv[1]} "
          f"(train on them: sprint train --model mnist --data {sys.argv[1]} --format mnist)")
