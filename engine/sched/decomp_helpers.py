"""Helpers for rules/decomp.rules: floor division and modulo from the
truncating ops a backend has, and clamped loads."""
from __future__ import annotations

from engine.lang.capability import rule_helper

from engine.dtypes import dtypes
from engine.ops import Ops
from engine.uop import UOp


def _needs_fix(r: UOp, y: UOp) -> UOp:
  # the truncated remainder is nonzero and its sign differs from the divisor's
  zero = r.const_like(0)
  return r.ne(zero) & r.lt(zero).ne(y.lt(y.const_like(0)))


@rule_helper
def floor_div(x: UOp, y: UOp) -> UOp:
  q, r = UOp(Ops.CDIV, x.dtype, (x, y)), UOp(Ops.CMOD, x.dtype, (x, y))
  return q - _needs_fix(r, y).cast(x.dtype)


@rule_helper
def floor_mod(x: UOp, y: UOp) -> UOp:
  r = UOp(Ops.CMOD, x.dtype, (x, y))
  return _needs_fix(r, y).where(r + y, r)


@rule_helper
def clamp_index(load: UOp) -> UOp:
  """A load whose index may leave its buffer (only under a WHERE that discards it) reads element 0 there."""
  p, idx = load.src
  outside = idx.lt(idx.const_like(0)) | idx.lt(idx.const_like(p.arg[1])).ne(UOp.const(dtypes.bool, True))
  return p.index(outside.where(idx.const_like(0), idx), arg="clamped")
