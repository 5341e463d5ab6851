"""Each layer's forward and backward timed inside a whole net step: what
the per-layer terms (``fit_steps.fit_layer_terms``) are fitted on, and what
bench/validate_model.py compares the model's layer terms with.

A layer's pass costs more than its ops in their sweeps: the Python of the
layer and the ops between them, the buffers it allocates, and the caches
the neighbouring layers left cold. These records see all of it.
"""
from __future__ import annotations

import numpy as np

from engine import spec as spec_mod

from .cache_decay import _spin
from .fingerprint import cache_bytes
from .sweep_kernels import SWEPT_NETS
from .timing import CLOCK, _rand, _xp

# The nets of held-out test sets 1-7 (bench/RESULTS.md section 4): each was
# scored once and counts as seen since, so the sweeps may fit on them. Spec
# dicts, so that any install can sweep them. Sets 3 and 4 bring what the
# swept nets lack: 7x7 kernels (heldout-k7), three conv layers, three FC
# layers. Sets 5 and 6 (scored, seen since 2026-12-01) bring 5x5 kernels
# over 3 channels, pooling by 4 and 3, and an output layer that reads a conv
# map directly (heldout-allconv's, priced 40-57 % short in set 6). Set 7
# (scored, seen since 06:21 2026-12-01) brings 9x9 kernels (heldout-k9's,
# priced 35-40 % fast). Its heldout-four is not swept: its last conv (16 ->
# 32 channels, 3x3 on 12x12) is also test set 8's heldout-five's fourth.
# Set 8's nets (bench/specs/heldout_k11, heldout_five) are in no list.
SEEN_NETS = (
    "digits", "mnist",
    {"name": "mnist-heldout", "x0": 28, "m0": 1, "c": 5, "convs": [[16, 2], [32, 2]], "fcs": [128, 10]},
    {"name": "heldout-b", "x0": 16, "m0": 3, "c": 3, "convs": [[12, 2], [24, 2]], "fcs": [48, 10]},
    {"name": "heldout-fc", "x0": 12, "m0": 1, "c": 3, "convs": [[8, 2]], "fcs": [256, 128, 10]},
    {"name": "heldout-deep", "x0": 20, "m0": 2, "c": 5, "convs": [[12, 1], [16, 2], [32, 2]], "fcs": [64, 10]},
    {"name": "heldout-k7", "x0": 28, "m0": 1, "c": 7, "convs": [[10, 2], [20, 2]], "fcs": [100, 10]},
    {"name": "heldout-wide", "x0": 28, "m0": 1, "c": 3, "convs": [[24, 1], [24, 2], [48, 2]], "fcs": [96, 10]},
    {"name": "heldout-k5c3", "x0": 24, "m0": 3, "c": 5, "convs": [[20, 2], [40, 3]], "fcs": [64, 10]},
    {"name": "heldout-pool4", "x0": 32, "m0": 1, "c": 3, "convs": [[32, 4], [64, 2]], "fcs": [200, 10]},
    {"name": "heldout-lenet", "x0": 28, "m0": 1, "c": 5, "convs": [[6, 2], [16, 2]], "fcs": [120, 84, 10]},
    {"name": "heldout-allconv", "x0": 32, "m0": 3, "c": 3, "convs": [[16, 1], [32, 2], [32, 2], [64, 2]],
     "fcs": [10]},
    {"name": "heldout-k9", "x0": 28, "m0": 1, "c": 9, "convs": [[12, 2], [24, 2]], "fcs": [64, 10]})
# Nets whose layer passes fit the per-layer terms; ``heldout-b`` is held
# out of that fit whole.
LAYER_PASS_NETS = SWEPT_NETS + SEEN_NETS
LAYER_PASS_HELDOUT = ("heldout-b",)


def layer_pass_times(spec, n, repeats=7, clock=None, gap=0.0):
    """{(layer, "fwd"|"bwd"): (median, std) seconds} of each layer's forward
    and backward inside ``Net.loss_and_grad`` of ``spec`` on ``n`` samples,
    one thread; ``gap``: seconds of idle spin before each step (the age a
    longer step would give its layers' data, ``sweep_gapped_layer_passes``)."""
    from engine.net import Net
    clock = clock or CLOCK["fn"]
    sp = spec_mod.get_spec(spec)
    net = Net(sp, seed=0)
    acc = {}

    def wrap(layer, kind, key):
        f = getattr(layer, kind)

        def timed(*a, **k):
            t0 = clock()
            r = f(*a, **k)
            acc.setdefault((layer.name, key), []).append(clock() - t0)
            return r
        setattr(layer, kind, timed)
    for layer in net.layers:
        wrap(layer, "forward", "fwd")
        wrap(layer, "backward", "bwd")
    x = _rand((n,) + sp.input_shape, 9)
    y = _xp().asarray(np.random.default_rng(0).integers(0, sp.n_classes, n))
    net.loss_and_grad(x, y)
    acc.clear()
    for _ in range(repeats):
        if gap > 0:
            _spin(gap)
        net.loss_and_grad(x, y)
    return {k: (float(np.median(v)), float(np.std(v))) for k, v in acc.items()}


def sweep_layer_passes(cfg, skipped=None, gap=0.0, batches=None, repeats=None):
    """``layer_pass`` records of ``LAYER_PASS_NETS`` at every net batch size
    (``layer_pass_batches`` where given); the middle batch size of each net
    and the nets of ``LAYER_PASS_HELDOUT`` are held out whole (shapes and
    nets, not points).

    Each pass is the median of ``layer_pass_repeats`` steps (3 x repeats,
    21, before): the passes of small layers (20-60 us) scatter between steps
    by a standard deviation of 20-100 % of their median (the first sweep of
    bench/profiles/cpu_test5_records.json), which the median of 21 does not
    average away below the 10 % per-layer target. A sweep of 12 nets at 6
    batch sizes stays around a minute."""
    recs = []
    batches = batches or cfg.get("layer_pass_batches", cfg["net_batches"])
    repeats = repeats or cfg.get("layer_pass_repeats", 3 * cfg["repeats"])
    held = batches[len(batches) // 2]
    for net in cfg.get("layer_pass_nets", cfg["nets"]):
        sp = spec_mod.get_spec(net)
        name = sp.name
        kinds = {g.name: g.kind for g in spec_mod.layers(sp)}
        for n in batches:
            try:
                got = layer_pass_times(sp, n, repeats=repeats, gap=gap)
            except Exception as e:    # kernels still missing
                (skipped if skipped is not None else []).append(f"layer passes {name}: {type(e).__name__}: {e}")
                break
            for (layer, pas), (t, s) in got.items():
                recs.append({"kind": "layer_pass", "model": name, "spec": sp.to_dict(), "n_subbatch": n,
                             "layer": layer, "layer_kind": kinds[layer], "pass": pas, "t": t, "std": s,
                             "clock": CLOCK["name"], "holdout": n == held or name in LAYER_PASS_HELDOUT,
                             "l2_bytes": cache_bytes(2), **({"gap": gap, "source": "gapped"} if gap else {})})
    return recs


# The idle gap before each step of ``sweep_gapped_layer_passes``, its batch
# sizes (the middle one held out) and steps per point.
GAP_SECONDS, GAP_BATCHES, GAP_REPEATS = 0.03, (2, 8, 32), 31


def sweep_gapped_layer_passes(cfg, skipped=None):
    """``layer_pass`` records (``source`` "gapped", with their ``gap``) of
    ``LAYER_PASS_NETS`` with ``GAP_SECONDS`` of idle spin before each step.

    The plain sweep's nets step in 0.3-15 ms; the nets users train (test
    sets 9-12: 10-40 ms) leave each layer's weights and gradient a step
    older, and on this VM the caches empty with age (``cache_decay``):
    heldout-k5d's fc1 dW GEMM ran 347 us in its step against 53 us alone.
    Without old data in the records the refill terms (``l2_refill``) are
    fitted on shares of 0.02-0.3 and cannot be told from ``f``. 70 s
    (2026-12-01 23:41 UTC). Opt-in (``sweep.OPT_IN``)."""
    return sweep_layer_passes(cfg, skipped, gap=GAP_SECONDS, batches=GAP_BATCHES, repeats=GAP_REPEATS)
