"""Downpour, Sandblaster, ASGD and sync on the emulated GPU (tests/gpu_emu.py;
the harness and its rules are tests/test_gpu_emulated.py's). Replicas
compute on device arrays and must stage every gradient push, weight fetch
and allreduce through host memory (the emulated MPI refuses device buffers);
each rank, and each worker thread of it, must run on its own GPU."""
from __future__ import annotations

import json

import numpy as np
import pytest

from test_gpu_emulated import (COMMON, check_on_own_gpus, emu_cache, gpu_and_cpu, metrics, needs_mpi,  # noqa: F401
                               params, small_data, sprint)

pytestmark = needs_mpi


def _initial():
    from engine.net import Net
    return np.asarray(Net("digits", seed=3).params, np.float64)


def test_downpour_two_shards_get_the_pushes_of_two_gpu_replicas(small_data, tmp_path, emu_cache):
    args = [*COMMON, "--data", small_data, "--epochs", "1", "--parallel", "downpour", "--servers", "2"]
    rc, out, run, ledgers = sprint(args, 4, emu_cache, tmp_path, "downpour")
    assert rc == 0, out[-3000:]
    # replicas on GPUs 2 and 3 (every rank used GPU 0 before); server 1 only serves
    check_on_own_gpus(ledgers, 4, compute_ranks={0, 2, 3})
    st = json.loads((run / "downpour_stats.json").read_text())
    assert st["backend"] == "gpu" and st["pushes_applied"] == st["pushes_sent"] > 0, st
    for shard in st["servers"]:
        pushes = shard["pushes_from"]
        assert sorted(pushes) == ["2", "3"] and all(v > 0 for v in pushes.values()), (shard["server"], pushes)
    assert st["samples"] >= 384 and np.abs(params(run) - _initial()).max() > 1e-3


def test_downpour_one_gpu_replica_fetching_and_pushing_every_step_follows_the_cpu(small_data, tmp_path, emu_cache):
    """One replica, n_fetch = n_push = 1, momentum SGD at the server: the
    sequential SGD of the CPU run, up to GEMM rounding (cuBLAS vs the
    engine's SGEMM: 1e-4 after 12 steps)."""
    args = [*COMMON, "--data", small_data, "--epochs", "1", "--parallel", "downpour", "--servers", "1",
            "--server-opt", "sgd", "--fetch-every", "1", "--push-every", "1"]
    run, cpu, _ = gpu_and_cpu(args, 2, emu_cache, tmp_path, "downpour")
    diff = np.abs(params(run) - params(cpu)).max()
    assert diff < 1e-4 and np.abs(params(run) - _initial()).max() > 1e-3, diff


def test_sandblaster_one_server_two_gpu_replicas(small_data, tmp_path, emu_cache):
    args = [*COMMON, "--data", small_data, "--epochs", "2", "--parallel", "sandblaster", "--servers", "1",
            "--batch", "128", "--slice", "32"]
    rc, out, run, ledgers = sprint(args, 3, emu_cache, tmp_path, "sandblaster")
    assert rc == 0, out[-3000:]
    check_on_own_gpus(ledgers, 3)
    st = json.loads((run / "sandblaster_stats.json").read_text())
    assert st["backend"] == "gpu" and st["batches"] >= 6, st
    assert all(r["slices"] > 0 for r in st["replicas"]), st["replicas"]
    m = metrics(run)
    assert m[-1]["train_loss"] < m[0]["train_loss"] or m[-1]["test_loss"] < 2.0, m


def test_asgd_gpu_workers_run_on_their_rank_gpu_and_resume(small_data, tmp_path, emu_cache):
    """The worker threads adopt their rank's GPU (they used to start on
    device 0, where rank 1's net is not); a resumed run takes the saved
    momentum (host) into the device's DeltaWeights."""
    args = [*COMMON, "--data", small_data, "--epochs", "1", "--parallel", "asgd"]
    rc, out, run, ledgers = sprint(args, 2, emu_cache, tmp_path, "asgd")
    assert rc == 0 and "GPU vectors reduced by copies through host memory" in out, out[-3000:]
    check_on_own_gpus(ledgers, 2)
    assert any(t.startswith("sprint-asgd-worker") for t in ledgers[1]["threads_devices"]), ledgers[1]
    w1 = params(run)
    assert np.abs(w1 - _initial()).max() > 1e-3
    rc, out, _, ledgers = sprint(["--resume", run, "--epochs", "2"], 2, emu_cache, tmp_path, "asgd-resumed")
    assert rc == 0, out[-3000:]
    check_on_own_gpus(ledgers, 2)
    assert [m["epoch"] for m in metrics(run)] == [1, 2] and np.abs(params(run) - w1).max() > 1e-4


@pytest.mark.parametrize("workers,cuda_mpi", [(1, False), (2, False), (2, True)])
def test_sync_on_two_gpu_ranks_follows_the_cpu(small_data, tmp_path, emu_cache, workers, cuda_mpi):
    """Each worker computes on its own non-blocking stream: what the null
    stream wrote before (weights, data the loader thread prepared) must be
    finished first, or the emulation reports a stream race. With one worker
    that stream is the main thread's, which also evaluates each epoch. With
    a CUDA-aware MPI the gradients are reduced in device memory."""
    args = [*COMMON, "--data", small_data, "--epochs", "2", "--parallel", "sync", "--workers", workers]
    env = {"SPRINT_EMU_CUDA_MPI": "1"} if cuda_mpi else {}
    path = "CUDA-aware MPI" if cuda_mpi else "copies through host memory"
    run, cpu, ledgers = gpu_and_cpu(args, 2, emu_cache, tmp_path, "sync", env=env,
                                    expect=f"GPU vectors reduced by {path}")
    if workers > 1:
        assert any(t.startswith("sprint-sync-worker") for t in ledgers[1]["threads_devices"]), ledgers[1]
    assert np.abs(params(run) - params(cpu)).max() < 1e-4


@pytest.mark.parametrize("strategy", ["downpour", "sandblaster"])
def test_parameter_server_run_on_gpu_replicas_resumes_as_if_never_stopped(small_data, tmp_path, emu_cache, strategy):
    """Stopped after one epoch and resumed with --resume: the server state
    (Downpour's momentum, Sandblaster's L-BFGS history) goes back to the
    servers and the weights back onto the replicas' GPUs, and the second
    epoch is the one the straight two-epoch run made. One replica that
    fetches and pushes every step keeps Downpour's result independent of
    timing; Sandblaster's sums over slices are (one replica)."""
    extra = (["--servers", "1", "--server-opt", "sgd", "--fetch-every", "1", "--push-every", "1"]
             if strategy == "downpour" else ["--servers", "1", "--batch", "128", "--slice", "32"])
    args = [*COMMON, "--data", small_data, "--parallel", strategy, *extra]
    rc, out, part, ledgers = sprint([*args, "--epochs", "1"], 2, emu_cache, tmp_path, "part")
    assert rc == 0, out[-3000:]
    check_on_own_gpus(ledgers, 2)
    rc, out, _, ledgers = sprint(["--resume", part, "--epochs", "2"], 2, emu_cache, tmp_path, "resumed")
    assert rc == 0, out[-3000:]
    check_on_own_gpus(ledgers, 2)
    rc, out, straight, _ = sprint([*args, "--epochs", "2"], 2, emu_cache, tmp_path, "straight")
    assert rc == 0, out[-3000:]
    assert [m["epoch"] for m in metrics(part)] == [1, 2]
    np.testing.assert_array_equal(params(part), params(straight))
