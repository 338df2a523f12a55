"""The IR's data structures: SSA values, operations, blocks, regions and graphs.

An `Operation` is generic (its name is a string such as "ember.add"); what an op
means (its type inference, verification and traits) lives in its `OpDef`, looked up
by name in `ir.opdef`. So unregistered ops parse, print and round-trip, as in MLIR.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .types import Type


@dataclass(frozen=True)
class Location:
    """A source position, printed as MLIR's `loc("file.py":12:5)`."""

    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f'loc("{self.file}":{self.line}:{self.col})'


class Value:
    """An SSA value: an operation's result or a block's argument."""

    __slots__ = ("type", "owner", "index", "name", "uses")

    def __init__(self, type: Type, owner: Operation | Block, index: int, name: str | None = None):
        self.type = type
        self.owner = owner
        self.index = index
        self.name = name  # a hint for block arguments (`%x`); results are numbered
        self.uses: list[tuple[Operation, int]] = []

    @property
    def op(self) -> Operation | None:
        """The defining operation, or None for a block argument."""
        return self.owner if isinstance(self.owner, Operation) else None

    def replace_all_uses_with(self, new: Value) -> None:
        for user, i in list(self.uses):
            user.set_operand(i, new)

    def __repr__(self) -> str:
        where = self.owner.name if isinstance(self.owner, Operation) else "arg"
        return f"<Value {where}#{self.index}: {self.type}>"


class Operation:
    """One operation: `%r = "dialect.name"(operands) {attributes} ({regions}) : types`."""

    def __init__(self, name: str, operands: Sequence[Value] = (),
                 result_types: Sequence[Type] = (),
                 attributes: dict[str, Any] | None = None, regions: Sequence[Region] = (),
                 loc: Location | None = None):
        self.name = name
        self.operands: list[Value] = []
        self.results = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.regions: list[Region] = []
        self.parent: Block | None = None
        self.loc = loc
        # (line, col) in the text it was parsed from, for error messages; unlike `loc`
        # (the user's debug location, printed with --mlir-print-debuginfo) never printed
        self.pos: tuple[int, int] | None = None
        for v in operands:
            self.add_operand(v)
        for r in regions:
            self.add_region(r)

    @property
    def dialect(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.name} has {len(self.results)} results, not one")
        return self.results[0]

    def add_operand(self, v: Value) -> None:
        v.uses.append((self, len(self.operands)))
        self.operands.append(v)

    def set_operand(self, i: int, v: Value) -> None:
        old = self.operands[i]
        old.uses.remove((self, i))
        v.uses.append((self, i))
        self.operands[i] = v

    def drop_operands(self) -> None:
        for i, v in enumerate(self.operands):
            v.uses.remove((self, i))
        self.operands = []

    def add_region(self, region: Region) -> None:
        region.parent = self
        self.regions.append(region)

    def erase(self) -> None:
        """Remove from the parent block; results must be unused."""
        for r in self.results:
            if r.uses:
                raise ValueError(f"erasing {self.name} whose result still has {len(r.uses)} uses")
        self.drop_operands()
        for region in self.regions:
            for block in region.blocks:
                for op in list(reversed(block.ops)):
                    op.drop_operands()
        if self.parent is not None:
            self.parent.ops.remove(self)
            self.parent = None

    def walk(self) -> Iterator[Operation]:
        """This op, then every op nested in its regions, in order."""
        yield self
        for region in self.regions:
            for block in region.blocks:
                for op in list(block.ops):
                    yield from op.walk()

    def __repr__(self) -> str:
        return f"<Operation {self.name}>"


class Block:
    """A list of operations with typed arguments; the last op is the terminator."""

    def __init__(self, arg_types: Sequence[Type] = (),
                 arg_names: Sequence[str | None] | None = None):
        names = arg_names or [None] * len(arg_types)
        self.args = [Value(t, self, i, n) for i, (t, n) in enumerate(zip(arg_types, names))]
        self.ops: list[Operation] = []
        self.parent: Region | None = None

    def add_arg(self, type: Type, name: str | None = None) -> Value:
        v = Value(type, self, len(self.args), name)
        self.args.append(v)
        return v

    def append(self, op: Operation) -> Operation:
        op.parent = self
        self.ops.append(op)
        return op

    def insert(self, index: int, op: Operation) -> Operation:
        op.parent = self
        self.ops.insert(index, op)
        return op

    def insert_before(self, anchor: Operation, op: Operation) -> Operation:
        return self.insert(self.ops.index(anchor), op)

    @property
    def terminator(self) -> Operation | None:
        return self.ops[-1] if self.ops else None


class Region:
    """A list of blocks owned by an operation (a fused kernel's scalar body)."""

    def __init__(self, blocks: Sequence[Block] = ()):
        self.blocks: list[Block] = []
        self.parent: Operation | None = None
        for b in blocks:
            self.append(b)

    def append(self, block: Block) -> Block:
        block.parent = self
        self.blocks.append(block)
        return block

    @property
    def block(self) -> Block:
        return self.blocks[0]


class Graph:
    """One `func.func` inside a `module`: arguments, a body, and a `func.return`.

    `attributes` are printed on the `func.func` (`attributes {ember.grads = [...]}`): what
    passes hand to later passes or to the runtime, such as which results are gradients of
    which params, so a dump fed back through `ember opt` loses nothing.
    """

    def __init__(self, name: str = "forward", arg_types: Sequence[Type] = (),
                 arg_names: Sequence[str | None] | None = None, loc: Location | None = None):
        self.name = name
        self.body = Block(arg_types, arg_names)
        self.loc = loc
        self.pos: tuple[int, int] | None = None  # where the parser read it, as Operation.pos
        self.attributes: dict[str, Any] = {}

    @property
    def args(self) -> list[Value]:
        return self.body.args

    @property
    def ops(self) -> list[Operation]:
        return self.body.ops

    @property
    def return_op(self) -> Operation:
        term = self.body.terminator
        if term is None or term.name != "func.return":
            raise ValueError(f"graph @{self.name} has no func.return terminator")
        return term

    @property
    def outputs(self) -> list[Value]:
        return self.return_op.operands

    @property
    def result_types(self) -> list[Type]:
        return [v.type for v in self.outputs]

    def walk(self) -> Iterator[Operation]:
        for op in list(self.body.ops):
            yield from op.walk()

    def params(self) -> list[Operation]:
        """The `ember.param` ops, in order."""
        return [op for op in self.body.ops if op.name == "ember.param"]

    def __str__(self) -> str:
        from .printer import print_graph

        return print_graph(self)

    def __repr__(self) -> str:
        """One line for a REPL or a list of graphs (`str(graph)` is the whole text)."""
        ins = ", ".join(str(a.type) for a in self.args)
        term = self.body.terminator
        outs = ", ".join(str(v.type) for v in term.operands) if term is not None else ""
        n = sum(1 for _ in self.walk())
        return f"<Graph @{self.name}({ins}) -> ({outs}): {n} ops>"

    def _repr_html_(self) -> str:
        """A notebook shows the MLIR text, folded under its one-line repr."""
        from html import escape

        return (f"<details><summary><code>{escape(repr(self))}</code></summary>"
                f"<pre>{escape(str(self))}</pre></details>")
