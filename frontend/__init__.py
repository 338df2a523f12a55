"""What users write: modules, params, initializers, layers, symbolic tensors and tracing."""

# first: Tensor's methods use modules (indexing, joining, selection) that import it back
from . import tensor  # noqa: F401, E402
