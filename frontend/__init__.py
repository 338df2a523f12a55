"""What users write: modules, params, initializers, layers, symbolic tensors and tracing."""

# the modules that implement Tensor's composed methods (each registers its functions with
# tensor.implements): imported with the package, so a Tensor has them whatever was imported
from . import indexing, joining, numpy_functions, selection  # noqa: F401, E402
