"""Distributed training: SPRINT asynchronous SGD and synchronous allreduce SGD.

``run(cfg)`` trains ``cfg`` with the parallel strategy ``cfg.parallel``
names (engine.session.registry lists them). The pieces are generic over flat parameter vectors
and a per-worker "source" (load, deform, compute gradient):

* ``comm``    -- MPI (mpi4py) or single-process communicator: in-place
                 allreduce of flat vectors (NCCL / CUDA-aware MPI / host
                 staging for device buffers), broadcast, agreement checks,
                 job-wide abort naming the failed rank;
* ``asgd``    -- SPEC section 3: worker threads (Algorithm 1) and the
                 updater (Algorithm 2) whose allreduce carries the weights;
* ``sync``    -- gradients averaged over all workers and ranks every step;
* ``timers``  -- per-step timers named as in SPEC;
* ``runner``  -- asgd and sync over engine.Net / Loader and engine.session: ranks, checkpoints,
                 metrics, ``asgd_stats.json`` / ``sync_stats.json``;
* ``report``, ``cli`` -- ``sprint report RUN_DIR``.

Launch: ``mpiexec -n N sprint train --parallel asgd --workers W ...`` (each
rank a node); without a launcher it is one node.
"""
from __future__ import annotations


def run(cfg):
    """Train as ``cfg`` (an ``engine.TrainConfig`` whose ``parallel`` names a
    parallel strategy of engine.session.registry: 'asgd', 'sync', ...) says,
    on this process's rank of the MPI job (one node without a launcher);
    returns what ``engine.train`` returns (final metrics, history, run
    directory). Every rank calls it with the same config."""
    from engine.session import registry
    strategy = registry.get_strategy(cfg.parallel)
    if not strategy.distributed:
        choices = [s.name for s in registry.STRATEGIES.values() if s.distributed]
        raise ValueError(f"engine.parallel.run needs cfg.parallel set to one of {', '.join(choices)}, "
                         f"got {cfg.parallel!r} (engine.train runs it)")
    return strategy.function()(cfg)


__all__ = ["run"]
