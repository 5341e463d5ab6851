"""pytest-benchmark sweeps behind the performance model (issue 5).

Each test runs one sweep of engine.perf.sweep (quick grids), saves its records
as JSON under bench/results/, and reports in ``extra_info`` the fit's error on
held-out points and a ratio against a baseline measured in the same run
(numpy's own matmul / copy for the engine's SGEMM / vector work).

    pytest bench/test_bench_sweeps.py --benchmark-only -q
    sprint profile --from-records bench/results/sweep_all.json --out profile.json
"""
from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint import write_json
from engine.perf import fit, sweep

RESULTS = Path(__file__).parent / "results"
_ALL = []


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    sweep.set_threads(1)
    sweep.use_clock("cpu")     # one thread: CPU time is the kernel's cost without other jobs' preemption
    yield
    sweep.use_clock("wall")
    if _ALL:
        write_json(RESULTS / "sweep_all.json", {"records": _ALL, "meta": {"quick": True, "threads": 1}})


def _save(name, recs):
    write_json(RESULTS / f"sweep_{name}.json", recs)
    _ALL.extend(recs)


def _cfg():
    cfg = sweep.mode_config(True)
    cfg["repeats"] = 3
    return cfg


def _baseline(fn, engine_fn):
    t_np, _ = sweep.time_call(fn, 5, 2e-3)
    t_en, _ = sweep.time_call(engine_fn, 5, 2e-3)
    return t_en / t_np


def test_sweep_sgemm(benchmark):
    from engine import ops
    cfg = _cfg()
    cfg.update(sgemm_exp=(0, 2, 4, 6, 8), sgemm_nexp=(0, 2, 4, 6, 8, 10, 12), sgemm_kexp=(2, 4, 6, 8, 10),
               sgemm_max=2 ** 27, sgemm_mid=16)
    recs = benchmark.pedantic(lambda: sweep.sweep_sgemm(cfg, variants=("nn", "nt")), rounds=1, iterations=1)
    _save("sgemm", recs)
    prof = fit.fit_profile(recs)
    a, b = np.random.rand(256, 256).astype(np.float32), np.random.rand(256, 256).astype(np.float32)
    c = np.empty((256, 256), np.float32)
    benchmark.extra_info["gemm_256_vs_numpy_matmul"] = _baseline(lambda: np.matmul(a, b, out=c),
                                                                 lambda: ops.gemm(a, b, out=c))
    for var, v in prof["sgemm"]["variants"].items():
        benchmark.extra_info[f"{var}_regimes"] = len(v["regimes"])
        benchmark.extra_info[f"{var}_holdout_median_err"] = v["error"]["holdout"].get("median")
    assert all(r["t"] > 0 for r in recs)


def test_sweep_layer_kernels(benchmark):
    cfg = _cfg()
    cfg["batches"] = (1, 4)
    recs = benchmark.pedantic(lambda: sweep.sweep_layers(cfg) + sweep.sweep_fc_softmax(cfg),
                              rounds=1, iterations=1)
    _save("layers", recs)
    prof = fit.fit_profile(recs)
    for name, t in prof["terms"].items():
        benchmark.extra_info[f"{name}_holdout_median_err"] = t["error"]["holdout"].get("median")
    assert {"im2col", "col2im"} <= set(prof["terms"])


def test_sweep_vectors(benchmark):
    cfg = _cfg()
    recs = benchmark.pedantic(lambda: sweep.sweep_vectors(cfg) + sweep.sweep_handover(cfg),
                              rounds=1, iterations=1)
    _save("vectors", recs)
    prof = fit.fit_profile(recs)
    n = 1 << 20
    a, b = np.ones(n, np.float32), np.empty(n, np.float32)
    benchmark.extra_info["copy_GBps"] = 8 / prof["terms"]["copy"]["a"] / 1e9
    benchmark.extra_info["add_vs_numpy_copy"] = _baseline(lambda: np.copyto(b, a), lambda: b.__iadd__(a))
    assert prof["terms"]["copy"]["a"] > 0


def test_sweep_vectors_cold(benchmark):
    cfg = _cfg()
    cfg["vec_exp"] = range(10, 24, 2)
    recs = benchmark.pedantic(lambda: sweep.sweep_vectors(cfg) + sweep.sweep_vectors_cold(cfg),
                              rounds=1, iterations=1)
    _save("vectors_cold", recs)
    # Baseline of the same run: the warm sweep of the same operation and size.
    warm = {(r["kind"], r["x"]): r["t"] for r in recs if not r["kind"].endswith("_cold")}
    for r in recs:
        if r["kind"].endswith("_cold") and r["x"] in (1 << 12, 1 << 20):
            benchmark.extra_info[f"{r['kind']}_{r['x']}_vs_warm"] = r["t"] / warm[(r["kind"][:-5], r["x"])]
    assert all(r["t"] > 0 for r in recs)


def test_sweep_data(benchmark):
    cfg = _cfg()
    cfg["data_batches"] = (1, 4, 16, 64)
    recs = benchmark.pedantic(lambda: sweep.sweep_data(cfg), rounds=1, iterations=1)
    _save("data", recs)
    prof = fit.fit_profile(recs)
    for name in ("load", "deform"):
        if name in prof["terms"]:
            benchmark.extra_info[f"{name}_ns_per_pixel"] = prof["terms"][name]["a"] * 1e9


def test_sweep_net_steps(benchmark):
    cfg = _cfg()
    cfg.update(nets=("tiny", "cifar"), net_batches=(1, 4))
    recs = benchmark.pedantic(lambda: sweep.sweep_net_steps(cfg), rounds=1, iterations=1)
    _save("net_steps", recs)
    assert recs and all(r["t"] > 0 for r in recs)


@pytest.mark.mpi
def test_sweep_allreduce(benchmark):
    cfg = _cfg()
    cfg.update(ranks=(2,), allreduce_exp=range(10, 22, 4))
    recs = benchmark.pedantic(lambda: sweep.sweep_allreduce(cfg, timeout=120), rounds=1, iterations=1)
    _save("allreduce", recs)
    big = max(recs, key=lambda r: r["n_param"])
    benchmark.extra_info["allreduce_2ranks_GBps"] = 4 * big["n_param"] / big["t"] / 1e9
