"""Mixed precision (`precision="bf16-mixed" | "16-mixed"`, runtime/precision.py and
passes/autocast.py): a GPT-like model trains as in f32, a step with inf gradients is
skipped under 16-mixed's loss scaling and the scale adjusted as torch.amp.GradScaler does,
saved runs resume bit-exactly, the interpreter and the cpu backend agree, and one step
matches PyTorch's `torch.autocast("cpu", dtype=torch.bfloat16)`."""

import copy
import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from file_damage import metadata, reseal

import ember as em
from ember import optim
from ember.__main__ import main
from ember.runtime.checkpoint import KEY, CheckpointError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpt import Gpt, lm_loss, torch_loss, torch_twin  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"
T, BATCH, VOCAB = 16, 8, 128


def text(n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """`n` (tokens, next tokens) batches of real text: README.md's characters."""
    chars = np.frombuffer(README.read_bytes(), np.uint8).astype(np.int64) % VOCAB
    starts = np.random.default_rng(seed).integers(0, len(chars) - T - 1, (n, BATCH))
    windows = chars[starts[..., None] + np.arange(T + 1)]
    return [(w[:, :-1].copy(), w[:, 1:].copy()) for w in windows]


def gpt_step(precision: str, backend: str = "cpu", **options):
    em.seed(0)
    model = Gpt(vocab=VOCAB, n_embd=32, n_head=4, n_layer=2, block=T)
    return model, em.compile_train_step(model, lm_loss, optim.AdamW(lr=1e-2), backend=backend,
                                        precision=precision, **options)


@functools.cache
def final_loss(precision: str, steps: int = 200) -> float:
    """The mean loss of the last 10 of `steps` AdamW steps on the text."""
    _, step = gpt_step(precision)
    losses = [step(x, y) for x, y in text(steps)]
    assert losses[-1] < losses[0] - 1.0  # it learned the text's characters
    return float(np.mean(losses[-10:]))


def state(model, step) -> list[np.ndarray]:
    """Every param and optimizer state value, copied."""
    slots = [np.array(v) for s in step.optimizer.state.values() for v in s.values()]
    return [np.array(v) for v in model.state_dict().values()] + slots


def assert_grads_close(got: dict, want: dict, rtol: float) -> None:
    """Each gradient within `rtol` of its twin's norm, or of a hundredth of the largest
    one's (a key bias's gradient is zero but for rounding: softmax ignores it)."""
    floor = 1e-2 * max(np.linalg.norm(w) for w in want.values())
    for name, w in want.items():
        err = np.linalg.norm(got[name] - w) / max(np.linalg.norm(w), floor)
        assert got[name].dtype == np.float32 and err < rtol, (name, err)


def test_a_precision_not_among_the_three_is_a_usage_error():
    model, _ = gpt_step("32")
    listed = "'32', 'bf16-mixed', '16-mixed'"
    with pytest.raises(ValueError, match=f"precision must be one of {listed}, got 'bf16'"):
        em.compile_train_step(model, lm_loss, optim.SGD(lr=0.1), precision="bf16")
    with pytest.raises(ValueError, match=listed):
        em.compile_grad(model, lm_loss, precision="fp16")
    with pytest.raises(ValueError, match=listed):
        em.compile(model, np.zeros((1, T), np.int64), precision="16")
    with pytest.raises(SystemExit):
        main(["train", "--precision", "bf16"])


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_trains_as_f32_does(precision):
    f32, mixed = final_loss("32"), final_loss(precision)
    assert abs(mixed - f32) < 0.02 * f32, (mixed, f32)


def test_params_and_state_stay_f32_and_every_cast_is_fused():
    model, step = gpt_step("bf16-mixed")
    step(*text(1)[0])
    assert {v.dtype for v in state(model, step)} == {np.dtype(np.float32)}
    assert step.stages[:3] == ["traced", "autocast", "autodiff"]
    assert "bf16" in step.ir("autocast") and "bf16" not in step.ir("traced")
    fused = step.ir("fuse")  # attention's backward, computed in f32, fuses as in f32
    assert '"ember.cast"' not in fused and '"kernel.attention_grad"' in fused


def test_symbolic_dims_and_recompute_under_16_mixed():
    x, y = (a[:, :11] for a in text(1)[0])
    runs = [gpt_step("16-mixed", recompute="balanced", **dims)[1]
            for dims in ({}, {"dynamic_dims": {0: {1: "T"}, 1: {1: "T"}}})]
    exact, padded = ([step(x, y) for _ in range(3)] for step in runs)
    # f16 rounds at 2^-11: the padded graph's GEMMs may sum in another order (another
    # blocking, another engine by the measured cost table), and a sum within an f32
    # rounding of an f16 boundary flips by an f16 ulp (2.3e-5 after 3 steps, seen once)
    np.testing.assert_allclose(padded, exact, rtol=1e-4)
    assert runs[1].stages[:3] == ["traced", "pad-mask", "autocast"]


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_an_overflowing_step_is_skipped_and_the_scale_halved(backend):
    model, step = gpt_step("16-mixed", backend)
    batches = text(3)
    step(*batches[0])
    assert not step.skipped and step.scaler.scale == 2.0 ** 16
    before = state(model, step)
    step.scaler.scale = 2.0 ** 40  # the backward overflows f16 in its first matmul
    loss = step(*batches[1])
    assert np.isfinite(loss) and step.skipped
    assert step.scaler.scale == 2.0 ** 39 and step.scaler.growth_tracker == 0
    assert step.optimizer.step_count == 1
    for a, b in zip(before, state(model, step), strict=True):
        np.testing.assert_array_equal(a, b)
    step.scaler.scale = 2.0 ** 16
    step(*batches[2])
    assert not step.skipped and step.optimizer.step_count == 2


def test_the_scale_grows_after_growth_interval_finite_steps():
    _, step = gpt_step("16-mixed")
    step.scaler.growth_interval = 3
    trace = []
    for x, y in text(5):
        step(x, y)
        trace.append((step.scaler.scale, step.scaler.growth_tracker))
    s = 2.0 ** 16
    assert trace == [(s, 1), (s, 2), (2 * s, 0), (2 * s, 1), (2 * s, 2)]


def test_16_mixed_accumulation_skips_the_update_of_an_overflowing_cycle():
    model, step = gpt_step("16-mixed", accumulate=2)
    before = state(model, step)
    step.scaler.scale = 2.0 ** 40
    for x, y in text(2):
        step(x, y)
    assert step.pending == 0 and step.skipped and step.optimizer.step_count == 0
    assert step.scaler.scale == 2.0 ** 39
    for a, b in zip(before, state(model, step)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_a_saved_run_resumes_bit_exactly(tmp_path, precision):
    batches = text(8)
    model, step = gpt_step(precision)
    if step.scaler is not None:
        step.scaler.growth_interval = 3  # the scale grows before and after the save
    for x, y in batches[:4]:
        step(x, y)
    path = step.save_checkpoint(str(tmp_path / "run.ckpt"))
    saved = copy.copy(step.scaler)
    ref = [step(x, y) for x, y in batches[4:]]
    again, resumed = gpt_step(precision)
    if resumed.scaler is not None:
        resumed.scaler.growth_interval = 3
    resumed.load_checkpoint(path)
    assert resumed.scaler == saved
    assert [resumed(x, y) for x, y in batches[4:]] == ref
    for a, b in zip(state(model, step), state(again, resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.scaler == step.scaler


def test_the_scaler_state_is_checked_and_ignored_by_a_step_that_does_not_scale(tmp_path):
    _, step = gpt_step("16-mixed")
    step(*text(1)[0])
    path = tmp_path / "run.ckpt"
    step.save_checkpoint(str(path))
    _, f32 = gpt_step("32")
    f32.load_checkpoint(str(path))  # resumed in another precision
    assert f32.optimizer.step_count == 1
    doc = json.loads(metadata(path.read_bytes())[KEY])
    assert doc["loss_scaler"] == {"scale": 65536.0, "growth_tracker": 1}
    doc["loss_scaler"]["scale"] = -1.0
    path.write_bytes(reseal(path.read_bytes(), {**metadata(path.read_bytes()),
                                                KEY: json.dumps(doc)}))
    with pytest.raises(CheckpointError, match="want a finite scale > 0"):
        step.load_checkpoint(str(path))
    assert step.scaler.scale == 65536.0


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_interpreter_and_cpu_agree(precision):
    """The same losses over three steps, and the same gradients at the same params: the
    interpreter's after its three steps (Adam's normalized update turns a rounding
    difference of a near-zero gradient into one of lr, so each backend's own params after
    training differ by more than their gradients at one point do)."""
    batches = text(3)
    losses, grads = [], []
    for backend in ("interpreter", "cpu"):
        model, step = gpt_step(precision, backend)
        losses.append([step(x, y) for x, y in batches])
        if backend == "interpreter":
            trained = model.state_dict()
        model.load_state_dict(trained)
        grads.append(em.compile_grad(model, lm_loss, backend=backend, precision=precision)(
            *batches[0]))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-3)
    assert_grads_close(dict(grads[1].items()), dict(grads[0].items()), 1e-2)


def test_inference_runs_its_matmuls_in_bf16_and_returns_f32():
    model, _ = gpt_step("32")
    x = text(1)[0][0]
    ref = em.compile(model, x)(x)
    fwd = em.compile(model, x, precision="bf16-mixed")
    out = fwd(x)
    assert out.dtype == np.float32 and "autocast" in fwd.stages
    np.testing.assert_allclose(out, ref, atol=0.05 * np.abs(ref).max())
    dynamic = em.compile(model, em.TensorSpec((BATCH, "T"), "i64"), precision="bf16-mixed")
    np.testing.assert_array_equal(dynamic(x), out)


def test_one_step_matches_torch_autocast_bf16():
    torch = pytest.importorskip("torch")
    model, _ = gpt_step("32")
    twin = torch_twin(model)
    x, y = text(1)[0]
    grads = em.compile_grad(model, lm_loss, precision="bf16-mixed")
    ours = grads(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch_loss(twin, torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    assert abs(grads.loss - loss.item()) < 1e-2 * loss.item()
    theirs = {name: p.grad.numpy() for name, p in twin.named_parameters()}
    want = {}  # by our paths, Linear weights as ours ([d_in, d_out])
    for path, _ in model.named_parameters():
        g = theirs[path.replace("gamma", "weight").replace("beta", "bias")]
        linear = path.endswith(".weight") and path not in ("tok.weight", "pos.weight")
        want[path] = g.T if linear else g
    assert_grads_close({path: ours[p.id] for path, p in model.named_parameters()}, want, 2e-2)
