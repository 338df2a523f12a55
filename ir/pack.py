"""A graph as compact JSON, for the stage cache (runtime/stage_cache.py): read back about
five times faster than its MLIR text parses (the 8,858 ops of a 16-layer GPT training
step: ~0.05 s instead of ~0.25 s), since nothing is lexed token by token.

Every string (names, type texts, attribute dicts as MLIR prints them) is kept once, in
three tables the ops index, so each type and attribute dict is read once, by the text
parser (`ir.attributes`), however many ops share it: attribute values read back exactly
as from the text, and the stage cache can number the param ids in the tables. What the
printer leaves out without debuginfo is left out here too (locations, text positions):
a packed graph prints as the graph did. Malformed input is a ValueError, never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from .attributes import AttributeParser, _fresh
from .core import Block, Graph, Operation, Region, Value
from .printer import fmt_attr_dict

FORMAT = 1
TABLES = ("names", "types", "attrs")  # every string of a packed graph is in one of these


def pack(graph: Graph) -> dict[str, Any]:
    """`graph` as JSON-able lists: {"format", "names", "types", "attrs", "graph"}."""
    tables: dict[str, dict[str, int]] = {t: {} for t in TABLES}

    def index(table: str, text: str) -> int:
        found = tables[table]
        return found.setdefault(text, len(found))

    numbers: dict[Value, int] = {}  # every value, in the order `unpack` makes them

    def block(b: Block) -> list[Any]:
        args = [[index("types", str(v.type)),  # a name that is no str prints as argN, as None
                 index("names", v.name) if isinstance(v.name, str) else None] for v in b.args]
        for v in b.args:
            numbers[v] = len(numbers)
        ops = []
        for op in b.ops:
            operands = [numbers[v] for v in op.operands]  # KeyError: not in scope, unprintable
            regions = [[block(inner) for inner in r.blocks] for r in op.regions]
            for v in op.results:
                numbers[v] = len(numbers)
            attrs = index("attrs", fmt_attr_dict(op.attributes)) if op.attributes else None
            ops.append([index("names", op.name), operands,
                        [index("types", str(v.type)) for v in op.results], attrs, regions])
        return [args, ops]

    attrs = index("attrs", fmt_attr_dict(graph.attributes)) if graph.attributes else None
    body = [index("names", graph.name), attrs, block(graph.body)]
    return {"format": FORMAT, **{t: list(tables[t]) for t in TABLES}, "graph": body}


def dumps(packed: dict[str, Any]) -> bytes:
    """ASCII JSON: any string, a lone surrogate too, is escaped (and read back as it was)."""
    return json.dumps(packed, separators=(",", ":")).encode()


def loads(data: bytes) -> dict[str, Any]:
    """The packed graph in `data` (ValueError where it is not one)."""
    packed = json.loads(data)  # UnicodeDecodeError and JSONDecodeError are ValueErrors
    if not isinstance(packed, dict) or packed.get("format") != FORMAT:
        raise ValueError("not a packed graph of this format")
    return packed


def _read(texts: Any, what: str) -> list[Any]:
    """Each of `texts`, a type (`what` "type") or an attribute dict ("attrs") as MLIR text,
    read by one parser, one a line, so the types they repeat are read once too."""
    if not isinstance(texts, list) or not all(type(t) is str and "\n" not in t for t in texts):
        raise ValueError(f"expected a table of {what} texts")
    p = AttributeParser("\n".join(texts))
    read = p.type if what == "type" else p.attr_dict
    out, start = [], 0
    for text in texts:
        end = start + len(text)
        if p.tok.pos != start:  # a text that does not start the line, or an empty one
            raise p.error(f"expected {what} at the start of the line")
        out.append(read())
        if p.end != end:
            raise p.expected("the end of the line")
        start = end + 1
    if p.tok.kind != "eof":
        raise p.expected("the end of the text")
    return out


def unpack(packed: dict[str, Any]) -> Graph:
    """The graph `pack` packed; ValueError (a ParseError for a bad type or attribute text)
    where `packed` is not what pack makes."""
    try:
        return _Unpacker(packed).graph()
    except (TypeError, KeyError, IndexError, AttributeError) as e:
        raise ValueError(f"malformed packed graph: {type(e).__name__}: {e}") from None


class _Unpacker:
    """Builds the graph; indices are checked as they are used (a negative one, which Python
    would take from the end, included)."""

    def __init__(self, packed: dict[str, Any]):
        self.names = packed["names"]
        if not all(isinstance(n, str) for n in self.names):
            raise ValueError("expected a table of names")
        self.types = _read(packed["types"], "type")
        # (the dict, how to copy each mutable value: an op gets its own, as from the parser)
        self.attrs = [(a, [(k, _copier(v)) for k, v in a.items() if _mutable(v)])
                      for a in _read(packed["attrs"], "attrs")]
        self.body = packed["graph"]
        self.values: list[Value] = []

    def graph(self) -> Graph:
        name, attrs, body = self.body
        g = Graph(self.names[_index(name)])
        if attrs is not None:
            g.attributes = _fresh(self.attrs[_index(attrs)][0])
        self.block(body, g.body)
        return g

    def block(self, packed: list[Any], block: Block) -> None:
        args, ops = packed
        values, names, types, attrs = self.values, self.names, self.types, self.attrs
        for t, name in args:
            values.append(block.add_arg(types[_index(t)],
                                        None if name is None else names[_index(name)]))
        for name, operands, results, attr, regions in ops:
            if type(name) is not int or name < 0:
                raise ValueError(f"expected a name's index, got {name!r}")
            if operands and min(operands) < 0:  # past the values defined: an IndexError
                raise ValueError(f"expected indices of values defined before, got {operands}")
            if results and min(results) < 0:
                raise ValueError(f"expected type indices, got {results}")
            if attr is not None:
                shared, copies = attrs[_index(attr)]
                if copies:  # else Operation's copy of the dict is enough
                    attr = dict(shared)
                    for k, copy in copies:
                        attr[k] = copy(shared[k])
                else:
                    attr = shared
            inner = []
            for blocks in regions:
                region = Region()
                for b in blocks:
                    self.block(b, region.append(Block()))
                inner.append(region)
            op = Operation(names[name], [values[i] for i in operands],
                           [types[i] for i in results], attr, inner)
            values += op.results
            block.append(op)


def _mutable(v: Any) -> bool:
    return isinstance(v, (list, dict)) or (isinstance(v, np.ndarray) and v.flags.writeable)


def _copier(v: Any) -> Callable[[Any], Any]:
    """A deep copy of `v`: quick for a list of immutables, or of lists of them (a kernel's
    `maps`, `shape`, `dims`), else `_fresh`."""
    if type(v) is list and not any(map(_mutable, v)):
        return list.copy
    if type(v) is list and all(type(x) is list and not any(map(_mutable, x)) for x in v):
        return lambda rows: [row.copy() for row in rows]
    return _fresh


def _index(i: Any) -> int:
    if type(i) is not int or i < 0:
        raise ValueError(f"expected an index, got {i!r}")
    return i
