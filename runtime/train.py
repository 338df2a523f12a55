"""The training loop behind `ember train`: epochs of compiled steps, then test accuracy."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from ..frontend import nn
from .compiled import CompiledFunction, TrainStep, write_stages
from .data import DataLoader, Dataset


@dataclass
class EpochResult:
    epoch: int
    loss: float
    train_accuracy: float
    test_accuracy: float
    steps_per_second: float


def accuracy(forward: CompiledFunction, x: np.ndarray, y: np.ndarray) -> float:
    return float((np.argmax(forward(x), axis=-1) == y).mean())


def fit(model: nn.Module, data: Dataset, optimizer, epochs: int = 10, batch_size: int = 32,
        backend: str = "cpu", seed: int = 0, dump_ir: str | None = None,
        progress: bool = True, out=sys.stdout) -> list[EpochResult]:
    """Train `model` on `data` with cross-entropy; print and return per-epoch results."""
    loader = DataLoader(data.x_train, data.y_train, batch_size, seed=seed)
    step = TrainStep(model, nn.functional.cross_entropy, optimizer, backend=backend)
    results, forward_train, forward_test = [], None, None
    for epoch in range(1, epochs + 1):
        model.train()
        losses, start = [], time.perf_counter()
        bar = tqdm(loader, desc=f"epoch {epoch}/{epochs}", leave=False, disable=not progress,
                   file=sys.stderr)
        for xb, yb in bar:
            losses.append(step(xb, yb))
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        elapsed = time.perf_counter() - start - (step.compile_seconds if epoch == 1 else 0.0)
        if epoch == 1:
            print(f"compiled the training step in {step.compile_seconds:.2f} s "
                  f"({backend} backend)", file=out)
            if dump_ir:
                paths = write_stages(step._require().stages, dump_ir, prefix="train_step")
                print(f"wrote {len(paths)} IR stages to {dump_ir}", file=out)
        model.valid()
        if forward_test is None:  # params are read at each call: compile once
            forward_train = CompiledFunction(model, (data.x_train,), backend=backend)
            forward_test = CompiledFunction(model, (data.x_test,), backend=backend)
        r = EpochResult(epoch, float(np.mean(losses)),
                        accuracy(forward_train, data.x_train, data.y_train),
                        accuracy(forward_test, data.x_test, data.y_test),
                        len(losses) / elapsed)
        results.append(r)
        print(f"epoch {epoch:3d}  loss {r.loss:.4f}  train acc {r.train_accuracy:.2%}  "
              f"test acc {r.test_accuracy:.2%}  {r.steps_per_second:,.0f} steps/s", file=out)
    model.train()
    return results
