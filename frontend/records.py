"""Records: a model's params and buffers in safetensors files, and PyTorch weights.

`save(model, path)` writes every param and buffer (flags are modes, not state) under its
path, each ParamId in the metadata, atomically: a temporary file in the same directory,
fsynced, then `os.replace`, so a crash mid-save leaves the old file intact.
`load(model, path, strict=True)` checks everything first (a truncated file, dtype and
shape mismatches, and under `strict` missing and unexpected keys, every one by path) and
changes nothing unless all is well; then it sets the values and restores the ParamIds,
so optimizer state keyed by id stays attached. `load_torch` imports a PyTorch state
dict (Linear weights transposed, norm `weight`/`bias` as `gamma`/`beta`, Sequential's
`layers.` segment dropped, `num_batches_tracked` reported and ignored); a file is only
ever read through `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as _serialize

from ..files import write_atomically
from ..ir import numpy_dtype
from .linear import Linear, Sequential
from .module import Module
from .norm import BatchNorm, GroupNorm, LayerNorm, RMSNorm
from .param import ParamId

_IDS = "ember.param_ids"  # metadata key: JSON {path: ParamId string}


class RecordError(ValueError):
    """A record does not fit the model, or is not a readable record; the model is unchanged."""


def save(model: Module, path: str | os.PathLike) -> None:
    """Write the model's params and buffers to the safetensors file `path`, atomically."""
    path = os.fspath(path)
    records = model._records()
    tensors = {p: np.ascontiguousarray(param.val()) for p, param in records}
    blob = _serialize(tensors, {"format": "ember", _IDS: json.dumps(
        {p: str(param.id) for p, param in records})})
    write_atomically(path, blob)


def _read(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    try:
        with safe_open(path, framework="np") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise RecordError(f"cannot read the record {path}: {e} (truncated or not a "
                          "safetensors file?); the model is unchanged") from None


def load(model: Module, path: str | os.PathLike, strict: bool = True) -> Module:
    """Set the model's params and buffers from `save`'s file; returns the model.

    Any problem raises RecordError listing every dtype/shape mismatch (always) and every
    missing/unexpected key (when strict), by path, and leaves the model unchanged.
    """
    path = os.fspath(path)
    tensors, meta = _read(path)
    try:
        ids = json.loads(meta.get(_IDS, "{}"))
        ids = {k: ParamId.parse(v) for k, v in ids.items()}
    except (ValueError, AttributeError) as e:
        raise RecordError(f"{path}: bad ParamId metadata ({e}); the model is unchanged") from None
    targets = model._records()
    problems = []
    for p, param in targets:
        if p in tensors:
            a = tensors[p]
            want = numpy_dtype(param.dtype)
            if a.shape != param.shape or a.dtype != want:
                problems.append(f"mismatch at {p}: the file has {list(a.shape)} {a.dtype}, "
                                f"the model has {list(param.shape)} {want}")
    if strict:
        known = {p for p, _ in targets}
        if missing := [p for p, _ in targets if p not in tensors]:
            problems.append(f"missing: {', '.join(missing)}")
        if unexpected := [k for k in tensors if k not in known]:
            problems.append(f"unexpected: {', '.join(unexpected)}")
    if problems:
        raise RecordError(f"cannot load {path} into {type(model).__name__}: "
                          + "; ".join(problems) + " (the model is unchanged)")
    for p, param in targets:
        if p in tensors:
            param.set_value(tensors[p])
            if p in ids:
                param.id = ids[p]
    return model


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


def _torch_names(model: Module) -> dict[str, tuple[str, bool]]:
    """PyTorch key -> (ember path, transpose?) for every record of the model."""
    modules = dict(model.named_modules())
    out = {}
    for path, _ in model._records():
        owner_path, _, name = path.rpartition(".")
        owner = modules.get(owner_path)
        if isinstance(owner, _NORMS):
            name = {"gamma": "weight", "beta": "bias"}.get(name, name)
        parts = owner_path.split(".") if owner_path else []
        torch_parts, prefix = [], ""
        for i, seg in enumerate(parts):  # Sequential's `layers` is not a torch key segment
            if not (seg == "layers" and isinstance(modules.get(prefix), Sequential)):
                torch_parts.append(seg)
            prefix = ".".join(parts[:i + 1])
        key = ".".join(torch_parts + [name])
        out[key] = (path, isinstance(owner, Linear) and name == "weight")
    return out


def _apply_key_map(key: str, key_map) -> str | None:
    if key_map is None:
        return key
    if callable(key_map):
        return key_map(key)
    for old in sorted(key_map, key=len, reverse=True):  # longest prefix first
        if key.startswith(old):
            return None if key_map[old] is None else key_map[old] + key[len(old):]
    return key


def _to_numpy(v) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor
        v = v.detach().cpu()
        if str(v.dtype) == "torch.bfloat16":
            v = v.float()
        return v.numpy()
    return np.asarray(v)


def load_torch(model: Module, state_dict_or_file, key_map: Mapping[str, str | None]
               | Callable[[str], str | None] | None = None, strict: bool = True) -> TorchImport:
    """Import PyTorch weights into `model`; returns a TorchImport report.

    `state_dict_or_file`: a state dict (tensors or arrays) or a file that
    `torch.load(weights_only=True)` reads. `key_map` renames PyTorch keys first: a dict of
    prefixes (`{"encoder.": "enc."}`, None drops the key) or a callable; a renamed key may
    be an ember path or a PyTorch-style key. Linear weights are transposed ([out, in] ->
    [d_in, d_out]); `num_batches_tracked` is ignored and reported. Problems (shape,
    unknown keys, missing paths when strict) raise RecordError and change nothing.
    """
    if isinstance(state_dict_or_file, (str, os.PathLike)):
        import torch

        state = torch.load(os.fspath(state_dict_or_file), map_location="cpu", weights_only=True)
    else:
        state = state_dict_or_file
    if not isinstance(state, Mapping):
        raise RecordError(f"load_torch needs a state dict, got a {type(state).__name__}")
    names = _torch_names(model)
    paths = {p for p, _ in model._records()}
    report, values, problems = TorchImport(), {}, []
    for key, v in state.items():
        new = _apply_key_map(key, key_map)
        if new is None:
            report.ignored[key] = "dropped by key_map"
            continue
        if new.rsplit(".", 1)[-1] == "num_batches_tracked":
            report.ignored[key] = "BatchNorm's num_batches_tracked (ember uses momentum only)"
            continue
        path, transpose = (new, False) if new in paths and new not in names else names.get(
            new, (None, False))
        if path is None:
            problems.append(f"unexpected: {key}" + (f" (as {new})" if new != key else ""))
            continue
        a = _to_numpy(v)
        values[path] = a.T if transpose and a.ndim == 2 else a
    targets = dict(model._records())
    for p, a in values.items():
        if a.shape != targets[p].shape:
            problems.append(f"mismatch at {p}: PyTorch has {list(a.shape)}, the model has "
                            f"{list(targets[p].shape)}")
    if strict and (missing := [p for p in targets if p not in values]):
        problems.append(f"missing: {', '.join(missing)}")
    if problems:
        raise RecordError(f"cannot import PyTorch weights into {type(model).__name__}: "
                          + "; ".join(problems) + " (the model is unchanged)")
    for p, a in values.items():
        targets[p].set_value(a.astype(numpy_dtype(targets[p].dtype)))
        report.loaded.append(p)
    return report


__all__ = ["RecordError", "TorchImport", "load", "load_torch", "save"]
