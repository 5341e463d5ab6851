"""Counts in messages agree with their nouns (errors.counted): '1 step per
epoch', '1 server x 1 replica', not '1 steps', '1 servers', '1 replicas' as
the train header and sprint plan's table said."""
import re

from engine.errors import counted


def test_counted():
    assert counted(1, "step") == "1 step" and counted(0, "step") == "0 steps" and counted(3, "step") == "3 steps"
    assert counted(1, "micro-batch", "micro-batches") == "1 micro-batch"
    assert counted(2, "micro-batch", "micro-batches") == "2 micro-batches"
    assert counted(1.0, "evaluation", fmt="g") == "1 evaluation" and counted(2.5, "evaluation", fmt="g") == "2.5 evaluations"
    assert counted(12345, "image", fmt=",") == "12,345 images"


_ONE_PLURAL = re.compile(r"(?<![\d.,])1 (?:steps|servers|replicas|ranks|nodes|workers|devices|stages|updates|"
                         r"configurations|evaluations|micro-batches|slices|threads|cores|samples)\b|\(s\)|\(es\)")


def test_plan_table_with_one_server_and_one_replica():
    from engine.perf.plan import format_plan, make_plan
    out = format_plan(*make_plan("tiny", 2))
    assert "1 server x 1 replica" in out, out
    assert not _ONE_PLURAL.search(out), _ONE_PLURAL.search(out)


def test_train_header_with_one_step_per_epoch(tmp_path, capsys):
    import engine
    cfg = engine.TrainConfig(model="digits", epochs=1, batch=1438, out=str(tmp_path / "run"), progress=False)
    engine.train(cfg)
    out = capsys.readouterr()
    assert "batch 1438, 1 step per epoch;" in out.out + out.err, out


def test_tune_and_simulate_lines_with_ones():
    from engine.perf import asgd, tune
    from engine.perf.profile import Profile
    prof = Profile.synthetic()
    cands = tune.search("tiny", prof, 8, 0.05, max_nodes=1, max_subbatch=8, subbatches=(8,))
    text = tune.format_candidates(cands, 8, 0.05)
    assert "1 of 1 configuration searched qualifies" in text, text
    sim = asgd.simulate("tiny", 1, 1, 8, prof, n_updates=5)
    head = asgd.format_simulation(sim).splitlines()[0]
    assert head.startswith("tiny: 1 node x 1 worker = 1 simulated GPU, N_Subbatch 8: 5 updates"), head
    assert not _ONE_PLURAL.search(head), head


def test_a_data_set_of_one_class_is_counted(tmp_path, capsys):
    """'bad4/train has 1 classes; give a --model that takes 8x8x1 images of 1 classes'."""
    import numpy as np
    from engine import cli
    np.savez(tmp_path / "one.npz", x=np.zeros((10, 1, 8, 8), np.float32), y=np.zeros(10, np.int64))
    assert cli.main(["train", "--data", str(tmp_path / "one.npz"), "--out", str(tmp_path / "r"), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "model digits has 10 outputs but one/train has 1 class; give a --model that takes 8x8x1 images of 1 class " \
           "(a spec file" in err, err
