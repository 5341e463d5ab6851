"""A machine profile: the fitted cost of every term of the performance model.

The JSON written by ``fit.fit_profile`` and read here::

    {"version": 1, "machine": str, "date": str, "backend": "cpu"|"gpu", "cores": int,
     "sgemm": {"regimes": [{"rule": [[feature, "<="|">", threshold], ...],
                            "coef": {"mnk": a, "mn": .., "mk": .., "nk": .., "m": .., "n": .., "k": .., "1": b}}],
               "error": {...}},
     "terms": {name: {"a": per-unit seconds, "b": fixed seconds, "unit": str, "cv": spread, "error": {...}}},
     "allreduce": {"a_log": .., "b": .., "c_log": .., "d": .., "error": {...}},
     "contention": {"slope": s},          # optional: slowdown per extra busy thread beyond the cores
     "overhead": {"per_layer": s, "per_step": s}}   # optional framework cost not in any kernel

Only the keys the model reads are required; ``Profile`` fails with a
ValueError naming the missing term rather than predicting nonsense.
"""
from __future__ import annotations

import json
import math

import numpy as np
from importlib import resources
from pathlib import Path

from .profile_sharing import HostSharing

SGEMM_FEATURES = ("mnk", "mn", "mk", "nk", "m", "n", "k", "1")


def sgemm_features(m, n, k):
    """The eight monomials of the SPEC section 4 SGEMM polynomial."""
    m, n, k = float(m), float(n), float(k)
    return (m * n * k, m * n, m * k, n * k, m, n, k, 1.0)


def regime_feature(name, m, n, k):
    """Shape features the regime rules split on (log2 so thresholds read as sizes)."""
    vals = {"m": m, "n": n, "k": k, "mn": m * n, "mk": m * k, "nk": n * k, "mnk": m * n * k,
            "min": min(m, n, k)}
    return math.log2(max(vals[name], 1))


def rule_matches(rule, m, n, k):
    for feat, op, thr in rule:
        v = regime_feature(feat, m, n, k)
        if (op == "<=" and not v <= thr) or (op == ">" and not v > thr):
            return False
    return True


def piece_time(pieces, x, k=1.0, kc=1.0):
    """The price of a piecewise-linear term (``fit.fit_linear_pieces``), per-unit
    parts by ``k`` and per-call parts by ``kc``, never below zero; None past
    the last cut when no piece is open-ended. A piece whose records' range
    (``lo``, ``hi``) was kept prices that range and beyond the outer ones;
    between two pieces' records the price runs straight from the lower
    piece's at its highest record to the upper piece's at its lowest: no jump
    at the cut. Pieces without ranges (profiles fitted before) each price up
    to their cut."""
    def line(p, v):
        return k * p["a"] * v + kc * p["b"]
    for lower, upper in zip(pieces, pieces[1:]):
        x0, x1 = lower.get("hi"), upper.get("lo")
        if x0 is not None and x1 is not None and x0 < x < x1:
            y0, y1 = line(lower, x0), line(upper, x1)
            return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    for p in pieces:
        if p["upper"] is None or x <= p["upper"]:
            return max(0.0, line(p, x))
    return None


# The profile format this code writes (fit.fit_profile) and reads.
FORMAT_VERSION = 1

# The profiles a source checkout keeps (bench/profiles; an installed package has none).
CHECKOUT_PROFILES = Path(__file__).resolve().parents[2] / "bench" / "profiles"


def checkout_profiles(folder=None) -> list:
    """The profile files in ``folder`` (the checkout's bench/profiles by
    default), sorted by name, the sweeps' ``*_records.json`` left out."""
    folder = Path(CHECKOUT_PROFILES if folder is None else folder)
    return sorted(f for f in folder.glob("*.json") if not f.name.endswith("_records.json")) \
        if folder.is_dir() else []


def shown_path(path) -> Path:
    """``path`` relative to the working directory where it is below it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return Path(path)


def profile_choices(given, datasheets=()) -> str:
    """What --profile takes, for the error of a ``given`` one that is no
    file: ``datasheets`` by name, the checkout's profile files (the one
    named like ``given`` first), or none for the shipped default_profile.json."""
    files = [f.name for f in checkout_profiles()]
    shown = shown_path(CHECKOUT_PROFILES)
    near = [f for f in (Path(str(given)).name, f"{Path(str(given)).name}.json") if f in files]
    said = [f"a datasheet by name ({', '.join(datasheets)})"] if datasheets else []
    if near:
        said.append(f"a profile file such as {shown / near[0]}")
    elif files:
        said.append(f"a profile file (the {len(files)} of this checkout are in {shown}/)")
    else:
        said.append("a profile file (`sprint profile` writes one)")
    return f"--profile takes {', '.join(said)}, or nothing for the shipped default_profile.json"


class Profile(HostSharing):
    def __init__(self, data: dict, source: str = "<dict>"):
        if not isinstance(data, dict):
            raise TypeError("profile must be a dict")
        self.data = data
        self.source = source
        self.terms = data.get("terms", {})
        self.cores = int(data.get("cores", 1))
        # {model or "*": wall/CPU factor of one undisturbed step measured now}
        self.host_factor = {}
        # How much slower this machine runs than the one profiled, from a
        # calibration (engine.perf.calibrate.check); multiplies every time,
        # or with ``call_scale`` set the per-unit parts only.
        self.time_scale = 1.0
        self._call_scale = None
        # measure_layers.LayerMeasure under --measure-layers: the net's layer
        # passes timed here replace the fitted per-layer terms.
        self.layer_measure = None

    @property
    def call_scale(self) -> float:
        """Factor on the fixed per-call parts of every time (the intercepts of
        the kernel fits, the layers' per-call rows, the runner's and the net
        step's per-call excess): the calibration's Python part where it was
        timed apart (``calibrate.PARTS``), else ``time_scale``."""
        return self.time_scale if self._call_scale is None else self._call_scale

    @call_scale.setter
    def call_scale(self, v):
        self._call_scale = None if v is None else float(v)

    # -- file I/O ---------------------------------------------------------
    @classmethod
    def load(cls, path=None) -> "Profile":
        """``path`` or, when None, the profile shipped with the package."""
        if path is None:
            text = resources.files("engine.perf").joinpath("default_profile.json").read_text()
            return cls(json.loads(text), source="default_profile.json")
        from engine.errors import MissingFile, RunError
        p = Path(path)
        if not p.exists():
            raise MissingFile(f"profile does not exist; {profile_choices(path)}", p)
        try:
            data = json.loads(p.read_text())
        except UnicodeDecodeError:
            raise RunError("not a machine profile (not a text file)", p) from None
        except json.JSONDecodeError as e:
            raise RunError(f"not a machine profile (not valid JSON: {e})", p) from None
        # A spec file or another run's JSON would otherwise predict with no
        # fitted term at all and fail far from the cause.
        if not isinstance(data, dict) or not ("terms" in data or "sgemm" in data):
            raise RunError("not a machine profile (no fitted terms; `sprint profile` writes one)", p)
        # A newer format may give old keys new meanings: priced silently by
        # this reader it would be wrong without a sign.
        version = data.get("version", FORMAT_VERSION)
        if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
            raise RunError(f"profile format version {version!r} is not one this sprint reads "
                           f"(up to {FORMAT_VERSION}); make one here with `sprint profile --quick`", p)
        return cls(data, source=str(p))

    @classmethod
    def resolve(cls, profile) -> "Profile":
        """``profile`` itself, a profile file's, or the shipped profile when None."""
        import os
        if profile is None or isinstance(profile, (str, os.PathLike)):
            return cls.load(profile)
        return profile

    def save(self, path):
        from engine.checkpoint import atomic_write
        atomic_write(path, json.dumps(self.data, indent=1, sort_keys=True))

    # -- evaluation -------------------------------------------------------
    def _term(self, name):
        try:
            return self.terms[name]
        except KeyError:
            raise ValueError(f"profile {self.source} has no fitted term {name!r}") from None

    def has(self, name) -> bool:
        return name in self.terms

    def term(self, name, x) -> float:
        """a * x + b of a linear term; zero work costs nothing. ``x`` may be
        (elements, segments) for the terms fitted with a per-segment cost,
        and for pooling (elements, input rows, planes, side, pool)
        (``pool_cost.pool_size``): its kernels' own features where the
        profile's fit has them (``pool_cost.fit_pool``)."""
        size, x2 = x, 0.0
        if isinstance(x, tuple):
            x, x2 = x[:2]
        if x <= 0:
            return 0.0
        t = self._term(name)
        k, kc = self.time_scale, self.call_scale
        if "coef" in t:
            from .pool_cost import pool_time
            return pool_time(t, name, size, k, kc)
        if "c" in t:
            return k * (t["a"] * x + t["c"] * x2) + kc * t["b"]
        # A piece past the first is fitted to its own records, a negative intercept allowed
        # (fit_linear_pieces). Priced where piece_time prices it with the records' ranges
        # (on its range, past the last), it is above zero; priced from the cut, as profiles
        # without them are, its line may cross zero in the gap (cpu_test18's sub between its
        # cut at 49,152 elements and 79,300: UpdateMomentum of digits on 2 nodes at -12 us),
        # as may a line whose per-call part a calibration scales more than its per-unit part.
        # A time is never negative (piece_time). (Holding the fit above zero at the cut
        # instead moved the cut of axpy in most saved record sets and halved its price at
        # 24-32 K.)
        got = piece_time(t["pieces"], x, k, kc) if t.get("pieces") else None
        if got is not None:
            return got
        return k * t["a"] * x + kc * t["b"]

    def cv(self, name) -> float:
        """Relative spread (std/mean) measured for a term, 0 if unknown."""
        if name == "sgemm":
            sg = self.data.get("sgemm", {})
            if "variants" in sg:
                return float(np.median([v.get("cv", 0.0) for v in sg["variants"].values()]))
            return float(sg.get("cv", 0.0))
        return float(self.terms.get(name, {}).get("cv", 0.0))

    def _sgemm_fit(self, trans):
        sg = self.data.get("sgemm")
        if not sg:
            raise ValueError(f"profile {self.source} has no SGEMM fit")
        variants = sg.get("variants")
        if variants is None:
            return sg
        return variants.get(trans) or variants.get("nn") or next(iter(variants.values()))

    def sgemm_regime(self, m, n, k, trans="nn") -> dict:
        regs = self._sgemm_fit(trans).get("regimes")
        if not regs:
            raise ValueError(f"profile {self.source} has no SGEMM fit")
        for r in regs:
            if rule_matches(r["rule"], m, n, k):
                return r
        return regs[-1]

    def sgemm(self, m, n, k, trans="nn") -> float:
        """Fitted SGEMM time; ``trans`` in nn|nt|tn picks the variant's fit."""
        if min(m, n, k) <= 0:
            return 0.0
        coef = self.sgemm_regime(m, n, k, trans)["coef"]
        return self._scaled(coef, SGEMM_FEATURES, sgemm_features(m, n, k))

    def _scaled(self, coef, names, feats) -> float:
        """A fitted polynomial, its per-unit monomials by ``time_scale`` and
        its intercept (``"1"``, the per-call cost) by ``call_scale``."""
        unit = sum(coef.get(f, 0.0) * v for f, v in zip(names, feats) if f != "1")
        return self.time_scale * unit + self.call_scale * coef.get("1", 0.0)

    def op_kinds(self) -> set:
        """The whole-op fits (``fit.fit_op_terms``) that price the ops as they
        run now: on a CPU profile those swept on the conv/GEMM path in force
        or the nearest (``sweep_ops.fits_hold``: implicit's for Winograd);
        the others fall back to the kernels. ``path_warning`` says when
        that misprices a net."""
        ops = self.data.get("ops") or {}
        if not ops:
            return set()
        if self.data.get("backend", "cpu") != "cpu":
            return set(ops)
        from .sweep_ops import fits_hold, op_path
        now = op_path()
        return {k for k, o in ops.items() if fits_hold(o.get("path"), k.split("_")[0], now)}

    def path_warning(self, model) -> str:
        """'' when this profile's op fits were swept on the path ``model``'s
        layers run on now (a GPU profile: always); else what differs and
        what to do, for the commands that price to say."""
        ops = self.data.get("ops") or {}
        if not ops or self.data.get("backend", "cpu") != "cpu":
            return ""
        from engine import spec as spec_mod
        from .sweep_ops import op_path, path_mismatch
        differs = path_mismatch(ops, op_path(), spec_mod.layers(spec_mod.get_spec(model)))
        return differs and (f"{self.source}: {differs}; the layers that run otherwise are mispriced: "
                            "`sprint profile` sweeps the path in force ($SPRINT_CONV_ALGO / --conv-algo, "
                            "$SPRINT_GEMM), or set those to the profile's")

    def op(self, kind, m, n, k, c=1, b=None, h=None, w=None) -> float:
        """Fitted time of one whole op (``sweep_ops``) on its forward GEMM
        shape; for a convolution with its geometry (batch ``b``, input
        ``h`` x ``w``) on the kernel it runs, where the profile fitted one
        per kernel (``conv_tiles``)."""
        from .sweep_ops import OP_FEATURES, op_features
        entry = (self.data.get("ops") or {}).get(kind, {})
        regs = entry.get("regimes")
        if not regs:
            raise ValueError(f"profile {self.source} has no {kind} fit")
        if b is not None and entry.get("kernels") is not None:
            from .conv_tiles import price_features
            return self._scaled(*price_features(entry, kind, m, n, k, c, (b, h, w)))
        reg = next((r for r in regs if rule_matches(r["rule"], m, n, k)), regs[-1])
        return self._scaled(reg["coef"], OP_FEATURES, op_features(m, n, k, c, entry.get("wide_taps")))

    def allreduce_bw(self, n_node, n_param) -> float:
        """Allreduce time without the barrier: (a log2 N + b) N_Param + c log2 N + d."""
        a = self.data.get("allreduce")
        if a is None:
            raise ValueError(f"profile {self.source} has no allreduce fit")
        lg = math.log2(max(n_node, 1))
        return self.time_scale * ((a["a_log"] * lg + a["b"]) * n_param + a.get("c_log", 0.0) * lg + a.get("d", 0.0))

    @classmethod
    def synthetic(cls, sgemm_flop_s=1e10, vec_bytes_s=5e9, launch=2e-6, allreduce_bw=1e9,
                  allreduce_lat=2e-5, cores=1, backend="gpu", load_pixel=1e-9, deform_pixel=2e-9):
        """A made-up profile from a few rates: for tests and what-if studies."""
        per = lambda bytes_per: {"a": bytes_per / vec_bytes_s, "b": launch, "cv": 0.0}
        terms = {n: per(8.0) for n in ("im2col", "col2im", "bias", "bias_grad", "relu_fwd",
                                        "relu_bwd", "pool_fwd", "pool_bwd", "softmax", "copy",
                                        "scale", "fill", "to_nchw", "to_cnhw")}
        terms.update({n: per(12.0) for n in ("axpy", "add", "sub")})
        terms["handover"] = {"a": 0.0, "b": 2 * launch, "cv": 0.0}
        terms["load"] = {"a": load_pixel, "b": launch, "cv": 0.0}
        terms["deform"] = {"a": deform_pixel, "b": launch, "cv": 0.0}
        coef = dict.fromkeys(SGEMM_FEATURES, 0.0)
        coef["mnk"] = 2.0 / sgemm_flop_s
        coef["1"] = launch
        return cls({"version": FORMAT_VERSION, "machine": "synthetic", "date": "", "backend": backend,
                    "cores": cores, "terms": terms,
                    "sgemm": {"regimes": [{"rule": [], "coef": coef}]},
                    "allreduce": {"a_log": 4.0 / allreduce_bw, "b": 4.0 / allreduce_bw,
                                  "c_log": allreduce_lat, "d": 0.0}}, source="synthetic")

    def vector_share(self, n_param, age=None) -> float:
        """Share of an ``n_param`` vector's cold price that a worker step pays
        when the worker last touched it ``age`` seconds before
        (``vector_age.vector_share``: beyond the L2 at the caches' decay); 1
        without an age or a fitted ``vector_tau`` (profiles before session 15
        price it cold)."""
        from .vector_age import vector_share
        return vector_share(n_param, (self.data.get("cache") or {}).get("l2_bytes"), age,
                            self.data.get("overhead", {}).get("vector_tau"))

    def runner_step_terms(self, step, age=None, n_param=0) -> tuple:
        """``(c, r)``: seconds per call and fraction of its kernel that the
        runner spends on a worker step beyond the kernels that price it, one
        thread (``fit.runner_step_excess``), ``r`` of the vector-sized steps at
        the vector's ``age`` (``vector_share``); (0, 0) if not fitted. Older profiles stored ``c``
        alone."""
        from .vector_age import VECTOR_STEPS
        v = self.data.get("overhead", {}).get("runner_steps", {}).get(step, 0.0)
        c, r = (v.get("c", 0.0), v.get("r", 0.0)) if isinstance(v, dict) else (v, 0.0)
        return self.call_scale * float(c), float(r) * (self.vector_share(n_param, age) if step in VECTOR_STEPS else 1.0)

    def runner_step_time(self, step, kernel, slow=1.0, age=None, n_param=0, passes=1) -> float:
        """Seconds of a small worker step in the runner whose kernels take
        ``kernel`` s (already times the host's ``slow``): a vector-sized step
        the profile fitted whole is ``slow`` times its price
        (``vector_age.vector_step_price``: ``c`` per call, ``d`` and ``e`` per
        unit, ``passes`` over the vector), any other the kernel plus
        ``runner_step_terms``' ``slow * c + r * kernel``."""
        v = self.data.get("overhead", {}).get("runner_steps", {}).get(step)
        if isinstance(v, dict) and "d" in v:
            from .vector_age import vector_step_price
            tau = self.data.get("overhead", {}).get("vector_tau")
            unit = vector_step_price(v, n_param, age, tau, passes) - v["c"]
            return slow * (self.call_scale * v["c"] + self.time_scale * unit)
        c, r = self.runner_step_terms(step, age, n_param)
        return kernel + slow * c + r * kernel

    def runner_compute(self, n_param: int, age=None) -> float:
        """Seconds per ComputeGradient the runner spends beyond the modelled
        step (``fit.runner_compute_excess``): ``c + d * n_param``, or with
        ``l2_bytes`` stored ``c + d * (bytes of the parameters beyond the
        L2)``, the ``d`` part at the vector's ``age`` (``vector_share``); 0
        if not fitted."""
        v = self.data.get("overhead", {}).get("runner_compute")
        if not v:
            return 0.0
        from .layer_cost import bytes_beyond_l2
        x = bytes_beyond_l2(n_param, v["l2_bytes"]) if v.get("l2_bytes") else n_param
        from .cache_decay import refill_share
        tau = self.data.get("overhead", {}).get("vector_tau")
        return self.call_scale * v["c"] + self.time_scale * v["d"] * x * (1.0 if age is None else refill_share(age, tau))

    def runner_step(self, step, kernel: float = 0.0, age=None, n_param=0) -> float:
        """The excess of ``runner_step_terms`` for a step whose kernels take ``kernel`` s."""
        c, r = self.runner_step_terms(step, age, n_param)
        return c + r * kernel

    # Overhead entries that are factors, not seconds (not rescaled); those
    # that are per-parameter seconds (the rest are per call).
    _FACTORS = ("kernel_factor",)
    _PER_UNIT = ("per_step_param",)

    def per_step(self, n_param: int, age=None) -> float:
        """A net step's work outside its layers: ``per_step + per_step_param
        * N_Param``, the second at the vector's ``age`` (``vector_share``)."""
        return self.overhead("per_step") + self.overhead("per_step_param") * n_param * self.vector_share(n_param, age)

    def overhead(self, key) -> float:
        v = float(self.data.get("overhead", {}).get(key, 0.0))
        if key in self._FACTORS:
            return v
        return (self.time_scale if key in self._PER_UNIT else self.call_scale) * v
