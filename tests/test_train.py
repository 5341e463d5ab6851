"""The training loop: learning, run directory, exact kill-and-resume,
evaluation and config errors."""
import json

import numpy as np
import pytest

import engine
from engine import checkpoint
from engine.train import TrainConfig, evaluate, load_checkpoint, resume_config, train


def _blobs(path, n=192, seed=0):
    """3 classes for `tiny` (2x8x8): a bright quadrant tells the class."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(0, 0.3, (n, 2, 8, 8)).astype(np.float32)
    for k, (ch, r, c) in enumerate([(0, 0, 0), (1, 4, 4), (0, 4, 0)]):
        x[y == k, ch, r:r + 4, c:c + 4] += 1.0
    np.savez(path, x=x, y=y)
    return path


def _cfg(data, **kw):
    base = dict(model="tiny", data=str(data), epochs=4, batch=16, lr=0.05, progress=False,
                verbose=False, crop_pad=1)
    base.update(kw)
    return TrainConfig(**base)


def test_learns_and_writes_the_run_directory(tmp_path):
    data = _blobs(tmp_path / "blobs.npz")
    res = engine.train(_cfg(data, out=str(tmp_path / "run")))
    run = tmp_path / "run"
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in recs] == [1, 2, 3, 4]
    for r in recs:
        assert {"epoch", "step", "train_loss", "test_loss", "test_acc", "images_per_s", "time"} <= set(r)
    assert recs[-1]["step"] == 4 * int(np.ceil(154 / 16))
    assert recs[-1]["train_loss"] < recs[0]["train_loss"]
    assert res["test_acc"] == recs[-1]["test_acc"] >= 0.9
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["train"]["model"] == "tiny" and cfg["spec"]["x0"] == 8 and len(cfg["deform"]["mean"]) == 2
    state = checkpoint.load(run / "checkpoint.npz")
    assert state["epoch"] == 4 and state["step"] == recs[-1]["step"]
    assert np.array_equal(state["params"], res["net"].params)
    assert np.array_equal(state["optim"]["velocity"], res["optimizer"].velocity)
    sched = state["optim"]["schedule"]
    assert sched["kind"] == "warmup" and sched["after"]["kind"] == "cosine" and state["rng"]["seed"] == 0
    # evaluate() from the checkpoint reproduces the logged accuracy
    net, st = load_checkpoint(run)
    from engine.data import DeformConfig, load_dataset
    _, test = load_dataset(str(data))
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in st["deform"].items()}
    loss, acc = evaluate(net, test, 64, DeformConfig(**d))
    assert acc == recs[-1]["test_acc"] and loss == pytest.approx(recs[-1]["test_loss"], rel=1e-6)


def test_kill_and_resume_is_bit_identical(tmp_path):
    data = _blobs(tmp_path / "blobs.npz")
    full = train(_cfg(data, out=str(tmp_path / "full"), warmup=1.0, flip=True, scale_jitter=0.1))
    cut = train(_cfg(data, out=str(tmp_path / "cut"), warmup=1.0, flip=True, scale_jitter=0.1, stop_after=2))
    assert cut["epochs"] == 2
    assert not np.array_equal(cut["net"].params, full["net"].params)
    resumed = train(resume_config(tmp_path / "cut"))
    assert resumed["epochs"] == 4
    a, b = checkpoint.load(tmp_path / "full"), checkpoint.load(tmp_path / "cut")
    assert a["params"].tobytes() == b["params"].tobytes()
    assert a["optim"]["velocity"].tobytes() == b["optim"]["velocity"].tobytes()
    assert a["step"] == b["step"]
    la = (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
    lb = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    strip = lambda ls: [{k: v for k, v in json.loads(l).items() if k not in ("time", "images_per_s")} for l in ls]
    assert strip(la) == strip(lb)


def test_resume_rejects_another_model(tmp_path):
    data = _blobs(tmp_path / "blobs.npz")
    train(_cfg(data, out=str(tmp_path / "r"), epochs=1))
    cfg = resume_config(tmp_path / "r", epochs=2)
    cfg.model = "digits"
    with pytest.raises(ValueError, match="channel"):
        train(cfg)
    with pytest.raises(FileNotFoundError, match="run directory"):
        resume_config(tmp_path / "nothing")


def test_data_must_fit_the_model(tmp_path):
    data = _blobs(tmp_path / "blobs.npz")
    with pytest.raises(ValueError, match="1 channel"):
        train(_cfg(data, model="digits"))
    np.savez(tmp_path / "two.npz", x=np.zeros((10, 2, 8, 8), np.float32), y=np.arange(10) % 2)
    with pytest.raises(ValueError, match="3 outputs but .* 2 classes"):
        train(_cfg(tmp_path / "two.npz"))


def test_config_validation_and_parallel_delegation(monkeypatch):
    for bad in (dict(epochs=0), dict(batch=-1), dict(lr=0), dict(parallel="mpi"), dict(device="tpu"),
                dict(scale_jitter=1.5)):
        with pytest.raises(ValueError):
            TrainConfig(**bad)
    with pytest.raises(ValueError, match="unknown"):
        TrainConfig.from_dict({"epochz": 3})
    for bad in (dict(lr=float("inf")), dict(lr=float("nan")), dict(momentum=1.0), dict(momentum=-0.1),
                dict(workers=2)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainConfig(**bad)
    with pytest.raises(ValueError, match="lr must be finite and > 0, got inf"):
        TrainConfig(lr=float("inf"))
    import engine.parallel.runner
    seen = []
    monkeypatch.setattr(engine.parallel.runner, "run", lambda cfg: seen.append(cfg) or {"delegated": True})
    cfg = TrainConfig(parallel="asgd", workers=2)
    assert train(cfg) == {"delegated": True} and seen == [cfg]
    assert engine.parallel.run(cfg) == {"delegated": True} and seen == [cfg, cfg]
    with pytest.raises(ValueError, match="asgd, sync"):
        engine.parallel.run(TrainConfig())


def test_cifar_defaults_to_a_tenth_of_the_strategys_learning_rate(tmp_path):
    """The cifar preset diverges at the strategies' 0.05 (and so does PyTorch's
    twin of it); left at None its lr is a tenth of the strategy's, an lr given
    is kept, and a resumed run keeps the lr its config.json saved."""
    from engine.session.registry import get_strategy
    for parallel in ("none", "asgd", "sync", "downpour"):
        base = get_strategy(parallel).field_default("lr")
        assert TrainConfig(model="cifar", parallel=parallel).lr == pytest.approx(base / 10, rel=1e-12)
        assert TrainConfig(model="digits", parallel=parallel).lr == base
        assert TrainConfig(model="cifar", parallel=parallel, lr=0.05).lr == 0.05
    saved = TrainConfig(model="cifar", lr=0.05).to_dict()
    assert TrainConfig.from_dict(saved).lr == 0.05


def test_pipelines_that_update_every_micro_batch_default_to_the_rate_over_m():
    """1f1b and dualpipe apply an update after every micro-batch (a step of
    --batch / M samples): at the mini-batch's 0.05 dualpipe on digits fell to
    chance (test_pipeline_mpi). Left at None their lr is the base one over
    M, the preset's scale on top; gpipe keeps one process's; an lr given,
    or saved in a run's config.json, is kept."""
    def lr(**extra):
        return TrainConfig(parallel="pipeline", extra=extra).lr
    assert lr() == lr(schedule="gpipe") == lr(schedule="gpipe", microbatches=8) == 0.05
    assert lr(schedule="dualpipe") == lr(schedule="1f1b", microbatches=4) == 0.0125
    assert lr(schedule="1f1b", microbatches=8) == 0.00625 and lr(schedule="dualpipe", microbatches=1) == 0.05
    assert TrainConfig(parallel="pipeline", model="cifar", extra={"schedule": "1f1b"}).lr == 0.00125
    assert TrainConfig(parallel="pipeline", lr=0.05, extra={"schedule": "dualpipe"}).lr == 0.05
    saved = TrainConfig(parallel="pipeline", lr=0.05, extra={"schedule": "dualpipe"}).to_dict()
    assert TrainConfig.from_dict(saved).lr == 0.05
    # a bad M is left to the pipeline's check, which names --microbatches
    assert lr(schedule="1f1b", microbatches=0) == lr(schedule="1f1b", microbatches="x") == 0.05


def test_metrics_and_plot_errors(tmp_path):
    from engine import metrics
    from engine.plot import plot_run
    with pytest.raises(FileNotFoundError, match="no metrics"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"its metrics hold no epochs yet \(.*\)$"):
        plot_run(tmp_path)
    metrics.append(tmp_path / "metrics.jsonl", {"epoch": 1, "train_loss": 2.0, "test_loss": 1.5,
                                                "train_acc": 0.3, "test_acc": 0.5})
    metrics.append(tmp_path / "metrics.jsonl", {"epoch": 2, "train_loss": 1.0, "test_loss": 0.9,
                                                "train_acc": 0.6, "test_acc": 0.7})
    paths = plot_run(tmp_path, tmp_path / "png")
    assert [p.name for p in paths] == ["loss.png", "accuracy.png"] and all(p.stat().st_size > 5000 for p in paths)
    metrics.truncate(tmp_path / "metrics.jsonl", 1)
    assert [r["epoch"] for r in metrics.read(tmp_path)] == [1]
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        metrics.read(tmp_path / "metrics.jsonl")


def test_the_presets_without_normalisation_default_to_a_rate_they_train_at():
    """cifar and the VGG presets diverge at the strategies' 0.05, and so do
    their PyTorch twins (engine.spec.PRESET_LR_SCALE says where and how it
    was measured): an --lr left out gives them a rate they train at."""
    from engine.session import TrainConfig
    assert TrainConfig(model="digits").lr == 0.05 and TrainConfig(model="cifar").lr == 0.005
    for m in ("cnn-a", "cnn-b", "cnn-c"):
        assert TrainConfig(model=m).lr == 0.001 and TrainConfig(model=m, parallel="asgd").lr == 0.0004
        assert TrainConfig(model=m, lr=0.05).lr == 0.05
