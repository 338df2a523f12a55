"""PyTorch's module containers, ModuleList and ModuleDict: Modules whose elements
`Module.visit` and `map` walk as a plain list's or dict's (`_entries`), so their paths are
the same (`layers.0.weight`) and `load_torch` maps torch's keys one to one."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping

from .module import Module
from .param import Edits


def _edited() -> None:
    """A container's elements changed: a structure edit, counted as a field assignment
    (TreeWatch reads only fields, and a container keeps its elements outside them)."""
    Edits.fields += 1


def _module(owner: str, where: object, value) -> Module:
    if not isinstance(value, Module):
        raise TypeError(f"{owner} holds Modules; {where} is a {type(value).__name__}")
    return value


class ModuleList(Module):
    """PyTorch's ModuleList: modules in order, indexed (negative too), sliced (a new
    ModuleList of the same modules), iterated and grown as a list is.

    Its elements are walked as a plain list's ("List", named by index), so the paths are
    `layers.0.weight` as with a plain list and as in PyTorch, and `load_torch` maps keys
    one to one. Unlike a plain list it is a Module itself: `model.layers.freeze()`,
    `.parameters()`, `named_modules()` and `repr` see it.
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        object.__setattr__(self, "_modules", [])  # not a field: walked by _entries
        if modules is not None:
            self.extend(modules)

    def _entries(self):
        yield from ((str(i), m, "List") for i, m in enumerate(self._modules))
        yield from super()._entries()

    def _index(self, i) -> int:
        """`i` as an index into the list, negatives counted from the end (IndexError else)."""
        n, i = len(self._modules), operator.index(i)
        if not -n <= i < n:
            raise IndexError(f"ModuleList index {i} is out of range for {n} modules")
        return i % n

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ModuleList(self._modules[i])
        return self._modules[self._index(i)]

    def __setitem__(self, i, module: Module) -> None:
        self._modules[self._index(i)] = _module("ModuleList", f"element {i}", module)
        _edited()

    def __delitem__(self, i) -> None:
        del self._modules[i if isinstance(i, slice) else self._index(i)]
        _edited()

    def append(self, module: Module) -> ModuleList:
        return self.insert(len(self._modules), module)

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        new = [_module("ModuleList", f"element {i}", m) for i, m in enumerate(modules)]
        self._modules.extend(new)
        _edited()
        return self

    def insert(self, index: int, module: Module) -> ModuleList:
        self._modules.insert(operator.index(index), _module("ModuleList", "the new element",
                                                             module))
        _edited()
        return self

    def pop(self, index: int = -1) -> Module:
        module = self[index]
        del self[index]
        return module

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList([*self._modules, *other])


class ModuleDict(Module):
    """PyTorch's ModuleDict: modules by string key, in insertion order, with a dict's
    `[key]`, `in`, `len`, iteration (over keys), `keys`/`values`/`items`, `update`, `pop`,
    and attribute access (`blocks.attn`) as in PyTorch.

    Its elements are walked as a plain dict's ("Dict", named by key), so the paths are
    `blocks.attn.weight` as in PyTorch. Keys are strings without "." (a dot would split a
    path), as PyTorch requires.
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]
                 | None = None):
        super().__init__()
        object.__setattr__(self, "_modules", {})  # not a field: walked by _entries
        if modules is not None:
            self.update(modules)

    def _entries(self):
        yield from ((k, m, "Dict") for k, m in self._modules.items())
        yield from super()._entries()

    def __getattr__(self, name: str):  # only for names that are not attributes
        modules = self.__dict__.get("_modules", {})  # absent while copy.deepcopy rebuilds
        if name in modules:
            return modules[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute or key {name!r}")

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key) -> bool:
        return key in self._modules

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.update({key: module})

    def __delitem__(self, key: str) -> None:
        del self._modules[key]
        _edited()

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        """Add or replace modules, from a mapping or (key, module) pairs; checks them all
        before changing anything."""
        pairs = list(modules.items() if hasattr(modules, "items") else modules)
        checked = {_key(k): _module("ModuleDict", f"key {k!r}", m) for k, m in pairs}
        self._modules.update(checked)
        _edited()

    def pop(self, key: str) -> Module:
        module = self._modules.pop(key)
        _edited()
        return module

    def clear(self) -> None:
        self._modules.clear()
        _edited()


def _key(k) -> str:
    if not isinstance(k, str):
        raise TypeError(f"ModuleDict keys are strings, got a {type(k).__name__}: {k!r}")
    if not k or "." in k:
        raise ValueError(f"ModuleDict key {k!r}: a key is a non-empty path segment, without "
                         "'.'")
    return k
