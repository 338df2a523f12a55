"""What sits inside an op in ember's MLIR text: types, attribute values, dense elements
and locations.

`AttributeParser` reads them off a `Lexer`: `tensor<2x3xf32>` and scalar types, function
types, numbers (with `: type` suffixes and hex float bit patterns), arrays, dicts, dense
elements (splats, nested lists, `dense<"0xHEX">`) and `loc(...)`. A `loc(#alias)` is
returned as an unresolved `Alias`; the module parser resolves it once every alias is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .core import Location
from .lexer import MAX_DEPTH, Lexer, ParseError, Token, show
from .types import DTYPES, FLOAT_DTYPES, ScalarType, TensorType, Type, numpy_dtype

T = TypeVar("T")

_LAZY_SPLAT = 1 << 20  # bigger splats stay read-only broadcast views instead of allocating
_DIM = re.compile(r"([0-9]+)x")
_WORD = re.compile(r"[A-Za-z0-9_]+")
_INT_TYPES = frozenset({"i64", "i32", "i1", "index"})
# arrays as the printer writes the common ones, read in one match (`AttributeParser.array`):
# of plain ints (at most 18 digits: no int() limit to hit), or of strings without escapes
_INTS = re.compile(r"\[(-?[0-9]{1,18}(?:, -?[0-9]{1,18})*)\]")
_STRS = re.compile(r'\[("[^"\\\n\ud800-\udfff]*"(?:, "[^"\\\n\ud800-\udfff]*")*)\]')
# one `key = value` of a dict of plain ints, strings and bools (`AttributeParser.flat_dict`)
_ENTRY = re.compile(r'([A-Za-z_][A-Za-z0-9_$.]*) = '
                    r'("[^"\\\n\ud800-\udfff]*"|-?[0-9]{1,18}|true|false)(, |\})')


def _fresh(value: Any) -> Any:
    """A copy of an attribute value that shares nothing mutable with it."""
    if type(value) is list:
        return [_fresh(v) for v in value]
    if type(value) is dict:
        return {k: _fresh(v) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.flags.writeable:  # a big splat is read-only
        return value.copy()
    return value


@dataclass
class Alias:
    """A `loc(#loc3)` reference, resolved once the `#loc3 = loc(...)` lines are all read."""

    name: str
    pos: int


@dataclass(frozen=True)
class FuncType:
    inputs: tuple[Type, ...]
    outputs: tuple[Type, ...]


class AttributeParser(Lexer):
    """Types, attributes, dense elements and locations, on top of the lexer's checks."""

    def __init__(self, text: str):
        # the text of each tensor type read so far -> it (types are immutable, so shared)
        self.seen_types: dict[str, TensorType] = {}
        # the text of each function type or attribute dict read so far, up to the end of its
        # line -> (it, its length, a bound on its nesting): see once_per_text
        self.seen_func_types: dict[str, tuple[Any, int, int]] = {}
        self.seen_attrs: dict[bool, dict[str, tuple[Any, int, int]]] = {False: {}, True: {}}
        super().__init__(text)

    # -- types ----------------------------------------------------------------------------

    def type(self) -> TensorType | ScalarType:
        tok = self.tok
        if tok.kind != "id":
            raise self.expected("a type")
        if tok.text == "tensor" and self.text.startswith("<", tok.pos + 6):
            end = self.text.find(">", tok.pos) + 1  # where a well-formed one ends
            known = self.seen_types.get(self.text[tok.pos:end])
            if known is None:
                known = self.seen_types[self.text[tok.pos:end]] = self.tensor_type()
            else:
                self.lex(end)
            return known
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
            got = show(word) if word else "end of input"
            raise self.error(f"expected {what} ({', '.join(DTYPES)}), got {got}", pos)
        pos += len(word)
        if not self.text.startswith(">", pos):
            got = show(self.text[pos]) if pos < len(self.text) else "end of input"
            raise self.error(f"expected '>' to close tensor type, got {got}", pos)
        self.lex(pos + 1)
        return TensorType(tuple(dims), word)

    def type_list(self) -> list[Type]:
        self.expect("(")
        return self.comma_list(")", self.type)

    def func_type(self) -> FuncType:
        if not self.at("("):
            raise self.expected("'(' and operand types")
        return self.once_per_text(self.seen_func_types, self.read_func_type)

    def read_func_type(self) -> FuncType:
        ins = self.type_list()
        self.expect("->")
        outs = self.type_list() if self.at("(") else [self.type()]
        return FuncType(tuple(ins), tuple(outs))

    def once_per_text(self, seen: dict[str, tuple[Any, int, int]], read: Callable[[], T]) -> T:
        """`read()` from the current token; what it returned before for the same text up to
        the end of the line, if anything (read afresh where nesting could pass MAX_DEPTH).
        The ops of a graph repeat their types and attributes (79 types and 156 attribute
        dicts among the 2,462 ops of a 4-layer GPT training step): each is read once."""
        start = self.tok.pos
        eol = self.text.find("\n", start) % (len(self.text) + 1)  # -1: the end of the text
        line = self.text[start:eol]
        known = seen.get(line)
        if known is not None and self.depth + known[2] <= MAX_DEPTH:
            value, length, _ = known
            self.lex(start + length)
            fresh: T = _fresh(value)
            return fresh
        value = read()
        if self.end <= eol:  # what it read lies within `line`
            seen[line] = _fresh(value), self.end - start, line.count("[") + line.count("{")
        return value

    # -- attributes -----------------------------------------------------------------------

    def attr_dict(self, allow_func_type: bool = False) -> dict[str, Any]:
        if not self.at("{"):
            raise self.expected("'{'")
        return self.once_per_text(self.seen_attrs[allow_func_type],
                                  lambda: self.read_attr_dict(allow_func_type))

    def read_attr_dict(self, allow_func_type: bool) -> dict[str, Any]:
        flat = self.flat_dict()
        if flat is not None:
            return flat
        opening = self.expect("{")
        out: dict[str, Any] = {}
        with self.nested(opening):
            def entry() -> None:
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

    def flat_dict(self) -> dict[str, Any] | None:
        """`{id = "...", path = "..."}`: a dict of plain ints, strings and bools (a param's,
        most ops'), read one match an entry; None, having read nothing, for any other."""
        if self.depth >= MAX_DEPTH:
            return None
        text, pos, out = self.text, self.tok.pos + 1, {}
        while m := _ENTRY.match(text, pos):
            key, value = m[1], m[2]
            if key in out:  # the token-wise reading names it
                return None
            c = value[0]
            out[key] = value[1:-1] if c == '"' else value == "true" if c in "tf" else int(value)
            pos = m.end()
            if m[3] == "}":
                self.lex(pos)
                return out
        return None

    def attr(self, allow_func_type: bool = False) -> Any:
        tok = self.tok
        if tok.kind == "str":
            return self.advance().value
        if tok.kind in ("int", "float", "hex") or self.at("-"):
            return self.number()
        if self.at("["):
            return self.array()
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

    def array(self) -> list[Any]:
        """`[...]`; a flat one of plain ints or strings (`[4096, 64, 1]`, `["p0:exp_avg"]`:
        most of a training step's arrays) in one match instead of a token at a time."""
        if self.depth < MAX_DEPTH:  # else the slow path, which says the nesting is too deep
            pos = self.tok.pos
            if m := _INTS.match(self.text, pos):
                self.lex(m.end())
                return [int(x) for x in m[1].split(", ")]
            if m := _STRS.match(self.text, pos):
                self.lex(m.end())
                return m[1][1:-1].split('", "')
        with self.nested(self.advance()):
            return self.comma_list("]", self.attr)

    def literal(self) -> tuple[bool, Token, int | float]:
        """A number token after an optional '-': (negated, the token, its unsigned value)."""
        neg = self.accept("-")
        tok = self.tok
        if tok.kind not in ("int", "float", "hex"):
            raise self.expected("a number")
        self.advance()
        return neg, tok, float(tok.text) if tok.kind == "float" else self.integer(tok)

    def number(self) -> int | float:
        """`3`, `-2 : i32`, `0.5 : f64`, `1.0e-05`, `0x7FF0000000000000 : f64`."""
        neg, tok, value = self.literal()
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
            assert isinstance(value, int)  # a hex token's value is an integer
            return self.hex_float(value, dtype, tok.pos)
        if dtype in FLOAT_DTYPES:
            value = self.to_float(value, tok)
        return -value if neg else value

    def to_float(self, v: int | float, tok: Token) -> float:
        try:
            return float(v)
        except OverflowError:
            raise self.error(f"expected a number in float range, got {tok.text}", tok.pos) from None

    def hex_float(self, bits: int, dtype: str, pos: int) -> float:
        """A float from its IEEE bit pattern (`0x7FC00000` for an f32 NaN)."""
        np_dtype = numpy_dtype(dtype)
        width = 8 * np_dtype.itemsize
        if bits >= 1 << width:
            raise self.error(f"expected a {dtype} bit pattern of at most {width // 4} hex "
                             "digits", pos)
        return float(np.array(bits, f"u{np_dtype.itemsize}").view(np_dtype))

    # -- dense elements -------------------------------------------------------------------

    def dense(self) -> np.ndarray:
        """`dense<...> : tensor<...>`: splat, nested lists, `dense<>` or `dense<"0xHEX">`."""
        self.advance()
        self.expect("<")
        start = self.tok
        body: tuple[str, Any]
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

    def dense_list(self) -> tuple[list[tuple[Token, Any]], tuple[int, ...]]:
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

    def dense_elem(self) -> tuple[Token, Any]:
        tok = self.tok
        if self.at("true") or self.at("false"):
            self.advance()
            return tok, tok.text == "true"
        if tok.kind in ("int", "float", "hex") or self.at("-"):
            neg, num, value = self.literal()
            return num, (-value if neg else value)
        raise self.expected("a dense element (a number, true or false)")

    def dense_value(self, body: tuple[str, Any], t: TensorType, pos: int) -> np.ndarray:
        kind, data = body
        size = math.prod(t.shape)
        if kind == "empty":
            if size:
                raise self.error(f"expected elements for {t}, got none", pos)
            return np.zeros(t.shape, numpy_dtype(t.dtype))
        if kind == "hex":
            return self.dense_hex(data, t, size)
        if kind == "splat":
            return self.splat_array(self.convert([data], t.dtype)[0], t.shape, size)
        flat, shape = data
        if shape != t.shape:
            raise self.error(f"expected dense shape {list(t.shape)} for {t}, got {list(shape)}",
                             pos)
        return self.convert(flat, t.dtype).reshape(t.shape)

    def convert(self, elems: list[tuple[Token, Any]], dtype: str) -> np.ndarray:
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
                    bits[i] = v
            return cast
        lo, hi = (0, 1) if dtype == "i1" else (np.iinfo(np_dtype).min, np.iinfo(np_dtype).max)
        for tok, v in elems:
            if tok.kind == "float" or (isinstance(v, bool) and dtype != "i1"):
                raise self.error(f"expected an integer for {dtype}, got {tok.text}", tok.pos)
            if not lo <= v <= hi:
                raise self.error(f"expected a value in {dtype}'s range, got {v}", tok.pos)
        return np.array([v for _, v in elems], np_dtype)

    def float_elem(self, tok: Token, v: Any, dtype: str) -> float:
        if isinstance(v, bool):
            raise self.error(f"expected a number for {dtype}, got {tok.text}", tok.pos)
        if tok.kind == "hex":
            if v < 0:
                raise self.error("expected a float bit pattern without '-'", tok.pos)
            self.hex_float(v, dtype, tok.pos)  # checks the width; the bits are set as they are
            return 0.0
        return self.to_float(v, tok)

    def dense_hex(self, tok: Token, t: TensorType, size: int) -> np.ndarray:
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
        np_dtype = numpy_dtype(t.dtype)
        item = np_dtype.itemsize
        if len(raw) not in (item, item * size):
            raise self.error(f"expected {item * size} bytes of hex data for {t}, got {len(raw)}",
                             tok.pos)
        a = np.frombuffer(raw, f"<u{item}").astype(f"=u{item}").view(np_dtype)
        if len(raw) == item and size != 1:
            return self.splat_array(a[0], t.shape, size)
        return a.reshape(t.shape).copy()

    @staticmethod
    def splat_array(v: np.ndarray, shape: tuple[int, ...], size: int) -> np.ndarray:
        v = np.asarray(v)
        return np.full(shape, v, v.dtype) if size <= _LAZY_SPLAT else np.broadcast_to(v, shape)

    # -- locations ------------------------------------------------------------------------

    def opt_loc(self) -> Location | Alias | None:
        return self.loc() if self.at("loc") else None

    def loc(self) -> Location | Alias | None:
        """`loc("f.py":1:2)`, `loc(#alias)`; other forms (unknown, callsite, ...) give None."""
        self.advance()
        self.expect("(")
        tok = self.tok
        result: Location | Alias | None = None
        if tok.kind == "hash":
            self.advance()
            result = Alias(tok.text, tok.pos)
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

    def loc_body(self) -> Location | Alias | None:
        """The inside of a named location: like `loc(...)`'s, without the keyword."""
        tok = self.tok
        if tok.kind == "hash":
            self.advance()
            return Alias(tok.text, tok.pos)
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
