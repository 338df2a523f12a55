"""The lexer of ember's MLIR text: tokens, their positions, and ParseError.

`Lexer` holds the text and its current token and offers the checks every level of the
parser uses (`at`, `accept`, `expect`, `take`, comma lists, a nesting limit); its errors
name the line and column. `decode` turns a file's bytes into text the same way.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

MAX_DEPTH = 100  # nesting of regions, arrays and dicts: deeper input is an error, not a crash

# One match: the spaces and comments before a token, then the token. A string without
# escapes (or lone surrogates) is read here too; any other string, and a character no token
# starts with, match `slow` (empty): `Lexer.lex_string` reads the one, the other is an error.
_TOKEN = re.compile(r"""(?:\s+|//[^\n]*)*(?:
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
  | (?P<str>"[^"\\\n\ud800-\udfff]*")
  | (?P<eof>\Z)
  | (?P<slow>))""", re.VERBOSE)
_ESCAPES = {'"': 0x22, "\\": 0x5C, "n": 0x0A, "t": 0x09}


def show(text: str) -> str:
    """A token for an error message: quoted, with line ends and tabs named."""
    if text.isspace():
        return {"\n": "end of line", "\t": "a tab"}.get(text, repr(text))
    return f"'{text}'"


class ParseError(ValueError):
    """Malformed text: `str(e)` is `"<line>:<col>: error: <what was expected>"`."""

    def __init__(self, message: str, line: int, col: int):
        self.message, self.line, self.col = message, line, col
        super().__init__(f"{line}:{col}: error: {message}")


@dataclass(slots=True)
class Token:
    kind: str  # pct at caret hash float hex int id arrow punct str eof
    text: str
    pos: int
    value: Any = None

def decode(data: bytes) -> str:
    """The text of a file's bytes: what is not UTF-8 is a ParseError at its line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1
        col = len(data[start:e.start].decode("utf-8")) + 1
        raise ParseError(f"expected UTF-8 text, got byte 0x{data[e.start]:02X}",
                         data.count(b"\n", 0, e.start) + 1, col) from None


class Lexer:
    """The text and its current token `tok`, with the checks every level of the parser
    uses; `depth` counts the nesting that `nested` limits."""

    def __init__(self, text: str):
        self.text = text
        self.lines = [0] + [m.end() for m in re.finditer("\n", text)]
        self.depth = 0
        self.lex(0)

    def error(self, message: str, pos: int | None = None) -> ParseError:
        return ParseError(message, *self.line_col(self.tok.pos if pos is None else pos))

    def line_col(self, pos: int) -> tuple[int, int]:
        """The 1-based line and column of offset `pos`."""
        line = bisect.bisect_right(self.lines, pos)
        return line, pos - self.lines[line - 1] + 1

    def expected(self, what: str, tok: Token | None = None) -> ParseError:
        tok = tok or self.tok
        got = "end of input" if tok.kind == "eof" else show(tok.text)
        return self.error(f"expected {what}, got {got}", tok.pos)

    def lex(self, pos: int) -> None:
        """Make the token at `pos` (after spaces and comments) the current one: one match
        of one regex. `end` is where the text read so far ends (`pos`)."""
        self.end = pos
        m = _TOKEN.match(self.text, pos)
        # `slow` matches the empty string, so there is always a match, and its group is named
        assert m is not None and m.lastgroup is not None
        kind = m.lastgroup
        if kind == "slow":
            pos = m.end()
            if self.text[pos] != '"':
                raise self.error(f"unexpected character '{self.text[pos]}'", pos)
            self.tok = self.lex_string(pos)
        else:
            text = m[kind]
            self.tok = Token(kind, text, m.end() - len(text),
                             text[1:-1] if kind == "str" else None)

    def lex_string(self, start: int) -> Token:
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
        return Token("str", text[start:i + 1], start, value)

    def advance(self) -> Token:
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

    def expect(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            raise self.expected(what or f"'{text}'")
        return self.advance()

    def take(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.expected(what)
        return self.advance()

    def integer(self, tok: Token) -> int:
        try:
            return int(tok.text, 16 if tok.kind == "hex" else 10)
        except ValueError:
            raise self.error("integer literal too long", tok.pos) from None

    @contextmanager
    def nested(self, opening: Token) -> Iterator[None]:
        """Counts nesting depth so that hostile input cannot exhaust Python's stack."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nesting deeper than {MAX_DEPTH} levels", opening.pos)
        try:
            yield
        finally:
            self.depth -= 1

    def comma_list(self, close: str, item: Callable[[], T]) -> list[T]:
        """`item (',' item)* close`, or just `close`."""
        out: list[T] = []
        if not self.accept(close):
            out.append(item())
            while self.accept(","):
                out.append(item())
            self.expect(close, f"',' or '{close}'")
        return out
