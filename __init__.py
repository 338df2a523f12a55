"""ember: a staged graph compiler for deep learning."""

from . import ir  # noqa: F401
