"""im2col / col2im throughput over layer shapes, as GB/s against a memcpy of
the same number of bytes measured in the same run (interleaved).

GB/s counts the bytes each kernel must move: im2col reads x and writes cols,
col2im reads cols and writes x; memcpy reads and writes a cols-sized buffer.

    pytest bench/test_bench_im2col.py --benchmark-only -s
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import interleaved, machine_info, save_json

from engine import backend, ops

# (name, N, C, H, W, k, stride, pad): the cifar reference net at batch 32 + other windows
SHAPES = [
    ("cifar-conv1", 32, 3, 32, 32, 3, 1, 1),
    ("cifar-conv2", 32, 64, 32, 32, 3, 1, 1),
    ("cifar-conv3", 32, 64, 16, 16, 3, 1, 1),
    ("cifar-conv4", 32, 128, 16, 16, 3, 1, 1),
    ("cifar-conv5", 32, 128, 8, 8, 3, 1, 1),
    ("cifar-conv6", 32, 256, 8, 8, 3, 1, 1),
    ("5x5-s1", 32, 32, 24, 24, 5, 1, 2),
    ("11x11-s4", 8, 3, 99, 99, 11, 4, 2),
]
_records: list[dict] = []


def _sweep_one(xp, name, N, C, H, W, k, s, p, sync=None):
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal((N, C, H, W), dtype=np.float32))
    cols = ops.im2col(x, k, k, s, p)
    dx = xp.empty_like(x)
    src = xp.asarray(rng.standard_normal(cols.size, dtype=np.float32))
    dst = xp.empty_like(src)
    t = interleaved({
        "im2col": lambda: ops.im2col(x, k, k, s, p, out=cols),
        "col2im": lambda: ops.col2im(cols, x.shape, k, k, s, p, out=dx),
        "memcpy": lambda: xp.copyto(dst, src),
    }, reps=9, sync=sync)
    moved = (cols.nbytes + x.nbytes) / 1e9
    rec = {"name": name, "N": N, "C": C, "H": H, "W": W, "k": k, "stride": s, "pad": p,
           "im2col_s": t["im2col"], "col2im_s": t["col2im"], "memcpy_s": t["memcpy"],
           "im2col_gbps": moved / t["im2col"], "col2im_gbps": moved / t["col2im"],
           "memcpy_gbps": 2 * cols.nbytes / 1e9 / t["memcpy"]}
    rec["im2col_vs_memcpy"] = rec["im2col_gbps"] / rec["memcpy_gbps"]
    rec["col2im_vs_memcpy"] = rec["col2im_gbps"] / rec["memcpy_gbps"]
    return rec


@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_im2col_bandwidth(benchmark, shape, summary):
    backend.set_backend("cpu")
    name, N, C, H, W, k, s, p = shape
    rec = _sweep_one(np, *shape)
    x = np.random.default_rng(1).standard_normal((N, C, H, W), dtype=np.float32)
    cols = ops.im2col(x, k, k, s, p)
    benchmark.extra_info.update(rec)
    benchmark(ops.im2col, x, k, k, s, p, out=cols)
    _records.append(rec)
    summary(f"im2col {name:12s} {rec['im2col_gbps']:6.1f} GB/s = {rec['im2col_vs_memcpy']:.2f} x memcpy "
            f"({rec['memcpy_gbps']:.1f} GB/s); col2im {rec['col2im_gbps']:6.1f} GB/s = "
            f"{rec['col2im_vs_memcpy']:.2f} x memcpy")
    save_json("im2col_sweep.json", {"machine": machine_info(), "backend": "cpu", "records": _records})


@pytest.mark.gpu
def test_im2col_bandwidth_gpu(benchmark, summary):
    import cupy
    be = backend.set_backend("gpu")
    sync = cupy.cuda.get_current_stream().synchronize
    recs = []
    try:
        for shape in SHAPES:
            rec = _sweep_one(cupy, *shape, sync=sync)
            recs.append(rec)
            summary(f"GPU({be.kernels}) im2col {shape[0]:12s} {rec['im2col_gbps']:7.1f} GB/s = "
                    f"{rec['im2col_vs_memcpy']:.2f} x memcpy; col2im {rec['col2im_vs_memcpy']:.2f} x memcpy")
        x = cupy.ones((32, 64, 32, 32), cupy.float32)
        benchmark(lambda: (ops.im2col(x, 3, 3, 1, 1), sync()))
        save_json("im2col_sweep_gpu.json", {"machine": machine_info(), "backend": f"gpu-{be.kernels}",
                                            "records": recs})
    finally:
        backend.set_backend("cpu")
