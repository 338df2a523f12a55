"""Module: a tree of submodules and Params, walked only by `visit` and `map` (burn's semantics).

Fields are classified by type, in assignment order: a Module is a submodule, a Param a
parameter, a list/tuple/dict holding modules or params (at any depth) a container,
None an absent optional, anything else a constant that is never visited. ModuleList and
ModuleDict (PyTorch's containers, containers.py) are Modules whose elements are walked as
a plain list's or dict's, so their paths are the same (`layers.0.weight`). Every query and
state transition below (counting, records, train/valid/freeze, devices, clone, repr) is a
visitor or a mapper over these two walks; there is no other tree traversal.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from itertools import chain
from operator import is_

import numpy as np

from ..ir import numpy_dtype
from . import context
from .param import Edits, Param, as_array

PARAM_KINDS = ("float", "int", "bool")  # what named_parameters() and num_params() count


class ModuleVisitor:
    """Read-only walk: `model.visit(v)` calls these in field order; every default is a no-op.

    `container_type` is "Struct:<Class>" for a field of a module of that class, or "List",
    "Tuple", "Dict" for a container element (named by its index or key). `visit_module`
    (ember's addition) sees each submodule right after its `enter_module`.
    """

    def enter_module(self, name: str, container_type: str) -> None: ...
    def exit_module(self, name: str, container_type: str) -> None: ...
    def visit_module(self, module: Module) -> None: ...
    def visit_float(self, param: Param) -> None: ...
    def visit_int(self, param: Param) -> None: ...
    def visit_bool(self, param: Param) -> None: ...
    def visit_flag(self, param: Param) -> None: ...
    def visit_buffer(self, param: Param) -> None: ...


class ModuleMapper:
    """Rebinding walk: `model.map(m)` replaces every param with what `map_<kind>` returns."""

    def enter_module(self, name: str, container_type: str) -> None: ...
    def exit_module(self, name: str, container_type: str) -> None: ...
    def map_float(self, param: Param) -> Param: return param
    def map_int(self, param: Param) -> Param: return param
    def map_bool(self, param: Param) -> Param: return param
    def map_flag(self, param: Param) -> Param: return param
    def map_buffer(self, param: Param) -> Param: return param


class ParamGroup:
    """Params chosen by path: `ParamGroup.from_predicate("encoder.")` or a callable on paths."""

    def __init__(self, predicate: Callable[[str], bool]):
        self.predicate = predicate

    @classmethod
    def from_predicate(cls, p: str | Callable[[str], bool]) -> ParamGroup:
        if isinstance(p, str):
            return cls(lambda path: p in path)
        if callable(p):
            return cls(p)
        raise TypeError(f"a ParamGroup predicate is a path substring or a callable, got {p!r}")

    def matches(self, path: str) -> bool:
        return bool(self.predicate(path))


# -- classifying field values -------------------------------------------------------------

def _items(v) -> Iterator[tuple[str, object, str]]:
    """(name, element, container type) of a list/tuple/dict; nothing for anything else."""
    if isinstance(v, dict):
        yield from ((str(k), x, "Dict") for k, x in v.items())
    elif isinstance(v, (list, tuple)):
        kind = "List" if isinstance(v, list) else "Tuple"
        yield from ((str(i), x, kind) for i, x in enumerate(v))


def _holds(v) -> bool:
    """Is `v` a Module or Param, or a container holding one at any depth?"""
    return isinstance(v, (Module, Param)) or any(_holds(x) for _, x, _ in _items(v))


def _hides(v) -> bool:
    """Does a value that is not walked (a set, dict keys, a dataclass) hold a Module/Param?"""
    if isinstance(v, (set, frozenset)):
        return any(_holds(x) or _hides(x) for x in v)
    if isinstance(v, dict) and any(_holds(k) for k in v):
        return True
    if is_dataclass(v) and not isinstance(v, type):
        return any(_holds(x) or _hides(x) for x in (getattr(v, f.name) for f in fields(v)))
    return any(_hides(x) for _, x, _ in _items(v))


def _visit(value, name: str, container: str, visitor: ModuleVisitor) -> None:
    visitor.enter_module(name, container)
    if isinstance(value, Module):
        visitor.visit_module(value)
        value.visit(visitor)
    elif isinstance(value, Param):
        getattr(visitor, f"visit_{value.kind}")(value)
    else:
        for key, x, kind in _items(value):
            if _holds(x):
                _visit(x, key, kind, visitor)
    visitor.exit_module(name, container)


def _map(value, name: str, container: str, mapper: ModuleMapper):
    mapper.enter_module(name, container)
    if isinstance(value, Module):
        value.map(mapper)
    elif isinstance(value, Param):
        new = getattr(mapper, f"map_{value.kind}")(value)
        if not isinstance(new, Param):
            raise TypeError(f"{type(mapper).__name__}.map_{value.kind} returned "
                            f"{type(new).__name__}, not a Param")
        value = new
    elif isinstance(value, list):  # lists and dicts are rebound in place, as users hold them
        for i, x in enumerate(value):
            if _holds(x):
                value[i] = _map(x, str(i), "List", mapper)
    elif isinstance(value, dict):
        for k, x in value.items():
            if _holds(x):
                value[k] = _map(x, str(k), "Dict", mapper)
    else:
        xs = [_map(x, k, "Tuple", mapper) if _holds(x) else x for k, x, _ in _items(value)]
        value = type(value)(*xs) if hasattr(value, "_fields") else tuple(xs)  # namedtuple
    mapper.exit_module(name, container)
    return value


_END = (object(),)  # ends each container in TreeWatch's snapshot: no tree holds it


class TreeWatch:
    """Says cheaply whether a module tree may have changed shape since the watch was made,
    so that the runtime walks the tree once instead of on every step.

    A change is any Module field assigned or deleted anywhere (`Edits.fields`, a global
    count, so an unrelated tree's edit costs one more walk, never a stale one) or a list or
    dict held in the tree's fields changed in place (each is kept with a snapshot of its
    items). Param values, flags and requires_grad are not structure: callers read them.

    The check runs on every step, so it is one C-level pass: the elements of every list,
    and the keys and values of every dict (live views), each container followed by `_END`,
    compared by identity with the snapshot. A container that grew or shrank puts an
    element where the snapshot has `_END` or the other way round, so lengths need no check
    of their own; a key replaced by an equal one only costs a walk.
    """

    def __init__(self, root: Module):
        self._count = Edits.fields
        views: list = []
        for _, module in root.visit(_Paths(root)).modules:
            for name in module.__dict__.get("_fields", ()):
                _collect(module.__dict__.get(name), views)
        self._views = tuple(views)
        self._items = list(chain(*views))

    def unchanged(self) -> bool:
        return self._count == Edits.fields and all(map(is_, chain(*self._views), self._items))


def _collect(value, views: list) -> None:
    """What TreeWatch compares of every list and dict in `value`, at any depth: the list,
    or the dict's keys and values views, then `_END`."""
    if isinstance(value, list):
        views += (value, _END)
    elif isinstance(value, dict):
        views += (value.keys(), _END, value.values(), _END)
    for _, x, _ in _items(value):
        _collect(x, views)


# -- the visitors and mappers behind Module's methods -------------------------------------

class _Paths(ModuleVisitor):
    """Every submodule and every Param (all kinds), with its dotted path, in visit order."""

    def __init__(self, root: Module):
        self.names: list[str] = []
        self.modules: list[tuple[str, Module]] = [("", root)]
        self.params: list[tuple[str, Param]] = []

    def enter_module(self, name, container_type):
        self.names.append(name)

    def exit_module(self, name, container_type):
        self.names.pop()

    def visit_module(self, module):
        self.modules.append((".".join(self.names), module))

    def _param(self, param):
        self.params.append((".".join(self.names), param))

    visit_float = visit_int = visit_bool = visit_flag = visit_buffer = _param


class _ToDevice(ModuleMapper):
    def __init__(self, device: str):
        self.device = device

    def _move(self, param):
        return param.to_device(self.device)

    map_float = map_int = map_bool = map_flag = map_buffer = _move


@dataclass
class _Node:
    name: str
    container: str
    module: Module | None = None
    param: Param | None = None
    children: list[_Node] = field(default_factory=list)

    def count(self, kinds=PARAM_KINDS) -> int:
        own = self.param.size if self.param is not None and self.param.kind in kinds else 0
        return own + sum(c.count(kinds) for c in self.children)


class _Tree(ModuleVisitor):
    """The module tree as nodes, for `repr`."""

    def __init__(self, root: Module):
        self.stack = [_Node("", "", module=root)]

    def enter_module(self, name, container_type):
        self.stack.append(_Node(name, container_type))

    def exit_module(self, name, container_type):
        node = self.stack.pop()
        self.stack[-1].children.append(node)

    def visit_module(self, module):
        self.stack[-1].module = module

    def _param(self, param):
        self.stack[-1].param = param

    visit_float = visit_int = visit_bool = visit_flag = visit_buffer = _param


def _render(node: _Node) -> list[str]:
    """PyTorch-style lines; a module's own params show in its config, a container's as Params."""
    n, b = node.count(), node.count(("buffer",))
    note = f"  # {n:,} params" if n else ""
    note += (f", {b:,} buffers" if n else f"  # {b:,} buffers") if b else ""
    if node.param is not None:
        p = node.param
        kind = "" if p.kind in PARAM_KINDS else f", {p.kind}"
        return [f"Param({list(p.shape)}, {p.dtype}{kind}){note}"]
    if node.module is not None:
        head, extra = type(node.module).__name__, node.module.extra_repr()
        kids = [c for c in node.children if c.param is None]
    else:
        head, extra, kids = node.children[0].container, "", node.children
    if not kids:
        return [f"{head}({extra}){note}"]
    inner = [f"  {extra}"] if extra else []
    for c in kids:
        first, *rest = _render(c)
        inner += [f"  ({c.name}): {first}"] + [f"  {line}" for line in rest]
    return [f"{head}(", *inner, f"){note}"]


class Module:
    """Base of every layer and model: assign fields in `__init__`, define `forward`."""

    def __init__(self):
        object.__setattr__(self, "_fields", {})

    def __setattr__(self, name: str, value) -> None:
        if not isinstance(getattr(type(self), name, None), property):
            current = self.__dict__.get(name)
            if isinstance(current, Param) and not (
                    value is None or isinstance(value, (Param, Module))):
                self._set_param_value(name, current, value)
                return
            if _hides(value):
                raise TypeError(f"{type(self).__name__}.{name}: a {type(value).__name__} that "
                                "holds a Module or Param is never visited; use a list, tuple or "
                                "dict (with string or int keys)")
            self.__dict__.setdefault("_fields", {})[name] = None  # an ordered set of names
        Edits.fields += 1
        object.__setattr__(self, name, value)

    def _set_param_value(self, name: str, param: Param, value) -> None:
        """`lin.weight = array` (or a torch tensor): the parameter's new value, as `.data =`
        sets it, keeping its id, so it goes on training; a constant in its place would
        silently stop training. A value that is not numbers, or not of the parameter's
        shape, is refused and changes nothing."""
        where = f"{type(self).__name__}.{name}"
        try:
            a = as_array(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"cannot assign a {type(value).__name__} to {where}, a parameter: "
                            f"{e} (an array or a torch tensor sets its value; a Param replaces "
                            "it; None drops it)") from None
        if a.shape != param.shape:
            hint = (" (ember's Linear weights are [d_in, d_out], PyTorch's [out, in]: assign "
                    "its transpose)" if a.ndim == 2 and a.shape == param.shape[::-1] else "")
            raise ValueError(f"cannot assign a value of shape {list(a.shape)} to {where}, a "
                             f"parameter of shape {list(param.shape)}{hint}")
        param.set_value(a)

    def __delattr__(self, name: str) -> None:
        self.__dict__.get("_fields", {}).pop(name, None)
        Edits.fields += 1
        object.__delattr__(self, name)

    def _children(self) -> Iterator[tuple[str, object]]:
        """(name, value) of the fields that are walked, in assignment order."""
        for name in self.__dict__.get("_fields", ()):
            value = self.__dict__.get(name)
            if _holds(value):
                yield name, value
            elif _hides(value):
                raise TypeError(f"{type(self).__name__}.{name}: a {type(value).__name__} "
                                "holds a Module or Param but is never visited")

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward")

    def __call__(self, *args, **kwargs):
        t = context.active()
        if t is None:
            return self.forward(*args, **kwargs)
        with t.scope(self):  # so a shape error names this module's path
            return self.forward(*args, **kwargs)

    # -- the two walks ----------------------------------------------------------------------

    def _entries(self) -> Iterator[tuple[str, object, str]]:
        """(name, value, container type) of what `visit` and `map` walk, in order: the walked
        fields, each a field of this class. ModuleList and ModuleDict walk their elements
        first, as a list's or a dict's, so their paths are a plain container's."""
        owner = f"Struct:{type(self).__name__}"
        for name, value in self._children():
            yield name, value, owner

    def visit(self, visitor: ModuleVisitor) -> ModuleVisitor:
        """Walk the tree read-only; returns the visitor."""
        for name, value, container in self._entries():
            _visit(value, name, container, visitor)
        return visitor

    def map(self, mapper: ModuleMapper) -> Module:
        """Rebind every param to what the mapper returns; returns this module."""
        for name, value, container in list(self._entries()):
            new = _map(value, name, container, mapper)  # a Module maps in place: never new
            if new is not value:
                Edits.fields += 1
                object.__setattr__(self, name, new)
        return self

    # -- queries ------------------------------------------------------------------------------

    def all_params(self) -> list[tuple[str, Param]]:
        """(path, Param) of every Param of every kind (flags and buffers too), in visit order."""
        return self.visit(_Paths(self)).params

    def named_modules(self) -> list[tuple[str, Module]]:
        """(path, module) of this module (path "") and every submodule."""
        return self.visit(_Paths(self)).modules

    def params_by_id(self) -> dict[str, Param]:
        """Every Param of every kind by `str(param.id)` (what `ember.param`'s `id` names)."""
        out: dict[str, Param] = {}
        for _, p in self.all_params():
            out.setdefault(str(p.id), p)
        return out

    def _unique(self, kinds) -> list[tuple[str, Param]]:
        seen, out = set(), []
        for path, p in self.all_params():
            if p.kind in kinds and p.id not in seen:
                seen.add(p.id)
                out.append((path, p))
        return out

    def named_parameters(self) -> list[tuple[str, Param]]:
        """(path, Param) of float, int and bool params; a shared param once."""
        return self._unique(PARAM_KINDS)

    def parameters(self) -> list[Param]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self) -> list[tuple[str, Param]]:
        return self._unique(("buffer",))

    def num_params(self) -> int:
        """Elements of all parameters, from their shapes: initializes nothing."""
        return sum(p.size for _, p in self.named_parameters())

    def num_buffers(self) -> int:
        return sum(p.size for _, p in self.named_buffers())

    def devices(self) -> list[str]:
        return sorted({p.device for _, p in self.all_params()})

    def _records(self) -> list[tuple[str, Param]]:
        """What records hold: every param and buffer under every path (flags are modes)."""
        return [(path, p) for path, p in self.all_params() if p.kind != "flag"]

    def state_dict(self) -> dict[str, np.ndarray]:
        """path -> a copy of the value (materializes lazy params)."""
        return {path: p.val().copy() for path, p in self._records()}

    def load_state_dict(self, state: dict, strict: bool = True) -> Module:
        """Set values by path; on any problem raise ValueError and change nothing.

        Shape mismatches are always errors; missing and unexpected paths only when strict.
        """
        targets = dict(self._records())
        values = {k: as_array(state[k]) for k in targets if k in state}  # torch tensors too
        problems = [f"shape mismatch at {k}: got {list(v.shape)}, the model has "
                    f"{list(targets[k].shape)}" for k, v in values.items()
                    if v.shape != targets[k].shape]
        if strict:
            if missing := [k for k in targets if k not in state]:
                problems.append(f"missing: {', '.join(missing)}")
            if unexpected := [k for k in state if k not in targets]:
                problems.append(f"unexpected: {', '.join(unexpected)}")
        if problems:
            raise ValueError(f"load_state_dict into {type(self).__name__}: "
                             + "; ".join(problems))
        converted = {k: v.astype(numpy_dtype(targets[k].dtype)) for k, v in values.items()}
        for k, v in converted.items():
            targets[k].set_value(v)
        return self

    # -- state transitions (in place; each returns this module) -------------------------------

    def _params(self, *kinds: str) -> list[Param]:
        return [p for _, p in self.all_params() if not kinds or p.kind in kinds]

    def train(self, mode: bool = True) -> Module:
        """Flags on (training behaviour), except in frozen modules; gradients untouched.
        `train(False)` is `valid()`, as PyTorch's `train(mode)`."""
        if not mode:
            return self.valid()
        for p in self._params("flag"):
            if not p.frozen:
                p.set_value(True)
        return self

    def valid(self) -> Module:
        """Flags off (evaluation behaviour); gradients untouched."""
        for p in self._params("flag"):
            p.set_value(False)
        return self

    def eval(self) -> Module:  # noqa: A003  (PyTorch's name for valid())
        """`valid()`, under the name PyTorch users reach for."""
        return self.valid()

    def freeze(self) -> Module:
        """No gradients and flags off, and `train()` leaves them off until `unfreeze()`."""
        for p in self._params():
            p.frozen = True
            if p.kind == "flag":
                p.set_value(False)
            p.requires_grad = False
        return self

    def unfreeze(self) -> Module:
        """Gradients on again and `train()` allowed again (flags stay off until `train()`)."""
        for p in self._params():
            p.frozen = False
            p.requires_grad = p.kind == "float"
        return self

    def set_require_grad(self, requires_grad: bool) -> Module:
        for p in self._params("float"):
            p.requires_grad = bool(requires_grad)
        return self

    def no_grad(self) -> Module:
        """No gradients; flags untouched."""
        return self.set_require_grad(False)

    def set_require_grad_group(self, group: ParamGroup, requires_grad: bool) -> Module:
        for path, p in self.all_params():
            if p.kind == "float" and group.matches(path):
                p.requires_grad = bool(requires_grad)
        return self

    def to_device(self, device: str) -> Module:
        """Every param targets `device` (a lazy one is still not materialized)."""
        return self.map(_ToDevice(device))

    def clone(self) -> Module:
        """A copy of the tree whose params are copies sharing lazy state and ids."""
        memo = {id(p): copy.copy(p) for _, p in self.all_params()}
        return copy.deepcopy(self, memo)

    # -- repr ---------------------------------------------------------------------------------

    def extra_repr(self) -> str:
        """The layer's configuration, shown in `repr` (`d_in=4, d_out=8, bias=True`)."""
        return ""

    def __repr__(self) -> str:
        return "\n".join(_render(self.visit(_Tree(self)).stack[0]))
