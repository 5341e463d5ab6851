"""conv2d forward + backward on the layers of the cifar reference net
(input 3x32x32; 3x3 pad-1 convs 64, 64, 128, 128, 256, 256; 2x2 pooling after
the 2nd, 4th and 6th), batch 32, against, in the same run (interleaved):

- the SGEMM rate: the same three GEMMs per layer (forward, dW, dX; no dX for
  the first layer, as in training) on preallocated operands -- the bound an
  im2col convolution can reach;
- PyTorch CPU (torch.nn.functional.conv2d + autograd, same thread count), if
  installed, timed in a fresh process of its own (see conftest.py).

Writes bench/results/conv_cifar.json.

    pytest bench/test_bench_conv.py --benchmark-only -s
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import adaptive_median, in_fresh_process, interleaved, machine_info, save_json, torch_available

from engine import backend, ops

BATCH = 32
# (name, C_in, M, side)
LAYERS = [("conv1", 3, 64, 32), ("conv2", 64, 64, 32), ("conv3", 64, 128, 16),
          ("conv4", 128, 128, 16), ("conv5", 128, 256, 8), ("conv6", 256, 256, 8)]
REPS = 7
_records: list[dict] = []


_torch_times: dict = {}


def torch_layer_times(threads: int) -> dict:
    """Median seconds of PyTorch's conv fwd+bwd per layer; run in a process
    of its own (conftest.py says why)."""
    import torch
    torch.set_num_threads(threads)
    out = {}
    for name, C, M, S in LAYERS:
        first = name == "conv1"
        out[name] = adaptive_median(torch_case(torch, layer_case(C, M, S, first)[3], first), min_reps=REPS)
    return out


def _torch_time(name: str, threads: int):
    if not torch_available():
        return None
    if threads not in _torch_times:
        _torch_times[threads] = in_fresh_process("torch", "test_bench_conv", "torch_layer_times", threads,
                                                 threads=threads)
    return _torch_times[threads][name]


def layer_case(C, M, S, first, xp=np):
    rng = np.random.default_rng(0)
    x = xp.asarray(rng.standard_normal((BATCH, C, S, S), dtype=np.float32))
    w = xp.asarray(rng.standard_normal((M, C, 3, 3), dtype=np.float32) * 0.05)
    b = xp.asarray(np.zeros(M, np.float32))
    dy = xp.asarray(rng.standard_normal((BATCH, M, S, S), dtype=np.float32))
    y = xp.empty_like(dy)
    dx, dw, db = xp.empty_like(x), xp.empty_like(w), xp.empty_like(b)

    def conv():
        ops.conv2d_forward(x, w, b, pad=1, out=y)
        ops.conv2d_backward(x, w, dy, pad=1, dw_out=dw, db_out=db, need_dx=not first,
                            dx_out=None if first else dx)

    K, NP = C * 9, BATCH * S * S
    A = xp.asarray(rng.standard_normal((M, K), dtype=np.float32))
    cols = xp.asarray(rng.standard_normal((K, NP), dtype=np.float32))
    dyt = xp.asarray(rng.standard_normal((M, NP), dtype=np.float32))
    yt, gw, dcols = xp.empty((M, NP), np.float32), xp.empty((M, K), np.float32), xp.empty((K, NP), np.float32)

    def sgemm():
        ops.gemm(A, cols, out=yt)
        ops.gemm(dyt, cols, trans_b=True, out=gw)
        if not first:
            ops.gemm(A, dyt, trans_a=True, out=dcols)

    flops = 2.0 * M * K * NP * (2 if first else 3)
    return conv, sgemm, flops, (x, w, b, dy)


def torch_case(torch, arrays, first, device="cpu"):
    x, w, b, dy = (torch.from_numpy(np.asarray(a)).to(device) for a in arrays)
    x.requires_grad_(not first)
    w.requires_grad_(True)
    b.requires_grad_(True)

    def run():
        y = torch.nn.functional.conv2d(x, w, b, padding=1)
        y.backward(dy)
        x.grad = w.grad = b.grad = None

    return run


@pytest.mark.parametrize("layer", LAYERS, ids=[l[0] for l in LAYERS])
def test_conv_fwd_bwd_cifar_layer(benchmark, layer, summary):
    be = backend.set_backend("cpu")
    name, C, M, S = layer
    first = name == "conv1"
    conv, sgemm, flops, arrays = layer_case(C, M, S, first)
    threads = be.ext.get_num_threads()
    t = interleaved({"conv": conv, "sgemm": sgemm}, reps=REPS)
    t_torch = _torch_time(name, threads)
    if t_torch is not None:
        t["torch"] = t_torch
    rec = {"layer": name, "C": C, "M": M, "side": S, "batch": BATCH, "threads": threads, "flops": flops,
           **{f"{k}_s": v for k, v in t.items()}, **{f"{k}_gflops": flops / v / 1e9 for k, v in t.items()}}
    rec["conv_vs_sgemm"] = t["sgemm"] / t["conv"]
    line = (f"{name} C{C:<3d} M{M:<3d} {S}x{S}: conv {rec['conv_gflops']:6.1f} GFLOP/s = "
            f"{rec['conv_vs_sgemm']:.2f} x SGEMM ({rec['sgemm_gflops']:.1f})")
    if "torch" in t:
        rec["speedup_vs_torch"] = t["torch"] / t["conv"]
        line += f"; torch {rec['torch_gflops']:6.1f} GFLOP/s -> engine {rec['speedup_vs_torch']:.2f} x torch"
    benchmark.extra_info.update(rec)
    benchmark.pedantic(conv, rounds=3, iterations=1)
    _records.append(rec)
    summary(line)
    if len(_records) == len(LAYERS):
        tot = {k: sum(r[f"{k}_s"] for r in _records) for k in ("conv", "sgemm", "torch") if f"{k}_s" in rec}
        fl = sum(r["flops"] for r in _records)
        total = {"conv_gflops": fl / tot["conv"] / 1e9, "sgemm_gflops": fl / tot["sgemm"] / 1e9,
                 "conv_vs_sgemm": tot["sgemm"] / tot["conv"]}
        msg = (f"ALL LAYERS: conv {total['conv_gflops']:.1f} GFLOP/s = {total['conv_vs_sgemm']:.2f} x SGEMM "
               f"({total['sgemm_gflops']:.1f})")
        if "torch" in tot:
            total["torch_gflops"] = fl / tot["torch"] / 1e9
            total["speedup_vs_torch"] = tot["torch"] / tot["conv"]
            msg += f"; torch {total['torch_gflops']:.1f} GFLOP/s -> engine {total['speedup_vs_torch']:.2f} x torch"
        summary(msg)
        save_json("conv_cifar.json", {"machine": machine_info(), "backend": "cpu", "layers": _records,
                                      "total": total})


@pytest.mark.gpu
def test_conv_fwd_bwd_cifar_gpu(benchmark, summary):
    import cupy
    be = backend.set_backend("gpu")
    sync = cupy.cuda.get_current_stream().synchronize
    try:
        recs, t_conv, t_gemm, fl = [], 0.0, 0.0, 0.0
        for name, C, M, S in LAYERS:
            conv, sgemm, flops, _ = layer_case(C, M, S, name == "conv1", xp=cupy)
            t = interleaved({"conv": conv, "sgemm": sgemm}, reps=REPS, sync=sync)
            recs.append({"layer": name, "flops": flops, "conv_s": t["conv"], "sgemm_s": t["sgemm"]})
            t_conv, t_gemm, fl = t_conv + t["conv"], t_gemm + t["sgemm"], fl + flops
        summary(f"GPU({be.kernels}) ALL LAYERS: conv {fl / t_conv / 1e9:.0f} GFLOP/s = {t_gemm / t_conv:.2f} x "
                f"SGEMM ({fl / t_gemm / 1e9:.0f})")
        conv, _, _, _ = layer_case(64, 64, 32, False, xp=cupy)
        benchmark(lambda: (conv(), sync()))
        save_json("conv_cifar_gpu.json", {"machine": machine_info(), "backend": f"gpu-{be.kernels}",
                                          "layers": recs})
    finally:
        backend.set_backend("cpu")
