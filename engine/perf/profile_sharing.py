"""The host-sharing terms of a machine profile (engine.perf.profile.Profile
inherits them): what ranks and worker threads sharing a host's cores cost,
read from the contention sweeps' entries (``sweep_contention`` and the
runner's ``sweep_contention_runner``) -- slowdowns, the updater's waits for
time slices, a worker's cycle beyond its timed steps and the allreduce under
load. Apart from profile.py because these are one family, fitted on one
sweep, and read only by the model's sharing paths."""
from __future__ import annotations

import math

import numpy as np


class HostSharing:
    """Mixin of Profile: reads ``self.data``, ``self.cores``, ``self.time_scale``,
    ``self.call_scale``, ``self.host_factor`` and ``self.allreduce_bw``."""

    def _contention(self):
        """Contention entries that price the workers' slowdown: the runner's
        own (``sweep_contention_runner``) where the profile has them."""
        from .sweep_runner import LONG_SOURCE
        entries = [e for e in self.data.get("contention", {}).get("entries", [])
                   if e.get("source") != LONG_SOURCE]          # they anchor one reading (long_step_anchor)
        runner = [e for e in entries if e.get("source") == "runner"]
        return runner or entries

    @staticmethod
    def _sharing(entries, ranks_per_host, n_gpu, model):
        """The entries of exactly this sharing: this net's where it was
        swept, else every net's."""
        same = [e for e in entries if e["ranks"] == ranks_per_host and e["workers"] == n_gpu]
        return [e for e in same if e.get("model") == model] or same

    def _excess(self, same, ratio, phi, n_param=None) -> float:
        """A net's slowdown beyond its core share, read from the swept nets'
        (``ratio``: theirs over their own core shares) in sqrt(phi) (in phi
        within the cores), apart
        for the nets whose flat vectors fit the L2 and those that overflow
        it, and between the two groups in log N_Param.

        Two causes, read apart. Per-call Python queues for the GIL, and
        grows with phi; with no per-call share and cache-resident vectors
        a worker pays its core share only, so the small nets' curve starts
        at (phi 0, x1). Updaters streaming vectors larger than the L2
        (cifar's 13 MB) evict the workers' data: that excess is the large
        nets', whatever their phi. Read in phi alone, cifar (phi 0.002)
        anchored every compute-bound net: heldout-k9 and heldout-k11 (0.1 M
        parameters, phi 0.001-0.006) were priced x1.3-1.4 beyond their core
        share at 2 x 2, 3 x 1 and 3 x 2 and ran x0.96-1.10 (test sets 7-8,
        bench/RESULTS.md section 4)."""
        # Within the cores (no time slicing) two workers' per-call Python
        # collide on the GIL about as often as phi: read in phi. Beyond
        # them a collision can cost a descheduled holder's time slice, and
        # the excess climbs faster at small phi: read in sqrt(phi). In
        # sqrt(phi) at 1 x 2 the compute-bound nets of sets 2-9 were priced
        # x1.21-1.30 and ran x1.03-1.15: ComputeGradient slowdown mean
        # |error| 12.0 -> 9.2 % at 1 x 2, 7.0 -> 5.8 % at 2 x 1; 7.6 -> 7.7 %
        # and 6.3 -> 7.6 % read so at 2 x 2 and 3 x 1 (measured layers).
        within = all(e["ranks"] * e["workers"] <= self.cores for e in same)
        f = (lambda v: v) if within else math.sqrt
        pts = [(f(e["phi"]), float(e.get("n_param") or 0), ratio(e)) for e in same
               if e.get("phi") is not None]
        big = [p for p in pts if self._overflows(p[1])]
        small = [p for p in pts if p not in big]
        x = f(max(phi, 0.0))
        # The small nets' curve ends at the long compute-bound steps' reading
        # where swept (``long_step_anchor``: more ranks than cores), else at
        # the core share.
        long = self.long_step_anchor(same[0]["ranks"], same[0]["workers"]) if same else None
        anchor = (f(long[0]), long[1]) if long else (0.0, 1.0)

        def read(group, anchored):
            group = sorted(group)
            xs, ys = [p[0] for p in group], [p[2] for p in group]
            if anchored:
                keep = [i for i, v in enumerate(xs) if v > anchor[0]]
                xs, ys = [anchor[0]] + [xs[i] for i in keep], [anchor[1]] + [ys[i] for i in keep]
            return float(np.interp(x, xs, ys))            # clamped to the read range
        # The large-vector nets' curve is their own: anchored at the long
        # steps' reading too (those swept within the cores as well), it
        # priced held-out set 34 no better (T_GPU over 1 x 2, 2 x 1, 2 x 2
        # 13.3 against 13.1 %, bench/RESULTS.md section 4) and sets 29-33
        # worse (5.0 -> 5.5 %): reverted.
        if not big or not small:
            return read(pts, anchored=not big) if pts else float(np.mean([ratio(e) for e in same]))
        w = self._big_weight(n_param, [p[1] for p in small], [p[1] for p in big])
        return (1.0 - w) * read(small, anchored=True) + w * read(big, anchored=False)

    def long_step_anchor(self, ranks_per_host: int, n_gpu: int):
        """``(phi, ratio)``: where the long compute-bound steps of nets whose
        vectors fit the L2 sit beyond their core share at this sharing, from
        the ``runner contention long`` entries (sweep_runner.LONG_SOURCE):
        each net's runs pooled by their median ``rel``, divided by the core
        share its own updaters left (as ``model.swept_shares``), averaged
        over the nets at their median phi; None where not swept.

        With more ranks than cores the workers of three processes take turns
        on each core, and every turn starts on caches another process's
        worker filled: a step that runs longer than a turn pays that refill
        on each one, and one of a short step's few turns is a fresh one.
        The nets swept there for the per-call share (tiny, mnist, digits)
        all step in 0.5-2.5 ms; compute-bound nets of 3-30 ms ran x1.1-1.3
        beyond their core share at 3 x 2 (heldout-d8 x3.7-3.9 at N_Subbatch
        4, 26 and 64 alike, 3-30 ms steps, measured 20:43 UTC 2026-12-01),
        where the curve's old end at (phi 0, x1) priced x1.0-1.05."""
        from .sweep_runner import LONG_SOURCE
        cache = self.__dict__.setdefault("_long_anchors", {})
        key = (ranks_per_host, n_gpu, self.time_scale, self.call_scale)
        if key in cache:
            return cache[key]
        runs = {}
        for e in self.data.get("contention", {}).get("entries", []):
            if (e.get("source") == LONG_SOURCE and (e["ranks"], e["workers"]) == (ranks_per_host, n_gpu)
                    and e.get("rel") and e.get("n_subbatch")):
                runs.setdefault((e.get("model"), int(e["n_subbatch"])), []).append(e)
        pts = []
        for group in runs.values():
            pt = self._long_point(group[0].get("spec") or group[0]["model"], int(group[0]["n_subbatch"]),
                                  ranks_per_host, n_gpu, max(float(np.median([e["rel"] for e in group])), 1.0))
            if pt is not None:
                pts.append(pt)
        cache[key] = (float(np.median([p[0] for p in pts])), float(np.mean([p[1] for p in pts]))) if pts else None
        return cache[key]

    def _long_point(self, spec, n, R, n_gpu, rel):
        """``(phi, rel / core share)`` of one long-step net's runs at R x n_gpu,
        predicted at its own run with the slowdown it measured; None when this
        install cannot build the net."""
        from engine import spec as spec_mod
        from .host import core_share, updater_duty
        from .layer_cost import python_share
        from .model import RUNNER_SWEEP_IMPL, _predict
        try:
            sp = spec_mod.get_spec(spec)
            phi = python_share(sp, n, self)
            ref = _predict(sp, R, n_gpu, n, self, ranks_per_host=R, impl=RUNNER_SWEEP_IMPL, slowdown=rel)
        except (KeyError, ValueError):
            return None
        # Without layer terms no net has a per-call share: the long steps at 0.
        return phi or 0.0, rel / core_share(R, n_gpu, self.cores, updater_duty(ref, self))

    def _overflows(self, n_param, cache: str = "l2_bytes") -> bool:
        """Whether a net's flat vectors (4 bytes a parameter) overflow the L2
        (or the profile's ``cache`` level, e.g. ``llc_bytes``): updaters
        streaming them evict the workers' data. False where the profile has
        no size for that level."""
        size = float((self.data.get("cache") or {}).get(cache) or 0)
        return bool(size) and 4 * float(n_param or 0) > size

    @staticmethod
    def _big_weight(n_param, small, big) -> float:
        """Weight of the large-vector nets' reading for a net of ``n_param``
        parameters: 0 up to the largest small-vector swept net, 1 from the
        smallest large-vector one, in log N_Param between."""
        lo, hi, n = max(small), min(big), float(n_param or 0)
        return 0.0 if n <= lo else 1.0 if n >= hi else math.log(n / lo) / math.log(hi / lo)

    def sharing_excess(self, key, ranks_per_host: int, n_gpu: int, model: str = "", n_param: int = 0) -> float:
        """Seconds per cycle of a runner contention entry's ``key`` (e.g.
        ``updater_excess``, ``slice_wait``) for this sharing: this net's where
        swept, else ``c + d N_Param`` through the swept nets' (NNLS, >= 0),
        not the first net's (tiny's 0.04 ms put on every net at 3 x 1);
        0 when not measured."""
        es = [e for e in self._contention() if e["ranks"] == ranks_per_host and e["workers"] == n_gpu
              and e.get(key) is not None]
        own = [e for e in es if e.get("model") == model]
        if own:
            return self.time_scale * float(own[0][key])
        pts = [(float(e.get("n_param") or 0), float(e[key])) for e in es]
        if not pts:
            return 0.0
        n, x = (np.array(v) for v in zip(*pts))
        if len(pts) == 1 or n.max() < 10 * max(n.min(), 1.0):
            return self.time_scale * max(float(np.median(x)), 0.0)
        from scipy.optimize import nnls
        c, d = nnls(np.column_stack([np.ones_like(n), n]), x)[0]
        return self.time_scale * float(c + d * n_param)

    def slice_terms(self, ranks_per_host: int, n_gpu: int, model: str = "", n_param: int = 0) -> tuple:
        """``(c, beta)``: the runner's wait per updater cycle for time slices
        (``slice_wait``) as ``c + beta * T_GPU``, NNLS over the swept nets'
        entries of this sharing against the T_GPU each measured (its cycle).

        With more ranks than cores a rank's updater waits for its worker's
        (or another rank's) time slice before it can sum, poll and publish:
        part of that wait is per cycle (a scheduler slice), part grows with
        the step that must finish first. Read between nets by N_Param
        (``sharing_excess``), tiny's 1.7 ms and cifar's 39 ms at 3 x 1 put
        2-3 ms on every small net whatever its step: held-out nets at
        T_GPU 31 ms waited 23 ms (bench/RESULTS.md section 4, test set 3).
        Entries without a measured T_GPU (older profiles) fall back to
        ``(sharing_excess(...), 0)``."""
        es = [e for e in self._contention() if e["ranks"] == ranks_per_host and e["workers"] == n_gpu
              and e.get("slice_wait") is not None and (e.get("cycle") or {}).get("T_GPU")]
        if ranks_per_host <= self.cores or len({e.get("model") for e in es}) < 2:
            return self.sharing_excess("slice_wait", ranks_per_host, n_gpu, model, n_param), 0.0
        # Read apart for nets whose vectors fit the L2 and those that overflow
        # it, as the slowdown's excess (``_excess``): through all four swept
        # nets the line was cifar's (9.96 ms at T_GPU 93 ms, beta 0.09 at
        # 3 x 1) and priced the held-out nets' wait at a third of what they
        # waited (0.45 T_GPU at 3 x 1, 0.6 at 3 x 2; sets 2-9, all seen);
        # tiny, mnist and digits alone give 0.3 and 0.6.
        es = self._whole_slice_waits(es, ranks_per_host, n_gpu)
        big = [e for e in es if self._overflows(e.get("n_param"))]
        small = [e for e in es if not self._overflows(e.get("n_param"))]
        if not big or len({e.get("model") for e in small}) < 2:
            # A line needs two small-vector nets (4 ranks: tiny alone, whose
            # 1 ms step says nothing of the part that grows with the step).
            c, beta = self._slice_line(es)
        else:
            w = self._big_weight(n_param, [float(e.get("n_param") or 0) for e in small],
                                 [float(e.get("n_param") or 0) for e in big])
            (cs, bs), (cb, bb) = self._slice_line(small), self._slice_line(big)
            c, beta = (1.0 - w) * cs + w * cb, (1.0 - w) * bs + w * bb
        return self.time_scale * c, beta

    def _whole_slice_waits(self, es, ranks_per_host, n_gpu) -> list:
        """The entries with ``slice_wait`` as the wait ``queueing.with_slice_wait``
        composes with the model's barrier: the sweep measured it beyond a
        model that priced the barrier alone (``fit_steps.anchor_contention``),
        so each swept run's own barrier (the model's, without the slice wait)
        is put back as the composition says."""
        from .model import RUNNER_SWEEP_IMPL, per_swept_run
        from .queueing import slice_from_excess
        bare = per_swept_run(self, ranks_per_host, n_gpu, {"impl": RUNNER_SWEEP_IMPL}, "_bare_barriers",
                             lambda e, ref: ref.t_barrier, slice_wait=(0.0, 0.0), wake=0.0)
        # In the sweep's seconds, as the entries' waits (c is rescaled after the fit).
        return [dict(e, slice_wait=slice_from_excess(bare.get(e.get("model"), 0.0) / self.time_scale,
                                                     e["slice_wait"])) for e in es]

    @staticmethod
    def _slice_line(es) -> tuple:
        """``(c, beta)`` of ``slice_wait = c + beta T_GPU`` through entries
        (NNLS); one net, or T_GPUs less than 2x apart: the median wait when
        the steps agree, the median fraction of the step when one net."""
        t = np.array([e["cycle"]["T_GPU"] for e in es], float)
        w = np.array([e["slice_wait"] for e in es], float)
        if len({e.get("model") for e in es}) < 2:
            return 0.0, max(float(np.median(w / t)), 0.0)
        if t.max() < 2 * t.min():
            return max(float(np.median(w)), 0.0), 0.0
        from scipy.optimize import nnls
        c, beta = nnls(np.column_stack([np.ones_like(t), t]), w)[0]
        return float(c), float(beta)

    def cycle_gap(self, ranks_per_host: int, n_gpu: int, model: str = "") -> tuple:
        """``(c, beta)``: a worker's whole cycle beyond its timed steps,
        ``c + beta * T_GPU`` seconds, for this host sharing, NNLS on relative
        residuals over the swept nets' runner entries (``fit_steps.cycle_gap``
        times their measured T_GPU); with fewer than two nets or T_GPUs less
        than 2x apart ``(0, median fraction)``; ``(0, 0)`` where not measured.

        Not a fraction alone: on 3 ranks the gap is about half a millisecond
        (a time slice) plus a few % of the step -- tiny 60 % of its 0.9 ms
        T_GPU, cifar 7 % of 87 ms; one fraction put 25 % on a held-out net's
        10 ms step that waited 11 %."""
        # Every swept net's entry, a swept net's own too: one line through
        # them prices its other N_Subbatch as well.
        es = [e for e in self._contention() if e["ranks"] == ranks_per_host and e["workers"] == n_gpu
              and e.get("cycle_gap") is not None and (e.get("cycle") or {}).get("T_GPU")]
        if not es:
            return 0.0, 0.0
        t = np.array([e["cycle"]["T_GPU"] for e in es], float)
        g = np.array([max(e["cycle_gap"], 0.0) for e in es], float)
        if len({e.get("model") for e in es}) < 2 or t.max() < 2 * t.min() or not (g > 0).all():
            return 0.0, float(np.median(g))
        from scipy.optimize import nnls
        gap = g * t
        c, beta = nnls(np.column_stack([1.0 / gap, t / gap]), np.ones_like(gap))[0]
        return self.call_scale * float(c), float(beta)

    def contention_entry(self, ranks_per_host: int, n_gpu: int, model: str = ""):
        """The contention sweep's record for exactly this sharing (this net's
        when it was swept), or None."""
        return (self._sharing(self._contention(), ranks_per_host, n_gpu, model) or [None])[0]

    def allreduce_load(self, ranks_per_host: int, n_gpu: int, model: str = "") -> float:
        """Allreduce time under the workers' load over the allreduce fit's
        (swept on an idle host): on a shared CPU host the collective's polls
        wait for cores. From the contention sweep's in-situ allreduces of
        this sharing (timed from the last rank's arrival), this net's where
        swept, else the mean over nets; 1 when not measured."""
        es = self._sharing([e for e in self.data.get("contention", {}).get("entries", [])
                            if e.get("allreduce") and e.get("n_param") and e["ranks"] > 1],
                           ranks_per_host, n_gpu, model)
        if not es or "allreduce" not in self.data:
            return 1.0
        # Against the unscaled fit: both were measured on the profiled machine.
        return float(np.mean([e["allreduce"] * self.time_scale / self.allreduce_bw(e["ranks"], e["n_param"])
                              for e in es]))

    def updater_slowdown(self, model: str = "", phi: float | None = None) -> float:
        """Factor for the updater's own steps on a shared CPU host: the one
        of an undisturbed (1, 1) run times the memory-bandwidth share of two
        busy processes (the (2, 1) sharing's rel); the updater outranks the
        niced workers for the cores themselves."""
        e = self.contention_entry(2, 1, model)
        bw = max(float(e.get("rel") or 1.0), 1.0) if e else 1.0
        return self.slowdown(1, 1, model, phi) * bw

    def slowdown(self, ranks_per_host: int, n_gpu: int, model: str = "", phi: float | None = None,
                 shares: dict | None = None, n_param: int | None = None) -> float:
        """Per-step time factor when ``ranks_per_host`` processes of ``n_gpu``
        worker threads share the host, relative to the profile's own sweeps.

        Measured by the contention sweep for (ranks, workers) pairs and
        nets. A swept net gets its own; another net is placed between the
        swept ones by ``phi``, the share of its step spent in per-call
        Python (``model.python_share``): worker threads of one process
        queue for the GIL in those parts only, so ``tiny`` (phi 0.4) slows
        2.5x with two workers and ``cifar`` (phi 0.01) 1.2x, and a net in
        between, or the same net at another N_Subbatch, slows in between.
        Without ``phi`` (or phi-less entries), the mean over nets.
        Unmeasured pairs scale the nearest measured one by the thread count.
        ``shares``: {swept net: the core share its own updaters left its
        workers in its run} (``model.swept_shares``); a net not swept gets
        the swept ones' slowdowns divided by them, read by ``_excess``
        (``n_param``: this net's parameter count).
        """
        entries = self._contention()
        threads = ranks_per_host * n_gpu
        if not entries:
            return max(1.0, threads / max(self.cores, 1))

        def ratio(e):
            # rel: this sharing against one thread measured alongside it;
            # host: that thread's time over an undisturbed step's CPU time.
            h = self.host_factor.get(e.get("model"), self.host_factor.get("*")) \
                if self.host_factor else None
            if "rel" in e and e.get("rel"):
                if e.get("solo_wall"):
                    # A probe (sweep.probe_host) gives the machine's drift
                    # since the sweep: it scales the stored factor.
                    return max(e["rel"], 1.0) * e["host"] * (h if h is not None else 1.0)
                # Sharing the host cannot make a step faster: a measured rel
                # below 1 is the other jobs' load dropping during the pair.
                # Older entries: a probe's wall/CPU replaces the load.
                return max(e["rel"], 1.0) * (h if h is not None else e["host"])
            return e["ratio"]
        same = self._sharing(entries, ranks_per_host, n_gpu, model)
        if shares and all(e.get("model") != model for e in same):
            raw = ratio
            ratio = lambda e: raw(e) / shares.get(e.get("model"), 1.0)   # noqa: E731
            if phi is not None and same:
                return self._excess(same, ratio, phi, n_param)
        if same:
            if phi is not None and all(e.get("model") != model for e in same):
                # Read in sqrt(phi): the slowdown climbs fastest at small
                # phi (chosen on the validation's development set, run 1 of
                # bench/RESULTS.md section 4, and judged on held-out set 2).
                pts = sorted((math.sqrt(e["phi"]), ratio(e)) for e in same if e.get("phi") is not None)
                if len({x for x, _ in pts}) >= 2:
                    xs, ys = zip(*pts)
                    return float(np.interp(math.sqrt(max(phi, 0.0)), xs, ys))   # clamped to the swept range
            return float(np.mean([ratio(e) for e in same]))
        near = min(entries, key=lambda e: (abs(e["ranks"] * e["workers"] - threads), e.get("model") != model))
        return ratio(near) * max(1.0, threads / max(near["ranks"] * near["workers"], 1))
