"""Real models, exported by both of torch's ONNX exporters and imported with `em.onnx.load`:
transformers' BertModel, GPT2LMHeadModel, DistilBertModel and T5EncoderModel (tiny configs,
random init) and two small PyTorch CNNs (BatchNorm; a MobileNet-like block with Hardswish,
a depthwise conv and a Hardsigmoid squeeze-excitation). Each output matches PyTorch's within
1e-4 relative (max abs diff / max abs reference); the transformers then fine-tune 5 SGD
steps in ember and in PyTorch from the same weights, with the same losses step by step.

The TorchScript exporter is `torch.onnx.export(..., dynamo=False, opset_version=17)`, with
its default constant folding; the dynamo exporter `torch.onnx.export(..., dynamo=True)`
(a case it cannot export is skipped with the exporter's error). `em.onnx.load` makes the
model's weights trainable Params (its import report); PyTorch trains the same set: each
torch parameter found among them by name or by value (the exporter renames a weight it
transposed: `onnx::MatMul_123`), the others frozen.
`python tests/interop/test_onnx_model_zoo.py` runs them, printing each case's import +
compile time.
"""

import copy
import io
import time
import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # exports and compiles real models

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
transformers = pytest.importorskip("transformers")

import ember as em  # noqa: E402

F = em.nn.functional
B, T, VOCAB, HIDDEN, HEADS, LAYERS = 2, 8, 100, 64, 2, 2
STEPS, LR, RTOL = 5, 1e-2, 1e-4
EXPORTERS = ("torchscript", "dynamo")


class Wrapped(torch.nn.Module):
    """A transformers model called with its inputs by name; its main output."""

    def __init__(self, model, inputs: tuple[str, ...], output: str):
        super().__init__()
        self.m, self.inputs, self.output = model, inputs, output

    def forward(self, *xs):
        return getattr(self.m(**dict(zip(self.inputs, xs))), self.output)


def _randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every float parameter moved off its init: the exporters share initializers of equal
    values (the zero biases, the LayerNorm ones), which then train as one."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return model.eval()


def _tokens(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((B, T), np.int64)
    mask[1, 5:] = 0  # the second row padded
    types = np.zeros((B, T), np.int64)
    types[:, T // 2:] = 1
    return {"input_ids": rng.integers(0, VOCAB, (B, T)), "attention_mask": mask,
            "token_type_ids": types}


def _transformer(name: str):
    """(torch model, inputs, target, ember loss, torch loss) of a transformers model."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, attn_implementation="sdpa")
    if name == "bert":
        cfg = transformers.BertConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                                      max_position_embeddings=32, type_vocab_size=2,
                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                      **common)
        model, inputs = transformers.BertModel(cfg), ("input_ids", "attention_mask",
                                                      "token_type_ids")
    elif name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=32,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      use_cache=False, **common)
        model, inputs = transformers.GPT2LMHeadModel(cfg), ("input_ids", "attention_mask")
    elif name == "distilbert":
        cfg = transformers.DistilBertConfig(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                            hidden_dim=2 * HIDDEN, max_position_embeddings=32,
                                            dropout=0.0, attention_dropout=0.0, **common)
        model, inputs = transformers.DistilBertModel(cfg), ("input_ids", "attention_mask")
    else:
        # eager attention: with sdpa the dynamo exporter fails on torch 2.13 ("Cannot view
        # a tensor with shape [2, 8, 2, 32] and strides (512, 32, 256, 1) as (2, 8, 64)")
        common["attn_implementation"] = "eager"
        cfg = transformers.T5Config(d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN,
                                    num_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0,
                                    use_cache=False, **common)
        model, inputs = transformers.T5EncoderModel(cfg), ("input_ids", "attention_mask")
    tokens = _tokens(1)
    xs = [tokens[k] for k in inputs]
    if name == "gpt2":  # the next token, none after the last
        target = np.concatenate([xs[0][:, 1:], np.full((B, 1), -100)], axis=1)
        return (Wrapped(_randomized(model, 2), inputs, "logits").eval(), xs, target,
                lambda logits, y: F.cross_entropy(logits.transpose(1, 2), y),
                lambda logits, y: torch.nn.functional.cross_entropy(logits.transpose(1, 2), y))
    target = np.random.default_rng(3).standard_normal((B, T, HIDDEN)).astype(np.float32)
    return (Wrapped(_randomized(model, 2), inputs, "last_hidden_state").eval(), xs, target,
            F.mse_loss, torch.nn.functional.mse_loss)


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class MobileBlock(torch.nn.Module):
    """MobileNetV3's inverted residual: expand (Conv, BatchNorm, Hardswish), depthwise Conv,
    squeeze-excitation gated by Hardsigmoid, project, residual; then a classifier."""

    def __init__(self, c=8, e=24):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, c, 3, padding=1),
                                        torch.nn.BatchNorm2d(c), torch.nn.Hardswish())
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(c, e, 1, bias=False),
                                          torch.nn.BatchNorm2d(e), torch.nn.Hardswish())
        self.depthwise = torch.nn.Sequential(torch.nn.Conv2d(e, e, 3, padding=1, groups=e,
                                                             bias=False),
                                             torch.nn.BatchNorm2d(e), torch.nn.Hardswish())
        self.se = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(e, 8, 1),
                                      torch.nn.ReLU(), torch.nn.Conv2d(8, e, 1),
                                      torch.nn.Hardsigmoid())
        self.project = torch.nn.Sequential(torch.nn.Conv2d(e, c, 1, bias=False),
                                           torch.nn.BatchNorm2d(c))
        self.head = torch.nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x)
        h = self.depthwise(self.expand(x))
        x = x + self.project(h * self.se(h))
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _cnn(name: str):
    torch.manual_seed(4)
    model = Cnn() if name == "cnn" else MobileBlock()
    with torch.no_grad():  # running statistics that are not the defaults
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
    x = np.random.default_rng(5).standard_normal((B, 3, 16, 16)).astype(np.float32)
    return model.eval(), [x]


def export(model: torch.nn.Module, xs: list[np.ndarray], names: list[str], exporter: str) -> bytes:
    """The ONNX bytes of `model` on `xs`, by the TorchScript or the dynamo exporter; a
    dynamo export that fails skips the case with its error."""
    args = tuple(torch.from_numpy(x) for x in xs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            f = io.BytesIO()
            torch.onnx.export(model, args, f, dynamo=False, opset_version=17,
                              input_names=names, output_names=["y"])
            return f.getvalue()
        try:
            return torch.onnx.export(model, args, dynamo=True,
                                     verbose=False).model_proto.SerializeToString()
        except Exception as e:  # onnxscript missing, or a model this exporter cannot export
            pytest.skip(f"torch.onnx.export(dynamo=True) failed: {type(e).__name__}: "
                        f"{str(e)[:500]}")


def _import(case: str, data: bytes, xs: list[np.ndarray]):
    """The imported model and its forward compiled for the cpu backend; prints the time."""
    start = time.perf_counter()
    m = em.onnx.load(data)
    forward = em.compile(m, *xs, backend="cpu")
    print(f"\n{case}: import + compile {time.perf_counter() - start:.2f} s")
    return m, forward


def _close(got, want) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / np.abs(want).max())


def _is_part(v: np.ndarray, q: np.ndarray) -> bool:
    """Whether Param value `v` is torch parameter `q`: as it is, transposed, or rows of it
    (the dynamo exporter folds the embeddings of the fixed position ids into a constant)."""
    if v.shape == q.shape and np.array_equal(v, q):
        return True
    if v.ndim == 2 and v.shape == q.shape[::-1] and np.array_equal(v, q.T):
        return True
    if q.ndim != 2 or v.ndim < 2 or v.shape[-1] != q.shape[1] or v.size >= q.size:
        return False
    rows = v.reshape(-1, q.shape[1])
    return any(np.array_equal(rows, q[i:i + len(rows)]) for i in range(len(q) - len(rows) + 1))


def _torch_names(m, model: torch.nn.Module) -> dict[str, str | None]:
    """Each trainable Param's torch parameter (by name, or by value: see `_is_part`), or
    None: a value the exporter computed from parameters (the dynamo exporter folds T5's
    relative position bias, gathered for the fixed length, into a [1, heads, T, T] constant)."""
    params = dict(model.named_parameters())
    found: dict[str, str | None] = {}
    for name, p in m.initializers.items():
        if p.requires_grad:
            same = [name] if name in params else [
                k for k, q in params.items() if _is_part(p.val(), q.detach().numpy())]
            assert len(same) <= 1, f"Param {name!r} {p.val().shape} is torch's {same}"
            found[name] = same[0] if same else None
    return found


def _trained_alike(found: dict[str, str], model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The torch parameters ember trains (`found`: Param -> torch parameter); the others
    frozen. A tied torch parameter the export made several Params (the TorchScript exporter
    folds GPT-2's `lm_head` into a transposed copy of `wte`) is untied into as many, which
    then train apart as the Params do."""
    params = dict(model.named_parameters())
    aliases: dict[int, list[str]] = {}
    for k, q in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(q), []).append(k)
    trained = set(found.values())
    for k in sorted(trained):
        copies, names = list(found.values()).count(k), aliases[id(params[k])]
        if copies > 1:
            assert copies == len(names), f"{k} (tied as {names}) is {copies} Params"
            for alias in names[1:]:  # each alias its own copy
                owner, _, attr = alias.rpartition(".")
                setattr(model.get_submodule(owner), attr,
                        torch.nn.Parameter(params[k].detach().clone()))
            trained |= set(names)
    params = dict(model.named_parameters(remove_duplicate=False))
    for k, q in params.items():
        q.requires_grad_(k in trained)
    return list({id(q): q for q in params.values() if q.requires_grad}.values())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["bert", "gpt2", "distilbert", "t5"])
def test_transformer_matches_and_fine_tunes_as_in_pytorch(name, exporter):
    model, xs, target, loss_fn, torch_loss = _transformer(name)
    reference = copy.deepcopy(model)  # before the export, which may change the model
    with torch.no_grad():
        want = reference(*map(torch.from_numpy, xs)).numpy()
    data = export(model, xs, list(model.inputs), exporter)
    m, forward = _import(f"{name}-{exporter}", data, xs)
    assert _close(forward(*xs), want) < RTOL

    found = _torch_names(m, reference)
    computed = sorted(k for k, v in found.items() if v is None)
    if computed:  # trained in neither: no torch parameter is that value
        print(f"{name}-{exporter}: frozen, computed from parameters at export: {computed}")
        found = {k: v for k, v in found.items() if v is not None}
        m = em.onnx.load(data, trainable=sorted(found))
    step = em.compile_train_step(m, loss_fn, em.optim.SGD(lr=LR), backend="cpu",
                                 n_inputs=len(xs))
    opt = torch.optim.SGD(_trained_alike(found, reference), lr=LR)
    losses, wants = [], []
    for _ in range(STEPS):
        losses.append(float(step(*xs, target)))
        opt.zero_grad()
        loss = torch_loss(reference(*map(torch.from_numpy, xs)), torch.from_numpy(target))
        loss.backward()
        opt.step()
        wants.append(loss.item())
    # f32 rounding that differs compounds over the steps (T5, unscaled attention, most)
    for k, (got, want) in enumerate(zip(losses, wants)):
        assert got == pytest.approx(want, rel=RTOL * (k + 1)), (k, losses, wants)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", ["cnn", "mobilenet_block"])
def test_cnn_matches_pytorch(name, exporter):
    model, xs = _cnn(name)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        want = reference(torch.from_numpy(xs[0])).numpy()
    _, forward = _import(f"{name}-{exporter}", export(model, xs, ["x"], exporter), xs)
    assert _close(forward(*xs), want) < RTOL


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-m", "slow", "-p", "no:cacheprovider", "-s"]))
