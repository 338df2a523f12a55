"""Training checkpoints: one safetensors file, written atomically, that resumes bit-exactly.

Tensors: `param/<path>` (every param and buffer; flags are modes, kept in the JSON) and
`optim/<path>/<slot>` (optimizer state). Metadata: `ember.format` (the format version),
`ember` (a JSON document: per path the ParamId, shape, dtype, kind, requires_grad and
frozen state; flag values and frozen state; the optimizer's config (kind, options, lr
schedule) and step count (the schedule's position); the state slots of each path; the RNG
counter; the caller's `extra`, where `ember train` keeps the data position and history),
and `ember.sha256`: a SHA-256 over every other metadata entry and every tensor's name,
dtype, shape and bytes, so no byte of the file goes unchecked.

A step saved mid gradient accumulation (`accumulate=k`, `step.pending > 0`) adds
`accum/<path>` tensors (the summed gradients of the pending micro-batches) and the
document's `accumulation` object (`micro_batches`, `accumulate`: k); loading it needs a
step of the same k, and resumes the cycle. Files saved with nothing pending have neither.

A step under `precision="16-mixed"` adds the document's `loss_scaler` object (`scale`,
`growth_tracker`: runtime/precision.py's LossScaler state), which a step that scales its
loss resumes from (bit-exactly: a float in JSON reads back as the same double); a step
that does not ignores it, and a file without it leaves the step's scaler as it is. A
format-2 reader that predates it refuses such a file (an unexpected key) rather than
resume with another scale.

Writing goes to a temporary file in the same directory, fsynced, then `os.replace`d
over the target, so a crash mid-write leaves the previous checkpoint intact. Loading
reads, verifies and validates the whole file into a plan (every field's type and range,
every tensor's presence, dtype and shape against the model and optimizer) before it
changes anything: a truncated or damaged file, one of another format version, or one
from a different model (the error lists the mismatched paths) raises CheckpointError and
leaves the model, optimizer and counters as they were.

Format 2 (this one) added the format key and the checksum over the metadata; format 1
files (checksum over the tensors only) are refused with a message that says so.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..files import write_atomically
from ..frontend.param import KINDS, Param, ParamId
from ..frontend.records import json_type, listing, one_line, open_safetensors, parse_json, shown
from ..ir import DTYPES, numpy_dtype
from ..passes.optimizer import SLOTS
from .backend import to_host
from .optim import Optimizer, from_config

FORMAT = 2
KEY = "ember"  # metadata: the JSON document
FORMAT_KEY = "ember.format"
SHA_KEY = "ember.sha256"
_COUNTER_LIMIT = 1 << 63  # step counters are fed to the graph as int64
_DOC = {"model": str, "params": dict, "flags": dict, "optimizer": dict, "optimizer_step": int,
        "optimizer_state": dict, "rng_step": int, "extra": dict}
_PARAM = {"id": str, "shape": list, "dtype": str, "kind": str, "requires_grad": bool,
          "frozen": bool}
_FLAG = {"value": bool, "frozen": bool}
_ACCUMULATION = {"micro_batches": int, "accumulate": int, "grads": list}
_LOSS_SCALER = {"scale": float, "growth_tracker": int}
_OPTIONAL = ("accumulation", "loss_scaler")  # keys of the document only some steps write


class CheckpointError(ValueError):
    """A checkpoint cannot be read, or does not fit the model it is loaded into."""


class _Invalid(ValueError):
    """A defect of a checkpoint's content; `load` names the file."""


# -- writing --------------------------------------------------------------------------------

def _feed(h, data: bytes | memoryview) -> None:
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def checksum(meta: dict[str, str], tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 of every metadata entry but the checksum's own and of every tensor's name,
    dtype, shape and bytes, each length-prefixed so that no two contents hash alike."""
    h = hashlib.sha256()
    for key in sorted(meta):
        if key != SHA_KEY:
            _feed(h, key.encode())
            _feed(h, meta[key].encode())
    for name in sorted(tensors):
        a = np.asarray(tensors[name], order="C")
        _feed(h, f"{name}:{a.dtype.str}:{list(a.shape)}".encode())
        _feed(h, a.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _model_params(model) -> dict[str, Param]:
    """path -> Param for every param of every kind (flags included)."""
    return dict(model.all_params())


def collect(step, extra: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and JSON document of a checkpoint of `step` (a TrainStep)."""
    model, opt = step.model, step.optimizer
    tensors, described, flags, state = {}, {}, {}, {}
    by_id = {}
    for path, p in _model_params(model).items():
        if p.kind == "flag":
            flags[path] = {"value": bool(p.val()), "frozen": p.frozen}
            continue
        tensors[f"param/{path}"] = np.asarray(p.val(), order="C")  # 0-d stays 0-d
        described[path] = {"id": str(p.id), "shape": list(p.shape), "dtype": p.dtype,
                           "kind": p.kind, "requires_grad": p.requires_grad, "frozen": p.frozen}
        by_id.setdefault(p.id, path)
    for pid, slots in opt.state.items():
        path = by_id.get(pid)
        if path is None:  # state of a param no longer in the model (replaced by from_array)
            continue
        state[path] = sorted(slots)
        for slot, value in slots.items():
            tensors[f"optim/{path}/{slot}"] = np.asarray(to_host(value), order="C")
    doc = {"model": type(model).__name__, "params": described, "flags": flags,
           "optimizer": opt.config(), "optimizer_step": opt.step_count,
           "optimizer_state": state, "rng_step": step.rng_step, "extra": extra or {}}
    pending, grads = step.accumulated() if hasattr(step, "accumulated") else (0, {})
    if pending:
        paths = []
        for pid, g in grads.items():
            paths.append(by_id[pid])
            tensors[f"accum/{by_id[pid]}"] = np.asarray(to_host(g), order="C")
        doc["accumulation"] = {"micro_batches": pending, "accumulate": step.accumulate,
                               "grads": sorted(paths)}
    if getattr(step, "scaler", None) is not None:
        doc["loss_scaler"] = step.scaler.state()
    return tensors, doc


def save(step, path: str, extra: dict | None = None) -> str:
    """Write atomically (temp file + fsync + os.replace); returns `path`."""
    from safetensors.numpy import save as st_save

    tensors, doc = collect(step, extra)
    meta = {FORMAT_KEY: str(FORMAT), KEY: json.dumps(doc)}
    meta[SHA_KEY] = checksum(meta, tensors)
    write_atomically(path, st_save(tensors, metadata=meta))
    return path


# -- reading and checking -------------------------------------------------------------------

def read(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and JSON document of a checkpoint file, verified against its checksum
    (not yet against a model)."""
    with open_safetensors(path, CheckpointError, "checkpoint") as f:
        _check_format(f.meta, path)
        tensors = {name: f.tensor(name) for name in f.header}
    if f.meta.get(SHA_KEY) != checksum(f.meta, tensors):
        raise CheckpointError(f"checkpoint {path} is damaged: its content does not match the "
                              "checksum written with it; nothing was changed")
    try:
        doc = parse_json(f.meta[KEY])
    except ValueError as e:  # only a file made to pass the checksum gets here
        raise CheckpointError(f"checkpoint {path} is damaged: {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"checkpoint {path} is damaged: its document is a JSON "
                              f"{json_type(doc)}, not a JSON object")
    return tensors, doc


def _check_format(meta: dict[str, str], path: str) -> None:
    version = meta.get(FORMAT_KEY)
    if version is None and KEY not in meta:
        raise CheckpointError(f"{path} is a safetensors file but not an ember checkpoint "
                              "(no 'ember' metadata)")
    if version is None:
        raise CheckpointError(f"checkpoint {path} has no {FORMAT_KEY}: an older ember wrote it "
                              "(format 1, whose checksum did not cover the metadata) or it is "
                              f"damaged; this ember reads format {FORMAT} only")
    if version != str(FORMAT):
        raise CheckpointError(f"checkpoint {path} has format {shown(version)}; this ember "
                              f"reads format {FORMAT} only")
    if KEY not in meta:
        raise CheckpointError(f"checkpoint {path} is damaged: it has no '{KEY}' document")


def _fields(obj: object, schema: dict[str, type], where: str) -> dict:
    """`obj`, which must be a JSON object with exactly the keys of `schema`, each of its
    type (a boolean is not a number here)."""
    if not isinstance(obj, dict):
        raise _Invalid(f"{where} is a JSON {json_type(obj)}, not a JSON object")
    if missing := [k for k in schema if k not in obj]:
        raise _Invalid(f"{where} lacks {listing(missing)}")
    if unexpected := [k for k in obj if k not in schema]:
        raise _Invalid(f"{where} has unexpected keys {listing(unexpected)}")
    for key, kind in schema.items():
        v = obj[key]
        if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
            raise _Invalid(f"{where}.{key} is a JSON {json_type(v)}, not a JSON "
                           f"{json_type(kind())}")
    return obj


def _check_doc(doc: dict) -> None:
    """Every field of the document, on its own (the model comes after)."""
    _fields({k: v for k, v in doc.items() if k not in _OPTIONAL}, _DOC, "the document")
    if "accumulation" in doc:
        info = _fields(doc["accumulation"], _ACCUMULATION, "accumulation")
        if not 0 < info["micro_batches"] < info["accumulate"]:
            raise _Invalid(f"accumulation holds {shown(str(info['micro_batches']))} "
                           f"micro-batches of {shown(str(info['accumulate']))}")
        if not all(isinstance(p, str) for p in info["grads"]):
            raise _Invalid("accumulation.grads is not an array of param paths")
    if "loss_scaler" in doc:
        scaler = _fields(doc["loss_scaler"], _LOSS_SCALER, "loss_scaler")
        if not (math.isfinite(scaler["scale"]) and scaler["scale"] > 0
                and scaler["growth_tracker"] >= 0):
            raise _Invalid(f"loss_scaler is {shown(json.dumps(scaler))}: want a finite scale "
                           "> 0 and a growth_tracker >= 0")
    for key in ("optimizer_step", "rng_step"):
        if not 0 <= doc[key] < _COUNTER_LIMIT:
            raise _Invalid(f"{key} is {shown(str(doc[key]))}, not in [0, 2**63)")
    for path, info in doc["params"].items():
        _check_param(path, _fields(info, _PARAM, f"params[{shown(path)}]"))
    for path, info in doc["flags"].items():
        _fields(info, _FLAG, f"flags[{shown(path)}]")
    for path, slots in doc["optimizer_state"].items():
        if not isinstance(slots, list) or not all(isinstance(s, str) for s in slots):
            raise _Invalid(f"optimizer_state[{shown(path)}] is not an array of slot names")
        if len(set(slots)) != len(slots):
            raise _Invalid(f"optimizer_state[{shown(path)}] names a slot twice")


def _check_param(path: str, info: dict) -> None:
    where = f"params[{shown(path)}]"
    try:
        ParamId.parse(info["id"])
    except ValueError:
        raise _Invalid(f"{where}.id is {shown(info['id'])}, not a ParamId") from None
    shape = info["shape"]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _Invalid(f"{where}.shape is not an array of sizes")
    if info["dtype"] not in DTYPES:
        raise _Invalid(f"{where}.dtype is {shown(info['dtype'])}, not one of {', '.join(DTYPES)}")
    if info["kind"] not in KINDS or info["kind"] == "flag":
        raise _Invalid(f"{where}.kind is {shown(info['kind'])}, not a kind of param or buffer")
    if info["requires_grad"] and info["kind"] != "float":
        raise _Invalid(f"{where} is a {info['kind']} param that requires gradients")


def mismatches(model, doc: dict) -> list[str]:
    """What differs between the model and a checkpoint's params: one entry per kind."""
    params = _model_params(model)
    have = {k: p for k, p in params.items() if p.kind != "flag"}
    saved = doc["params"]
    missing = [k for k in have if k not in saved]
    unexpected = [k for k in saved if k not in have]
    shapes = [f"{k} (checkpoint {saved[k]['shape']}, model {list(have[k].shape)})"
              for k in have if k in saved and list(have[k].shape) != saved[k]["shape"]]
    kinds = [f"{k} (checkpoint {saved[k]['kind']} {saved[k]['dtype']}, model {have[k].kind} "
             f"{have[k].dtype})" for k in have if k in saved
             and (saved[k]["kind"], saved[k]["dtype"]) != (have[k].kind, have[k].dtype)]
    flags = {k for k, p in params.items() if p.kind == "flag"}
    out = []
    if missing:
        out.append(f"in the model but not the checkpoint: {listing(missing)}")
    if unexpected:
        out.append(f"in the checkpoint but not the model: {listing(unexpected)}")
    if shapes:
        out.append(f"shape mismatch: {listing(shapes)}")
    if kinds:
        out.append(f"kind or dtype mismatch: {listing(kinds)}")
    if flags != set(doc["flags"]):
        out.append(f"mode flags differ: {listing(sorted(flags ^ set(doc['flags'])))}")
    return out


def _restored_optimizer(opt: Optimizer, config: dict, step_count: int) -> Optimizer:
    """A fresh optimizer of the checkpoint's config over `opt`'s param groups (the settings
    are the checkpoint's, which params each group holds the model's), which must be exactly
    what `config()` writes (so a value of the wrong type cannot slip in through a
    constructor) with finite numbers only, and whose lr at `step_count` is finite."""
    _fields(config, {"kind": str, "options": dict, "schedule": dict}, "optimizer")
    if config["kind"] != opt.kind:
        raise _Invalid(f"it was trained with {shown(config['kind'])}, not {opt.kind}: its "
                       "optimizer state does not apply")
    try:
        text = json.dumps(config, sort_keys=True, allow_nan=False)
        restored = from_config(config, like=opt)
        lr = restored.schedule(step_count)
    except (TypeError, ValueError, KeyError, OverflowError, RecursionError) as e:
        raise _Invalid(f"bad optimizer config: {type(e).__name__}: {one_line(str(e))}") from None
    if json.dumps(restored.config(), sort_keys=True) != text:
        raise _Invalid("the optimizer config is not one this ember writes")
    if not math.isfinite(lr):
        raise _Invalid(f"the lr schedule gives {lr} at step {step_count}")
    return restored


def _check_state(saved: dict, params: dict[str, Param], kind: str) -> None:
    """Optimizer state only for the model's params (each once) and in `kind`'s slots."""
    seen = set()
    for path, names in saved.items():
        p = params.get(path)
        if p is None or p.kind == "flag":
            raise _Invalid(f"optimizer state for {shown(path)}, which is not a param of the model")
        if p.id in seen:
            raise _Invalid(f"optimizer state for {shown(path)} twice (a shared param)")
        seen.add(p.id)
        if bad := [s for s in names if s not in SLOTS[kind]]:
            raise _Invalid(f"optimizer state {listing(bad)} of {shown(path)}: {kind} keeps "
                           f"{', '.join(SLOTS[kind])}")


def _check_tensor_names(tensors: dict, doc: dict) -> None:
    """Exactly the tensors the document describes: each param's, each state slot's."""
    expected = {f"param/{p}" for p in doc["params"]} | {
        f"optim/{p}/{s}" for p, names in doc["optimizer_state"].items() for s in names} | {
        f"accum/{p}" for p in doc.get("accumulation", {}).get("grads", ())}
    if missing := sorted(expected - tensors.keys()):
        raise _Invalid(f"tensors missing: {listing(missing)}")
    if unexpected := sorted(tensors.keys() - expected):
        raise _Invalid(f"unexpected tensors: {listing(unexpected)}")


def _tensor(tensors: dict, name: str, like: Param) -> np.ndarray:
    """A copy of the tensor, which must have the dtype and shape of the param `like`."""
    a = tensors[name]
    want = numpy_dtype(like.dtype)
    if a.dtype != want or a.shape != like.shape:
        raise _Invalid(f"tensor {shown(name)} is {list(a.shape)} {a.dtype}, the model's param "
                       f"is {list(like.shape)} {want}")
    return np.array(a)


@dataclass(frozen=True)
class _Plan:
    """Everything a load sets, checked: applying it cannot fail halfway."""

    params: list[tuple[Param, np.ndarray, bool, bool]]  # value, requires_grad, frozen
    optimizer: Optimizer  # a fresh one of the checkpoint's config
    state: dict[ParamId, dict[str, np.ndarray]]
    optimizer_step: int
    rng_step: int
    extra: dict
    accumulated: tuple[int, dict]  # micro-batches pending, their summed gradients by ParamId
    loss_scaler: dict | None  # the LossScaler state saved, if any


def _plan(step, tensors: dict, doc: dict) -> _Plan:
    """Check the document and tensors against `step`'s model and optimizer."""
    _check_doc(doc)
    model, params = step.model, _model_params(step.model)
    if problems := mismatches(model, doc):
        raise _Invalid(f"it (a {shown(doc['model'])}) does not fit this "
                       f"{type(model).__name__}: " + "; ".join(problems))
    restored = _restored_optimizer(step.optimizer, doc["optimizer"], doc["optimizer_step"])
    _check_state(doc["optimizer_state"], params, restored.kind)
    _check_tensor_names(tensors, doc)
    values = []
    for path, p in params.items():
        if p.kind == "flag":
            info = doc["flags"][path]
            values.append((p, np.array(info["value"]), p.requires_grad, info["frozen"]))
        else:
            info = doc["params"][path]
            values.append((p, _tensor(tensors, f"param/{path}", p), info["requires_grad"],
                           info["frozen"]))
    state = {params[path].id: {s: _tensor(tensors, f"optim/{path}/{s}", params[path])
                               for s in names}
             for path, names in doc["optimizer_state"].items()}
    return _Plan(values, restored, state, doc["optimizer_step"], doc["rng_step"], doc["extra"],
                 _accumulated(step, doc, tensors, params), doc.get("loss_scaler"))


def _accumulated(step, doc: dict, tensors: dict, params: dict[str, Param]) -> tuple[int, dict]:
    """The gradient buffers of a checkpoint saved mid-accumulation, checked against the
    step's `accumulate` and the model's params; (0, {}) when none were pending."""
    info = doc.get("accumulation")
    if info is None:
        return 0, {}
    k = getattr(step, "accumulate", 1)
    if info["accumulate"] != k:
        raise _Invalid(f"it was saved after {info['micro_batches']} of {info['accumulate']} "
                       f"accumulated micro-batches; load it into a step with accumulate="
                       f"{info['accumulate']} (this one has {k}), or save right after an "
                       "update (step.pending == 0)")
    grads = {}
    for path in info["grads"]:
        p = params.get(path)
        if p is None or p.kind != "float" or not doc["params"][path]["requires_grad"]:
            raise _Invalid(f"accumulated gradient of {shown(path)}, which is not a trainable "
                           "param of the model")
        grads[p.id] = _tensor(tensors, f"accum/{path}", p)
    return info["micro_batches"], grads


def _apply(step, plan: _Plan) -> None:
    """Set what the plan holds: plain assignments of checked values, none of which fails."""
    for p, value, requires_grad, frozen in plan.params:
        p.set_value(value)
        p.requires_grad, p.frozen = requires_grad, frozen
    opt = step.optimizer
    for k, v in vars(plan.optimizer).items():
        if k not in ("state", "step_count"):
            setattr(opt, k, v)
    opt.state = plan.state
    opt.step_count = plan.optimizer_step
    step.rng_step = plan.rng_step
    if hasattr(step, "restore_accumulated"):
        step.restore_accumulated(*plan.accumulated)
    if plan.loss_scaler is not None and getattr(step, "scaler", None) is not None:
        step.scaler.load_state(plan.loss_scaler)


def load(step, path: str, parse_extra: Callable[[dict], object] | None = None) -> object:
    """Restore `step`'s model, optimizer and counters from `path`, all or nothing; returns
    the checkpoint's `extra`, passed through `parse_extra` (checked before anything
    changes: a ValueError, TypeError or KeyError it raises refuses the file)."""
    tensors, doc = read(path)
    try:
        plan = _plan(step, tensors, doc)
        extra = plan.extra if parse_extra is None else _parsed_extra(parse_extra, plan.extra)
    except _Invalid as e:
        raise CheckpointError(f"checkpoint {path}: {e}; nothing was changed") from None
    _apply(step, plan)
    return extra


def _parsed_extra(parse: Callable[[dict], object], extra: dict) -> object:
    try:
        return parse(extra)
    except (ValueError, TypeError, KeyError) as e:
        raise _Invalid(f"its extra data is not what this run wrote ({e})") from None


__all__ = ["CheckpointError", "checksum", "collect", "load", "mismatches", "read", "save"]
