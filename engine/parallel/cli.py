"""``sprint report RUN_DIR``: registered into the top-level CLI."""
from __future__ import annotations

from pathlib import Path


def register(subparsers):
    p = subparsers.add_parser("report", help="summary of a parallel run's measured statistics "
                                             "(asgd, sync, pipeline, downpour, sandblaster, layerwise)",
                              description="Print the step timers of a parallel run (ASGD: T_GPU, T_Update, "
                                          "N_Minibatch_avg, staleness; sync: T_Step and the allreduce's share) "
                                          "and plot what matters for its mode (ASGD: the staleness and "
                                          "minibatch distributions; sync: the allreduce time per step and the "
                                          "throughput over time; pipeline: per-stage times; downpour, "
                                          "sandblaster: the servers' and replicas' tables; layerwise: the "
                                          "plan, each rank's parameters and the step time against the "
                                          "prediction).")
    p.add_argument("run_dir", help="run directory holding asgd_stats.json, sync_stats.json, pipeline_stats.json, "
                                   "downpour_stats.json, sandblaster_stats.json or layerwise_stats.json "
                                   "(or the file)")
    p.add_argument("--png", default=None, help="where to write the plot (default RUN_DIR/parallel_report.png)")
    p.add_argument("--no-png", action="store_true", help="print the table only")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from .report import load_stats, plot_distributions, summary_table
    st = load_stats(args.run_dir)
    print(summary_table(st))
    if not args.no_png:
        base = Path(args.run_dir)
        png = Path(args.png) if args.png else (base if base.is_dir() else base.parent) / "parallel_report.png"
        if args.png:
            # as plot --out's: said "not a folder (.../x.png)" of a file in the way above it
            from engine.cli import make_out_folder
            from engine.errors import RunError
            if png.is_dir():
                raise RunError("is a folder, not a file; --png takes the plot's file name (e.g. report.png)", png)
            make_out_folder(png.parent, "the folder for the plot", "--png")
        print(f"plot: {plot_distributions(st, png)}")
    return 0
