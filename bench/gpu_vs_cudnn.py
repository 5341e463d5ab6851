"""The engine's GPU convolutions and training step against PyTorch + cuDNN on
the same GPU (for bench/gpu_check.sh):

    python bench/gpu_vs_cudnn.py [--out bench/results/gpu_vs_cudnn.json] [--reps 30]

Per layer of the cifar net (batch 32, forward + backward as in training, no
dx for the first layer) and for the whole cifar training step (batch 32 and
128): the engine with each kernel path it has (the compiled module and CuPy
RawModule; cuBLAS for the GEMMs) and PyTorch in a process of its own, with
cuDNN in float32 (TF32 off, as the engine computes) and with its default TF32
for convolutions, `cudnn.benchmark` on. Every time is the median of --reps
runs after warm-up, each run bracketed by a device synchronisation on both
sides, so both frameworks are timed the same way. Ratios are cuDNN's time over
the engine's (> 1: the engine is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from test_bench_conv import BATCH, LAYERS, layer_case, torch_case  # noqa: E402
from test_bench_train import BATCHES, _times, engine_step_fn, torch_step_fn  # noqa: E402


def median_time(fn, sync, reps):
    """(median seconds, (max - min) / median) of fn with the device
    synchronised after each call; the warm-up covers cuDNN's algorithm
    search, NVRTC compiles and workspaces."""
    ts = _times(lambda: (fn(), sync()), reps, warmup=min(5, reps))
    return statistics.median(ts), (max(ts) - min(ts)) / statistics.median(ts)


def engine_times(kernels, reps):
    """{case: (median s, spread)} of the engine on the GPU with SPRINT_KERNELS=kernels."""
    import cupy

    from engine import backend
    os.environ["SPRINT_KERNELS"] = kernels
    be = backend.set_backend("gpu")
    if be.kernels != kernels:
        raise RuntimeError(f"asked for {kernels} kernels, got {be.kernels}")
    sync = cupy.cuda.Device().synchronize
    out = {}
    for name, C, M, S in LAYERS:
        conv, _, _, _ = layer_case(C, M, S, name == "conv1", xp=cupy)
        out[name] = median_time(conv, sync, reps)
    for n in BATCHES:
        out[f"step{n}"] = median_time(engine_step_fn(n), sync, reps)
    backend.set_backend("cpu")
    return out


def torch_times(reps, device="cuda"):
    """The same cases in PyTorch on CUDA (run in a process of its own)."""
    import torch
    torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for tf32 in (False, True):
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        tag = "tf32" if tf32 else "fp32"
        for name, C, M, S in LAYERS:
            first = name == "conv1"
            run = torch_case(torch, layer_case(C, M, S, first)[3], first, device)
            out[f"{name}/{tag}"] = median_time(run, sync, reps)
        for n in BATCHES:
            out[f"step{n}/{tag}"] = median_time(torch_step_fn(n, device), sync, reps)
    out["torch"] = (torch.__version__, torch.backends.cudnn.version(),
                    torch.cuda.get_device_name() if device == "cuda" else device)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_vs_cudnn.json"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-device", default="cuda", help=argparse.SUPPRESS)  # cpu: a dry run without a GPU
    a = ap.parse_args()
    if a.torch_worker:
        print(json.dumps(torch_times(a.reps, a.torch_device)))
        return 0
    p = subprocess.run([sys.executable, __file__, "--torch-worker", "--reps", str(a.reps),
                        "--torch-device", a.torch_device], capture_output=True,
                       text=True)
    if p.returncode != 0:
        print(p.stderr[-3000:], file=sys.stderr)
        raise SystemExit("gpu_vs_cudnn: the PyTorch worker failed")
    tor = json.loads(p.stdout.strip().splitlines()[-1])
    eng = {}
    for kernels in ("compiled", "rawmodule"):
        try:
            eng[kernels] = engine_times(kernels, a.reps)
        except Exception as e:  # the compiled module may be missing: say so and go on
            print(f"gpu_vs_cudnn: {kernels} kernels: {type(e).__name__}: {e}", file=sys.stderr)
    cases = [n for n, *_ in LAYERS] + [f"step{n}" for n in BATCHES]
    rows = []
    for c in cases:
        row = {"case": c, "batch": BATCH if c.startswith("conv") else int(c[4:]),
               "cudnn_fp32_s": tor[f"{c}/fp32"][0], "cudnn_tf32_s": tor[f"{c}/tf32"][0],
               "cudnn_fp32_spread": tor[f"{c}/fp32"][1]}
        for k, t in eng.items():
            row[f"{k}_s"], row[f"{k}_spread"] = t[c]
            row[f"{k}_vs_cudnn_fp32"] = tor[f"{c}/fp32"][0] / t[c][0]
            row[f"{k}_vs_cudnn_tf32"] = tor[f"{c}/tf32"][0] / t[c][0]
        rows.append(row)
    doc = {"device": tor["torch"][2], "torch": tor["torch"][0], "cudnn": tor["torch"][1], "reps": a.reps, "rows": rows}
    from engine.checkpoint import write_json
    write_json(a.out, doc, indent=1)
    print(f"{doc['device']}, torch {doc['torch']}, cuDNN {doc['cudnn']}; ms (median of {a.reps}); "
          "ratio = cuDNN time / engine time")
    hdr = f"{'case':<8}{'cuDNN fp32':>11}{'cuDNN tf32':>11}"
    for k in eng:
        hdr += f"{k:>12}{'x fp32':>8}{'x tf32':>8}"
    print(hdr)
    for r in rows:
        line = f"{r['case']:<8}{1e3 * r['cudnn_fp32_s']:>11.3f}{1e3 * r['cudnn_tf32_s']:>11.3f}"
        for k in eng:
            line += f"{1e3 * r[k + '_s']:>12.3f}{r[k + '_vs_cudnn_fp32']:>8.2f}{r[k + '_vs_cudnn_tf32']:>8.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
