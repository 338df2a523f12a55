"""Records: a model's params and buffers in safetensors files, and PyTorch weights.

`save(model, path)` writes every param and buffer (flags are modes, not state) under its
path, each ParamId in the metadata, atomically: a temporary file in the same directory,
fsynced, then `os.replace`, so a crash mid-save leaves the old file intact.
`load(model, path, strict=True)` checks everything first (a file that is truncated,
damaged or not safetensors, damaged ParamId metadata, dtype and shape mismatches, and
under `strict` missing and unexpected keys, every one by path) and raises RecordError,
changing nothing, unless all is well; then it sets the values and restores the ParamIds,
so optimizer state keyed by id stays attached. Values are data: NaN and Inf load as
they are. The readers of damaged files at the end are shared with training checkpoints.

`load_torch` imports a PyTorch state dict (Linear weights transposed, norm `weight`/`bias`
as `gamma`/`beta`, Sequential's `layers.` segment dropped, MultiheadAttention's stacked
`in_proj_weight` split into ember's three projections, `num_batches_tracked` reported and
ignored); a file is only ever read through `torch.load(weights_only=True)`, and a damaged
one, or a value that is not an array of numbers, is a RecordError too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as _serialize

from ..files import write_atomically
from ..ir import numpy_dtype
from .attention import MultiHeadAttention
from .linear import Linear, Sequential
from .module import Module
from .norm import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from .param import ParamId, as_array

_IDS = "ember.param_ids"  # metadata key: JSON {path: ParamId string}
# the safetensors dtypes ember has (F8_*, U8, ... have no ember dtype)
_DTYPES = {"F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16", "I64": "i64",
           "I32": "i32", "BOOL": "i1"}


class RecordError(ValueError):
    """A record does not fit the model, or is not a readable record; the model is unchanged."""


def save(model: Module, path: str | os.PathLike) -> None:
    """Write the model's params and buffers to the safetensors file `path`, atomically."""
    path = os.fspath(path)
    records = model._records()
    # (np.asarray, not ascontiguousarray, which makes a 0-d param 1-d)
    tensors = {p: np.asarray(param.val(), order="C") for p, param in records}
    blob = _serialize(tensors, {"format": "ember", _IDS: json.dumps(
        {p: str(param.id) for p, param in records})})
    write_atomically(path, blob)


def load(model: Module, path: str | os.PathLike, strict: bool = True) -> Module:
    """Set the model's params and buffers from `save`'s file; returns the model.

    Any problem raises RecordError listing every dtype/shape mismatch (always) and every
    missing/unexpected key (when strict), by path, and leaves the model unchanged.
    """
    path = os.fspath(path)
    targets = model._records()
    with open_safetensors(path, RecordError, "record") as f:
        ids = _param_ids(f)
        if problems := _problems(targets, f.header, strict):
            raise RecordError(f"cannot load {path} into {type(model).__name__}: "
                              + "; ".join(problems) + " (the model is unchanged)")
        values = {p: f.tensor(p) for p, _ in targets if p in f.header}
    for p, param in targets:
        if p in values:
            param.set_value(values[p])
            if p in ids:
                param.id = ids[p]
    return model


def _param_ids(f: Archive) -> dict[str, ParamId]:
    """The ParamIds `save` wrote ({} for a safetensors file from elsewhere), all checked."""
    text = f.meta.get(_IDS)
    if text is None:
        return {}
    try:
        ids = parse_json(text)
        if not isinstance(ids, dict):
            raise ValueError(f"it is a JSON {json_type(ids)}, not a JSON object of path: "
                             "ParamId")
        return {k: _param_id(k, v, f.header) for k, v in ids.items()}
    except ValueError as e:
        raise RecordError(f"{f.path} has damaged {_IDS} metadata: {e} (the model is "
                          "unchanged)") from None


def _param_id(path: str, text: object, header: dict) -> ParamId:
    if path not in header:
        raise ValueError(f"it names {shown(path)}, which has no tensor in the file")
    if not isinstance(text, str):
        raise ValueError(f"the id of {shown(path)} is a JSON {json_type(text)}, not a string")
    try:
        return ParamId.parse(text)
    except ValueError:
        raise ValueError(f"the id of {shown(path)} is {shown(text)}, not a ParamId (13 "
                         "characters of 0-9a-v)") from None


def _problems(targets: list, header: dict, strict: bool) -> list[str]:
    """Every dtype/shape mismatch and, when strict, the missing and unexpected paths."""
    problems = []
    for p, param in targets:
        if p in header:
            dtype, shape = header[p]
            want = numpy_dtype(param.dtype)
            if shape != param.shape or dtype != want:
                problems.append(f"mismatch at {p}: the file has {list(shape)} {dtype}, "
                                f"the model has {list(param.shape)} {want}")
    if strict:
        known = {p for p, _ in targets}
        if missing := [p for p, _ in targets if p not in header]:
            problems.append(f"missing: {listing(missing)}")
        if unexpected := [k for k in header if k not in known]:
            problems.append(f"unexpected: {listing(unexpected)}")
    return problems


# -- reading files that may be damaged (records and training checkpoints) -----------------

class Archive:
    """An open safetensors file: its metadata, and per tensor the numpy dtype (or, for one
    ember has no dtype for, the safetensors name) and shape its header declares."""

    def __init__(self, f, path: str, error: type[ValueError]):
        self.path, self.error, self._file = path, error, f
        self.meta: dict[str, str] = dict(f.metadata() or {})
        self.header: dict[str, tuple[np.dtype | str, tuple[int, ...]]] = {}
        for name in f.keys():
            info = f.get_slice(name)
            code = info.get_dtype()
            self.header[name] = (numpy_dtype(_DTYPES[code]) if code in _DTYPES else code,
                                 tuple(info.get_shape()))

    def tensor(self, name: str) -> np.ndarray:
        """The tensor's data; one of a dtype ember has no dtype for is an error, not a crash
        inside safetensors (which raises TypeError or AttributeError for those)."""
        dtype, _ = self.header[name]
        if not isinstance(dtype, np.dtype):
            raise self.error(f"{self.path}: tensor {shown(name)} has dtype {dtype}, which "
                             "ember does not use; nothing was changed")
        return self._file.get_tensor(name)


@contextmanager
def open_safetensors(path: str, error: type[ValueError], what: str) -> Iterator[Archive]:
    """`safe_open` (memory-mapped: a header that claims gigabytes allocates nothing) with
    every failure to read the file raised as `error`, naming the file."""
    try:
        with safe_open(path, framework="np") as f:
            yield Archive(f, path, error)
    except OSError as e:
        raise error(f"cannot read the {what} {path}: {e.strerror or e}") from None
    except SafetensorError as e:
        raise error(f"cannot read the {what} {path}: {one_line(str(e))}; it is truncated or "
                    "damaged, or not a safetensors file, and nothing was changed") from None


def _unique(pairs: list[tuple[str, object]]) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {shown(k)}")
        out[k] = v
    return out


def parse_json(text: str) -> object:
    """`json.loads` for metadata that may be damaged: duplicate keys and nesting too deep for
    Python raise ValueError (as every other defect does), never RecursionError."""
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def json_type(v: object) -> str:
    """The JSON name of a parsed value's type, for messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(v), type(v).__name__)


def shown(s: str, limit: int = 60) -> str:
    """`s` for a one-line message: as is when short and printable, else quoted and cut."""
    if len(s) <= limit and s.isprintable():
        return s
    return repr(s[:limit]) + ("..." if len(s) > limit else "")


def one_line(text: str, limit: int = 300) -> str:
    """A library's error text (which may quote the file, newlines included) as one line."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def listing(names: list[str], limit: int = 10) -> str:
    """At most `limit` names, comma-separated, and how many more."""
    out = ", ".join(shown(n, 200) for n in names[:limit])
    return out + (f" and {len(names) - limit} more" if len(names) > limit else "")


# -- PyTorch ------------------------------------------------------------------------------

@dataclass
class TorchImport:
    """What `load_torch` did: ember paths set, and PyTorch keys ignored (with the reason)."""

    loaded: list[str] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors"]
        lines += [f"ignored {k}: {why}" for k, why in self.ignored.items()]
        return "\n".join(lines)


_NORMS = (LayerNorm, RMSNorm, GroupNorm, BatchNorm)
_QKV = ("query", "key", "value")  # stacked in this order in MultiheadAttention's in_proj


def _torch_names(model: Module) -> tuple[dict[str, list[str]], set[str]]:
    """PyTorch key -> the ember paths its tensor fills (several: split evenly along dim 0,
    in order), and the paths of Linear weights, whose PyTorch layout is transposed."""
    modules = dict(model.named_modules())
    names: dict[str, list[str]] = {}
    transposed = set()
    for path, _ in model._records():  # visit order: an attention's query, key, value
        owner_path, _, name = path.rpartition(".")
        names.setdefault(_torch_key(owner_path, name, modules), []).append(path)
        if isinstance(modules.get(owner_path), Linear) and name == "weight":
            transposed.add(path)
    return names, transposed


def _torch_key(owner_path: str, name: str, modules: dict[str, Module]) -> str:
    """The PyTorch key of the record `name` of the module at `owner_path`: norms' `gamma`
    and `beta` are `weight` and `bias`, Sequential's `layers` is no key segment, and an
    attention's query/key/value projections are MultiheadAttention's `in_proj_weight` and
    `in_proj_bias`, its output projection `out_proj`."""
    if isinstance(modules.get(owner_path), _NORMS):
        name = {"gamma": "weight", "beta": "bias"}.get(name, name)
    parts = owner_path.split(".") if owner_path else []
    segments = [seg for i, seg in enumerate(parts)
                if not (seg == "layers" and isinstance(modules.get(".".join(parts[:i])),
                                                       Sequential))]
    if parts and isinstance(modules.get(".".join(parts[:-1])), MultiHeadAttention):
        if parts[-1] in _QKV:
            segments[-1:], name = [], f"in_proj_{name}"
        elif parts[-1] == "output":
            segments[-1] = "out_proj"
    return ".".join(segments + [name])


def _apply_key_map(key: str, key_map) -> list[str]:
    """The keys `key` is renamed to: none (dropped), one, or several (split)."""
    if key_map is None:
        new = key
    elif callable(key_map):
        new = key_map(key)
    else:
        new = key
        for old in sorted(key_map, key=len, reverse=True):  # longest prefix first
            if key.startswith(old):
                new = _renamed(key_map[old], key[len(old):])
                break
    if new is None:
        return []
    if isinstance(new, str):
        return [new]
    if isinstance(new, (list, tuple)) and all(isinstance(k, str) for k in new):
        return list(new)
    raise TypeError(f"key_map gave {new!r} for {key!r}: a key, a list of keys, or None")


def _renamed(prefix, rest: str):
    """What a prefix key_map's value makes of a key: None, or each new prefix + the rest."""
    if prefix is None:
        return None
    if isinstance(prefix, str):
        return prefix + rest
    return [p + rest for p in prefix]


class _Import:
    """One `load_torch`: the values it will set, by ember path, and every problem found
    (so that all are reported together, and nothing is set unless there is none)."""

    def __init__(self, model: Module, key_map):
        self.model, self.key_map = model, key_map
        self.targets = dict(model._records())
        self.names, self.transposed = _torch_names(model)
        self.values: dict[str, np.ndarray] = {}
        self.sources: dict[str, str] = {}  # path -> the PyTorch key that gave it
        self.split: set[str] = set()  # paths given a part of a PyTorch tensor
        self.problems: list[str] = []
        self.report = TorchImport()

    def add(self, key, v) -> None:
        """Take one state dict entry: rename it, convert it, place it (or its parts)."""
        if not isinstance(key, str):
            self.problems.append(f"a key that is not a string: {shown(repr(key))}")
            return
        keys = _apply_key_map(key, self.key_map)
        if not keys:
            self.report.ignored[key] = "dropped by key_map"
            return
        if any(k.rsplit(".", 1)[-1] == "num_batches_tracked" for k in keys):
            self.report.ignored[key] = "BatchNorm's num_batches_tracked (ember uses momentum only)"
            return
        try:
            a = as_array(v)
        except (ValueError, TypeError) as e:
            self.problems.append(f"at {key}: {e}")
            return
        for new, part in zip(keys, self._parts(key, a, len(keys))):
            self._place(key, new, part, split=len(keys) > 1)

    def _parts(self, key: str, a: np.ndarray, n: int) -> list[np.ndarray]:
        """`a` split evenly along dim 0 into `n` parts (none, and a problem, if it can't be)."""
        if n == 1:
            return [a]
        if a.ndim == 0 or a.shape[0] % n:
            self.problems.append(f"at {key}: {list(a.shape)} does not split evenly along dim 0 "
                                 f"into {n} parts")
            return []
        return np.split(a, n)

    def _place(self, key: str, new: str, a: np.ndarray, split: bool) -> None:
        """Set the path(s) that the renamed key `new` names: an ember path, or a PyTorch
        key (MultiheadAttention's in_proj_weight names three)."""
        paths = self.names.get(new) or ([new] if new in self.targets else [])
        if not paths:
            self.problems.append(f"unexpected: {key}" + (f" (as {new})" if new != key else ""))
            return
        for path, part in zip(paths, self._parts(key, a, len(paths))):
            if path in self.values:
                self.problems.append(f"{path} is given twice, by {self.sources[path]} and {key}")
            self.values[path] = part.T if path in self.transposed and part.ndim == 2 else part
            self.sources[path] = key
            if split or len(paths) > 1:
                self.split.add(path)

    def check(self, strict: bool) -> None:
        """Raise RecordError listing every problem, shapes and (when strict) missing paths."""
        for p, a in self.values.items():
            if a.shape != self.targets[p].shape:
                part = f" (a part of {self.sources[p]})" if p in self.split else ""
                self.problems.append(f"mismatch at {p}: PyTorch has {list(a.shape)}{part}, the "
                                     f"model has {list(self.targets[p].shape)}")
        if strict and (missing := [p for p in self.targets if p not in self.values]):
            self.problems.append(f"missing: {listing(missing)}")
        if self.problems:
            raise RecordError(f"cannot import PyTorch weights into {type(self.model).__name__}: "
                              + "; ".join(self.problems) + " (the model is unchanged)")

    def apply(self) -> TorchImport:
        for p, a in self.values.items():
            self.targets[p].set_value(a.astype(numpy_dtype(self.targets[p].dtype)))
            self.report.loaded.append(p)
        return self.report


def _read_torch(path: str):
    """`torch.load(weights_only=True)`: plain data only, never code; any failure (a damaged
    file, a pickle asking for a class) is a RecordError."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises a different type for each kind of damage
        raise RecordError(f"cannot read the PyTorch file {path} with torch.load(weights_only="
                          f"True): {type(e).__name__}: {_reason(e)} (the model is "
                          "unchanged)") from None


def _reason(e: Exception) -> str:
    """The line of an error that says what is wrong: torch's weights_only errors put it
    last, after advice (to load with weights_only=False, which runs code) and before a
    pointer to its documentation."""
    lines = [s.strip() for s in str(e).splitlines()
             if s.strip() and not s.startswith("Check the documentation")]
    return one_line(lines[-1]) if lines else "no message"


KeyMap = (Mapping[str, str | Sequence[str] | None]
          | Callable[[str], str | Sequence[str] | None] | None)


def load_torch(model: Module, state_dict_or_file, key_map: KeyMap = None,
               strict: bool = True) -> TorchImport:
    """Import PyTorch weights into `model`; returns a TorchImport report.

    `state_dict_or_file`: a state dict (tensors or arrays) or a file that
    `torch.load(weights_only=True)` reads. Linear weights are transposed ([out, in] ->
    [d_in, d_out]); norms' `weight`/`bias` are `gamma`/`beta`; a `torch.nn.
    MultiheadAttention`'s `in_proj_weight` [3E, E] and `in_proj_bias` [3E] (q, k, v
    stacked along dim 0) are split into a MultiHeadAttention's `query`, `key` and `value`,
    its `out_proj` is `output`; `num_batches_tracked` is ignored and reported.

    `key_map` renames PyTorch keys first: a dict of prefixes (`{"encoder.": "enc."}`) or a
    callable on the whole key. Each gives, per key, None (the key is dropped), a new key,
    or a list of keys: the tensor is then split evenly along dim 0 into that many parts,
    in order, as PyTorch stacks fused weights (`{"attn.c_attn.": ["attn.q.", "attn.k.",
    "attn.v."]}` splits a fused qkv Linear's weight and bias; an uneven split is done on
    the state dict beforehand). A new key may be an ember path or a PyTorch-style key;
    either way its value is in PyTorch's layout, so a Linear weight (or a part of one)
    is transposed. Problems (shapes, unknown keys, missing paths when strict) raise
    RecordError and change nothing.
    """
    if isinstance(state_dict_or_file, (str, os.PathLike)):
        state = _read_torch(os.fspath(state_dict_or_file))
    else:
        state = state_dict_or_file
    if not isinstance(state, Mapping):
        raise RecordError(f"load_torch needs a state dict, got a {type(state).__name__}")
    job = _Import(model, key_map)
    for key, v in state.items():
        job.add(key, v)
    job.check(strict)
    return job.apply()


__all__ = ["RecordError", "TorchImport", "load", "load_torch", "save"]
