"""`ember train` logging and looking: metrics as JSON lines and CSV (TensorBoard where
installed), `--plot`, `--summary` and `--profile`, each checked in what it writes."""

from __future__ import annotations

import csv
import json
import sys

import numpy as np
import pytest

from ember.__main__ import main
from ember.runtime.data import digits

STEPS_PER_EPOCH = len(digits(0).x_train) // 32  # the defaults: digits, batch 32


def train(*args) -> int:
    return main(["train", "--no-progress", *map(str, args)])


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One 2-epoch run with every output asked for; (its directory, stdout)."""
    d = tmp_path_factory.mktemp("run")
    capture = pytest.MonkeyPatch()
    out = d / "stdout.txt"
    with out.open("w") as f:
        capture.setattr(sys, "stdout", f)
        try:
            code = train("--epochs", 2, "--log-dir", d / "logs", "--log", d / "one.csv",
                         "--summary", "--profile", d / "trace.json",
                         *(["--plot", d / "curves.png"] if _has_matplotlib() else []))
        finally:
            capture.undo()
    assert code == 0, out.read_text()
    return d, out.read_text()


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_json_lines_have_a_record_per_step_and_per_epoch(run):
    d, _ = run
    got = records(d / "logs" / "metrics.jsonl")
    steps = [r for r in got if r["kind"] == "step"]
    epochs = [r for r in got if r["kind"] == "epoch"]
    assert [r["step"] for r in steps] == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert [r["step"] for r in epochs] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    assert all(r["lr"] == 0.05 and np.isfinite(r["loss"]) for r in steps)
    first = [r["loss"] for r in steps if r["epoch"] == 1]
    assert epochs[0]["loss"] == pytest.approx(np.mean(first))
    assert epochs[1]["test_accuracy"] > 0.8 and epochs[1]["loss"] < epochs[0]["loss"]


def test_csv_matches_the_json_lines(run):
    d, _ = run
    rows = list(csv.DictReader((d / "logs" / "metrics.csv").open()))
    got = records(d / "logs" / "metrics.jsonl")
    assert len(rows) == len(got) and (d / "one.csv").read_text() == \
        (d / "logs" / "metrics.csv").read_text()
    for row, r in zip(rows, got):
        assert row["kind"] == r["kind"] and int(row["step"]) == r["step"]
        assert float(row["loss"]) == pytest.approx(r["loss"])
        assert (row["test_accuracy"] == "") == (r["kind"] == "step")


def test_tensorboard_events_where_tensorboard_is_installed(run):
    d, _ = run
    events = list((d / "logs").glob("events.out.tfevents.*"))
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        assert not events
        pytest.skip("tensorboard is not installed")
    assert events and events[0].stat().st_size > 0


def test_summary_table_is_printed_before_training(run):
    _, out = run
    assert out.index("Layer (type)") < out.index("epoch   1")
    assert "layers.0 (Linear)" in out and "[32, 128]" in out and "Total params: 9,610" in out


def test_profile_writes_a_trace_with_one_event_per_kernel(run):
    d, out = run
    trace = json.loads((d / "trace.json").read_text())
    kernels = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert f"wrote a trace of the step's {len(kernels)} kernels" in out
    assert len(kernels) > 3 and all(e["dur"] >= 0 and "ts" in e for e in kernels)


def test_plot_is_a_real_picture(run):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    d, out = run
    png = d / "curves.png"
    assert f"wrote {png}" in out and png.stat().st_size > 5000
    pixels = imread(png)
    assert pixels.ndim == 3 and len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 10


def test_plot_without_matplotlib_is_a_clear_error_before_training(capsys, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib then fails
    assert train("--epochs", 1, "--plot", tmp_path / "p.png") == 1
    out, err = capsys.readouterr()
    assert "pip install 'ember[plot]'" in err and "epoch" not in out


def test_a_log_file_of_unknown_format_and_profile_off_cpu_are_errors(capsys, tmp_path):
    assert train("--epochs", 1, "--log", tmp_path / "m.txt") == 1
    assert "want a .jsonl or .csv file" in capsys.readouterr().err
    assert train("--epochs", 1, "--backend", "interpreter", "--profile", tmp_path / "t") == 1
    assert "--profile times the cpu backend's kernels" in capsys.readouterr().err


def test_a_resumed_run_appends_to_its_logs(tmp_path, capsys):
    ckpt, log = tmp_path / "run.ckpt", tmp_path / "m.jsonl"
    assert train("--epochs", 1, "--save", ckpt, "--log", log) == 0
    assert train("--epochs", 2, "--resume", ckpt, "--log", log) == 0
    got = records(log)
    assert [r["epoch"] for r in got if r["kind"] == "epoch"] == [1, 2]
    assert [r["step"] for r in got if r["kind"] == "step"] == list(
        range(1, 2 * STEPS_PER_EPOCH + 1))
    assert train("--epochs", 1, "--log", log) == 0  # a fresh run starts the file anew
    assert len(records(log)) == STEPS_PER_EPOCH + 1
