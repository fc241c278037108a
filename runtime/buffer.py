"""Device buffers and the map from BUFFER UOps to them.

A BUFFER UOp (arg = (uid, device, size)) names storage; the storage itself is
a Buffer, found with `buffer_of(uop)`. Buffers are allocated lazily, on first
use, and live as long as the UOp that names them.
"""
from __future__ import annotations

import weakref

import numpy as np

from engine.dtypes import DType, dtypes
from engine.ops import Ops
from engine.uop import UOp

_storage: "weakref.WeakKeyDictionary[UOp, Buffer]" = weakref.WeakKeyDictionary()


def np_dtype(dtype: DType) -> np.dtype:
  if dtype.np_name is None: raise TypeError(f"{dtype} has no numpy equivalent")
  return np.dtype(dtype.np_name)


class Buffer:
  """Flat storage of `size` elements of `dtype` on `device`."""
  def __init__(self, device: str, size: int, dtype: DType):
    self.device, self.size, self.dtype = device, size, dtype
    self._data: np.ndarray | None = None

  @property
  def allocated(self) -> bool: return self._data is not None

  def numpy_view(self) -> np.ndarray:
    """The contents as a 1-D numpy array (no copy on host devices)."""
    if self._data is None: self._data = np.zeros(self.size, dtype=np_dtype(self.dtype))
    return self._data

  def copyin(self, data: np.ndarray):
    arr = np.ascontiguousarray(data, dtype=np_dtype(self.dtype)).reshape(-1)
    if arr.size != self.size: raise ValueError(f"copyin of {arr.size} elements into a buffer of {self.size}")
    self._data = arr.copy() if arr.base is not None or not arr.flags.writeable else arr

  def __repr__(self): return f"<Buffer {self.device} {self.size} x {self.dtype.name}>"


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
  """A fresh BUFFER UOp with its storage registered."""
  u = UOp.new_buffer(device, size, dtype)
  _storage[u] = Buffer(device, size, dtype)
  return u


def buffer_of(u: UOp) -> Buffer:
  if u.op is not Ops.BUFFER: raise TypeError(f"{u.op} is not a BUFFER")
  buf = _storage.get(u)
  if buf is None:
    _, device, size = u.arg
    buf = _storage[u] = Buffer(device, size, u.dtype)
  return buf


__all__ = ["Buffer", "new_buffer", "buffer_of", "np_dtype", "dtypes"]
