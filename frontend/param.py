"""Params: lazily initialized model state, each with a stable 64-bit `ParamId`.

A Param holds a shared lazy state (shape, initializer, fans, seed) and computes its
value on the first `val()`. The value depends only on (seed in effect when the Param
was created, its id) — `np.random.default_rng([seed, id])` — never on the order of
first reads. Copies (`copy.copy`, `Module.clone`) share that state and id, so a lazy
value is computed once for all of them; `set_value` rebinds only the Param it is called
on. Inside `forward` a Param behaves as a tensor: operators and tensor methods forward
to the `ember.param` value of the active trace.
"""

from __future__ import annotations

import copy
import functools
import math
import random
import secrets
import sys
from dataclasses import dataclass

import numpy as np

from ..ir import DTYPES, dtype_of, is_float, numpy_dtype
from ..ir.types import FLOAT_DTYPES
from . import context

_ALPHABET = "0123456789abcdefghijklmnopqrstuv"
KINDS = ("float", "int", "bool", "flag", "buffer")
_NUMPY_DTYPES = {d: numpy_dtype(d) for d in DTYPES}  # set_value runs every step: no np.dtype()


class Edits:
    """How many edits of three kinds were made so far, in any tree: Module fields assigned
    or deleted (`fields`: TreeWatch walks the tree again), Params' requires_grad set
    (`requires_grad`: StateWatch reads every Param again), Params' values rebound
    (`values`, by `set_value`, `set_device_value`, a device value's first read, and a
    compiled step's own rebinding: a bound step looks at each Param's value again). The
    runtime's watches compare them on every step instead of reading everything; global
    counts, so an unrelated edit costs one more look, never a stale one."""

    fields = 0
    requires_grad = 0
    values = 0


_seed: int | None = None
_ids = random.Random()
_entropy = secrets.randbits(64)  # the value seed of unseeded processes


def seed(s: int | None) -> None:
    """Make new ParamIds and lazy initial values reproducible (None: random again)."""
    global _seed
    if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
        raise ValueError(f"seed must be a non-negative integer or None, got {s!r}")
    _seed = s
    _ids.seed(s)


def random_seed() -> int:
    """The seed of random ops traced now (dropout's `seed`): `em.seed`'s, else the process's
    entropy; 63 bits, so it prints as an i64 attribute."""
    return (_seed if _seed is not None else _entropy) & (1 << 63) - 1


@dataclass(frozen=True, order=True)
class ParamId:
    """A 64-bit id; `str()` is 13 lowercase base32 characters (0-9a-v)."""

    value: int

    def __post_init__(self):
        if not 0 <= self.value < 1 << 64:
            raise ValueError(f"ParamId must fit in 64 bits, got {self.value}")
        object.__setattr__(self, "_hash", hash(self.value))

    def __hash__(self) -> int:  # dicts of ParamIds (optimizer state) hash them on every lookup
        return self._hash

    @classmethod
    def new(cls) -> ParamId:
        """From the seeded stream after `em.seed`, else random."""
        return cls(_ids.getrandbits(64) if _seed is not None else secrets.randbits(64))

    @classmethod
    def parse(cls, s: str) -> ParamId:
        if len(s) != 13 or any(c not in _ALPHABET for c in s):
            raise ValueError(f"not a ParamId: {s!r} (want 13 characters of 0-9a-v)")
        return cls(int(s, 32))

    def __int__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return self._text

    @functools.cached_property
    def _text(self) -> str:  # cached: the runtime keys params by this string on every step
        v, out = self.value, []
        for _ in range(13):
            v, d = divmod(v, 32)
            out.append(_ALPHABET[d])
        return "".join(reversed(out))

    def __repr__(self) -> str:
        return f"ParamId('{self}')"


def _unshared(state: _State) -> bool:
    """Whether one Param alone refers to `state` (no clone shares its initial value): the
    Param's reference, this function's argument and getrefcount's."""
    return sys.getrefcount(state) <= 3


class _State:
    """What clones share: how to compute the initial value, and the value once computed."""

    __slots__ = ("shape", "dtype", "init", "fan_in", "fan_out", "seed", "value")

    def __init__(self, shape, dtype, init=None, fan_in=None, fan_out=None, value=None):
        self.shape, self.dtype, self.init = shape, dtype, init
        self.fan_in, self.fan_out = fan_in, fan_out
        self.seed = _seed if _seed is not None else _entropy
        self.value = value

    def materialize(self, pid: ParamId) -> np.ndarray:
        if self.value is None:  # deterministic, so a race only computes the same value twice
            rng = np.random.default_rng([self.seed, pid.value])
            v = np.asarray(self.init(self.shape, rng, self.fan_in, self.fan_out))
            if v.shape != self.shape:
                raise ValueError(f"initializer {self.init} made shape {list(v.shape)}, "
                                 f"not {list(self.shape)}")
            self.value = np.asarray(v, dtype=numpy_dtype(self.dtype), order="C")
        return self.value


class DeviceValue:
    """A param value that a device backend's step left in device memory: the runtime feeds
    it to the next step as it is, and `Param.val()` copies it to the host once, when read
    (a training step on a GPU copies nothing back but its loss)."""

    __slots__ = ("array", "to_host", "host")

    def __init__(self, array, to_host):
        self.array, self.to_host, self.host = array, to_host, None

    def host_copy(self, dtype: str) -> np.ndarray:
        if self.host is None:
            self.host = np.asarray(self.to_host(self.array), _NUMPY_DTYPES[dtype], order="C")
        return self.host


_TORCH_FLOATS = ("torch.float16", "torch.float32", "torch.float64")  # those numpy has


def _is_torch_tensor(v) -> bool:
    """A torch.Tensor (a torch Parameter too), told without importing torch."""
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in type(v).__mro__)


def as_array(v) -> np.ndarray:
    """A value given for a Param (an array, a torch tensor, numbers) as a numpy array of
    real numbers; ValueError or TypeError for anything else. A torch tensor is detached
    and copied to the host first (numpy refuses one that requires grad or lives on a GPU);
    its bf16 becomes ml_dtypes' bfloat16 (the same bits), float8 is widened to f32."""
    if _is_torch_tensor(v):
        v = v.detach().cpu()
        if str(v.dtype) == "torch.bfloat16":  # torch is loaded: `v` is one of its tensors
            import torch

            v = v.view(torch.int16).numpy().view(numpy_dtype("bf16"))
        elif v.is_floating_point() and str(v.dtype) not in _TORCH_FLOATS:
            v = v.float().numpy()
        else:
            v = v.numpy()
    a = np.asarray(v)
    if a.dtype.kind not in "biuf" and not is_float(a.dtype):
        raise ValueError(f"a {type(v).__name__} of {a.dtype}, not an array of real numbers")
    return a


def _default_kind(dtype: str) -> str:
    return "float" if dtype in FLOAT_DTYPES else "bool" if dtype == "i1" else "int"


class Param:
    """A model parameter (or flag, or buffer), lazy until its value is first read.

    `Param((4, 8), em.init.Normal(0, 0.02))`; layers pass `fan_in`/`fan_out` for
    fan-based initializers. `kind` is derived from the dtype ("float", "int", "bool")
    unless "flag" or "buffer" is given; only float params require gradients by default.
    """

    def __init__(self, shape, init, dtype: str = "f32", *, fan_in: int | None = None,
                 fan_out: int | None = None, kind: str | None = None,
                 requires_grad: bool | None = None, device: str = "cpu",
                 id: ParamId | None = None):
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"negative dimension in Param shape {list(shape)}")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        kind = kind or _default_kind(dtype)
        if kind not in KINDS:
            raise ValueError(f"unknown Param kind {kind!r}; expected one of {', '.join(KINDS)}")
        if kind in ("float", "int", "bool") and kind != _default_kind(dtype):
            raise ValueError(f"a {kind} Param cannot have dtype {dtype}")
        if requires_grad and kind != "float":
            raise ValueError(f"a {kind} Param cannot require gradients")
        if init is not None:
            getattr(init, "check", lambda *a: None)(shape, fan_in, fan_out)
        self.id = id if id is not None else ParamId.new()
        self.shape, self.dtype, self.kind, self.device = shape, dtype, kind, device
        self._requires_grad = kind == "float" if requires_grad is None else bool(requires_grad)
        self.frozen = False  # set by Module.freeze(): train() leaves this param's flags off
        self._state = _State(shape, dtype, init, fan_in, fan_out)
        self._value: np.ndarray | None = None  # set_value's rebinding, not shared with clones
        self._device: DeviceValue | None = None  # set_device_value's, until a host rebinding

    @classmethod
    def from_array(cls, a, requires_grad: bool | None = None, *, kind: str | None = None,
                   device: str = "cpu") -> Param:
        """A Param holding `a` (already initialized), with a new id."""
        a = np.asarray(a)
        p = cls(a.shape, None, dtype_of(a.dtype), kind=kind, requires_grad=requires_grad,
                device=device)
        p._state.value = np.array(a, order="C")  # a copy
        return p

    @classmethod
    def flag(cls, value: bool) -> Param:
        """A boolean mode switch (`Dropout.training`): read as a python bool while tracing."""
        return cls.from_array(np.array(bool(value)), kind="flag")

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._requires_grad = value
        Edits.requires_grad += 1  # a compiled step's key changes (StateWatch)

    @property
    def init(self):
        """The initializer of the lazy value (None for params made from arrays)."""
        return self._state.init

    @property
    def is_initialized(self) -> bool:
        return (self._value is not None or self._device is not None
                or self._state.value is not None)

    def initial_array(self) -> np.ndarray | None:
        """The value ember computed at init, where this Param holds it still and no clone
        shares it (a training step may then write the first update over it, as it writes
        every later one over the last), else None."""
        if self._value is None and self._device is None and self._state.value is not None \
                and _unshared(self._state):
            return self._state.value
        return None

    def held_arrays(self) -> list:
        """Every array this Param keeps alive: its value, its device copy, an initial value
        not yet dropped (what `memory_report()`'s `held_params` counts)."""
        device = self._device.array if self._device is not None else None
        return [a for a in (self._value, device, self._state.value) if a is not None]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def val(self) -> np.ndarray:
        """The value, computed on the first read; treat it as read-only (use `set_value`)."""
        if self._value is not None:
            return self._value
        if self._device is not None:
            return self._rebind(self._device.host_copy(self.dtype), self._device)
        return self._state.materialize(self.id)

    def set_device_value(self, array, to_host) -> Param:
        """Rebind this Param to a device array (a device backend's result, of this Param's
        shape and dtype), copied to the host by `to_host` only when `val()` reads it."""
        self._rebind(None, DeviceValue(array, to_host))
        return self

    def device_value(self):
        """The device array `set_device_value` left, unless the value was rebound since."""
        d = self._device
        if d is not None and (self._value is None or self._value is d.host):
            return d.array
        return None

    def set_value(self, a) -> Param:
        """Rebind this Param's value (the runtime's updates, loaded records); same shape.

        `a`: an array, a torch tensor or numbers (`as_array`). It is kept without a copy
        when its dtype and layout already fit: don't mutate it.
        """
        if (type(a) is np.ndarray and a.shape == self.shape and a.flags.c_contiguous
                and a.dtype == _NUMPY_DTYPES[self.dtype]):  # a compiled step's result
            self._rebind(a, None)
            return self
        a = as_array(a)
        if a.shape != self.shape:
            raise ValueError(f"param {self.id}: value of shape {list(a.shape)} does not match "
                             f"its shape {list(self.shape)}")
        self._rebind(np.asarray(a, dtype=numpy_dtype(self.dtype), order="C"), None)
        return self

    @property
    def data(self) -> np.ndarray:
        """PyTorch's spelling: the value (`val()`); assigning an array or a torch tensor
        sets it (`set_value`)."""
        return self.val()

    @data.setter
    def data(self, a) -> None:
        self.set_value(a)

    def _rebind(self, value: np.ndarray | None, device) -> np.ndarray | None:
        """The Param's methods rebind its value here, counted (`Edits.values`); a bound
        training step rebinds its Params itself and counts once for all of them. While
        the count is the one its last step left, it skips reading them."""
        self._value, self._device = value, device
        Edits.values += 1
        self._forget_initial()
        return value

    def _forget_initial(self) -> None:
        """Drop the initial value once the Param holds another, unless a clone shares it
        (copies share `_state`): a trained model keeps one copy of each param, not two."""
        if self._value is not None and self._state.value is not None \
                and _unshared(self._state):
            self._state.value = None

    def map(self, fn) -> Param:
        """A Param holding `fn(self.val())`, with the same id, kind and requires_grad."""
        v = np.asarray(fn(self.val()))
        p = copy.copy(self)
        p.dtype = self.dtype if v.dtype == numpy_dtype(self.dtype) else dtype_of(v.dtype)
        p.shape, p._value, p._device = v.shape, None, None
        p._state = _State(v.shape, p.dtype, value=np.asarray(v, order="C"))
        return p

    def to_device(self, device: str) -> Param:
        """The same Param (shared state, id, requires_grad) targeting `device`."""
        p = copy.copy(self)
        p.device = device
        return p

    def tensor(self):
        """This Param as a symbolic tensor of the active trace (its `ember.param` op)."""
        return context.current().param_tensor(self)

    def __bool__(self) -> bool:
        if self.kind != "flag":
            raise TypeError(f"a {self.kind} Param has no truth value (only flags do)")
        return bool(self.val())

    # Tensor behaviour: == and != compare symbolically while tracing, by identity otherwise.
    def __eq__(self, other):
        t = context.active()
        return NotImplemented if t is None else t.param_tensor(self) == other

    def __ne__(self, other):
        t = context.active()
        return NotImplemented if t is None else t.param_tensor(self) != other

    __hash__ = object.__hash__

    # numpy's functions and ufuncs on a Param while tracing are its tensor's (NEP 18, 13)
    def __array_function__(self, func, types, args, kwargs):
        t = context.active()
        if t is None:
            return NotImplemented
        tensor = t.param_tensor(self)
        types = tuple(type(tensor) if issubclass(k, Param) else k for k in types)
        return tensor.__array_function__(func, types, args, kwargs)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        t = context.active()
        if t is None:
            return NotImplemented
        inputs = tuple(t.param_tensor(x) if isinstance(x, Param) else x for x in inputs)
        return t.param_tensor(self).__array_ufunc__(ufunc, method, *inputs, **kwargs)

    @property
    def T(self):
        return self.tensor().T

    def __repr__(self) -> str:
        state = "initialized" if self.is_initialized else "lazy"
        grad = ", requires_grad" if self.requires_grad else ""
        return (f"Param(id={self.id}, shape={list(self.shape)}, dtype={self.dtype}, "
                f"kind={self.kind}, device={self.device}{grad}, {state})")


def Parameter(data, requires_grad: bool = True) -> Param:  # noqa: N802  (torch's name)
    """torch's `nn.Parameter(tensor)`: a Param holding a copy of `data` (an array, a torch
    tensor, `em.zeros(1, 1, d)`), trained unless `requires_grad=False`."""
    return Param.from_array(as_array(data), requires_grad)


def _forward(name):
    def method(self, *args, **kwargs):
        return getattr(self.tensor(), name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


for _name in ("add radd sub rsub mul rmul truediv rtruediv matmul rmatmul pow rpow neg lt le gt "
              "ge getitem").split():
    setattr(Param, f"__{_name}__", _forward(f"__{_name}__"))
for _name in ("reshape transpose sum mean max exp log relu sigmoid tanh sqrt abs astype min amax "
              "amin argmax argmin var std cumsum view unsqueeze squeeze flatten unflatten permute "
              "expand repeat split chunk unbind masked_fill clamp sign").split():
    setattr(Param, _name, _forward(_name))
