"""The Tensor front end: lazy tensors that build tensor-level UOp graphs.

    from rulec import Tensor, dtypes
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    y = (x @ x.T).softmax().sum(axis=0)
    y.numpy()

A Tensor holds `.uop` (a tensor-level UOp, see docs/architecture.md) and its
device string. Operations only build graphs; `realize()` (or `numpy()`,
`tolist()`, `item()`) computes them through `engine.realize`, and replaces the
tensor's uop with the realized view (`BUFFER.reshape(shape)`), so later graphs
start from the buffer.

Conventions of the graphs built here: elementwise ops get operands of equal
shape (broadcast with RESHAPE + EXPAND) and equal dtype (CAST to the promoted
dtype first); comparisons give bool; reductions are REDUCE_AXIS with keepdim
shapes, followed by a RESHAPE when keepdim=False; transcendentals are built
from EXP2, LOG2, SIN, SQRT, RECIPROCAL.

Types follow numpy 2 (NEP 50) with two changes: the default float is float32
and the default int is int32. Concretely:

- Tensor + Tensor promotes like numpy (`np.result_type`), e.g. int32 + float32
  gives float64, uint8 + int8 gives int16.
- Python scalars are weak: `int8 + 1` stays int8, `float16 + 1.0` stays
  float16, `int32 + 1.5` gives float32 (numpy: float64), `bool + 1` gives
  int32 (numpy: int64). A Python int that does not fit the tensor's integer
  dtype raises OverflowError, as in numpy.
- bool arithmetic is numpy's: `+` is logical or, `*` logical and, `-` and
  unary `-` raise TypeError; `//`, `%`, `**` of bools give int8.
- `/` of ints or bools gives float32 (numpy: float64); so do exp, log, sqrt,
  sin, cos, tanh, sigmoid, mean, var, std, softmax of ints (numpy: float64).
- float16 transcendentals (exp, log, sin, cos, tanh, sigmoid, ...) and float16
  mean/var/std/softmax/log_softmax/layernorm are computed in float32 and
  rounded to float16 (numpy's float16 ufuncs do the same).
- sum/prod of bool, int8, int16, int32 give int32, of uint8, uint16, uint32
  give uint32 (numpy: int64 / uint64); int64, uint64 and floats keep their
  dtype. argmax/argmin give int32 (numpy: int64).
- Nested lists of Python ints become int32 (int64 if a value does not fit),
  of floats float32; numpy arrays keep their dtype.
- `int ** negative int` with a Python exponent raises ValueError like numpy;
  with a tensor exponent it gives 1 for base 1, +-1 for base -1, else 0.
- max/min over an axis of size 0 raise ValueError, as in numpy.
- `//` on floats is the IR's IDIV, floor(a / b) of the rounded quotient
  (engine/alu.py); numpy (and Python) compute it from the remainder, so the
  two can differ by one where the rounding of a / b crosses an integer
  (1.0 // 0.1 is 10.0 here, 9.0 in numpy). `%` on floats is numpy's.
- NaNs propagate through maximum, minimum, clip, max, min and max_pool2d as
  in numpy (the IR's MAX keeps its first operand when the second is NaN and
  its reduction skips NaNs, so these add explicit NaN checks).

Bad input raises at the call that passes it (ValueError, IndexError, TypeError
with a message naming the shapes, axes or values involved): the checks are in
engine/tensor_args.py, the UOp builders the methods share in
engine/tensor_uops.py.
"""
from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from engine import realize as _engine
from engine.dtypes import DType, dtypes
from engine.ops import Ops
from engine.tensor_args import (AxisError, broadcast_shapes, canon_device, cast_scalar, from_numpy_dtype, int_arg,
                                is_py_scalar, lowest, norm_axes, norm_axis, norm_new_axis, pair_arg, promote_types,
                                scalar_of, shape_arg, sum_dtype, to_dtype, to_numpy, weak_dtype)
from engine.tensor_uops import (alu, bcast, cmp, const, take_every, u_abs, u_ceil, u_cos, u_exp, u_floor, u_log,
                                u_max_reduce, u_maximum, u_neg, u_sigmoid, u_sin, u_tanh, window)
from engine.rewrite import substitute
from engine.sched.tensor_helpers import is_buffer_view
from engine.uop import UOp, prod
from runtime.buffer import buffer_of, new_buffer, np_dtype
from runtime.devices import DEVICES

__all__ = ["Tensor", "DEVICES", "AxisError", "broadcast_shapes", "promote_types", "to_dtype"]


def _became(done: dict[UOp, UOp]) -> None:
  """After a realize: every live tensor whose graph holds an assign that was carried out reads the assigned
  buffer from now on, so no assign is carried out twice.

  Other tensors that happen to hold the same graph as a realized one (UOps are hash-consed: two
  `Tensor.full((2, 3), -2)` are one node) keep it and compute it again: sharing the buffer would let an assign
  into one of them change the other."""
  assigned = {u: v for u, v in done.items() if u.op is Ops.ASSIGN}
  if not assigned: return
  for t in list(_LIVE):
    u = t.uop
    if u in assigned: t.uop = assigned[u]
    elif not _engine.is_realized(u):
      new = substitute(u, assigned)
      if new is not u: t.uop = new


# every live Tensor: realizing one graph updates every tensor whose graph holds what was realized
_LIVE: weakref.WeakSet = weakref.WeakSet()


class Tensor:
  """A lazy tensor: a tensor-level UOp graph and the device its value lives on."""
  __slots__ = ("uop", "device", "__weakref__")
  _rng: np.random.Generator = np.random.default_rng()

  def __init__(self, data: Any, dtype: Any = None, device: str | None = None):
    _LIVE.add(self)
    dt = None if dtype is None else to_dtype(dtype)
    if isinstance(data, Tensor):
      t = data if dt is None else data.cast(dt)
      t = t if device is None else t.to(device)
      self.uop, self.device = t.uop, t.device
      return
    dev = canon_device(device)
    if isinstance(data, UOp):
      self.uop, self.device = (data if dt is None else data.cast(dt)), dev
      return
    arr, dt = to_numpy(data, dt)
    buf = new_buffer(dev, arr.size, dt)
    buffer_of(buf).copyin(arr)
    self.uop, self.device = buf.reshape(arr.shape), dev

  @classmethod
  def _from_uop(cls, u: UOp, device: str) -> Tensor:
    t = object.__new__(cls)
    t.uop, t.device = u, device
    _LIVE.add(t)
    return t

  def _new(self, u: UOp) -> Tensor: return Tensor._from_uop(u, self.device)

  # *** properties ***

  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return prod(self.shape)
  @property
  def T(self) -> Tensor: return self.permute(tuple(range(self.ndim))[::-1])

  def __repr__(self) -> str:
    return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device!r}>"

  def __len__(self) -> int:
    if self.ndim == 0: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]

  def __iter__(self):
    for i in range(len(self)): yield self[i]

  __hash__ = object.__hash__

  def __bool__(self) -> bool:
    if self.numel() != 1:
      raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous; use .any() or .all()")
    return bool(self.item())

  def __float__(self) -> float: return float(self.item())
  def __int__(self) -> int: return int(self.item())

  # *** creation ***

  @classmethod
  def manual_seed(cls, seed: int = 0) -> None:
    """Seed the generator behind rand, randn and randint."""
    cls._rng = np.random.default_rng(seed)

  @staticmethod
  def full(shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    shape = shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,), "shape")
    if any(s < 0 for s in shape): raise ValueError(f"negative dimensions are not allowed: {shape}")
    if dtype is not None: dt = to_dtype(dtype)
    elif isinstance(fill_value, np.generic): dt = from_numpy_dtype(fill_value.dtype)
    elif isinstance(fill_value, bool): dt = dtypes.bool
    elif isinstance(fill_value, int): dt = dtypes.default_int if -2**31 <= fill_value < 2**31 else dtypes.int64
    elif isinstance(fill_value, float): dt = dtypes.default_float
    else: raise TypeError(f"fill_value must be a scalar, got {type(fill_value).__name__}")
    return Tensor._from_uop(const(cast_scalar(fill_value, dt), dt, shape), canon_device(device))

  @staticmethod
  def zeros(*shape, dtype: Any = None, device: str | None = None) -> Tensor:
    return Tensor.full(shape_arg(shape, "shape"), 0, dtype=dtypes.default_float if dtype is None else dtype, device=device)

  @staticmethod
  def ones(*shape, dtype: Any = None, device: str | None = None) -> Tensor:
    return Tensor.full(shape_arg(shape, "shape"), 1, dtype=dtypes.default_float if dtype is None else dtype, device=device)

  def zeros_like(self, dtype: Any = None) -> Tensor: return Tensor.zeros(self.shape, dtype=dtype or self.dtype, device=self.device)
  def ones_like(self, dtype: Any = None) -> Tensor: return Tensor.ones(self.shape, dtype=dtype or self.dtype, device=self.device)
  def full_like(self, fill_value: Any, dtype: Any = None) -> Tensor:
    return Tensor.full(self.shape, fill_value, dtype=dtype or self.dtype, device=self.device)

  @staticmethod
  def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, device: str | None = None) -> Tensor:
    if stop is None: start, stop = 0, start
    for v, name in ((start, "start"), (stop, "stop"), (step, "step")):
      if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, (bool, np.bool_)):
        raise TypeError(f"arange {name} must be a number, got {v!r}")
    if step == 0: raise ValueError("arange step must not be zero")
    if dtype is None:
      dtype = dtypes.default_float if any(isinstance(v, (float, np.floating)) for v in (start, stop, step)) else dtypes.default_int
    return Tensor(np.arange(start, stop, step), dtype=dtype, device=device)

  @staticmethod
  def eye(n: int, m: int | None = None, dtype: Any = None, device: str | None = None) -> Tensor:
    n = int_arg(n, "eye n")
    m = n if m is None else int_arg(m, "eye m")
    if n < 0 or m < 0: raise ValueError(f"eye needs non-negative sizes, got n={n}, m={m}")
    return Tensor(np.eye(n, m), dtype=dtypes.default_float if dtype is None else dtype, device=device)

  @staticmethod
  def _random(kind: str, shape: tuple, dtype: Any, device: str | None) -> Tensor:
    shape = shape_arg(shape, "shape")
    if any(s < 0 for s in shape): raise ValueError(f"negative dimensions are not allowed: {shape}")
    dt = dtypes.default_float if dtype is None else to_dtype(dtype)
    if not dt.is_float: raise TypeError(f"{kind} needs a float dtype, got {dt.name}")
    gen = np.float64 if dt is dtypes.float64 else np.float32
    rng = Tensor._rng
    if kind == "rand":
      a = rng.random(shape, dtype=gen).astype(np_dtype(dt))
      if dt is dtypes.float16: a = np.minimum(a, np.nextafter(np.float16(1), np.float16(0)))  # stay below 1
    else: a = rng.standard_normal(shape, dtype=gen).astype(np_dtype(dt))
    return Tensor(a, dtype=dt, device=device)

  @staticmethod
  def rand(*shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """Uniform in [0, 1)."""
    return Tensor._random("rand", shape, dtype, device)

  @staticmethod
  def randn(*shape, dtype: Any = None, device: str | None = None) -> Tensor:
    """Standard normal."""
    return Tensor._random("randn", shape, dtype, device)

  @staticmethod
  def randint(low: int, high: int | None = None, shape: Any = (), dtype: Any = None, device: str | None = None) -> Tensor:
    """Uniform integers in [low, high) (or [0, low))."""
    if high is None: low, high = 0, low
    low, high = int_arg(low, "randint low"), int_arg(high, "randint high")
    if high <= low: raise ValueError(f"randint needs low < high, got low={low}, high={high}")
    shape = shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,), "shape")
    dt = dtypes.default_int if dtype is None else to_dtype(dtype)
    return Tensor(Tensor._rng.integers(low, high, shape), dtype=dt, device=device)

  # *** realizing ***

  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor (and others: `Tensor.realize(a, b, c)`) into buffers; returns self."""
    ts = [self, *others]
    for t in ts:
      if not isinstance(t, Tensor): raise TypeError(f"realize() takes Tensors, got {type(t).__name__}")
    todo, seen = [], set()
    for t in ts:
      if id(t) not in seen and not _engine.is_realized(t.uop): seen.add(id(t)); todo.append(t)
    if todo:
      # two tensors holding one (hash-consed) graph get a buffer each: an assign into one must not show in the other
      uops, firsts = [], set()
      for t in todo:
        uops.append(t.uop if t.uop not in firsts else UOp(Ops.CONTIGUOUS, t.dtype, (t.uop,), tag="copy"))
        firsts.add(t.uop)
      done = _engine.realize_map(uops, [t.device for t in todo])
      for t, u in zip(todo, uops): t.uop = done.get(u, u)
      _became(done)
    return self

  def schedule(self, *others: Tensor):
    """The kernels realizing these tensors would run (`Tensor.schedule(a, b)`)."""
    ts = (self, *others)
    return _engine.schedule([t.uop for t in ts], [t.device for t in ts])

  def numpy(self) -> np.ndarray:
    """The value as a new numpy array (realizes the tensor)."""
    self.realize()
    return np.array(_engine.host_value(self.uop), copy=True).reshape(self.shape)

  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    a = self.numpy()
    return a if dtype is None else a.astype(dtype)

  def tolist(self) -> Any: return self.numpy().tolist()

  def item(self) -> Any:
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with exactly one element, got shape {self.shape}")
    return self.numpy().reshape(()).item()

  def to(self, device: str) -> Tensor:
    d = canon_device(device)
    if d == self.device: return self
    return Tensor._from_uop(UOp(Ops.COPY, self.dtype, (self.uop,), d), d)

  def contiguous(self) -> Tensor:
    """This value laid out in order in a buffer. A realized tensor that already is (a whole buffer) is returned
    as itself, sharing the buffer, as in tinygrad and torch; `clone()` always copies."""
    return self._new(self.uop if is_buffer_view(self.uop) else self.uop.contiguous())
  def detach(self) -> Tensor: return self._new(UOp(Ops.DETACH, self.dtype, (self.uop,)))
  def clone(self) -> Tensor:
    """A copy in a buffer of its own (contiguous() of a realized tensor is that tensor's buffer; this never is)."""
    return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), tag="copy"))

  def assign(self, x: Any) -> Tensor:
    """Write x (broadcast and cast to this tensor's shape and dtype) into this tensor's storage.

    Lazy like everything else: the write happens when the tensor is realized.
    When this tensor is a view of a buffer (a realized tensor, a slice or
    transpose of one) the write goes through the view into that buffer;
    otherwise the tensor gets a fresh buffer."""
    if self.uop.base.op is Ops.ASSIGN: self.realize()   # an earlier assign is carried out first, not lost
    if isinstance(x, Tensor): self._same_device(x); v = x
    elif is_py_scalar(x) or isinstance(x, np.generic):
      v = Tensor._from_uop(const(cast_scalar(x, self.dtype), self.dtype, ()), self.device)
    else: v = Tensor(x, device=self.device)
    try: shape = broadcast_shapes(v.shape, self.shape)
    except ValueError: shape = None
    if shape != self.shape:
      raise ValueError(f"assign: a value of shape {v.shape} does not fit a tensor of shape {self.shape}")
    value = bcast(v.uop.cast(self.dtype), self.shape)
    target = self.uop
    if target.base.op is Ops.BUFFER:
      try: _engine.view_indices(target)
      except ValueError as e: raise ValueError(f"assign to a tensor of shape {self.shape}: {e}") from None
    else: target = new_buffer(self.device, self.numel(), self.dtype).reshape(self.shape)
    self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value))
    return self

  def __setitem__(self, idx: Any, value: Any) -> None:
    if self.uop.base.op is not Ops.BUFFER: self.realize()
    view = self[idx]
    view.assign(value).realize()

  # *** binary operand plumbing ***

  def _same_device(self, other: Tensor) -> None:
    if other.device != self.device:
      raise ValueError(f"tensors are on different devices: {self.device} and {other.device}; move one with .to()")

  def _pair(self, other: Any, reverse: bool = False) -> tuple[UOp, UOp] | None:
    """self and other as UOps of one broadcast shape and one promoted dtype (None: not an operand)."""
    if isinstance(other, Tensor):
      self._same_device(other)
      dt = promote_types(self.dtype, other.dtype)
      shape = broadcast_shapes(self.shape, other.shape)
      x, y = bcast(self.uop.cast(dt), shape), bcast(other.uop.cast(dt), shape)
    elif is_py_scalar(other):
      dt = weak_dtype(self.dtype, other)
      x = self.uop.cast(dt)
      y = x.const_like(scalar_of(other, dt))
    elif isinstance(other, (np.ndarray, np.generic, list, tuple)):
      return self._pair(Tensor(other, device=self.device), reverse)
    else: return None
    return (y, x) if reverse else (x, y)

  def _arith(self, other: Any, op: Ops, reverse: bool = False) -> Tensor:
    p = self._pair(other, reverse)
    if p is None: return NotImplemented
    x, y = p
    if x.dtype.is_bool:
      if op is Ops.ADD: op = Ops.OR
      elif op is Ops.MUL: op = Ops.AND
      elif op is Ops.SUB:
        raise TypeError("bool - bool is not supported (numpy refuses it too); use ^ (xor) or cast to an integer dtype")
      elif op in (Ops.IDIV, Ops.MOD, Ops.POW): x, y = x.cast(dtypes.int8), y.cast(dtypes.int8)  # numpy gives int8
    if op is Ops.POW and x.dtype.is_int and not reverse and is_py_scalar(other) and other < 0:
      raise ValueError(f"integers to negative integer powers are not allowed ({self.dtype.name} ** {other})")
    return self._new(alu(op, x, y))

  def __add__(self, o): return self._arith(o, Ops.ADD)
  def __radd__(self, o): return self._arith(o, Ops.ADD, True)
  def __sub__(self, o): return self._arith(o, Ops.SUB)
  def __rsub__(self, o): return self._arith(o, Ops.SUB, True)
  def __mul__(self, o): return self._arith(o, Ops.MUL)
  def __rmul__(self, o): return self._arith(o, Ops.MUL, True)
  def __floordiv__(self, o): return self._arith(o, Ops.IDIV)
  def __rfloordiv__(self, o): return self._arith(o, Ops.IDIV, True)
  def __mod__(self, o): return self._arith(o, Ops.MOD)
  def __rmod__(self, o): return self._arith(o, Ops.MOD, True)
  def __pow__(self, o): return self._arith(o, Ops.POW)
  def __rpow__(self, o): return self._arith(o, Ops.POW, True)

  def _truediv(self, other: Any, reverse: bool = False) -> Tensor:
    p = self._pair(other, reverse)
    if p is None: return NotImplemented
    x, y = p
    if not x.dtype.is_float: x, y = x.cast(dtypes.default_float), y.cast(dtypes.default_float)
    return self._new(alu(Ops.FDIV, x, y))

  def __truediv__(self, o): return self._truediv(o)
  def __rtruediv__(self, o): return self._truediv(o, True)

  def _bitwise(self, other: Any, op: Ops, reverse: bool = False) -> Tensor:
    p = self._pair(other, reverse)
    if p is None: return NotImplemented
    x, y = p
    if x.dtype.is_float or (op in (Ops.SHL, Ops.SHR) and x.dtype.is_bool):
      raise TypeError(f"{op.name.lower()} needs integer or bool tensors, got {x.dtype.name}")
    return self._new(alu(op, x, y))

  def __and__(self, o): return self._bitwise(o, Ops.AND)
  def __rand__(self, o): return self._bitwise(o, Ops.AND, True)
  def __or__(self, o): return self._bitwise(o, Ops.OR)
  def __ror__(self, o): return self._bitwise(o, Ops.OR, True)
  def __xor__(self, o): return self._bitwise(o, Ops.XOR)
  def __rxor__(self, o): return self._bitwise(o, Ops.XOR, True)
  def __lshift__(self, o): return self._bitwise(o, Ops.SHL)
  def __rlshift__(self, o): return self._bitwise(o, Ops.SHL, True)
  def __rshift__(self, o): return self._bitwise(o, Ops.SHR)
  def __rrshift__(self, o): return self._bitwise(o, Ops.SHR, True)

  def __invert__(self) -> Tensor:
    dt = self.dtype
    if dt.is_float: raise TypeError(f"~ needs an integer or bool tensor, got {dt.name}")
    return self._new(alu(Ops.XOR, self.uop, self.uop.const_like(True if dt.is_bool else -1 if dt.kind == "i" else dt.max())))

  def __neg__(self) -> Tensor:
    if self.dtype.is_bool: raise TypeError("unary - of a bool tensor is not supported (numpy refuses it too); use ~")
    return self._new(u_neg(self.uop))

  def __pos__(self) -> Tensor: return self

  # comparisons (numpy's NaN behaviour: a <= b is (a < b) or (a == b))
  def _compare(self, other: Any, kind: str) -> Tensor:
    p = self._pair(other)
    if p is None: return NotImplemented
    x, y = p
    if kind == "lt": u = cmp(Ops.CMPLT, x, y)
    elif kind == "gt": u = cmp(Ops.CMPLT, y, x)
    elif kind == "le": u = alu(Ops.OR, cmp(Ops.CMPLT, x, y), cmp(Ops.CMPEQ, x, y))
    elif kind == "ge": u = alu(Ops.OR, cmp(Ops.CMPLT, y, x), cmp(Ops.CMPEQ, x, y))
    elif kind == "eq": u = cmp(Ops.CMPEQ, x, y)
    else: u = cmp(Ops.CMPNE, x, y)
    return self._new(u)

  def __lt__(self, o): return self._compare(o, "lt")
  def __le__(self, o): return self._compare(o, "le")
  def __gt__(self, o): return self._compare(o, "gt")
  def __ge__(self, o): return self._compare(o, "ge")
  def __eq__(self, o): return self._compare(o, "eq")  # type: ignore[override]
  def __ne__(self, o): return self._compare(o, "ne")  # type: ignore[override]

  def _binary(self, other: Any, name: str) -> tuple[UOp, UOp]:
    p = self._pair(other)
    if p is None: raise TypeError(f"{name}: unsupported operand of type {type(other).__name__}")
    return p

  def maximum(self, other: Any) -> Tensor:
    x, y = self._binary(other, "maximum")
    return self._new(u_maximum(x, y))

  def minimum(self, other: Any) -> Tensor:
    x, y = self._binary(other, "minimum")
    if x.dtype.is_float: return self._new(u_neg(u_maximum(u_neg(x), u_neg(y))))
    if x.dtype.is_bool: return self._new(alu(Ops.AND, x, y))
    return self._new(UOp(Ops.WHERE, x.dtype, (cmp(Ops.CMPLT, x, y), x, y)))

  def where(self, x: Any, y: Any) -> Tensor:
    """numpy's where(self, x, y): x where self is true, else y (self is cast to bool)."""
    cond = self.uop if self.dtype.is_bool else self.uop.cast(dtypes.bool)
    xs, ys = is_py_scalar(x), is_py_scalar(y)
    if xs and ys:
      dt = dtypes.default_float if isinstance(x, float) or isinstance(y, float) else \
        dtypes.bool if isinstance(x, bool) and isinstance(y, bool) else dtypes.default_int
      shape = self.shape
      xu, yu = const(scalar_of(x, dt), dt, shape), const(scalar_of(y, dt), dt, shape)
    else:
      xt = None if xs else x if isinstance(x, Tensor) else Tensor(x, device=self.device)
      yt = None if ys else y if isinstance(y, Tensor) else Tensor(y, device=self.device)
      for t in (xt, yt):
        if t is not None: self._same_device(t)
      if xt is not None and yt is not None: dt = promote_types(xt.dtype, yt.dtype)
      elif xt is not None: dt = weak_dtype(xt.dtype, y)
      else: dt = weak_dtype(yt.dtype, x)
      shape = broadcast_shapes(self.shape, *(t.shape for t in (xt, yt) if t is not None))
      xu = bcast(xt.uop.cast(dt), shape) if xt is not None else const(scalar_of(x, dt), dt, shape)
      yu = bcast(yt.uop.cast(dt), shape) if yt is not None else const(scalar_of(y, dt), dt, shape)
    return self._new(UOp(Ops.WHERE, dt, (bcast(cond, shape), xu, yu)))

  def clip(self, min_: Any = None, max_: Any = None) -> Tensor:
    """numpy's clip: minimum(maximum(self, min_), max_); either bound may be None."""
    r = self
    if min_ is not None: r = r.maximum(min_)
    if max_ is not None: r = r.minimum(max_)
    return r

  def cast(self, dtype: Any) -> Tensor: return self._new(self.uop.cast(to_dtype(dtype)))
  def bitcast(self, dtype: Any) -> Tensor:
    dt = to_dtype(dtype)
    if dt.itemsize != self.dtype.itemsize:
      raise ValueError(f"bitcast from {self.dtype.name} to {dt.name} changes the item size ({self.dtype.itemsize} -> {dt.itemsize})")
    return self._new(self.uop.bitcast(dt))

  # *** unary math ***

  def _float_unary(self, fn) -> Tensor:
    x = self.uop if self.dtype.is_float else self.uop.cast(dtypes.default_float)
    if x.dtype is dtypes.float16: return self._new(fn(x.cast(dtypes.float32)).cast(dtypes.float16))
    return self._new(fn(x))

  def exp(self) -> Tensor: return self._float_unary(u_exp)
  def exp2(self) -> Tensor: return self._float_unary(lambda x: alu(Ops.EXP2, x))
  def log(self) -> Tensor: return self._float_unary(u_log)
  def log2(self) -> Tensor: return self._float_unary(lambda x: alu(Ops.LOG2, x))
  def sqrt(self) -> Tensor: return self._float_unary(lambda x: alu(Ops.SQRT, x))
  def rsqrt(self) -> Tensor: return self._float_unary(lambda x: alu(Ops.RECIPROCAL, alu(Ops.SQRT, x)))
  def reciprocal(self) -> Tensor: return self._float_unary(lambda x: alu(Ops.RECIPROCAL, x))
  def sin(self) -> Tensor: return self._float_unary(u_sin)
  def cos(self) -> Tensor: return self._float_unary(u_cos)
  def tanh(self) -> Tensor: return self._float_unary(u_tanh)
  def sigmoid(self) -> Tensor: return self._float_unary(u_sigmoid)

  def _float_keep(self, fn) -> Tensor:
    """fn on floats; integers and bools are returned unchanged (trunc, floor, ceil of ints)."""
    return self._new(fn(self.uop)) if self.dtype.is_float else self

  def trunc(self) -> Tensor: return self._float_keep(lambda x: alu(Ops.TRUNC, x))
  def floor(self) -> Tensor: return self._float_keep(u_floor)
  def ceil(self) -> Tensor: return self._float_keep(u_ceil)

  def abs(self) -> Tensor:
    if self.dtype.is_bool or self.dtype.is_unsigned: return self
    return self._new(u_abs(self.uop))
  __abs__ = abs

  def relu(self) -> Tensor:
    if self.dtype.is_bool: return self
    return self._new(alu(Ops.MAX, self.uop, self.uop.const_like(0)))

  def square(self) -> Tensor:
    x = self.cast(dtypes.int8) if self.dtype.is_bool else self  # numpy's square of bool is int8
    return x * x

  # *** reductions ***

  def _reduce(self, op: Ops, axis: Any, keepdim: bool, u: UOp | None = None, numpy_nan: bool = True) -> UOp:
    """A reduction (keepdim shape, then a reshape unless keepdim); MAX propagates NaNs like numpy unless numpy_nan=False."""
    u = self.uop if u is None else u
    axes = norm_axes(axis, len(u.shape))
    shape = u.shape
    if axes: u = u_max_reduce(u, axes) if op is Ops.MAX and numpy_nan else u.r(op, axes)
    if not keepdim: u = u.reshape(tuple(d for i, d in enumerate(shape) if i not in axes))
    return u

  def _check_nonempty(self, axis: Any, name: str) -> None:
    axes = norm_axes(axis, self.ndim)
    if any(self.shape[a] == 0 for a in axes):
      raise ValueError(f"{name}() of a tensor of shape {self.shape} over axis {axis}: a zero-size reduction has no identity")

  def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    dt = sum_dtype(self.dtype) if dtype is None else to_dtype(dtype)
    u = self.uop.cast(dt)
    return self._new(self._reduce(Ops.ADD, axis, keepdim, u))

  def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    dt = sum_dtype(self.dtype) if dtype is None else to_dtype(dtype)
    return self._new(self._reduce(Ops.MUL, axis, keepdim, self.uop.cast(dt)))

  def max(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    self._check_nonempty(axis, "max")
    return self._new(self._reduce(Ops.MAX, axis, keepdim))

  def min(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    self._check_nonempty(axis, "min")
    return self._new(self._flip_order(self._reduce(Ops.MAX, axis, keepdim, self._flip_order(self.uop))))

  @staticmethod
  def _flip_order(u: UOp) -> UOp:
    """An order-reversing bijection (its own inverse): -x for floats (keeps NaN), ~x for ints and bools."""
    if u.dtype.is_float: return u_neg(u)
    return alu(Ops.XOR, u, u.const_like(True if u.dtype.is_bool else -1 if u.dtype.kind == "i" else u.dtype.max()))

  def any(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    return self._new(self._reduce(Ops.MAX, axis, keepdim, self.uop.cast(dtypes.bool)))

  def all(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    return ~(~self.bool()).any(axis, keepdim)

  def _half_up(self) -> tuple[Tensor, DType]:
    """A float tensor to compute in (float16 -> float32, ints -> float32) and the dtype to return."""
    if self.dtype is dtypes.float16: return self.cast(dtypes.float32), dtypes.float16
    if not self.dtype.is_float: return self.cast(dtypes.default_float), dtypes.default_float
    return self, self.dtype

  def _count(self, axis: Any) -> int:
    return prod(self.shape[a] for a in norm_axes(axis, self.ndim))

  def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    x, out = self._half_up()
    return (x.sum(axis, keepdim) / self._count(axis)).cast(out)

  def var(self, axis: Any = None, keepdim: bool = False, ddof: int = 0) -> Tensor:
    """numpy's var: mean squared deviation, divided by max(n - ddof, 0)."""
    x, out = self._half_up()
    d = x - x.mean(axis, keepdim=True)
    return ((d * d).sum(axis, keepdim) / max(self._count(axis) - ddof, 0)).cast(out)

  def std(self, axis: Any = None, keepdim: bool = False, ddof: int = 0) -> Tensor:
    x, out = self._half_up()
    return x.var(axis, keepdim, ddof).sqrt().cast(out)

  def _arg_best(self, axis: Any, keepdim: bool, name: str, x: Tensor) -> Tensor:
    if axis is None:
      if self.numel() == 0: raise ValueError(f"attempt to get {name} of an empty tensor")
      r = x.flatten()._arg_best(0, False, name, x.flatten())
      return r.reshape((1,) * self.ndim) if keepdim else r
    ax = norm_axis(axis, self.ndim)
    n = self.shape[ax]
    if n == 0: raise ValueError(f"attempt to get {name} of an empty sequence (axis {axis} of shape {self.shape})")
    m = x.max(ax, keepdim=True)
    hit = x == m
    if x.dtype.is_float: hit = hit | (x != x)  # numpy: the first NaN wins
    rev = Tensor.arange(n, 0, -1, dtype=dtypes.int32, device=self.device).reshape(tuple(n if i == ax else 1 for i in range(self.ndim)))
    best = hit.where(rev, 0).max(ax, keepdim=keepdim)
    return n - best

  def argmax(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """Index of the first largest element (int32); NaN counts as largest, like numpy."""
    return self._arg_best(axis, keepdim, "argmax", self)

  def argmin(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    return self._arg_best(axis, keepdim, "argmin", self._new(self._flip_order(self.uop)))

  # *** movement ***

  def reshape(self, *shape) -> Tensor:
    new = shape_arg(shape, "reshape")
    n = self.numel()
    if sum(1 for s in new if s == -1) > 1: raise ValueError(f"reshape: only one dimension can be -1, got {new}")
    if any(s < -1 for s in new): raise ValueError(f"reshape: negative dimension in {new}")
    if -1 in new:
      known = prod(s for s in new if s != -1)
      if known == 0 or n % known != 0:
        raise ValueError(f"cannot reshape a tensor of shape {self.shape} (size {n}) into shape {new}")
      new = tuple(n // known if s == -1 else s for s in new)
    if prod(new) != n: raise ValueError(f"cannot reshape a tensor of shape {self.shape} (size {n}) into shape {new}")
    return self._new(self.uop.reshape(new))

  def permute(self, *order) -> Tensor:
    order = shape_arg(order, "permute")
    nd = self.ndim
    if len(order) != nd:
      raise ValueError(f"permute order {order} does not name each of the {nd} axes of shape {self.shape} once")
    norm = tuple(norm_axis(a, nd) for a in order)
    if sorted(norm) != list(range(nd)):
      raise ValueError(f"permute order {order} does not name each of the {nd} axes of shape {self.shape} once")
    return self._new(self.uop.permute(norm))

  def transpose(self, ax0: int | None = None, ax1: int | None = None) -> Tensor:
    """transpose() reverses the axes (numpy); transpose(a, b) swaps axes a and b."""
    if ax0 is None and ax1 is None: return self.T
    if ax0 is None or ax1 is None: raise TypeError("transpose takes no axes or two axes to swap")
    a, b = norm_axis(ax0, self.ndim), norm_axis(ax1, self.ndim)
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  def expand(self, *shape) -> Tensor:
    """Broadcast to shape (numpy's broadcast_to; -1 keeps a dimension)."""
    new = shape_arg(shape, "expand")
    old = self.shape
    if len(new) < len(old): raise ValueError(f"cannot expand shape {old} to {new}: fewer dimensions")
    lead = len(new) - len(old)
    full = []
    for i, s in enumerate(new):
      o = old[i - lead] if i >= lead else None
      if s == -1:
        if o is None: raise ValueError(f"cannot expand shape {old} to {new}: -1 for a new leading dimension")
        s = o
      if s < 0: raise ValueError(f"cannot expand shape {old} to {new}: negative dimension")
      if o is not None and o != s and o != 1: raise ValueError(f"cannot expand shape {old} to {new}: axis {i} has size {o}")
      full.append(s)
    return self._new(bcast(self.uop, tuple(full)))

  def broadcast_to(self, *shape) -> Tensor: return self.expand(*shape)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = norm_axis(start_dim, self.ndim), norm_axis(end_dim, self.ndim)
    if s > e: raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} (shape {self.shape})")
    sh = self.shape
    return self.reshape(sh[:s] + (prod(sh[s:e + 1]),) + sh[e + 1:])

  def squeeze(self, axis: Any = None) -> Tensor:
    sh = self.shape
    if axis is None: axes = tuple(i for i, d in enumerate(sh) if d == 1)
    else:
      axes = norm_axes(axis, self.ndim)
      for a in axes:
        if sh[a] != 1: raise ValueError(f"cannot squeeze axis {a} of size {sh[a]} (shape {sh}): only size-1 axes can be squeezed")
    return self.reshape(tuple(d for i, d in enumerate(sh) if i not in axes))

  def unsqueeze(self, axis: int) -> Tensor:
    a = norm_new_axis(axis, self.ndim)
    sh = self.shape
    return self.reshape(sh[:a] + (1,) + sh[a:])

  def pad(self, padding: Any, value: Any = 0) -> Tensor:
    """numpy-style padding: ((before, after), ...) per axis (None for none), or one int for every side.

    Negative amounts crop. The fill is `value` cast to the tensor's dtype."""
    nd = self.ndim
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool): pads = ((int(padding),) * 2,) * nd
    else:
      pads = tuple(padding)
      if len(pads) != nd: raise ValueError(f"pad: {len(pads)} (before, after) pairs given for a tensor of shape {self.shape}")
      pads = tuple((0, 0) if p is None else pair_arg(p, "pad amount") for p in pads)
    sh = self.shape
    for i, ((b, a), d) in enumerate(zip(pads, sh)):
      if min(b, 0) + min(a, 0) + d < 0: raise ValueError(f"pad: cropping {pads[i]} is more than axis {i} of shape {sh} holds")
    u = self.uop.shrink(tuple((-min(b, 0), d + min(a, 0)) for (b, a), d in zip(pads, sh)))
    pos = tuple((max(b, 0), max(a, 0)) for b, a in pads)
    padded = u.pad(pos)
    fill = cast_scalar(value, self.dtype)
    zero_fill = fill == 0 and not (self.dtype.is_float and math.copysign(1.0, fill) < 0)
    if zero_fill or padded is u: return self._new(padded)
    mask = const(True, dtypes.bool, u.shape).pad(pos)
    return self._new(UOp(Ops.WHERE, self.dtype, (mask, padded, padded.const_like(fill))))

  def shrink(self, bounds: Any) -> Tensor:
    """Keep [start, end) along each axis: ((start, end) or None, ...)."""
    bounds = tuple(bounds)
    sh = self.shape
    if len(bounds) != len(sh): raise ValueError(f"shrink: {len(bounds)} bounds given for a tensor of shape {sh}")
    out = []
    for i, (b, d) in enumerate(zip(bounds, sh)):
      s, e = (0, d) if b is None else pair_arg(b, "shrink bound")
      if not 0 <= s <= e <= d: raise ValueError(f"shrink: bounds ({s}, {e}) do not fit axis {i} of shape {sh}")
      out.append((s, e))
    return self._new(self.uop.shrink(tuple(out)))

  def flip(self, axis: Any = None) -> Tensor:
    axes = norm_axes(axis, self.ndim)
    return self._new(self.uop.flip(tuple(i in axes for i in range(self.ndim))))

  def __getitem__(self, idx: Any) -> Tensor:
    """Basic indexing: ints (negative ok), slices (any step), None and one Ellipsis."""
    items = idx if isinstance(idx, tuple) else (idx,)
    for it in items:
      if it is None or it is Ellipsis or isinstance(it, slice): continue
      if isinstance(it, (bool, np.bool_)): raise TypeError("indexing with booleans is not supported")
      if isinstance(it, (int, np.integer)): continue
      if isinstance(it, Tensor): raise TypeError("indexing with a Tensor is not supported; use where() or matmul with a one-hot")
      raise TypeError(f"unsupported index {it!r} of type {type(it).__name__}: use ints, slices, None and ...")
    if sum(1 for it in items if it is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    nd = self.ndim
    if used > nd: raise IndexError(f"too many indices for tensor: tensor is {nd}-dimensional, but {used} were indexed")
    if any(it is Ellipsis for it in items):
      k = next(i for i, it in enumerate(items) if it is Ellipsis)
      items = items[:k] + (slice(None),) * (nd - used) + items[k + 1:]
    else: items = items + (slice(None),) * (nd - used)
    u, sh = self.uop, self.shape
    flips, bounds, steps, out_shape = [], [], [], []
    ax = 0
    for it in items:
      if it is None: out_shape.append(1); continue
      d = sh[ax]
      if isinstance(it, slice):
        start, stop, step = it.indices(d)
        n = len(range(start, stop, step))
        if step < 0: start, step = d - 1 - start, -step  # read the flipped axis forwards
        flips.append(it.indices(d)[2] < 0)
        bounds.append((start, start + (n - 1) * step + 1) if n > 0 else (0, 0))
        steps.append((step, n))
        out_shape.append(n)
      else:
        i = int(it)
        if not -d <= i < d: raise IndexError(f"index {i} is out of bounds for axis {ax} with size {d}")
        i = i + d if i < 0 else i
        flips.append(False)
        bounds.append((i, i + 1))
        steps.append((1, 1))
      ax += 1
    u = u.flip(tuple(flips)).shrink(tuple(bounds))
    for a, (step, n) in enumerate(steps):
      if step > 1 and n > 1: u = take_every(u, a, n, step)
    return self._new(u.reshape(tuple(out_shape)))

  # *** joining ***

  def cat(self, *others: Tensor, axis: int = 0) -> Tensor:
    """numpy's concatenate: `Tensor.cat(a, b, axis=1)`, `a.cat(b, c)` or `Tensor.cat([a, b])`."""
    ts = (list(self) if isinstance(self, (list, tuple)) else [self]) + list(others)
    if not ts: raise ValueError("cat needs at least one tensor")
    for t in ts:
      if not isinstance(t, Tensor): raise TypeError(f"cat takes Tensors, got {type(t).__name__}")
      ts[0]._same_device(t)
    nd = ts[0].ndim
    shapes = [t.shape for t in ts]
    if nd == 0: raise ValueError("zero-dimensional tensors cannot be concatenated")
    a = norm_axis(axis, nd)
    for s in shapes:
      if len(s) != nd or any(s[i] != shapes[0][i] for i in range(nd) if i != a):
        raise ValueError(f"cat along axis {axis}: shapes {' and '.join(map(str, shapes))} differ off that axis")
    dt = promote_types(*(t.dtype for t in ts))
    total = sum(s[a] for s in shapes)
    out, off = None, 0
    for t in ts:
      n = t.shape[a]
      p = t.uop.cast(dt).pad(tuple((off, total - off - n) if i == a else (0, 0) for i in range(nd)))
      out = p if out is None else alu(Ops.OR if dt.is_bool else Ops.ADD, out, p)
      off += n
    return ts[0]._new(out)

  def stack(self, *others: Tensor, axis: int = 0) -> Tensor:
    """numpy's stack: `Tensor.stack(a, b, axis=0)` or `Tensor.stack([a, b])`."""
    ts = (list(self) if isinstance(self, (list, tuple)) else [self]) + list(others)
    if not ts: raise ValueError("stack needs at least one tensor")
    for t in ts:
      if not isinstance(t, Tensor): raise TypeError(f"stack takes Tensors, got {type(t).__name__}")
    shapes = [t.shape for t in ts]
    if any(s != shapes[0] for s in shapes):
      raise ValueError(f"stack needs tensors of one shape, got {' and '.join(map(str, shapes))}")
    a = norm_new_axis(axis, ts[0].ndim)
    return Tensor.cat(*[t.unsqueeze(a) for t in ts], axis=a)

  # *** linear algebra and nn ***

  def matmul(self, other: Any) -> Tensor:
    """numpy's matmul: 1-D operands gain and lose an axis; batch axes broadcast."""
    o = other if isinstance(other, Tensor) else Tensor(other, device=self.device)
    return Tensor._matmul(self, o)

  @staticmethod
  def _matmul(a: Tensor, b: Tensor) -> Tensor:
    a._same_device(b)
    sa, sb = a.shape, b.shape
    if a.ndim == 0 or b.ndim == 0:
      raise ValueError(f"matmul needs operands with at least 1 dimension, got shapes {sa} and {sb}")
    dt = promote_types(a.dtype, b.dtype)
    au, bu = a.uop.cast(dt), b.uop.cast(dt)
    if a.ndim == 1: au = au.reshape((1,) + sa)
    if b.ndim == 1: bu = bu.reshape(sb + (1,))
    (n, k), (k2, m) = au.shape[-2:], bu.shape[-2:]
    if k != k2: raise ValueError(f"matmul: shapes {sa} and {sb} do not align ({k} != {k2})")
    try: batch = broadcast_shapes(au.shape[:-2], bu.shape[:-2])
    except ValueError: raise ValueError(f"matmul: batch axes of shapes {sa} and {sb} cannot be broadcast together") from None
    au = bcast(au.reshape(au.shape[:-1] + (1, k)), batch + (n, m, k))
    nb = len(bu.shape)
    bu = bu.permute(tuple(range(nb - 2)) + (nb - 1, nb - 2))
    bu = bcast(bu.reshape(bu.shape[:-2] + (1, m, k)), batch + (n, m, k))
    r = alu(Ops.AND if dt.is_bool else Ops.MUL, au, bu).r(Ops.ADD, (len(batch) + 2,))
    out = batch + ((n,) if a.ndim > 1 else ()) + ((m,) if b.ndim > 1 else ())
    return a._new(r.reshape(out))

  def __matmul__(self, o):
    if not isinstance(o, (Tensor, np.ndarray, list, tuple)): return NotImplemented
    return self.matmul(o)

  def __rmatmul__(self, o):
    if not isinstance(o, (np.ndarray, list, tuple)): return NotImplemented
    return Tensor._matmul(Tensor(o, device=self.device), self)

  def dot(self, other: Any) -> Tensor: return self.matmul(other)

  def softmax(self, axis: int = -1) -> Tensor:
    x, out = self._half_up()
    ax = norm_axis(axis, self.ndim)
    m = self._new(x._reduce(Ops.MAX, ax, True, numpy_nan=False))  # (a NaN makes the whole slice NaN anyway)
    e = (x - m).exp()
    return (e / e.sum(ax, keepdim=True)).cast(out)

  def log_softmax(self, axis: int = -1) -> Tensor:
    x, out = self._half_up()
    ax = norm_axis(axis, self.ndim)
    s = x - self._new(x._reduce(Ops.MAX, ax, True, numpy_nan=False))
    return (s - s.exp().sum(ax, keepdim=True).log()).cast(out)

  def layernorm(self, axis: Any = -1, eps: float = 1e-5, weight: Any = None, bias: Any = None) -> Tensor:
    """(x - mean) / sqrt(var + eps) over axis, then * weight + bias when given."""
    x, out = self._half_up()
    norm_axes(axis, self.ndim)
    d = x - x.mean(axis, keepdim=True)
    r = (d * (d.square().mean(axis, keepdim=True) + eps).rsqrt()).cast(out)
    if weight is not None: r = r * weight
    if bias is not None: r = r + bias
    return r

  def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
             groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation) of NCHW input with OIHW weights (O, C/groups, kh, kw)."""
    w = weight if isinstance(weight, Tensor) else Tensor(weight, device=self.device)
    self._same_device(w)
    if self.ndim != 4: raise ValueError(f"conv2d: input must be 4-D (N, C, H, W), got shape {self.shape}")
    if w.ndim != 4: raise ValueError(f"conv2d: weight must be 4-D (O, C, kh, kw), got shape {w.shape}")
    (sh, sw), (ph, pw), (dh, dw) = pair_arg(stride, "stride"), pair_arg(padding, "padding"), pair_arg(dilation, "dilation")
    groups = int_arg(groups, "groups")
    if min(sh, sw) < 1 or min(dh, dw) < 1 or min(ph, pw) < 0 or groups < 1:
      raise ValueError(f"conv2d: bad stride {stride}, padding {padding}, dilation {dilation} or groups {groups}")
    N, C, H, W = self.shape
    O, Cg, kh, kw = w.shape
    if C != Cg * groups:
      raise ValueError(f"conv2d: input has {C} channels (shape {self.shape}) but weight of shape {w.shape} with "
                       f"groups={groups} expects {Cg * groups}")
    if O % groups: raise ValueError(f"conv2d: {O} output channels (weight shape {w.shape}) do not split into {groups} groups")
    if kh < 1 or kw < 1: raise ValueError(f"conv2d: empty kernel in weight shape {w.shape}")
    Hp, Wp = H + 2 * ph, W + 2 * pw
    if Hp < (kh - 1) * dh + 1 or Wp < (kw - 1) * dw + 1:
      raise ValueError(f"conv2d: kernel {(kh, kw)} (dilation {(dh, dw)}) is larger than the padded input {(Hp, Wp)}")
    b = None
    if bias is not None:
      b = bias if isinstance(bias, Tensor) else Tensor(bias, device=self.device)
      if b.shape != (O,): raise ValueError(f"conv2d: bias must have shape ({O},), got {b.shape}")
    dt = promote_types(self.dtype, w.dtype)
    x = self.uop.cast(dt).pad(((0, 0), (0, 0), (ph, ph), (pw, pw)))
    x = window(window(x, 2, kh, sh, dh), 4, kw, sw, dw)  # (N, C, Oh, kh, Ow, kw)
    Oh, Ow = x.shape[2], x.shape[4]
    G, Og = groups, O // groups
    full = (N, G, Og, Cg, Oh, kh, Ow, kw)
    x = x.reshape((N, G, 1, Cg, Oh, kh, Ow, kw)).expand(full)
    wu = w.uop.cast(dt).reshape((1, G, Og, Cg, 1, kh, 1, kw)).expand(full)
    r = alu(Ops.AND if dt.is_bool else Ops.MUL, x, wu).r(Ops.ADD, (3, 5, 7)).reshape((N, O, Oh, Ow))
    out = self._new(r)
    return out if b is None else out + b.reshape(1, O, 1, 1)

  def _pool(self, name: str, kernel_size: Any, stride: Any, padding: Any, dilation: Any, fill: Any) -> tuple[UOp, tuple]:
    if self.ndim < 2: raise ValueError(f"{name}: input needs at least 2 dimensions, got shape {self.shape}")
    k = pair_arg(kernel_size, "kernel_size")
    s = k if stride is None else pair_arg(stride, "stride")
    p, d = pair_arg(padding, "padding"), pair_arg(dilation, "dilation")
    if min(k) < 1 or min(s) < 1 or min(p) < 0 or min(d) < 1:
      raise ValueError(f"{name}: bad kernel_size {kernel_size}, stride {stride}, padding {padding} or dilation {dilation}")
    H, W = self.shape[-2:]
    if H + 2 * p[0] < (k[0] - 1) * d[0] + 1 or W + 2 * p[1] < (k[1] - 1) * d[1] + 1:
      raise ValueError(f"{name}: kernel {k} is larger than the padded input {(H + 2 * p[0], W + 2 * p[1])} (shape {self.shape})")
    nd = self.ndim
    x = self.pad(((0, 0),) * (nd - 2) + ((p[0], p[0]), (p[1], p[1])), value=fill).uop
    x = window(window(x, nd - 2, k[0], s[0], d[0]), nd, k[1], s[1], d[1])  # (..., Oh, kh, Ow, kw)
    return x, (nd - 1, nd + 1)

  def max_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    """Max over kernel windows of the last two axes; padding counts as -inf (the dtype's lowest value)."""
    x, axes = self._pool("max_pool2d", kernel_size, stride, padding, dilation, lowest(self.dtype))
    sh = x.shape
    return self._new(u_max_reduce(x, axes).reshape(tuple(d for i, d in enumerate(sh) if i not in axes)))

  def avg_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0) -> Tensor:
    """Mean over kernel windows of the last two axes; zero padding is counted (torch's default)."""
    src, out = self._half_up()
    x, axes = src._pool("avg_pool2d", kernel_size, stride, padding, 1, 0)
    sh = x.shape
    s = x.r(Ops.ADD, axes).reshape(tuple(d for i, d in enumerate(sh) if i not in axes))
    return (self._new(s) / (sh[axes[0]] * sh[axes[1]])).cast(out)

  # *** dtype shorthands (last: their names shadow builtins inside the class body) ***

  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
