"""What every training run shares, whatever its strategy.

* ``config``   -- TrainConfig, its defaults per strategy, resume_config;
* ``registry`` -- the strategy table (name -> module:function) and ``run(cfg)``;
* ``setup``    -- device and threads, data, (sharded) evaluation;
* ``rundir``   -- the run folder: atomic config/metrics/checkpoint/stats files, run id;
* ``session``  -- Session: one run's life from loading state to the last epoch;
* ``watchdog`` -- heartbeats between MPI ranks: a rank that stops answering ends the job.

Strategies (engine.train for one process, engine.parallel.* for the others)
stand on these and never on each other.
"""
from __future__ import annotations

from .config import TrainConfig, resume_config
from .registry import STRATEGIES, Strategy, get_strategy, register, run
from .rundir import CHECKPOINT, CONFIG, METRICS, RunDir
from .session import Session, epoch_line
from .setup import auto_threads, evaluate, evaluate_sharded, prepare_data, setup_device

__all__ = ["TrainConfig", "resume_config", "STRATEGIES", "Strategy", "get_strategy", "register", "run",
           "CHECKPOINT", "CONFIG", "METRICS", "RunDir", "Session", "epoch_line", "auto_threads", "evaluate",
           "evaluate_sharded", "prepare_data", "setup_device"]
