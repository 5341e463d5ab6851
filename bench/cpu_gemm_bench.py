"""The engine's own SGEMM and implicit-GEMM convolution on this CPU (issue 14):

  peak    measured fp32 FMA peak per ISA (12 independent FMA chains per
          thread), on all threads and on one
  gemm    SGEMM GFLOP/s on the conv GEMM shapes of `cifar` (batch 32) and
          `cnn-a` (batch 1), on all threads and on one, and the implicit
          convolution's three passes on the same layers, as a share of the
          measured peak
  layers  each cifar conv layer forward + backward: the engine's algorithms
          of --algos (default: `default`, what runs with no --conv-algo and no
          $SPRINT_CONV_ALGO, and implicit; also winograd, and im2col: explicit
          im2col + OpenBLAS, the default before issue 14), PyTorch (own
          processes, alternated)
  step    cifar training step at batch 32 and 128: the same, the engine's
          share of the step outside the micro-kernel loops, and peak memory
          (per algorithm)

Every engine/PyTorch ratio is between runs alternated in the same invocation;
times are medians of repeats, with the spread (min..max of the per-process
medians) printed. Results go to --out (bench/results/cpu_gemm*.json).

    python bench/cpu_gemm_bench.py [--parts peak,gemm,layers,step] [--procs 3] [--algos implicit,winograd]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from engine.checkpoint import write_json  # noqa: E402
from engine.parallel.threads import usable_cores  # noqa: E402

THREADS = int(os.environ.get("SPRINT_BENCH_THREADS", usable_cores()))
CIFAR_LAYERS = [("conv1", 3, 64, 32), ("conv2", 64, 64, 32), ("conv3", 64, 128, 16),
                ("conv4", 128, 128, 16), ("conv5", 128, 256, 8), ("conv6", 256, 256, 8)]


def _timeit(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def _cpu_rate(fn, flops, reps, warmup=1):
    """GFLOP/s by wall clock (median, best) and per CPU-second of the
    process's threads (process_time / THREADS): on a shared machine the
    latter is what the code reaches while it holds the cores."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append((time.process_time() - c) / THREADS)
    return {"gflops_median": flops / statistics.median(wall) / 1e9, "gflops_best": flops / min(wall) / 1e9,
            "gflops_cpu": flops / statistics.median(cpu) / 1e9}


def _fresh(framework, fn, *args):
    from conftest import in_fresh_process
    return in_fresh_process(framework, "cpu_gemm_bench", fn, *args, threads=THREADS)


def _stats(ts):
    return {"median": statistics.median(ts), "best": min(ts), "worst": max(ts), "n": len(ts)}


# ---- peak -------------------------------------------------------------------------
def peak(reps=20, iters=1 << 22):  # ~20 ms a call: shorter ones time the waking of the second thread
    from engine import backend
    ext = backend.set_backend("cpu").ext
    out = {}
    for isa in ("avx512", "avx2"):
        if isa not in ext.gemm_info("")["supported"]:
            continue
        for th, key in ((THREADS, isa), (1, isa + "_1t")):
            fl = ext.fma_peak(iters, th, isa)
            out[key] = _cpu_rate(lambda: ext.fma_peak(iters, th, isa), fl, reps)
    return out


# ---- GEMM shapes ------------------------------------------------------------------
def gemm_shapes():
    from engine.spec import get_spec, layers
    shapes = []
    for net, n in (("cifar", 32), ("cnn-a", 1)):
        for g in layers(get_spec(net), n):
            if g.kind == "conv":
                for p in ("fwd", "dw", "dx"):
                    if p == "dx" and g.index == 0:
                        continue
                    shapes.append((net, g.name, p, getattr(g, f"gemm_{p}")))
    return shapes


def gemm_rates(reps=5):
    from engine import backend
    ext = backend.set_backend("cpu").ext
    rng = np.random.default_rng(0)
    recs = []
    for net, name, p, (m, n, k) in gemm_shapes():
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        rec = {"net": net, "layer": name, "pass": p, "m": m, "n": n, "k": k,
               **_cpu_rate(lambda: ext.sgemm(a, b, c, False, False, 1.0, 0.0, ""), 2 * m * n * k, reps)}
        ext.set_num_threads(1)
        rec["gflops_best_1t"] = _cpu_rate(lambda: ext.sgemm(a, b, c, False, False, 1.0, 0.0, ""), 2 * m * n * k,
                                          reps)["gflops_best"]
        ext.set_num_threads(THREADS)
        recs.append(rec)
    # the implicit convolution's own passes (no column matrix) on the conv layers
    # of cifar (batch 32) and cnn-a (batch 1; all 3 x 3, stride 1, same padding)
    for net, n, name, C, M, S in _conv_layers():
        x = rng.standard_normal((n, C, S, S), dtype=np.float32)
        w = rng.standard_normal((M, C, 3, 3), dtype=np.float32)
        dy = rng.standard_normal((n, M, S, S), dtype=np.float32)
        y, dw, dx = np.empty_like(dy), np.empty_like(w), np.empty_like(x)
        fl = 2 * M * C * 9 * n * S * S
        for p, fn in (("implicit fwd", lambda: ext.conv2d_implicit_forward(x, w, None, y, 1, 1, 1, 1, True)),
                      ("implicit dw", lambda: ext.conv2d_implicit_backward(x, w, dy, dw, None, 1, 1, 1, 1)),
                      ("implicit dw+dx", lambda: ext.conv2d_implicit_backward(x, w, dy, dw, dx, 1, 1, 1, 1))):
            f = fl * (2 if p.endswith("dx") else 1)
            recs.append({"net": net, "layer": name, "pass": p, "m": M, "n": n * S * S, "k": C * 9,
                         **_cpu_rate(fn, f, reps)})
    return recs


def _conv_layers():
    """(net, batch, layer, C, M, S) of the 3 x 3 same-padded convolutions the implicit passes are timed on."""
    from engine.spec import get_spec, layers
    out = []
    for net, n in (("cifar", 32), ("cnn-a", 1)):
        for g in layers(get_spec(net), n):
            if g.kind == "conv":
                (C, S, _), M = g.in_shape, g.w_shape[0]
                assert g.w_shape[2:] == (3, 3) and g.extra["conv_out"][1:] == (S, S), g
                out.append((net, n, g.name, C, M, S))
    return out


# ---- conv layers ------------------------------------------------------------------
def layer_times(framework, algo, reps):
    """Median seconds of fwd+bwd per cifar conv layer (batch 32) in this process."""
    sys.path.insert(0, str(BENCH))
    from test_bench_conv import layer_case, torch_case
    out = {}
    if framework == "torch":
        import torch
        torch.set_num_threads(THREADS)
    else:
        _engine_variant(algo)
    for name, C, M, S in CIFAR_LAYERS:
        first = name == "conv1"
        fn, _, flops, arrays = layer_case(C, M, S, first)
        if framework == "torch":
            import torch
            fn = torch_case(torch, arrays, first)
        out[name] = {"s": statistics.median(_timeit(fn, reps, warmup=2)), "flops": flops}
    return out


ALGOS = ("default", "winograd", "implicit", "im2col")


def _engine_variant(algo):
    """default: the engine as a user gets it (no --conv-algo, no
    $SPRINT_CONV_ALGO); implicit: the implicit conv everywhere (engine
    SGEMM); im2col: explicit im2col with OpenBLAS, the CPU path before issue
    14; winograd: F(4x4,3x3) for the 3x3 stride-1 layers it serves (engine
    SGEMM), implicit for the rest."""
    from engine import backend
    from engine.ops import conv
    if algo == "im2col":
        os.environ["SPRINT_GEMM"] = "blas"
    backend.set_backend("cpu")
    if algo == "default":
        os.environ.pop("SPRINT_CONV_ALGO", None)
    conv.set_conv_algo(None if algo == "default" else algo)
    return backend.get_backend().ext


def layers_bench(procs, reps, algos=("default", "implicit")):
    runs = {**{a: [] for a in algos}, "torch": []}
    for _ in range(procs):
        for a in algos:
            runs[a].append(_fresh("engine", "layer_times", "engine", a, reps))
        if _torch():
            runs["torch"].append(_fresh("torch", "layer_times", "torch", None, reps))
    res = {}
    for name, *_ in CIFAR_LAYERS + [("all",)]:
        row = {}
        for k, rs in runs.items():
            if not rs:
                continue
            per = [sum(r[l]["s"] for l in r) if name == "all" else r[name]["s"] for r in rs]
            fl = sum(v["flops"] for v in rs[0].values()) if name == "all" else rs[0][name]["flops"]
            row[k] = {**_stats(per), "gflops": fl / statistics.median(per) / 1e9}
        if "torch" in row:
            for k in algos:
                row[f"{k}_vs_torch"] = row["torch"]["median"] / row[k]["median"]
        res[name] = row
    return res


# ---- training step ----------------------------------------------------------------
def step_times(framework, algo, n, rounds):
    from test_bench_train import _limit_threads, engine_step_fn, torch_step_fn
    _limit_threads()
    if framework == "torch":
        return {"times": _timeit(torch_step_fn(n), rounds, warmup=2)}
    ext = _engine_variant(algo)
    step = engine_step_fn(n)
    ts = _timeit(step, rounds, warmup=2)
    ext.gemm_profile(True)
    prof_ts = _timeit(step, max(2, rounds // 2), warmup=0)
    prof = ext.gemm_profile(False)
    wall = sum(prof_ts) * ext.get_num_threads()  # thread-seconds available
    from engine.ops.conv import conv_algo
    return {"times": ts, "kernel_share": prof["kernel_s"] / wall, "pack_share": prof["pack_s"] / wall,
            "conv_algo": conv_algo()}  # what the process ran: says what `default` is


def step_bench(procs, batches=(32, 128), algos=("default", "implicit")):
    from test_bench_train import peak_memory
    res = {}
    for n in batches:
        rounds = 8 if n == 32 else 4
        runs = {**{a: [] for a in algos}, "torch": []}
        shares, ran = [], {}
        for _ in range(procs):
            for a in algos:
                r = _fresh("engine", "step_times", "engine", a, n, rounds)
                runs[a].append(statistics.median(r["times"]))
                ran[a] = r["conv_algo"]
                if a == algos[0]:
                    shares.append((r["kernel_share"], r["pack_share"]))
            if _torch():
                runs["torch"].append(statistics.median(_fresh("torch", "step_times", "torch", None, n, rounds)["times"]))
        row = {k: {**_stats(v), "img_s": n / statistics.median(v)} for k, v in runs.items() if v}
        if "torch" in row:
            for k in algos:
                row[f"{k}_vs_torch"] = row["torch"]["median"] / row[k]["median"]
                # ratio of each alternated pair, to show the spread
                row[f"{k}_vs_torch_pairs"] = [t / e for t, e in zip(runs["torch"], runs[k])]
        row["kernel_share"] = statistics.median(s[0] for s in shares)  # of algos[0]
        row["pack_share"] = statistics.median(s[1] for s in shares)
        row["conv_algo"] = ran
        old = os.environ.get("SPRINT_CONV_ALGO")
        for a in algos:  # the fresh process reads the algorithm from the environment
            os.environ.pop("SPRINT_CONV_ALGO", None) if a == "default" else os.environ.update(SPRINT_CONV_ALGO=a)
            row[f"memory_{a}"] = peak_memory("engine", n)
        os.environ.pop("SPRINT_CONV_ALGO", None) if old is None else os.environ.update(SPRINT_CONV_ALGO=old)
        row["memory_engine"] = row[f"memory_{algos[0]}"]
        res[n] = row
    return res


def _torch():
    from conftest import torch_available
    return torch_available()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="peak,gemm,layers,step")
    ap.add_argument("--procs", type=int, default=3, help="alternated processes per framework")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batches", default="32,128", help="step: the batch sizes")
    ap.add_argument("--algos", default="default,implicit",
                    help=f"the engine's convolution algorithms timed by layers and step (of {', '.join(ALGOS)}; "
                         "the first is the one whose step profile and memory are printed)")
    ap.add_argument("--out", default=str(BENCH / "results" / "cpu_gemm.json"))
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    algos = tuple(args.algos.split(","))
    if not algos or any(a not in ALGOS for a in algos):
        ap.error(f"--algos: a comma list of {', '.join(ALGOS)}, got {args.algos!r}")
    env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "SPRINT_CPU_ISA")}
    out = {"threads": THREADS, "env": env, "loadavg_start": os.getloadavg(),
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if "peak" in parts:
        out["peak"] = peak()
        print("peak", json.dumps(out["peak"]), flush=True)
    if "gemm" in parts:
        out["gemm"] = gemm_rates(args.reps)
        pk = out.get("peak", {}).get("avx512", {})
        pk1 = out.get("peak", {}).get("avx512_1t", {})
        for r in out["gemm"]:
            share = f" = {100 * r['gflops_best'] / pk['gflops_best']:5.1f} % of peak" if pk else ""
            one = r.get("gflops_best_1t")
            share1 = (f"; 1 thread {one:6.1f} = {100 * one / pk1['gflops_best']:5.1f} %" if one and pk1 else "")
            print(f"{r['net']:6s} {r['layer']:7s} {r['pass']:15s} {r['m']:5d}x{r['n']:6d}x{r['k']:5d} "
                  f"median {r['gflops_median']:6.1f} best {r['gflops_best']:6.1f} GFLOP/s{share}{share1}", flush=True)
    if "layers" in parts:
        out["layers"] = layers_bench(args.procs, args.reps, algos)
        for name, row in out["layers"].items():
            print(name, " ".join(f"{k} {v['gflops']:.1f} GF/s ({v['best'] * 1e3:.2f}..{v['worst'] * 1e3:.2f} ms)"
                                 for k, v in row.items() if isinstance(v, dict)),
                  " ".join(f"{k} {v:.2f}x" for k, v in row.items() if k.endswith("vs_torch")), flush=True)
    if "step" in parts:
        out["step"] = step_bench(args.procs, tuple(int(b) for b in args.batches.split(",")), algos)
        for n, row in out["step"].items():
            print(f"step batch {n} (ran {row['conv_algo']}):", " ".join(f"{k} {v['img_s']:.1f} img/s" for k, v in row.items()
                                               if isinstance(v, dict) and "img_s" in v),
                  " ".join(f"{k} {v:.2f}x" for k, v in row.items() if k.endswith("vs_torch")),
                  " ".join(f"{a} pairs {row.get(f'{a}_vs_torch_pairs')}" for a in algos),
                  f"kernel share {100 * row['kernel_share']:.1f} %, packing {100 * row['pack_share']:.1f} %,",
                  " ".join(f"memory {a} {row[f'memory_{a}']['step_rss_mib']:.0f} MiB" for a in algos), flush=True)
    out["loadavg_end"] = os.getloadavg()
    write_json(args.out, out, indent=1, default=str)      # atomic: an interrupted write keeps the last results
    print("wrote", args.out)


if __name__ == "__main__":
    main()
