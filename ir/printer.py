"""Prints graphs as MLIR text that upstream `mlir-opt --allow-unregistered-dialect` accepts.

Every op is printed in MLIR's generic form, so no op needs a custom syntax; only the
`func.func` wrapper and its `func.return` use the custom form a reader expects. What is
printed parses back (`ir.parser`) to an equal graph that prints byte-identically.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import numpy as np

from .core import Block, Graph, Location, Operation, Region, Value
from .dense import splat_element
from .types import ScalarType, TensorType, dtype_of

BARE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")
VALUE_ID = re.compile(r"[A-Za-z_$.\-][A-Za-z0-9_$.\-]*")  # digit-only names are for results
_HEX_WIDTH = {"f64": 16, "f32": 8, "f16": 4, "bf16": 4}
_UNKNOWN = "%<<UNKNOWN SSA VALUE>>"
_LOC_AT_END = re.compile(r' loc\("[^"]*":\d+:\d+\)$', re.M)
_PLAIN = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but '"' and '\\': printed as it is


def print_graph(graph: Graph, debuginfo: bool = False) -> str:
    """`module { func.func @name(...) {...} }`; `debuginfo` adds each op's `loc(...)`."""
    return print_module([graph], debuginfo)


def strip_locations(text: str) -> str:
    """What `print_graph(graph)` prints, from what `print_graph(graph, debuginfo=True)`
    printed: every line's trailing `loc(...)` dropped (a `"` inside a printed string is
    `\\22`, so only a location can end a line in `loc("...":line:col)`)."""
    return _LOC_AT_END.sub("", text)


def print_module(graphs: list[Graph], debuginfo: bool = False) -> str:
    """Several graphs as the functions of one module (their names must differ for MLIR)."""
    return "module {\n" + "".join(GraphPrinter(g, debuginfo).func() for g in graphs) + "}\n"


def quote(s: str) -> str:
    """An MLIR string literal, escaped byte-wise exactly as MLIR prints it (`\\22`, `\\0A`)."""
    if _PLAIN.fullmatch(s):  # op names, paths, ids: nothing to escape
        return f'"{s}"'
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        out.append("\\\\" if c == "\\" else c if 0x20 <= b < 0x7F and c != '"' else f"\\{b:02X}")
    return '"' + "".join(out) + '"'


def fmt_float(x: float) -> str:
    """Shortest repr that round-trips, with the '.' MLIR wants (`1.0e-05`); hex if not finite."""
    if not math.isfinite(x):
        return f"0x{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"
    return _dotted(repr(float(x)))


def _dotted(s: str) -> str:
    mant, e, exp = s.partition("e")
    return s if "." in mant else f"{mant}.0{e}{exp}"


def _elem(x: np.generic, dtype: str) -> str:
    """A dense element; a float reads back (via double, as MLIR reads it) to the same bits."""
    if dtype == "i1":
        return "true" if x else "false"
    if dtype in ("i32", "i64"):
        return str(int(x))
    if not np.isfinite(x):
        return f"0x{int(x.view(f'u{x.itemsize}')):0{_HEX_WIDTH[dtype]}X}"
    s = _dotted(str(x))
    return s if type(x)(float(s)) == x else fmt_float(float(x))


def fmt_dense(a: np.ndarray) -> str:
    """`dense<...> : tensor<2x3xf32>`: splat when all elements are equal, else nested lists."""
    dtype = dtype_of(a.dtype)
    first = splat_element(a)
    if a.size == 0:
        body = ""
    elif first is not None:
        body = _elem(first, dtype)
    else:
        items = [_elem(x, dtype) for x in a.reshape(-1)]
        for d in reversed(a.shape[1:]):
            items = ["[" + ", ".join(items[i:i + d]) + "]" for i in range(0, len(items), d)]
        body = "[" + ", ".join(items) + "]"
    return f"dense<{body}> : {TensorType(a.shape, dtype)}"


def fmt_attr(v: Any, in_array: bool = False) -> str:
    """An attribute value; ints are i64 and floats f64 (the type elided inside arrays)."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        s = fmt_float(float(v))
        return s if in_array and not s.startswith("0x") else s + " : f64"
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_attr(x, True) for x in v) + "]"
    if isinstance(v, dict):
        return fmt_attr_dict(v)
    if isinstance(v, np.ndarray):
        return fmt_dense(v)
    if isinstance(v, (TensorType, ScalarType)):
        return str(v)
    raise TypeError(f"cannot print attribute value {v!r} of type {type(v).__name__} as MLIR")


def fmt_attr_dict(attrs: dict[str, Any]) -> str:
    """`{a = 1, b = "x"}`, sorted by key as mlir-opt prints it."""
    items = (f"{k if BARE_ID.fullmatch(k) else quote(k)} = {fmt_attr(attrs[k])}"
             for k in sorted(attrs))
    return "{" + ", ".join(items) + "}"


def fmt_loc(loc: Location) -> str:
    return f"loc({quote(loc.file)}:{loc.line}:{loc.col})"


class GraphPrinter:
    """Names every value of one graph up front (so forward references print), then prints
    the whole function (`func`) or one op at a time (`op`: the CUDA generator's comments
    quote each op under the names the dump uses)."""

    def __init__(self, graph: Graph, debuginfo: bool):
        self.graph, self.debuginfo = graph, debuginfo
        self.names: dict[Value, str] = {}
        self.used: set[str] = set()
        self.next_result = 0
        self.next_arg = len(graph.args)
        for i, v in enumerate(graph.args):
            self._name_arg(v, i)
        self._name_block_ops(graph.body)

    def _name_arg(self, v: Value, n: int | None = None) -> None:
        name = v.name
        if not (isinstance(name, str) and VALUE_ID.fullmatch(name)) or name in self.used:
            if n is None:
                n, self.next_arg = self.next_arg, self.next_arg + 1
            while f"arg{n}" in self.used:
                n += 1
            name = f"arg{n}"
        self.used.add(name)
        self.names[v] = name

    def _name_block_ops(self, block: Block) -> None:
        for op in block.ops:
            for r in op.results:
                self.names[r] = str(self.next_result)
                self.next_result += 1
            for region in op.regions:
                for b in region.blocks:
                    for v in b.args:
                        self._name_arg(v)
                    self._name_block_ops(b)

    def value(self, v: Value) -> str:
        return "%" + self.names[v] if v in self.names else _UNKNOWN

    def typed_arg(self, v: Value) -> str:
        return f"{self.value(v)}: {v.type}"

    def loc(self, loc: Location | None) -> str:
        return " " + fmt_loc(loc) if self.debuginfo and loc is not None else ""

    def func(self) -> str:
        g = self.graph
        term = g.body.terminator
        results = [v.type for v in term.operands] if term and term.name == "func.return" else []
        sig = ", ".join(map(self.typed_arg, g.args))
        name = g.name if BARE_ID.fullmatch(g.name) else quote(g.name)
        head = f"  func.func @{name}({sig})"
        if results:
            types = ", ".join(map(str, results))
            head += f" -> {types}" if len(results) == 1 else f" -> ({types})"
        if g.attributes:
            head += " attributes " + fmt_attr_dict(g.attributes)
        body = "".join(self.op(op, "    ") for op in g.ops)
        return f"{head} {{\n{body}  }}{self.loc(g.loc)}\n"

    def op(self, op: Operation, indent: str) -> str:
        if op.name == "func.return":
            text = "func.return"
            if op.operands:
                text += (" " + ", ".join(map(self.value, op.operands)) + " : "
                         + ", ".join(str(v.type) for v in op.operands))
            return f"{indent}{text}{self.loc(op.loc)}\n"
        text = ", ".join(map(self.value, op.results)) + " = " if op.results else ""
        text += f"{quote(op.name)}({', '.join(map(self.value, op.operands))})"
        if op.regions:
            text += " (" + ", ".join(self.region(r, indent) for r in op.regions) + ")"
        if op.attributes:
            text += " " + fmt_attr_dict(op.attributes)
        ins = ", ".join(str(v.type) for v in op.operands)
        outs = ", ".join(str(v.type) for v in op.results)
        outs = outs if len(op.results) == 1 else f"({outs})"
        return f"{indent}{text} : ({ins}) -> {outs}{self.loc(op.loc)}\n"

    def region(self, region: Region, indent: str) -> str:
        """`{` blocks `}`; an entry block is labelled when it has args or is empty."""
        text = "{\n"
        for i, b in enumerate(region.blocks):
            if i or b.args or not b.ops:
                args = f"({', '.join(map(self.typed_arg, b.args))})" if b.args else ""
                text += f"{indent}^bb{i}{args}:\n"
            text += "".join(self.op(op, indent + "  ") for op in b.ops)
        return text + indent + "}"
