"""`em.onnx.load` / `em.onnx.save`: ONNX models in and out of ember.

The `onnx` package (the optional extra `ember[onnx]`) is imported only when one of these
is called, so `import ember` never needs it.
"""

from __future__ import annotations

from .onnx_errors import OnnxImportError

__all__ = ["OnnxImportError", "load", "save"]


def load(model, *args, **kwargs):
    """An ONNX model (a path, bytes or an `onnx.ModelProto`) as an ember Module.

    `load(model, constants=None, base_dir=None, *, trainable=None)`. Weights (what feeds a
    MatMul, Gemm, Conv, a normalization's scale or bias, an embedding, or any float tensor
    of more than one element) become Params; scalar numbers of the forward stay constants.
    `trainable` picks which weights train (None/True all, False none, names or globs, or a
    predicate `(name, array) -> bool`; the rest are frozen Params). An opset before 13 is
    upgraded by onnx.version_converter. `module.import_report()` says what became of each
    initializer and why. The rule in full: `ember.interop.onnx_import`'s docstring.
    """
    from .onnx_import import load as _load

    return _load(model, *args, **kwargs)


def save(model, path, *example_inputs, **kwargs):
    """Export `model`'s forward on `example_inputs` as an ONNX file at `path`."""
    from .onnx_export import save as _save

    return _save(model, path, *example_inputs, **kwargs)
