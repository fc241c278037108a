"""Reductions over axes: sum, prod, max/min, any/all, mean/var/std, argmax/argmin."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any


from engine.dtypes import DType, dtypes
from engine.ops import Ops
from engine.tensor.args import (norm_axes, norm_axis, sum_dtype, to_dtype)
from engine.tensor.uops import (alu, u_max_reduce, u_neg)
from engine.uop import UOp, prod

if TYPE_CHECKING: from engine.tensor.tensor import Tensor


class ReduceMixin:
  """Reductions over axes."""
  __slots__ = ()


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
    rev = type(self).arange(n, 0, -1, dtype=dtypes.int32, device=self.device).reshape(tuple(n if i == ax else 1 for i in range(self.ndim)))
    best = hit.where(rev, 0).max(ax, keepdim=keepdim)
    return n - best

  def argmax(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """Index of the first largest element (int32); NaN counts as largest, like numpy."""
    return self._arg_best(axis, keepdim, "argmax", self)

  def argmin(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    return self._arg_best(axis, keepdim, "argmin", self._new(self._flip_order(self.uop)))

  # *** movement ***
