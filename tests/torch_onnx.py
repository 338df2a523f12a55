"""A PyTorch model's ONNX bytes as the interop tests take them: torch.onnx.export's
TorchScript exporter (`dynamo=False`, which needs no onnxscript), one input `x`, one output
`y`. Import it after `pytest.importorskip("torch")`."""

import io
import warnings

import numpy as np
import torch


def torch_export(model: torch.nn.Module, x: np.ndarray, opset: int = 17,
                 fold: bool = True) -> bytes:
    """The ONNX bytes of `model` on `x`; `fold=False` without constant folding, which
    would fuse a BatchNorm into its conv (a different model to fine-tune)."""
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(x),), f, dynamo=False, opset_version=opset,
                          input_names=["x"], output_names=["y"], do_constant_folding=fold)
    return f.getvalue()
