"""What a layer pass fetches again in a step after its data aged: the
refill columns of a layer term, ``r`` (seconds per byte of the weights the
op sweep read from the L2) and ``s`` (seconds per pass: its code, buffers
and Python objects), each times the refill share of the pass's age
(``cache_decay``). ``fit_steps.fit_layer_terms`` fits them for the keys
it is given (``REFILL_KEYS`` by default), ``layer_cost.compute_gradient_terms``
prices what a profile has.

The op sweeps call each op back to back, its weights and gradient warm. In
a step the forward reads weights the previous backward left a step before,
the backward writes a gradient it wrote one step before, and on this VM the
caches empty with age: heldout-k5d's fc1 (88 x 1600, 563 KB of weights,
batch 19) ran its dW GEMM in 347 us inside the step against 53 us alone,
its own buffers timed alone ran at the sweep's price (2026-12-01 23:25 UTC,
one thread). The gapped layer-pass sweep (``sweep_layer_passes``) times
the passes at the age of a long step.

Fitted for the FC forwards, hidden and output (``REFILL_KEYS``). How much a pass
refills changed by 2-3x between the hours of the seen test sets
(heldout-w3's fc1 backward at batch 11: 172 us in set 9, 530 us at 23:40
UTC), and with the backwards or the output layers fitted too, from either
hour's records, other seen sets came out worse (``python
bench/layer_terms_holdout.py --refill-keys ... --validations ...``; the
gapped records of 2026-12-01 23:41 UTC: bench/profiles/cpu_test15L_records.json).
The hidden FC forwards were priced short on balance (signed median
-14 % over sets 5-13's 40 such passes with the terms off); from
cpu_test14's records (no gapped passes) the fit gives them ``s`` alone, 24
us a pass at full age, and the per-layer median of sets 5-13 (re-predicted)
went 12.8 -> 12.7 % (calibrated 12.4 -> 11.4 %, lower on every set with a
calibration).

The output layers' forwards since session 18: their weights are a few KB,
but the step evicts their code and buffers as it does a hidden layer's, the
more the longer the step: over the layer-pass records of cpu_test17 the
term without refills priced them from -56 % (heldout-allconv at batch 32,
cifar at every batch: long steps) to +56 % (heldout-b at batch 1), fit
median 21 %, and sets 14-15 -23 % (signed median). With ``r`` and ``s``
the fit median is 14 % and sets 14-15's output forwards -5 %; the backwards
were tried too and left out (sets 14 and 8 worse).
"""
from __future__ import annotations

from engine import spec as spec_mod

# The layer-term keys fitted with the refill columns by default (above).
REFILL_KEYS = ("fc_fwd", "fcout_fwd")
# The row labels of the refill terms in ``compute_gradient_terms``.
REFILL_LABEL, REFILL_CALL_LABEL = "l2-refill", "refill-per-call"


def l2_weight_bytes(g, l2_bytes) -> float:
    """Bytes of layer ``g``'s weights (and so of its gradient) that fit in one
    core's L2 of ``l2_bytes``: what the sweep ran warm and an aged step
    refills (0 without a known L2)."""
    if not l2_bytes:
        return 0.0
    return float(min(4.0 * spec_mod._prod(g.w_shape), l2_bytes))
