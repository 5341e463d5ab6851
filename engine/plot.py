"""PNG curves of a run: loss (train and test) and test accuracy per epoch."""
from __future__ import annotations

from pathlib import Path

from . import metrics as _metrics
from .checkpoint import atomic_write


def save_png(fig, path, dpi="figure") -> Path:
    """Write the matplotlib figure ``fig`` to ``path`` as a PNG atomically (a
    full disk or a kill leaves the previous file, never a truncated one) and
    close the figure either way; every PNG of the engine goes through here."""
    import matplotlib.pyplot as plt
    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
    finally:
        plt.close(fig)


def plot_run(run_dir, out=None) -> list:
    """Write ``loss.png`` and ``accuracy.png`` into ``out`` (default: the run
    directory) from its metrics.jsonl; returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    if run_dir.is_file() and run_dir.suffix != ".jsonl":
        from .errors import RunError
        raise RunError("sprint plot takes a run folder (or its metrics.jsonl), not this file", run_dir)
    recs = _metrics.read(run_dir)
    if run_dir.is_file():
        run_dir = run_dir.parent      # its metrics.jsonl given: the PNGs go beside it, not under the file
    if not recs:
        from .errors import RunError
        # the where in parentheses, as every other error of the CLI says it
        raise RunError("its metrics hold no epochs yet", run_dir)
    if out and Path(out).suffix.lower() in (".png", ".jpg", ".jpeg", ".pdf", ".svg") and not Path(out).is_dir():
        # it would become a folder of that name holding the two PNGs
        from .errors import RunError
        raise RunError("--out is the folder for loss.png and accuracy.png, not a file name", out)
    if out:
        from .cli import make_out_folder
        out = make_out_folder(out, "the folder for the plots")
    else:
        out = run_dir
    ep = [r["epoch"] for r in recs]
    figs = {
        "loss.png": ("loss", [("train_loss", "train"), ("test_loss", "test")]),
        "accuracy.png": ("accuracy (%)", [("train_acc", "train"), ("test_acc", "test")]),
    }
    paths = []
    for name, (ylabel, series) in figs.items():
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        for key, label in series:
            ys = [r.get(key) for r in recs]
            if all(v is not None for v in ys):
                scale = 100.0 if "acc" in key else 1.0
                ax.plot(ep, [scale * v for v in ys], marker="o", ms=3, label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{run_dir.name}: {ylabel}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths.append(save_png(fig, out / name))
    return paths
