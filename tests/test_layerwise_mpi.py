"""Layer-wise execution on 2, 3 and 4 ranks equals one process to 1e-5 after
5 steps (loss, whole gradient, weights) for pure data parallel, the one
weird trick, channel splits, spatial splits with halo exchange and a plan
that splits every layer differently; bad plans are refused before any step."""
import json

import numpy as np
import pytest

from engine.net import Net
from engine.perf import layerwise as L
from test_parallel_mpi import run_mpi

PLANS = "data,owt,channel,spatial,mixed"


@pytest.mark.parametrize("n", [2, 4])
def test_every_executed_plan_equals_one_process(n):
    rc, out, _ = run_mpi(n, "layerwise_equiv.py", "--plan", PLANS, timeout=120)
    assert rc == 0, out[-3000:]
    for kind in PLANS.split(","):
        assert f"LAYERWISE {kind.upper()} OK on {n} ranks" in out, out[-3000:]


def test_three_ranks_on_a_net_whose_shapes_split_three_ways(tmp_path):
    spec = tmp_path / "tri.json"
    spec.write_text(json.dumps({"name": "tri", "x0": 6, "m0": 1, "c": 3, "convs": [[6, 1], [12, 2]],
                                "fcs": [12, 6]}))
    rc, out, _ = run_mpi(3, "layerwise_equiv.py", "--plan", PLANS, "--model", spec, timeout=120)
    assert rc == 0, out[-3000:]
    assert out.count("OK on 3 ranks") == 5 and "'conv1': (1, 1, 3, 1)" in out, out[-3000:]


def test_bad_plans_are_refused_before_anything_runs():
    from mpi4py import MPI
    from engine.parallel.layerwise import LayerwiseExecutor
    net = Net("digits", seed=0)
    with pytest.raises(ValueError, match="job has 1 rank"):
        LayerwiseExecutor(net, L.named_plan("owt", "digits", 2, 8), MPI.COMM_SELF)
    with pytest.raises(ValueError, match="not 'digits'"):
        LayerwiseExecutor(net, L.named_plan("data", "tiny", 1, 8), MPI.COMM_SELF)
    ex = LayerwiseExecutor(net, L.named_plan("data", "digits", 1, 8), MPI.COMM_SELF)
    with pytest.raises(ValueError, match="batch 8"):
        ex.step(np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int64))
