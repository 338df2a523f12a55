"""Graph transformations and the pass manager; importing this package registers every pass."""

from . import (  # noqa: F401
    autocast,
    autodiff,
    bucket_grads,
    canonicalize,
    cse,
    dce,
    decompose,
    fuse,
    layout,
    low_precision_attention,
    low_precision_gemm,
    low_precision_storage,
    memory,
    optimizer,
    pad_mask,
    recompute,
    widen,
)
from .manager import PASSES, Pass, PassManager, PipelineError, parse_pipeline, register_pass

__all__ = ["PASSES", "Pass", "PassManager", "PipelineError", "parse_pipeline", "register_pass"]
