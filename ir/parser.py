"""Parses MLIR text into graphs: ember's own output and what `mlir-opt` prints back.

A hand-written lexer (`ir/lexer.py`) and recursive-descent parser over MLIR's generic op
form, the custom `module`/`func.func`/`return` forms, `<{properties}>`, `loc(...)` and
`#loc` aliases. Types, attributes, dense elements and locations are read by
`ir/attributes.py`; this module reads modules, functions, blocks, regions and operations,
and keeps the SSA scopes and location aliases. It builds `Operation`s directly: types are
explicit in the text, so nothing is inferred, and nothing is verified (that is
`ir.verify`'s job). Any malformed input raises `ParseError` naming the line and column
and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import partial
from typing import cast

from .attributes import Alias, AttributeParser, FuncType
from .core import Block, Graph, Location, Operation, Region, Value
from .lexer import ParseError, Token, decode
from .types import Type

__all__ = ["ParseError", "decode", "parse", "parse_module"]

_SSA_NAME = re.compile(r"%([0-9]+|[A-Za-z_$.\-][A-Za-z0-9_$.\-]*)(?:#([0-9]+))?")
_PCT = re.compile(r"%[A-Za-z0-9_$.\-]+(?:#[0-9]+)?")  # the lexer's `pct` token
_OPERANDS = re.compile(rf"\((?:(?:{_PCT.pattern}, )*{_PCT.pattern})?\)")


def parse(text: str) -> Graph:
    """The one `func.func` of `text` as a Graph (ParseError unless there is exactly one)."""
    p = _Parser(text)
    graphs = p.parse_module()
    if len(graphs) != 1:
        pos = p.func_pos[1] if len(graphs) > 1 else len(text)
        raise p.error(f"expected exactly one func.func, got {len(graphs)}", pos)
    return graphs[0]


def parse_module(text: str) -> list[Graph]:
    """Every `func.func` of `text`, in order."""
    return _Parser(text).parse_module()


class _Parser(AttributeParser):
    """Modules, functions, blocks and ops, with the SSA scopes (one per region) and the
    `#loc` aliases."""

    def __init__(self, text: str):
        self.scopes: list[dict[str, list[Value]]] = []
        self.aliases: dict[str, Location | Alias | None] = {}
        self.func_pos: list[int] = []
        super().__init__(text)

    # -- module structure -----------------------------------------------------------------

    def parse_module(self) -> list[Graph]:
        graphs = self.items(top=True)
        for g in graphs:
            g.loc = self.resolve(g.loc)
            for op in g.walk():
                op.loc = self.resolve(op.loc)
        return graphs

    def items(self, top: bool) -> list[Graph]:
        """Module contents: functions, nested modules and `#alias = loc(...)` lines."""
        graphs = []
        while not (self.tok.kind == "eof" if top else self.at("}")):
            tok = self.tok
            if tok.kind == "hash":
                self.alias_def()
            elif self.at("module"):
                graphs += self.custom_module()
            elif self.at("func.func"):
                graphs.append(self.custom_func())
            elif tok.kind == "str" and tok.value == "builtin.module":
                graphs += self.generic_module()
            elif tok.kind == "str" and tok.value == "func.func":
                graphs.append(self.generic_func())
            else:
                raise self.expected("'module' or 'func.func'" + ("" if top else " or '}'"))
        return graphs

    def alias_def(self) -> None:
        name = self.advance()
        self.expect("=")
        if not self.at("loc"):
            raise self.expected("'loc' (only location aliases are supported)")
        self.aliases[name.text] = self.loc()

    def custom_module(self) -> list[Graph]:
        self.advance()
        if self.tok.kind == "at":
            self.advance()
        if self.accept("attributes"):
            self.attr_dict()
        self.expect("{")
        graphs = self.items(top=False)
        self.expect("}")
        self.opt_loc()
        return graphs

    def generic_module(self) -> list[Graph]:
        self.advance()
        self.expect("(")
        self.expect(")", "')' (a module takes no operands)")
        if self.accept("<"):
            self.attr_dict()
            self.expect(">")
        self.expect("(")
        self.expect("{")
        if self.tok.kind == "caret":
            self.advance()
            self.expect(":", "':' (a module block takes no arguments)")
        graphs = self.items(top=False)
        self.expect("}")
        self.expect(")", "')' (a module has one region)")
        if self.at("{"):
            self.attr_dict()
        self.expect(":")
        ft = self.func_type()
        if ft.inputs or ft.outputs:
            raise self.error(f"expected '() -> ()' for builtin.module, got {_fmt_ft(ft)}")
        self.opt_loc()
        return graphs

    def custom_func(self) -> Graph:
        self.func_pos.append(self.advance().pos)
        if self.at("private") or self.at("public") or self.at("nested"):
            raise self.error("expected '@name': function declarations are not supported")
        name = self.symbol()
        self.scopes = [{}]
        g = Graph(name)
        g.pos = self.line_col(self.func_pos[-1])
        self.expect("(")
        self.comma_list(")", lambda: self.block_arg(g.body))
        results: list[Type] = []
        if self.accept("->"):
            results = self.type_list() if self.at("(") else [self.type()]
        if self.accept("attributes"):
            g.attributes = self.attr_dict()
        self.expect("{")
        self.block_ops(g.body)
        if not self.at("}"):
            raise self.expected("'}' (a func.func body is a single block)")
        end = self.advance()
        g.loc = self.unresolved_loc()
        self.check_return(g, results, end.pos)
        return g

    def generic_func(self) -> Graph:
        self.func_pos.append(self.tok.pos)
        self.scopes = [{}]
        op = self.generic_op(results=[], in_func=True)
        attrs, ft = op.attributes, op.attributes.pop("function_type", None)
        name = attrs.pop("sym_name", None)
        if not isinstance(ft, FuncType) or not isinstance(name, str):
            raise self.error("expected func.func properties 'function_type' and 'sym_name'",
                             self.func_pos[-1])
        if len(op.regions) != 1 or len(op.regions[0].blocks) != 1 or op.operands or op.results:
            raise self.error("expected func.func with one single-block region, no operands "
                             "and no results", self.func_pos[-1])
        body = op.regions[0].blocks[0]
        if [a.type for a in body.args] != list(ft.inputs):
            raise self.error(f"expected block arguments of types ({_types(ft.inputs)}) as in "
                             f"function_type, got ({_types(a.type for a in body.args)})",
                             self.func_pos[-1])
        g = Graph(name, loc=op.loc)
        g.pos = self.line_col(self.func_pos[-1])
        g.body, body.parent, g.attributes = body, None, attrs
        self.check_return(g, list(ft.outputs), self.func_pos[-1])
        return g

    def check_return(self, g: Graph, results: list[Type], pos: int) -> None:
        """The signature's result types must be what `func.return` returns (MLIR checks it)."""
        term = g.body.terminator
        if term is None or term.name != "func.return":
            if results:
                raise self.error("expected the function body to end with func.return", pos)
            return
        got = [v.type for v in term.operands]
        if got != results:
            raise self.error(f"expected func.return of ({_types(results)}) as declared, "
                             f"got ({_types(got)})", pos)

    def symbol(self) -> str:
        tok = self.take("at", "a symbol name '@name'")
        if tok.text != "@":
            return tok.text[1:]
        if self.tok.kind == "str" and self.tok.pos == tok.pos + 1:
            name: str = self.advance().value
            return name
        raise self.expected("a symbol name after '@'")

    # -- blocks and operations -----------------------------------------------------------

    def define(self, name: str, values: list[Value], pos: int) -> None:
        if any(name in s for s in self.scopes):
            raise self.error(f"redefinition of value '%{name}'", pos)
        self.scopes[-1][name] = values

    def operands(self) -> list[tuple[Value, Token]]:
        """`(%a, %b)`; as ember prints it, in one match instead of a token at a time."""
        m = _OPERANDS.match(self.text, self.tok.pos)
        if m is None:
            self.expect("(")
            return self.comma_list(")", self.use)
        uses = [self.value_of(Token("pct", n[0], n.start()))
                for n in _PCT.finditer(self.text, m.start(), m.end())]
        self.lex(m.end())
        return uses

    def use(self) -> tuple[Value, Token]:
        return self.value_of(self.take("pct", "a value '%name'"))

    def value_of(self, tok: Token) -> tuple[Value, Token]:
        m = _SSA_NAME.fullmatch(tok.text)
        if m is None:
            raise self.error(f"expected a valid value name, got '{tok.text}'", tok.pos)
        name, idx = m.group(1), int(m.group(2) or 0)
        for scope in reversed(self.scopes):
            if name in scope:
                group = scope[name]
                if idx >= len(group):
                    raise self.error(f"expected a result number below {len(group)} for "
                                     f"'%{name}', got #{idx}", tok.pos)
                return group[idx], tok
        raise self.error(f"use of undefined value '%{name}'", tok.pos)

    def block_arg(self, block: Block) -> Value:
        tok = self.take("pct", "an argument '%name'")
        m = _SSA_NAME.fullmatch(tok.text)
        if m is None or m.group(2):
            raise self.error(f"expected an argument name, got '{tok.text}'", tok.pos)
        self.expect(":")
        v = block.add_arg(self.type(), m.group(1))
        if self.at("{"):
            raise self.error("argument attributes are not supported")
        self.opt_loc()
        self.define(m.group(1), [v], tok.pos)
        return v

    def block_ops(self, block: Block) -> None:
        while not (self.at("}") or self.tok.kind in ("caret", "eof")):
            block.append(self.op())

    def region(self) -> Region:
        opening = self.expect("{")
        region = Region()
        self.scopes.append({})
        with self.nested(opening):
            if not self.at("}") and self.tok.kind != "caret":
                self.block_ops(region.append(Block()))
            while self.tok.kind == "caret":
                block = region.append(Block())
                self.advance()
                if self.accept("("):
                    self.comma_list(")", partial(self.block_arg, block))
                self.expect(":")
                self.block_ops(block)
        self.scopes.pop()
        self.expect("}", "an operation, a block label or '}'")
        return region

    def op(self) -> Operation:
        """One operation, remembering where it starts for the verifier's messages."""
        start = self.line_col(self.tok.pos)
        results = []  # (name, count, pos)
        if self.tok.kind == "pct":
            results = self.comma_list("=", self.result_name)
        if self.tok.kind == "str":
            op = self.generic_op(results)
        elif self.at("func.return") or self.at("return"):
            if results:
                raise self.error("expected no results for func.return", results[0][2])
            op = self.custom_return()
        else:
            raise self.expected('an operation (\'"dialect.op"(...)\' or \'func.return\')')
        op.pos = start
        return op

    def result_name(self) -> tuple[str, int, int]:
        tok = self.take("pct", "a result name '%name'")
        m = _SSA_NAME.fullmatch(tok.text)
        if m is None or m.group(2):
            raise self.error(f"expected a result name, got '{tok.text}'", tok.pos)
        count = 1
        if self.accept(":"):
            n = self.take("int", "a result count")
            count = self.integer(n)
            if count < 1:
                raise self.error("expected a positive result count, got 0", n.pos)
        return m.group(1), count, tok.pos

    def custom_return(self) -> Operation:
        self.advance()
        uses = []
        if self.tok.kind == "pct":
            uses = [self.use()]
            while self.accept(","):
                uses.append(self.use())
            self.expect(":")
            pos = self.tok.pos
            types = [self.type()]
            while self.accept(","):
                types.append(self.type())
            self.check_uses(uses, types, pos)
        return Operation("func.return", [v for v, _ in uses], [], loc=self.unresolved_loc())

    def check_uses(self, uses: list[tuple[Value, Token]], types: list[Type], pos: int) -> None:
        if len(uses) != len(types):
            raise self.error(f"expected {_count(len(uses), 'operand type')}, got {len(types)}",
                             pos)
        for (v, tok), t in zip(uses, types):
            if v.type != t:
                raise self.error(f"use of '{tok.text}' expected type {v.type} as defined, "
                                 f"got {t}", tok.pos)

    def generic_op(self, results: list[tuple[str, int, int]], in_func: bool = False) -> Operation:
        name = self.advance().value
        uses = self.operands()
        if self.at("["):
            raise self.error("successors are not supported")
        attrs = {}
        if self.accept("<"):
            attrs = self.attr_dict(in_func)
            self.expect(">")
        regions = self.comma_list(")", self.region) if self.accept("(") else []
        if self.at("{"):
            for k, v in self.attr_dict(in_func).items():
                attrs.setdefault(k, v)
        self.expect(":", "':' and the op's type")
        pos = self.tok.pos
        ft = self.func_type()
        self.check_uses(uses, list(ft.inputs), pos)
        want = sum(n for _, n, _ in results)
        if len(ft.outputs) != want:
            raise self.error(f"expected {_count(want, 'result type')}, got {len(ft.outputs)}",
                             pos)
        op = Operation(name, [v for v, _ in uses], list(ft.outputs), attrs, regions,
                       self.unresolved_loc())
        i = 0
        for rname, n, pos in results:
            self.define(rname, op.results[i:i + n], pos)
            i += n
        return op

    # -- location aliases -----------------------------------------------------------------

    def unresolved_loc(self) -> Location | None:
        """`opt_loc()` for an op's or a graph's `loc`: a `loc(#alias)` is stored there as its
        `Alias` until `parse_module` resolves it (aliases may be defined after their uses)."""
        return cast("Location | None", self.opt_loc())

    def resolve(self, loc: Location | Alias | None) -> Location | None:
        seen = set()
        while isinstance(loc, Alias):
            if loc.name not in self.aliases:
                raise self.error(f"use of undefined location alias '{loc.name}'", loc.pos)
            if loc.name in seen:
                raise self.error(f"location alias '{loc.name}' refers to itself", loc.pos)
            seen.add(loc.name)
            loc = self.aliases[loc.name]
        return loc


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _types(types: Iterable[object]) -> str:
    return ", ".join(map(str, types))


def _fmt_ft(ft: FuncType) -> str:
    return f"({_types(ft.inputs)}) -> ({_types(ft.outputs)})"
