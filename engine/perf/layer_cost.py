"""What one layer costs in a net step: its kernels (or whole ops) as the
profile prices them, plus the per-layer terms fitted on real passes.

``layer_kernels`` lists what a layer runs; ``compute_gradient_terms``
prices a whole ComputeGradient layer by layer; ``python_share`` is the
share of it in per-call costs. ``engine.perf.model`` builds Algorithm 1's
steps on these (and re-exports them).
"""
from __future__ import annotations

from engine import spec as spec_mod

from .cache_decay import aged_share, step_passes
from .l2_refill import REFILL_CALL_LABEL, REFILL_LABEL, l2_weight_bytes
from .pool_cost import pool_size
from .sweep_ops import OP_KINDS


def bytes_beyond_l2(n_floats, l2_bytes) -> float:
    """Bytes of ``n_floats`` float32 values that do not fit in an L2 of
    ``l2_bytes``: what the cold-weight terms of the layers and of the
    runner's ComputeGradient (fit and prediction alike) are priced on."""
    return float(max(4.0 * n_floats - l2_bytes, 0.0))


def cold_weight_bytes(g, l2_bytes) -> float:
    """Bytes of a layer's weights beyond one core's L2 cache (0 without one).

    The op sweeps call each op in a loop, its weights warm in the caches; in
    a net step the other layers stream their data between two calls, and
    weights larger than the L2 come back from memory: cifar's fc1 (8 MiB)
    forward takes 3.4-9 ms in a step against 2.0-2.4 ms in its sweep."""
    if not l2_bytes:
        return 0.0
    return bytes_beyond_l2(spec_mod._prod(g.w_shape), l2_bytes)


# The layer terms whose passes also pay per float of the layer's input
# (``fc_input_floats``; the ``x`` of a fitted term): hidden FC layers only.
INPUT_TERM_KEYS = ("fc_fwd", "fc_bwd")
# The columns of a layer term beside ``f`` (``fit_steps.fit_layer_terms``):
# the per-call ``b``, the cold weights ``w``, the input ``x`` (for the keys
# of ``INPUT_TERM_KEYS``) and the refills ``r`` and ``s`` (``l2_refill``; for
# the keys the fit is given).
TERM_COLUMNS = ("b", "w", "x", "r", "s")


def fc_input_floats(g, n) -> float:
    """Floats of hidden-or-output FC layer ``g``'s input at batch ``n`` (0 for
    a convolution): what the ``x`` of its layer term prices, for the keys of
    ``INPUT_TERM_KEYS``.

    A hidden FC pass in a step runs beyond ``f`` times its op sweep by an
    amount that grows with its input at a fixed batch: at batch 16 the
    swept nets' fc1 passes (the records of bench/profiles/cpu_test12) ran
    2.0-3.1 ns per input float beyond the op swept at the same shape, where
    per weight the same excess spread 0.19-0.57 ns; at batch 1 it is
    smaller. The op sweep calls the op back to back; in a step the layers
    before it stream their maps between two calls and the op's code, weights
    and buffers come back from further out (timed alone, 16 MB read between
    two calls added 31-45 us to fc ops of 0.07-0.9 MB of weights, a fresh
    input alone nothing). How much of that a step evicts grows with the maps
    the layers before write, which for the first FC layer is a multiple of
    its input. ``f`` alone priced heldout-w3's fc1 backward -52 % and
    heldout-k5w's -28 % (test sets 9 and 10). Output layers keep ``f``:
    with the input term heldout-d8's (a 3584-wide map, 10 outputs) came out
    +40 %, and their records do not call for it."""
    return float(n * spec_mod._prod(g.in_shape)) if g.kind == "fc" else 0.0


def streams_in_sweep(g, l2_bytes) -> bool:
    """Whether FC layer ``g``'s weights overflow one core's L2 (either pass,
    any batch: the batch and the pass stopped mattering in session 18): the
    in-step factor ``f`` of the layer terms is what a step adds to an op
    its sweep ran with the weights in the L2 (the step streams the other
    layers' data between two calls); a sweep whose weights came from beyond
    the L2 ran as the step does, and only the cold-weight term (``w``) adds
    to it. Fitted and priced so (``l2_only`` in a layer term) since test
    set 9: heldout-shallow's fc1 (2352 x 256, 2.4 MB of weights) ran its
    backward in a step at 1.0-1.2x its op sweep, f priced 1.26x.

    Until session 18 the weights, input and output (the backward's dW and dX
    besides) were counted against the L2: passes of weights well inside it
    flipped to 1x at a larger batch while a step still ran them at 1.5-2.4x
    their sweep: heldout-wide's fc1 backward (903 KB) in the records of
    cpu_test17 at 1.7-2.0x for batches 1-8 and 2.2-2.35x at 16 and 32
    (priced -45 / -36 %), heldout-c3w's fc1 backward (1.0 MB, set 15) -45 %,
    heldout-c3x's fc1 forward (1.8 MB, set 14) -33 / -39 %. Counting the
    weights alone, the per-layer medians of sets 14-15 (re-predicted,
    cpu_test17 refitted) went 8.2 / 9.6 -> 8.0 / 9.2 % with the fit of the
    FC backwards closer (median 11.2 -> 10.8 %, held out 12.7 -> 11.2 %).
    Convolutions keep f: no measurement told them apart."""
    if g.kind != "fc" or not l2_bytes:
        return False
    return 4 * spec_mod._prod(g.w_shape) > l2_bytes


def in_step_factor(term, g, l2_bytes, default=1.0) -> float:
    """The factor on a layer pass's kernels: its term's ``f`` (``default``
    without one), 1 for a pass whose sweep streamed (``streams_in_sweep``)
    where the term was fitted that way."""
    if not term:
        return default
    return 1.0 if term.get("l2_only") and streams_in_sweep(g, l2_bytes) else term["f"]


def layer_term_keys(kind, i, n_layers, pas) -> tuple:
    """The per-layer term keys of pass ``pas`` of layer ``i`` (of
    ``n_layers``), the most specific first.

    A net's first convolution (``conv1_*``) and its output layer
    (``fcout_*``) are fitted apart from the other layers of their kind. The
    first convolution reads the batch the loader wrote, over 1-3 channels,
    and has no dX; the output layer's passes are a few small GEMMs beside
    the softmax. On the sweeps of test sets 3 and 4 (bench/RESULTS.md
    section 4) first convolutions ran 1.1-1.9x their op prices inside a step
    against 0.9-1.25x for the others, and output-layer forwards 1.5-2.2x
    against 1.0-1.3x: one factor per kind priced both wrong. Profiles fitted
    before have the kind keys (``conv_fwd``, ...) only."""
    role = "conv1" if kind == "conv" and i == 0 else ("fcout" if kind == "fc" and i == n_layers - 1 else None)
    return ((f"{role}_{pas}",) if role else ()) + (f"{kind}_{pas}",)


def layer_term(terms, kind, i, n_layers, pas):
    """The fitted term of a layer pass: its role's if fitted, else its kind's."""
    for key in layer_term_keys(kind, i, n_layers, pas):
        if key in terms:
            return terms[key]
    return None


def layer_kernels(g, n: int, first: bool, last: bool, ops=frozenset()):
    """(pass, kernel, size) of every kernel one layer runs for its batch.

    ``size`` is an (m, n, k) tuple for SGEMMs (kernel ``sgemm_nn|nt|tn`` by
    transposition) and an element count for the rest. This mirrors
    engine.layers / engine.ops.conv: conv forward = im2col, SGEMM, the
    CNHW->NCHW copy that adds the bias, max-pool, ReLU (on the pooled map);
    backward = ReLU', pool', im2col again, the NCHW->CNHW copy that also
    sums db, the dW SGEMM and, except for the first layer, the dX SGEMM and
    col2im. FC: SGEMM + bias (+ ReLU); backward dW, db, dX SGEMMs.

    ``ops``: the whole-op fits the profile has for the path in force
    (``Profile.op_kinds``). With them a layer is its ops as engine.layers
    calls them: the implicit convolution (ReLU fused, db inside its
    backward) and max-pool, or linear_forward/backward and ReLU; sizes are
    the forward GEMM's (m, n, k) and, for convolutions, the kernel side,
    the batch and the input's height and width (``Profile.op``: which
    kernel runs the op, ``conv_tiles``).
    """
    ks = []
    kind_ops = (("conv_fwd", "conv_bwd_dw" if first else "conv_bwd") if g.kind == "conv"
                else ("fc_fwd", "fc_bwd_dw" if first else "fc_bwd"))
    if all(k in ops for k in kind_ops):
        return _op_kernels(g, n, last, kind_ops)
    if g.kind == "conv":
        conv_out = spec_mod._prod(g.extra["conv_out"]) * n
        pooled = spec_mod._prod(g.out_shape) * n
        side = g.extra["conv_out"][1]
        # (elements, contiguous segments): one segment per (k, n, output row)
        # for im2col/col2im, per (n, channel) for the layout copies.
        cols = (g.im2col_elems, g.im2col_elems // side)
        lay = (conv_out, n * g.w_shape[0])
        ks += [("fwd", "im2col", cols), ("fwd", "sgemm_nn", g.gemm_fwd), ("fwd", "to_nchw", lay)]
        if g.pool > 1:
            ks.append(("fwd", "pool_fwd", pool_size(g, n)))
        ks += [("fwd", "relu_fwd", pooled), ("bwd", "relu_bwd", pooled)]
        if g.pool > 1:
            ks.append(("bwd", "pool_bwd", pool_size(g, n)))
        ks += [("bwd", "im2col", cols), ("bwd", "to_cnhw", lay), ("bwd", "sgemm_nt", g.gemm_dw)]
        if not first:
            ks += [("bwd", "sgemm_tn", g.gemm_dx), ("bwd", "col2im", cols)]
    else:
        out = g.out_shape[0] * n
        ks += [("fwd", "sgemm_nt", g.gemm_fwd), ("fwd", "bias", out)]
        if g.relu:
            ks += [("fwd", "relu_fwd", out), ("bwd", "relu_bwd", out)]
        if last:
            # Net.loss_and_grad runs it between the passes, outside the layer.
            ks.append(("loss", "softmax", out))
        ks += [("bwd", "sgemm_tn", g.gemm_dw), ("bwd", "bias_grad", out)]
        if not first:
            ks.append(("bwd", "sgemm_nn", g.gemm_dx))
    return ks


def _op_kernels(g, n, last, kind_ops):
    fwd, bwd = kind_ops
    if g.kind == "conv":
        # the kernel side, then the geometry that picks the kernel (conv_tiles)
        size = tuple(g.gemm_fwd) + (g.w_shape[2], n) + tuple(g.in_shape[1:])
        ks = [("fwd", fwd, size)] + ([("fwd", "pool_fwd", pool_size(g, n))] if g.pool > 1 else [])
        ks.append(("bwd", "relu_bwd", spec_mod._prod(g.out_shape) * n))
        return ks + ([("bwd", "pool_bwd", pool_size(g, n))] if g.pool > 1 else []) + [("bwd", bwd, size)]
    out = g.out_shape[0] * n
    ks = [("fwd", fwd, tuple(g.gemm_fwd))]
    if g.relu:
        ks += [("fwd", "relu_fwd", out), ("bwd", "relu_bwd", out)]
    if last:
        ks.append(("loss", "softmax", out))
    return ks + [("bwd", bwd, tuple(g.gemm_fwd))]


def kernel_time(profile, kern, size) -> float:
    """Profile price of one row of ``layer_kernels``."""
    if kern in OP_KINDS:
        return profile.op(kern, *size)
    if kern.startswith("sgemm"):
        return profile.sgemm(*size, trans=kern.split("_")[1])
    return profile.term(kern, size)


def python_share(spec, n_subbatch, profile, rows=None) -> float | None:
    """Share of a ComputeGradient spent in per-call costs (the ``per-call``
    rows of the layer terms: Python and fixed costs around each kernel);
    None for profiles without layer terms. It places a net the contention
    sweep did not run between those it did (``Profile.slowdown``).
    ``rows``: the net's ``compute_gradient_terms`` when the caller has them."""
    if not profile.data.get("layer_terms"):
        return None
    if rows is None:
        rows = compute_gradient_terms(spec_mod.get_spec(spec), n_subbatch, profile, measured=False)
    tot = sum(r[4] for r in rows)
    return sum(r[4] for r in rows if r[2] == "per-call") / tot if tot > 0 else None


def compute_gradient_terms(spec, n_subbatch, profile, kernels_only=False, measured=True):
    """Per layer, pass and kernel: [(layer, pass, kernel, size, seconds)].

    Pass is ``fwd``, ``bwd`` or ``loss`` (the softmax between them). With
    the profile's per-layer terms (``fit.fit_layer_terms``) each layer pass
    is ``f * kernels`` plus a ``per-call`` row ``b`` for its kind (or role,
    ``layer_term_keys``) and pass;
    older profiles scale every kernel by one ``kernel_factor`` and add a
    ``per_layer`` overhead. ``kernels_only``: the swept kernels alone.
    With ``profile.layer_measure`` (``--measure-layers``) and ``measured``,
    each layer pass is the pass timed on this machine instead
    (``measure_layers.measured_rows``).
    """
    if measured and not kernels_only and getattr(profile, "layer_measure", None) is not None:
        from .measure_layers import measured_rows
        return measured_rows(spec, n_subbatch, profile,
                             compute_gradient_terms(spec, n_subbatch, profile, measured=False))
    geoms = spec_mod.layers(spec, n_subbatch)
    lt = {} if kernels_only else profile.data.get("layer_terms", {})
    # Sweeps time kernels on warm caches; a whole step runs slower by the
    # fitted factor (1 when the profile has no net-step fit).
    factor = 1.0 if (kernels_only or lt) else (profile.overhead("kernel_factor") or 1.0)
    rows, colds = [], []
    ops = profile.op_kinds()
    l2 = profile.data.get("cache", {}).get("l2_bytes")
    for i, g in enumerate(geoms):
        for pas, kern, size in layer_kernels(g, n_subbatch, i == 0, i == len(geoms) - 1, ops):
            t = kernel_time(profile, kern, size)
            term = layer_term(lt, g.kind, i, len(geoms), pas)
            rows.append((g.name, pas, kern, size, in_step_factor(term, g, l2, factor) * t))
        if kernels_only:
            continue
        if lt:
            cold, warm = cold_weight_bytes(g, l2), l2_weight_bytes(g, l2)
            for pas in ("fwd", "bwd"):
                term = layer_term(lt, g.kind, i, len(geoms), pas)
                if term and term["b"] > 0:
                    rows.append((g.name, pas, "per-call", 1, profile.call_scale * term["b"]))
                if term and term.get("w", 0.0) > 0 and cold > 0:
                    colds.append((g.name, pas, "cold-weights", cold, profile.time_scale * term["w"] * cold,
                                  term.get("tau")))
                refills = term and not streams_in_sweep(g, l2)
                if refills and term.get("r", 0.0) > 0 and warm > 0:
                    colds.append((g.name, pas, REFILL_LABEL, warm, profile.time_scale * term["r"] * warm,
                                  term.get("tau")))
                if refills and term.get("s", 0.0) > 0:
                    colds.append((g.name, pas, REFILL_CALL_LABEL, 1, profile.call_scale * term["s"], term.get("tau")))
                xin = fc_input_floats(g, n_subbatch)
                if term and term.get("x", 0.0) > 0 and xin > 0:
                    rows.append((g.name, pas, "input", xin, profile.time_scale * term["x"] * xin))
        elif profile.overhead("per_layer"):
            rows.append((g.name, "fwd+bwd", "overhead", 1, profile.overhead("per_layer")))
    return rows + _cold_rows(rows, colds)


def _cold_rows(rows, colds):
    """The ``cold-weights`` and ``l2-refill`` rows (``colds``: (layer, pass,
    label, bytes, full price, tau)): each layer pass's full price (all its
    bytes from memory) times ``aged_share``, its refill share at its age in the step
    the rows price, steps run back to back. The ages hold the cold rows
    themselves: a few rounds reach the fixed point (the shares saturate).
    The step is its layer passes, as the fit reads it from the records."""
    if not colds:
        return []
    got = [(name, pas, label, cold, full) for name, pas, label, cold, full, _ in colds]
    for _ in range(50):
        per, step = step_passes((r[0], r[1], r[4]) for r in rows + got if r[1] in ("fwd", "bwd"))
        new = [(name, pas, label, cold, full * aged_share(per, step, name, pas, tau))
               for name, pas, label, cold, full, tau in colds]
        done = max(abs(a[4] - b[4]) for a, b in zip(new, got)) <= 1e-12 * step
        got = new
        if done:
            break
    return got
