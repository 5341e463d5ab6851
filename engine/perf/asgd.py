"""SPRINT ASGD's row of the strategy table (engine.perf.strategies), beside
engine.parallel.asgd: its closed-form model (engine.perf.model), the
discrete-event simulation of Algorithms 1 and 2 (engine.perf.simulate) and
their own command-line options."""
from __future__ import annotations

from dataclasses import dataclass

from engine.argtypes import nonneg_int, positive_int

from .model import ENGINE_IMPL, SEED_IMPL, predict  # noqa: F401  (the row's predict)
from .report import format_prediction  # noqa: F401  (the row's formatter)
from engine.errors import counted


def add_cli_arguments(p):
    p.add_argument("--impl", choices=["engine", "seed"], default="engine",
                   help="engine: this engine's ASGD (swaps, updater waits for a gradient); "
                        "seed: the seed's copies and free-running updater (default engine)")


def add_simulate_arguments(p):
    p.add_argument("--updates", type=positive_int, default=400, help="global updates to simulate (default 400)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the simulated step times (default 0)")
    p.add_argument("--cv", type=float, default=None, help="spread of every step (default: measured)")


def cli_kwargs(args) -> dict:
    kw = {"impl": SEED_IMPL if args.impl == "seed" else ENGINE_IMPL}
    if hasattr(args, "updates"):
        kw.update(n_updates=args.updates, seed=args.seed, cv=args.cv)
    return kw


@dataclass
class AsgdSimulation:
    model: str
    n_node: int
    n_gpu: int
    n_subbatch: int
    unit: str            # what a worker is on this profile: GPUs or workers
    prediction: object   # engine.perf.model.Prediction
    sim: object          # engine.perf.simulate.SimResult

    def as_dict(self) -> dict:
        return {"simulation": self.sim.as_dict(), "closed_form": self.prediction.as_dict()}


def simulate(spec, n_node: int, n_gpu: int, n_subbatch: int, profile=None, n_updates: int = 400, seed: int = 0,
             cv=None, n_file=None, ranks_per_host: int = 1, impl=ENGINE_IMPL, threads: int = 1) -> AsgdSimulation:
    """The simulation beside the closed form of the same configuration (the
    simulation takes the closed form's host slowdown)."""
    from .profile import Profile
    from .simulate import simulate as run
    profile = Profile.resolve(profile)
    pred = predict(spec, n_node, n_gpu, n_subbatch, profile, n_file=n_file, ranks_per_host=ranks_per_host,
                   impl=impl, threads=threads)
    sim = run(spec, n_node, n_gpu, n_subbatch, profile, n_updates=n_updates, seed=seed, cv=cv, n_file=n_file,
              ranks_per_host=ranks_per_host, impl=impl, slowdown=pred.slowdown)
    unit = "GPUs" if profile.data.get("backend") == "gpu" else "workers"
    return AsgdSimulation(spec if isinstance(spec, str) else pred.model, n_node, n_gpu, n_subbatch, unit, pred, sim)


def format_simulation(s: AsgdSimulation, explain_terms: bool = False) -> str:
    from .report import SIMULATE_TERMS, explain, host_line
    from .simulate import compare, format_compare
    sim = s.sim
    lines = [f"{s.model}: {counted(s.n_node, 'node')} x {counted(s.n_gpu, 'worker')} = "
             f"{counted(s.n_node * s.n_gpu, 'simulated ' + s.unit[:-1])}, N_Subbatch {s.n_subbatch}: "
             f"{counted(sim.updates, 'update')}, {counted(sim.worker_steps, 'worker step')}, "
             f"{sim.sim_time:.4g} s simulated in {sim.wall_s:.2f} s",
             host_line(s.prediction), format_compare(compare(s.prediction, sim))]
    if explain_terms:
        lines.append(explain(SIMULATE_TERMS))
    return "\n".join(lines)
