"""Checking and normalising what users pass to Tensor: dtypes, devices, axes, shapes, scalars, host data.

Every function here raises at the user's call with a message that names the
bad value, with the exception class tinygrad raises for it (ShapeError, AxisError,
DTypeNameError, ... derive from the classes numpy would raise too); dtype
promotion is tinygrad's lattice (engine/tensor/__init__.py's docstring spells it out).
"""
from __future__ import annotations

import math
import operator
import os
from typing import Any

import numpy as np

from rulec.engine.ir.dtypes import DTYPE_ALIASES, DType, dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, linear_form
from rulec.runtime.buffer import np_dtype
from rulec.runtime.devices import DEVICES, canonical_device, default_device

TENSOR_DTYPES: dict[str, DType] = {d.name: d for d in (
  dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
  dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)}


class AxisError(ValueError, IndexError):
  """An axis argument out of range for the tensor's number of dimensions."""


class DuplicateAxisError(AxisError, RuntimeError):
  """An axis named twice (flip, reductions, permute); tinygrad raises RuntimeError, numpy ValueError."""


class DTypeNameError(TypeError, AttributeError):
  """A dtype name that is no dtype: tinygrad looks names up on `dtypes` (AttributeError), numpy raises TypeError."""


class DTypeError(TypeError, ValueError, RuntimeError):
  """An operand dtype the operation does not take (int ** negative int, shifts of floats): tinygrad raises
  RuntimeError, numpy TypeError or ValueError."""


class ArgError(ValueError, RuntimeError):
  """An argument value the operation refuses (roll's shifts and dims of different lengths, unfold's step, meshgrid's
  indexing, einsum's second '...'): tinygrad and torch raise RuntimeError, numpy and older rulec ValueError."""


class ShapeError(ValueError, RuntimeError):
  """Shapes that do not fit the operation. tinygrad raises RuntimeError for these and numpy ValueError, so both
  `except` clauses catch it."""


class ShapeArgError(TypeError, ValueError):
  """A shape argument mixing a tuple with more dimensions: tinygrad raises ValueError, older rulec TypeError."""


class ZeroDimError(ShapeError, IndexError):
  """A zero-dimensional tensor where an axis is needed (cat): tinygrad raises IndexError."""


def _unknown(d: Any) -> str:
  return f"unknown dtype {d!r}; Tensor dtypes: {', '.join(TENSOR_DTYPES)} (and tinygrad's aliases: int, float, half, long, ...)"


class DefaultInt(int):
  """A keyword default (var's correction=1, cat's dim=0) told apart from the same number passed by the caller, so
  passing it together with its older alias (ddof=, axis=) is a TypeError; it shows as the plain number."""


def alias_arg(value: Any, alias: Any, name: str, alias_name: str, fn: str) -> Any:
  """tinygrad's keyword (value) or rulec's older alias in its place, not both."""
  if alias is None: return int(value) if isinstance(value, DefaultInt) else value
  if value is not None and not isinstance(value, DefaultInt):
    raise TypeError(f"{fn}() got both {name}={value!r} and {alias_name}={alias!r}; pass one")
  return alias


def to_dtype(d: Any) -> DType:
  """A Tensor dtype from a DType, a dtype name (tinygrad's aliases such as 'int' or 'half' too, any case), a numpy
  dtype or bool / int / float."""
  if isinstance(d, DType): dt = d
  elif d is bool: return dtypes.bool
  elif d is int: return dtypes.default_int
  elif d is float: return dtypes.default_float
  elif isinstance(d, str):
    dt = DTYPE_ALIASES.get(d.lower())   # tinygrad resolves names as getattr(dtypes, name.lower())
    if dt is None: raise DTypeNameError(_unknown(d))
  else:
    try: name = np.dtype(d).name
    except Exception: raise DTypeNameError(_unknown(d)) from None
    if name not in TENSOR_DTYPES: raise TypeError(f"numpy dtype {name} is not supported; Tensor dtypes: {', '.join(TENSOR_DTYPES)}")
    return TENSOR_DTYPES[name]
  if dt.name not in TENSOR_DTYPES:
    raise TypeError(f"dtype {dt.name} is not supported by Tensor; Tensor dtypes: {', '.join(TENSOR_DTYPES)}")
  return dt


class DeviceError(ValueError, RuntimeError):
  """Devices that do not fit the operation (tensors on different devices or device sets); tinygrad raises
  RuntimeError for these."""


def canon_device(device: Any) -> str | tuple[str, ...]:
  """A device name in its one spelling ('cpu:1' -> 'CPU:1', 'CPU:0' -> 'CPU'); a tuple or list of names is a
  device set (a sharded tensor's), and a set of one device is that device."""
  if device is None: return default_device()
  if isinstance(device, (tuple, list)):
    if not device: raise ValueError("a device set needs at least one device")
    out = tuple(canon_device(d) for d in device)
    for d in out:
      if not isinstance(d, str): raise TypeError(f"a device set holds device names, got {device!r}")
    return out[0] if len(out) == 1 else out
  if not isinstance(device, str): raise TypeError(f"device must be a string, got {type(device).__name__}")
  try: return canonical_device(device)
  except ValueError: raise ValueError(f"unknown device {device!r}; known devices: {', '.join(DEVICES)} "
                                      "(each also with an index: CPU:1)") from None


def promote_types(*dts: DType) -> DType:
  """tinygrad's promotion: the least upper bound in its lattice of the dtypes given (it is a lattice, so the order
  and grouping of the operands do not matter).

  bool is below every other dtype; any float wins over the ints, and the widest float over the others; among ints
  the result is the narrowest that holds every operand's range: uint8 + int8 -> int16, uint32 + int32 -> int64.
  A signed int with uint64 has no such int: tinygrad gives its (weak) default float, float32."""
  if all(d is dts[0] for d in dts): return dts[0]
  floats = [d for d in dts if d.is_float]
  if floats:
    widest = max(floats, key=lambda d: d.itemsize)
    # float16 and bfloat16 hold neither the other's range nor its precision: together they meet at float32
    if widest.is_half and any(d is not widest for d in floats): return dtypes.float32
    return widest
  sbits = max((d.bits for d in dts if d.kind == "i"), default=0)
  ubits = max((d.bits for d in dts if d.kind == "u"), default=0)
  if not sbits and not ubits: return dtypes.bool
  if not ubits: return _INT[sbits]
  if not sbits: return _UINT[ubits]
  if sbits > ubits: return _INT[sbits]
  return _INT.get(2 * ubits, dtypes.default_float)


_INT = {8: dtypes.int8, 16: dtypes.int16, 32: dtypes.int32, 64: dtypes.int64}
_UINT = {8: dtypes.uint8, 16: dtypes.uint16, 32: dtypes.uint32, 64: dtypes.uint64}


def is_py_scalar(v: Any) -> bool:
  return isinstance(v, (bool, int, float)) and not isinstance(v, np.generic)


def weak_dtype(t: DType, v: Any) -> DType:
  """The dtype of `tensor(t) op v` for a Python scalar v: weak, as in tinygrad (a Python int never widens an int
  tensor, a Python float never widens a float tensor; bool tensors go to int32 / float32)."""
  if isinstance(v, bool): return t
  if isinstance(v, int): return dtypes.default_int if t.is_bool else t
  return t if t.is_float else dtypes.default_float


def wrap_int(v: int, dt: DType) -> int:
  """v in dt's two's-complement range, as the integer would be stored (tinygrad wraps Python ints that do not fit:
  int8 tensor + 300 adds 44)."""
  m = v & ((1 << dt.bits) - 1)
  return m - (1 << dt.bits) if dt.kind == "i" and m > dt.max() else m


def scalar_of(v: Any, dt: DType) -> Any:
  """A Python scalar as a constant of dt; integers that do not fit wrap around (tinygrad; numpy raises)."""
  if dt.is_bool: return bool(v)
  if dt.is_int:
    if isinstance(v, float):
      if not v.is_integer(): raise TypeError(f"{v!r} is not an integer for {dt.name}")
      v = int(v)
    return wrap_int(int(v), dt)
  return float(v)


def cast_scalar(v: Any, dt: DType) -> Any:
  """A scalar converted to dt the way numpy's np.full would."""
  return np.full((), v, dtype=np_dtype(dt)).item()


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
  """numpy's broadcasting of shapes; ValueError naming the shapes when they do not fit."""
  n = max((len(s) for s in shapes), default=0)
  padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    big = {d for d in dims if d != 1}
    if len(big) > 1:
      raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together")
    out.append(big.pop() if big else 1)
  return tuple(out)


def specialise(v: Any) -> Any:
  """A bound symbolic value (tinygrad's `Variable(...).bind(n)`, or an int expression of bound Variables) as its
  Python int; anything else unchanged. rulec builds graphs, schedules and kernels for the value (docs/api.md,
  "Symbolic shapes"); an unbound Variable raises ValueError (tinygrad's class) naming it."""
  if isinstance(v, UOp) and v.is_symbolic: return int(v) if v.dtype.kind in "iux" else bool(v) if v.dtype.kind == "b" else v
  return v


def symbolic_enabled() -> bool:
  """Bound offsets stay symbolic unless RULEC_SYMBOLIC=0 (then every bound value is specialised, as before)."""
  return os.environ.get("RULEC_SYMBOLIC", "1") != "0"


def bound_expr(x: Any) -> bool:
  """x is an integer expression whose Variables are all bound (so it has a value)."""
  if not (isinstance(x, UOp) and x.is_symbolic and x.dtype.is_int): return False
  bound = {b.src[0] for b in x.toposort() if b.op is Ops.BIND}
  return all(v in bound for v in x.variables())


def symbolic_bounds(b: Any, d: int) -> tuple[Any, Any] | None:
  """A (start, end) pair along an axis of size d kept symbolic, or None (the caller specialises it). Kept when
  an end is a bound (linear) expression and the pair fits the axis for every value in the Variables' ranges, and
  either the size end - start is an int whatever the values (the offset moves: a KV-cache write `cache[:, p:p+1]`,
  GPT-2's `wte.shrink(((tok, tok+1), None))`), or the start is an int (the size is the Variable's: the attention
  over `cache[:, 0:p+1]`; the axis then has its largest size, UOp.sizes). The graph holds the expressions, and
  one schedule and one set of kernels serve every value (the value is a kernel argument)."""
  if not symbolic_enabled() or not isinstance(b, (tuple, list)) or len(b) != 2: return None
  s, e = b
  if not any(bound_expr(x) for x in (s, e)): return None
  if not all(bound_expr(x) or (isinstance(x, (int, np.integer)) and not isinstance(x, bool)) for x in (s, e)): return None
  fs, fe = linear_form(s), linear_form(e)
  if fs is None or fe is None: return None
  lo = s.vmin if isinstance(s, UOp) else int(s)
  hi = e.vmax if isinstance(e, UOp) else int(e)
  if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo and hi <= d): return None
  if fs[0] == fe[0]:   # an offset that moves, a size that does not
    return (s, e) if fe[1] - fs[1] >= 0 else None
  # a size that is a Variable's (`cache[:, 0:p+1]`): from a fixed start, and never negative
  if isinstance(s, UOp) or not isinstance(e, UOp) or e.vmin < int(s): return None
  return (int(s), e)


def specialise_index(it: Any) -> Any:
  """An index item with bound symbolic values (an int, a slice's start, stop and step) specialised to ints."""
  if isinstance(it, UOp): return specialise(it)
  if isinstance(it, slice) and any(isinstance(x, UOp) for x in (it.start, it.stop, it.step)):
    return slice(specialise(it.start), specialise(it.stop), specialise(it.step))
  return it


def int_arg(v: Any, what: str) -> int:
  if isinstance(v, (bool, np.bool_)): raise TypeError(f"{what} must be an integer, got {v!r}")
  try: return operator.index(v)
  except TypeError: raise TypeError(f"{what} must be an integer, got {type(v).__name__} {v!r}") from None


def norm_axis(a: Any, ndim: int) -> int:
  a = int_arg(a, "axis")
  if not -ndim <= a < ndim: raise AxisError(f"axis {a} is out of bounds for a tensor of dimension {ndim}")
  return a + ndim if a < 0 else a


def norm_new_axis(a: Any, ndim: int) -> int:
  """Where a new axis goes in a tensor of ndim dimensions (unsqueeze, stack): -ndim-1 .. ndim."""
  a = int_arg(a, "axis")
  if not -ndim - 1 <= a <= ndim:
    raise AxisError(f"axis {a} is out of bounds for inserting an axis into a tensor of dimension {ndim} "
                    f"(allowed {-ndim - 1}..{ndim})")
  return a + ndim + 1 if a < 0 else a


def norm_axes(axis: Any, ndim: int) -> tuple[int, ...]:
  """Axes (an int, a tuple/list, or None for all) as non-negative ints, in the order given. A 0-d tensor takes 0 and -1
  and they name no axis (tinygrad: `Tensor(3.0).sum(0)` is 3.0)."""
  if axis is None: return tuple(range(ndim))
  axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
  if ndim == 0:
    for a in axes:
      if int_arg(a, "axis") not in (0, -1): raise AxisError(f"axis {a} is out of bounds for a tensor of dimension 0 (0 or -1 allowed)")
    return ()
  out = tuple(norm_axis(a, ndim) for a in axes)
  if len(set(out)) != len(out): raise DuplicateAxisError(f"duplicate value in axis {axis!r}: each axis can appear at most once")
  return out


def shape_arg(shape: tuple, what: str) -> tuple[int, ...]:
  """A shape given as ints or as one tuple/list (a tuple among other arguments, `kaiming_uniform((3, 3), 3)`, is
  ShapeArgError: tinygrad's ValueError, older rulec's TypeError)."""
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  elif any(isinstance(s, (tuple, list)) for s in shape):
    raise ShapeArgError(f"{what}: give the dimensions as ints or as one tuple, not both: {shape!r}")
  out = tuple(int_arg(s, f"{what} dimension") for s in shape)
  return out


def pair_arg(v: Any, what: str) -> tuple[int, int]:
  if isinstance(v, (tuple, list)):
    if len(v) != 2: raise ValueError(f"{what} must be an int or a pair of ints, got {v!r}")
    return (int_arg(v[0], what), int_arg(v[1], what))
  v = int_arg(v, what)
  return (v, v)


def lowest(dt: DType) -> Any:
  if dt.is_bool: return False
  if dt.is_float: return -math.inf
  return dt.min()


def highest(dt: DType) -> Any:
  if dt.is_bool: return True
  if dt.is_float: return math.inf
  return dt.max()


def sum_dtype(dt: DType) -> DType:
  """tinygrad's sum accumulator: small signed ints and bool to int32, small unsigned to uint32."""
  if dt.is_bool or (dt.kind == "i" and dt.itemsize <= 4): return dtypes.int32
  if dt.kind == "u" and dt.itemsize <= 4: return dtypes.uint32
  return dt


def from_numpy_dtype(nd: np.dtype) -> DType:
  if nd.name not in TENSOR_DTYPES:
    raise TypeError(f"cannot make a Tensor from numpy data of dtype {nd}; Tensor dtypes: {', '.join(TENSOR_DTYPES)}")
  return TENSOR_DTYPES[nd.name]


def to_numpy(data: Any, dt: DType | None) -> tuple[np.ndarray, DType]:
  """Host data for a new buffer, and its dtype."""
  if isinstance(data, (np.ndarray, np.generic)):
    arr = np.asarray(data)
    if dt is None: dt = from_numpy_dtype(arr.dtype)
    return arr.astype(np_dtype(dt), copy=False), dt   # (the buffer copies it: buffer.copyin)
  if not isinstance(data, (bool, int, float, list, tuple)):
    raise TypeError(f"cannot make a Tensor from {type(data).__name__}; pass a number, nested lists or a numpy array")
  if dt is not None:
    try: return np.array(data, dtype=np_dtype(dt)), dt
    except ValueError as e: raise ValueError(f"Tensor data must be a number or rectangular nested lists of numbers: {e}") from None
  try: arr = np.array(data)
  except ValueError as e: raise ValueError(f"Tensor data must be a number or rectangular nested lists of numbers: {e}") from None
  k = arr.dtype.kind
  if k == "b": dt = dtypes.bool
  elif k in "iu":
    lo, hi = (int(arr.min()), int(arr.max())) if arr.size else (0, 0)
    dt = dtypes.int32 if -2**31 <= lo and hi < 2**31 else dtypes.int64 if hi < 2**63 else dtypes.uint64
  elif k == "f": dt = dtypes.default_float
  else: raise TypeError(f"cannot make a Tensor from {type(data).__name__} holding {arr.dtype} data (e.g. {data!r:.60})")
  return arr.astype(np_dtype(dt)), dt
