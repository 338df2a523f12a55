"""Parses MLIR text into graphs: ember's own output and what `mlir-opt` prints back.

A hand-written lexer and recursive-descent parser over MLIR's generic op form, the custom
`module`/`func.func`/`return` forms, `<{properties}>`, `loc(...)` and `#loc` aliases. It
builds `Operation`s directly: types are explicit in the text, so nothing is inferred, and
nothing is verified (that is `ir.verify`'s job). Any malformed input raises `ParseError`
naming the line and column and what was expected.
"""

from __future__ import annotations

import bisect
import math
import re
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from .core import Block, Graph, Location, Operation, Region, Value
from .types import DTYPES, FLOAT_DTYPES, ScalarType, TensorType, numpy_dtype

MAX_DEPTH = 100  # nesting of regions, arrays and dicts: deeper input is an error, not a crash
_LAZY_SPLAT = 1 << 20  # bigger splats stay read-only broadcast views instead of allocating

_TOKEN = re.compile(r"""
    (?P<pct>%[A-Za-z0-9_$.\-]+(?:\#[0-9]+)?)
  | (?P<at>@(?:[A-Za-z_][A-Za-z0-9_$.]*)?)
  | (?P<caret>\^[A-Za-z0-9_$.\-]+)
  | (?P<hash>\#[A-Za-z0-9_$.\-]+)
  | (?P<float>[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?)
  | (?P<hex>0x[0-9A-Fa-f]+)
  | (?P<int>[0-9]+)
  | (?P<id>[A-Za-z_][A-Za-z0-9_$.]*)
  | (?P<arrow>->)
  | (?P<punct>[(){}\[\]<>,:=\-*?!+|])
""", re.VERBOSE)
_SPACE = re.compile(r"(?:\s+|//[^\n]*)*")
_DIM = re.compile(r"([0-9]+)x")
_WORD = re.compile(r"[A-Za-z0-9_]+")
_SSA_NAME = re.compile(r"%([0-9]+|[A-Za-z_$.\-][A-Za-z0-9_$.\-]*)(?:#([0-9]+))?")
_ESCAPES = {'"': 0x22, "\\": 0x5C, "n": 0x0A, "t": 0x09}
_INT_TYPES = frozenset({"i64", "i32", "i1", "index"})
_HEX_FLOAT = {"f64": ("<Q", "<d"), "f32": ("<I", "<f"), "f16": ("<H", "<e")}


def _show(text: str) -> str:
    """A token for an error message: quoted, with line ends and tabs named."""
    if text.isspace():
        return {"\n": "end of line", "\t": "a tab"}.get(text, repr(text))
    return f"'{text}'"


class ParseError(ValueError):
    """Malformed text: `str(e)` is `"<line>:<col>: error: <what was expected>"`."""

    def __init__(self, message: str, line: int, col: int):
        self.message, self.line, self.col = message, line, col
        super().__init__(f"{line}:{col}: error: {message}")


@dataclass
class _Tok:
    kind: str  # pct at caret hash float hex int id arrow punct str eof
    text: str
    pos: int
    value: Any = None


@dataclass
class _Alias:
    """A `loc(#loc3)` reference, resolved once the `#loc3 = loc(...)` lines are all read."""

    name: str
    pos: int


@dataclass(frozen=True)
class _FuncType:
    inputs: tuple
    outputs: tuple


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


def decode(data: bytes) -> str:
    """The text of a file's bytes: what is not UTF-8 is a ParseError at its line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1
        col = len(data[start:e.start].decode("utf-8")) + 1
        raise ParseError(f"expected UTF-8 text, got byte 0x{data[e.start]:02X}",
                         data.count(b"\n", 0, e.start) + 1, col) from None


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.lines = [0] + [m.end() for m in re.finditer("\n", text)]
        self.scopes: list[dict[str, list[Value]]] = []
        self.aliases: dict[str, Any] = {}
        self.func_pos: list[int] = []
        self.depth = 0
        self.lex(0)

    # -- errors and tokens ----------------------------------------------------------------

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError(message, *self.line_col(self.tok.pos if pos is None else pos))

    def line_col(self, pos: int) -> tuple[int, int]:
        """The 1-based line and column of offset `pos`."""
        line = bisect.bisect_right(self.lines, pos)
        return line, pos - self.lines[line - 1] + 1

    def expected(self, what: str, tok: _Tok | None = None) -> ParseError:
        tok = tok or self.tok
        got = "end of input" if tok.kind == "eof" else _show(tok.text)
        return self.error(f"expected {what}, got {got}", tok.pos)

    def lex(self, pos: int) -> None:
        """Make the token at `pos` (after spaces and comments) the current one."""
        pos = _SPACE.match(self.text, pos).end()
        if pos >= len(self.text):
            self.tok = _Tok("eof", "", pos)
        elif self.text[pos] == '"':
            self.tok = self.lex_string(pos)
        else:
            m = _TOKEN.match(self.text, pos)
            if m is None:
                raise self.error(f"unexpected character '{self.text[pos]}'", pos)
            self.tok = _Tok(m.lastgroup, m.group(), pos)

    def lex_string(self, start: int) -> _Tok:
        out, i, text = bytearray(), start + 1, self.text
        while i < len(text) and text[i] not in '"\n':
            c = text[i]
            if c != "\\":
                out += c.encode("utf-8", "surrogatepass")
                i += 1
            elif text[i + 1:i + 2] in _ESCAPES:
                out.append(_ESCAPES[text[i + 1]])
                i += 2
            elif re.fullmatch(r"[0-9A-Fa-f]{2}", text[i + 1:i + 3]):
                out.append(int(text[i + 1:i + 3], 16))
                i += 3
            else:
                raise self.error("expected an escape (\\\\, \\\", \\n, \\t or two hex digits) "
                                 f"after '\\', got {text[i + 1:i + 2]!r}", i)
        if i >= len(text) or text[i] != '"':
            raise self.error("unterminated string: expected '\"' before end of line", start)
        try:
            value = out.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("expected a UTF-8 string", start) from None
        return _Tok("str", text[start:i + 1], start, value)

    def advance(self) -> _Tok:
        tok = self.tok
        self.lex(tok.pos + len(tok.text))
        return tok

    def at(self, text: str) -> bool:
        return self.tok.text == text and self.tok.kind not in ("str", "eof")

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.advance()
            return True
        return False

    def expect(self, text: str, what: str | None = None) -> _Tok:
        if not self.at(text):
            raise self.expected(what or f"'{text}'")
        return self.advance()

    def take(self, kind: str, what: str) -> _Tok:
        if self.tok.kind != kind:
            raise self.expected(what)
        return self.advance()

    def integer(self, tok: _Tok) -> int:
        try:
            return int(tok.text, 16 if tok.kind == "hex" else 10)
        except ValueError:
            raise self.error("integer literal too long", tok.pos) from None

    @contextmanager
    def nested(self, opening: _Tok):
        """Counts nesting depth so that hostile input cannot exhaust Python's stack."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nesting deeper than {MAX_DEPTH} levels", opening.pos)
        try:
            yield
        finally:
            self.depth -= 1

    def comma_list(self, close: str, item) -> list:
        """`item (',' item)* close`, or just `close`."""
        out = []
        if not self.accept(close):
            out.append(item())
            while self.accept(","):
                out.append(item())
            self.expect(close, f"',' or '{close}'")
        return out

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
        results = []
        if self.accept("->"):
            results = self.type_list() if self.at("(") else [self.type()]
        if self.accept("attributes"):
            g.attributes = self.attr_dict()
        self.expect("{")
        self.block_ops(g.body)
        if not self.at("}"):
            raise self.expected("'}' (a func.func body is a single block)")
        end = self.advance()
        g.loc = self.opt_loc()
        self.check_return(g, results, end.pos)
        return g

    def generic_func(self) -> Graph:
        self.func_pos.append(self.tok.pos)
        self.scopes = [{}]
        op = self.generic_op(results=[], in_func=True)
        attrs, ft = op.attributes, op.attributes.pop("function_type", None)
        name = attrs.pop("sym_name", None)
        if not isinstance(ft, _FuncType) or not isinstance(name, str):
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

    def check_return(self, g: Graph, results: list, pos: int) -> None:
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
            return self.advance().value
        raise self.expected("a symbol name after '@'")

    # -- blocks and operations -----------------------------------------------------------

    def define(self, name: str, values: list[Value], pos: int) -> None:
        if any(name in s for s in self.scopes):
            raise self.error(f"redefinition of value '%{name}'", pos)
        self.scopes[-1][name] = values

    def use(self) -> tuple[Value, _Tok]:
        tok = self.take("pct", "a value '%name'")
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
                    self.comma_list(")", lambda b=block: self.block_arg(b))
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
        return Operation("func.return", [v for v, _ in uses], [], loc=self.opt_loc())

    def check_uses(self, uses: list, types: list, pos: int) -> None:
        if len(uses) != len(types):
            raise self.error(f"expected {_count(len(uses), 'operand type')}, got {len(types)}",
                             pos)
        for (v, tok), t in zip(uses, types):
            if v.type != t:
                raise self.error(f"use of '{tok.text}' expected type {v.type} as defined, "
                                 f"got {t}", tok.pos)

    def generic_op(self, results: list, in_func: bool = False) -> Operation:
        name = self.advance().value
        self.expect("(")
        uses = self.comma_list(")", self.use)
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
                       self.opt_loc())
        i = 0
        for rname, n, pos in results:
            self.define(rname, op.results[i:i + n], pos)
            i += n
        return op

    # -- types ----------------------------------------------------------------------------

    def type(self) -> TensorType | ScalarType:
        tok = self.tok
        if tok.kind != "id":
            raise self.expected("a type")
        if tok.text == "tensor" and self.text.startswith("<", tok.pos + 6):
            return self.tensor_type()
        if tok.text in DTYPES:
            self.advance()
            return ScalarType(tok.text)
        raise self.error(f"expected a type (tensor<...> or one of {', '.join(DTYPES)}), "
                         f"got unknown type '{tok.text}'", tok.pos)

    def tensor_type(self) -> TensorType:
        """`tensor<2x3xf32>`, read character-wise (the lexer would split `3xf32` oddly)."""
        pos, dims = self.tok.pos + 7, []
        while m := _DIM.match(self.text, pos):
            if len(m.group(1)) > 18:
                raise self.error("dimension too large", pos)
            dims.append(int(m.group(1)))
            pos = m.end()
        m = _WORD.match(self.text, pos)
        word = m.group() if m else self.text[pos:pos + 1]
        if word not in DTYPES:
            what = "a static dimension or dtype" if word in ("?", "*") else "a dtype"
            got = _show(word) if word else "end of input"
            raise self.error(f"expected {what} ({', '.join(DTYPES)}), got {got}", pos)
        pos += len(word)
        if not self.text.startswith(">", pos):
            got = _show(self.text[pos]) if pos < len(self.text) else "end of input"
            raise self.error(f"expected '>' to close tensor type, got {got}", pos)
        self.lex(pos + 1)
        return TensorType(tuple(dims), word)

    def type_list(self) -> list:
        self.expect("(")
        return self.comma_list(")", self.type)

    def func_type(self) -> _FuncType:
        if not self.at("("):
            raise self.expected("'(' and operand types")
        ins = self.type_list()
        self.expect("->")
        outs = self.type_list() if self.at("(") else [self.type()]
        return _FuncType(tuple(ins), tuple(outs))

    # -- attributes -----------------------------------------------------------------------

    def attr_dict(self, allow_func_type: bool = False) -> dict[str, Any]:
        opening = self.expect("{")
        out: dict[str, Any] = {}
        with self.nested(opening):
            def entry():
                tok = self.tok
                if tok.kind not in ("id", "str"):
                    raise self.expected("an attribute name")
                key = self.advance().value if tok.kind == "str" else self.advance().text
                if key in out:
                    raise self.error(f"duplicate attribute '{key}'", tok.pos)
                if not key:
                    raise self.error("expected a non-empty attribute name", tok.pos)
                out[key] = self.attr(allow_func_type) if self.accept("=") else True
            self.comma_list("}", entry)
        return out

    def attr(self, allow_func_type: bool = False) -> Any:
        tok = self.tok
        if tok.kind == "str":
            return self.advance().value
        if tok.kind in ("int", "float", "hex") or self.at("-"):
            return self.number()
        if self.at("["):
            with self.nested(self.advance()):
                return self.comma_list("]", self.attr)
        if self.at("{"):
            return self.attr_dict()
        if self.at("("):
            if not allow_func_type:
                raise self.error("function types are only supported as func.func's "
                                 "function_type")
            return self.func_type()
        if tok.kind == "id":
            words = {"true": True, "false": False, "unit": True}
            if tok.text in words:
                self.advance()
                return words[tok.text]
            if tok.text == "dense":
                return self.dense()
            if tok.text == "tensor" or tok.text in DTYPES:
                return self.type()
        raise self.expected("an attribute value")

    def number(self) -> int | float:
        """`3`, `-2 : i32`, `0.5 : f64`, `1.0e-05`, `0x7FF0000000000000 : f64`."""
        neg = self.accept("-")
        tok = self.tok
        if tok.kind not in ("int", "float", "hex"):
            raise self.expected("a number")
        self.advance()
        value = float(tok.text) if tok.kind == "float" else self.integer(tok)
        dtype = None
        if self.accept(":"):
            dtok = self.tok
            if self.accept("index"):
                dtype = "index"
            else:
                t = self.type()
                if not isinstance(t, ScalarType):
                    raise self.error(f"expected a scalar type after a number, got {t}", dtok.pos)
                dtype = t.dtype
            if dtype in _INT_TYPES and tok.kind == "float":
                raise self.error(f"expected a float type for {tok.text}, got {dtype}", dtok.pos)
        if tok.kind == "hex" and dtype in FLOAT_DTYPES:
            if neg:
                raise self.error("expected a float bit pattern without '-'", tok.pos)
            return self.hex_float(value, dtype, tok.pos)
        if dtype in FLOAT_DTYPES:
            value = self.to_float(value, tok)
        return -value if neg else value

    def to_float(self, v: int | float, tok: _Tok) -> float:
        try:
            return float(v)
        except OverflowError:
            raise self.error(f"expected a number in float range, got {tok.text}", tok.pos) from None

    def hex_float(self, bits: int, dtype: str, pos: int) -> float:
        """A float from its IEEE bit pattern (`0x7FC00000` for an f32 NaN)."""
        width = 16 if dtype == "bf16" else 8 * struct.calcsize(_HEX_FLOAT[dtype][0])
        if bits >= 1 << width:
            raise self.error(f"expected a {dtype} bit pattern of at most {width // 4} hex "
                             "digits", pos)
        if dtype == "bf16":
            dtype, bits = "f32", bits << 16
        ifmt, ffmt = _HEX_FLOAT[dtype]
        return struct.unpack(ffmt, struct.pack(ifmt, bits))[0]

    # -- dense elements -------------------------------------------------------------------

    def dense(self) -> np.ndarray:
        """`dense<...> : tensor<...>`: splat, nested lists, `dense<>` or `dense<"0xHEX">`."""
        self.advance()
        self.expect("<")
        start = self.tok
        if start.kind == "str":
            body = ("hex", self.advance())
        elif self.at(">"):
            body = ("empty", None)
        elif self.at("["):
            body = ("list", self.dense_list())
        else:
            body = ("splat", self.dense_elem())
        self.expect(">")
        self.expect(":")
        ttok = self.tok
        t = self.type()
        if not isinstance(t, TensorType):
            raise self.expected("a tensor type for dense elements", ttok)
        try:
            return self.dense_value(body, t, start.pos)
        except ParseError:
            raise
        except (ValueError, MemoryError, OverflowError) as e:  # numpy: too big to represent
            raise self.error(f"cannot hold dense elements of {t}: {e}", ttok.pos) from None

    def dense_list(self) -> tuple[list, tuple[int, ...]]:
        """Nested `[...]` of elements: the flat elements and the shape they form."""
        start = self.expect("[")
        with self.nested(start):
            if self.at("["):
                subs = self.comma_list("]", self.dense_list)
                shapes = {s for _, s in subs}
                if len(shapes) != 1:
                    raise self.error("expected nested lists of equal shape", start.pos)
                return [x for flat, _ in subs for x in flat], (len(subs),) + shapes.pop()
            flat = self.comma_list("]", self.dense_elem)
            return flat, (len(flat),)

    def dense_elem(self) -> tuple[_Tok, Any]:
        tok = self.tok
        if self.at("true") or self.at("false"):
            self.advance()
            return tok, tok.text == "true"
        if tok.kind in ("int", "float", "hex") or self.at("-"):
            neg = self.accept("-")
            num = self.tok
            if num.kind not in ("int", "float", "hex"):
                raise self.expected("a number")
            self.advance()
            value = float(num.text) if num.kind == "float" else self.integer(num)
            return num, (-value if neg else value)
        raise self.expected("a dense element (a number, true or false)")

    def dense_value(self, body: tuple, t: TensorType, pos: int) -> np.ndarray:
        kind, data = body
        size = math.prod(t.shape)
        if kind == "empty":
            if size:
                raise self.error(f"expected elements for {t}, got none", pos)
            return np.zeros(t.shape, numpy_dtype(t.dtype))
        if kind == "hex":
            return self.dense_hex(data, t, size)
        if kind == "splat":
            elem = self.convert([data], t.dtype)
            if size <= _LAZY_SPLAT:
                return np.full(t.shape, elem[0], elem.dtype)
            return np.broadcast_to(elem.reshape(()), t.shape)
        flat, shape = data
        if shape != t.shape:
            raise self.error(f"expected dense shape {list(t.shape)} for {t}, got {list(shape)}",
                             pos)
        return self.convert(flat, t.dtype).reshape(t.shape)

    def convert(self, elems: list[tuple[_Tok, Any]], dtype: str) -> np.ndarray:
        """Literal elements as a numpy array of `dtype`, checking each fits."""
        np_dtype = numpy_dtype(dtype)
        if dtype in FLOAT_DTYPES:
            out = np.array([self.float_elem(tok, v, dtype) for tok, v in elems], np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                cast = out.astype(np_dtype)
            bad = np.flatnonzero(np.isfinite(out) & ~np.isfinite(cast))
            if bad.size:
                tok = elems[bad[0]][0]
                raise self.error(f"expected a value in {dtype}'s range, got {tok.text}", tok.pos)
            bits = cast.view(f"u{cast.itemsize}")  # bit patterns keep NaN payloads exactly
            for i, (tok, v) in enumerate(elems):
                if tok.kind == "hex":
                    bits[i] = v << 16 if dtype == "bf16" else v
            return cast
        lo, hi = (0, 1) if dtype == "i1" else (np.iinfo(np_dtype).min, np.iinfo(np_dtype).max)
        for tok, v in elems:
            if tok.kind == "float" or (isinstance(v, bool) and dtype != "i1"):
                raise self.error(f"expected an integer for {dtype}, got {tok.text}", tok.pos)
            if not lo <= v <= hi:
                raise self.error(f"expected a value in {dtype}'s range, got {v}", tok.pos)
        return np.array([v for _, v in elems], np_dtype)

    def float_elem(self, tok: _Tok, v: Any, dtype: str) -> float:
        if isinstance(v, bool):
            raise self.error(f"expected a number for {dtype}, got {tok.text}", tok.pos)
        if tok.kind == "hex":
            if v < 0:
                raise self.error("expected a float bit pattern without '-'", tok.pos)
            self.hex_float(v, dtype, tok.pos)  # checks the width; the bits are set as they are
            return 0.0
        return self.to_float(v, tok)

    def dense_hex(self, tok: _Tok, t: TensorType, size: int) -> np.ndarray:
        """MLIR's raw little-endian bytes; i1 is bit-packed, and one element means a splat."""
        s = tok.value
        if not re.fullmatch(r"0x([0-9A-Fa-f]{2})*", s):
            raise self.error(f"expected a hex string \"0x...\" of whole bytes, got {tok.text}",
                             tok.pos)
        raw = bytes.fromhex(s[2:])
        if t.dtype == "i1":
            if len(raw) == 1 and raw[0] in (0, 0xFF):
                return self.splat_array(np.array(bool(raw[0])), t.shape, size)
            if len(raw) != (size + 7) // 8:
                raise self.error(f"expected {(size + 7) // 8} bytes of hex data for {t}, "
                                 f"got {len(raw)}", tok.pos)
            bits = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")
            return bits[:size].astype(bool).reshape(t.shape)
        item = 2 if t.dtype == "bf16" else numpy_dtype(t.dtype).itemsize
        if len(raw) not in (item, item * size):
            raise self.error(f"expected {item * size} bytes of hex data for {t}, got {len(raw)}",
                             tok.pos)
        if t.dtype == "bf16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, numpy_dtype(t.dtype).newbyteorder("<"))
            a = a.astype(numpy_dtype(t.dtype))
        if len(raw) == item and size != 1:
            return self.splat_array(a[0], t.shape, size)
        return a.reshape(t.shape).copy()

    @staticmethod
    def splat_array(v: np.ndarray, shape: tuple, size: int) -> np.ndarray:
        v = np.asarray(v)
        return np.full(shape, v, v.dtype) if size <= _LAZY_SPLAT else np.broadcast_to(v, shape)

    # -- locations ------------------------------------------------------------------------

    def opt_loc(self) -> Location | _Alias | None:
        return self.loc() if self.at("loc") else None

    def loc(self) -> Location | _Alias | None:
        """`loc("f.py":1:2)`, `loc(#alias)`; other forms (unknown, callsite, ...) give None."""
        self.advance()
        self.expect("(")
        tok = self.tok
        result = None
        if tok.kind == "hash":
            self.advance()
            result = _Alias(tok.text, tok.pos)
        elif tok.kind == "str":
            self.advance()
            if self.accept(":"):
                line = self.integer(self.take("int", "a line number"))
                self.expect(":")
                col = self.integer(self.take("int", "a column number"))
                result = Location(tok.value, line, col)
            elif self.at("("):  # a named location wrapping a child location
                self.advance()
                result = self.loc_body()
                self.expect(")")
        else:
            self.skip_balanced()
        self.expect(")", "')' to close loc(...)")
        return result

    def loc_body(self) -> Location | _Alias | None:
        """The inside of a named location: like `loc(...)`'s, without the keyword."""
        tok = self.tok
        if tok.kind == "hash":
            self.advance()
            return _Alias(tok.text, tok.pos)
        if tok.kind == "str" and self.text.startswith(":", tok.pos + len(tok.text)):
            self.advance()
            self.expect(":")
            line = self.integer(self.take("int", "a line number"))
            self.expect(":")
            return Location(tok.value, line, self.integer(self.take("int", "a column number")))
        self.skip_balanced()
        return None

    def skip_balanced(self) -> None:
        """Skip tokens up to the ')' that closes the current group."""
        closing = {"(": ")", "[": "]", "{": "}", "<": ">"}
        stack: list[str] = []
        while stack or not self.at(")"):
            tok = self.tok
            if tok.kind == "eof":
                raise self.expected("')' to close loc(...)")
            if tok.kind == "punct" and tok.text in closing:
                stack.append(closing[tok.text])
            elif tok.kind == "punct" and tok.text in ")]}>":
                want = stack.pop() if stack else ")"
                if tok.text != want:
                    raise self.expected(f"'{want}'")
            if len(stack) > MAX_DEPTH:
                raise self.error(f"nesting deeper than {MAX_DEPTH} levels")
            self.advance()

    def resolve(self, loc: Any) -> Location | None:
        seen = set()
        while isinstance(loc, _Alias):
            if loc.name not in self.aliases:
                raise self.error(f"use of undefined location alias '{loc.name}'", loc.pos)
            if loc.name in seen:
                raise self.error(f"location alias '{loc.name}' refers to itself", loc.pos)
            seen.add(loc.name)
            loc = self.aliases[loc.name]
        return loc


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _types(types) -> str:
    return ", ".join(map(str, types))


def _fmt_ft(ft: _FuncType) -> str:
    return f"({_types(ft.inputs)}) -> ({_types(ft.outputs)})"
