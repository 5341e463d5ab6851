"""Is this profile about this machine? Its fingerprint and a short calibration.

``sprint profile`` stores in the profile the machine it measured (CPU model,
cores, memory, the Python/numpy/BLAS it ran) and the time of a fixed,
one-thread calibration workload (``calibration_step``). Before
``predict``/``tune``/``simulate`` use a profile, ``check`` runs the same
workload for a couple of seconds and rescales the profile's per-unit times
by the geometric mean of the whole workload's and the compute part's
measured ratios and its per-call times by the Python part's
(``RESCALES``), each shrunk toward 1 by how far it is to be believed
(``Profile.time_scale``, ``call_scale``); when the fingerprint
differs, or a part runs slower or faster than the stored time by more than
the noise, it also says so. A profile without a fingerprint (written
before this check existed) is reported as unverifiable.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .fingerprint import MACHINE_KEYS, differing, fingerprint, profiles_here
from .host_steadiness import note as steadiness_note, window_spread
from .sweep_drift import profile_note

# Below this relative difference a calibration's ratio is applied without a
# warning (shared 2-core VM: runs of one configuration spread by 5-8 %).
MIN_NOISE = 0.10


def _compute_part(rng):
    """One training step of the ``cifar`` net at batch 1 (about 25 ms): the
    convolution kernels, pooling and a 3.2 M-parameter FC that compute-bound
    nets spend their steps in. In session 13 the host's compute-heavy steps
    drifted 10-15 % within an hour while the kernel part (an L2-sized GEMM
    and a copy) read within 1 % (bench/RESULTS.md, test set 11), and cifar's
    one-thread step followed them. In 20 live rounds of session 14
    (bench/calibration_drift.py --live, 20:35-21:43 UTC, the host slowing
    by 15 %) both tracked: the spread of log(cifar's runner T_GPU / part),
    over the five calls' medians, was 1.6 % with this step and 2.4 % with
    the kernel part (6.3 % unscaled), but over seen heldout-d4's and
    heldout-d8's one-thread steps 2.7 and 3.9 % against 1.7 and 2.2 %. It
    is timed where the profile's calibration recorded it and said, but
    rescales nothing (``RESCALES``): from cpu_test17's records to
    cpu_test18's it read x0.86 where the nets' times moved x0.82-0.85."""
    from engine.net import Net
    from engine.spec import get_spec
    sp = get_spec("cifar")
    net = Net(sp, seed=0)
    x = rng.standard_normal((1,) + sp.input_shape).astype(np.float32)
    y = rng.integers(0, sp.n_classes, 1)
    return lambda: net.loss_and_grad(x, y)


def _workload():
    """The fixed calibration workload as three parts, each one call: a
    mid-size SGEMM with a flat copy larger than L2 (``kernel``: flops and
    memory), a step of the ``tiny`` net (``python``: per-call Python and
    fixed costs) -- the kinds of cost the model prices per unit and per
    call -- and a compute-bound net step (``compute``, ``_compute_part``)."""
    from engine import ops
    from engine.net import Net
    from engine.spec import get_spec
    rng = np.random.default_rng(0)
    a = rng.standard_normal((192, 192)).astype(np.float32)
    b = rng.standard_normal((192, 192)).astype(np.float32)
    c = np.empty((192, 192), np.float32)
    src = rng.standard_normal(1 << 20).astype(np.float32)
    dst = np.empty_like(src)
    sp = get_spec("tiny")
    net = Net(sp, seed=0)
    x = rng.standard_normal((8,) + sp.input_shape).astype(np.float32)
    y = rng.integers(0, sp.n_classes, 8)

    def kernel():
        ops.gemm(a, b, out=c)
        np.copyto(dst, src)

    def python():
        net.loss_and_grad(x, y)
    return kernel, python, _compute_part(rng)


# Seconds of one calibration, the same wherever one is taken (sprint profile's
# record, predict/tune/simulate/plan's check, validate_model's passes): its
# blocks' spread, and so how much of a ratio is believed (``_weight``),
# depends on its length.
SECONDS = 3.0
# The parts of the calibration, each rescaling its kind of cost (Profile.time_scale / call_scale).
PARTS = ("kernel_s", "python_s", "compute_s")
# Share of each block given to the compute part (timed apart: its steps are long).
COMPUTE_SHARE = 1 / 3


def calibration_step(seconds: float = SECONDS, blocks: int = 5, compute: bool = True) -> dict:
    """Wall and CPU seconds per call of the calibration workload on one
    thread, run for ``seconds``; ``kernel_s``, ``python_s`` and
    ``compute_s``: the wall seconds of its parts per call (without
    ``compute``, the compute part is not run: the calibration then takes
    ``1 - COMPUTE_SHARE`` of ``seconds``).

    ``wall_s`` is throughput (elapsed / calls of the kernel and Python parts,
    run in turn), not a median: on a shared host most calls fit in one
    scheduler slice and a few wait for whole slices, and a long run pays for
    both. ``u`` (and ``u_kernel``, ``u_python``, ``u_compute``): relative
    uncertainty of ``wall_s`` (of each part), from the spread of its
    ``blocks`` consecutive blocks. The compute part runs alone for
    ``COMPUTE_SHARE`` of each block, after the other two.

    The parts are timed apart because they drift apart: on test set 5's
    night (bench/RESULTS.md section 4) the whole workload ran x0.96 its
    stored time while Python-bound runner steps ran x0.66; one ratio for
    both rescales per-call costs by the kernels' drift.
    """
    from .timing import set_threads
    set_threads(1)
    kernel, python, step = _workload()
    for _ in range(3):
        kernel()
        python()
    per_block = seconds / blocks
    walls, cpus, parts, n = [], [], {k: [] for k in PARTS if compute or k != "compute_s"}, 0
    starts, pairs = [], []      # each kernel + Python call: its start and length (host_steadiness)
    if compute:
        step()
    clock = time.perf_counter
    for _ in range(blocks):
        calls, t0, c0, tk, tp = 0, clock(), time.thread_time(), 0.0, 0.0
        while clock() - t0 < per_block * (1 - COMPUTE_SHARE) or calls < 2:
            t1 = clock()
            kernel()
            t2 = clock()
            python()
            t3 = clock()
            tk, tp = tk + t2 - t1, tp + t3 - t2
            starts.append(t1)
            pairs.append(t3 - t1)
            calls += 1
        walls.append((clock() - t0) / calls)
        cpus.append((time.thread_time() - c0) / calls)
        parts["kernel_s"].append(tk / calls)
        parts["python_s"].append(tp / calls)
        n += calls
        if compute:
            k, t0 = 0, clock()
            while clock() - t0 < per_block * COMPUTE_SHARE or k < 2:
                step()
                k += 1
            parts["compute_s"].append((clock() - t0) / k)
    u = lambda v: float(np.std(v, ddof=1) / np.mean(v) / np.sqrt(blocks))
    w = float(np.mean(walls))
    out = {"wall_s": w, "cpu_s": float(np.mean(cpus)), "u": u(walls), "n": n,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for k, v in parts.items():
        out[k] = float(np.mean(v))
        out["u_" + k.split("_")[0]] = u(v)
    if steady := window_spread(starts, pairs):
        out["steadiness"] = steady
    return out


def merge_calibrations(cals) -> dict:
    """One calibration of several taken on one machine (a sweep's before and
    after): their means, their combined uncertainty, and ``drift``, how far
    the last moved from the first (noise of the same machine too)."""
    both = dict(cals[-1], **{k: float(np.mean([c[k] for c in cals])) for k in ("wall_s", "cpu_s") + PARTS
                             if all(k in c for c in cals)})
    for u in ("u",) + tuple("u_" + k.split("_")[0] for k in PARTS):
        if all(u in c for c in cals):
            both[u] = float(np.sqrt(np.sum([c[u] ** 2 for c in cals])) / len(cals))
    return dict(both, n=sum(c["n"] for c in cals), drift=float(abs(cals[-1]["wall_s"] / cals[0]["wall_s"] - 1)),
                before=cals[0], after=cals[-1])


def record(seconds: float = SECONDS) -> dict:
    """The fingerprint with a calibration: what ``sprint profile`` stores."""
    fp = fingerprint()
    fp["calibration"] = calibration_step(seconds)
    return fp


@dataclass
class Check:
    """Result of comparing this machine with a profile's."""
    scale: float = 1.0                 # times to multiply the profile's times by
    messages: list = field(default_factory=list)
    differs: dict = field(default_factory=dict)    # fingerprint key -> (profile's, this machine's)
    ratio: float | None = None         # calibration now / then (wall clock)
    noise: float = MIN_NOISE
    # Per-call costs' factor (from the Python part) when the calibrations
    # timed their parts apart; None: the same as ``scale``.
    call_scale: float | None = None
    parts: dict = field(default_factory=dict)      # part -> ratio now / then
    weights: dict = field(default_factory=dict)    # part -> how much of its ratio (in log) is applied
    bands: dict = field(default_factory=dict)      # part -> its ratio's noise band (``_noise``)
    now: dict | None = None            # the fresh calibration (check), to judge another profile by
    # Said beside the warnings, not as one: the host's speed is unsteady (host_steadiness).
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.messages

    def apply(self, profile):
        """Rescale ``profile``: per-unit costs by ``scale``, per-call costs by
        ``call_scale`` (by ``scale`` too where the parts were not timed apart)."""
        if self.scale != 1.0:
            profile.time_scale = self.scale
        if self.call_scale is not None:
            profile.call_scale = self.call_scale


# Relative standard deviation of one calibration's ratio from call to call
# (``whole``: its wall time; else a part's), which its blocks' spread (``u``)
# does not see: session 16 (h17C), 3-s calibrations under cpu-exclusive,
# 12 back to back and 13 interleaved with 2.5-s runs of seen nets
# (bench/calibration_transfer.py --live, 02:49-03:14 UTC, host x1.1-1.6 slow):
# kernel part 1.9-3.1 %, Python part 3.7-6.6 %, compute part 1.2-4.0 %,
# wall 2.9-5.0 %, 3-4x the blocks' u (0.6 % and 1-4 %).
CALL_SPREAD = {"whole": 0.04, "kernel": 0.023, "python": 0.055, "compute": 0.035}


def _noise(then, now, key="u"):
    """The band beyond which a ratio is said (a warning): three sigma of the
    two measurements' combined uncertainty with the call-to-call spread of
    a calibration (``CALL_SPREAD``), at least MIN_NOISE; the profile's own
    drift between its before and after calibrations is noise of the same
    machine too. Only what is said: the ratio's weight (``_weight``) keeps
    the blocks' uncertainty alone, since shrinking by the call-to-call
    spread scored worse on the seen sets (calibration_drift.py --history,
    T_GPU mean of the sets 13.1 -> 13.3 %)."""
    spread = CALL_SPREAD["whole" if key == "u" else key[2:]]
    sd = np.sqrt(then.get(key, 0.0) ** 2 + now.get(key, 0.0) ** 2 + spread ** 2)
    return max(MIN_NOISE, 3.0 * float(sd), _drift(then, key))


def _drift(then, key="u") -> float:
    """The profile's own drift between its before and after calibrations:
    the whole workload's (``drift``), for a part its own where that moved
    further. Set 34's sweep (cpu_test34, 2026-12-07) closed with the
    compute part (a cifar step, memory-bound: 13 MB of FC weights) at 85.8
    ms against 41.0 at its start, the kernel part 6 % apart; their mean
    stood for every record, the part's ratio (x0.70 at the runs, which read
    41-45 ms) was believed whole, and every calibrated price came out 16 %
    short (T_GPU 13.4 % off, 5.3 % uncalibrated)."""
    d = float(then.get("drift", 0.0))
    part = {"u_" + k.split("_")[0]: k for k in PARTS}.get(key)
    b, a = then.get("before") or {}, then.get("after") or {}
    if part and b.get(part) and a.get(part):
        d = max(d, abs(a[part] / b[part] - 1))
    return d


def _weight(then, now, ratio, key="u") -> float:
    """How much of a ratio to believe: d^2 / (d^2 + s^2), d its log, s its
    uncertainty (both measurements' and half the profile's own drift between
    its before and after calibrations). A ratio far beyond its noise is
    applied whole, one at its noise half, 1 not at all: shrunk toward 1
    rather than cut at a band, because the nets feel a 5 % drift as much as
    a 15 % one. On the saved validation runs of the fitted grid and sets
    6-10 (576 runs, each against its own pass's calibration) T_GPU's mean
    |error| was 11.6 % with the 10 % band, 11.1 % so, 13.6 % unscaled."""
    d2 = float(np.log(ratio)) ** 2
    s2 = then.get(key, 0.0) ** 2 + now.get(key, 0.0) ** 2 + (_drift(then, key) / 2) ** 2
    return d2 / (d2 + s2) if d2 > 0 else 0.0


# Which ratio rescales which costs, the first one both calibrations timed:
# per-unit costs (``scale``) by the geometric mean of the whole workload's
# (``wall_s``: the kernel and Python parts run in turn) and the compute
# part's (a compute-bound net step), each shrunk by its weight; per-call
# costs (``call_scale``) by the Python part's. A net's per-unit costs are
# both kinds: GEMM-bound layer passes, which drift with the compute part,
# and short kernels and vector steps, which drift with the whole workload.
# On one day each part alone missed in turn. Session 19 (h19C, cpu_test14
# to cpu_test18's records against sets 9-15) chose the whole workload over
# the kernel part (84.7 -> 58.8 summed T_GPU error on sets 9-13); session 22
# (2026-12-02 21:44 UTC, bench/calibration_pairs.py's rows; 12 pairs of a
# profile and a seen set that both timed the compute part: cpu_test17 and
# cpu_test18 with sets 15-16, cpu_test19c with 17-18, cpu_test21 and the
# refit cpu_test22 with 19-21) scored T_GPU's mean |error|, the mean over
# the pairs: unscaled 13.1 %, whole workload 8.6 %, compute part 9.1 %,
# their geometric mean 7.4 % (better on 7 pairs, by up to 7.8 points where
# the compute step drifted apart from the kernels: cpu_test22 with set 19
# x1.44 against x1.07, 13.2 -> 5.4 %; worse on 5 by 0.1-3.0 points, most on
# the AMD VM's set 17: 12.5 -> 14.5 %).
RESCALES = {"scale": ("whole+compute", "whole"), "call_scale": ("python",)}


def _split(then, now, chk, whole):
    """Each part's ratio, shrunk by its weight (``_weight``), beside the whole
    workload's (``whole``, shrunk as ``compare`` did), and which rescales what
    (``RESCALES``). Both calibrations must have timed the kernel and Python
    parts (profiles swept before they were: one ratio)."""
    if not all(then.get(k) and now.get(k) for k in ("kernel_s", "python_s")):
        return None
    scales = {"whole": whole}
    for k in PARTS:
        if not (then.get(k) and now.get(k)):
            continue
        tag = k.split("_")[0]
        r = now[k] / then[k]
        w = _weight(then, now, r, "u_" + tag)
        chk.parts[tag], chk.weights[tag] = float(r), float(w)
        scales[tag] = float(r ** w)
    if "compute" in scales:
        scales["whole+compute"] = float(np.sqrt(whole * scales["compute"]))
    return {what: scales[next(t for t in tags if t in scales)] for what, tags in RESCALES.items()}


def compare(stored: dict | None, now: dict | None, calibration: dict | None, source: str = "profile") -> Check:
    """Compare a profile's ``stored`` fingerprint with this machine's ``now``
    and a fresh ``calibration``. ``scale`` is the calibration ratio shrunk
    toward 1 by its weight (``_weight``); when both calibrations timed their
    parts (``PARTS``), ``call_scale`` is the Python part's, by its own weight
    (``RESCALES``). A ratio beyond the noise (``_noise``) is also said, with
    what it rescales."""
    chk = Check()
    if not stored:
        chk.messages.append(f"{source} records no machine fingerprint or calibration (written before "
                            "profiles carried one): it cannot be checked against this machine; run "
                            "`sprint profile --quick` for a profile of this one")
        return chk
    if now:
        chk.differs = differing(stored, now)
        if chk.differs:
            what = "; ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in chk.differs.items())
            from .profile import shown_path
            here = profiles_here(now) if any(k in chk.differs for k in MACHINE_KEYS) else []
            # a checkout may already hold profiles of this machine: name the newest sweep
            named = (f" (this checkout has {len(here)} profile(s) of this machine's CPU; the newest sweep: "
                     f"--profile {shown_path(here[0][1])}, {here[0][0] or 'undated'})") if here else ""
            chk.messages.append(f"{source} was measured on another machine or software ({what}); "
                                f"run `sprint profile --quick` for a profile of this one{named}")
    then = stored.get("calibration")
    if calibration and then and then.get("wall_s") and calibration.get("wall_s"):
        ratio = calibration["wall_s"] / then["wall_s"]
        chk.noise = _noise(then, calibration)
        chk.ratio = float(ratio)
        chk.weights["whole"] = _weight(then, calibration, ratio)
        whole = float(ratio ** chk.weights["whole"])
        split = _split(then, calibration, chk, whole)
        if split is not None:
            chk.scale, chk.call_scale = split["scale"], split["call_scale"]
            chk.bands = {t: _noise(then, calibration, "u_" + t) for t in chk.parts}
            said = any(abs(r - 1.0) > chk.bands[t] for t, r in chk.parts.items())
        else:
            chk.scale = whole
            said = abs(ratio - 1.0) > chk.noise
        if said:
            cpu = calibration.get("cpu_s", 0) / then["cpu_s"] if then.get("cpu_s") else None
            # Wall time beyond the CPU time is time without a core: other
            # jobs. CPU time that moved with the wall time is the cores'
            # own speed, either way (it said 'other jobs load the host' of
            # a host running x0.90 in both).
            loaded = cpu is not None and cpu > 0 and ratio > 1 and ratio / cpu > 1 + chk.noise
            why = "" if not cpu else f"; CPU time x{cpu:.2f}, so " + (
                "other jobs load the host" if loaded else
                f"the cores themselves run {'faster' if cpu < 1 else 'slower'}")
            named = {"kernel": "kernels", "compute": "compute step", "python": "per-call Python"}
            how = (f"every time is rescaled by x{chk.scale:.2f}" if split is None else
                   ", ".join(f"{named[t]} x{r:.2f} (noise +-{100 * chk.bands[t]:.0f} %)"
                             for t, r in chk.parts.items()) +
                   f": per-unit costs are rescaled by x{chk.scale:.2f}, per-call costs by x{chk.call_scale:.2f}")
            chk.messages.append(
                f"this machine runs the calibration workload in {ratio:.2f}x the time stored in {source} "
                f"({1e3 * calibration['wall_s']:.2f} ms now, {1e3 * then['wall_s']:.2f} ms on "
                f"{then.get('date', '?')}, noise +-{100 * chk.noise:.0f} %{why}; {how}); "
                "`sprint profile --quick` measures this machine as it is now")
    elif calibration is not None:
        chk.messages.append(f"{source} has no calibration time: its speed cannot be checked against this "
                            "machine's; run `sprint profile --quick`")
    if said := steadiness_note(calibration):
        chk.notes.append(said)
    return chk


def check(profile, seconds: float = SECONDS, apply: bool = True) -> Check:
    """Calibrate now (``seconds``), compare with ``profile``'s machine and,
    with ``apply``, rescale it (``profile.time_scale``)."""
    stored = profile.data.get("fingerprint")
    if profile.data.get("backend", "cpu") != "cpu":
        # A GPU profile's times are the device's: a CPU workload says nothing about it.
        chk = compare(stored, fingerprint(), None, profile.source)
    else:
        # The compute part only where the profile recorded it: nothing to compare it with otherwise.
        has = bool(((stored or {}).get("calibration") or {}).get("compute_s"))
        now = calibration_step(seconds, compute=has) if stored else None
        chk = compare(stored, fingerprint(), now, profile.source)
        chk.now = now
        # The marks are the host CPU's speed during the sweeps: said for a CPU profile only.
        if said := profile_note(profile.data.get("sweep") or {}, profile.source):
            chk.notes.append(said)
    if apply:
        chk.apply(profile)
    return chk
