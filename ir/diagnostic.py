"""Errors as mlir-opt prints them: `file:line:col: error: what`, then the source line and
a caret under the column, so the reader sees the place without opening the file."""

from __future__ import annotations


def render(source: str, error: Exception, text: str | None = None) -> str:
    """The error's lines. A ParseError or VerifyError read from text carries its `line` and
    `col` (1-based); with `text`, the line it names is quoted under the message."""
    line: int | None = getattr(error, "line", None)
    col: int | None = getattr(error, "col", None)
    if line is None:
        return f"{source}: error: {error}"
    head = f"{source}:{error}"  # str(error) starts with "line:col: error: "
    lines = text.splitlines() if text is not None else []
    if not 1 <= line <= len(lines):
        return head
    quoted = lines[line - 1]
    assert col is not None, "an error that names its line names its column"
    pad = "".join(c if c == "\t" else " " for c in quoted[:max(col - 1, 0)])  # tabs align
    return f"{head}\n{quoted}\n{pad}^"
