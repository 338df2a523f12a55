"""Fuzzing the IR text past the parser: mutated dumps of real graphs (an MLP's loss, a CNN,
a layer with layer norm and dropout, each as traced, decomposed and fused) are parsed and
verified; what verifies goes through cse and canonicalize (and must still verify), and
what is small also runs on the interpreter. Only ParseError and VerifyError may come out:
any other exception, or an example that runs past its time, is a bug.

Mutations that keep the text parseable are the ones that reach the verifier, so besides
byte edits there are consistent ones: a type or a dimension replaced everywhere it occurs,
a number replaced by a huge, negative or odd one, two value names swapped.
"""

from __future__ import annotations

import math
import random
import re
import signal
from contextlib import contextmanager

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember as em
from ember import nn
from ember.backends import interpreter
from ember.ir import Graph, TensorType, VerifyError, has_trait, lookup, numpy_dtype, verify
from ember.ir.parser import ParseError, parse
from ember.ir.printer import print_graph
from ember.passes.manager import PassManager, parse_pipeline
from ember.runtime.models import Cnn, Mlp
from ember.runtime.pipeline import grad_pipeline, inference_pipeline

SECONDS_PER_EXAMPLE = 20  # a hang fails the example instead of stalling the run
RUN_LIMIT = 20_000  # largest value (elements) the interpreter is asked to compute
WORK_LIMIT = 2_000_000  # result x largest operand of a matmul or conv the interpreter runs


class Loss(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


class NormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return nn.functional.softmax(self.drop(self.norm(self.fc(x))), axis=-1)


def _seeds() -> list[str]:
    """Each model as traced, after `decompose` and after its whole pipeline (fused)."""
    em.seed(0)
    x, labels = em.TensorSpec((4, 6), "f32"), em.TensorSpec((4,), "i64")
    models = [(Loss(Mlp(6, (5,), 3)), (x, labels), grad_pipeline()),
              (Cnn((1, 4, 4), 2, 3), (em.TensorSpec((2, 1, 4, 4), "f32"),),
               inference_pipeline()),
              (NormBlock().train(), (x,), inference_pipeline())]
    texts = []
    for model, specs, pipeline in models:
        decompose = [p for p in pipeline if p.startswith("decompose")]
        for stages in ([], decompose, pipeline):  # passes rewrite in place: a fresh trace each
            traced = em.trace(model, *specs, training=True)
            g = PassManager(parse_pipeline(",".join(stages))).run(traced)
            texts.append(print_graph(g, debuginfo=len(texts) % 2 == 1))
    return texts


SEEDS = _seeds()
NUMBER = re.compile(r"(?<![%#^\w.])-?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?\b")
TENSOR = re.compile(r"tensor<[0-9x]*[a-z0-9]+>")
USE = re.compile(r"%[A-Za-z0-9_]+(?:#[0-9]+)?\b(?! =|:)")
TOKEN = re.compile(r"%[\w#.]+|\w+|\S")
ODD_NUMBERS = ("0", "1", "-1", "2", "-3", "7", "2147483648", "9223372036854775807",
               "9223372036854775808", "18446744073709551616", "99999999999999999999999",
               "1.0e+308", "-0.0", "0.5", "0x7FC00000", "100000")
ATTR_VALUE = re.compile(r"(?<= = )(?:\[[^\[\]{}]*\]|\"[^\"]*\"|[\w.+-]+(?: : \w+)?)")
ODD_VALUES = ("[]", "[[]]", "[-1]", "[0, 0]", "[[1], [1]]", '"f32"', '"add"', "true", "-1",
              "1.5 : f64", "tensor<2xf32>", "[tensor<2xf32>]", "dense<1.0> : tensor<2xf32>",
              "{}", '["x"]', "[1.5]")
DTYPES = ("f32", "f64", "f16", "bf16", "i64", "i32", "i1")
NOISE = '%"{}()[]<>:,=#^@-+.x0123456789 \nabcdefilnorstuxyf32i64'


def _number(rng: random.Random, text: str) -> str:
    spots = list(NUMBER.finditer(text))
    if not spots:
        return text
    m = rng.choice(spots)
    new = rng.choice(ODD_NUMBERS + (str(-int(float(m.group()))), m.group() * 2))
    return text[:m.start()] + new + text[m.end():]


def _everywhere(rng: random.Random, text: str, pattern: re.Pattern, new) -> str:
    """One match of `pattern`, replaced by `new(match)` wherever it occurs."""
    found = sorted(set(pattern.findall(text)))
    if not found:
        return text
    old = rng.choice(found)
    return text.replace(old, new(old))


def _retype(rng: random.Random, t: str) -> str:
    dims, _, dtype = t[len("tensor<"):-1].rpartition("x") if "x" in t else ("", "", t[7:-1])
    if dims and rng.random() < 0.6:
        parts = dims.split("x")
        parts[rng.randrange(len(parts))] = rng.choice(("0", "1", "3", "8", "99999999999"))
        dims = "x".join(parts)
    else:
        dtype = rng.choice(DTYPES)
    return f"tensor<{dims + 'x' if dims else ''}{dtype}>"


def _tokens(rng: random.Random, text: str, dup: bool) -> str:
    lines = text.split("\n")
    k = rng.randrange(len(lines))
    toks = TOKEN.findall(lines[k])
    if len(toks) < 2:
        return text
    a, b = rng.randrange(len(toks)), rng.randrange(len(toks))
    if dup:
        toks.insert(a, toks[b])
    else:
        toks[a], toks[b] = toks[b], toks[a]
    lines[k] = " ".join(toks)
    return "\n".join(lines)


def mutate(rng: random.Random, text: str) -> str:
    kind = rng.choices(("number", "attr", "type", "value", "swap", "dup", "line", "delete",
                        "flip", "truncate"), (25, 15, 20, 10, 6, 3, 3, 5, 8, 5))[0]
    i = rng.randrange(len(text) + 1)
    if kind == "number":
        return _number(rng, text)
    if kind == "attr":  # an attribute value becomes another one or an odd one
        spots = list(ATTR_VALUE.finditer(text))
        if not spots:
            return text
        m = rng.choice(spots)
        new = rng.choice([rng.choice(spots).group(), rng.choice(ODD_VALUES)])
        return text[:m.start()] + new + text[m.end():]
    if kind == "type":
        return _everywhere(rng, text, TENSOR, lambda t: _retype(rng, t))
    if kind == "value":  # one use of a value becomes a use of another
        uses = list(USE.finditer(text))
        if not uses:
            return text
        m, other = rng.choice(uses), rng.choice(uses)
        return text[:m.start()] + other.group() + text[m.end():]
    if kind in ("swap", "dup"):
        return _tokens(rng, text, dup=kind == "dup")
    if kind == "line":
        lines = text.split("\n")
        k = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines)), lines[k])
        return "\n".join(lines)
    if kind == "delete":
        return text[:i] + text[i + rng.randint(1, 12):]
    if kind == "flip":
        return text[:i] + rng.choice(NOISE) + text[i + 1:]
    return text[:i]


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(SEEDS))
    rng = draw(st.randoms(use_true_random=False))
    for _ in range(rng.randint(1, 3)):
        text = mutate(rng, text)
    return text


@contextmanager
def time_limit(seconds: int):
    def fail(signum, frame):
        raise TimeoutError(f"an example ran past {seconds} s")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _small(g: Graph) -> bool:
    """Cheap enough to interpret: registered ops only, small values and loops."""
    for op in g.walk():
        types = [v.type for v in op.operands + op.results if isinstance(v.type, TensorType)]
        sizes = [t.size for t in types] + [math.prod(op.attributes.get("space", []))
                                           if has_trait(op.name, "kernel") else 0]
        if lookup(op.name) is None or max(sizes, default=0) > RUN_LIMIT:
            return False
        if has_trait(op.name, "compute_bound") and math.prod(sorted(sizes)[-2:]) > WORK_LIMIT:
            return False
    return True


def _inputs(g: Graph, rng: np.random.Generator) -> tuple[list, dict]:
    """Arguments and params: floats in [-2, 2], integers 0 (a valid label for any classes)."""
    def value(t: TensorType) -> np.ndarray:
        return (rng.uniform(-2, 2, t.shape) if t.is_float else np.zeros(t.shape)).astype(
            numpy_dtype(t.dtype))
    params = {op.attributes["id"]: value(op.result.type) for op in g.params()}
    return [value(a.type) for a in g.args], params


def _run(g: Graph) -> list[np.ndarray] | None:
    """The interpreter's results on fixed inputs; None when the data indexes out of range
    (labels 0 of 0 classes), which only an op that indexes by data may say."""
    args, params = _inputs(g, np.random.default_rng(0))
    try:
        return interpreter.run(g, args, params)
    except IndexError:
        assert any(op.name in ("ember.gather", "ember.scatter_add", "nn.cross_entropy")
                   for op in g.walk())
        return None


def check(text: str) -> None:
    """Only ParseError and VerifyError may escape; what verifies survives the passes,
    prints and parses back, and (when small) computes what it did before them."""
    try:
        g = verify(parse(text))
    except (ParseError, VerifyError) as e:
        assert e.line is None or (e.line >= 1 and e.col >= 1), str(e)
        return
    before = _run(g) if _small(g) else None
    g = PassManager(parse_pipeline("cse,canonicalize"), verify_each=True).run(g)
    verify(parse(print_graph(g)))
    after = _run(g) if before is not None else None
    for x, y in zip(before or [], after or []):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6)


def test_seeds_are_valid_and_run():
    for text in SEEDS:
        with time_limit(SECONDS_PER_EXAMPLE):
            g = verify(parse(text))
            assert _small(g)
            check(text)


@settings(max_examples=1000, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(mutated())
def test_mutated_ir_only_raises_parse_or_verify_errors(text):
    with time_limit(SECONDS_PER_EXAMPLE):
        check(text)
