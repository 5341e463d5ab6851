"""The ranges of ``sprint predict | simulate | tune | plan``'s sizes: a size
no run can have (more workers than the epoch has samples, a minibatch
larger than the epoch) is one ``sprint: error:`` line naming its option; a
legal size far outside what the profile measured is priced, with a warning
saying so. Before any of them was checked, ``predict --nodes 100000000``
printed a T_Epoch of nanoseconds and ``tune --target-minibatch 1e12``
listed minibatches of a thousand epochs without a word; ``simulate
--nodes 1024`` ran for minutes in silence. Only the options are judged
here: no prediction changes."""
from __future__ import annotations

from engine.errors import RunError

# A sweep's allreduce is timed at ``sweep.QUICK["ranks"]`` ranks (2-4 on the
# build machine); its log2 N fit is read up to this many times the most ranks
# it measured before the warning says the rest is extrapolated.
EXTRAPOLATION_FACTOR = 16

# Worker steps a simulation takes about a second for (the event loop's rate
# on the build machine, 9-10 us a step at 16-128 nodes of tiny); beyond
# SIMULATION_WARN_S the warning gives the estimate before the wait.
SIMULATED_STEPS_PER_S = 1e5
SIMULATION_WARN_S = 30.0

# The Downpour simulation's pace (replica steps a second, 4096 replicas of
# tiny on the build machine) and the closed form's (configurations a second
# that sprint tune prices: on the Xeon VM of 2026-12-02, 36 for tiny and 15
# for cifar, the slower taken; the AMD EPYC VM is about half as fast): the
# warnings' estimates.
DOWNPOUR_STEPS_PER_S = 5e4
CONFIGURATIONS_PER_S = 15.0

# A calibration longer than this is a typo (it is a few seconds by default):
# refused rather than waited for.
CALIBRATION_MAX_S = 600.0


def epoch_samples(model, n_file=None) -> int:
    """N_File the cost models take for ``model`` (their default when
    ``--n-file`` is not given)."""
    from engine import spec as spec_mod
    from .model import N_FILE
    return int(n_file or N_FILE.get(spec_mod.get_spec(model).name, 50000))


def _n_file_where(model, n_file) -> str:
    return "--n-file" if n_file else f"N_File of {model}'s epoch; --n-file sets it"


def check_config(model, n_node: int, n_gpu: int, n_subbatch: int, n_file=None, nodes_flag="--nodes"):
    """Refuse a configuration no run can have: more workers than the epoch
    has samples, or one worker step larger than the epoch."""
    total = epoch_samples(model, n_file)
    where = _n_file_where(model, n_file)
    if n_subbatch > total:
        raise RunError(f"N_Subbatch {n_subbatch:,} is more than the {total:,} samples of an epoch ({where}): "
                       f"one worker step would take the epoch more than once", "--subbatch")
    if n_node * n_gpu > total:
        workers = f"{n_node:,} x {n_gpu:,} workers" if n_gpu > 1 else f"{n_node:,} workers"
        raise RunError(f"{workers} are more than the {total:,} samples of an epoch ({where}): "
                       f"some would never take a step", nodes_flag)


def check_calibration(args):
    secs = getattr(args, "calibrate_seconds", None)
    if getattr(args, "calibrate", True) and secs is not None and secs > CALIBRATION_MAX_S:
        raise RunError(f"must be at most {CALIBRATION_MAX_S:g} s (a few seconds calibrate), got {secs:g}",
                       "--calibrate-seconds")


def measured_ranks(profile):
    """The most ranks the profile's allreduce was timed at, or None (a
    synthetic or datasheet profile, a GPU profile: nothing measured here)."""
    data = getattr(profile, "data", None) or {}
    if not data.get("sweep") or not data.get("allreduce") or data.get("backend", "cpu") != "cpu":
        return None
    from .sweep import mode_config
    return max(mode_config(bool(data["sweep"].get("quick", True)))["ranks"])


def node_warning(n_node: int, profile, flag="--nodes") -> str:
    """'' or why N_Node is far outside the profile's measured allreduce."""
    top = measured_ranks(profile)
    if top is None or n_node <= EXTRAPOLATION_FACTOR * top:
        return ""
    return (f"{flag} {n_node:,}: the profile's allreduce was timed at up to {top} ranks; its log2 N fit is "
            f"read here {n_node / top:,.0f}x beyond that, where no run has checked it")


def round_warning(n_node: int, n_gpu: int, n_subbatch: int, total: int) -> str:
    """'' or why an ASGD epoch ends before its workers' first round of steps."""
    one_round = n_node * n_gpu * n_subbatch
    if one_round <= total:
        return ""
    return (f"N_Node x N_GPU x N_Subbatch = {one_round:,} samples is more than the epoch's {total:,}: the epoch "
            f"ends before every worker took one step, so T_Epoch is a fraction of one step and the steady "
            f"state (N_Minibatch_avg, staleness) is never reached")


def simulation_warning(prediction, n_updates: int, warmup: int = 40) -> str:
    """'' or how long the ASGD simulation will take: about N_Minibatch_avg /
    N_Subbatch worker steps for each simulated update."""
    per_update = prediction.n_minibatch_avg / max(prediction.n_subbatch, 1)
    steps = (n_updates + warmup) * per_update
    secs = steps / SIMULATED_STEPS_PER_S
    if not secs > SIMULATION_WARN_S:
        return ""
    return (f"about {steps:,.0f} worker steps to simulate ({per_update:,.0f} an update x {n_updates + warmup} "
            f"updates): about {secs / 60:.0f} min at this machine's pace; --updates or fewer nodes shorten it, "
            f"sprint predict gives the closed form at once")


def check_target(model, target: float, n_file=None):
    """``tune --target-minibatch``: at most the epoch's samples (an update
    each epoch at the least)."""
    total = epoch_samples(model, n_file)
    if target > total:
        raise RunError(f"{target:g} samples per update is more than the {total:,} samples of an epoch "
                       f"({_n_file_where(model, n_file)}): at most {total:,}", "--target-minibatch")
    return total


def downpour_warning(n_node: int, steps: int) -> str:
    """'' or how long the Downpour simulation of ``steps`` steps per replica takes."""
    secs = n_node * steps / DOWNPOUR_STEPS_PER_S
    if not secs > SIMULATION_WARN_S:
        return ""
    return (f"{n_node:,} replicas x {steps:,} steps to simulate: about {secs / 60:.0f} min at this machine's pace; "
            f"--steps shortens it, sprint predict gives the closed form at once")


def search_warning(n_configurations: int) -> str:
    """'' or how long sprint tune's search of ``n_configurations`` takes."""
    secs = n_configurations / CONFIGURATIONS_PER_S
    if not secs > SIMULATION_WARN_S:
        return ""
    when = f"{secs:.0f} s" if secs < 90 else f"{secs / 60:.0f} min"
    return (f"{n_configurations:,} configurations to price: about {when}; --max-workers, "
            f"--max-nodes and --max-subbatch narrow the search")


def check_strategy_values(args):
    """The strategies' own options whose range their cost models assume."""
    import math
    overlap = getattr(args, "overlap", None)
    if overlap is not None and not 0 <= overlap <= 1:
        raise RunError(f"must be a share between 0 and 1, got {overlap:g}", "--overlap")
    trip = getattr(args, "round_trip", None)
    if trip is not None and not (math.isfinite(trip) and trip >= 0):
        raise RunError(f"must be a finite number of seconds >= 0, got {trip:g}", "--round-trip")
    slow = getattr(args, "slow_factor", None)
    if slow is not None and not (math.isfinite(slow) and slow >= 1):
        raise RunError(f"must be a finite factor >= 1 (2: half speed), got {slow:g}", "--slow-factor")


# The layer-wise search's cost tables (engine.perf.layerwise.edge_costs):
# for each pair of consecutive layers an array of (configurations of one) x
# (of the next) x devices entries, about PLAN_BYTES_PER_ENTRY bytes each at
# its peak (float64 overlaps and increments, int32 extents), built at about
# PLAN_ENTRIES_PER_S. Build machine: tiny at 4000 devices, 96 M entries
# (57.6 M in its largest table), 19 s and 1.29 GB; cifar at 1000, 38 M in
# 4.2 s. Before this check `plan --gpus 100000` computed for seconds, then
# died asking numpy for 4 GiB and more.
PLAN_BYTES_PER_ENTRY = 22
PLAN_ENTRIES_PER_S = 5e6


def plan_tables(model, gpus: int, batch: int):
    """(entries of the largest cost table, entries of all) the layer-wise
    search of ``model`` on ``gpus`` devices builds (counting configurations
    only: milliseconds)."""
    from .layerwise import configs, graph_nodes
    nodes = graph_nodes(model)
    n_cfg = [len(configs(v, gpus, batch)) for v in nodes]
    sizes = [a * b * gpus for a, b in zip(n_cfg, n_cfg[1:])]
    return max(sizes, default=0), sum(sizes)


def check_plan_size(model, gpus: int, batch: int, free=None) -> str:
    """Refuse a layer-wise search whose largest cost table does not fit in
    the memory free (``free`` bytes; this machine's when None); otherwise
    '' or how long its tables take to build."""
    from engine.session.setup import available_memory     # MemAvailable, as sprint train's check
    largest, total = plan_tables(model, gpus, batch)
    free = available_memory(None) if free is None else free
    need = largest * PLAN_BYTES_PER_ENTRY
    if free is not None and need > free:
        raise RunError(f"the layer-wise search on {gpus:,} devices needs a cost table of {largest:,} entries "
                       f"(configurations of one layer x of the next x devices), about {need / 2**30:,.1f} GiB, "
                       f"more than the {free / 2**30:,.1f} GiB of memory free here: fewer devices", "--gpus")
    secs = total / PLAN_ENTRIES_PER_S
    if not secs > SIMULATION_WARN_S:
        return ""
    return (f"--gpus {gpus:,}: the layer-wise search's cost tables hold {total:,} entries, about "
            f"{secs / 60:.0f} min to build at this machine's pace")
