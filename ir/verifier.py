"""Checks the IR's rules: SSA order, registered ops, inferred types, terminators, kernel
bodies, value sizes and the graph attributes a backend reads.

A graph that verifies is one every backend can run: each broken rule is a VerifyError that
names the op (and, for parsed text, starts with its `line:col`), and nothing else escapes,
not even a bug in an op's definition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .core import Block, Graph, Operation, Value
from .opdef import InferenceError, OpDef, VerifyError, is_int, lookup
from .types import MAX_BYTES, TensorType, Type

# Dialects ember defines: an unknown op name in one of these is an error. Ops of other
# dialects are opaque, as with mlir-opt --allow-unregistered-dialect.
T = TypeVar("T")

OWN_DIALECTS = frozenset({"ember", "nn", "kernel", "func"})


def verify(graph: Graph) -> Graph:
    """Raise VerifyError naming the first broken op; return the graph when it is valid."""
    for i, a in enumerate(graph.args):
        if not isinstance(a.type, TensorType):
            raise _error(graph, f"argument {i} of @{graph.name} must be a tensor, got {a.type}")
        _check_size(graph, f"argument {i} of @{graph.name}", a.type)
    for key, check in GRAPH_ATTRS.items():
        if key in graph.attributes:
            check(graph, key, graph.attributes[key])
    _verify_block(graph.body, set(), graph, kernel=None)
    _verify_params(graph)
    return graph


def _error(at: Operation | Graph, message: str) -> VerifyError:
    return VerifyError(message, *(at.pos or (None, None)))


def _where(op: Operation) -> str:
    return f"'{op.name}'" + (f" at {op.loc}" if op.loc else "")


def _check_size(at: Operation | Graph, what: str, t: Type) -> None:
    if isinstance(t, TensorType) and t.nbytes > MAX_BYTES:
        raise _error(at, f"{what}: {t} has {t.size} elements, more bytes than int64 "
                         "offsets address")


def _verify_block(block: Block, outer: set[Value], owner: Operation | Graph,
                  kernel: Operation | None) -> None:
    """`outer`: the values defined above; a kernel's body (`kernel`) may use none of them,
    it reads tensors through the kernel's operands only."""
    defined = set(block.args) | (set() if kernel else outer)
    if not block.ops:
        raise _error(owner, "empty block: a block must end with a terminator")
    for i, op in enumerate(block.ops):
        for j, v in enumerate(op.operands):
            if v in defined:
                continue
            if v in outer:  # defined above: so this is a kernel's body (else outer is defined)
                assert kernel is not None
                raise _error(op, f"op {_where(op)} uses operand #{j} from outside the body of "
                                 f"{kernel.name}, which reads values through its operands only")
            raise _error(op, f"op {_where(op)} uses operand #{j} before it is defined")
        is_last = i == len(block.ops) - 1
        d = lookup(op.name)
        if d is None and op.dialect in OWN_DIALECTS:
            raise _error(op, f"unknown op {_where(op)}: dialect '{op.dialect}' has no such op")
        if kernel is not None and (d is None or "scalar_operands" not in d.traits):
            raise _error(op, f"op {_where(op)} cannot be in the body of {kernel.name}: a "
                             "kernel body holds scalar kernel ops only")
        if d is not None:
            _verify_op(op, d, is_last, in_kernel=kernel is not None)
        if isinstance(owner, Graph) and is_last and op.name != "func.return":
            raise _error(op, f"graph must end with func.return, not {_where(op)}")
        for region in op.regions:
            for b in region.blocks:
                inner = op if d is not None and "kernel" in d.traits else None
                _verify_block(b, defined | outer, op, inner)
        if d is not None:
            _guarded(op, d.check_op, op)
        defined.update(op.results)


def _verify_params(graph: Graph) -> None:
    """A param's id names one value (the runtime's, or a backend's buffer): one type."""
    first: dict[str, Operation] = {}
    for op in graph.walk():
        if op.name == "ember.param":
            seen = first.setdefault(op.attributes["id"], op)
            if seen.result.type != op.result.type:
                raise _error(op, f"op {_where(op)}: param id {op.attributes['id']!r} is "
                                 f"{seen.result.type} elsewhere, here {op.result.type}")


def _verify_op(op: Operation, d: type[OpDef], is_last: bool, in_kernel: bool) -> None:
    """Where the op may stand, then its types: inferred ones, or one given result."""
    if ("terminator" in d.traits) != is_last:
        raise _error(op, f"op {_where(op)} must end its block" if "terminator" in d.traits
                     else f"block ends with {_where(op)}, which is not a terminator")
    scalar = "scalar_operands" in d.traits
    if scalar and not in_kernel:
        raise _error(op, f"op {_where(op)} is a scalar op: it belongs in the body of a "
                         "kernel.fused or kernel.matmul")
    if op.regions and "kernel" not in d.traits:
        raise _error(op, f"op {_where(op)} takes no regions")
    inferred = _guarded(op, d.result_types, [v.type for v in op.operands], op.attributes)
    actual = [r.type for r in op.results]
    if inferred is not None and list(inferred) != actual:
        raise _error(op, f"op {_where(op)}: result types ({', '.join(map(str, actual))}) "
                         f"differ from inferred ({', '.join(map(str, inferred))})")
    if inferred is None and len(actual) != 1:
        raise _error(op, f"op {_where(op)} must have exactly one result")
    for k, t in enumerate(actual):
        if isinstance(t, TensorType) == scalar:
            want = "a scalar (f32, i64, ...)" if scalar else "a tensor"
            raise _error(op, f"op {_where(op)}: result {k} must be {want}, got {t}")
        _check_size(op, f"op {_where(op)}: result {k}", t)


def _guarded(op: Operation, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` with an InferenceError, or any other exception (a bug in the op's
    definition), turned into a VerifyError naming the op instead of a traceback."""
    try:
        return fn(*args)
    except InferenceError as e:
        raise _error(op, f"op {_where(op)}: {e}") from None
    except Exception as e:  # noqa: BLE001  (the last resort: name the op whatever broke)
        raise _error(op, f"op {_where(op)}: cannot be checked ({type(e).__name__}: {e})") from e


# -- graph attributes -------------------------------------------------------------------------

def _arg(graph: Graph, key: str, i: Any, kind: str) -> TensorType:
    """Argument `i` of the graph, which attribute `key` says is `kind` ("a float" or "an
    integer") tensor."""
    n = len(graph.args)
    if not is_int(i) or not 0 <= i < n:
        raise _error(graph, f"graph attribute '{key}': {i!r} is not an argument index of "
                            f"@{graph.name}, which has {n} arguments")
    t = graph.args[i].type
    assert isinstance(t, TensorType)  # verify() checks the arguments before the attributes
    if not (t.is_float if kind == "a float" else t.dtype in ("i32", "i64")):
        raise _error(graph, f"graph attribute '{key}': argument {i} of @{graph.name} is {t}, "
                            f"not {kind} tensor")
    return t


def _finite_args(graph: Graph, key: str, value: Any) -> None:
    """`[i, ...]`: float arguments that must hold no NaN or Inf (backends/input_checks.py)."""
    if not isinstance(value, list):
        raise _error(graph, f"graph attribute '{key}' must be a list of argument indices, "
                            f"got {value!r}")
    for i in value:
        _arg(graph, key, i, "a float")


def _label_args(graph: Graph, key: str, value: Any) -> None:
    """`[[i, c], ...]`: integer arguments whose values must lie in [0, c); `[i, c, v]`: or
    equal v (a loss's ignore_index)."""
    pairs = isinstance(value, list) and all(isinstance(p, list) and len(p) in (2, 3)
                                            for p in value)
    if not pairs:
        raise _error(graph, f"graph attribute '{key}' must be a list of [argument, classes] "
                            f"or [argument, classes, ignored] lists, got {value!r}")
    for i, c, *ignore in value:
        t = _arg(graph, key, i, "an integer")
        top = 2 ** (31 if t.dtype == "i32" else 63) - 1
        if not is_int(c) or not 0 <= c <= top:
            raise _error(graph, f"graph attribute '{key}': the class count of argument {i} "
                                f"must be an integer in [0, {top}], got {c!r}")
        if ignore and not (is_int(ignore[0]) and -top - 1 <= ignore[0] <= top):
            raise _error(graph, f"graph attribute '{key}': the ignored label of argument {i} "
                                f"must be an integer of its dtype, got {ignore[0]!r}")


GRAPH_ATTRS: dict[str, Callable[[Graph, str, object], None]] = {
    "ember.finite_args": _finite_args,
    "ember.label_args": _label_args,
}
