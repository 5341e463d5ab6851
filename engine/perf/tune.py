"""Pick the configuration: the smallest T_Epoch whose N_Minibatch_avg stays
within a tolerance of a target (seed 000 section 4.3: 138 +- 5 %)."""
from __future__ import annotations

from dataclasses import dataclass

from . import model as model_mod
from engine.errors import counted

NODE_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
SUBBATCH_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256)


@dataclass
class Candidate:
    n_node: int
    n_gpu: int
    n_subbatch: int
    t_epoch: float
    n_minibatch_avg: float
    t_gpu: float
    t_update: float
    staleness: float
    feasible: bool


def search(spec, profile=None, target: float = None, tolerance: float = 0.05, max_nodes: int = 64,
           workers=(1,), max_subbatch: int = 256, impl=model_mod.ENGINE_IMPL, n_file=None,
           nodes=None, subbatches=None, ranks_per_host=1, threads=1, refused=None, beyond=None):
    """All candidates of the grid, feasible ones first by T_Epoch, then the
    infeasible by their distance to the target. Configurations the model
    refuses (oversubscribed host sharings the profile never measured) are
    left out and, when ``refused`` is a list, appended to it as
    (N_Node, N_GPU, N_Subbatch, reason). So are configurations whose first
    round of worker steps (N_Node x N_GPU x N_Subbatch samples) is more than
    the epoch (``beyond``): the epoch ends before every worker took a step,
    so their T_Epoch is a fraction of one step and their N_Minibatch_avg a
    steady state never reached (on tiny's 256 samples the tuner chose 1 x 4
    x 192, and listed 256 x 2 x 1, workers that never step)."""
    from .cli_ranges import epoch_samples
    from .profile import Profile
    profile = Profile.resolve(profile)
    total = epoch_samples(spec, n_file)
    if target is None or not target > 0:
        raise ValueError(f"target must be > 0, got {target}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    if not isinstance(max_nodes, int) or max_nodes < 1:
        raise ValueError(f"max_nodes must be a positive int, got {max_nodes!r}")
    nodes = [n for n in (nodes or NODE_GRID) if n <= max_nodes]
    if max_nodes not in nodes and nodes and max_nodes > nodes[-1]:
        nodes.append(max_nodes)
    subs = [s for s in (subbatches or SUBBATCH_GRID) if s <= max_subbatch]
    out = []
    for g in workers:
        for s in subs:
            for n in nodes:
                if n * g * s > total:
                    if beyond is not None:
                        beyond.append((n, g, s))
                    continue
                try:
                    p = model_mod.predict(spec, n, g, s, profile, n_file=n_file, impl=impl,
                                          ranks_per_host=min(ranks_per_host, n), threads=threads)
                except model_mod.Oversubscribed as e:
                    if refused is not None:
                        refused.append((n, g, s, str(e)))
                    continue
                ok = abs(p.n_minibatch_avg - target) <= tolerance * target
                # Plain floats and bools: --json writes them (a numpy bool
                # from the model's arithmetic is not JSON serializable).
                out.append(Candidate(n, g, s, float(p.t_epoch), float(p.n_minibatch_avg), float(p.t_gpu),
                                     float(p.t_update), float(p.staleness), bool(ok)))
    feas = sorted((c for c in out if c.feasible), key=lambda c: c.t_epoch)
    rest = sorted((c for c in out if not c.feasible), key=lambda c: abs(c.n_minibatch_avg - target))
    return feas + rest


def format_candidates(cands, target, tolerance, top=5, refused=(), beyond=(), n_file=None) -> str:
    feas = [c for c in cands if c.feasible]
    show = feas[:top] if feas else cands[:top]
    lines = [f"target N_Minibatch_avg = {target:g} +- {100 * tolerance:g} %: "
             f"{len(feas)} of {counted(len(cands), 'configuration')} searched qualif{'y' if len(feas) != 1 else 'ies'}"]
    if feas:
        lines[0] += f"; {'all' if len(show) == len(feas) else f'the {len(show)} fastest'} shown" + \
            (" (--top)" if len(show) < len(feas) else "") + ", * = the choice"
    if refused:
        lines.append(f"{len(refused)} more not priced: oversubscribed host sharing the profile never measured "
                     f"(first: N_Node {refused[0][0]} N_GPU {refused[0][1]})")
    if beyond:
        lines.append(f"{len(beyond)} more left out: N_Node x N_GPU x N_Subbatch more than the epoch's "
                     f"{n_file:,} samples (its workers would not all take one step)")
    head = f"{'':3}{'N_Node':>7}{'N_GPU':>6}{'N_Sub':>6}{'T_Epoch (s)':>14}{'N_Minibatch':>13}" \
           f"{'T_GPU (s)':>12}{'T_Update (s)':>14}{'staleness':>11}"
    if not feas:
        lines.append(f"none qualifies; the {len(show)} closest to the target:")
    lines.append(head)
    for i, c in enumerate(show):
        mark = "*" if (i == 0 and feas) else " "
        lines.append(f"{mark:3}{c.n_node:>7}{c.n_gpu:>6}{c.n_subbatch:>6}{c.t_epoch:>14.6g}"
                     f"{c.n_minibatch_avg:>13.2f}{c.t_gpu:>12.5g}{c.t_update:>14.5g}{c.staleness:>11.2f}")
    return "\n".join(lines)
