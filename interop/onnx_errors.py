"""The one error of ONNX import, kept apart so that the reader, the op table and the
importer raise the same class without importing each other."""

from __future__ import annotations


class OnnxImportError(ValueError):
    """An ONNX model ember cannot import: a damaged file, a malformed graph, or nodes whose
    ops or attributes ember does not support (all of them listed in one message)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = list(problems or [])
        super().__init__(message + "".join(f"\n  {p}" for p in self.problems))
