"""A profile knows its machine: fingerprint, calibration and rescaling
(oversubscribed sharings: test_perf_oversubscription.py)."""
import copy
import json
import math

import numpy as np
import pytest

from engine import cli
from engine import spec as spec_mod
from engine.perf import calibrate, model
from engine.perf.profile import Profile

from bench_scripts import load as load_bench

FP = {"cpu_model": "Xeon A", "cores": 2, "mem_gib": 23.5, "python": "3.11.7", "numpy": "2.4.6",
      "blas": "libopenblas.so", "backend": "cpu", "host": "vm",
      "calibration": {"wall_s": 0.010, "cpu_s": 0.009, "u": 0.01, "n": 100, "date": "then"}}


def _now(wall=0.010, cpu=0.009, **fp):
    here = {k: v for k, v in FP.items() if k != "calibration"}
    here.update(fp)
    return here, {"wall_s": wall, "cpu_s": cpu, "u": 0.01, "n": 100}


def _w(ratio, s2=2 * 0.01 ** 2):
    """A ratio's weight, d^2 / (d^2 + s^2) with d = log(ratio) (calibrate._weight):
    by default both calibrations' u = 0.01 and no drift."""
    d2 = math.log(ratio) ** 2
    return d2 / (d2 + s2)


def test_another_machines_profile_names_the_checkouts_profiles_of_this_one(tmp_path, monkeypatch):
    """The warning names the newest sweep among the checkout's profiles of
    this machine's hardware; none named when the checkout has none, or when
    only the software differs."""
    from engine.perf import profile as profile_mod
    here, cal = _now(cpu_model="Epyc B")
    mine = lambda date: {"terms": {}, "fingerprint": dict(here, calibration={"date": date})}
    (tmp_path / "old.json").write_text(json.dumps(mine("2026-12-01T10:00:00Z")))
    (tmp_path / "new.json").write_text(json.dumps(mine("2026-12-07T04:39:30Z")))
    (tmp_path / "new_records.json").write_text(json.dumps(mine("2026-12-08T00:00:00Z")))   # records: not a profile
    (tmp_path / "other.json").write_text(json.dumps({"terms": {}, "fingerprint": FP}))
    (tmp_path / "broken.json").write_text("{")
    monkeypatch.setattr(profile_mod, "CHECKOUT_PROFILES", tmp_path)
    msg = calibrate.compare(FP, here, cal).messages[0]
    assert "2 profile(s) of this machine's CPU" in msg and "new.json, 2026-12-07T04:39:30Z" in msg
    assert "old.json" not in msg
    soft, _ = _now(numpy="9.9")
    assert "this checkout has" not in calibrate.compare(FP, soft, cal).messages[0]
    monkeypatch.setattr(profile_mod, "CHECKOUT_PROFILES", tmp_path / "none")
    assert "this checkout has" not in calibrate.compare(FP, here, cal).messages[0]


def test_same_machine_within_noise_is_silent_but_applied_in_part():
    here, cal = _now(wall=0.0104)
    chk = calibrate.compare(FP, here, cal)
    assert chk.ok and chk.ratio == pytest.approx(1.04)
    # No dead band: the 4 % is applied, shrunk by its weight.
    assert chk.scale == pytest.approx(1.04 ** _w(1.04)) and 1.03 < chk.scale < 1.04


def test_edited_fingerprint_warns_and_names_the_difference():
    here, cal = _now(cpu_model="Epyc B", cores=4)
    chk = calibrate.compare(FP, here, cal)
    assert not chk.ok and set(chk.differs) == {"cpu_model", "cores"}
    assert "Epyc B" in chk.messages[0] and "sprint profile" in chk.messages[0]
    assert chk.scale == 1.0            # its speed agrees: nothing to rescale


def test_memory_a_rounding_apart_is_the_same_machine_and_another_size_is_not():
    """The kernel's reported memory moves by MiB (23.5 vs 23.6 GiB on two
    24-GiB Xeon VMs): not a difference; 16 vs 23.5 GiB is. Memory not read
    (0.0) is not compared."""
    for mem in (23.6, 23.4, 24.5, 0.0):
        here, cal = _now(mem_gib=mem)
        assert calibrate.compare(FP, here, cal).ok, mem
    for mem in (16.0, 47.0, 22.0):
        here, cal = _now(mem_gib=mem)
        chk = calibrate.compare(FP, here, cal)
        assert set(chk.differs) == {"mem_gib"} and "another machine" in chk.messages[0], mem


def test_a_cpu_named_alike_with_other_caches_is_another_machine():
    """The Xeon VM of 2026-12-06 read as the one of 12-02 by name, cores and
    flags, with a 300 MiB L3 instead of 480 MiB (and twice the calibration
    time): the cache sizes say it; a profile that kept none is not compared on them."""
    stored = dict(FP, l2_bytes=2 << 20, llc_bytes=480 << 20)
    here, cal = _now(l2_bytes=2 << 20, llc_bytes=300 << 20)
    chk = calibrate.compare(stored, here, cal)
    assert set(chk.differs) == {"llc_bytes"} and "another machine" in chk.messages[0]
    assert str(480 << 20) in chk.messages[0] and str(300 << 20) in chk.messages[0]
    assert calibrate.compare(FP, here, cal).ok            # FP predates the keys
    assert calibrate.compare(dict(stored, llc_bytes=300 << 20), here, cal).ok
    from engine.perf.fingerprint import fingerprint
    assert {"l2_bytes", "llc_bytes"} <= set(fingerprint())


def test_scaled_calibration_warns_and_rescales():
    here, cal = _now(wall=0.025, cpu=0.0093)
    chk = calibrate.compare(FP, here, cal)
    # Far beyond its noise: applied (almost) whole.
    assert chk.scale == pytest.approx(2.5 ** _w(2.5)) and chk.weights == {"whole": pytest.approx(_w(2.5))}
    assert "2.50x" in chk.messages[0] and "other jobs load the host" in chk.messages[0]
    assert "rescaled by x2.50" in chk.messages[0]
    here, cal = _now(wall=0.005, cpu=0.0045)
    chk = calibrate.compare(FP, here, cal)
    assert chk.scale == pytest.approx(0.5 ** _w(0.5)) and "cores themselves run faster" in chk.messages[0]
    # Wall and CPU time both x0.8: faster cores, not a load (the Xeon VM of
    # 2026-12-02 at x0.90 was told 'other jobs load the host').
    here, cal = _now(wall=0.008, cpu=0.008)
    chk = calibrate.compare(FP, here, cal)
    assert "cores themselves run faster" in chk.messages[0] and "other jobs" not in chk.messages[0]
    here, cal = _now(wall=0.013, cpu=0.013)
    assert "cores themselves run slower" in calibrate.compare(FP, here, cal).messages[0]


def test_weight_shrinks_an_uncertain_ratio_more():
    """The same 20 % ratio measured with more spread, or against a profile
    whose own two calibrations drifted apart, moves the costs less."""
    here, cal = _now(wall=0.012)
    sure = calibrate.compare(FP, here, cal).scale
    cal.update(u=0.05)
    unsure = calibrate.compare(FP, here, cal).scale
    drifted = calibrate.compare(dict(FP, calibration=dict(FP["calibration"], drift=0.1)), *_now(wall=0.012)).scale
    assert 1.0 < unsure < sure < 1.2 and 1.0 < drifted < sure
    assert unsure == pytest.approx(1.2 ** _w(1.2, 0.01 ** 2 + 0.05 ** 2))
    assert drifted == pytest.approx(1.2 ** _w(1.2, 2 * 0.01 ** 2 + 0.05 ** 2))


def test_noise_band_follows_the_measured_spread():
    # Blocks that spread widely: a 25 % difference is still noise (not said,
    # and applied only as far as its weight, small here).
    stored = dict(FP, calibration=dict(FP["calibration"], u=0.08))
    here, cal = _now(wall=0.0125)
    cal.update(u=0.08)
    chk = calibrate.compare(stored, here, cal)
    assert chk.ok and chk.noise > 0.25 and chk.scale == pytest.approx(1.25 ** _w(1.25, 2 * 0.08 ** 2))
    assert 1.0 < chk.scale < 1.25 ** 0.85
    # The profile's own drift between its two calibrations counts too.
    stored = dict(FP, calibration=dict(FP["calibration"], drift=0.3))
    assert calibrate.compare(stored, *_now(wall=0.0125)).ok


def test_profile_without_fingerprint_cannot_be_checked():
    chk = calibrate.compare(None, *_now())
    assert not chk.ok and "no machine fingerprint" in chk.messages[0]


def test_time_scale_multiplies_every_time():
    a = Profile.synthetic()
    b = Profile.synthetic()
    b.time_scale = 2.0
    pa, pb = model.predict("cifar", 4, 2, 8, a), model.predict("cifar", 4, 2, 8, b)
    for k in ("t_gpu", "t_update", "t_epoch", "t_barrier"):
        assert getattr(pb, k) == pytest.approx(2 * getattr(pa, k), rel=1e-6)
    assert pb.n_minibatch_avg == pytest.approx(pa.n_minibatch_avg, rel=1e-6)


def _parts(kernel, python, u=0.01):
    return {"kernel_s": kernel, "python_s": python, "u_kernel": u, "u_python": u}


def test_python_part_drifting_alone_rescales_per_call_costs_by_it():
    # Test set 5's night: the kernel part stayed, the Python-bound part ran
    # x0.65 -- per-call costs follow the part, per-unit ones the whole
    # workload's x0.86 (h19C: the nets' per-unit costs drift between the two).
    stored = dict(FP, calibration=dict(FP["calibration"], **_parts(0.006, 0.004)))
    here, cal = _now(wall=0.006 + 0.0026)
    cal.update(_parts(0.006, 0.0026))
    chk = calibrate.compare(stored, here, cal)
    assert chk.scale == pytest.approx(0.86 ** _w(0.86)) and chk.call_scale == pytest.approx(0.65 ** _w(0.65))
    assert chk.parts == pytest.approx({"kernel": 1.0, "python": 0.65})
    assert chk.weights == pytest.approx({"whole": _w(0.86), "kernel": 0.0, "python": _w(0.65)})
    assert not chk.ok and "per-call costs by x0.65" in chk.messages[0]
    # Both parts within their noise: silent, each applied by its weight.
    cal.update(_parts(0.0062, 0.0041))
    chk = calibrate.compare(stored, here, dict(cal, wall_s=0.0103))
    assert chk.ok and chk.scale == pytest.approx(1.03 ** _w(1.03)) and chk.scale > 1.02
    assert chk.call_scale == pytest.approx((0.0041 / 0.004) ** _w(0.0041 / 0.004)) and chk.call_scale > 1.01
    # A profile swept before the parts were timed: one ratio, as before.
    chk = calibrate.compare(FP, here, dict(cal, wall_s=0.02))
    assert chk.scale == pytest.approx(2.0 ** _w(2.0)) and chk.call_scale is None


def test_a_part_is_said_only_beyond_its_call_to_call_spread():
    """Blocks that agree (u 0.5 %) do not make a 3-s calibration repeatable:
    its Python part scatters by CALL_SPREAD["python"] from call to call. A
    Python part x1.12 is inside three of those (applied, not said); x1.25
    is said, with its band; a kernel part x1.12 is beyond its 10 % band."""
    band = 3 * math.sqrt(2 * 0.005 ** 2 + calibrate.CALL_SPREAD["python"] ** 2)
    assert 0.12 < band < 0.25
    stored = dict(FP, calibration=dict(FP["calibration"], **_parts(0.006, 0.004, u=0.005)))
    here, cal = _now(wall=0.006 + 0.00448)
    cal.update(_parts(0.006, 0.00448, u=0.005))
    chk = calibrate.compare(stored, here, cal)
    assert chk.ok and chk.bands["python"] == pytest.approx(band) and chk.bands["kernel"] == calibrate.MIN_NOISE
    assert chk.call_scale == pytest.approx(1.12 ** _w(1.12, 2 * 0.005 ** 2)) and chk.call_scale > 1.11
    cal.update(_parts(0.006, 0.005, u=0.005))
    chk = calibrate.compare(stored, here, dict(cal, wall_s=0.011))
    assert not chk.ok and f"per-call Python x1.25 (noise +-{100 * band:.0f} %)" in chk.messages[0]
    cal.update(_parts(0.00672, 0.004, u=0.005))
    chk = calibrate.compare(stored, here, dict(cal, wall_s=0.01072))
    assert not chk.ok and "kernels x1.12 (noise +-10 %)" in chk.messages[0]


def test_kernel_part_drifting_alone_rescales_only_per_unit_costs():
    """The mirror of the Python part's test, end to end: a calibration whose
    kernel part ran x1.5 and whose Python part did not (the whole workload
    x1.3) rescales a profile so that it predicts what a profile with every
    per-unit rate slowed x1.3^w and the same per-call costs predicts."""
    stored = dict(FP, calibration=dict(FP["calibration"], **_parts(0.006, 0.004)))
    here, cal = _now(wall=0.013)
    cal.update(_parts(0.009, 0.004))
    chk = calibrate.compare(stored, here, cal)
    s = 1.3 ** _w(1.3)
    assert chk.parts == pytest.approx({"kernel": 1.5, "python": 1.0})
    assert chk.scale == pytest.approx(s) and chk.call_scale == 1.0
    prof = Profile.synthetic(backend="cpu", launch=1e-4)
    chk.apply(prof)
    ref = Profile.synthetic(backend="cpu", launch=1e-4, sgemm_flop_s=1e10 / s, vec_bytes_s=5e9 / s,
                            allreduce_bw=1e9 / s, allreduce_lat=2e-5 * s, load_pixel=1e-9 * s, deform_pixel=2e-9 * s)
    assert prof.term("copy", 4096) == pytest.approx(ref.term("copy", 4096), rel=1e-12)
    assert prof.sgemm(64, 32, 16) == pytest.approx(ref.sgemm(64, 32, 16), rel=1e-12)
    assert prof.term("handover", 1) == pytest.approx(2e-4)            # a per-call cost: not rescaled
    for n_node in (1, 2):
        got = model.predict("tiny", n_node, 1, 4, prof, ranks_per_host=1)
        want = model.predict("tiny", n_node, 1, 4, ref, ranks_per_host=1)
        assert got.t_gpu == pytest.approx(want.t_gpu, rel=1e-9) and got.t_gpu > model.predict(
            "tiny", n_node, 1, 4, Profile.synthetic(backend="cpu", launch=1e-4), ranks_per_host=1).t_gpu
        assert got.t_update == pytest.approx(want.t_update, rel=1e-9)


def test_a_day_s_drift_rescales_a_synthetic_profile_by_known_factors():
    """The day between cpu_test14's and cpu_test17's records: kernel part
    x1.15, Python part x1.44, the whole workload (0.6 / 0.4 of its time)
    x1.266. A profile so calibrated predicts what a profile whose per-unit
    rates ran x1.266 slower and whose per-call costs x1.44 longer predicts;
    with blocks far tighter than the drift the ratios are applied whole."""
    stored = dict(FP, calibration=dict(FP["calibration"], u=1e-4, **_parts(0.006, 0.004, u=1e-4)))
    here, cal = _now(wall=0.006 * 1.15 + 0.004 * 1.44)
    cal.update(u=1e-4, **_parts(0.006 * 1.15, 0.004 * 1.44, u=1e-4))
    chk = calibrate.compare(stored, here, cal)
    assert chk.scale == pytest.approx(1.266, rel=1e-4) and chk.call_scale == pytest.approx(1.44, rel=1e-4)
    assert not chk.ok and "per-unit costs are rescaled by x1.27, per-call costs by x1.44" in chk.messages[0]
    prof = Profile.synthetic(backend="cpu", launch=1e-4)
    chk.apply(prof)
    s, c = chk.scale, chk.call_scale
    ref = Profile.synthetic(backend="cpu", launch=1e-4 * c, sgemm_flop_s=1e10 / s, vec_bytes_s=5e9 / s,
                            allreduce_bw=1e9 / s, allreduce_lat=2e-5 * s, load_pixel=1e-9 * s, deform_pixel=2e-9 * s)
    assert prof.sgemm(64, 32, 16) == pytest.approx(ref.sgemm(64, 32, 16), rel=1e-12)
    assert prof.term("copy", 4096) == pytest.approx(ref.term("copy", 4096), rel=1e-12)
    assert prof.term("handover", 1) == pytest.approx(c * 2e-4)        # a per-call cost: by the Python part
    bare = Profile.synthetic(backend="cpu", launch=1e-4)
    for n_node in (1, 2):
        got = model.predict("tiny", n_node, 1, 4, prof, ranks_per_host=1).t_gpu
        assert s * 0.999 < got / model.predict("tiny", n_node, 1, 4, bare, ranks_per_host=1).t_gpu < c * 1.001


def test_calibration_pairs_scores_planted_drift():
    """bench/calibration_pairs.py: rows whose measured times are exactly
    W U + P C (the whole workload's and the Python part's ratios of their
    passes' calibrations) score no error calibrated, and (U + C) / (W U + P C)
    - 1 unscaled; a set's scales are the median over all its files' passes."""
    cp = load_bench("calibration_pairs")
    then = dict(FP["calibration"], u=1e-4, **_parts(0.006, 0.004, u=1e-4))
    now = lambda k, p: dict(wall_s=0.006 * k + 0.004 * p, u=1e-4, **_parts(0.006 * k, 0.004 * p, u=1e-4))
    rows = []
    # File c's passes read (and its runs ran) x1.3 / x1.7: outvoted by a's and b's six.
    for f, (k, p) in (("a", (1.1, 1.5)), ("b", (1.1, 1.5)), ("c", (1.3, 1.7))):
        w = 0.6 * k + 0.4 * p
        for u, c in ((0.002, 0.008), (0.009, 0.001)):
            rows.append({"set": 9, "file": f, "net": "n", "U": {"T_GPU": u, "T_Epoch": 10 * u},
                         "C": {"T_GPU": c, "T_Epoch": 10 * c},
                         "meas": {"T_GPU": w * u + p * c, "T_Epoch": 10 * (w * u + p * c)}, "nows": [now(k, p)] * 3})
    got = cp.score(rows, then)[9]
    (gpu, epoch) = got["rules"]["calibrated"]
    uc = ((0.002, 0.008), (0.009, 0.001))
    off = [abs((1.26 * u + 1.5 * c) / (1.46 * u + 1.7 * c) - 1) for u, c in uc]      # file c's rows
    assert gpu[0] == pytest.approx(100 * sum(off) / 6, rel=1e-3) and epoch[1] == pytest.approx(0, abs=1e-3)
    none = [abs((u + c) / (w * u + p * c) - 1) for w, p in ((1.26, 1.5),) * 2 + ((1.46, 1.7),) for u, c in uc]
    assert got["rules"]["none"][0][0] == pytest.approx(100 * np.mean(none))
    assert got["parts"]["kernel"] == pytest.approx(1.1) and got["parts"]["python"] == pytest.approx(1.5)
    assert got["n"] == 6 and np.isnan(got["parts"]["compute"])


def test_every_calibration_takes_the_same_seconds_by_default():
    """predict/tune/simulate, plan and `profile --update --only calibration`
    (2.0 s for plan until session 15): one length, so one noise and weight."""
    parse = cli.build_parser().parse_args
    for argv in (["predict", "--model", "tiny", "--nodes", "1", "--subbatch", "1"],
                 ["plan", "--model", "tiny", "--gpus", "2"], ["profile", "--update", "p.json", "--only", "calibration"]):
        assert parse(argv).calibrate_seconds == calibrate.SECONDS, argv[0]


def test_per_unit_costs_follow_the_whole_workload_and_the_compute_part_together():
    """Where both calibrations timed the compute part, per-unit costs are
    rescaled by the geometric mean of the whole workload's ratio and the
    compute part's, each shrunk by its weight (calibrate.RESCALES: 12 pairs
    of a profile and a seen set, T_GPU 8.6 -> 7.4 %); without it (older
    profiles or calibrations) by the whole workload's alone."""
    stored = dict(FP, calibration=dict(FP["calibration"], **_parts(0.006, 0.004), compute_s=0.002, u_compute=0.01))
    here, cal = _now(wall=0.0101)
    cal.update(_parts(0.00606, 0.004), compute_s=0.0024, u_compute=0.01)
    chk = calibrate.compare(stored, here, cal)
    assert chk.parts == pytest.approx({"kernel": 1.01, "python": 1.0, "compute": 1.2})
    w_c = chk.weights["compute"]
    assert 0.5 < w_c < 1.0
    assert chk.scale == pytest.approx(np.sqrt(1.01 ** _w(1.01) * 1.2 ** w_c)) and chk.call_scale == pytest.approx(1.0)
    assert not chk.ok and "compute step x1.20" in chk.messages[0] and "kernels x1.01" in chk.messages[0]
    assert f"per-unit costs are rescaled by x{chk.scale:.2f}" in chk.messages[0]
    old = dict(FP, calibration=dict(FP["calibration"], **_parts(0.006, 0.004)))
    for then, now in ((old, cal), (stored, {k: v for k, v in cal.items() if "compute" not in k})):
        chk = calibrate.compare(then, here, now)
        assert "compute" not in chk.parts and chk.scale == pytest.approx(1.01 ** _w(1.01))
        assert chk.ok and chk.call_scale == pytest.approx(1.0)


def test_a_part_that_moved_between_the_sweeps_before_and_after_is_believed_less():
    """A stored calibration whose compute part read twice as long at the
    sweep's close as at its start (set 34's, 41 -> 86 ms), its kernel part
    steady: that part's own drift is its noise, so a ratio of 0.7 against
    their mean is shrunk toward 1 (weight with s^2 = 2 u^2 + (drift / 2)^2),
    not believed whole as with the whole workload's drift alone; a part that
    did not move keeps that drift."""
    before = dict(_parts(0.006, 0.004), wall_s=0.010, compute_s=0.041, u_compute=0.01)
    after = dict(before, compute_s=0.086)
    cal = dict(FP["calibration"], **_parts(0.006, 0.004), compute_s=0.0635, u_compute=0.01, drift=0.0,
               before=before, after=after)
    here, now = _now()
    now.update(_parts(0.006, 0.004), compute_s=0.0445, u_compute=0.01)
    chk = calibrate.compare(dict(FP, calibration=cal), here, now)
    r = 0.0445 / 0.0635
    assert chk.parts["compute"] == pytest.approx(r)
    assert chk.weights["compute"] == pytest.approx(_w(r, 2 * 0.01 ** 2 + (0.086 / 0.041 - 1) ** 2 / 4))
    assert chk.weights["compute"] < 0.35
    steady = dict(cal, after=dict(after, compute_s=0.041), compute_s=0.041)
    chk = calibrate.compare(dict(FP, calibration=steady), here, now)
    assert chk.weights["compute"] == pytest.approx(_w(0.0445 / 0.041, 2 * 0.01 ** 2 + (0.0 / 2) ** 2))


def test_call_scale_multiplies_only_the_fixed_parts():
    # Synthetic coefficients: a term a x + b, an SGEMM 2 mnk / F + launch,
    # the runner's c + d x; per-call parts x3, per-unit parts x1.5.
    p = Profile.synthetic(sgemm_flop_s=1e10, vec_bytes_s=4e9, launch=2e-6)
    p.data["overhead"] = {"runner_steps": {"LoadImage": {"c": 1e-4, "r": 0.5}},
                          "runner_compute": {"c": 2e-4, "d": 1e-9}, "per_step": 5e-5, "per_step_param": 1e-9}
    p.time_scale, p.call_scale = 1.5, 3.0
    assert p.term("copy", 1000) == pytest.approx(1.5 * 1000 * 8 / 4e9 + 3.0 * 2e-6)
    assert p.sgemm(64, 32, 16) == pytest.approx(1.5 * 2 * 64 * 32 * 16 / 1e10 + 3.0 * 2e-6)
    assert p.runner_step_terms("LoadImage") == pytest.approx((3e-4, 0.5))
    assert p.runner_compute(1000) == pytest.approx(3.0 * 2e-4 + 1.5 * 1e-6)
    assert p.per_step(1000) == pytest.approx(3.0 * 5e-5 + 1.5 * 1e-6)
    p.call_scale = None                       # unset: per-call parts follow time_scale
    assert p.term("copy", 1000) == pytest.approx(1.5 * (1000 * 8 / 4e9 + 2e-6))


def test_calibration_times_its_parts():
    cal = calibrate.calibration_step(seconds=0.2, blocks=3)
    assert all(cal[k] > 0 and cal["u_" + k.split("_")[0]] >= 0 for k in calibrate.PARTS)
    assert cal["kernel_s"] + cal["python_s"] <= cal["wall_s"] * 1.001


def test_compute_part_runs_only_for_a_profile_that_recorded_it():
    cal = calibrate.calibration_step(seconds=0.3, blocks=3, compute=False)
    assert "compute_s" not in cal and "u_compute" not in cal and cal["kernel_s"] > 0
    prof = Profile.synthetic(backend="cpu")
    fp = dict(calibrate.fingerprint(), calibration=dict(cal))
    prof.data["fingerprint"] = fp
    assert "compute_s" not in calibrate.check(prof, seconds=0.3, apply=False).now
    fp["calibration"] = calibrate.calibration_step(seconds=0.3, blocks=3)
    chk = calibrate.check(prof, seconds=0.3, apply=False)
    assert chk.now["compute_s"] > 0 and "compute" in chk.parts


def test_real_calibration_of_an_edited_profile_warns(tmp_path, capsys):
    """End to end: this machine's own fingerprint with its calibration time
    divided by 10 and another CPU model -> predict warns twice and rescales
    (10x: far beyond what other jobs' load moves the calibration by)."""
    fp = calibrate.record(seconds=0.3)
    fp["cpu_model"] = "some other CPU"
    fp["calibration"] = dict(fp["calibration"], u=0.0, u_kernel=0.0, u_python=0.0, u_compute=0.0,
                             **{k: fp["calibration"][k] / 10 for k in ("wall_s", "cpu_s") + calibrate.PARTS})
    prof = Profile.synthetic(backend="cpu")
    prof.data["fingerprint"] = fp
    chk = calibrate.check(prof, seconds=0.3)
    assert "cpu_model" in chk.differs and chk.scale > 3 and prof.time_scale == chk.scale
    assert chk.call_scale > 3 and prof.call_scale == chk.call_scale
    path = tmp_path / "p.json"
    Profile(copy.deepcopy(prof.data)).save(path)
    args = ["predict", "--model", "tiny", "--nodes", "1", "--workers", "1", "--subbatch", "4",
            "--profile", str(path), "--json", "--calibrate-seconds", "0.3"]
    assert cli.main(args) == 0
    cap = capsys.readouterr()
    assert cap.err.count("warning:") == 2 and "some other CPU" in cap.err and "rescaled" in cap.err
    scaled = json.loads(cap.out)["t_gpu"]
    assert cli.main(args + ["--no-calibrate"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and json.loads(cap.out)["t_gpu"] < scaled / 3


def test_plan_checks_a_measured_profile_but_not_a_datasheet(tmp_path, capsys, monkeypatch):
    prof = Profile.load()
    # the conv algorithm the profile was swept on: its warning when another
    # runs (tests/test_winograd.py) is not this test's
    monkeypatch.setenv("SPRINT_CONV_ALGO", prof.data["ops"]["conv_fwd"]["path"].split("/")[0])
    prof.data["fingerprint"] = dict(prof.data["fingerprint"], cpu_model="some other CPU")
    path = tmp_path / "p.json"
    prof.save(path)
    args = ["plan", "--model", "digits", "--gpus", "2", "--json", "--calibrate-seconds", "0.3"]
    assert cli.main(args + ["--profile", str(path)]) == 0
    assert "some other CPU" in capsys.readouterr().err
    assert cli.main(args + ["--profile", str(path), "--no-calibrate"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(args + ["--profile", "h200"]) == 0          # a datasheet is another machine by design
    assert capsys.readouterr().err == ""


def test_blas_fingerprint_does_not_depend_on_what_was_imported():
    # The same machine gave two fingerprints when the BLAS was read from the
    # libraries loaded in the process: `sprint profile` had SciPy's OpenBLAS
    # loaded beside NumPy's, `sprint predict` did not.
    import subprocess
    import sys
    code = "{}from engine.perf.fingerprint import _blas; print(_blas())"
    got = {subprocess.run([sys.executable, "-c", code.format(m)], capture_output=True, text=True,
                          check=True).stdout.strip() for m in ("", "import scipy.linalg; ")}
    assert len(got) == 1 and ".so" not in got.pop()
    # A profile written with the old field is not told apart on it alone.
    here, cal = _now(blas="scipy-openblas 0.3.31")
    assert calibrate.compare(FP, here, cal).ok
    here, cal = _now(blas="mkl 2025.1")
    assert set(calibrate.compare(dict(FP, blas="scipy-openblas 0.3.31"), here, cal).differs) == {"blas"}


def test_profile_update_only_calibration_replaces_it_and_keeps_the_rest(tmp_path, capsys):
    """``sprint profile --update P --only calibration``: this machine's
    calibration (its parts too) replaces a stale one (here 10x too fast),
    the old kept as ``replaced``, every fitted section as it was; refused for
    a profile of another machine and with --from-records."""
    fp = calibrate.record(seconds=0.2)
    stale = {k: fp["calibration"][k] / 10 for k in ("wall_s", "cpu_s") + calibrate.PARTS}
    prof = Profile.synthetic(backend="cpu")
    prof.data["fingerprint"] = dict(fp, calibration=dict(fp["calibration"], **stale))
    src, out = tmp_path / "p.json", tmp_path / "q.json"
    prof.save(src)
    args = ["profile", "--update", str(src), "--only", "calibration", "--calibrate-seconds", "0.2"]
    assert cli.main(args + ["--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "calibration: wall" in said and "the one it replaces" in said
    new, old = json.loads(out.read_text()), json.loads(src.read_text())
    cal = new["fingerprint"]["calibration"]
    assert cal["replaced"]["wall_s"] == pytest.approx(stale["wall_s"])
    assert all(cal[k] > 3 * stale[k] for k in ("wall_s",) + calibrate.PARTS)
    assert cal["before"] and cal["after"] and "drift" in cal
    assert {k: v for k, v in new.items() if k != "fingerprint"} == {k: v for k, v in old.items() if k != "fingerprint"}
    # Now a predict finds the machine as the profile says: nothing to warn about.
    chk = calibrate.compare(new["fingerprint"], calibrate.fingerprint(), cal["after"])
    assert not chk.differs and abs(chk.parts["kernel"] - 1) < 0.5
    other = dict(prof.data, fingerprint=dict(prof.data["fingerprint"], cpu_model="some other CPU"))
    Profile(other).save(src)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "some other CPU" in err and err.startswith("sprint: error:") and err.count("\n") == 1
    assert cli.main(args + ["--from-records", str(out)]) == 2
    assert "not refitted from records" in capsys.readouterr().err


def test_anchor_refers_the_compute_part_to_the_records_era(tmp_path, monkeypatch, capsys):
    """bench/calibration_drift.py --anchor: cifar's steps timed now run
    1.2-1.5x their records (median 1.3), so the compute part measured now
    (36 ms) is stored as 36 / 1.3 ms; the kernel and Python parts stay the
    profile's. Timings are stubbed: the arithmetic is what is tested."""
    from engine.perf import timing
    cd = load_bench("calibration_drift")
    cifar = spec_mod.get_spec("cifar").to_dict()
    steps = [{"kind": "net_step", "model": "cifar", "n_subbatch": n, "t": t, "clock": "cpu", "spec": cifar}
             for n, t in ((1, 0.020), (2, 0.025), (4, 0.030))]
    recs = {"meta": {"quick": True}, "records": steps + [{"kind": "sgemm", "t": 1.0}]}
    (tmp_path / "r.json").write_text(json.dumps(recs))
    old = dict(FP["calibration"], **_parts(0.006, 0.004))
    prof = Profile.synthetic(backend="cpu")
    prof.data["fingerprint"] = dict(FP, calibration=old)
    prof.save(tmp_path / "p.json")
    ratios = [1.2, 1.5, 1.3]
    calls = []

    def fake_time_call(fn, repeats, min_time):
        i = len(calls)
        calls.append(i)
        return steps[i]["t"] * ratios[i], 0.0
    monkeypatch.setattr(timing, "time_call", fake_time_call)
    monkeypatch.setattr(calibrate, "calibration_step", lambda: dict(
        old, kernel_s=0.0066, python_s=0.0048, compute_s=0.036, u_compute=0.01, u=0.01, n=10, date="now"))
    cd.anchor(tmp_path / "p.json", tmp_path / "r.json", tmp_path / "q.json")
    cal = json.loads((tmp_path / "q.json").read_text())["fingerprint"]["calibration"]
    assert calls == [0, 1, 2] and cal["compute_s"] == pytest.approx(0.036 / 1.3)
    u_r = np.std(ratios, ddof=1) / np.sqrt(3)
    assert cal["u_compute"] == pytest.approx(np.hypot(0.01 / np.sqrt(2), u_r))
    assert {k: cal[k] for k in old} == old and cal["compute_anchor"]["cifar"] == pytest.approx(1.3)
    assert "x1.300 the records'" in capsys.readouterr().out
    # A profile so anchored compares the compute part from now on (said; per-unit costs follow the
    # whole workload, here x1, and the compute part together).
    now = dict(old, compute_s=0.036 / 1.3 * 1.1, u_compute=0.01)
    chk = calibrate.compare(dict(FP, calibration=cal), None, now)
    assert chk.parts["compute"] == pytest.approx(1.1)
    assert chk.scale == pytest.approx(np.sqrt(1.1 ** chk.weights["compute"]))


def test_calibration_history_judges_each_run_by_its_own_profile_and_rules():
    """bench/calibration_drift.py --history: a run is priced by the newest
    profile fitted before it whose calibration the run's own measurements
    give back (two profiles may share one calibration); a run whose
    calibrations timed no parts is rescaled by the whole ratio under every
    rule but none."""
    cd = load_bench("calibration_drift")
    cal = dict(FP["calibration"], **_parts(0.006, 0.004))
    other = dict(cal, wall_s=0.012)
    profs = {"a": ("2026-12-01T10:00Z", {"calibration": cal}), "b": ("2026-12-01T12:00Z", {"calibration": cal}),
             "c": ("2026-12-01T13:00Z", {"calibration": other})}
    run = lambda date, now: {"date": date,
                             "calibrations": [{"ratio": 1.1, "now": dict(now, wall_s=1.1 * now["wall_s"])}]}
    assert cd._profile_of(run("2026-12-01T11:00Z", cal), profs) == "a"
    assert cd._profile_of(run("2026-12-01T14:00Z", cal), profs) == "b"        # c's calibration is not the run's
    assert cd._profile_of(run("2026-12-01T14:00Z", other), profs) == "c"
    with pytest.raises(ValueError):
        cd._profile_of(run("2026-12-01T09:00Z", cal), profs)
    whole = {"wall_s": 0.010, "cpu_s": 0.009, "u": 0.01}
    chk, rules = cd._rules(whole, cd._now({"ratio": 1.3}, whole))
    w = 1.3 ** _w(1.3, 0.01 ** 2 + 0.004 ** 2)
    assert rules["none"] == (1.0, 1.0) and chk.call_scale is None
    assert rules["one ratio"] == rules["by part (now)"] == pytest.approx((w, w)) and rules["band 10 %"] == (1.3, 1.3)
    now = dict(whole, wall_s=0.0123, **_parts(0.0063, 0.006))
    chk, rules = cd._rules(cal, now)
    assert rules["by part (now)"] == pytest.approx((chk.scale, chk.call_scale)) and chk.call_scale > 1.4
    assert rules["band 10 %"] == pytest.approx((1.0, 1.5))        # the kernel part's 5 % is inside its band


def test_calibration_transfer_scores_each_rule_against_a_planted_truth():
    """bench/calibration_transfer.py: runs whose measured T_GPU is exactly
    W U + P C (W, P the calibration's whole-workload and Python ratios) have
    no error by part (shrunk only by the tiny weights' loss) and a known one
    under the other rules; the spreads are of the logs within each file."""
    ct = load_bench("calibration_transfer")
    then = dict(FP["calibration"], u=0.001, **_parts(0.006, 0.004, u=0.001))
    uc = {"a|1|1": (0.002, 0.008), "b|4|1": (0.009, 0.001)}
    rounds, kp = [], ((1.1, 1.5), (1.2, 1.4))
    wall = [0.6 * k + 0.4 * p for k, p in kp]
    for (k, p), w in zip(kp, wall):
        cal = dict(wall_s=0.010 * w, u=0.001, **_parts(0.006 * k, 0.004 * p, u=0.001))
        rounds.append({"cal": cal, "runs": {r: w * u + p * c for r, (u, c) in uc.items()}})
    got = ct.rule_errors(rounds, uc, then)
    for run, (u, c) in uc.items():
        assert got[run]["by part (now)"] == pytest.approx([0, 0], abs=2e-3)
        assert got[run]["none"] == pytest.approx([(u + c) / (w * u + p * c) - 1 for (k, p), w in zip(kp, wall)])
        assert got[run]["one = kernel"][0] == pytest.approx(1.1 * (u + c) / (wall[0] * u + 1.5 * c) - 1)
        want = (1.2 * u + (1.2 * 1.4) ** 0.5 * c) / (wall[1] * u + 1.4 * c) - 1
        assert got[run]["per-call sqrt(K P)"][1] == pytest.approx(want)
    recs = [{"file": 0, "v": 1.0}, {"file": 0, "v": math.e ** 0.1}, {"file": 1, "v": 5.0}, {"file": 1, "v": 5 * math.e ** 0.1}]
    # Within each file the logs differ by 0.1 (sd 0.1 / sqrt 2); the files' levels do not count.
    assert ct.pooled(recs, lambda r: r["v"]) == pytest.approx(0.1 / math.sqrt(2))
    assert ct.spread([1.0, math.e ** 0.1]) == pytest.approx(0.1 / math.sqrt(2))


def test_calibration_transfer_passes_recovers_a_planted_slope():
    """--passes: each pass's measured T_GPU moves with its calibration by a
    planted slope (1: the pass-to-pass scatter is signal, 0: noise)."""
    ct = load_bench("calibration_transfer")
    rng = np.random.default_rng(3)
    for slope in (1.0, 0.0):
        rows = []
        for i in range(40):
            parts = [{"kernel": float(np.exp(rng.normal(0, 0.03))), "python": 1.0} for _ in range(3)]
            m = [float(np.exp(slope * np.log(p["kernel"]))) for p in parts]
            rows.append({"run": "s", "parts": parts, "U": {"T_GPU": 1.0}, "C": {"T_GPU": 0.0},
                         "runs": [{"T_GPU": x} for x in m]})
        got = ct.passes(rows)
        assert got["s"]["slope"] == pytest.approx(slope, abs=1e-9) and got["all"]["n"] == 120
        assert got["s"]["sd_applied"] == pytest.approx(0.0 if slope else got["s"]["sd_calibration"], abs=1e-9)
