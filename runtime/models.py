"""The built-in models `ember train` offers, and loading a user's model from a file.

How a model wants the digits: as images [N, 1, 8, 8] or as rows [N, 64]. A class may say
so (`image = True` or `image = False`); otherwise its first layer tells (`wants_image`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import traceback

from .. import ir
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


def _layer_kinds() -> tuple[tuple, tuple, tuple]:
    """(layers that take images [N, C, H, W], layers that take rows [N, D], layers with
    parameters that take either): a model's first layer of the first two kinds tells how
    it wants the digits."""
    def kinds(*names: str) -> tuple:
        return tuple(getattr(nn, n) for n in names if hasattr(nn, n))

    return (kinds("Conv2d", "ConvTranspose2d", "BatchNorm2d", "MaxPool2d", "AvgPool2d",
                  "AdaptiveAvgPool2d"),
            kinds("Linear", "BatchNorm1d"),
            kinds("LayerNorm", "RMSNorm", "GroupNorm"))


def wants_image(spec: str, model: nn.Module | None = None) -> bool:
    """Does the model `spec` names (`model`, its instance, for a user's class) take the
    digits as [N, 1, 8, 8] images, or as [N, 64] rows?

    An `image` attribute (of the class or the instance) says; otherwise the first layer
    the model defines that tells, in definition order: a Conv2d (or a 2-d pool or
    BatchNorm2d) takes images, a Linear (or BatchNorm1d) rows. Layers that take either
    (activations, Dropout, LayerNorm, Flatten, ...) are passed over. A ValueError says
    what to add when the model cannot tell (its first layer with parameters is of another
    kind, e.g. a Conv1d or an Embedding, or it has no layers).
    """
    if spec in BUILTIN:
        return BUILTIN[spec].image
    if model is None:
        model = load_model(spec, (), 0)
    said = getattr(model, "image", None)
    if said is not None:
        return bool(said)
    images, rows, either = _layer_kinds()
    first = None  # the first layer with parameters of its own, of a kind that does not tell
    for path, m in model.named_modules()[1:]:
        if isinstance(m, images):
            return True
        if isinstance(m, rows):
            return False
        if not isinstance(m, either) and len(m.named_modules()) == 1 and m.named_parameters():
            first = f"its first layer {path} is a {type(m).__name__}"
            break
    name = type(model).__name__
    why = first or "it has no Conv2d or Linear layer"
    raise ValueError(f"cannot tell whether {name} takes the digits as images [N, 1, 8, 8] or "
                     f"as rows [N, 64] ({why}): add `image = True` (images) or `image = False` "
                     f"(rows) to class {name} in {spec.rpartition(':')[0]}")


def source_location(spec: str, model: nn.Module) -> ir.Location | None:
    """Where `model`, of the class `spec` names, is written, for ops that no line of it
    made (the loss): the `def forward` line of its class (in the user's file, or in this
    one for a built-in model), else the `class` line of a user's class that inherits its
    forward; None for an .onnx model."""
    if spec.endswith(".onnx"):
        return None
    cls = type(model)
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    if code is not None and (spec in BUILTIN or not code.co_filename.startswith(_HERE)):
        return ir.Location(code.co_filename, code.co_firstlineno, 0)
    path = os.path.abspath(spec.rpartition(":")[0])
    return ir.Location(path, _class_line(path, cls.__name__), 0)


def _class_line(path: str, name: str) -> int:
    """The line of `class name` in the file at `path` (1 where it cannot be found)."""
    import ast

    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return 1
    return next((n.lineno for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name),
                1)


def load_model(spec: str, input_shape: tuple[int, ...] | int, d_out: int) -> nn.Module:
    """A built-in name (`mlp`, `cnn`) or `path/to/file.py:ClassName` (constructed with no
    arguments: `input_shape` and `d_out` are the built-ins'). `input_shape` is one
    example's shape ([64] or [1, 8, 8])."""
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


def _user_class(spec: str) -> type:
    """The class `path/to/file.py:ClassName` names, the file run anew at each call."""
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
