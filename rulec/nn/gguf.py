"""gguf_load: GGUF files (llama.cpp's format, versions 2 and 3) as (metadata, tensors), quantised tensors
dequantised on load.

A GGUF file is a header (magic `GGUF`, version, tensor count, key-value count), the key-value metadata, one info
record per tensor (name, dims innermost first, ggml type, offset), then, aligned to `general.alignment` (32 by
default), the tensors' data. Every count and size read from the header is checked against the bytes left in the
file before anything is allocated, so a truncated or corrupt file is a CheckpointError (a ValueError).

Dequantisation runs on the host in numpy, block by block as ggml lays the blocks out (ggml-quants.c's
dequantize_row_* functions): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K become float32; F32, F16, F64 and the
integer types load as they are, BF16 too."""
from __future__ import annotations

import mmap
import os
import pathlib
import re
import struct
from typing import Any, Callable

import numpy as np

from rulec.engine.ir.dtypes import np_dtype_named
from rulec.engine.tensor import Tensor
from rulec.nn.torchfile import CheckpointError

__all__ = ["gguf_load", "ggml_data_to_tensor", "GGML_TYPES"]

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
  0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
  7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
  24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}
# ggml types this loader does not dequantise (named in the error)
_OTHER_TYPES = {9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
                20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}
_NATIVE = {0: "<f4", 1: "<f2", 24: "i1", 25: "<i2", 26: "<i4", 27: "<i8", 28: "<f8"}
_MAX_DIMS, _MAX_ARRAY_DEPTH = 8, 8


class _Cursor:
  """Reads little-endian values from a buffer, refusing to read past its end."""
  def __init__(self, buf: Any, where: str):
    self.buf, self.pos, self.end, self.where = buf, 0, len(buf), where

  def fail(self, msg: str) -> CheckpointError: return CheckpointError(f"gguf_load: {self.where}: {msg}")

  def left(self) -> int: return self.end - self.pos

  def take(self, n: int, what: str) -> bytes:
    if n < 0 or n > self.left(): raise self.fail(f"the file ends inside {what} (at byte {self.pos}, {n} bytes wanted, {self.left()} left)")
    out = self.buf[self.pos:self.pos + n]
    self.pos += n
    return bytes(out)

  def unpack(self, fmt: str, what: str) -> Any: return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))[0]

  def string(self, what: str) -> str:
    n = self.unpack("Q", f"the length of {what}")
    raw = self.take(n, what)
    try: return raw.decode("utf-8")
    except UnicodeDecodeError as e: raise self.fail(f"{what} is not UTF-8: {e}") from None


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MIN_SIZE = {**{t: struct.calcsize("<" + f) for t, f in _SCALARS.items()}, 8: 8, 9: 12}   # bytes an item takes at least


def _value(c: _Cursor, typ: int, what: str, depth: int = 0) -> Any:
  if typ in _SCALARS: return c.unpack(_SCALARS[typ], what)
  if typ == 8: return c.string(what)
  if typ == 9:
    if depth >= _MAX_ARRAY_DEPTH: raise c.fail(f"{what}: arrays nested more than {_MAX_ARRAY_DEPTH} deep")
    item, n = c.unpack("I", f"{what}'s item type"), c.unpack("Q", f"{what}'s length")
    if item not in _MIN_SIZE: raise c.fail(f"{what}: an array of unknown value type {item}")
    if n * _MIN_SIZE[item] > c.left(): raise c.fail(f"{what}: an array of {n} items does not fit in the {c.left()} bytes left")
    if item in _SCALARS:   # (a numeric array at once: vocabularies' scores are long)
      fmt = _SCALARS[item]
      return list(struct.unpack(f"<{n}{fmt}", c.take(n * struct.calcsize(fmt), what)))
    return [_value(c, item, what, depth + 1) for _ in range(n)]
  raise c.fail(f"{what}: unknown value type {typ}")


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
  """The float16 at byte `at` of each block, as float32 (a column)."""
  return np.ascontiguousarray(blocks[:, at:at + 2]).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
  """Low nibbles of every byte, then high nibbles (ggml's order within a 32-element block)."""
  return np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int32)


def _q4_0(b: np.ndarray) -> np.ndarray: return _f16(b, 0) * (_nibbles(b[:, 2:18]) - 8).astype(np.float32)
def _q4_1(b: np.ndarray) -> np.ndarray: return _f16(b, 0) * _nibbles(b[:, 4:20]).astype(np.float32) + _f16(b, 2)
def _q8_0(b: np.ndarray) -> np.ndarray: return _f16(b, 0) * b[:, 2:34].view(np.int8).astype(np.float32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
  """Q5's high bits: bit j of the 32-bit qh for element j of the block, as 0 or 16."""
  h = np.ascontiguousarray(qh).view("<u4").astype(np.uint64)   # (blocks, 1)
  return (((h >> np.arange(32, dtype=np.uint64)) & 1) << 4).astype(np.int32)


def _q5_0(b: np.ndarray) -> np.ndarray:
  return _f16(b, 0) * ((_nibbles(b[:, 6:22]) | _fifth_bits(b[:, 2:6])) - 16).astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
  return _f16(b, 0) * (_nibbles(b[:, 8:24]) | _fifth_bits(b[:, 4:8])).astype(np.float32) + _f16(b, 2)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The 8 six-bit scales and mins packed in the 12 bytes of a Q4_K / Q5_K block."""
  s = s.astype(np.int32)
  sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
  mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
  return sc.astype(np.float32), mn.astype(np.float32)


def _k_quants(qs: np.ndarray) -> np.ndarray:
  """(blocks, 8, 32): four 32-byte groups, each its low nibbles (sub-block 2i) then its high ones (2i+1)."""
  g = qs.reshape(len(qs), 4, 32).astype(np.int32)
  return np.stack([g & 0xF, g >> 4], axis=2).reshape(len(qs), 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
  sc, mn = _k_scales(b[:, 4:16])
  q = _k_quants(b[:, 16:144]).astype(np.float32)
  d, dmin = _f16(b, 0)[:, :, None], _f16(b, 2)[:, :, None]
  return ((d * sc[:, :, None]) * q - dmin * mn[:, :, None]).reshape(len(b), 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
  sc, mn = _k_scales(b[:, 4:16])
  qh = b[:, 16:48].astype(np.int32)[:, None, :]
  high = ((qh >> np.arange(8, dtype=np.int32)[None, :, None]) & 1) << 4   # sub-block k takes bit k of each qh byte
  q = (_k_quants(b[:, 48:176]) + high).astype(np.float32)
  d, dmin = _f16(b, 0)[:, :, None], _f16(b, 2)[:, :, None]
  return ((d * sc[:, :, None]) * q - dmin * mn[:, :, None]).reshape(len(b), 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
  n = len(b)
  ql = b[:, 0:128].reshape(n, 2, 64).astype(np.int32)
  qh = b[:, 128:192].reshape(n, 2, 32).astype(np.int32)
  sc = b[:, 192:208].view(np.int8).reshape(n, 2, 4, 2).astype(np.float32)   # [half, quarter, l // 16]
  lo, hi = ql[:, :, :32], ql[:, :, 32:]
  q = np.stack([(lo & 0xF) | ((qh & 3) << 4), (hi & 0xF) | (((qh >> 2) & 3) << 4),
                (lo >> 4) | (((qh >> 4) & 3) << 4), (hi >> 4) | (((qh >> 6) & 3) << 4)], axis=2) - 32
  d = _f16(b, 208).reshape(n, 1, 1, 1, 1)
  return ((d * sc[..., None]) * q.reshape(n, 2, 4, 2, 16).astype(np.float32)).reshape(n, 256)


_DEQUANT: dict[int, Callable[[np.ndarray], np.ndarray]] = {2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0,
                                                           12: _q4_k, 13: _q5_k, 14: _q6_k}


def _type_info(typ: int, fail: Callable[[str], Exception]) -> tuple[str, int, int]:
  if typ in GGML_TYPES: return GGML_TYPES[typ]
  if typ in _OTHER_TYPES: raise fail(f"ggml type {_OTHER_TYPES[typ]} ({typ}) is not supported; supported: "
                                     + ", ".join(name for name, _, _ in GGML_TYPES.values()))
  raise fail(f"unknown ggml type {typ}")


def _nbytes(n: int, typ: int, fail: Callable[[str], Exception]) -> int:
  name, block, size = _type_info(typ, fail)
  if n % block: raise fail(f"{n} elements of {name} do not fill whole blocks of {block}")
  return n // block * size


def _dequantize(raw: bytes, n: int, typ: int) -> np.ndarray:
  """n elements of ggml type typ from raw (exactly their bytes) as a flat numpy array."""
  if typ in _NATIVE: return np.frombuffer(raw, dtype=_NATIVE[typ], count=n).astype(np.dtype(_NATIVE[typ]).newbyteorder("="))
  if typ == 30: return np.frombuffer(raw, dtype="<u2", count=n).astype(np.uint16).view(np_dtype_named("bfloat16"))
  _, block, size = GGML_TYPES[typ]
  blocks = np.frombuffer(raw, dtype=np.uint8).reshape(n // block, size)
  return _DEQUANT[typ](blocks).reshape(n)


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
  """ggml_data_to_tensor(t, n, ggml_type): the first n elements of type ggml_type in t's bytes, dequantised (a flat
  float32 Tensor for the quantised types, the type's own dtype for F16, F32, F64 and the ints)."""
  raw = t.numpy().tobytes()
  def fail(msg: str) -> CheckpointError: return CheckpointError(f"ggml_data_to_tensor: {msg}")
  need = _nbytes(n, ggml_type, fail)
  if need > len(raw): raise fail(f"{n} elements need {need} bytes, the tensor holds {len(raw)}")
  return Tensor(_dequantize(raw[:need], n, ggml_type))


def _parse(buf: Any, where: str) -> tuple[dict, dict[str, Tensor]]:
  c = _Cursor(buf, where)
  if c.left() < 4 or bytes(buf[:4]) != b"GGUF": raise c.fail("not a GGUF file (no GGUF magic)")
  c.take(4, "the magic")
  version = c.unpack("I", "the version")
  if version not in (2, 3):
    raise c.fail(f"GGUF version {version}: only versions 2 and 3 are read" + (" (a big-endian file?)" if version > 0xFFFF else ""))
  n_tensors, n_kv = c.unpack("Q", "the tensor count"), c.unpack("Q", "the metadata count")
  if n_kv * 13 > c.left() or n_tensors * 24 > c.left():
    raise c.fail(f"{n_tensors} tensors and {n_kv} metadata entries do not fit in a file of {c.end} bytes")
  kv: dict[str, Any] = {}
  for i in range(n_kv):
    key = c.string(f"metadata key {i}")
    kv[key] = _value(c, c.unpack("I", f"the type of {key!r}"), f"metadata {key!r}")
  infos = []
  for i in range(n_tensors):
    name = c.string(f"tensor name {i}")
    nd = c.unpack("I", f"the rank of {name!r}")
    if nd > _MAX_DIMS: raise c.fail(f"tensor {name!r} has {nd} dimensions (at most {_MAX_DIMS})")
    dims = tuple(c.unpack("Q", f"the dims of {name!r}") for _ in range(nd))
    infos.append((name, dims, c.unpack("I", f"the type of {name!r}"), c.unpack("Q", f"the offset of {name!r}")))
  align = kv.get("general.alignment", 32)
  if not isinstance(align, int) or isinstance(align, bool) or align <= 0: raise c.fail(f"general.alignment is {align!r}")
  start = -(-c.pos // align) * align
  tensors: dict[str, Tensor] = {}
  for name, dims, typ, off in infos:
    n = 1
    for d in dims: n *= d
    size = _nbytes(n, typ, lambda m, name=name: c.fail(f"tensor {name!r}: {m}"))
    if start + off + size > c.end:
      raise c.fail(f"tensor {name!r} ({GGML_TYPES[typ][0]}, dims {list(dims)}) needs bytes {start + off}..{start + off + size}, "
                   f"the file has {c.end}")
    if name in tensors: raise c.fail(f"tensor {name!r} appears twice")
    tensors[name] = Tensor(_dequantize(bytes(buf[start + off:start + off + size]), n, typ).reshape(tuple(reversed(dims))))
  return kv, tensors


def _parse_path(path: str) -> tuple[dict, dict[str, Tensor]]:
  with open(path, "rb") as fh:
    if os.fstat(fh.fileno()).st_size == 0: raise CheckpointError(f"gguf_load: {path}: an empty file")
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm: return _parse(mm, path)


def gguf_load(fn: Tensor | str | os.PathLike) -> tuple[dict, dict[str, Tensor]]:
  """gguf_load(fn): (metadata, tensors) of a GGUF file (v2 or v3), from a path or a Tensor of the file's bytes.

  metadata: the key-value pairs (arrays as lists); tensors: name -> Tensor in file order, shaped as tinygrad shapes
  them (the file's dims reversed: (rows, columns)). Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K are
  dequantised to float32; F16, BF16, F32, F64 and the ints keep their dtype. A file split in parts
  (`-00001-of-0000N.gguf`, given by path) loads every part. A truncated or corrupt file raises CheckpointError."""
  if isinstance(fn, Tensor): return _parse(fn.numpy().tobytes(), "<tensor>")
  path = os.fspath(fn)
  kv, tensors = _parse_path(path)
  total = kv.get("split.count", 1)
  if not isinstance(total, int) or total <= 1: return kv, tensors
  if kv.get("split.no", 0) != 0: raise CheckpointError(f"gguf_load: {path}: a split file loads from its first part, this is part {kv['split.no']}")
  m = re.match(r"^(.*)-00001-of-\d{5}\.gguf$", path)
  if m is None: raise CheckpointError(f"gguf_load: {path}: a split file's first part is named <name>-00001-of-NNNNN.gguf")
  for i in range(2, total + 1): tensors.update(_parse_path(str(pathlib.Path(f"{m.group(1)}-{i:05d}-of-{total:05d}.gguf")))[1])
  return kv, tensors
