"""Graph transformations and the pass manager; importing this package registers every pass."""

from . import autodiff, canonicalize, cse, dce, decompose, optimizer  # noqa: F401
from .manager import PASSES, Pass, PassManager, PipelineError, parse_pipeline, register_pass

__all__ = ["PASSES", "Pass", "PassManager", "PipelineError", "parse_pipeline", "register_pass"]
