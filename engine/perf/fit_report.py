"""The fit table of a machine profile (``sprint profile`` prints it): for
every fit its points and relative errors on the fitted and the held-out
points, and what each fit holds out. Apart from fit.py, which fits; this
only reads the fitted profile dict."""
from __future__ import annotations

from .fit_steps import HOLDOUT
from .profile import Profile


def format_errors(prof: dict) -> str:
    """One line per fit: its points and relative errors on fitted and held-out points."""
    def cell(e):
        if not e or not e.get("n"):
            return f"{'-':>22}"
        return f"{e['n']:>4} {100 * e['median']:>6.1f} {100 * e['p90']:>6.1f}%"
    lines = [f"{prof.get('machine', '')} ({prof.get('backend', '')}, {prof.get('cores', '?')} cores), "
             f"{prof.get('date', '')}",
             f"{'fit':<22}{'fitted: n med p90':>22}{'held out: n med p90':>24}"]
    for var, v in sorted(prof.get("sgemm", {}).get("variants", {}).items()):
        label = f"sgemm_{var} ({len(v['regimes'])} regimes)"
        lines.append(f"{label:<22}{cell(v['error']['fit'])}  {cell(v['error']['holdout'])}")
        if "net_shapes" in v["error"]:
            lines.append(f"{'  net shapes':<22}{'':>22}  {cell(v['error']['net_shapes'])}")
    for name, o in sorted(prof.get("ops", {}).items()):
        # a fit per kernel (conv_tiles) prices what has its geometry, and gave the errors
        parts = f"{len(o['kernels'])} kernels" if o.get("kernels") is not None else f"{len(o['regimes'])} regimes"
        lines.append(f"{name + ' (' + parts + ')':<22}{cell(o['error']['fit'])}  {cell(o['error']['holdout'])}")
    for name, t in sorted(prof.get("terms", {}).items()):
        lines.append(f"{name:<22}{cell(t['error']['fit'])}  {cell(t['error']['holdout'])}")
    if "allreduce" in prof:
        a = prof["allreduce"]
        lines.append(f"{'allreduce':<22}{cell(a['error']['fit'])}  {cell(a['error']['holdout'])}")
    for key, t in sorted(prof.get("layer_terms", {}).items()):
        lines.append(f"{'layer ' + key.replace('_', ' '):<22}{cell(t['error']['fit'])}  {cell(t['error']['holdout'])}"
                     f"  f {t['f']:.2f}, b {1e6 * t['b']:.1f} us"
                     + (f", w {1e3 * t['w'] * 2 ** 20:.2f} ms/MiB beyond the L2" if t.get("w") else "")
                     + (f", x {1e9 * t['x']:.2f} ns per input float" if t.get("x") else "")
                     # l2_refill: at full age, the share of the pass's age (tau) times these
                     + (f", refill r {1e3 * t.get('r', 0.0) * 2 ** 20:.2f} ms/MiB in the L2 + s"
                        f" {1e6 * t.get('s', 0.0):.1f} us (tau {1e3 * t.get('tau', 0.0):.1f} ms)"
                        if t.get("r") or t.get("s") else ""))
    lines += _decay_lines(prof)
    ov = prof.get("overhead", {})
    if "error" in ov and isinstance(ov["error"], dict):
        e = ov["error"]
        if e.get("kernels_only"):
            lines.append(f"{'net step (kernels)':<22}{cell(e.get('kernels_only'))}  "
                         f"{cell(e.get('holdout_kernels_only'))}")
        lines.append(f"{'net step (+overhead)':<22}{cell(e.get('fit'))}  {cell(e.get('holdout'))}")
    if ov.get("runner_steps"):
        p = Profile(prof)
        # A vector-sized step fitted whole (vector_age.fit_vector_step) prints its own terms.
        whole = lambda k, v: (f"{k} {1e6 * v['c']:.1f} us + {1e12 * v['d']:.0f} ps/param/pass"
                              f" + {1e12 * v['e']:.0f} ps/byte beyond the L2 by age")
        lines.append("runner excess per call: " + ", ".join(
            whole(k, v) if isinstance(v, dict) and "d" in v else
            "{} {:.1f} us + {:.0f} % of its kernel".format(k, *(f * x for f, x in zip((1e6, 100),
                                                                                    p.runner_step_terms(k))))
            for k, v in ov["runner_steps"].items()))
    lines.append("held out of each fit (never fitted): " + "; ".join(f"{k}: {v}" for k, v in HOLDOUT.items()))
    return "\n".join(lines)


def _decay_lines(prof) -> list:
    """The refill decay's taus per pass, and a note where one stopped at the
    longest gap swept (``cache_decay.fit_refill_tau``): the op's time still
    climbed there, and what the caches lose beyond it is not measured
    (cpu_test22's backward: a line over 0-64 ms)."""
    from .cache_decay import DECAY_GAPS
    taus = {}
    for key, t in (prof.get("layer_terms") or {}).items():
        if isinstance(t, dict) and t.get("tau"):
            taus.setdefault(key.rsplit("_", 1)[-1], float(t["tau"]))
    if not taus:
        return []
    top = max(DECAY_GAPS)
    capped = [pas for pas, tau in taus.items() if abs(tau - top) < 1e-12]
    return ["refill decay: tau " + ", ".join(f"{pas} {1e3 * tau:.1f} ms" for pas, tau in sorted(taus.items()))
            + (f" ({' and '.join(sorted(capped))} capped at the longest gap swept, {1e3 * top:.0f} ms: the op "
               "still slowed there; the decay beyond it is not measured)" if capped else "")]
