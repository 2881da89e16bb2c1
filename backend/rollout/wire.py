"""The rollout worker's wire format: data only, so a peer can send values, never code.

A message is one JSON header followed by its binary parts, each a frame of `multiprocessing.connection`
(`send_bytes`/`recv_bytes`; the HMAC handshake before it is the standard library's and carries no objects):
tensors travel as raw bytes with their dtype and shape, `bytes` as themselves, images as raw pixels with
their mode and size, everything else as JSON. Dataclasses are rebuilt only from the protocol's own table
(`_TYPES`), through their constructors, with the fields they declare. Nothing is unpickled, so a client
that holds the key, or a worker someone took over, can at worst send wrong values: a `WireError` naming
what was wrong, never code run in the receiver.

Non-JSON values are tagged objects {"$": tag, ...}; plain dicts are tagged too, so no payload can pass for a tag.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from multiprocessing.connection import Connection
from typing import Any

import torch

HEADER_MAX_BYTES = 256 << 20  # the JSON part of one message; binary parts are sized by the header itself

_DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}


class WireError(ValueError):
    """A message that is not in the wire format (a type it does not carry, a malformed header or part)."""


def _types() -> dict[str, type]:
    """The dataclasses the protocol carries, by name: nothing else is ever constructed from a message."""
    from backend.rollout.base import Completion, InstanceTiming, PromptInput, RawMedia, SamplingParams
    from backend.rollout.weight_sync import BucketMeta, TensorMeta, WeightsMeta

    return {c.__name__: c for c in (Completion, InstanceTiming, PromptInput, RawMedia, SamplingParams,
                                    BucketMeta, TensorMeta, WeightsMeta)}


_TYPES: dict[str, type] = {}


def _table() -> dict[str, type]:
    if not _TYPES:
        _TYPES.update(_types())
    return _TYPES


def _encode(obj: Any, parts: list[bytes | memoryview]) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, numbers.Integral) and not isinstance(obj, torch.Tensor):  # numpy ints too
        return int(obj)
    if isinstance(obj, numbers.Real) and not isinstance(obj, torch.Tensor):
        return float(obj)
    if type(obj).__module__ == "numpy" and getattr(obj, "shape", None) == ():  # a numpy scalar (np.bool_ too)
        return _encode(obj.item(), parts)
    if isinstance(obj, list):
        if all(type(x) in (int, float) for x in obj):  # token ids, logprobs: the bulk of a generate reply
            return obj
        return [_encode(x, parts) for x in obj]
    if isinstance(obj, tuple):
        return {"$": "tuple", "v": [_encode(x, parts) for x in obj]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {"$": "dict", "v": {k: _encode(v, parts) for k, v in obj.items()}}
        return {"$": "map", "v": [[_encode(k, parts), _encode(v, parts)] for k, v in obj.items()]}
    if isinstance(obj, (set, frozenset)):
        return {"$": "set", "v": [_encode(x, parts) for x in obj]}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        parts.append(obj)
        return {"$": "bytes", "i": len(parts) - 1}
    if isinstance(obj, torch.Tensor):
        name = str(obj.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise WireError(f"a tensor of dtype {obj.dtype} is not carried")
        t = obj.detach().to("cpu").contiguous()
        parts.append(t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b"")
        return {"$": "tensor", "dtype": name, "shape": list(t.shape), "i": len(parts) - 1}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if _table().get(name) is not type(obj):
            raise WireError(f"{type(obj).__module__}.{name} is not one of the protocol's types")
        return {"$": "dc", "type": name, "v": {f.name: _encode(getattr(obj, f.name), parts)
                                              for f in dataclasses.fields(obj) if f.init}}
    if type(obj).__module__.startswith("PIL."):
        parts.append(obj.tobytes())
        return {"$": "image", "mode": obj.mode, "size": list(obj.size), "i": len(parts) - 1}
    raise WireError(f"a {type(obj).__module__}.{type(obj).__qualname__} is not carried (data only)")


def _decode(obj: Any, parts: list[bytes]) -> Any:
    if isinstance(obj, list):
        return [_decode(x, parts) for x in obj]
    if not isinstance(obj, dict):
        return obj
    tag = obj.get("$")
    try:
        if tag == "dict":
            return {k: _decode(v, parts) for k, v in obj["v"].items()}
        if tag == "map":
            return {_decode(k, parts): _decode(v, parts) for k, v in obj["v"]}
        if tag == "tuple":
            return tuple(_decode(x, parts) for x in obj["v"])
        if tag == "set":
            return set(_decode(x, parts) for x in obj["v"])
        if tag == "bytes":
            return parts[obj["i"]]
        if tag == "tensor":
            dtype, shape = _DTYPES[obj["dtype"]], [int(n) for n in obj["shape"]]
            raw = parts[obj["i"]]
            if not raw:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
        if tag == "dc":
            cls = _table()[obj["type"]]
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            fields = obj["v"]
            if not set(fields) <= names:
                raise WireError(f"{obj['type']} has no field(s) {sorted(set(fields) - names)}")
            return cls(**{k: _decode(v, parts) for k, v in fields.items()})
        if tag == "image":
            from PIL import Image

            return Image.frombytes(str(obj["mode"]), tuple(int(n) for n in obj["size"]), parts[obj["i"]])
    except WireError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
        raise WireError(f"malformed {tag!r} value: {type(err).__name__}: {err}") from err
    raise WireError(f"unknown tag {tag!r}")


def send(conn: Connection, obj: Any) -> None:
    """Send `obj` (JSON values, tensors, bytes, images, the protocol's dataclasses) as data only."""
    parts: list[bytes | memoryview] = []
    head = json.dumps({"v": _encode(obj, parts), "parts": [memoryview(p).nbytes for p in parts]}).encode()
    conn.send_bytes(head)
    for p in parts:
        conn.send_bytes(p)


def recv(conn: Connection) -> Any:
    """The next message from `conn`; WireError when it is not in the wire format (EOFError/OSError pass)."""
    head = conn.recv_bytes(HEADER_MAX_BYTES)
    try:
        msg = json.loads(head)
        sizes = [int(n) for n in msg["parts"]]
        value = msg["v"]
    except (ValueError, KeyError, TypeError) as err:
        raise WireError(f"malformed message header: {err}") from err
    parts = []
    for n in sizes:
        part = conn.recv_bytes(n + 1) if n >= 0 else b""  # recv_bytes refuses a frame longer than announced
        if len(part) != n:
            raise WireError(f"a binary part of {len(part)} bytes where the header announced {n}")
        parts.append(part)
    return _decode(value, parts)
