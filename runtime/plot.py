"""`ember train --plot PATH.png`: the run's loss and accuracy curves, drawn at the end.

matplotlib is an optional extra (`pip install 'ember[plot]'`), imported only here and
only when a plot is asked for; `require_matplotlib` says so before a run starts, rather
than after it has trained.
"""

from __future__ import annotations

from collections.abc import Sequence


class PlotUnavailableError(ImportError):
    """matplotlib is not installed."""


def require_matplotlib():
    """The pyplot module on a file-only backend (no display needed), or a clear error."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailableError("--plot needs matplotlib: pip install 'ember[plot]' "
                                   "(or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(path: str, epochs: Sequence, steps: Sequence[tuple[int, float]],
             steps_per_epoch: int) -> str:
    """Loss per step (this run's: (step, loss) pairs) and each epoch's mean loss at the
    step that ended it on the left, train and test accuracy per epoch on the right;
    `epochs`: EpochResults. Returns `path`."""
    plt = require_matplotlib()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    try:
        if steps:
            left.plot(*zip(*steps), lw=0.8, alpha=0.5, label="step loss")
        left.plot([r.epoch * steps_per_epoch for r in epochs], [r.loss for r in epochs], "o-",
                  label="epoch mean loss")
        left.set(xlabel="step", ylabel="loss", title="loss")
        left.legend()
        x = [r.epoch for r in epochs]
        right.plot(x, [r.train_accuracy for r in epochs], "o-", label="train")
        right.plot(x, [r.test_accuracy for r in epochs], "s-", label="test")
        right.set(xlabel="epoch", ylabel="accuracy", title="accuracy", ylim=(0, 1.02))
        right.legend()
        for ax in (left, right):
            ax.grid(alpha=0.3)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
