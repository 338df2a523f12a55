"""The `kernel` dialect: fused loop kernels with scalar bodies, what `fuse` produces and
every backend (interpreter, cpu, cuda) lowers.

A kernel iterates over a static `space` (a list of dimension sizes). Each tensor operand
is read through an index map: `maps[k]` holds one element stride per space dimension, so
the element of operand k read at point p is `flat(operand)[sum(p[i] * maps[k][i])]`.
Stride 0 broadcasts, permuted strides transpose, and a reshape of a contiguous buffer is
just other strides: no view op is ever copied. Results are written the same way through
`out_maps` (stride 0 where the result does not vary), with types `out_types`.

`kernel.fused` (operands: tensors; results: `out_types`)::

    %r:2 = "kernel.fused"(%x, %b) ({
    ^bb0(%xe: f32, %be: f32):                    // one scalar per operand, at point p
      %s = "kernel.add"(%xe, %be) : (f32, f32) -> f32
      %m = "kernel.reduce"(%s) {dims = [1], kind = "max"} : (f32) -> f32
      "kernel.yield"(%s, %m) : (f32, f32) -> ()  // one value per result
    }) {maps = [[10, 1], [0, 1]], out_maps = [[10, 1], [1, 0]],
        out_types = [tensor<64x10xf32>, tensor<64x1xf32>], space = [64, 10]}

The body is evaluated at every point of the space. `kernel.reduce {kind, dims}` is the
reduction of its operand over space dimensions `dims` with the other coordinates fixed
(so it is uniform along `dims`); every reduce of one kernel reduces the same dims, and a
reduce may consume another (layer norm: mean, then variance, then the output). A result
whose out map has stride 0 along a dimension must be uniform along it.
`kernel.index {dim}` is the coordinate along a space dimension (i64).

`kernel.matmul` (operands: a, b, epilogue inputs...; same attributes): the space is
`[batch..., M, N, K]`, maps[0] reads a (stride 0 on N), maps[1] reads b (stride 0 on M),
the other operands and every result have stride 0 on K. Its body is the epilogue: block
arguments are the accumulated `sum_k a*b` (first: of a's dtype, or f32 on bf16/f16
operands) and one scalar per epilogue operand.
Transposed operands are transposed strides, so backward matmuls need no copies.

`kernel.conv2d` (operands: x, w, epilogue inputs...; `ember.conv2d`'s stride, padding,
dilation and groups, and the attributes above): the space is the conv's output
[N, O, OH, OW]; x and w are read as the conv reads them, so `maps` holds one map per
epilogue operand only. Its body is the epilogue (bias, activation, residual) as for
`kernel.matmul`, its first block argument the conv's value at each output point.
`kernel.conv2d_nhwc` is the same for `ember.conv2d_nhwc`, its space [N, OH, OW, O].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..opdef import (
    I64_MAX,
    OPS,
    SHAPE,
    InferenceError,
    OpDef,
    is_int,
    ops_with,
    register,
    same_dtype,
)
from ..types import LOW_PRECISION, ScalarType, TensorType, Type
from . import (
    ember,  # noqa: F401  (registers the ops whose twins this dialect derives)
    ember_windows,
)
from .ember_windows import ConvBase, ForwardConv

if TYPE_CHECKING:
    from ..core import Operation, Value

SCALAR = frozenset({"pure", "scalar_operands"})
# kernels whose body is the epilogue of a product they compute first (its first argument)
CONV_KERNELS = ("kernel.conv2d", "kernel.conv2d_nhwc")
EPILOGUE_KERNELS = ("kernel.matmul", *CONV_KERNELS)
REDUCE_KINDS = ("add", "max", "min", "mul")


def _scalars(op: str, types: Iterable[Type]) -> None:
    for t in types:
        if not isinstance(t, ScalarType):
            raise InferenceError(f"{op} takes scalars (f32, i64, ...), got {t}")


class Twin(OpDef):
    """`kernel.<name>`: elementwise `ember.<name>` on one element of each operand, so its
    arity, attributes, dtype rule and meaning are the ember op's own (a subclass of it)."""

    traits = SCALAR
    dtype: ClassVar[Callable[[Sequence[Type], dict[str, Any]], str]]  # the ember op's, by the MRO

    @classmethod
    def infer(cls, operand_types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        _scalars(cls.name, operand_types)
        return [ScalarType(cls.dtype(operand_types, attrs))]


for _name in ops_with("elementwise", "ember"):
    register(type("K" + OPS[_name].__name__, (Twin, OPS[_name]),
                  {"name": "kernel." + _name.removeprefix("ember.")}))


@register
class KConstant(OpDef):
    """`kernel.constant {value = 0.5 : f64} : () -> f32`: the result type says the dtype."""

    name = "kernel.constant"
    traits = SCALAR
    attrs = {"value": (int, float, bool)}

    @classmethod
    def check_op(cls, op: Operation) -> None:
        """The value must be one of the result's dtype: every backend stores it as that."""
        v, dtype = op.attributes["value"], op.result.type.dtype
        if dtype == "i1":
            ok = v in (0, 1) and not isinstance(v, float)
        elif dtype in ("i32", "i64"):
            half = 2 ** (31 if dtype == "i32" else 63)
            ok = is_int(v) and -half <= v < half
        else:
            ok = not isinstance(v, bool)
        if not ok:
            raise InferenceError(f"kernel.constant: value {v!r} does not fit its result type "
                                 f"{dtype}")


@register
class KIndex(OpDef):
    """`kernel.index {dim} : () -> i64`: the coordinate along space dimension `dim`."""

    name = "kernel.index"
    traits = SCALAR
    attrs = {"dim": int}


@register
class KDropout(OpDef):
    """`kernel.dropout(x, step, c_0, ..., c_n-1) {p, seed, key, rows}`: `ember.dropout` of
    one element, `c_k` its coordinate along axis k of the dropout's result (i64), `rows`
    that result's first dimension, `step` the rng (its high 32 bits: the shard, rng.py)."""

    name = "kernel.dropout"
    traits = frozenset({"pure", "random", "scalar_operands"})
    arity = (2, None)
    attrs = {"p": float, "seed": int, "key": int}
    optional_attrs = {"rows": int}

    @classmethod
    def infer(cls, operand_types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        _scalars(cls.name, operand_types)
        x, step, *coords = operand_types
        if not x.is_float or step.dtype != "i64" or any(c.dtype != "i64" for c in coords):
            raise InferenceError(f"kernel.dropout takes (float, i64, i64...), got "
                                 f"({', '.join(map(str, operand_types))})")
        return [x]


@register
class KReduce(OpDef):
    """`kernel.reduce {kind, dims}`: the reduction of the operand over space dims `dims`."""

    name = "kernel.reduce"
    traits = SCALAR
    arity = (1, 1)
    attrs = {"kind": str, "dims": list}

    @classmethod
    def infer(cls, operand_types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        _scalars(cls.name, operand_types)
        if attrs["kind"] not in REDUCE_KINDS:
            raise InferenceError(f"kernel.reduce kind {attrs['kind']!r} is not one of "
                                 f"{', '.join(REDUCE_KINDS)}")
        dims = attrs["dims"]
        if not dims or len(set(dims)) != len(dims):
            raise InferenceError(f"kernel.reduce needs distinct dims, at least one, got {dims}")
        return list(operand_types)


@register
class KYield(OpDef):
    name = "kernel.yield"
    traits = frozenset({"terminator", "scalar_operands"})
    arity = (0, None)

    @classmethod
    def infer(cls, operand_types: Sequence[Type], attrs: dict[str, Any]) -> list[Type]:
        _scalars(cls.name, operand_types)
        return []


def reach(space: Sequence[int], strides: Sequence[int]) -> int:
    """The largest flat offset a map touches (-1 for an empty space)."""
    if any(d == 0 for d in space):
        return -1
    return sum((d - 1) * s for d, s in zip(space, strides))


def check_map(op: str, what: str, space: list[int], strides: Any, t: TensorType) -> None:
    if not isinstance(strides, list) or len(strides) != len(space) or not all(
            is_int(s) and 0 <= s <= I64_MAX for s in strides):
        raise InferenceError(f"{op}: the map of {what} must be {len(space)} strides >= 0 "
                             f"(one per space dim, each fitting in 64 bits), got {strides!r}")
    if reach(space, strides) >= t.size:
        raise InferenceError(f"{op}: the map {strides} of {what} ({t}) reads past its "
                             f"{t.size} elements over space {space}")


def check_cover(op: str, k: int, space: list[int], strides: list[int], t: TensorType) -> None:
    """Result k's map over the space its body runs at writes each of its elements (exactly
    once up to stride-0 dims); an empty space writes nothing, so the result must be empty."""
    if t.size == 0:
        return
    if any(d == 0 for d in space):
        raise InferenceError(f"{op}: the body runs at no point of space {space}, so result {k} "
                             f"({t}) is never written")
    step = 1
    for s, d in sorted((s, d) for s, d in zip(strides, space) if s and d > 1):
        if s != step:
            raise InferenceError(f"{op}: out map {strides} over space {space} does not write "
                                 f"every element of result {k} ({t})")
        step *= d
    if step != t.size:
        raise InferenceError(f"{op}: out map {strides} over space {space} writes {step} "
                             f"elements of result {k} ({t}), which has {t.size}")


class KernelOp(OpDef):
    traits = frozenset({"pure", "memory_bound", "kernel"})
    arity = (0, None)
    attrs = {"space": SHAPE, "maps": (list,), "out_maps": (list,), "out_types": (list,)}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        space, maps, outs = attrs["space"], attrs["maps"], attrs["out_types"]
        if math.prod(space) > I64_MAX:
            raise InferenceError(f"{cls.name}: space {space} has more points than int64 counts")
        if len(maps) != len(operand_types):
            raise InferenceError(f"{cls.name}: {len(operand_types)} operands but {len(maps)} "
                                 "maps")
        if not outs or len(attrs["out_maps"]) != len(outs) or not all(
                isinstance(t, TensorType) for t in outs):
            raise InferenceError(f"{cls.name}: out_types must list one tensor type per "
                                 f"out map, got {outs!r}")
        for k, (m, t) in enumerate(zip(maps, operand_types)):
            check_map(cls.name, f"operand {k}", space, m, t)
        body = cls.body_space(space)
        for k, (m, t) in enumerate(zip(attrs["out_maps"], outs)):
            check_map(cls.name, f"result {k}", space, m, t)
            check_cover(cls.name, k, body, m[:len(body)], t)
        return list(outs)

    @classmethod
    def body_space(cls, space: list[int]) -> list[int]:
        """The points the body runs at, where it yields what the results store."""
        return space

    @classmethod
    def check_op(cls, op: Operation) -> None:
        check_kernel(op)


@register
class Fused(KernelOp):
    name = "kernel.fused"


@register
class Matmul(KernelOp):
    name = "kernel.matmul"
    traits = frozenset({"pure", "compute_bound", "kernel"})
    arity = (2, None)

    @classmethod
    def body_space(cls, space: list[int]) -> list[int]:
        return space[:-1]  # the epilogue runs once the sum over K is done

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        space = attrs["space"]
        if len(space) < 3:
            raise InferenceError(f"kernel.matmul: space must be [batch..., M, N, K], got "
                                 f"{space}")
        out = super().infer(operand_types, attrs)
        maps = attrs["maps"]
        n, m = len(space) - 2, len(space) - 3
        bad = ("a" if maps[0][n] else "b" if maps[1][m] else None)
        if bad:
            raise InferenceError(f"kernel.matmul: operand {bad} must not vary along "
                                 f"{'N' if bad == 'a' else 'M'} (its stride there must be 0)")
        if any(s[-1] for s in maps[2:] + attrs["out_maps"]):
            raise InferenceError("kernel.matmul: epilogue operands and results must have "
                                 "stride 0 along K")
        same_dtype(cls.name, operand_types[:2])
        if not operand_types[0].is_float:
            raise InferenceError(f"kernel.matmul needs float operands, got {operand_types[0]}")
        return out


class _ConvKernel(KernelOp, ConvBase):
    """A conv and its epilogue; its space is the output shape of its ember twin, `core`."""

    core: ClassVar[type[ForwardConv]]
    traits = frozenset({"pure", "compute_bound", "kernel"})
    arity = (2, None)
    attrs = {**KernelOp.attrs, **ConvBase.attrs}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        cls.check_operands(operand_types[:2], ("input", "weight"))
        x, w = operand_types[:2]
        conv = list(cls.core.output_shape(x.shape, w.shape, attrs))
        if attrs["space"] != conv:
            raise InferenceError(f"{cls.name}: space must be the conv's output {conv}, "
                                 f"got {attrs['space']}")
        return super().infer(operand_types[2:], attrs)  # the epilogue operands' maps


@register
class Conv2d(_ConvKernel):
    name = "kernel.conv2d"
    core = ember_windows.Conv2d


@register
class Conv2dNhwc(_ConvKernel):
    name = "kernel.conv2d_nhwc"
    core = ember_windows.Conv2dNhwc


# -- helpers shared by the pass and the backends ----------------------------------------

def widening_cast(op: Operation, k: int) -> Operation | None:
    """The `kernel.cast` to f32 of a bf16/f16 value that a kernel's body yields as its
    result k, if that is what it yields (the result holds low-precision values)."""
    cast = op.regions[0].blocks[0].ops[-1].operands[k].op
    if cast is None or cast.name != "kernel.cast" or cast.attributes["dtype"] != "f32" \
            or cast.operands[0].type.dtype not in LOW_PRECISION:
        return None
    return cast


def accumulator_dtype(op: Operation) -> str:
    """The dtype of a kernel.matmul's or kernel.conv2d's product (its body's first
    argument): its operands', or f32 on bf16/f16 operands where the body says so (an
    `ember.matmul {dtype = "f32"}` fused)."""
    dtype = op.operands[0].type.dtype
    args = op.regions[0].blocks[0].args if op.regions and op.regions[0].blocks else []
    if dtype in LOW_PRECISION and args and args[0].type == ScalarType("f32"):
        return "f32"
    return dtype


def epilogue_maps(op: Operation) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """(space, epilogue operand maps, out maps) of a `kernel.matmul`'s or `kernel.conv2d`'s
    body, over the product's points: a matmul's without its K dim."""
    a = op.attributes
    if op.name in CONV_KERNELS:
        return a["space"], a["maps"], a["out_maps"]
    return a["space"][:-1], [m[:-1] for m in a["maps"][2:]], [m[:-1] for m in a["out_maps"]]


def conv_output(op: Operation) -> list[int]:
    """The output shape of a conv op or conv kernel op (a kernel's is its space: its first
    result may be a value computed from it, of another layout)."""
    if op.name in CONV_KERNELS:
        return list(op.attributes["space"])
    t = op.result.type
    assert isinstance(t, TensorType), f"{op.name} makes a tensor, not {t}"
    return list(t.shape)


def holds_product(op: Operation) -> bool:
    """Whether a kernel.conv2d's first result is laid out as its product (its dtype,
    contiguous over the space, size-1 dims aside): a backend may compute the conv there
    and run the body in place over it."""
    space, _, out_maps = epilogue_maps(op)
    product = [math.prod(space[d + 1:]) for d in range(len(space))]
    return op.attributes["out_types"][0].dtype == accumulator_dtype(op) and all(
        m == p for m, p, n in zip(out_maps[0], product, space) if n > 1)


def body(op: Operation) -> list[Operation]:
    """The scalar ops of a kernel's body, terminator included."""
    return op.regions[0].blocks[0].ops


def varying(op: Operation) -> dict[Value, frozenset[int]]:
    """For each scalar value of a kernel body: the set of space dims it varies along."""
    block = op.regions[0].blocks[0]
    maps = op.attributes["maps"]
    out: dict[Value, frozenset[int]] = {}
    if op.name in CONV_KERNELS:
        out[block.args[0]] = frozenset(range(len(op.attributes["space"])))
        args = zip(block.args[1:], maps)
    elif op.name == "kernel.matmul":
        rank = len(op.attributes["space"]) - 1
        mn = {rank - 2, rank - 1}
        out[block.args[0]] = frozenset(d for d in mn) | frozenset(
            d for d in range(rank - 2) if maps[0][d] or maps[1][d])
        args = zip(block.args[1:], maps[2:])
    else:
        args = zip(block.args, maps)
    for a, m in args:
        out[a] = frozenset(d for d, s in enumerate(m) if s)
    for s in block.ops:
        if s.name == "kernel.index":
            v = frozenset({s.attributes["dim"]})
        elif s.name == "kernel.reduce":
            v = out[s.operands[0]] - frozenset(s.attributes["dims"])
        else:
            v = frozenset().union(*(out[x] for x in s.operands))
        for r in s.results:
            out[r] = v
    return out


def check_kernel(op: Operation) -> None:
    """The body rules `infer` cannot see: block arguments match the operands, the yield
    matches the results, reduces share their dims, and what is stored with stride 0 along
    a dim does not vary along it. Raises InferenceError naming the rule."""
    name, attrs = op.name, op.attributes
    if len(op.regions) != 1 or len(op.regions[0].blocks) != 1:
        raise InferenceError(f"{name} needs one region with one block")
    block = op.regions[0].blocks[0]
    space = attrs["space"]
    if name in EPILOGUE_KERNELS:
        want = [ScalarType(accumulator_dtype(op))] + [
            ScalarType(v.type.dtype) for v in op.operands[2:]]
    else:
        want = [ScalarType(v.type.dtype) for v in op.operands]
    got = [a.type for a in block.args]
    if got != want:
        raise InferenceError(f"{name}: block arguments ({', '.join(map(str, got))}) must be "
                             f"({', '.join(map(str, want))})")
    term = block.terminator
    if term is None or term.name != "kernel.yield":
        raise InferenceError(f"{name}: body must end with kernel.yield")
    types = [ScalarType(t.dtype) for t in attrs["out_types"]]
    if [v.type for v in term.operands] != types:
        gave = ", ".join(str(v.type) for v in term.operands)
        raise InferenceError(f"{name}: kernel.yield gives ({gave}), results are "
                             f"({', '.join(map(str, types))})")
    rank = len(space) - (name == "kernel.matmul")
    dims = {tuple(sorted(s.attributes["dims"])) for s in block.ops if s.name == "kernel.reduce"}
    if name in EPILOGUE_KERNELS and dims:
        raise InferenceError(f"{name}: an epilogue cannot reduce")
    if len(dims) > 1:
        raise InferenceError(f"{name}: every kernel.reduce must reduce the same dims, got "
                             f"{sorted(dims)}")
    for s in block.ops:
        d = (s.attributes["dims"] if s.name == "kernel.reduce" else
             [s.attributes["dim"]] if s.name == "kernel.index" else [])
        if any(not 0 <= x < rank for x in d):
            raise InferenceError(f"{name}: {s.name} dim out of range for a space of rank "
                                 f"{rank}")
        if s.name == "kernel.index" and s.result.type != ScalarType("i64"):
            raise InferenceError(f"{name}: kernel.index gives i64, not {s.result.type}")
    var = varying(op)
    for k, (v, m) in enumerate(zip(term.operands, attrs["out_maps"])):
        bad = [d for d in var[v] if not m[d] and space[d] > 1]
        if bad:
            raise InferenceError(f"{name}: result {k} varies along space dim {bad[0]} but its "
                                 "out map has stride 0 there")
