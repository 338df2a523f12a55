"""Damage for the safetensors files ember reads (records, training checkpoints): the header
taken apart and put back, a checkpoint re-sealed after an edit (so that the edit reaches
the checks behind the checksum), and a seeded mutator of bytes and of JSON."""

import copy
import json
import random

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from ember.runtime.checkpoint import KEY, SHA_KEY, checksum

# stand-ins that json.dumps cannot make: replaced by raw JSON text after dumping
_DEEP, _HUGE = "\x00deep", "\x00huge"
_RAW = {_DEEP: "[" * 100_000 + "]" * 100_000,  # past the recursion limit (3.13 parses 5000)
        _HUGE: "9" * 5000}  # past the digits limit
ODD = [None, True, False, 0, -1, 1.5, 2 ** 64, -2 ** 63 - 1, 10 ** 30, 1e308, float("nan"),
       float("inf"), "", "x", "layers.0.weight", "0123456789abc", "\u00e9\u2603\U0001f600",
       "\ud800", "a\nb", [], {}, [1, "a"], {"a": {"b": [None]}}, [[[[[[[[0]]]]]]]], _DEEP, _HUGE]
_ITEM = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "U8": 1, "BOOL": 1,
         "F8_E4M3": 1}


def split(data: bytes) -> tuple[dict, bytes]:
    """A safetensors file's header (parsed) and body."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header: dict | str, body: bytes) -> bytes:
    text = header if isinstance(header, str) else json.dumps(header)
    raw = text.encode()
    return len(raw).to_bytes(8, "little") + raw + body


def metadata(data: bytes) -> dict[str, str]:
    return dict(split(data)[0].get("__metadata__", {}))


def reseal(data: bytes, meta: dict[str, str] | None = None,
           tensors: dict[str, np.ndarray] | None = None) -> bytes:
    """The checkpoint `data` with `meta` and `tensors` in place of its own, and a checksum
    that fits them: what a file made to pass the checksum looks like."""
    meta = dict(metadata(data) if meta is None else meta)
    tensors = st_load(data) if tensors is None else tensors
    meta[SHA_KEY] = checksum(meta, tensors)
    return st_save(tensors, metadata=meta)


def dumps(value, raw: dict[str, str] = _RAW) -> str:
    """json.dumps, then the stand-ins replaced by their raw text."""
    text = json.dumps(value)
    for stand_in, replacement in raw.items():
        text = text.replace(json.dumps(stand_in), replacement)
    return text


def _places(root) -> list[tuple[object, object]]:
    """(container, key) of every value inside `root`."""
    out, todo = [], [root]
    while todo:
        node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out.append((node, k))
            if isinstance(v, (dict, list)):
                todo.append(v)
    return out


def edit_json(value, rng: random.Random) -> str:
    """`value` (parsed JSON) with one random defect, as JSON text: a value deleted, replaced
    by one of another type, nested deeper, a key added or duplicated, or the whole replaced."""
    value = copy.deepcopy(value)
    places = _places(value)
    op = rng.choice(["delete", "replace", "replace", "nest", "add", "duplicate", "root"])
    if op == "root" or not places:
        return dumps(rng.choice(ODD))
    node, key = rng.choice(places)
    if op == "delete":
        del node[key]
    elif op == "replace":
        node[key] = rng.choice(ODD)
    elif op == "nest":
        node[key] = rng.choice([[node[key]], {"value": node[key]}])
    else:
        dicts = [value] + [n[k] for n, k in places if isinstance(n[k], dict)]
        target = rng.choice(dicts) if isinstance(value, dict) else None
        if target is None:
            return dumps(rng.choice(ODD))
        if op == "duplicate" and target:  # a second entry of a key, under a stand-in name
            target["\x00dup"] = rng.choice(ODD)
            return dumps(value, {**_RAW, "\x00dup": json.dumps(rng.choice(list(target)[:-1]))})
        target[rng.choice(["zz", "\u2603", "id", "shape"])] = rng.choice(ODD)
    return dumps(value)


def retype(data: bytes, rng: random.Random) -> bytes:
    """One tensor of the file declared with another dtype and shape of the same byte size
    (so safetensors itself still accepts it)."""
    header, body = split(data)
    name = rng.choice([k for k in header if k != "__metadata__"])
    entry = header[name]
    start, end = entry["data_offsets"]
    fits = [d for d, size in _ITEM.items() if (end - start) % size == 0 and d != entry["dtype"]]
    if not fits:
        return data
    dtype = rng.choice(fits)
    n = (end - start) // _ITEM[dtype]
    same = _ITEM[dtype] == _ITEM[entry["dtype"]]
    entry["dtype"] = dtype
    entry["shape"] = rng.choice([entry["shape"][::-1], [n]] if same else [[n]])
    return join(header, body)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: flips (often in the header), a cut, garbage at the end, or a
    header length that lies."""
    n = int.from_bytes(data[:8], "little")
    op = rng.choice(["flip", "flip", "cut", "extend", "length"])
    if op == "cut":
        return data[:rng.randrange(len(data))]
    if op == "extend":
        return data + rng.randbytes(rng.randint(1, 64))
    if op == "length":
        claim = rng.choice([0, 1, n - 1, n + 1, 2 ** 31, 2 ** 40, 2 ** 64 - 1])
        return claim.to_bytes(8, "little") + data[8:]
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        hi = 8 + n if rng.random() < 0.6 else len(out)
        out[rng.randrange(hi)] ^= rng.randint(1, 255)
    return bytes(out)


def mutate_header(data: bytes, rng: random.Random) -> bytes:
    """The safetensors header with one JSON defect (tensor entries and metadata alike)."""
    header, body = split(data)
    return join(edit_json(header, rng), body)


def mutate_metadata(data: bytes, rng: random.Random, key: str) -> bytes:
    """The JSON document in metadata `key` with one defect (checksum left as it was)."""
    header, body = split(data)
    header["__metadata__"][key] = edit_json(json.loads(header["__metadata__"][key]), rng)
    return join(header, body)


def mutate_document(data: bytes, rng: random.Random) -> bytes:
    """The checkpoint's document with one defect, re-sealed: it passes the checksum."""
    meta = metadata(data)
    meta[KEY] = edit_json(json.loads(meta[KEY]), rng)
    return reseal(data, meta)


def mutate_tensors(data: bytes, rng: random.Random) -> bytes:
    """A checkpoint's tensor dropped, added, or given another dtype or shape; re-sealed."""
    tensors = st_load(data)
    name = rng.choice(sorted(tensors))
    op = rng.choice(["drop", "add", "dtype", "shape"])
    if op == "drop":
        del tensors[name]
    elif op == "add":
        tensors[name + rng.choice(["/x", "", "_"])] = np.zeros(3, np.float32)
    elif op == "dtype":
        tensors[name] = tensors[name].astype(rng.choice([np.float64, np.int32, np.float16]))
    else:
        tensors[name] = tensors[name].reshape(-1)[:-1] if tensors[name].size else np.zeros(1)
    return reseal(data, tensors=tensors)
