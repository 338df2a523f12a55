"""Op definitions: what an op name means (operands, attributes, type inference, traits).

An op is declared once, as a small class in `ir/dialects/<dialect>.py`, and registered
by its name. Traits used by passes and backends:

- `pure`: no side effects (removable when unused, mergeable by CSE)
- `elementwise`: result[i] depends on operand[i] only (after numpy broadcasting)
- `reduction`: reduces over `axes`
- `movement`: every result element is an operand element (or a zero), so the op is exact
  in any dtype and a backend runs it on bf16/f16 bits as they are (passes/widen.py)
- `compute_bound` / `memory_bound`: what bounds the op, so what recompute keeps or recomputes
- `random`: draws from the counter-based generator
- `terminator`: ends a block
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard, cast

from .types import DTYPES, ScalarType, TensorType, Type

if TYPE_CHECKING:  # for annotations only: opdef needs nothing of core at run time
    from .core import Operation

I64_MIN, I64_MAX = -2**63, 2**63 - 1  # integer attributes are i64, as they are printed


class InferenceError(ValueError):
    """Operand types or attributes do not fit the op (raised by `OpDef.infer`)."""


class VerifyError(ValueError):
    """A graph breaks an IR rule; the message names the op and what is wrong. For an op
    read from text, `str(e)` starts with its `line:col: error: `, as a ParseError's does."""

    def __init__(self, message: str, line: int | None = None, col: int | None = None):
        self.message, self.line, self.col = message, line, col
        super().__init__(message if line is None else f"{line}:{col}: error: {message}")


@dataclass(frozen=True)
class Kind:
    """An attribute kind stricter than its python type `base`: `attrs` may name one where
    a type alone would let a value through that no backend can run (a dim of -1)."""

    base: Any
    ok: Callable[[Any], bool]
    what: str


SHAPE = Kind(list, lambda v: all(d >= 0 for d in v), "a list of dimensions >= 0")
DTYPE = Kind(str, lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}")
COUNT = Kind(int, lambda v: v >= 0, "an integer >= 0")


OPS: dict[str, type[OpDef]] = {}


def register(cls: type[OpDef]) -> type[OpDef]:
    if cls.name in OPS:
        raise ValueError(f"op {cls.name} registered twice")
    OPS[cls.name] = cls
    return cls


def declare(dialect: str, base: type[OpDef], names: str, prefix: str = "",
            **extra: Any) -> None:
    """Register one subclass of `base` per name in `names` ("add sub"), as `dialect.<name>`:
    for families of ops that differ only in their name."""
    for n in names.split():
        register(type(prefix + n.title(), (base,), {"name": f"{dialect}.{n}", **extra}))


def lookup(name: str) -> type[OpDef] | None:
    """The definition of an op name, or None for an unregistered op."""
    return OPS.get(name)


def has_trait(op_name: str, trait: str) -> bool:
    d = OPS.get(op_name)
    return d is not None and trait in d.traits


def ops_with(trait: str, dialect: str) -> tuple[str, ...]:
    """The ops of `dialect` with `trait`, in registration order: what a backend's op set or
    a dialect's derived ops are computed from, never a list of names kept by hand."""
    return tuple(n for n, d in OPS.items() if n.startswith(dialect + ".") and trait in d.traits)


class OpDef:
    """Base of every op definition. Subclasses set the class variables and `infer`."""

    name: ClassVar[str]
    traits: ClassVar[frozenset[str]] = frozenset({"pure", "memory_bound"})
    # (min, max) operand count; max None = variadic
    arity: ClassVar[tuple[int, int | None]] = (0, 0)
    # attribute name -> accepted python type(s); `optional_attrs` may be absent
    attrs: ClassVar[dict[str, Any]] = {}
    optional_attrs: ClassVar[dict[str, Any]] = {}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type] | None:
        """Result types from operand types and attributes; None when given explicitly. The
        operands are tensors (`check_signature`), unless the op has the `scalar_operands`
        trait: such an op's `infer` takes `Sequence[Type]`."""
        return None

    @classmethod
    def check_signature(cls, operand_types: list[Type], attrs: dict[str, Any]) -> None:
        lo, hi = cls.arity
        n = len(operand_types)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo}..{'' if hi is None else hi}"
            raise InferenceError(f"{cls.name} takes {want} operands, got {n}")
        for key, kind in cls.attrs.items():
            if key not in attrs:
                raise InferenceError(f"{cls.name} needs attribute '{key}'")
            _check_attr(cls.name, key, attrs[key], kind)
        for key, kind in cls.optional_attrs.items():
            if key in attrs:
                _check_attr(cls.name, key, attrs[key], kind)
        for t in operand_types:
            if not isinstance(t, TensorType) and "scalar_operands" not in cls.traits:
                raise InferenceError(f"{cls.name} takes tensors, got {t}")

    @classmethod
    def result_types(cls, operand_types: list[Type], attrs: dict[str, Any]) -> list[Type] | None:
        cls.check_signature(operand_types, attrs)
        # tensors only, as check_signature found, unless the op's infer takes any Type
        return cls.infer(cast("list[TensorType]", operand_types), attrs)

    @classmethod
    def check_op(cls, op: Operation) -> None:
        """The rules on the op itself that its operand types and attributes cannot show (a
        kernel's body, a scalar constant against its result type): InferenceError if broken.
        The verifier calls it once the op's types and regions are known to be valid."""


def is_int(v: Any) -> TypeGuard[int]:
    """An integer attribute value (a bool is not one, though Python says it is)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _check_attr(op: str, key: str, value: Any, kind: Any) -> None:
    items = value if kind is list and isinstance(value, list) else [value]
    big = [v for v in items if is_int(v) and not I64_MIN <= v <= I64_MAX]
    if big:
        raise InferenceError(f"{op} attribute '{key}': {big[0]} does not fit in 64 bits")
    if isinstance(kind, Kind):
        _check_attr(op, key, value, kind.base)
        if not kind.ok(value):
            raise InferenceError(f"{op} attribute '{key}' must be {kind.what}, got {value!r}")
        return
    if kind is list:
        ok = isinstance(value, list) and all(map(is_int, value))
        if not ok:
            raise InferenceError(f"{op} attribute '{key}' must be a list of integers, "
                                 f"got {value!r}")
        return
    if kind is int and isinstance(value, bool):
        raise InferenceError(f"{op} attribute '{key}' must be an integer, got {value!r}")
    if kind is float and is_int(value):
        return
    if not isinstance(value, kind):
        raise InferenceError(f"{op} attribute '{key}' must be {getattr(kind, '__name__', kind)},"
                             f" got {value!r}")


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def broadcast_shapes(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting of shapes, with an error naming the op and every shape."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(dims) > 1:
            raise InferenceError(f"{op}: shapes {' and '.join(fmt_shape(s) for s in shapes)} "
                                 "do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def same_dtype(op: str, types: Sequence[Type]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise InferenceError(f"{op}: operand dtypes differ ({', '.join(str(t) for t in types)})")
    return dtypes.pop()


def normalize_axes(op: str, axes: list[int], rank: int) -> list[int]:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise InferenceError(f"{op}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise InferenceError(f"{op}: repeated axis in {axes}")
    return sorted(out)


__all__ = ["COUNT", "DTYPE", "OPS", "SHAPE", "Kind", "OpDef", "InferenceError", "VerifyError",
           "register", "lookup", "has_trait", "ops_with", "is_int", "broadcast_shapes",
           "same_dtype", "normalize_axes", "fmt_shape", "ScalarType"]
