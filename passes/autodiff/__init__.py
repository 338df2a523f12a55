"""Reverse-mode automatic differentiation: the `autodiff` pass and its rule tables."""

from .backward import Autodiff, AutodiffError, trainable
from .rules import RULES, Rule, bound_class

__all__ = ["Autodiff", "AutodiffError", "RULES", "Rule", "bound_class", "trainable"]
