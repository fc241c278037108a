"""Reductions over axes: sum, prod, max/min, any/all, mean/var/std (and var_mean/std_mean), argmax/argmin.

Signatures are tinygrad's: `axis=None` (an int, a tuple of ints, or None for every axis), `keepdim=False`; a
0-d tensor takes axis 0 or -1 and reduces nothing, as in tinygrad."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any


from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.tensor.args import (DefaultInt, alias_arg, norm_axes, norm_axis, sum_dtype, to_dtype)
from rulec.engine.tensor.uops import (alu, u_max_reduce, u_neg)
from rulec.engine.ir.uop import UOp, first_n, prod

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor


_ONE = DefaultInt(1)   # correction's default: passing correction= and ddof= together is a TypeError


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

  def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """sum(axis=None, keepdim=False, dtype=None): the sum over axis (an int, a tuple, or None for all); bool and
    small signed ints accumulate and return in int32, small unsigned ints in uint32, unless dtype says otherwise."""
    dt = sum_dtype(self.dtype) if dtype is None else to_dtype(dtype)
    return self._new(self._reduce(Ops.ADD, axis, keepdim, self.uop.cast(dt)))

  def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """prod(axis=None, keepdim=False, dtype=None): the product over axis, in self's dtype (tinygrad keeps it, so
    int8 products wrap; numpy widens) unless dtype says otherwise."""
    dt = self.dtype if dtype is None else to_dtype(dtype)
    u = self.uop.cast(dt)
    if dt.is_bool: return self._new(self._reduce(Ops.MUL, axis, keepdim, u.cast(dtypes.int8)).cast(dt))
    return self._new(self._reduce(Ops.MUL, axis, keepdim, u))

  def max(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """max(axis=None, keepdim=False): the largest element over axis; NaN if one is NaN. Over an empty axis it is
    the dtype's lowest value (-inf for floats), as in tinygrad (numpy raises)."""
    return self._new(self._reduce(Ops.MAX, axis, keepdim))

  def min(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """min(axis=None, keepdim=False): the smallest element over axis; NaN if one is NaN; over an empty axis the
    dtype's highest value (inf for floats)."""
    return self._new(self._flip_order(self._reduce(Ops.MAX, axis, keepdim, self._flip_order(self.uop))))

  @staticmethod
  def _flip_order(u: UOp) -> UOp:
    """An order-reversing bijection (its own inverse): -x for floats (keeps NaN), ~x for ints and bools."""
    if u.dtype.is_float: return u_neg(u)
    return alu(Ops.XOR, u, u.const_like(True if u.dtype.is_bool else -1 if u.dtype.kind == "i" else u.dtype.max()))

  def any(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """any(axis=None, keepdim=False): whether any element over axis is nonzero (bool)."""
    return self._new(self._reduce(Ops.MAX, axis, keepdim, self.uop.cast(dtypes.bool)))

  def all(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """all(axis=None, keepdim=False): whether every element over axis is nonzero (bool)."""
    return ~(~self.bool()).any(axis, keepdim)

  def _half_up(self) -> tuple[Tensor, DType]:
    """A float tensor to compute in (float16 and bfloat16 -> float32, ints -> float32) and the dtype to return."""
    if self.dtype.is_half: return self.cast(dtypes.float32), self.dtype
    if not self.dtype.is_float: return self.cast(dtypes.default_float), dtypes.default_float
    return self, self.dtype

  def _count(self, axis: Any) -> Any:
    """How many elements a reduce over axis takes: an int, or a 0-d float32 Tensor where an axis's size is a
    Variable's (UOp.sizes: the count of the positions below it, so one graph serves every value)."""
    axes = norm_axes(axis, self.ndim)
    sizes = self.uop.sizes
    if sizes is None or all(sizes[a] is None for a in axes): return prod(self.shape[a] for a in axes)
    n: Any = prod(self.shape[a] for a in axes if sizes[a] is None)
    for a in axes:
      if sizes[a] is not None:
        line = first_n(sizes[a], (self.shape[a],), 0).cast(dtypes.float32)
        n = self._new(line).sum() * n
    return n

  def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """mean(axis=None, keepdim=False): the average over axis; ints and bools give float32, float16 and bfloat16 are computed in
    float32; NaN over an empty axis."""
    x, out = self._half_up()
    return (x.sum(axis, keepdim) / self._count(axis)).cast(out)

  def var(self, axis: Any = None, keepdim: bool = False, correction: Any = _ONE, *, ddof: Any = None) -> Tensor:
    """var(axis=None, keepdim=False, correction=1): the sum of squared deviations divided by max(n - correction, 0).
    tinygrad's default correction=1 is the sample variance (numpy's default ddof=0 is not); `ddof=` is kept as
    an alias of correction (passing both is a TypeError)."""
    c = alias_arg(correction, ddof, "correction", "ddof", "var")
    x, out = self._half_up()
    d = x - x.mean(axis, keepdim=True)
    n = self._count(axis)
    return ((d * d).sum(axis, keepdim) / (max(n - c, 0) if isinstance(n, int) else (n - c).maximum(0))).cast(out)

  def std(self, axis: Any = None, keepdim: bool = False, correction: Any = _ONE, *, ddof: Any = None) -> Tensor:
    """std(axis=None, keepdim=False, correction=1): sqrt of var(axis, keepdim, correction); `ddof=` is an alias."""
    c = alias_arg(correction, ddof, "correction", "ddof", "std")
    x, out = self._half_up()
    return x.var(axis, keepdim, c).sqrt().cast(out)

  def var_mean(self, axis: Any = None, keepdim: bool = False, correction: Any = _ONE, *, ddof: Any = None) -> tuple[Tensor, Tensor]:
    """var_mean(axis=None, keepdim=False, correction=1): (var, mean) over axis."""
    c = alias_arg(correction, ddof, "correction", "ddof", "var_mean")
    return self.var(axis, keepdim, c), self.mean(axis, keepdim)

  def std_mean(self, axis: Any = None, keepdim: bool = False, correction: Any = _ONE, *, ddof: Any = None) -> tuple[Tensor, Tensor]:
    """std_mean(axis=None, keepdim=False, correction=1): (std, mean) over axis."""
    c = alias_arg(correction, ddof, "correction", "ddof", "std_mean")
    return self.std(axis, keepdim, c), self.mean(axis, keepdim)

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
    """argmax(axis=None, keepdim=False): index (int32) of the first largest element over axis, of the flattened
    tensor when axis is None; NaN counts as largest. An empty axis raises ValueError (tinygrad returns garbage)."""
    return self._arg_best(axis, keepdim, "argmax", self)

  def argmin(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """argmin(axis=None, keepdim=False): index (int32) of the first smallest element over axis."""
    return self._arg_best(axis, keepdim, "argmin", self._new(self._flip_order(self.uop)))
