"""Op definitions, one module per dialect; importing this package registers them all."""

from . import ember, ember_windows, func, kernel, kernel_attention, nn  # noqa: F401
