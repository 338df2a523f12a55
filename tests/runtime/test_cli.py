"""`ember train` and `ember bench` as a user runs them: dumps, user models, save/resume,
bad input (exit status 1, a one-line reason, the last good checkpoint intact)."""

import shutil
import subprocess
import textwrap

import numpy as np
import pytest

from ember.__main__ import main
from ember.runtime.checkpoint import read

USER_MODEL = '''
from ember import nn

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 24)
        self.fc2 = nn.Linear(24, {d_out})

    def forward(self, x):
        x = {pre}x
        return self.fc2(nn.functional.relu(self.fc1(x)))
'''


def user_model(tmp_path, d_out=10, pre="", name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(USER_MODEL.format(d_out=d_out, pre=pre)))
    return f"{path}:Tiny"


def train(*args):
    return main(["train", "--no-progress", *map(str, args)])


def test_dump_ir_files_parse_with_ember_opt_and_mlir_opt(tmp_path, capsys):
    assert train("--epochs", 1, "--dump-ir", tmp_path / "ir") == 0
    out = capsys.readouterr().out
    assert "compiled the training step in" in out and "wrote" in out
    dumps = sorted((tmp_path / "ir").glob("*.mlir"))
    names = [p.name for p in dumps]
    assert names[0] == "train_step.00-traced.mlir" and any("autodiff" in n for n in names)
    assert [int(n.split(".")[1].split("-")[0]) for n in names] == list(range(len(names)))
    for path in dumps:
        assert main(["opt", str(path)]) == 0, path
        assert capsys.readouterr().out.startswith("module")
    mlir_opt = shutil.which("mlir-opt") or shutil.which("/usr/lib/llvm-19/bin/mlir-opt")
    if mlir_opt:
        for path in dumps:
            proc = subprocess.run([mlir_opt, "--allow-unregistered-dialect", str(path)],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, (path, proc.stderr[-2000:])


def test_user_model_file_with_adamw_schedule_and_clipping(tmp_path, capsys):
    spec = user_model(tmp_path)
    assert train("--model", spec, "--optimizer", "adamw", "--lr", 1e-2, "--schedule", "cosine",
                 "--warmup", 5, "--clip-norm", 1.0, "--epochs", 3) == 0
    out = capsys.readouterr().out
    assert "training" in out and "Tiny" not in out.splitlines()[0] or "model.py" in out
    assert "epoch   3" in out and "test acc" in out
    table = out[out.index("-----"):]
    assert "train acc" in table and len([ln for ln in table.splitlines() if ln[:5].strip()
                                         .isdigit()]) == 3
    assert float(out.strip().splitlines()[-1].split()[-1].rstrip("%")) > 85


def test_save_then_resume_equals_one_longer_run(tmp_path, capsys):
    one, two = tmp_path / "one.ckpt", tmp_path / "two.ckpt"
    assert train("--optimizer", "adam", "--epochs", 2, "--save", two) == 0
    assert train("--optimizer", "adam", "--epochs", 1, "--save", one) == 0
    assert train("--optimizer", "adam", "--epochs", 2, "--resume", one, "--save", one) == 0
    assert "resumed from" in capsys.readouterr().out
    (a, meta_a), (b, meta_b) = read(str(one)), read(str(two))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert meta_a["optimizer_step"] == meta_b["optimizer_step"]
    assert [r["epoch"] for r in meta_a["extra"]["history"]] == [1, 2]


def test_bad_input_fails_with_one_clear_line_and_keeps_the_checkpoint(tmp_path, capsys):
    ckpt = tmp_path / "good.ckpt"
    assert train("--epochs", 1, "--save", ckpt) == 0
    good = ckpt.read_bytes()
    capsys.readouterr()

    def fails(*args, match):
        assert train(*args) == 1
        err = capsys.readouterr().err
        assert err.startswith("ember train: error:") and match in err, err
        assert ckpt.read_bytes() == good
        return err

    err = fails("--model", user_model(tmp_path), "--resume", ckpt, "--save", ckpt,
                match="does not fit")
    assert "fc1.weight" in err and "layers.0.weight" in err
    fails("--model", user_model(tmp_path, d_out=5, name="m5.py"), "--save", ckpt,
          match="labels out of range")
    fails("--lr", 1e30, "--save", ckpt, match="detect_anomaly")
    err = fails("--model", user_model(tmp_path, pre="(x - 0.5).log() + 0 * ", name="log.py"),
                "--detect-anomaly", "--save", ckpt, match="'ember.log'")
    assert "log.py:11" in err  # the `x = ...` line of forward
    x = np.random.default_rng(0).random((50, 64)).astype(np.float32)
    x[4, 2] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=np.arange(50) % 10)
    fails("--data", tmp_path / "nan.npz", "--save", ckpt, match="NaN or Inf (rows [4])")
    np.savez(tmp_path / "rows.npz", x=x[:40], y=np.arange(50) % 10)
    fails("--data", tmp_path / "rows.npz", match="x has 40 rows but y has 50")
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good[:1000])
    fails("--resume", cut, "--save", ckpt, match="truncated or damaged")


def test_bench_prints_a_table_with_ratios(capsys):
    assert main(["bench", "--models", "mlp", "--steps", "3", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "ember (cpu)" in out and "numpy (by hand)" in out and "x1.00" in out


def test_unknown_model_or_strategy_is_an_error(capsys):
    assert train("--epochs", 1, "--model", "nope") == 1
    assert "ember train: error: unknown model 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train("--recompute", "bogus")
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the deprecated old name still parses
        train("--checkpoint", "bogus")
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_the_old_option_name_checkpoint_says_it_is_deprecated(capsys):
    assert train("--epochs", 1, "--checkpoint", "balanced") == 0
    captured = capsys.readouterr()
    assert "--checkpoint is deprecated: use --recompute" in captured.err
    assert "recompute balanced" in captured.out


def test_ember_dump_ir_env_and_step_ir(tmp_path, monkeypatch):
    import ember as em
    from ember import nn, optim
    from ember.runtime.models import Mlp

    monkeypatch.setenv("EMBER_DUMP_IR", str(tmp_path))
    em.seed(0)
    step = em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="interpreter")
    step(np.zeros((4, 64), np.float32), np.zeros(4, np.int64))
    files = sorted(p.name for p in tmp_path.glob("train_step.*.mlir"))
    assert len(files) == len(step.stages) and files[0] == "train_step.00-traced.mlir"
    autodiff = next(f for f in files if f.endswith("-autodiff.mlir"))
    assert step.ir("autodiff", debuginfo=True) == (tmp_path / autodiff).read_text()  # loc(...)
    assert "ember.updates" in step.ir()
    with pytest.raises(KeyError, match="stages are traced, autodiff, decompose"):
        step.ir("nope")


@pytest.mark.parametrize(("label", "keep", "match"), [
    (3, 1000, "cannot read it as an .npz"),  # cut short: the zip's directory is lost
    (10**12, None, "class labels must be 0..99999")])
def test_a_bad_data_file_is_one_line_and_exit_status_1_without_a_traceback(tmp_path, label,
                                                                           keep, match):
    import sys

    bad = tmp_path / "bad.npz"
    y = np.arange(50) % 10
    np.savez(bad, x=np.zeros((50, 64), np.float32), y=np.where(y == 3, label, y))
    bad.write_bytes(bad.read_bytes()[:keep])
    proc = subprocess.run([sys.executable, "-m", "ember", "train", "--data", str(bad),
                           "--epochs", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"ember train: error: {bad}: ") and match in line, line


@pytest.mark.parametrize(("flag", "value"), [("--batch-size", "0"), ("--epochs", "0"),
                                             ("--warmup", "-1")])
def test_counts_below_their_least_value_are_a_usage_error(capsys, flag, value):
    from ember.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["train", flag, value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert f"argument {flag}: must be at least" in err.splitlines()[-1]


@pytest.mark.parametrize(("flag", "value"), [("--lr", "inf"), ("--lr", "0"), ("--momentum", "nan"),
                                             ("--weight-decay", "-1e-4"), ("--clip-norm", "inf")])
def test_settings_that_are_not_finite_numbers_are_a_usage_error(capsys, flag, value):
    """An inf lr or a NaN momentum trained on NaN from the first step."""
    from ember.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["train", f"{flag}={value}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert f"argument {flag}: must be a finite number" in err.splitlines()[-1]


@pytest.mark.parametrize(("source", "said"), [
    ("raise RuntimeError('boom')\n", "loading {path} raised RuntimeError: boom ({path}:1)"),
    ("import ember\nclass M(ember.nn.Module):\n    def __init__(self):\n"
     "        super().__init__()\n        raise KeyError('w')\n",
     "M() from {path} raised KeyError: 'w' ({path}:5)")])
def test_a_model_file_that_raises_is_one_line_naming_its_line(capsys, tmp_path, source, said):
    from ember.__main__ import main

    path = tmp_path / "model.py"
    path.write_text(source)
    assert main(["train", "--model", f"{path}:M", "--epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == "ember train: error: " + said.format(path=path)


def test_ctrl_c_saves_and_exits_130_and_a_closed_pipe_is_not_an_error(tmp_path):
    import signal
    import sys

    ckpt = tmp_path / "run.ckpt"
    cmd = [sys.executable, "-m", "ember", "train", "--no-progress", "--save", str(ckpt)]
    proc = subprocess.Popen([*cmd, "--epochs", "100000"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:  # the first epoch ran: Ctrl-C now
        if line.startswith("epoch"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 130 and "interrupted at" in rest and ckpt.exists()
    proc = subprocess.Popen([*cmd, "--epochs", "3"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.stdout.close()  # `ember train | head -1`
    assert proc.wait(timeout=120) == 0 and "Traceback" not in proc.stderr.read()


def test_an_image_model_on_flat_rows_says_to_reshape(tmp_path, capsys):
    from ember.__main__ import main

    flat = tmp_path / "flat.npz"
    np.savez(flat, x=np.zeros((50, 64), np.float32), y=np.arange(50) % 10)
    assert main(["train", "--data", str(flat), "--model", "cnn", "--epochs", "1"]) == 1
    assert "takes images [C, H, W] per example" in capsys.readouterr().err


def test_a_resume_that_would_train_nothing_says_so(tmp_path, capsys):
    from ember.__main__ import main

    ckpt = str(tmp_path / "run.ckpt")
    run = ["train", "--schedule", "cosine", "--no-progress"]
    assert main([*run, "--epochs", "1", "--save", ckpt]) == 0
    capsys.readouterr()
    assert main([*run, "--epochs", "1", "--resume", ckpt]) == 0
    assert "has done 1 of 1 epochs: nothing to train" in capsys.readouterr().out


def _step_lrs(path):
    import csv

    with open(path) as f:
        return {int(r["step"]): float(r["lr"]) for r in csv.DictReader(f) if r["kind"] == "step"}


@pytest.mark.parametrize(("schedule", "said"), [
    ("cosine", "cosine lr schedule ends at step 44; --epochs 3 recomputes it over this run's "
               "132 steps, as a 3-epoch run has it: lr 0 -> 0.03924 at step 44, then anneals "
               "to 0 by step 132"),
    ("step", "step lr schedule (x0.1 every 13 steps) was made for a shorter run; --epochs 3 "
             "recomputes it over this run's 132 steps, as a 3-epoch run has it: lr 5e-05 -> "
             "0.05 at step 44, then x0.1 every 42 steps")])
def test_a_longer_resume_recomputes_the_schedule_over_the_new_epochs(tmp_path, capsys, schedule,
                                                                     said):
    """A cosine run that ended at lr 0 trained on at lr 0: now the extra epochs get the lr a
    run of that many epochs has at those steps, and a note says how."""
    ckpt = tmp_path / "run.ckpt"
    run = ["--schedule", schedule, "--warmup", 5]
    assert train(*run, "--epochs", 1, "--save", ckpt) == 0
    assert train(*run, "--epochs", 3, "--log", tmp_path / "whole.csv") == 0
    capsys.readouterr()
    assert train(*run, "--epochs", 3, "--resume", ckpt, "--save", ckpt,
                 "--log", tmp_path / "resumed.csv") == 0
    out = capsys.readouterr().out
    assert f"note: the checkpoint's {said}" in out, out
    assert "continuing with the checkpoint's optimizer" not in out  # the same one, now
    assert "epoch   3" in out
    resumed, whole = _step_lrs(tmp_path / "resumed.csv"), _step_lrs(tmp_path / "whole.csv")
    assert len(resumed) == 88 and min(resumed.values()) > 0
    assert resumed == {s: whole[s] for s in resumed}
    capsys.readouterr()
    assert train(*run, "--epochs", 3, "--resume", ckpt) == 0  # it was saved extended
    out = capsys.readouterr().out
    assert "has done 3 of 3 epochs" in out and "recomputes" not in out


NET = '''
from ember import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 24)
        self.fc2 = nn.Linear(24, 10)

    def forward(self, x):
        h = nn.functional.relu(self.fc1(x))
        return self.fc2(h)
'''


def _locations(folder):
    import re

    found = {}
    for path in folder.glob("*.mlir"):
        for file, line in re.findall(r'loc\("([^"]*)":(\d+):\d+\)', path.read_text()):
            found.setdefault((file, int(line)), path.name)
    return found


@pytest.mark.parametrize("how", ["launcher", "python -m"])
def test_dumped_ir_locations_name_the_model_file_not_the_launcher(tmp_path, how):
    """Ops of forward are at their lines of the user's file, and the loss (and what autodiff
    and the optimizer make of it), which no line of it made, at its `def forward`."""
    import os
    import sys

    launcher = os.path.join(os.path.dirname(sys.executable), "ember")
    if how == "launcher" and not os.path.exists(launcher):
        pytest.skip("no `ember` script next to this python")
    (tmp_path / "tmp_model.py").write_text(NET)
    cmd = [launcher] if how == "launcher" else [sys.executable, "-m", "ember"]
    proc = subprocess.run([*cmd, "train", "--model", "tmp_model.py:Net", "--epochs", "1",
                           "--no-progress", "--dump-ir", "ir"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = str(tmp_path / "tmp_model.py")
    found = _locations(tmp_path / "ir")
    assert set(found) == {(model, 11), (model, 12), (model, 13)}, found  # def, h =, return
    traced = (tmp_path / "ir" / "train_step.00-traced.mlir").read_text()
    (cross_entropy,) = [ln for ln in traced.splitlines() if "nn.cross_entropy" in ln]
    assert cross_entropy.endswith(f'loc("{model}":11:0)')


def test_a_built_in_model_is_located_in_its_definition(tmp_path, capsys):
    """In process too: the frames outside `ember.__main__` (here pytest's) are not the
    user's."""
    from ember.runtime import models

    assert train("--epochs", 1, "--dump-ir", tmp_path) == 0
    assert {file for file, _ in _locations(tmp_path)} == {models.__file__}


CNN = '''
from ember import nn


class Net(nn.Module):
    {image}
    def __init__(self):
        super().__init__()
        self.conv = nn.{conv}(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * {area}, 10)

    def forward(self, x):
        x = nn.functional.relu(self.conv(x))
        return self.head(x.reshape(x.shape[0], -1))
'''


@pytest.mark.parametrize("image", ["", "image = True"])
def test_a_cnn_file_gets_images_from_its_first_layer(tmp_path, capsys, image):
    path = tmp_path / "cnn.py"
    path.write_text(CNN.format(image=image, conv="Conv2d", area=64))
    assert train("--model", f"{path}:Net", "--optimizer", "adam", "--lr", 0.01,
                 "--epochs", 2) == 0
    out = capsys.readouterr().out
    assert float(out.strip().splitlines()[-1].split()[-1].rstrip("%")) > 85


def test_a_model_whose_first_layer_cannot_tell_is_asked_to_say(tmp_path, capsys):
    path = tmp_path / "cnn1d.py"
    source = CNN.replace("self.conv(x)", "self.conv(x.reshape(x.shape[0], 1, 64))")
    path.write_text(source.format(image="", conv="Conv1d", area=64))
    assert train("--model", f"{path}:Net", "--epochs", 1) == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "ember train: error: cannot tell whether Net takes the digits as images [N, 1, 8, 8] "
        "or as rows [N, 64] (its first layer conv is a Conv1d): add `image = True` (images) "
        f"or `image = False` (rows) to class Net in {path}")
    path.write_text(source.format(image="image = False", conv="Conv1d", area=64))
    assert train("--model", f"{path}:Net", "--epochs", 1) == 0  # as it said


def test_shard_optimizer_without_ranks_is_an_error_before_training(capsys):
    from ember.__main__ import main

    assert main(["train", "--shard-optimizer", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "--shard-optimizer shards the optimizer state across ranks: add --nproc N" in err
    assert "training" not in out
