"""The built-in models `ember train` offers, and loading a user's model from a file.

A model class says how it wants the digits: `image = True` gives [N, 1, 8, 8] (a user's
class may set it too), otherwise [N, 64].
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import traceback

from ..frontend import nn


class Mlp(nn.Module):
    """Linear-ReLU layers then a linear head: 64-128-10 on the digits by default."""

    image = False

    def __init__(self, d_in: int = 64, hidden: tuple[int, ...] = (128,), d_out: int = 10):
        super().__init__()
        dims = [d_in, *hidden]
        self.layers = [nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
        self.head = nn.Linear(dims[-1], d_out)

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.relu(layer(x))
        return self.head(x)


class Cnn(nn.Module):
    """conv 3x3 (padding 1) - ReLU - max-pool 2x2 - linear: 1x8x8 digits -> 16x4x4 -> 10."""

    image = True

    def __init__(self, in_shape: tuple[int, int, int] = (1, 8, 8), channels: int = 16,
                 d_out: int = 10):
        super().__init__()
        c, h, w = in_shape
        self.conv = nn.Conv2d(c, channels, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(channels * (h // 2) * (w // 2), d_out)

    def forward(self, x):
        x = self.pool(nn.functional.relu(self.conv(x)))
        return self.head(x.reshape(x.shape[0], -1))


def _has_conv() -> bool:
    return hasattr(nn, "Conv2d") and hasattr(nn, "MaxPool2d")


BUILTIN = {"mlp": Mlp, **({"cnn": Cnn} if _has_conv() else {})}


def wants_image(spec: str) -> bool:
    """Does the model `spec` names take [N, C, H, W] images (else flat rows)?"""
    if spec in BUILTIN:
        return BUILTIN[spec].image
    return bool(getattr(_user_class(spec), "image", False))


def load_model(spec: str, input_shape: tuple[int, ...] | int, d_out: int) -> nn.Module:
    """A built-in name (`mlp`, `cnn`) or `path/to/file.py:ClassName` (constructed with no
    arguments). `input_shape` is one example's shape ([64] or [1, 8, 8])."""
    shape = (input_shape,) if isinstance(input_shape, int) else tuple(input_shape)
    if spec == "mlp":
        return Mlp(d_in=math.prod(shape), d_out=d_out)
    if spec in BUILTIN:
        if BUILTIN[spec].image and len(shape) != 3:
            raise ValueError(f"model {spec!r} takes images [C, H, W] per example, the data "
                             f"has rows of {list(shape)}: reshape x to [N, C, H, W]")
        return BUILTIN[spec](shape, d_out=d_out)
    cls = _user_class(spec)
    with _user_code(f"{cls.__name__}() from {spec.rpartition(':')[0]}"):
        return cls()


class UserCodeError(ValueError):
    """The user's model file raised while loading or constructing its class."""


@contextlib.contextmanager
def _user_code(what: str):
    """Run the user's code: what it raises becomes one UserCodeError naming `what`, the
    error and the innermost line of the user's file it came from (the CLI prints one line
    instead of a traceback through ember)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001  (anything a user's file may raise)
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if not f.filename.startswith(_HERE)]
        at = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        raise UserCodeError(f"{what} raised {type(e).__name__}: {e}{at}") from e


_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # ember's own files


@functools.cache
def _user_class(spec: str) -> type:
    path, sep, cls = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise ValueError(f"unknown model {spec!r}: use one of {', '.join(BUILTIN)} "
                         "or path/to/file.py:ClassName")
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file {path} does not exist")
    mod_spec = importlib.util.spec_from_file_location("ember_user_model", path)
    module = importlib.util.module_from_spec(mod_spec)
    with _user_code(f"loading {path}"):
        mod_spec.loader.exec_module(module)
    if not hasattr(module, cls):
        raise ValueError(f"{path} has no class {cls}")
    return getattr(module, cls)
