"""Metrics of a training run, written as it goes: a record per step (loss, lr) and per
epoch (loss, accuracies, steps/s), to JSON lines, CSV and, where `torch.utils.tensorboard`
is installed, TensorBoard event files, as Keras' CSVLogger and PyTorch Lightning's
loggers write them.

`ember train --log-dir DIR` writes DIR/metrics.jsonl, DIR/metrics.csv and DIR's TensorBoard
events; `--log FILE.jsonl` or `--log FILE.csv` one file. Every record has `kind` ("step" or
"epoch"), `epoch` (1-based) and `step` (optimizer steps so far); a CSV has one column per
field of either kind, empty where a row's kind has none. A fresh run starts its files
anew; a resumed one appends to them.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from typing import IO, Protocol

STEP_FIELDS = ("kind", "epoch", "step", "loss", "lr")
EPOCH_FIELDS = ("train_accuracy", "test_accuracy", "steps_per_second", "seconds")


class Sink(Protocol):
    def write(self, record: dict) -> None: ...
    def close(self) -> None: ...


def _open(path: str, append: bool) -> IO[str]:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "a" if append else "w", newline="")  # its sink closes it


class JsonLines:
    """One JSON object per line."""

    def __init__(self, path: str, append: bool = False):
        self.file = _open(path, append)

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.file.close()


class Csv:
    """A header, then one row per record (the header only when the file starts empty)."""

    def __init__(self, path: str, append: bool = False):
        self.file = _open(path, append)
        self.rows = csv.DictWriter(self.file, STEP_FIELDS + EPOCH_FIELDS)
        if self.file.tell() == 0:
            self.rows.writeheader()

    def write(self, record: dict) -> None:
        self.rows.writerow(record)

    def close(self) -> None:
        self.file.close()


class TensorBoard:
    """Scalars `step/<name>` and `epoch/<name>`, against the optimizer step."""

    def __init__(self, directory: str):
        from torch.utils.tensorboard import SummaryWriter  # ImportError without tensorboard

        self.writer = SummaryWriter(directory)

    def write(self, record: dict) -> None:
        for key, value in record.items():
            if key not in ("kind", "epoch", "step"):
                self.writer.add_scalar(f"{record['kind']}/{key}", value, record["step"])

    def close(self) -> None:
        self.writer.close()


def tensorboard(directory: str) -> TensorBoard | None:
    """A TensorBoard sink, or None (with a note) where tensorboard is not installed."""
    try:
        return TensorBoard(directory)
    except ImportError:
        print("note: no TensorBoard logs (pip install tensorboard to get them)",
              file=sys.stderr)
        return None


SUFFIXES = {".jsonl": JsonLines, ".json": JsonLines, ".csv": Csv}


class MetricLogs:
    """Every sink of one run, and the step losses of this run (what `--plot` draws)."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks
        self.steps: list[tuple[int, float]] = []

    @classmethod
    def open(cls, log_dir: str | None = None, files: list[str] = (),
             append: bool = False) -> MetricLogs:
        """The sinks `--log-dir` and `--log` ask for; ValueError for a file of no known
        format (before anything is written)."""
        for path in files:
            if os.path.splitext(path)[1] not in SUFFIXES:
                raise ValueError(f"--log {path}: want a .jsonl or .csv file")
        sinks: list[Sink] = [SUFFIXES[os.path.splitext(p)[1]](p, append) for p in files]
        if log_dir is not None:
            sinks += [JsonLines(os.path.join(log_dir, "metrics.jsonl"), append),
                      Csv(os.path.join(log_dir, "metrics.csv"), append)]
            board = tensorboard(log_dir)
            sinks += [board] if board is not None else []
        return cls(sinks)

    def step(self, epoch: int, step: int, loss: float, lr: float) -> None:
        self.steps.append((step, loss))
        self._write({"kind": "step", "epoch": epoch, "step": step, "loss": loss, "lr": lr})

    def epoch(self, step: int, result: dict) -> None:
        """`result`: an EpochResult as a dict (epoch, loss, accuracies, steps/s, seconds)."""
        self._write({"kind": "epoch", "step": step, **result})

    def _write(self, record: dict) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
