"""What users write: modules, params, initializers, layers, symbolic tensors and tracing."""
