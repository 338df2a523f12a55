"""The training loop behind `ember train`: epochs of compiled steps, then test accuracy.

`fit` trains with cross-entropy, prints one summary line per epoch (loss, train and test
accuracy, steps/s; the compile time once) and a final table. With `save`, a checkpoint
is written after every epoch and when Ctrl-C stops the run (after the current step);
`resume` continues a run from one, bit-exactly: `epochs` counts from the start of the
run, so 1 epoch + save + resume with `epochs=2` equals 2 epochs in one go.

Data-parallel (`data_parallel=True`, as `ember train` under torchrun): each rank trains on
its shard, `batch_size` rows per rank per step; only rank 0 prints and writes
checkpoints, and every rank resumes from the same file.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np

# a widget in notebooks; not tqdm.auto, whose asyncio wrapper calls iter() on the loader
# when built, and each iter() of a DataLoader serves the next epoch
from tqdm.autonotebook import tqdm

from ..frontend import nn
from .compiled import CompiledFunction
from .data import DataLoader, Dataset
from .logging import MetricLogs
from .steps import TrainStep


@dataclass
class EpochResult:
    epoch: int
    loss: float
    train_accuracy: float
    test_accuracy: float
    steps_per_second: float
    seconds: float = 0.0


@dataclass
class FitState:
    """Where a run is: what a checkpoint's `extra` holds besides the step's own state."""

    epoch: int = 0  # epochs completed
    batch: int = 0  # batches of the current epoch completed
    history: list[EpochResult] = field(default_factory=list)
    interrupted: bool = False

    def extra(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch,
                "history": [asdict(r) for r in self.history]}

    @classmethod
    def from_extra(cls, extra: dict) -> FitState:
        """The run's position from a checkpoint; TypeError/ValueError when it is malformed."""
        epoch, batch, history = extra.get("epoch", 0), extra.get("batch", 0), \
            extra.get("history", [])
        if not (_count(epoch) and _count(batch) and isinstance(history, list)):
            raise ValueError(f"epoch {epoch!r}, batch {batch!r} and a list of epochs expected")
        return cls(epoch, batch, [EpochResult(**r) for r in history])


def _count(x) -> bool:
    return type(x) is int and x >= 0


def accuracy(forward: CompiledFunction, x: np.ndarray, y: np.ndarray) -> float:
    return float((np.argmax(forward(x), axis=-1) == y).mean())


@contextmanager
def evaluating(model: nn.Module):
    """`model.valid()` for the block, then every flag exactly as it was (frozen ones too)."""
    flags = [(p, p.val()) for _, p in model.all_params() if p.kind == "flag"]
    model.valid()
    try:
        yield model
    finally:
        for p, value in flags:
            p.set_value(value)


@contextmanager
def stop_on_interrupt():
    """Ctrl-C sets the returned event instead of raising (a second Ctrl-C raises)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("\nember: stopping after this step (Ctrl-C again to abort)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def fit(model: nn.Module, data: Dataset, optimizer, epochs: int = 10, batch_size: int = 32,
        backend: str = "cpu", seed: int = 0, dump_ir: str | None = None,
        progress: bool = True, out=None, recompute: str = "none",
        memory_budget: int | None = None, save: str | None = None, resume: str | None = None,
        detect_anomaly: bool = False, step: TrainStep | None = None,
        data_parallel=False, logs: MetricLogs | None = None,
        profile: str | None = None,
        on_resume: Callable[[TrainStep, FitState], str | None] | None = None,
        accumulate: int = 1, shard_optimizer: bool = False, precision: str = "32") -> History:
    """Train `model` on `data` with cross-entropy; print and return per-epoch results.
    `logs`: where each step's and epoch's metrics go (runtime/logging.py); `profile`: a
    path for a Chrome trace of the step's kernels on one batch, written at the end;
    `on_resume(step, state)`: called once `resume` is loaded, it may change the restored
    optimizer (`ember train` stretches its lr schedule to a longer run) and returns a
    note to print, or None. `accumulate`: micro-batches (of `batch_size`) per optimizer
    update, as `compile_train_step`'s; a cycle may span an epoch's end, and a checkpoint
    saved mid-cycle keeps the gradient buffers. `shard_optimizer`: ZeRO-1 across the
    data-parallel ranks, `precision`: mixed precision (both `compile_train_step`'s; the
    accuracy is measured in f32)."""
    from .api import compile_train_step

    if step is None:
        step = compile_train_step(model, nn.functional.cross_entropy, optimizer,
                                  backend=backend, recompute=recompute,
                                  memory_budget=memory_budget, detect_anomaly=detect_anomaly,
                                  data_parallel=data_parallel, accumulate=accumulate,
                                  shard_optimizer=shard_optimizer, precision=precision)
    comm = getattr(step, "comm", None)
    rank, world_size = (comm.rank, comm.world_size) if comm is not None else (0, 1)
    out = out or sys.stdout
    if rank != 0:
        out, progress = open(os.devnull, "w"), False  # noqa: SIM115  (closed with the process)
        logs, profile = None, None
    loader = DataLoader(data.x_train, data.y_train, batch_size, seed=seed, rank=rank,
                        world_size=world_size)
    state = FitState()
    if resume:
        asked, asked_text = step.optimizer.config(), repr(step.optimizer)
        state = step.load_checkpoint(resume, FitState.from_extra)
        note = on_resume(step, state) if on_resume is not None else None
        if step.optimizer.config() != asked:
            print(f"note: continuing with the checkpoint's optimizer {step.optimizer}, not "
                  f"{asked_text}", file=out)
        print(f"resumed from {resume} at epoch {state.epoch + 1}, batch {state.batch} "
              f"(step {step.optimizer.step_count})", file=out)
        if note:
            print(f"note: {note}", file=out)
        _say_what_resuming_leaves(step, state, epochs, resume, out)
    forwards: dict[str, CompiledFunction] = {}
    with stop_on_interrupt() as stop:
        while state.epoch < epochs and not stop.is_set():
            r = _epoch(step, loader, state, epochs, progress, stop, out, dump_ir, logs)
            if r is None:
                break
            with evaluating(model):
                if not forwards:  # params are read at each call: compile once
                    forwards = {"train": CompiledFunction(model, (data.x_train,), backend=backend),
                                "test": CompiledFunction(model, (data.x_test,), backend=backend)}
                r.train_accuracy = accuracy(forwards["train"], data.x_train, data.y_train)
                r.test_accuracy = accuracy(forwards["test"], data.x_test, data.y_test)
            state.history.append(r)
            state.epoch, state.batch = state.epoch + 1, 0
            print(f"epoch {r.epoch:3d}  loss {r.loss:.4f}  train acc {r.train_accuracy:.2%}  "
                  f"test acc {r.test_accuracy:.2%}  {r.steps_per_second:,.0f} steps/s", file=out)
            if logs is not None:
                logs.epoch(step.optimizer.step_count, asdict(r))
            if save:
                step.save_checkpoint(save, state.extra())
        state.interrupted = stop.is_set()
    if state.interrupted:
        where = f"epoch {state.epoch + 1}, batch {state.batch}"
        if save:
            step.save_checkpoint(save, state.extra())
            print(f"interrupted at {where}; saved {save} (resume with --resume {save})",
                  file=out)
        else:
            print(f"interrupted at {where}", file=out)
    if state.history:
        print(table(state.history), file=out)
    if profile and len(loader):
        xb, yb = next(iter(loader))
        kernels = step.profile(xb, yb, path=profile)
        print(f"wrote a trace of the step's {len(kernels)} kernels to {profile}", file=out)
    return History(state.history, interrupted=state.interrupted)


class History(list):
    """The epochs a run completed (EpochResults), and whether Ctrl-C ended it early."""

    def __init__(self, epochs: list[EpochResult], interrupted: bool = False):
        super().__init__(epochs)
        self.interrupted = interrupted


def _say_what_resuming_leaves(step: TrainStep, state: FitState, epochs: int, path: str,
                              out) -> None:
    """A resumed run that would train nothing, or on at an lr its schedule ran down to 0,
    says so: the schedule is the checkpoint's, so a larger --epochs does not stretch it."""
    if state.epoch >= epochs:
        print(f"note: {path} has done {state.epoch} of {epochs} epochs: nothing to train "
              "(raise --epochs to go on)", file=out)
    elif step.optimizer.lr == 0:
        print(f"note: the checkpoint's lr schedule has reached 0 at step "
              f"{step.optimizer.step_count}: the remaining epochs would not change the "
              "model (start a new run with --schedule to train on)", file=out)


def _epoch(step: TrainStep, loader: DataLoader, state: FitState, epochs: int, progress: bool,
           stop: threading.Event, out, dump_ir: str | None,
           logs: MetricLogs | None) -> EpochResult | None:
    """One epoch (or its rest, after a resume); None when stopped before it ended."""
    loader.set_epoch(state.epoch, state.batch)
    first_compile = step._last is None
    losses, start = [], time.perf_counter()
    compiling, compiled_calls = 0.0, 0  # later calls that compiled (accumulate's update graph)
    bar = tqdm(loader, desc=f"epoch {state.epoch + 1}/{epochs}", leave=False,
               disable=not progress, file=sys.stderr, initial=state.batch, total=len(loader))
    for xb, yb in bar:
        lr = step.optimizer.lr  # the lr of this update
        compiles, called = step.compiles, time.perf_counter()
        losses.append(step(xb, yb))
        if step.compiles != compiles and not (first_compile and len(losses) == 1):
            compiling += time.perf_counter() - called
            compiled_calls += 1
        state.batch += 1
        if logs is not None:
            logs.step(state.epoch + 1, step.optimizer.step_count, losses[-1], lr)
        if first_compile and len(losses) == 1:
            print(f"compiled the training step in {step.compile_seconds:.2f} s "
                  f"({step.backend_name} backend)", file=out)
            if dump_ir:
                paths = step.dump_ir(dump_ir)
                print(f"wrote {len(paths)} IR stages to {dump_ir}", file=out)
            start = time.perf_counter()  # steps/s without the compile
        bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)  # drawn at tqdm's own pace
        if stop.is_set():
            break
    bar.close()
    if state.batch < len(loader):
        return None
    elapsed = time.perf_counter() - start - compiling
    timed = len(losses) - (1 if first_compile else 0) - compiled_calls
    return EpochResult(state.epoch + 1, float(np.mean(losses)), 0.0, 0.0,
                       timed / elapsed if elapsed > 0 and timed else 0.0, elapsed)


def table(history: list[EpochResult], max_rows: int = 20) -> str:
    """The final table: a row per epoch (every k-th one, and the last, for long runs) and
    the epoch with the best test accuracy."""
    every = -(-len(history) // max_rows)
    shown = [r for i, r in enumerate(history) if i % every == 0 or i == len(history) - 1]
    best = max(history, key=lambda r: r.test_accuracy)
    head = f"{'epoch':>5}  {'loss':>8}  {'train acc':>9}  {'test acc':>8}  {'steps/s':>8}"
    rows = [f"{r.epoch:5d}  {r.loss:8.4f}  {r.train_accuracy:9.2%}  {r.test_accuracy:8.2%}  "
            f"{r.steps_per_second:8,.0f}" for r in shown]
    rule = "-" * len(head)
    return "\n".join([rule, head, rule, *rows, rule,
                      f"best test acc {best.test_accuracy:.2%} at epoch {best.epoch}"])
