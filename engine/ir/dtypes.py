"""Scalar element types.

A DType is interned: there is exactly one object per name, so rules and passes
compare dtypes with `is`. `index` is the type of index arithmetic (ranges,
offsets); it is an integer that codegen later narrows to int32 or int64.
"""
from __future__ import annotations

import attrs
import numpy as np


def np_dtype_named(name: str) -> np.dtype:
  """numpy's dtype of that name. numpy has no bfloat16: ml_dtypes' (the type JAX and TensorFlow share) stands for it,
  so that host arrays, the NUMPY device and constant folding hold bfloat16 as they hold float16. ml_dtypes is
  imported here, the first time a bfloat16 is needed, not with rulec: importing it takes about a second (most of a
  fresh process's import time), which a program without bfloat16 should not pay."""
  if name == "bfloat16":
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(name)


@attrs.frozen(repr=False, eq=False)
class DType:
  """Compared and hashed by identity: every dtype exists once (see dtypes.by_name)."""
  name: str
  itemsize: int     # bytes; 0 for void
  kind: str         # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float, 'x' index, 'v' void
  priority: int     # promotion order inside a kind family
  np_name: str | None

  def __repr__(self): return f"dtypes.{self.name}"
  def __reduce__(self): return (dtypes.by_name, (self.name,))
  @property
  def is_float(self) -> bool: return self.kind == "f"
  @property
  def is_int(self) -> bool: return self.kind in "iux"
  @property
  def is_unsigned(self) -> bool: return self.kind == "u"
  @property
  def is_bool(self) -> bool: return self.kind == "b"
  @property
  def is_half(self) -> bool:
    """float16 or bfloat16: stored as 16 bits, computed in float32 with every result rounded back."""
    return self.kind == "f" and self.itemsize == 2
  @property
  def bits(self) -> int: return self.itemsize * 8

  # min / max are attributes as in tinygrad (`dtypes.int8.max == 127`); compiler code and rules call them
  # (`dt.max()`), so the value is a number that also returns itself when called
  @property
  def min(self) -> _Bound: return _bound(self, False)
  @property
  def max(self) -> _Bound: return _bound(self, True)
  @property
  def bitsize(self) -> int: return self.bits   # tinygrad's name for bits


class _Bound:
  """A number that is also callable, returning itself: `dt.max` (tinygrad) and `dt.max()` (older rulec) agree."""
  def __call__(self): return self._plain()


class _IntBound(_Bound, int):
  def _plain(self): return int(self)


class _BoolBound(_Bound, int):
  def _plain(self): return bool(self)
  def __repr__(self): return repr(bool(self))
  __str__ = __repr__


class _FloatBound(_Bound, float):
  def _plain(self): return float(self)


def _bound(dt: DType, hi: bool) -> _Bound:
  if dt.kind == "b": return _BoolBound(hi)
  if dt.kind == "u": return _IntBound((1 << dt.bits) - 1 if hi else 0)
  if dt.kind in "ix": return _IntBound((1 << (dt.bits - 1)) - 1 if hi else -(1 << (dt.bits - 1)))
  return _FloatBound(float("inf") if hi else float("-inf"))


_LIMITS: dict = {}


def int_limits(dt: DType) -> tuple[int, int]:
  """An integer dtype's (min, max) as plain ints, kept per dtype (dt.min builds a callable number each time; the
  symbolic rules' bounds checks ask for them tens of thousands of times a pass)."""
  if (got := _LIMITS.get(dt)) is None: got = _LIMITS[dt] = (dt.min(), dt.max())
  return got


class dtypes:
  """The dtype namespace: `dtypes.float32`, `dtypes.by_name("int8")`, ..."""
  void = DType("void", 0, "v", 0, None)
  bool = DType("bool", 1, "b", 1, "bool")
  int8 = DType("int8", 1, "i", 2, "int8")
  uint8 = DType("uint8", 1, "u", 3, "uint8")
  int16 = DType("int16", 2, "i", 4, "int16")
  uint16 = DType("uint16", 2, "u", 5, "uint16")
  int32 = DType("int32", 4, "i", 6, "int32")
  uint32 = DType("uint32", 4, "u", 7, "uint32")
  int64 = DType("int64", 8, "i", 8, "int64")
  uint64 = DType("uint64", 8, "u", 9, "uint64")
  index = DType("index", 8, "x", 10, "int64")
  float16 = DType("float16", 2, "f", 11, "float16")
  bfloat16 = DType("bfloat16", 2, "f", 12, "bfloat16")
  float32 = DType("float32", 4, "f", 13, "float32")
  float64 = DType("float64", 8, "f", 14, "float64")

  default_float = float32
  default_int = int32

  @staticmethod
  def all() -> dict[str, DType]: return dict(ALL_DTYPES)

  @staticmethod
  def by_name(name: str) -> DType:
    try: return ALL_DTYPES[name]
    except KeyError: raise ValueError(f"unknown dtype {name!r}; known dtypes: {', '.join(ALL_DTYPES)}") from None

  # tinygrad's helpers: is_int is False for bool and index (an IR type, not a Tensor dtype)
  @staticmethod
  def is_float(d: DType) -> bool: return d.kind == "f"
  @staticmethod
  def is_int(d: DType) -> bool: return d.kind in "iu"
  @staticmethod
  def is_unsigned(d: DType) -> bool: return d.kind == "u"
  @staticmethod
  def is_bool(d: DType) -> bool: return d.kind == "b"

  # tinygrad's C-style aliases (defined last: inside this class body `int` and `float` are dtypes from here on)
  half, float, double = float16, float32, float64
  char, short, int, long = int8, int16, int32, int64
  uchar, ushort, uint, ulong = uint8, uint16, uint32, uint64
  uints = (uint8, uint16, uint32, uint64)
  sints = (int8, int16, int32, int64)
  ints = uints + sints
  floats = (float16, bfloat16, float32, float64)
  # the 2-byte floats every device stores as their bits and computes in float32, rounding each result back
  halfs = (float16, bfloat16)


ALL_DTYPES: dict[str, DType] = {v.name: v for v in vars(dtypes).values() if isinstance(v, DType)}
# every name on the namespace a dtype goes by, aliases included (`dtypes.int` is int32): the names Tensor accepts
DTYPE_ALIASES: dict[str, DType] = {k: v for k, v in vars(dtypes).items() if isinstance(v, DType)}

# dtype classes usable in rule patterns, e.g. `x{ints}` or `CAST(y){floats}`
DTYPE_CLASSES: dict[str, frozenset[DType]] = {
  "ints": frozenset(d for d in ALL_DTYPES.values() if d.kind in "iux"),
  "sints": frozenset(d for d in ALL_DTYPES.values() if d.kind in "ix"),
  "uints": frozenset(d for d in ALL_DTYPES.values() if d.kind == "u"),
  "floats": frozenset(d for d in ALL_DTYPES.values() if d.kind == "f"),
  "bools": frozenset({dtypes.bool}),
}


def dtype_set(name: str) -> frozenset[DType] | None:
  """The set of dtypes a pattern name stands for, or None when it names nothing."""
  if name in DTYPE_CLASSES: return DTYPE_CLASSES[name]
  if name in ALL_DTYPES: return frozenset({ALL_DTYPES[name]})
  return None
