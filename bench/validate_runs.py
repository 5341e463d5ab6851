"""The runs and predictions of bench/validate_model.py: one SPRINT ASGD run
per configuration under mpiexec, the quantities it measured, the model's
prediction for it (closed form, simulation, the calibrated re-prediction,
the measured-layers one), the in-process layer passes, and the merging of
saved validations."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

# Samples in the synthetic training sets: large enough that no epoch ends
# (an epoch end evaluates the test set inside the updater loop).
N_TRAIN = {"tiny": 200_000, "digits": 100_000, "cifar": 20_000}
DEFAULT_SUB = {"tiny": (1, 8, 32), "digits": (1, 8, 32), "cifar": (1, 4, 16)}


def safe_name(model) -> str:
    """The net's spec name: a preset's name, or a spec file's (for paths)."""
    from engine.spec import get_spec
    return get_spec(model).name


def make_data(name, path):
    from engine.perf.sweep import synthetic_npz
    n = N_TRAIN.get(safe_name(name), 20_000)
    synthetic_npz(name, path, n)
    return n


def run_config(model, data, n_node, n_gpu, sub, seconds, workdir, timeout, rep=0):
    """One run in a folder of its own per pass: a run folder that holds a
    trained run is refused (sprint: error: already holds a trained run), so
    a second pass into the first one's folder failed."""
    from engine.perf.sweep import runner_job
    return runner_job(model, data, sub, n_node, n_gpu, seconds,
                      Path(workdir) / f"{safe_name(model)}-n{n_node}-g{n_gpu}-s{sub}-p{rep}",
                      timeout)


def measured(st, n_file):
    """The quantities of the model from one asgd_stats.json."""
    from engine.perf.sweep import runner_step_means
    steps, upd = runner_step_means(st["timers"])
    # T_Epoch by SPEC eq. (10), N_File T_Update / N_Minibatch_avg: a run of a
    # few seconds has start-up and stop edges a real epoch does not; the
    # wall-clock rate is kept as T_Epoch_wall.
    return {"T_GPU": st["T_GPU"], "T_Update": st["T_Update"],
            "T_Epoch": n_file * st["T_Update"] / st["N_Minibatch_avg"] if st.get("N_Minibatch_avg") else None,
            "T_Epoch_wall": n_file * st["wall_s"] / st["samples"] if st.get("samples") else None,
            "N_Minibatch_avg": st["N_Minibatch_avg"], "staleness": st["staleness_mean"],
            "steps": steps, "updater": upd, "updates": st["updates"], "samples": st["samples"],
            "T_GPU_median": st.get("T_GPU_median"), "T_Update_median": st.get("T_Update_median")}


def predicted(model, n_node, n_gpu, sub, prof, n_file, sim=True, host=None):
    """Closed form (+ simulation) for one run. ``host``: the machine-load
    factor probed just before the run (None: the one stored at sweep time)."""
    from engine.perf import model as M
    from engine.perf.simulate import simulate
    prof.host_factor = {} if host is None else {model: host}
    impl = M.RUNNER_SWEEP_IMPL
    p = M.predict(model, n_node, n_gpu, sub, prof, n_file=n_file, ranks_per_host=n_node, impl=impl)
    out = {"T_GPU": p.t_gpu, "T_Update": p.t_update, "T_Epoch": p.t_epoch,
           "N_Minibatch_avg": p.n_minibatch_avg, "staleness": p.staleness, "steps": dict(p.worker),
           "host_factor": host, "slowdown": p.slowdown, "updater": dict(p.updater)}
    if sim:
        s = simulate(model, n_node, n_gpu, sub, prof, n_updates=300, min_worker_steps=600, n_file=n_file,
                     ranks_per_host=n_node, impl=impl, seed=1, slowdown=p.slowdown)
        out["sim"] = {"T_GPU": s.t_gpu, "T_Update": s.t_update, "T_Epoch": s.t_epoch,
                      "N_Minibatch_avg": s.n_minibatch_avg, "staleness": s.staleness}
    return out


def layer_times(model, sub, prof, repeats=41):
    """Measured vs modelled forward/backward time of each layer (one thread,
    in-process): the median of ``repeats`` steps (7 until test set 5: the
    passes of small layers scatter between steps by a standard deviation of
    20-100 % of their median, as large as the per-layer target)."""
    from engine.perf.sweep import layer_pass_times, set_threads
    from engine.spec import get_spec
    set_threads(1)
    sp = get_spec(model)
    # One thread: its CPU time, the clock of the profile's sweeps.
    got = layer_pass_times(sp, sub, repeats=repeats, clock=time.thread_time)
    pred = layer_predictions(model, sub, prof)
    out = []
    for k, v in got.items():
        key = (k[0], "forward" if k[1] == "fwd" else "backward")
        out.append({"model": model, "n_subbatch": sub, "layer": key[0], "pass": key[1],
                    "measured": v[0], "predicted": pred.get(key, 0.0)})
    return out


def layer_predictions(model, sub, prof) -> dict:
    """{(layer, "forward"|"backward"): seconds} the model prices for each layer pass."""
    from engine.perf.model import compute_gradient_terms
    from engine.spec import get_spec
    pred = {}
    for name, pas, _, _, t in compute_gradient_terms(get_spec(model), sub, prof):
        if pas == "loss":          # the softmax runs between the passes, outside every layer
            continue
        for k in (("fwd", "bwd") if pas == "fwd+bwd" else (pas,)):
            key = (name, "forward" if k == "fwd" else "backward")
            # An older profile's per-layer overhead: half each way.
            pred[key] = pred.get(key, 0.0) + (t / 2 if pas == "fwd+bwd" else t)
    return pred


def repredict(d, profile, sim=True):
    """Replace the predictions of a saved validation ``d`` by ``profile``'s."""
    from engine.perf.profile import Profile
    prof = Profile.load(profile)
    for r in d["rows"]:
        n_file = row_n_file(r)
        p = predicted(r["model"], r["n_node"], r["n_gpu"], r["n_subbatch"], prof, n_file, sim=sim)
        r.pop("simulated", None)
        if "sim" in p:
            r["simulated"] = p.pop("sim")
        r["predicted"] = p
    for l in d["layers"]:
        l["predicted"] = layer_predictions(l["model"], l["n_subbatch"], prof).get((l["layer"], l["pass"]), 0.0)


def row_n_file(r) -> int:
    """The training-set size a saved row was run and predicted with. Not
    from its measured medians: T_Epoch, N_Minibatch_avg and T_Update are
    each the median of the runs, often of different runs, so their ratio
    missed N_File by up to 2 % and re-predictions moved T_Epoch by as much."""
    return int(r.get("n_file") or N_TRAIN.get(safe_name(r["model"]), 20_000))


def merge_runs(ds):
    """One validation from several saved ones (rows, layers, failures and
    calibrations together; the calibration scale is their median)."""
    if len(ds) == 1:
        return ds[0]
    out = {"rows": [], "layers": [], "failed": [], "calibrations": []}
    for d in ds:
        for k in out:
            out[k] += d.get(k) or []
    ratios = [c["ratio"] for c in out["calibrations"] if c.get("ratio")]
    out["calibration_scale"] = float(np.median(ratios)) if ratios else None
    out["parts"] = [{k: d.get(k) for k in ("profile", "argv", "date", "calibrated_scales")} for d in ds]
    out["anchor_passes"] = merge_anchors(ds)
    return out


def saved_calibrated(d):
    """``calibrated()``'s triple from a saved validation whose every row kept
    its calibrated prediction (validate_model.py writes them): each part's
    rows as its own passes' calibration rescaled them, and the median of the
    parts' (per-unit, per-call) scales, with a note saying so when there are
    several; None for runs saved before they were kept."""
    if not d["rows"] or not all(r.get("calibrated") for r in d["rows"]):
        return None
    scales = [p["calibrated_scales"] for p in d.get("parts") or [d] if p.get("calibrated_scales")]
    if not scales:
        return None
    rows = [dict(r, predicted=dict(r["predicted"], **r["calibrated"])) for r in d["rows"]]
    return _by_parts(rows, scales)


def _by_parts(rows, scales):
    """``(rows, per-unit, per-call)``: the median of the parts' (per-unit,
    per-call) ``scales``, with the report's note when there are several."""
    k, kc = (float(np.median([s[i] for s in scales])) for i in (0, 1))
    return (rows, k, kc) + (("median of each part's passes, shown: their median",) if len(scales) > 1 else ())


def median_runs(ms):
    """One measurement per configuration: the median of its runs, per
    quantity and per step."""
    out = {}
    for k, v in ms[0].items():
        if isinstance(v, dict):
            out[k] = {s: float(np.median([m[k].get(s, 0.0) for m in ms])) for s in v}
        elif isinstance(v, (int, float)) and v is not None:
            vals = [m[k] for m in ms if m.get(k) is not None]
            out[k] = float(np.median(vals)) if vals else None
        else:
            out[k] = v
    return out


def swept_nets(prof) -> set:
    """Nets whose timings any sweep of ``prof`` used: the net-step and
    layer-shape sweeps and the contention sweeps."""
    sw = prof.data.get("sweep", {})
    nets = set(sw.get("nets", ("tiny", "digits", "cifar"))) | set(sw.get("layer_nets", ("tiny", "digits", "cifar",
                                                                                         "cnn-a")))
    nets |= set(sw.get("layer_pass_nets", ()))
    nets |= {e.get("model") for e in prof.data.get("contention", {}).get("entries", [])}
    return nets


def group_of(model, prof) -> str:
    from engine.spec import get_spec
    return "fitted grid" if get_spec(model).name in swept_nets(prof) else "held-out nets"


def rescaled_profile(prof, cals):
    """``(prof rescaled as sprint predict would after its calibration,
    per-unit scale, per-call scale)``: by the median over ``cals`` of the
    scales each calibration applied (``calibrate.RESCALES``: the whole
    workload's ratio and its Python part's); None when no calibration timed the parts apart. A
    calibration that kept its measurement (``now``) is judged against
    ``prof``'s own stored one (``calibrate.compare``, the rule ``check``
    applies): its saved scales are against the profile of the run, which
    ``--repredict`` may have replaced. The one rescaling of the rows
    (``calibrated``) and of the layer passes (``calibrate_layers``)."""
    from engine.perf.calibrate import compare
    from engine.perf.profile import Profile
    stored = prof.data.get("fingerprint")
    cals = [c if not (c.get("now") and stored) else
            vars(compare(stored, None, c["now"])) for c in cals]
    split = [c for c in cals if c.get("call_scale") is not None]
    if not split:
        return None
    p = Profile(prof.data, prof.source)
    p.time_scale = float(np.median([c["scale"] for c in split]))
    p.call_scale = float(np.median([c["call_scale"] for c in split]))
    return p, p.time_scale, p.call_scale


def calibrated(rows, prof, cals, sim=False):
    """``(rows predicted as sprint predict would after its calibration,
    per-unit scale, per-call scale)``, the profile rescaled by
    ``rescaled_profile`` over the passes' calibrations; None when the
    calibrations did not time the parts apart or applied nothing."""
    got = rescaled_profile(prof, cals)
    if got is None or got[1:] == (1.0, 1.0):
        return None
    p, k, kc = got
    out = []
    for r in rows:
        n_file = row_n_file(r)
        out.append(dict(r, predicted=predicted(r["model"], r["n_node"], r["n_gpu"], r["n_subbatch"], p, n_file,
                                               sim=sim)))
    return out, k, kc


def calibrated_by_part(ds, prof, sim=False):
    """``calibrated()`` over saved validations ``ds`` (one grid run in
    parts), each part's rows rescaled by its own passes' calibrations, as
    validate_model.py rescaled them when it ran them (``saved_calibrated``):
    so that ``--rescore --repredict`` with the runs' own profile gives the
    numbers the runs gave. One median over all the parts' calibrations
    instead moved set 28's calibrated T_GPU from 10.3 to 11.0 %. The
    (per-unit, per-call) scales shown are the parts' median; None when a
    part's calibrations give none."""
    got = [calibrated(d["rows"], prof, d.get("calibrations") or [], sim=sim) for d in ds]
    if not got or any(g is None for g in got):
        return None
    return _by_parts([r for g in got for r in g[0]], [g[1:] for g in got])


# Where a layer pass's calibration came from (the ``calibration`` of each
# layer row, said in the report).
LAYER_CAL_BEFORE = "before the passes"
LAYER_CAL_FIRST = "the first pass's, after the passes"


def layer_calibration(d):
    """``(calibration, how)`` the layer passes of a saved validation ``d``
    are rescaled by: the one validate_model.py takes just before it times
    them (``layer_calibration``), else, in files written before it took one,
    the first pass's (taken right after the passes); None when there is none."""
    if d.get("layer_calibration"):
        return d["layer_calibration"], LAYER_CAL_BEFORE
    cals = d.get("calibrations") or []
    return (cals[0], LAYER_CAL_FIRST) if cals else None


def calibrate_layers(layers, prof, cal, how=LAYER_CAL_BEFORE):
    """Give each layer row its ``calibrated`` prediction: its pass priced by
    ``prof`` rescaled by calibration ``cal`` as sprint predict rescales its
    per-layer table (``rescaled_profile``), and its ``calibration`` (scales
    and ``how``). Nothing when ``cal`` did not time its parts apart.

    The calibration's parts are timed on the wall clock (perf_counter), the
    passes on the thread's CPU time (``layer_times``), the clock of the
    sweeps the profile was fitted on. The ratio carries over on this host:
    in the 72 calibrations the validations of sets 8-13 stored, CPU time was
    0.997-1.000 of wall time, so the host's slow hours show in CPU time as
    much (the hypervisor's contention is counted as the thread's own time;
    the one calibration thread is not preempted). On a host where it is
    preempted the ratio would overstate the passes' slowdown, and
    ``cpu_s / wall_s`` of the calibration says so."""
    got = rescaled_profile(prof, [cal]) if cal else None
    for l in layers:
        l.pop("calibrated", None)
        l.pop("calibration", None)
    if got is None:
        return
    p, k, kc = got
    preds = {}
    for l in layers:
        key = (l["model"], l["n_subbatch"])
        if key not in preds:
            preds[key] = layer_predictions(l["model"], l["n_subbatch"], p)
        l["calibrated"] = preds[key].get((l["layer"], l["pass"]), 0.0)
        l["calibration"] = {"scale": k, "call_scale": kc, "how": how}


def measured_mode(rows, layers, prof, anchors=None):
    """Rows predicted as ``sprint predict --measure-layers`` would: each
    layer pass the in-process pass timed during the validation
    (``layer_times``), the rest of the model as it is; None when a row's
    net and batch size have no timed passes.

    ``anchors``: ``{"<spec hash> <n>": {"<layer> <pass>": seconds}}``, the
    passes of nets no row runs that the model times on first use (the nets
    of the profile's contention sweeps: tiny, cifar, mnist, digits and the
    long-step anchors). Read from it where it
    has them, and what was timed here is added to it: saved with the runs,
    a ``--rescore`` prices by the run's own passes, where timing them again
    moved its line by about a point from one rescore to the next."""
    from engine.perf.measure_layers import LayerMeasure
    from engine.perf.profile import Profile
    by = {}
    for l in layers:
        pas = "fwd" if l["pass"] == "forward" else "bwd"
        by.setdefault((l["model"], l["n_subbatch"]), {})[(l["layer"], pas)] = l["measured"]
    if not rows or any((r["model"], r["n_subbatch"]) not in by for r in rows):
        return None
    p = Profile(prof.data, prof.source)
    p.layer_measure = m = LayerMeasure()
    for key, t in (anchors or {}).items():
        h, n = key.rsplit(" ", 1)
        m.cache[(h, int(n))] = {tuple(k.rsplit(" ", 1)): float(v) for k, v in t.items()}
    for (net, n), t in by.items():
        m.put(net, n, t)
    had = set(m.cache)
    out = [dict(r, predicted=predicted(r["model"], r["n_node"], r["n_gpu"], r["n_subbatch"], p, row_n_file(r),
                                       sim=False)) for r in rows]
    if anchors is not None:
        for (h, n), t in m.cache.items():
            if (h, n) not in had:
                anchors[f"{h} {n}"] = {f"{l} {pas}": v for (l, pas), v in t.items()}
    return out


def merge_anchors(ds) -> dict:
    """The saved anchor passes (``measured_mode``) of several validations:
    each pass's median over the files that timed it."""
    got = {}
    for d in ds:
        for key, t in (d.get("anchor_passes") or {}).items():
            for k, v in t.items():
                got.setdefault(key, {}).setdefault(k, []).append(v)
    return {key: {k: float(np.median(v)) for k, v in t.items()} for key, t in got.items()}
