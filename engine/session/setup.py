"""Device, threads and data of a run: the same for every strategy."""
from __future__ import annotations

import numpy as np

SMALL_NET_FLOPS = 20e6


def setup_device(cfg):
    from engine import backend
    # 'auto' keeps whatever the global --device or $SPRINT_DEVICE chose
    be = backend.get_backend() if cfg.device == "auto" else backend.set_backend(cfg.device)
    threads = cfg.threads or auto_threads(cfg)
    if cfg.threads and be.name == "cpu":
        _warn_oversubscribed(cfg.threads)
    if threads and be.name == "cpu":
        # after get_backend(): the extension (and its OpenMP) must be loaded to be limited
        from engine.parallel.threads import limit_this_thread
        limit_this_thread(threads)
    return be


def _warn_oversubscribed(threads: int):
    """--threads beyond the cores this process may run on: --threads 64 on 2
    cores trained digits 5x slower than 1 thread, without a word."""
    import sys
    from engine.errors import counted
    from engine.parallel.launcher import launcher_rank
    from engine.parallel.threads import usable_cores
    cores = usable_cores()
    if threads > cores and launcher_rank() == 0:
        print(f"sprint: warning: --threads {threads} is more than the {counted(cores, 'core')} this process may "
              f"run on: the threads take turns on them, which is slower, not faster (--threads)", file=sys.stderr, flush=True)


def auto_threads(cfg):
    """1 for nets under SMALL_NET_FLOPS per image (their kernels are too small
    to amortise a parallel region: 2 threads ran the digits step several times
    slower than 1 here), else None: the libraries' default, all cores."""
    from engine.spec import get_spec, layers
    flops = sum(g.flops_fwd for g in layers(get_spec(cfg.model), 1))
    return 1 if flops < SMALL_NET_FLOPS else None


def prepare_data(cfg, spec):
    """(train, test, deform config) for ``spec``: checks classes and channels and
    fills the normalisation from the training set."""
    from engine.data import DeformConfig, load_dataset
    train_ds, test_ds = load_dataset(cfg.data, cfg.fmt, size=spec.x0, channels=spec.m0,
                                     test_fraction=cfg.test_fraction, resize=cfg.resize, skip_bad=cfg.skip_bad)
    from engine.data.readers import model_for
    from engine.errors import counted
    for ds in (train_ds, test_ds):
        if ds.shape[0] != spec.m0:
            raise ValueError(f"model {spec.name} takes {counted(spec.m0, 'channel')} but {ds.name} has "
                             f"{ds.shape[0]}; {model_for(ds)}")
        if ds.n_classes != spec.n_classes:
            raise ValueError(f"model {spec.name} has {counted(spec.n_classes, 'output')} but {ds.name} has "
                             f"{counted(ds.n_classes, 'class', 'classes')}; {model_for(ds)}")
    if cfg.crop_pad >= spec.x0:
        # the shifted window would show the net mostly padding (10 % on digits)
        from engine.errors import RunError
        raise RunError(f"a crop padding of {cfg.crop_pad} pixels must be smaller than the network's "
                       f"{spec.x0}x{spec.x0} input",
                       "--crop-pad")
    j = cfg.scale_jitter
    deform = DeformConfig(crop_pad=cfg.crop_pad, flip=cfg.flip, scale=(1 - j, 1 + j),
                          out_hw=(spec.x0, spec.x0)).with_stats(train_ds)
    return train_ds, test_ds, deform


def batch_note(cfg, train_ds) -> str | None:
    """What a batch past the training set becomes, said rather than done
    silently (L-BFGS strategies take it as "the whole set")."""
    from .registry import get_strategy
    n = len(train_ds)
    if cfg.batch <= n or get_strategy(cfg.parallel).whole_set_batch:
        return None
    return (f"batch {cfg.batch} is larger than the training set ({n} images in {train_ds.name}): every epoch "
            f"is a single, smaller batch (--batch)")


def evaluate(net, dataset, batch=256, deform=None):
    """(mean loss, accuracy) of ``net`` on ``dataset``; ``deform`` supplies the
    normalisation the net was trained with (augmentation is switched off)."""
    from engine.data import DeformConfig, Loader
    if deform is None:
        deform = DeformConfig(out_hw=(net.spec.x0, net.spec.x0))
    loader = Loader(dataset, batch, shuffle=False, deform=deform.eval(), prefetch=1)
    loss_sum, correct, seen = 0.0, 0, 0
    for x, y in loader:
        logits = net.forward(x)
        loss, _, _ = net.ops.softmax_xent(logits, y)
        loss_sum += float(loss) * len(y)
        correct += int((logits.argmax(axis=1) == y).sum())
        seen += len(y)   # (a lazy image tree may drop unreadable files)
    if seen == 0:
        raise ValueError(f"{getattr(dataset, 'name', 'dataset')}: no readable samples to evaluate")
    return loss_sum / seen, correct / seen


def evaluate_sharded(comm, net, dataset, batch, deform):
    """Mean loss and accuracy over the whole of ``dataset``, each rank a shard."""
    idx = np.arange(comm.rank, len(dataset), comm.size)
    if len(idx):
        loss, acc = evaluate(net, dataset.subset(idx) if comm.size > 1 else dataset, batch, deform)
    else:
        loss, acc = 0.0, 0.0
    s = [loss * len(idx), acc * len(idx), len(idx)]
    if comm.size > 1:
        s = comm.allreduce_scalars(s)
    return s[0] / s[2], s[1] / s[2]


def memory_estimate(spec, batch: int, workers: int = 1) -> int:
    """A lower bound of the bytes a run of ``spec`` needs: the flat vectors
    (weights, gradients, momentum, a checkpoint copy; weights and gradients
    again per extra worker) and, per worker, one batch's activations kept for
    the backward pass plus the largest im2col matrix (float32)."""
    from engine.spec import layers, n_params
    p = n_params(spec)
    geo = layers(spec, batch)
    acts = 0
    for g in geo:
        per = _prod(g.extra.get("conv_out", g.out_shape)) + (_prod(g.out_shape) if g.pool > 1 else 0)
        acts += per * batch
    acts += _prod(spec.input_shape) * batch
    cols = max((g.im2col_elems for g in geo), default=0)
    return 4 * (p * (4 + 2 * (workers - 1)) + workers * (acts + cols))


def _prod(t):
    r = 1
    for v in t:
        r *= int(v)
    return r


def available_memory(backend) -> int | None:
    """Bytes free for the run: the GPU's free memory, else MemAvailable."""
    if getattr(backend, "name", "cpu") == "gpu":
        try:
            import cupy
            return int(cupy.cuda.runtime.memGetInfo()[0])
        except Exception:
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(cfg, spec, backend, n_train=None):
    """Refuse, before the network is allocated, one that cannot fit. A batch
    past the ``n_train`` training images is one batch of them all (batch_note):
    that is what it needs, not the nominal --batch."""
    from engine.errors import RunError
    batch = min(cfg.batch, n_train) if n_train else cfg.batch
    need = memory_estimate(spec, batch, cfg.workers)
    have = available_memory(backend)
    if have is not None and need > have:
        where = "GPU" if getattr(backend, "name", "cpu") == "gpu" else "host"
        raise RunError(f"model {spec.name} with batch {batch}"
                       f"{f' x {cfg.workers} workers' if cfg.workers > 1 else ''} needs at least "
                       f"{need / 2**30:.1f} GiB but {have / 2**30:.1f} GiB of {where} memory is free; "
                       f"use a smaller --batch or network", "--model")
    return need
