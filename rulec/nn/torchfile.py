"""torch_load: PyTorch `.pt` / `.pth` checkpoints read without torch, and without running anything they hold.

A checkpoint is a pickle whose tensors point at raw storages: since PyTorch 1.6 a zip archive (`<name>/data.pkl`,
the storages as `<name>/data/<key>`, `<name>/byteorder`), before that one file of consecutive pickles (a magic
number, a protocol number, system facts, the object, the storage keys) followed by the storages.

A pickle can call anything it names, so the pickle is read by an unpickler of our own: every global it asks for is
looked up in a table of a few names (the tensor rebuild functions, the storage classes, collections.OrderedDict),
each mapped to a function here, and any other name is refused with UnsafeCheckpointError before anything is made.
No module is imported and no class from the file is called; BUILD (setting an object's state) is allowed only on the
OrderedDicts the table makes. Sizes come from the file and are checked against its length before anything is
allocated: a truncated or corrupt file is a CheckpointError, not a crash or a huge allocation."""
from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from typing import Any

import numpy as np

from rulec.engine.ir.dtypes import np_dtype_named
from rulec.engine.tensor import Tensor

__all__ = ["torch_load", "CheckpointError", "UnsafeCheckpointError"]


class CheckpointError(ValueError):
  """A file torch_load cannot read: not a checkpoint, truncated, corrupt, or of a form it does not handle."""


class UnsafeCheckpointError(pickle.UnpicklingError, CheckpointError):
  """A checkpoint whose pickle asks for something other than tensors and plain containers (a class, a function such
  as os.system or eval): refused, and nothing it names is imported or run."""


# storage class -> (numpy dtype as stored, numpy dtype of the tensor made from it)
_STORAGES: dict[str, tuple[str, str]] = {
  "FloatStorage": ("<f4", "float32"), "HalfStorage": ("<f2", "float16"), "DoubleStorage": ("<f8", "float64"),
  "BFloat16Storage": ("<u2", "bfloat16"),   # its bits, read as ml_dtypes' bfloat16
  "LongStorage": ("<i8", "int64"), "IntStorage": ("<i4", "int32"), "ShortStorage": ("<i2", "int16"),
  "CharStorage": ("i1", "int8"), "ByteStorage": ("u1", "uint8"), "BoolStorage": ("?", "bool"),
}
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
_MAX_DIMS = 64


class _StorageType:
  """What the pickle gets for `torch.FloatStorage` and the like: a name and its element type, nothing callable."""
  def __init__(self, name: str):
    self.name = name
    self.stored, self.dtype = np.dtype(_STORAGES[name][0]), np_dtype_named(_STORAGES[name][1])

  def __repr__(self) -> str: return f"torch.{self.name}"


class _Storage:
  """A storage the pickle refers to by key: its type, element count, and (once read) its elements."""
  def __init__(self, stype: _StorageType, key: str, numel: int):
    self.stype, self.key, self.numel = stype, key, numel
    self.data: np.ndarray | None = None


class _Reader:
  """The state of one torch_load: where the storages' bytes are, and the storages the pickle named."""
  def __init__(self, where: str, fetch):
    self.where, self.fetch = where, fetch   # fetch(storage) -> its elements as a 1-D array, or None (not yet known)
    self.storages: dict[str, _Storage] = {}

  def fail(self, msg: str) -> CheckpointError: return CheckpointError(f"torch_load: {self.where}: {msg}")

  # *** what the pickle may name ***

  def storage(self, pid: Any) -> _Storage:
    if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
      raise self.fail(f"a persistent id the checkpoint format does not have: {pid!r:.100}")
    stype, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(stype, _StorageType): raise self.fail(f"a storage of type {stype!r:.60}, not a storage class")
    if not isinstance(key, (str, int)) or isinstance(key, bool): raise self.fail(f"a storage key {key!r:.60}")
    if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0: raise self.fail(f"a storage size {numel!r:.60}")
    if len(pid) > 5 and pid[5] is not None: raise self.fail("storage views (a legacy checkpoint's shared storages) are not supported")
    key = str(key)
    s = self.storages.get(key)
    if s is None: s = self.storages[key] = _Storage(stype, key, numel)
    elif s.stype.name != stype.name or s.numel != numel: raise self.fail(f"storage {key} is named with two types or sizes")
    return s

  def rebuild(self, storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> Tensor | None:
    """torch._utils._rebuild_tensor_v2 (and _rebuild_tensor): the tensor viewing `storage` from `offset` with
    `size` and `stride` (in elements), copied out into a Tensor."""
    if not isinstance(storage, _Storage): raise self.fail(f"a tensor built from {type(storage).__name__}, not a storage")
    size, stride = self._ints(size, "size"), self._ints(stride, "stride")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0: raise self.fail(f"a tensor offset {offset!r:.40}")
    if len(size) != len(stride) or len(size) > _MAX_DIMS: raise self.fail(f"a tensor of size {size} and stride {stride}")
    n = 1
    for s in size: n *= s
    if n:
      last = offset + sum((s - 1) * st for s, st in zip(size, stride))
      if last >= storage.numel:
        raise self.fail(f"a tensor of size {size}, stride {stride} and offset {offset} reaches past its storage "
                        f"{storage.key} of {storage.numel} elements")
      if n > storage.numel:
        raise self.fail(f"a tensor of {n} elements viewing a storage of {storage.numel} (an expanded tensor): not supported")
    data = self.fetch(storage)
    if data is None: return None
    item = data.dtype.itemsize
    if n: arr = np.lib.stride_tricks.as_strided(data[offset:], shape=size, strides=tuple(st * item for st in stride))
    else: arr = np.zeros(size, dtype=data.dtype)
    return Tensor(_widen(np.array(arr, order="C"), storage.stype))   # (ascontiguousarray would make a 0-d view 1-d)

  def _ints(self, v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
      raise self.fail(f"a tensor {what} {v!r:.80}")
    return tuple(v)

  def rebuild_parameter(self, data: Any, *rest: Any) -> Any:
    """torch._utils._rebuild_parameter: an nn.Parameter is its tensor here."""
    if data is not None and not isinstance(data, Tensor): raise self.fail(f"a parameter of {type(data).__name__}")
    return data


def _widen(arr: np.ndarray, stype: _StorageType) -> np.ndarray:
  """Stored elements as the tensor's dtype: native byte order, bfloat16 bits as bfloat16."""
  if stype.name == "BFloat16Storage": return arr.astype(np.uint16).view(np_dtype_named("bfloat16"))
  return arr.astype(stype.dtype)


def _size(*xs: Any) -> tuple:
  """torch.Size(...): a tuple."""
  if len(xs) != 1 or not isinstance(xs[0], (tuple, list)): raise CheckpointError(f"torch_load: torch.Size{xs!r:.60}")
  return tuple(xs[0])


class _Unpickler(pickle._Unpickler):
  """Python's own unpickler (the pure-Python one, whose opcodes can be overridden) with find_class limited to the
  table in `_globals`, persistent ids resolved to storages, and BUILD limited to OrderedDicts."""
  dispatch = dict(pickle._Unpickler.dispatch)

  def __init__(self, f: io.BytesIO, reader: _Reader):
    super().__init__(f)
    self.reader = reader
    self.globals: dict[tuple[str, str], Any] = {
      ("torch._utils", "_rebuild_tensor_v2"): reader.rebuild, ("torch._utils", "_rebuild_tensor"): reader.rebuild,
      ("torch._utils", "_rebuild_parameter"): reader.rebuild_parameter,
      ("torch._utils", "_rebuild_parameter_with_state"): reader.rebuild_parameter,
      ("collections", "OrderedDict"): OrderedDict, ("torch", "Size"): _size,
      **{("torch", name): _StorageType(name) for name in _STORAGES},
    }

  def find_class(self, module: str, name: str) -> Any:
    hit = self.globals.get((module, name))
    if hit is None:
      raise UnsafeCheckpointError(
        f"torch_load: {self.reader.where}: the checkpoint's pickle asks for {module}.{name}; torch_load rebuilds "
        "tensors and plain containers only (torch._utils._rebuild_tensor_v2, torch storages, "
        "collections.OrderedDict), so it refuses the file and runs nothing it names")
    return hit

  def persistent_load(self, pid: Any) -> Any: return self.reader.storage(pid)

  def load_build(self) -> None:
    state, inst = self.stack[-1], self.stack[-2]
    if type(inst) is not OrderedDict or not isinstance(state, dict):
      raise UnsafeCheckpointError(f"torch_load: {self.reader.where}: the pickle sets the state of a "
                                  f"{type(inst).__name__}; only an OrderedDict's attributes may be set")
    self.stack.pop()
    for k, v in state.items():
      if not isinstance(k, str) or k.startswith("__"): raise UnsafeCheckpointError(f"torch_load: an attribute {k!r:.40}")
      setattr(inst, k, v)
  dispatch[pickle.BUILD[0]] = load_build


def _unpickle(f: io.BytesIO, reader: _Reader) -> Any:
  """The next pickle in f (f is left after its STOP)."""
  try: return _Unpickler(f, reader).load()
  except CheckpointError: raise
  except RecursionError: raise reader.fail("the pickle nests too deeply") from None
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
          struct.error, UnicodeDecodeError, OverflowError, MemoryError) as e:
    raise reader.fail(f"a corrupt pickle ({type(e).__name__}: {e})") from None


def _load_zip(blob: bytes, where: str) -> Any:
  try: zf = zipfile.ZipFile(io.BytesIO(blob))
  except (zipfile.BadZipFile, OSError, ValueError) as e: raise CheckpointError(f"torch_load: {where}: a corrupt zip archive: {e}") from None
  with zf:
    names = zf.namelist()
    pkls = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
    if len(pkls) != 1: raise CheckpointError(f"torch_load: {where}: a zip archive without one <name>/data.pkl: not a PyTorch checkpoint")
    base = pkls[0].split("/", 1)[0]
    little = True
    if f"{base}/byteorder" in names:
      order = _entry(zf, f"{base}/byteorder", len(blob), where).decode("ascii", "replace").strip()
      if order not in ("little", "big"): raise CheckpointError(f"torch_load: {where}: byteorder {order!r:.20}")
      little = order == "little"

    def fetch(s: _Storage) -> np.ndarray:
      if s.data is None:
        name = f"{base}/data/{s.key}"
        if name not in names: raise CheckpointError(f"torch_load: {where}: storage {s.key} is missing from the archive")
        raw = _entry(zf, name, len(blob), where)
        want = s.numel * s.stype.stored.itemsize
        if len(raw) < want:
          raise CheckpointError(f"torch_load: {where}: storage {s.key} holds {len(raw)} bytes, its {s.numel} elements need {want}")
        dt = s.stype.stored if little else s.stype.stored.newbyteorder(">")
        s.data = np.frombuffer(raw, dtype=dt, count=s.numel)
      return s.data

    reader = _Reader(where, fetch)
    return _unpickle(io.BytesIO(_entry(zf, pkls[0], len(blob), where)), reader)


def _entry(zf: zipfile.ZipFile, name: str, limit: int, where: str) -> bytes:
  """An archive entry's bytes: stored (PyTorch writes its archives uncompressed) and no larger than the file."""
  info = zf.getinfo(name)
  if info.compress_type != zipfile.ZIP_STORED:
    raise CheckpointError(f"torch_load: {where}: {name} is compressed; PyTorch stores its entries uncompressed")
  if info.file_size > limit: raise CheckpointError(f"torch_load: {where}: {name} claims {info.file_size} bytes, more than the file")
  try:
    with zf.open(info) as fh: return fh.read()
  except (zipfile.BadZipFile, OSError, EOFError) as e: raise CheckpointError(f"torch_load: {where}: {name}: {e}") from None


def _load_legacy(blob: bytes, where: str) -> Any:
  """The format before PyTorch 1.6: pickles of the magic number, the protocol version and system facts, the object,
  then the sorted storage keys; then each storage as an int64 element count and its elements."""
  f = io.BytesIO(blob)
  reader = _Reader(where, lambda s: s.data)

  def next_pickle() -> Any: return _unpickle(f, reader)

  try: magic = next_pickle()
  except UnsafeCheckpointError: raise
  except CheckpointError: magic = None
  if magic != _LEGACY_MAGIC: raise CheckpointError(f"torch_load: {where}: not a PyTorch checkpoint (neither a zip archive nor the legacy format)")
  protocol, info = next_pickle(), next_pickle()
  if protocol != 1001: raise reader.fail(f"legacy protocol {protocol!r:.20}, expected 1001")
  little = not isinstance(info, dict) or info.get("little_endian", True)
  main = f.tell()
  next_pickle()   # the object, once to learn its storages (its tensors are None: no storage is read yet)
  keys = next_pickle()
  if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys): raise reader.fail("a corrupt storage key list")
  for k in keys:
    s = reader.storages.get(k)
    if s is None: raise reader.fail(f"storage {k} is listed but no tensor names it")
    head = f.read(8)
    if len(head) < 8: raise reader.fail(f"the file ends before storage {k}")
    (count,) = struct.unpack("<q" if little else ">q", head)
    nbytes = count * s.stype.stored.itemsize
    if count != s.numel or nbytes > len(blob) - f.tell():
      raise reader.fail(f"storage {k} holds {count} elements where {s.numel} were named, or the file ends first")
    dt = s.stype.stored if little else s.stype.stored.newbyteorder(">")
    s.data = np.frombuffer(f.read(nbytes), dtype=dt, count=count)
  if (missing := [k for k, s in reader.storages.items() if s.data is None]):
    raise reader.fail(f"storages {missing[:5]} are named but not in the file")
  f.seek(main)
  return next_pickle()


def torch_load(fn: Any) -> Any:
  """torch_load(fn): the object a PyTorch checkpoint holds (usually a state dict: name -> Tensor), read without torch
  from a path or from a Tensor of the file's bytes (tinygrad's signature). Tensors are loaded onto the default
  device with their dtypes (bfloat16 too, as tinygrad loads it); a view keeps its shape and
  strides (it is copied out contiguous). Handles the zip format (PyTorch >= 1.6) and the legacy one before it.

  The pickle inside may name only the tensor rebuild functions, torch storage classes and collections.OrderedDict:
  anything else (a model class, os.system, eval) raises UnsafeCheckpointError and nothing is run. A truncated or
  corrupt file raises CheckpointError (a ValueError)."""
  if isinstance(fn, Tensor): blob, where = fn.numpy().tobytes(), "<tensor>"
  else:
    where = os.fspath(fn)
    with open(where, "rb") as fh: blob = fh.read()
  if blob[:4] == b"PK\x03\x04" or zipfile.is_zipfile(io.BytesIO(blob)): return _load_zip(blob, where)
  if len(blob) >= 262 and blob[257:262] == b"ustar":
    raise CheckpointError(f"torch_load: {where}: a tar checkpoint (PyTorch before 0.4): not supported; re-save it with a newer PyTorch")
  return _load_legacy(blob, where)
