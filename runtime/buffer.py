"""Device buffers and the map from BUFFER UOps to them.

A BUFFER UOp (arg = (uid, device, size)) names storage; the storage itself is
a Buffer, found with `buffer_of(uop)`. Buffers are allocated lazily, on first
use, and live as long as the UOp that names them.

Every device can read every buffer, so a Buffer keeps its host (numpy) copy
and at most one device-side copy (a Mirror: e.g. an OpenCL buffer on a GPU),
with a validity flag each. Host readers call `host_view()` (read-only: the
device copy stays valid), host writers `numpy_view()` (the device copy becomes
stale); a device that writes the buffer marks the host copy stale, and the
next host access copies the data back. A chain of kernels on one device thus
never round-trips through host memory.
"""
from __future__ import annotations

import weakref

import numpy as np

from rulec.codegen.decomp import load_slack
from rulec.engine.ir.dtypes import DType, dtypes, np_dtype_named
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

_storage: "weakref.WeakKeyDictionary[UOp, Buffer]" = weakref.WeakKeyDictionary()

# Bytes held by allocated buffers, per device: `used` now, `peak` the most since reset_peak(). A buffer counts its
# size once from the moment it has storage (a host copy or a device copy) until it is freed, as a device
# allocation would (tinygrad's GlobalCounters.mem_used counts the same way); the host copy a GPU buffer keeps for
# reading back is not counted again.
MEMORY: dict[str, dict[str, int]] = {}


def memory_used(device: str | None = None) -> int:
  """Bytes held now by allocated buffers on `device` (every device when None)."""
  return sum(m["used"] for d, m in MEMORY.items() if device is None or d == device)


def memory_peak(device: str | None = None) -> int:
  """The most bytes allocated buffers held at once on `device` since reset_peak() (each device's own peak, summed
  when device is None)."""
  return sum(m["peak"] for d, m in MEMORY.items() if device is None or d == device)


def reset_peak() -> None:
  """Start measuring peaks again from what is held now."""
  for m in MEMORY.values(): m["peak"] = m["used"]


def np_dtype(dtype: DType) -> np.dtype:
  if dtype.np_name is None: raise TypeError(f"{dtype} has no numpy equivalent")
  return np_dtype_named(dtype.np_name)


# Host storage starts on a cache line: numpy's allocator gives 16-byte alignment (an address 16, 32 or 48 bytes past
# one, by the allocation), and then every 64-byte vector load a CPU kernel makes along a row straddles two lines.
# Measured on the 1024^3 matmul here (2 threads, the same kernel): 8.5-9.1 ms from numpy's arrays, 7.7 from
# 64-byte aligned ones; a C kernel of the same loops 7.7 against 8.8.
ALIGN = 64


def host_array(size: int, dtype: np.dtype, zero: bool = False) -> np.ndarray:
  """A 1-D array of `size` elements whose data starts at an ALIGN-byte boundary, with load_slack(size) zeroed
  elements before and after it that kernels may read but never write (codegen/decomp.py LOAD_SLACK_BYTES: a guarded
  load a little outside the buffer reads there instead of being clamped lane by lane)."""
  nbytes = size * dtype.itemsize
  slack = load_slack(size, dtype.itemsize) * dtype.itemsize
  before = -(-slack // ALIGN) * ALIGN   # (the elements stay aligned)
  raw = (np.zeros if zero else np.empty)(before + nbytes + slack + ALIGN, dtype=np.uint8)
  start = -raw.ctypes.data % ALIGN + before
  if not zero:
    raw[:start] = 0
    raw[start + nbytes:] = 0
  return raw[start:start + nbytes].view(dtype)


class Mirror:
  """A device-side copy of a Buffer. Devices subclass it; `valid` says it holds the current contents."""
  owner: object = None   # which device (object) holds it
  valid: bool = False
  def read_into(self, host: np.ndarray) -> None: raise NotImplementedError


class Buffer:
  """Flat storage of `size` elements of `dtype` on `device`."""
  def __init__(self, device: str, size: int, dtype: DType):
    self.device, self.size, self.dtype = device, size, dtype
    self._data: np.ndarray | None = None
    self._mirror: Mirror | None = None
    self.host_valid = True    # False: the mirror was written after the host copy
    self._counted = 0         # bytes this buffer adds to MEMORY (0 until it has storage)

  def _count(self) -> None:
    if self._counted: return
    self._counted = self.nbytes
    m = MEMORY.setdefault(self.device, {"used": 0, "peak": 0})
    m["used"] += self._counted
    if m["used"] > m["peak"]: m["peak"] = m["used"]

  def __del__(self):
    if self._counted: MEMORY[self.device]["used"] -= self._counted

  @property
  def mirror(self) -> Mirror | None: return self._mirror

  @mirror.setter
  def mirror(self, m: Mirror | None) -> None:
    self._mirror = m
    if m is not None: self._count()

  @property
  def allocated(self) -> bool: return self._data is not None or self._mirror is not None

  @property
  def untouched(self) -> bool:
    """Never written by anyone: the contents are zeros (a device may fill its copy instead of uploading)."""
    return self._data is None and self.host_valid

  def _host(self) -> np.ndarray:
    if self._data is None:
      self._data = host_array(self.size, np_dtype(self.dtype), zero=True)
      self._count()
    if not self.host_valid:
      assert self.mirror is not None and self.mirror.valid
      self.mirror.read_into(self._data)
      self.host_valid = True
    return self._data

  def host_view(self) -> np.ndarray:
    """The contents as a read-only 1-D numpy array (no copy unless a device holds newer data)."""
    v = self._host().view()
    v.flags.writeable = False
    return v

  def numpy_view(self) -> np.ndarray:
    """The contents as a writable 1-D numpy array; a device copy becomes stale (the caller may write)."""
    arr = self._host()
    if self.mirror is not None: self.mirror.valid = False
    return arr

  def copyin(self, data: np.ndarray):
    """The buffer's contents become a copy of `data` (never the caller's array itself, which they may change)."""
    arr = np.asarray(data).reshape(-1)
    if arr.size != self.size: raise ValueError(f"copyin of {arr.size} elements into a buffer of {self.size}")
    # a new array, not the old one overwritten: an earlier host view someone holds keeps what it showed
    self._data = host_array(self.size, np_dtype(self.dtype))
    self._count()
    np.copyto(self._data, arr, casting="unsafe")
    self.host_valid = True
    if self.mirror is not None: self.mirror.valid = False

  @property
  def nbytes(self) -> int: return self.size * np_dtype(self.dtype).itemsize

  def copy_from(self, src: "Buffer") -> None:
    """This buffer's contents become src's: a transfer between two devices. The data goes through host memory (a
    device copy of src is read back once and stays valid there); a device copy of this buffer is stale after."""
    if src.size != self.size or src.dtype is not self.dtype:
      raise ValueError(f"copy of {src!r} into {self!r}: sizes or dtypes differ")
    if self._data is None:
      self._data = host_array(self.size, np_dtype(self.dtype))
      self._count()
    np.copyto(self._data, src.host_view())
    self.host_valid = True
    if self.mirror is not None: self.mirror.valid = False

  def device_wrote(self, mirror: Mirror):
    """A device kernel wrote `mirror`: it is now the only current copy."""
    self.mirror, mirror.valid, self.host_valid = mirror, True, False

  def __repr__(self): return f"<Buffer {self.device} {self.size} x {self.dtype.name}>"


class ArenaView(Buffer):
  """A Buffer whose storage is bytes [offset, offset + nbytes) of an arena: one host Buffer of bytes that the memory
  planner (engine/memory_plan.py) shares among intermediates whose lifetimes do not overlap, each at an offset of
  its own while it lives, so several small ones fit where a large one lives at another time. Only for devices that
  compute on the host arrays themselves (CPU, NUMPY: `ARENA_DEVICES`). The arena counts its bytes once; a view
  counts none. The bytes around a view (LOAD_SLACK's reads, discarded by a WHERE) are the arena's: other views'
  contents or the arena's own zeroed slack."""
  def __init__(self, arena: Buffer, offset: int, size: int, dtype: DType):
    super().__init__(arena.device, size, dtype)
    self.arena, self.offset = arena, offset

  def _count(self) -> None: pass

  @property
  def allocated(self) -> bool: return True

  @property
  def untouched(self) -> bool: return False

  def _host(self) -> np.ndarray:
    if self._data is None:
      dt = np_dtype(self.dtype)
      self._data = self.arena._host()[self.offset:self.offset + self.size * dt.itemsize].view(dt)
    return self._data

  def copyin(self, data: np.ndarray):
    arr = np.asarray(data).reshape(-1)
    if arr.size != self.size: raise ValueError(f"copyin of {arr.size} elements into a buffer of {self.size}")
    np.copyto(self._host(), arr, casting="unsafe")

  def copy_from(self, src: "Buffer") -> None:
    if src.size != self.size or src.dtype is not self.dtype:
      raise ValueError(f"copy of {src!r} into {self!r}: sizes or dtypes differ")
    np.copyto(self._host(), src.host_view())

  def __repr__(self): return f"<ArenaView {self.device} {self.size} x {self.dtype.name} at byte {self.offset}>"


# the devices whose kernels read and write the host arrays of Buffers (ArenaView)
ARENA_DEVICES = ("CPU", "NUMPY")


def new_arena_views(device: str, nbytes: int, layout: list[tuple[int, int, DType]]) -> list[UOp]:
  """BUFFERs of `layout` ((byte offset, size, dtype) each, offsets multiples of ALIGN) viewing one new arena of
  `nbytes` bytes on `device`."""
  arena = Buffer(device, nbytes, dtypes.uint8)
  out = []
  for offset, size, dtype in layout:
    u = UOp.new_buffer(device, size, dtype)
    _storage[u] = ArenaView(arena, offset, size, dtype)
    out.append(u)
  return out


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


__all__ = ["Buffer", "Mirror", "ArenaView", "ARENA_DEVICES", "new_arena_views", "new_buffer", "buffer_of", "host_array",
           "np_dtype", "dtypes", "MEMORY", "memory_used", "memory_peak", "reset_peak"]
