"""Helpers for rules/gradient.rules: the gradients that are not one-line algebra."""
from __future__ import annotations

from rulec.engine.lang.capability import rule_helper
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, first_n


@rule_helper
def sum_to_shape(g: UOp, shape: tuple[int, ...]) -> UOp:
  """g summed over the axes where `shape` has 1 and g does not (the gradient of an EXPAND to g's shape)."""
  axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a != b)
  return g.r(Ops.ADD, axes) if axes else g


@rule_helper
def product_of_others(x: UOp, axes: tuple[int, ...]) -> UOp:
  """For each element of x, the product of the other elements of its slice along `axes` (exact with zeros).

  With no zero in a slice that is prod / x; with one zero, the zero's entry is the product of the rest and every
  other entry is 0; with two or more, everything is 0."""
  zero = x.eq(x.const_like(0))
  zeros = zero.cast(x.dtype).r(Ops.ADD, axes).expand(x.shape)
  nonzero_prod = zero.where(x.const_like(1), x).r(Ops.MUL, axes).expand(x.shape)
  none_zero = zeros.eq(zeros.const_like(0))
  only_this = zero & zeros.eq(zeros.const_like(1))
  safe_x = zero.where(x.const_like(1), x)
  return none_zero.where(nonzero_prod / safe_x, only_this.where(nonzero_prod, x.const_like(0)))


@rule_helper
def zero_past_sizes(g: UOp, s: UOp) -> UOp:
  """The gradient g of a SHRINK s whose size along an axis is a Variable's (UOp.sizes): 0 past that size, a value
  of the axis's whole size (g holds nothing there; its source's gradient is that of every element)."""
  own, below = s.sizes, s.src[0].sizes
  if own is None: return g
  for a, v in enumerate(own):
    if v is not None and (below is None or below[a] is None):
      g = first_n(v, g.shape, a).where(g, g.const_like(0))
  return g
