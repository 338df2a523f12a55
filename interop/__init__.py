"""Moving models between ember and other frameworks' file formats (ONNX)."""
