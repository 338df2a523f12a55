"""The op registry is complete: every op has a reference in the interpreter, a gradient rule
(or its reason for none in `rules.NO_RULE`), a lowering on cpu and on cuda, a pad-mask rule
(elementwise ops have the generic one; else its reason for none in `PAD_MASK_NONE` here),
and, if core, an ONNX export rule (or its reason for none) whose ONNX ops ember imports
back; every elementwise op fuses through its kernel twin and is what a frontend call
(`nn.functional` or a Tensor method, `FRONTEND` here) traces to. An op missing one fails
here, by name, never as a silent slow path. How to add an op: CONTRIBUTING.md."""

import inspect

import pytest
from strategies import op_graph

import ember as em
from ember.backends import cpu, cuda
from ember.backends.interpreter import FUSED, KERNELS
from ember.frontend.tensor import Tensor
from ember.interop.onnx_export_ops import NO_RULE as ONNX_NO_RULE
from ember.interop.onnx_export_ops import RULES as ONNX_RULES
from ember.interop.onnx_export_ops import STRUCTURAL, Nodes
from ember.interop.onnx_ops import RULES as ONNX_IMPORTS
from ember.ir import OPS, Builder, Graph, InferenceError, TensorType, has_trait, verify
from ember.ir.dialects.kernel import body
from ember.ir.opdef import ops_with
from ember.nn import functional as F
from ember.passes.autodiff import Autodiff
from ember.passes.autodiff.rules import NO_RULE, RULES
from ember.passes.decompose import Decompose
from ember.passes.fuse import Fuse
from ember.passes.pad_mask import RULES as PAD_MASK_RULES

OURS = [n for n in OPS if n.split(".")[0] in ("ember", "nn")]  # what a traced graph holds
ELEMENTWISE = ops_with("elementwise", "ember")
# what the interpreter runs without a table entry: graph structure, and the scalar ops
# its fused-body evaluator handles itself (the others are their ember twin's reference)
OWN = {"ember.param", "func.return", "kernel.constant", "kernel.index", "kernel.dropout",
       "kernel.reduce", "kernel.yield"}
EXAMPLE_ATTRS = {"ember.cmp": {"predicate": "lt"}, "ember.cast": {"dtype": "f64"}}


def lowered(graph: Graph) -> Graph:
    """`graph` through both backends, per op and then fused; the fused graph."""
    for g in (graph, fused := verify(Fuse().apply(graph))):
        cpu.emit_llvm(g)
        cuda.emit_cuda(g)
    return fused


@pytest.mark.parametrize("name", OPS)
def test_every_op_has_a_reference(name):
    twin = "ember." + name.removeprefix("kernel.")
    assert name in KERNELS or name in FUSED or name in OWN or (
        name.startswith("kernel.") and twin in KERNELS and issubclass(OPS[name], OPS[twin]))


@pytest.mark.parametrize("name", OURS)
def test_every_op_has_a_gradient_rule_or_a_reason(name):
    """(kernel.* ops are never differentiated: autodiff runs before fuse.)"""
    assert (name in RULES) != (name in NO_RULE), \
        "a rule in passes/autodiff/rules.py, or else its reason in NO_RULE (never both)"


@pytest.mark.parametrize("name", [n for n in OPS if n.startswith("ember.")])
def test_every_core_op_has_an_onnx_export_rule_or_a_reason(name):
    """(nn.* ops are decomposed before export; kernel.* ops are fused, never exported.)"""
    assert (name in ONNX_RULES or name in STRUCTURAL) != (name in ONNX_NO_RULE), \
        "a rule in interop/onnx_export_ops.py, or else its reason in NO_RULE (never both)"


@pytest.mark.parametrize("name", sorted(ONNX_RULES))
def test_what_an_export_rule_writes_ember_imports(name):
    """Every ONNX op an export rule writes has an import rule (interop/onnx_ops.py), so an
    exported file loads back (Constant nodes are folded at import, needing none)."""
    op = op_graph(name).return_op.operands[0].op
    nodes = Nodes(set())
    ONNX_RULES[name](nodes, op, *(f"x{k}" for k in range(len(op.operands))))
    missing = {n.op_type for n in nodes.nodes} - {"Constant"} - set(ONNX_IMPORTS)
    assert not missing, f"exported as {sorted(missing)}, which interop/onnx_ops.py lacks"


# How each elementwise op is reached from what users write: a call of `nn.functional` or of
# a Tensor method or operator, whose trace holds the op (an op only a pass makes would say
# why here instead). A new elementwise op fails below until its call is added.
FRONTEND = {
    "ember.add": lambda x, y: x + y, "ember.sub": lambda x, y: x - y,
    "ember.mul": lambda x, y: x * y, "ember.div": lambda x, y: x / y,
    "ember.max": F.maximum, "ember.min": F.minimum, "ember.pow": lambda x, y: x ** y,
    "ember.exp": Tensor.exp, "ember.log": Tensor.log, "ember.sqrt": Tensor.sqrt,
    "ember.rsqrt": F.rsqrt, "ember.tanh": F.tanh, "ember.sigmoid": F.sigmoid,
    "ember.erf": F.erf, "ember.neg": lambda x: -x, "ember.relu": F.relu,
    "ember.abs": Tensor.abs, "ember.softplus": F.softplus, "ember.sign": F.sign,
    "ember.cmp": lambda x, y: x < y, "ember.select": lambda x, y: F.where(x < y, x, y),
    "ember.cast": lambda x: x.astype("f64"),
}


class _Call(em.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn  # a constant field

    def forward(self, *xs):
        return self.fn(*xs)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_op_is_reached_from_the_frontend(name):
    assert name in FRONTEND, (f"no frontend call makes {name}: add one (frontend/ops.py and "
                              "nn.functional's __all__, or a Tensor method), and it to FRONTEND")
    fn = FRONTEND[name]
    arity = sum(p.default is p.empty for p in inspect.signature(fn).parameters.values())
    graph = em.trace(_Call(fn), *[em.TensorSpec((2, 3), "f32")] * arity)
    assert name in {op.name for op in graph.ops}


# Ops `pad-mask` has no rule for (passes/pad_mask.py), each with why: on a padded operand
# it refuses them, and the runtime compiles that length exactly.
_MADE_BY_AUTODIFF = "made only by autodiff, which runs after pad-mask"
_WINDOWS = "slides windows along its spatial axes (a padded operand is refused)"
PAD_MASK_NONE = {
    "ember.param": "no operands (a graph argument or a marked constant starts a padded axis)",
    "ember.constant": "no operands (a graph argument or a marked constant starts a padded axis)",
    "ember.scatter_add": _MADE_BY_AUTODIFF,
    "ember.conv2d_grad_weight": _MADE_BY_AUTODIFF,
    "ember.max_pool2d_grad": _MADE_BY_AUTODIFF,
    "ember.avg_pool2d_grad": _MADE_BY_AUTODIFF,
    "ember.grads_ready": "made by bucket-grads, the last pass of a data-parallel step",
    **dict.fromkeys(["ember.conv2d", "ember.conv2d_nhwc", "ember.conv2d_grad_input",
                     "ember.max_pool2d",
                     "ember.avg_pool2d", "nn.conv2d"], _WINDOWS),
}


@pytest.mark.parametrize("name", OURS)
def test_every_op_has_a_pad_mask_rule_or_a_reason(name):
    """(Elementwise ops, of any dialect, take the pass's generic rule.)"""
    covered = name in PAD_MASK_RULES or has_trait(name, "elementwise")
    assert covered != (name in PAD_MASK_NONE), \
        "a rule in passes/pad_mask.py (or the elementwise trait), or else its reason in " \
        "PAD_MASK_NONE here (never both)"


def example(name: str) -> Graph:
    """A graph of op `name`; nn.* ops as `decompose` (run by every pipeline) lowers them."""
    return verify(Decompose().apply(verify(op_graph(name))))


@pytest.mark.parametrize("name", OURS)
def test_every_op_is_lowered_by_cpu_and_cuda(name):
    lowered(example(name))


def attention_backward() -> Graph:
    """The gradient of an attention with respect to q, k and v: what fuses to
    kernel.attention_grad (no single-op example differentiates)."""
    g = Graph("f")
    b = Builder(g.body)
    qkv = [b.create("ember.param", [], {"id": n, "path": n},
                    result_types=[TensorType((2, 4, 3), "f32")]).result for n in "qkv"]
    o = b.op("nn.attention", *qkv, causal=True, scale=0.5)
    b.create("func.return", [b.op("ember.reduce_sum", o, axes=[0, 1, 2], keepdims=False)])
    return verify(Decompose().apply(verify(Autodiff().apply(g))))


def conv_nhwc_with_bias() -> Graph:
    """A channels-last depthwise conv and its bias: what fuses to kernel.conv2d_nhwc (the
    layout pass makes the conv; no single-op example has an epilogue)."""
    g = Graph("f", [TensorType((1, 5, 5, 4), "f32"), TensorType((3, 3, 1, 4), "f32"),
                    TensorType((4,), "f32")])
    b = Builder(g.body)
    x, w, bias = g.args
    y = b.op("ember.conv2d_nhwc", x, w, stride=[1, 1], padding=[1, 1], dilation=[1, 1],
             groups=4)
    b.create("func.return", [b.op("ember.add", y, bias)])
    return verify(g)


def test_fused_examples_reach_every_kernel_op():
    """So the lowering test above covers the kernel dialect too."""
    seen = set()
    for graph in [*map(example, OURS), attention_backward(), conv_nhwc_with_bias()]:
        for op in lowered(graph).ops:
            seen |= {op.name} | {s.name for s in (body(op) if op.regions else [])}
    assert not {n for n in OPS if n.startswith("kernel.")} - seen


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_op_fuses_and_lowers_on_every_dtype_it_takes(name, dtype):
    """(i1: numpy's partial bool arithmetic, tested by each backend's own tests.)"""
    d = OPS[name]
    g = Graph("f", [TensorType((2, 5), "i1" if name == "ember.select" and k == 0 else dtype)
                    for k in range(d.arity[0])])
    b = Builder(g.body)
    try:
        out = b.op(name, *g.args, **EXAMPLE_ATTRS.get(name, {}))
    except InferenceError:
        pytest.skip(f"{name} does not take {dtype}")
    b.create("func.return", [out])
    (kernel, _) = lowered(g).ops
    assert "kernel." + name.removeprefix("ember.") in [s.name for s in body(kernel)]
