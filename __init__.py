"""ember: a staged graph compiler for deep learning."""

import sys as _sys
from importlib import metadata as _metadata

from . import ir  # noqa: F401
from .frontend import init, nn
from .frontend.creation import arange, full, ones, zeros
from .frontend.joining import cat, chunk, split, stack, unbind
from .frontend.module import ModuleMapper, ModuleVisitor, ParamGroup
from .frontend.ops import where
from .frontend.param import Param, ParamId, seed
from .frontend.records import RecordError, load, load_torch, save
from .frontend.selection import argmax, argmin, cumsum, tril, triu
from .frontend.tensor import Tensor
from .frontend.trace import ShapeError, TensorSpec, trace
from .interop import onnx
from .runtime import distributed, optim
from .runtime.api import (  # noqa: A004
    checkpoint_strategies,
    compile,
    compile_grad,
    compile_train_step,
    recompute_strategies,
)
from .runtime.checkpoint import CheckpointError
from .runtime.data import DataLoader
from .runtime.debug import AnomalyError, ExecutionError
from .runtime.params import GradientsParams
from .runtime.summary import summary


def _version() -> str:
    """The installed distribution's version; in a checkout run without `pip install`, the one
    pyproject.toml declares (the file the distribution's version comes from)."""
    try:
        return _metadata.version("ember")
    except _metadata.PackageNotFoundError:
        import tomllib
        from pathlib import Path

        text = (Path(__file__).resolve().parent / "pyproject.toml").read_text()
        return tomllib.loads(text)["project"]["version"]


__version__ = _version()

__all__ = ["AnomalyError", "CheckpointError", "DataLoader", "ExecutionError", "GradientsParams",
           "ModuleMapper", "ModuleVisitor", "Param", "ParamGroup", "ParamId", "RecordError",
           "ShapeError", "Tensor", "TensorSpec", "arange", "argmax", "argmin", "cat",
           "checkpoint_strategies", "chunk", "compile", "compile_grad", "compile_train_step",
           "cumsum", "distributed", "full", "init", "ir", "load", "load_torch", "nn", "ones",
           "onnx", "optim", "recompute_strategies", "save", "seed", "split", "stack", "summary",
           "trace", "tril", "triu", "unbind", "where", "zeros"]

# `import ember.nn`, `from ember.nn import functional`, `import ember.optim` work as in
# PyTorch, though the modules live in frontend/ and runtime/ (the layering's homes)
_sys.modules.update({f"{__name__}.nn": nn, f"{__name__}.nn.functional": nn.functional,
                     f"{__name__}.init": init, f"{__name__}.optim": optim})
