"""The built-in models `ember train` offers, and loading a user's model from a file."""

from __future__ import annotations

import importlib.util
import os

from ..frontend import nn


class Mlp(nn.Module):
    """Linear-ReLU layers then a linear head: 64-128-10 on the digits by default."""

    def __init__(self, d_in: int = 64, hidden: tuple[int, ...] = (128,), d_out: int = 10):
        super().__init__()
        dims = [d_in, *hidden]
        self.layers = [nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
        self.head = nn.Linear(dims[-1], d_out)

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.relu(layer(x))
        return self.head(x)


BUILTIN = {"mlp": Mlp}


def load_model(spec: str, d_in: int, d_out: int) -> nn.Module:
    """A built-in name (`mlp`) or `path/to/file.py:ClassName` (constructed with no arguments)."""
    if spec in BUILTIN:
        return BUILTIN[spec](d_in=d_in, d_out=d_out)
    path, sep, cls = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise ValueError(f"unknown model {spec!r}: use one of {', '.join(BUILTIN)} "
                         "or path/to/file.py:ClassName")
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file {path} does not exist")
    mod_spec = importlib.util.spec_from_file_location("ember_user_model", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    if not hasattr(module, cls):
        raise ValueError(f"{path} has no class {cls}")
    return getattr(module, cls)()
