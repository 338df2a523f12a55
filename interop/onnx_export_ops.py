"""What each core `ember.*` op becomes in ONNX (opset 18): one table, `RULES`, keyed by op name.

A rule writes ONNX nodes for one ember op into a `Nodes` and returns the name of the value
that holds the op's result. Nodes here are plain data (`Node`, numpy constants): this module
never imports `onnx`, so the rules and the check for ops without one (`missing`) run, and
are tested, without it; `onnx_export` turns the list into protobuf.

Where ONNX's op differs from ember's at an edge, the rule spells out ember's meaning from
exact parts instead: `one_hot` as Equal against an index range (ONNX OneHot counts negative
labels from the end; ember gives them no class), `softplus` with its beta and threshold
around ONNX's plain Softplus, `cmp ne` as Not(Equal), `unslice` as Pad (a step > 1 spreads
the elements first, by a reshape and a Pad: no ScatterND, no index tensors).

With symbolic dims (`em.TensorSpec(("N", 64))`) the rules still write static numbers; the
exporter finds those that follow a size (`Poly`, a polynomial of the sizes) and has
`Nodes.sizes` compute them at run time from `Shape` of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..ir import Operation, dtype_of, numpy_dtype
from ..ir.dialects.ember import softplus_params
from ..ir.semantics import window

OPSET = 18  # the first opset where every reduction takes its axes as an input

# ember dtype -> TensorProto.DataType: fixed numbers of onnx.proto (checked by the tests)
ONNX_DTYPES = {"f32": 1, "f64": 11, "f16": 10, "bf16": 16, "i64": 7, "i32": 6, "i1": 9}


@dataclass(frozen=True)
class Const:
    """A tensor value in a node attribute; `dtype` is ember's."""

    value: np.ndarray
    dtype: str


Monomial = tuple[str, ...]  # sorted names of symbolic dims; () is the constant term


@dataclass(frozen=True)
class Poly:
    """An integer polynomial of symbolic sizes, at most linear in each (`2*N*T + 1`): the
    shape numbers a model's graph holds (a reshape to [N*T, d], a broadcast to [N, ...])."""

    terms: tuple[tuple[Monomial, int], ...]  # no zero coefficients, constant term first

    @classmethod
    def of(cls, coefficients: dict[Monomial, int]) -> Poly:
        return cls(tuple(sorted(((tuple(sorted(m)), int(c)) for m, c in coefficients.items()
                                 if c), key=lambda t: (len(t[0]), t[0]))))

    def __call__(self, sizes: dict[str, int]) -> int:
        return sum(c * math.prod(sizes[s] for s in m) for m, c in self.terms)

    @property
    def constant(self) -> int | None:
        """The value where no symbolic size is in it, else None."""
        return None if any(m for m, _ in self.terms) else sum(c for _, c in self.terms)

    @property
    def symbol(self) -> str | None:
        """The name where this is exactly one symbolic size, else None."""
        if len(self.terms) == 1:
            (m, c), = self.terms
            if c == 1 and len(m) == 1:
                return m[0]
        return None

    def __str__(self) -> str:
        text = " + ".join("*".join([str(c)] * (c != 1 or not m) + list(m))
                          for m, c in self.terms)
        return text.replace("+ -", "- ") or "0"


@dataclass
class Node:
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    doc: str = ""  # the ember op and its source line, for a reader of the ONNX file


class Nodes:
    """The ONNX nodes being written, with names that never collide with `reserved` ones
    (the initializers, named by their param paths): each new value is named after its op,
    `matmul`, `matmul_1`, ... Every node written while an ember op is exported carries
    that op in its `doc`."""

    def __init__(self, reserved: set[str]):
        self.nodes: list[Node] = []
        self.doc = ""
        self._taken = set(reserved)
        self._count: dict[str, int] = {}
        # symbolic dims: where each is read (graph input, axis), and the size tensors made
        self.sources: dict[str, tuple[str, int]] = {}
        self._sizes: dict = {}

    @property
    def taken(self) -> set[str]:
        """Every name in use: the reserved ones and every value written so far."""
        return set(self._taken)

    def fresh(self, base: str) -> str:
        while True:
            n = self._count.get(base, 0)
            self._count[base] = n + 1
            name = base if n == 0 else f"{base}_{n}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def node(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """Append `op_type(*inputs) {attrs}` and return the name of its one output (`out`,
        else a fresh one)."""
        out = out or self.fresh(op_type.lower())
        self.nodes.append(Node(op_type, list(inputs), [out], attrs, self.doc))
        return out

    def const(self, value, dtype: str | None = None) -> str:
        """A `Constant` node holding `value` (as ember's `dtype`, else numpy's own)."""
        value = np.asarray(value)
        return self.node("Constant", value=Const(value, dtype or dtype_of(value.dtype)))

    def ints(self, values) -> str:
        """A 1-D int64 constant: the shape, axes or index operands ONNX takes as inputs."""
        return self.const(np.asarray(list(values), np.int64))

    def _once(self, key, make: Callable[[], str]) -> str:
        """A size tensor written once: later uses read the first one."""
        if key not in self._sizes:
            self._sizes[key] = make()
        return self._sizes[key]

    def rename_last(self, old: str, new: str) -> bool:
        """Name the last node's output `new` where it is `old` (the size tensors it is one
        of follow); False where the last node is not `old`'s."""
        if not self.nodes or self.nodes[-1].outputs != [old]:
            return False
        self.nodes[-1].outputs = [new]
        self._sizes = {k: new if v == old else v for k, v in self._sizes.items()}
        return True

    def size(self, p: Poly) -> str:
        """A [1] int64 tensor holding `p` at run time: `Shape` of the input that has each
        symbolic size (read once), products of them, times and plus constants."""
        def monomial(m: Monomial) -> str:
            if len(m) == 1:
                x, axis = self.sources[m[0]]
                return self.node("Shape", x, start=axis, end=axis + 1)
            return self.node("Mul", self._once(("monomial", m[:-1]), lambda: monomial(m[:-1])),
                             self._once(("monomial", m[-1:]), lambda: monomial(m[-1:])))

        def make() -> str:
            out = None
            for m, c in reversed(p.terms):  # the constant term last
                term = self.ints([c]) if not m else \
                    self._once(("monomial", m), lambda m=m: monomial(m))
                if m and c != 1:
                    term = self.node("Mul", term, self.ints([c]))
                out = term if out is None else self.node("Add", out, term)
            return out if out is not None else self.ints([0])

        return self._once(("poly", p), make)

    def scalar(self, d: Poly | int) -> str:
        """A 0-d int64 tensor of a size (Range takes its bounds as scalars)."""
        d = d.constant if isinstance(d, Poly) and d.constant is not None else d
        if isinstance(d, int):
            return self.const(np.int64(d))
        return self._once(("scalar", d), lambda: self.node("Squeeze", self.size(d)))

    def range(self, d: Poly | int) -> str:
        """0, 1, ..., d - 1 (int64), made at run time."""
        return self._once(("range", d), lambda: self.node(
            "Range", self.const(np.int64(0)), self.scalar(d), self.const(np.int64(1))))

    def sizes(self, entries) -> str:
        """A 1-D int64 tensor of `entries` (ints and Polys), computed at run time: runs of
        ints as one constant, a Poly each, concatenated."""
        entries = [e.constant if isinstance(e, Poly) and e.constant is not None else e
                   for e in entries]
        if not any(isinstance(e, Poly) for e in entries):
            return self.ints(entries)

        def make() -> str:
            parts, run = [], []
            for e in entries:
                if isinstance(e, Poly):
                    parts += [self.ints(run)] if run else []
                    parts, run = parts + [self.size(e)], []
                else:
                    run.append(e)
            parts += [self.ints(run)] if run else []
            return parts[0] if len(parts) == 1 else self.node("Concat", *parts, axis=0)

        return self._once(("sizes", tuple(entries)), make)


Rule = Callable[..., str]  # (nodes, op, *input names) -> the name of the op's result


def same(op_type: str, **fixed) -> Rule:
    """The ONNX op of the same meaning, on the same operands."""
    return lambda b, op, *xs: b.node(op_type, *xs, **fixed)


def _reduce(op_type: str) -> Rule:
    def rule(b: Nodes, op: Operation, x: str) -> str:
        axes, keep = op.attributes["axes"], int(op.attributes["keepdims"])
        if not axes:  # ember: reduce nothing; ONNX without axes reduces everything
            return b.node(op_type, x, keepdims=keep, noop_with_empty_axes=1)
        return b.node(op_type, x, b.ints(axes), keepdims=keep)

    return rule


CMP = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}


def _cmp(b: Nodes, op: Operation, x: str, y: str) -> str:
    predicate = op.attributes["predicate"]
    if predicate == "ne":
        return b.node("Not", b.node("Equal", x, y))
    return b.node(CMP[predicate], x, y)


def _constant(b: Nodes, op: Operation) -> str:
    return b.const(op.attributes["value"], op.result.type.dtype)


def _softplus(b: Nodes, op: Operation, x: str) -> str:
    """x where beta x > threshold, else softplus(beta x) / beta (ONNX's has neither)."""
    beta, threshold = softplus_params(op.attributes)
    dtype = op.result.type.dtype
    t = x if beta == 1 else b.node("Mul", x, b.const(beta, dtype))
    y = b.node("Softplus", t)
    y = y if beta == 1 else b.node("Div", y, b.const(beta, dtype))
    return b.node("Where", b.node("Greater", t, b.const(threshold, dtype)), x, y)


def _sign(b: Nodes, op: Operation, x: str) -> str:
    """ONNX's Sign takes no bool; ember's sign of a bool is the bool itself."""
    return b.node("Identity" if op.result.type.dtype == "i1" else "Sign", x)


def _one_hot(b: Nodes, op: Operation, labels: str) -> str:
    """[..., C]: 1 where the label equals the class index, 0 elsewhere (any label)."""
    a, ltype = op.attributes, op.operands[0].type
    classes = b.const(np.arange(a["num_classes"], dtype=numpy_dtype(ltype.dtype)))
    hit = b.node("Equal", b.node("Unsqueeze", labels, b.ints([-1])), classes)
    return b.node("Cast", hit, to=ONNX_DTYPES[a["dtype"]])


def _window(a: dict) -> dict:
    """ONNX's names for ember's symmetric [h, w] stride and padding."""
    (sh, sw), (ph, pw) = a["stride"], a["padding"]
    return {"strides": [sh, sw], "pads": [ph, pw, ph, pw]}


def _conv(b: Nodes, op: Operation, x: str, w: str) -> str:
    a = op.attributes
    return b.node("Conv", x, w, **_window(a), dilations=list(a["dilation"]), group=a["groups"])


def _conv_transpose(b: Nodes, op: Operation, g: str, w: str) -> str:
    """conv2d's input gradient is ConvTranspose with the same weight layout; the extra rows
    at the bottom and right that `input_shape` asks for are ONNX's output_padding."""
    a, (gt, wt) = op.attributes, (v.type for v in op.operands)
    extra = [size - ((n - 1) * s - 2 * p + d * (k - 1) + 1) for size, n, s, p, d, k in
             zip(a["input_shape"][2:], gt.shape[2:], a["stride"], a["padding"], a["dilation"],
                 wt.shape[2:])]
    return b.node("ConvTranspose", g, w, **_window(a), dilations=list(a["dilation"]),
                  group=a["groups"], output_padding=extra)


def _reshape(b: Nodes, x: str, shape) -> str:
    return b.node("Reshape", x, b.ints(shape), allowzero=1)  # a 0 in the shape is a size


def _slice(b: Nodes, op: Operation, x: str) -> str:
    """ONNX's Slice on every axis, its ends one past each window's last element."""
    parts = window(op.attributes, op.result.type.shape)
    starts, ends, steps = ([getattr(p, k) for p in parts] for k in ("start", "stop", "step"))
    return b.node("Slice", x, b.ints(starts), b.ints(ends), b.ints(range(len(parts))),
                  b.ints(steps))


def _spread(b: Nodes, x: str, shape: tuple, steps: list[int]) -> str:
    """x with t - 1 zeros after each element along each axis of step t: a new axis of 1
    after each axis, padded to t, merged back into it."""
    pairs = [m for n in shape for m in (n, 1)]
    after = [m for t in steps for m in (0, t - 1)]
    y = b.node("Pad", _reshape(b, x, pairs), b.ints([0] * len(pairs) + after))
    return _reshape(b, y, [n * t for n, t in zip(shape, steps)])


def _unslice(b: Nodes, op: Operation, x: str) -> str:
    """Pad with zeros before each window's start and after its end; a step t > 1 spreads
    the elements first (`_spread`), and a negative pad after cuts the zeros that spreading
    put past the last element."""
    a, shape = op.attributes, op.operands[0].type.shape
    steps = [t if n > 1 else 1 for t, n in zip(a["step"], shape)]
    if any(t > 1 for t in steps):
        x = _spread(b, x, shape, steps)
    after = [size - s - n * t for size, s, n, t in zip(a["shape"], a["start"], shape, steps)]
    return b.node("Pad", x, b.ints([*a["start"], *after]))


def _identity_or(rule: Rule) -> Rule:
    """`rule`, but Identity where the op's result is its operand's shape (a whole window,
    which ONNX's Slice and Pad cannot take on a scalar)."""
    def whole(b: Nodes, op: Operation, x: str) -> str:
        if op.result.type.shape == op.operands[0].type.shape:
            return b.node("Identity", x)
        return rule(b, op, x)

    return whole


def _pool(op_type: str, **fixed) -> Rule:
    def rule(b: Nodes, op: Operation, x: str) -> str:
        a = op.attributes
        return b.node(op_type, x, kernel_shape=list(a["kernel"]), **_window(a), **fixed)

    return rule


SAME = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min",
        "pow": "Pow", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh",
        "sigmoid": "Sigmoid", "erf": "Erf", "neg": "Neg", "relu": "Relu", "abs": "Abs",
        "select": "Where", "matmul": "MatMul", "gather": "Gather"}
REDUCE = {"reduce_sum": "ReduceSum", "reduce_mean": "ReduceMean", "reduce_max": "ReduceMax"}

RULES: dict[str, Rule] = {
    **{f"ember.{name}": same(op_type) for name, op_type in SAME.items()},
    **{f"ember.{name}": _reduce(op_type) for name, op_type in REDUCE.items()},
    "ember.constant": _constant,
    "ember.rsqrt": lambda b, op, x: b.node("Reciprocal", b.node("Sqrt", x)),
    "ember.softplus": _softplus,
    "ember.sign": _sign,
    "ember.cmp": _cmp,
    "ember.cast": lambda b, op, x: b.node("Cast", x, to=ONNX_DTYPES[op.attributes["dtype"]]),
    "ember.broadcast": lambda b, op, x: b.node("Expand", x, b.ints(op.attributes["shape"])),
    "ember.reshape": lambda b, op, x: _reshape(b, x, op.attributes["shape"]),
    "ember.transpose": lambda b, op, x: b.node("Transpose", x, perm=list(op.attributes["perm"])),
    "ember.slice": _identity_or(_slice),
    "ember.unslice": _identity_or(_unslice),
    "ember.concat": lambda b, op, *xs: b.node("Concat", *xs, axis=op.attributes["axis"]),
    "ember.one_hot": _one_hot,
    "ember.conv2d": _conv,
    "ember.conv2d_grad_input": _conv_transpose,
    "ember.max_pool2d": _pool("MaxPool"),
    "ember.avg_pool2d": _pool("AveragePool", count_include_pad=1),
}

STRUCTURAL = frozenset({"ember.param", "func.return"})  # initializers and graph outputs

_GRADIENT = "a gradient, found only in training graphs"
NO_RULE = {  # core ops without a rule, and why an inference graph does without them
    "ember.dropout": "random; an inference trace has none (Dropout is off)",
    "ember.allreduce": "SyncBatchNorm's training statistics; an inference trace uses the "
                       "running ones",
    "ember.scatter_add": _GRADIENT,
    "ember.grads_ready": _GRADIENT,
    "ember.conv2d_grad_weight": _GRADIENT,
    "ember.max_pool2d_grad": _GRADIENT,
    "ember.avg_pool2d_grad": _GRADIENT,
    "ember.conv2d_nhwc": "made by a backend's layout pass, which an export does not run",
}


def missing(ops: list[Operation]) -> list[tuple[Operation, str]]:
    """Every op without an export rule, in graph order, with why it has none (if known)."""
    return [(op, NO_RULE.get(op.name, "")) for op in ops
            if op.name not in RULES and op.name not in STRUCTURAL]
