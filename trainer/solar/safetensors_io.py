"""Byte-deterministic safetensors encoding.

The ``safetensors`` library writes ``__metadata__`` in hash-map order, so the same tensors and
metadata can give different bytes in different processes. Digests, create-only comparisons and
reproducible datasets need equal bytes for equal content, so this writes the (simple) format
itself: 8-byte little-endian header length, a JSON header with sorted keys padded with spaces to
8-byte alignment, then each tensor's little-endian bytes in name order. Reading stays with the
``safetensors`` library (no pickle anywhere).
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable

import torch

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors name of a dtype (F32, BF16, ...)."""
    return _DTYPES[dtype]


def dtype_of(name: str) -> torch.dtype:
    """The dtype a safetensors name (F32, BF16, ...) stands for."""
    return next(dtype for dtype, known in _DTYPES.items() if known == name)


def tensor_buffer(tensor: torch.Tensor) -> memoryview:
    """The tensor's little-endian bytes (no copy for a contiguous CPU tensor)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
        raise RuntimeError("big-endian hosts are not supported")
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor_buffer(tensor))


def _header(specs: list[tuple[str, torch.dtype, tuple[int, ...]]], metadata: dict[str, str] | None) -> bytes:
    header: dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata must map str to str")
        header["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for name, dtype, shape in specs:
        if dtype not in _DTYPES:
            raise TypeError(f"tensor {name!r}: dtype {dtype} is not storable")
        size = torch.empty((), dtype=dtype).element_size()
        for dim in shape:
            size *= dim
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def encode(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytes:
    names = sorted(tensors)
    head = _header([(n, tensors[n].dtype, tuple(tensors[n].shape)) for n in names], metadata)
    return head + b"".join(tensor_bytes(tensors[n]) for n in names)


def write_streaming(handle, specs: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                    load: Callable[[str], torch.Tensor], metadata: dict[str, str] | None = None) -> int:
    """Write a safetensors file tensor by tensor (``load(name)`` fetches each one when needed), so
    a multi-GB file never sits in memory. Returns the bytes written."""
    names = sorted(specs)
    head = _header([(n, *specs[n]) for n in names], metadata)
    handle.write(head)
    written = len(head)
    for name in names:
        tensor = load(name)
        if tensor.dtype != specs[name][0] or tuple(tensor.shape) != tuple(specs[name][1]):
            raise ValueError(f"tensor {name!r} changed dtype or shape while writing")
        data = tensor_buffer(tensor)
        handle.write(data)
        written += data.nbytes
    return written
