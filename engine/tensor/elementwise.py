"""Elementwise operations: arithmetic with broadcasting and tinygrad's dtype promotion, comparisons, where, casts
and unary math."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import ALU, BINARY, UNARY, Ops
from rulec.engine.tensor.args import (DTypeError, bound_expr, symbolic_enabled, broadcast_shapes, is_py_scalar, promote_types,
                                scalar_of, specialise, to_dtype, weak_dtype)
from rulec.engine.tensor.uops import (alu, bcast, cmp, const, u_abs, u_ceil, u_cos, u_exp, u_floor, u_log,
                                u_maximum, u_neg, u_sigmoid, u_sin, u_tanh)
from rulec.engine.tensor.base import TensorBase
from rulec.engine.ir.uop import UOp

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


class ElementwiseMixin:
  """Elementwise arithmetic, comparisons, selection, casts and math."""
  __slots__ = ()

  def _pair(self, other: Any, reverse: bool = False) -> tuple[UOp, UOp] | None:
    """self and other as UOps of one broadcast shape and one promoted dtype (None: not an operand)."""
    if isinstance(other, TensorBase):
      self._same_device(other)
      dt = promote_types(self.dtype, other.dtype)
      shape = broadcast_shapes(self.shape, other.shape)
      x, y = bcast(self.uop.cast(dt), shape), bcast(other.uop.cast(dt), shape)
    elif (v := self._symbolic_scalar(other)) is not None:   # (a bound int expression: a kernel argument)
      dt = weak_dtype(self.dtype, 0)
      x = self.uop.cast(dt)
      y = v if v.dtype is dt else UOp(Ops.CAST, dt, (v,))
      if x.shape: y = y.reshape((1,) * len(x.shape)).expand(x.shape)
    elif is_py_scalar(other := specialise(other)):   # (a bound Variable is its value, a weak int)
      dt = weak_dtype(self.dtype, other)
      x = self.uop.cast(dt)
      y = x.const_like(scalar_of(other, dt))
    elif isinstance(other, (np.ndarray, np.generic, list, tuple)):
      return self._pair(self._lift(other), reverse)
    else: return None
    return (y, x) if reverse else (x, y)

  def _symbolic_scalar(self, other: Any) -> UOp | None:
    """A bound int expression (`x * start_pos`, `Tensor.arange(n) <= start_pos`) kept as a value of the graph: the
    kernels take the Variable as an argument, so one schedule serves every value (docs/api.md, "Symbolic shapes");
    None for anything else (a value spread over several devices specialises it)."""
    if not (isinstance(other, UOp) and bound_expr(other) and symbolic_enabled()) or isinstance(self.device, tuple): return None
    return other

  def _arith(self, other: Any, op: Ops, reverse: bool = False) -> Tensor:
    if op is Ops.POW and not reverse and (self.dtype.is_int or self.dtype.is_bool) and is_py_scalar(other) \
       and isinstance(other, int) and not isinstance(other, bool) and other < 0:
      raise DTypeError(f"base needs to be float: {self.dtype.name} ** {other} (an integer to a negative integer power)")
    p = self._pair(other, reverse)
    if p is None: return NotImplemented
    x, y = p
    if x.dtype.is_bool: return self._new(self._bool_arith(op, x, y))
    return self._new(alu(op, x, y))

  @staticmethod
  def _bool_arith(op: Ops, x: UOp, y: UOp) -> UOp:
    """tinygrad's bool arithmetic: + is or, * is and, - is x + (-y) with - as not, ** stays bool (0**0 = 1),
    // and % compute in float32."""
    if op is Ops.ADD: return alu(Ops.OR, x, y)
    if op is Ops.MUL: return alu(Ops.AND, x, y)
    if op in (Ops.SUB, Ops.POW): return alu(Ops.OR, x, alu(Ops.XOR, y, y.const_like(True)))
    f = dtypes.default_float
    return alu(op, x.cast(f), y.cast(f))

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
      raise DTypeError(f"{op.name.lower()} needs integer{'' if op in (Ops.SHL, Ops.SHR) else ' or bool'} operands, got {x.dtype.name}")
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
    if dt.is_float: raise DTypeError(f"~ needs an integer or bool tensor, got {dt.name}")
    return self._new(alu(Ops.XOR, self.uop, self.uop.const_like(True if dt.is_bool else -1 if dt.kind == "i" else dt.max())))

  def __neg__(self) -> Tensor:
    """-x; of a bool tensor it is logical not, as in tinygrad (numpy refuses it)."""
    if self.dtype.is_bool: return ~self
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

  def alu(self, op: Ops, *src: Tensor) -> Tensor:
    """alu(op, *src): the ALU op `op` (an `Ops` member) applied to self and the tensors src, broadcast; tinygrad's
    low-level escape hatch, so no dtype promotion: the operands must share a dtype (WHERE's condition is bool)."""
    if op not in ALU or op is Ops.THREEFRY: raise TypeError(f"alu: {op} is not an elementwise op rulec computes")
    want = 0 if op in UNARY else 1 if op in BINARY else 2
    if len(src) != want:
      raise TypeError(f"alu: {op.name} takes {want + 1} operand{'s' if want else ''}, got {len(src) + 1}")
    ts = (self,) + tuple(self._lift(t) for t in src)
    for t in ts[1:]: self._same_device(t)
    values = ts[1:] if op is Ops.WHERE else ts
    if len({t.dtype for t in values}) > 1:
      raise DTypeError(f"alu: {op.name} needs operands of one dtype, got {', '.join(t.dtype.name for t in values)}")
    if op is Ops.WHERE and not self.dtype.is_bool: raise DTypeError(f"alu: WHERE needs a bool condition, got {self.dtype.name}")
    shape = broadcast_shapes(*(t.shape for t in ts))
    us = [bcast(t.uop, shape) for t in ts]
    return self._new(us[0].alu(op, *us[1:]))

  def ufix(self, x: Any) -> Tensor:
    """ufix(x): x as an operand for self: a Tensor unchanged, a Python number as a 0-d constant of the dtype
    `self op x` would have (weak, as tinygrad: an int with a float tensor stays float, a float makes an int
    tensor's operand float)."""
    if isinstance(x, TensorBase): return x
    dt = weak_dtype(self.dtype, x)
    return self._new(const(scalar_of(x, dt), dt, ()))

  def maximum(self, other: Any) -> Tensor:
    """maximum(x): the elementwise larger of self and x (broadcast, promoted); NaN if either is NaN."""
    x, y = self._binary(other, "maximum")
    return self._new(u_maximum(x, y))

  def minimum(self, other: Any) -> Tensor:
    """minimum(x): the elementwise smaller of self and x (broadcast, promoted); NaN if either is NaN."""
    x, y = self._binary(other, "minimum")
    if x.dtype.is_float: return self._new(u_neg(u_maximum(u_neg(x), u_neg(y))))
    if x.dtype.is_bool: return self._new(alu(Ops.AND, x, y))
    return self._new(UOp(Ops.WHERE, x.dtype, (cmp(Ops.CMPLT, x, y), x, y)))

  def where(self, x: Any, y: Any) -> Tensor:
    """where(x, y): x where self is true, else y. tinygrad needs a bool self; rulec also takes other dtypes and
    casts them to bool (nonzero is true), as numpy does."""
    cond = self.uop if self.dtype.is_bool else self.uop.cast(dtypes.bool)
    xs, ys = is_py_scalar(x), is_py_scalar(y)
    if xs and ys:
      dt = dtypes.default_float if isinstance(x, float) or isinstance(y, float) else \
        dtypes.bool if isinstance(x, bool) and isinstance(y, bool) else dtypes.default_int
      shape = self.shape
      xu, yu = const(scalar_of(x, dt), dt, shape), const(scalar_of(y, dt), dt, shape)
    else:
      xt = None if xs else self._lift(x)
      yt = None if ys else self._lift(y)
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
    """clip(min_=None, max_=None): min_ where self is below it, max_ where above, else self (NaN stays NaN); one
    bound may be None, not both (tinygrad raises RuntimeError then). At a bound the gradient is 1, as tinygrad's."""
    if min_ is None and max_ is None: raise RuntimeError("clip: at least one of 'min_' or 'max_' must not be None")
    r = self
    if min_ is not None: r = r.maximum(min_) if not r.dtype.is_float else (r < min_).where(min_, r)
    if max_ is not None: r = r.minimum(max_) if not r.dtype.is_float else (r > max_).where(max_, r)
    return r

  def clamp(self, min_: Any = None, max_: Any = None) -> Tensor:
    """clamp(min_=None, max_=None): the same as clip."""
    return self.clip(min_, max_)

  def cast(self, dtype: Any) -> Tensor:
    """cast(dtype): the values converted to dtype (a DType or a name such as 'int' or 'half'); floats to ints truncate."""
    return self._new(self.uop.cast(to_dtype(dtype)))

  def bitcast(self, dtype: Any) -> Tensor:
    """bitcast(dtype): the same bytes read as dtype. To a type of another item size the last axis holds the
    same bytes in more or fewer items (little-endian, as numpy's `view`): float32 (2, 3) -> uint8 (2, 12)."""
    dt = to_dtype(dtype)
    if dt.itemsize != self.dtype.itemsize:
      what = f"bitcast from {self.dtype.name} to {dt.name}"
      if dtypes.bool in (dt, self.dtype): raise RuntimeError(f"{what}: bool has no byte layout to reinterpret")
      if self.ndim == 0: raise RuntimeError(f"{what} changes the item size, which needs at least one axis (a 0-d tensor has none)")
      if (self.shape[-1] * self.dtype.itemsize) % dt.itemsize:
        raise RuntimeError(f"unsupported size in bitcast: {what} of shape {self.shape}: the last axis holds "
                           f"{self.shape[-1] * self.dtype.itemsize} bytes, not a multiple of {dt.itemsize}")
    return self._new(self.uop.bitcast(dt))

  def element_size(self) -> int:
    """element_size(): bytes per element."""
    return self.dtype.itemsize

  def nbytes(self) -> int:
    """nbytes(): bytes of the whole tensor (numel * element_size)."""
    return self.numel() * self.dtype.itemsize

  def is_floating_point(self) -> bool:
    """is_floating_point(): whether the dtype is a float."""
    return self.dtype.is_float

  # *** unary math ***

  def _float_unary(self, fn) -> Tensor:
    x = self.uop if self.dtype.is_float else self.uop.cast(dtypes.default_float)
    if x.dtype.is_half: return self._new(fn(x.cast(dtypes.float32)).cast(x.dtype))
    return self._new(fn(x))

  def exp(self) -> Tensor:
    """exp(): e ** self (ints and bools in float32; float16 and bfloat16 computed in float32 and rounded back)."""
    return self._float_unary(u_exp)
  def exp2(self) -> Tensor:
    """exp2(): 2 ** self (ints and bools in float32)."""
    return self._float_unary(lambda x: alu(Ops.EXP2, x))
  def log(self) -> Tensor:
    """log(): natural logarithm (ints and bools in float32)."""
    return self._float_unary(u_log)
  def log2(self) -> Tensor:
    """log2(): base-2 logarithm (ints and bools in float32)."""
    return self._float_unary(lambda x: alu(Ops.LOG2, x))
  def sqrt(self) -> Tensor:
    """sqrt(): square root (ints and bools in float32)."""
    return self._float_unary(lambda x: alu(Ops.SQRT, x))
  def rsqrt(self) -> Tensor:
    """rsqrt(): 1 / sqrt(self) (ints and bools in float32)."""
    return self._float_unary(lambda x: alu(Ops.RECIPROCAL, alu(Ops.SQRT, x)))
  def reciprocal(self) -> Tensor:
    """reciprocal(): 1 / self (ints and bools in float32)."""
    return self._float_unary(lambda x: alu(Ops.RECIPROCAL, x))
  def sin(self) -> Tensor:
    """sin(): sine (ints and bools in float32)."""
    return self._float_unary(u_sin)
  def cos(self) -> Tensor:
    """cos(): cosine (ints and bools in float32)."""
    return self._float_unary(u_cos)
  def tanh(self) -> Tensor:
    """tanh(): hyperbolic tangent (ints and bools in float32)."""
    return self._float_unary(u_tanh)
  def sigmoid(self) -> Tensor:
    """sigmoid(): 1 / (1 + exp(-self)) (ints and bools in float32)."""
    return self._float_unary(u_sigmoid)

  def _float_keep(self, fn, bool_int: bool = False) -> Tensor:
    """fn on floats; integers are returned unchanged, bools too, or as int32 where tinygrad gives that (bool_int)."""
    if self.dtype.is_float: return self._new(fn(self.uop))
    return self.cast(dtypes.default_int) if bool_int and self.dtype.is_bool else self

  def trunc(self) -> Tensor:
    """trunc(): rounded toward zero; ints and bools unchanged."""
    return self._float_keep(lambda x: alu(Ops.TRUNC, x))
  def floor(self) -> Tensor:
    """floor(): rounded down; ints unchanged, bools become int32 (tinygrad)."""
    return self._float_keep(u_floor, True)
  def ceil(self) -> Tensor:
    """ceil(): rounded up; ints unchanged, bools become int32 (tinygrad)."""
    return self._float_keep(u_ceil, True)

  def abs(self) -> Tensor:
    """abs(): absolute value (bools and unsigned ints unchanged). Its gradient is sign(self), as tinygrad's and
    torch's: 0 at +-0.0 (an odd or even function built from |x| uses _abs_odd, whose gradient there is 1)."""
    if self.dtype.is_bool or self.dtype.is_unsigned: return self
    if not self.dtype.is_float: return self._new(u_abs(self.uop))
    u = self.uop
    return self._new(UOp(Ops.WHERE, u.dtype, (cmp(Ops.CMPNE, u, u.const_like(0)), u_abs(u), u.const_like(0.0))))
  __abs__ = abs

  def _abs_bits(self) -> Tensor:
    """|self| by the sign bit (abs(-0.0) is +0.0), with gradient -1 where the sign bit is set (-0.0 too), else 1:
    for values whose sign is put back by the sign bit (fmod)."""
    return self._new(u_abs(self.uop))

  def _abs_odd(self) -> Tensor:
    """|self| by comparison: -self where self < 0, else self (-0.0 stays -0.0), with gradient -1 there, else 1:
    for odd functions built as _odd(r(|x|)) (atan, asinh, erf, ...), so that their gradient at 0 is r'(0)."""
    return (self < 0).where(-self, self)

  def relu(self) -> Tensor:
    """relu(): self where it is positive, else 0 (NaN stays NaN); a bool tensor becomes int32 (tinygrad).

    Its gradient at 0 is 0, as tinygrad's (a maximum would send half there)."""
    x = self.cast(dtypes.default_int) if self.dtype.is_bool else self
    if not x.dtype.is_float: return x._new(alu(Ops.MAX, x.uop, x.uop.const_like(0)))
    u = x.uop
    keep = alu(Ops.OR, cmp(Ops.CMPLT, u.const_like(0), u), cmp(Ops.CMPNE, u, u))
    return x._new(UOp(Ops.WHERE, u.dtype, (keep, u, u.const_like(0))))

  def square(self) -> Tensor:
    """square(): self * self, in self's dtype (of bools: bool, as in tinygrad; numpy gives int8)."""
    return self * self

  def float(self) -> Tensor:
    """float(): cast to float32."""
    return self.cast(dtypes.float32)
  def half(self) -> Tensor:
    """half(): cast to float16."""
    return self.cast(dtypes.float16)
  def bfloat16(self) -> Tensor:
    """bfloat16(): cast to bfloat16."""
    return self.cast(dtypes.bfloat16)
  def double(self) -> Tensor:
    """double(): cast to float64."""
    return self.cast(dtypes.float64)
  def short(self) -> Tensor:
    """short(): cast to int16."""
    return self.cast(dtypes.int16)
  def int(self) -> Tensor:
    """int(): cast to int32."""
    return self.cast(dtypes.int32)
  def long(self) -> Tensor:
    """long(): cast to int64."""
    return self.cast(dtypes.int64)
  def bool(self) -> Tensor:
    """bool(): cast to bool (nonzero is True)."""
    return self.cast(dtypes.bool)
