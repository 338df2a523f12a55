"""`em.onnx.load` / `em.onnx.save`: ONNX models in and out of ember.

The `onnx` package (the optional extra `ember[onnx]`) is imported only when one of these
is called, so `import ember` never needs it.
"""

from __future__ import annotations

from .onnx_errors import OnnxImportError

__all__ = ["OnnxImportError", "load", "save"]


def load(model, *args, **kwargs):
    """An ONNX model (a path or an `onnx.ModelProto`) as an ember Module."""
    from .onnx_import import load as _load

    return _load(model, *args, **kwargs)


def save(model, path, *example_inputs, **kwargs):
    """Export `model`'s forward on `example_inputs` as an ONNX file at `path`."""
    from .onnx_export import save as _save

    return _save(model, path, *example_inputs, **kwargs)
