"""Training checkpoints: one safetensors file, written atomically, that resumes bit-exactly.

Tensors: `param/<path>` (every param and buffer; flags are modes, kept in the JSON) and
`optim/<path>/<slot>` (optimizer state). The safetensors metadata key `ember` holds a
JSON document: per path the ParamId, shape, dtype, kind, requires_grad and frozen state;
flag values (train/valid); the optimizer's config (kind, options, lr schedule), its step
count (the schedule's position); the RNG counter; a SHA-256 of the tensor data; and the
caller's `extra` (`ember train` keeps the data position and history there).

Writing goes to a temporary file in the same directory, fsynced, then `os.replace`d
over the target, so a crash mid-write leaves the previous checkpoint intact. Loading
checks everything before changing anything: a truncated or damaged file, or one from a
different model (the error lists the mismatched paths), raises CheckpointError and
leaves the model and optimizer as they were.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ..files import write_atomically
from .backend import to_host

FORMAT = 1
KEY = "ember"


class CheckpointError(ValueError):
    """A checkpoint cannot be read, or does not fit the model it is loaded into."""


def _digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(f"{name}:{a.dtype.str}:{list(a.shape)};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _model_params(model) -> dict[str, object]:
    """path -> Param for every param of every kind (flags included)."""
    return dict(model.all_params())


def collect(step, extra: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and JSON document of a checkpoint of `step` (a TrainStep)."""
    model, opt = step.model, step.optimizer
    params = _model_params(model)
    tensors, described, flags, state = {}, {}, {}, {}
    by_id = {}
    for path, p in params.items():
        if p.kind == "flag":
            flags[path] = {"value": bool(p.val()), "frozen": p.frozen}
            continue
        tensors[f"param/{path}"] = np.ascontiguousarray(p.val())
        described[path] = {"id": str(p.id), "shape": list(p.shape), "dtype": p.dtype,
                           "kind": p.kind, "requires_grad": p.requires_grad, "frozen": p.frozen}
        by_id.setdefault(p.id, path)
    for pid, slots in opt.state.items():
        path = by_id.get(pid)
        if path is None:  # state of a param no longer in the model (replaced by from_array)
            continue
        state[path] = sorted(slots)
        for slot, value in slots.items():
            tensors[f"optim/{path}/{slot}"] = np.ascontiguousarray(to_host(value))
    doc = {"format": FORMAT, "model": type(model).__name__, "params": described,
           "flags": flags, "optimizer": opt.config(), "optimizer_step": opt.step_count,
           "optimizer_state": state, "rng_step": step.rng_step, "extra": extra or {},
           "sha256": _digest(tensors)}
    return tensors, doc


def save(step, path: str, extra: dict | None = None) -> str:
    """Write atomically (temp file + fsync + os.replace); returns `path`."""
    from safetensors.numpy import save as st_save

    tensors, doc = collect(step, extra)
    data = st_save(tensors, metadata={KEY: json.dumps(doc)})
    write_atomically(path, data)
    return path


def read(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and JSON document of a checkpoint file, verified."""
    from safetensors.numpy import load as st_load

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or e}") from None
    try:
        tensors = st_load(data)
        meta = _metadata(data)
    except Exception as e:  # noqa: BLE001  (safetensors raises its own error types)
        raise CheckpointError(f"checkpoint {path} is truncated or damaged ({len(data)} bytes): "
                              f"{e}") from None
    if KEY not in meta:
        raise CheckpointError(f"{path} is a safetensors file but not an ember checkpoint "
                              "(no 'ember' metadata)")
    doc = json.loads(meta[KEY])
    if doc.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {doc.get('format')}; "
                              f"this ember reads format {FORMAT}")
    if _digest(tensors) != doc.get("sha256"):
        raise CheckpointError(f"checkpoint {path} is damaged: its tensor data does not match "
                              "the checksum written with it")
    return tensors, doc


def _metadata(data: bytes) -> dict:
    n = int.from_bytes(data[:8], "little")
    if len(data) < 8 + n:
        raise ValueError(f"header of {n} bytes but the file has {len(data)}")
    return json.loads(data[8:8 + n]).get("__metadata__", {})


def mismatches(model, doc: dict) -> list[str]:
    """What differs between the model and a checkpoint's params: one line per kind."""
    params = _model_params(model)
    have = {k: p for k, p in params.items() if p.kind != "flag"}
    saved = doc["params"]
    missing = [k for k in have if k not in saved]
    unexpected = [k for k in saved if k not in have]
    shapes = [f"{k} (checkpoint {saved[k]['shape']}, model {list(have[k].shape)})"
              for k in have if k in saved and list(have[k].shape) != saved[k]["shape"]]
    flags = {k for k, p in params.items() if p.kind == "flag"}
    out = []
    if missing:
        out.append(f"in the model but not the checkpoint: {', '.join(missing)}")
    if unexpected:
        out.append(f"in the checkpoint but not the model: {', '.join(unexpected)}")
    if shapes:
        out.append(f"shape mismatch: {', '.join(shapes)}")
    if flags != set(doc["flags"]):
        diff = sorted(flags ^ set(doc["flags"]))
        out.append(f"mode flags differ: {', '.join(diff)}")
    return out


def load(step, path: str) -> dict:
    """Restore `step`'s model, optimizer and counters from `path`; returns `extra`."""
    from .optim import from_config

    tensors, doc = read(path)
    model, opt = step.model, step.optimizer
    problems = mismatches(model, doc)
    if problems:
        raise CheckpointError(f"checkpoint {path} (a {doc.get('model')}) does not fit this "
                              f"{type(model).__name__}:\n  " + "\n  ".join(problems))
    saved_opt = doc["optimizer"]
    if saved_opt["kind"] != opt.kind:
        raise CheckpointError(f"checkpoint {path} was trained with {saved_opt['kind']}, not "
                              f"{opt.kind}: its optimizer state does not apply")
    restored = from_config(saved_opt)
    params = _model_params(model)
    state = {}
    for p_path, slots in doc["optimizer_state"].items():
        state[params[p_path].id] = {s: np.array(tensors[f"optim/{p_path}/{s}"]) for s in slots}
    # everything checked: now change things
    for p_path, p in params.items():
        if p.kind == "flag":
            p.set_value(doc["flags"][p_path]["value"])
            p.frozen = doc["flags"][p_path]["frozen"]
            continue
        info = doc["params"][p_path]
        p.set_value(np.array(tensors[f"param/{p_path}"]))
        p.requires_grad, p.frozen = info["requires_grad"], info["frozen"]
    for k, v in vars(restored).items():
        if k not in ("state", "step_count"):
            setattr(opt, k, v)
    opt.state = state
    opt.step_count = int(doc["optimizer_step"])
    step.rng_step = int(doc["rng_step"])
    return doc.get("extra", {})


__all__ = ["CheckpointError", "collect", "load", "mismatches", "read", "save"]
