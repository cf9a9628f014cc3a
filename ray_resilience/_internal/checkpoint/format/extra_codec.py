"""Safe encoding of a rank's `extra` state: JSON-safe values and plain tensors, never pickle.

Layout: magic, header length, a JSON header with tagged containers ({"L"} list, {"T"} tuple,
{"D"} dict, {"X": i} tensor i), then the raw tensor bytes of allow-listed dtypes.
"""

from __future__ import annotations

import ctypes
import json
import math
import struct
from typing import Any

import torch

from ray_resilience.checkpoint.errors import CheckpointCorruptError, CheckpointStateError

MAGIC = b"RRXTRA1\n"
_HEADER = struct.Struct("<Q")
_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in (
        "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
        "bool", "complex64", "complex128")
}
_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in _DTYPES.items()}
_SCALARS = (type(None), bool, int, float, str)


class ExtraSnapshot:
    """`extra` taken apart at save time (a tagged tree and copied tensor bytes), so `encode`
    may run later on another thread."""

    __slots__ = ("_values", "_tensors")

    def __init__(self, values: dict, tensors: list[tuple[str, list[int], bytes]]) -> None:
        self._values, self._tensors = values, tensors

    def encode(self) -> bytes:
        blobs, table, offset = [], [], 0
        for dtype, shape, raw in self._tensors:
            table.append({"dtype": dtype, "shape": shape, "offset": offset, "nbytes": len(raw)})
            blobs.append(raw)
            offset += len(raw)
        header = json.dumps({"values": self._values, "tensors": table}, allow_nan=True).encode()
        return b"".join([MAGIC, _HEADER.pack(len(header)), header, *blobs])


def snapshot_extra(extra: dict[str, Any]) -> ExtraSnapshot:
    """Checks and copies `extra` now; CheckpointStateError (a TypeError) names the bad key."""
    if not isinstance(extra, dict):
        raise CheckpointStateError("<extra>", f"must be a dict, got {type(extra).__name__}")
    tensors: list[tuple[str, list[int], bytes]] = []
    return ExtraSnapshot(_encode_dict(extra, "", tensors), tensors)


def encode_extra(extra: dict[str, Any]) -> bytes:
    """Serializes `extra`; raises CheckpointStateError (a TypeError) naming the offending key."""
    return snapshot_extra(extra).encode()


def _encode_dict(value: dict, path: str, tensors: list[tuple[str, list[int], bytes]]) -> dict:
    out = {}
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str):
            raise CheckpointStateError(where, f"dict keys must be str, got {type(key).__name__}")
        out[key] = _encode(item, where, tensors)
    return {"D": out}


def _encode(value: Any, path: str, tensors: list[tuple[str, list[int], bytes]]) -> Any:
    if isinstance(value, _SCALARS):
        if isinstance(value, int) and not isinstance(value, bool) and type(value) is not int:
            raise CheckpointStateError(path,
                                       f"int subclass {type(value).__name__} is not JSON-safe")
        return value
    if isinstance(value, torch.Tensor):
        return {"X": _add_tensor(value, path, tensors)}
    if isinstance(value, list):
        return {"L": [_encode(v, f"{path}[{i}]", tensors) for i, v in enumerate(value)]}
    if isinstance(value, tuple):
        return {"T": [_encode(v, f"{path}[{i}]", tensors) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        return _encode_dict(value, path, tensors)
    raise CheckpointStateError(
        path, f"values must be JSON-safe (None, bool, int, float, str, list, tuple, dict with str "
              f"keys) or torch tensors; got {type(value).__module__}.{type(value).__qualname__}")


def _add_tensor(value: torch.Tensor, path: str, tensors: list[tuple[str, list[int], bytes]]) -> int:
    if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
        raise CheckpointStateError(
            path, f"only plain tensors are allowed, got {type(value).__name__} "
                  "(put sharded state in the model or optimizer)")
    name = _NAMES.get(value.dtype)
    if name is None:
        raise CheckpointStateError(path, f"tensor dtype {value.dtype} is not supported; "
                                         f"use one of {sorted(_DTYPES)}")
    tensors.append((name, list(value.shape), _raw_bytes(value)))
    return len(tensors) - 1


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's values in C order, copied now: one memcpy for a plain contiguous CPU
    tensor (this runs at every save), the torch route otherwise."""
    if (tensor.is_cpu and tensor.layout is torch.strided and tensor.is_contiguous()
            and not tensor.is_conj() and not tensor.is_neg()):
        nbytes = tensor.numel() * tensor.element_size()
        return ctypes.string_at(tensor.data_ptr(), nbytes) if nbytes else b""
    cpu = tensor.detach().to("cpu", copy=True).resolve_conj().resolve_neg().contiguous()
    return cpu.reshape(-1).view(torch.uint8).numpy().tobytes() if cpu.numel() else b""


def decode_extra(data: bytes | memoryview, *, path: str) -> dict[str, Any]:
    """Inverse of `encode_extra`. Raises CheckpointCorruptError naming `path` on bad input."""
    data = memoryview(data)
    try:
        if bytes(data[:len(MAGIC)]) != MAGIC:
            raise ValueError("bad magic bytes")
        (length,) = _HEADER.unpack_from(data, len(MAGIC))
        start = len(MAGIC) + _HEADER.size
        if start + length > len(data):
            raise ValueError("header runs past the end of the file")
        header = json.loads(bytes(data[start:start + length]).decode())
        body = data[start + length:]
        tensors = [_decode_tensor(entry, body) for entry in header["tensors"]]
        result = _decode(header["values"], tensors)
    except CheckpointCorruptError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, struct.error, RuntimeError) as exc:
        raise CheckpointCorruptError(path, f"extra state is malformed ({exc})") from exc
    if not isinstance(result, dict):
        raise CheckpointCorruptError(path, "extra state is not a dict")
    return result


def _decode_tensor(entry: dict, body: memoryview) -> torch.Tensor:
    dtype = _DTYPES[entry["dtype"]]
    shape = [int(s) for s in entry["shape"]]
    offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
    itemsize = torch.empty((), dtype=dtype).element_size()
    if offset < 0 or offset + nbytes > len(body) or nbytes != math.prod(shape) * itemsize:
        raise ValueError(f"tensor bytes [{offset}, {offset + nbytes}) do not fit shape {shape}")
    out = torch.empty(shape, dtype=dtype)
    if nbytes:
        out.reshape(-1).view(torch.uint8).copy_(
            torch.frombuffer(bytearray(body[offset:offset + nbytes]), dtype=torch.uint8))
    return out


def _decode(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(f"unexpected encoded value {str(value)[:80]!r}")
    (tag, inner), = value.items()
    if tag == "D" and isinstance(inner, dict):
        return {str(k): _decode(v, tensors) for k, v in inner.items()}
    if tag in ("L", "T") and isinstance(inner, list):
        items = [_decode(v, tensors) for v in inner]
        return items if tag == "L" else tuple(items)
    if tag == "X" and type(inner) is int and 0 <= inner < len(tensors):
        return tensors[inner]
    raise ValueError(f"unknown tag {tag!r}")
