"""ember's IR: types, values, operations, graphs, op definitions, text, verification."""

from . import dialects  # noqa: F401  (registers every op)
from .builder import Builder
from .core import Block, Graph, Location, Operation, Region, Value
from .opdef import OPS, InferenceError, OpDef, VerifyError, has_trait, lookup
from .types import DTYPES, ScalarType, TensorType, dtype_of, is_float, numpy_dtype
from .verifier import verify

__all__ = ["Block", "Builder", "DTYPES", "Graph", "InferenceError", "Location", "OPS", "OpDef",
           "Operation", "Region", "ScalarType", "TensorType", "Value", "VerifyError",
           "dtype_of", "has_trait", "is_float", "lookup", "numpy_dtype", "verify"]
