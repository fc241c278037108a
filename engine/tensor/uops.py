"""The tensor-level UOp builders Tensor methods share: broadcasts, constants, ALU nodes, numpy-exact
maximum and max, the transcendentals built from EXP2 / LOG2 / SIN, and the movement-op windows (im2col)
that conv2d and the pools read through."""
from __future__ import annotations

import math
from typing import Any

from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def bcast(u: UOp, shape: tuple[int, ...]) -> UOp:
  """u broadcast to shape (reshape to add leading 1s, then expand)."""
  s = u.shape
  if s == shape: return u
  if len(s) < len(shape): u = u.reshape((1,) * (len(shape) - len(s)) + s)
  return u.expand(shape)


def const(value: Any, dt: DType, shape: tuple[int, ...], tag: Any = None) -> UOp:
  c = UOp.const(dt, value) if tag is None else UOp.const(dt, value).rtag(tag)
  return c.reshape((1,) * len(shape)).expand(shape) if shape else c


def alu(op: Ops, *srcs: UOp) -> UOp:
  return UOp(op, srcs[0].dtype, srcs)


def cmp(op: Ops, a: UOp, b: UOp) -> UOp:
  return UOp(op, dtypes.bool, (a, b))


def u_maximum(x: UOp, y: UOp) -> UOp:
  """numpy's maximum: NaN if either side is NaN (MAX alone keeps x when y is NaN)."""
  m = alu(Ops.MAX, x, y)
  if not x.dtype.is_float: return m
  return UOp(Ops.WHERE, x.dtype, (cmp(Ops.CMPNE, y, y), y, m))


def u_max_reduce(u: UOp, axes: tuple[int, ...]) -> UOp:
  """numpy's max over axes (kept as size 1): NaN where a slice holds a NaN (the MAX reduction skips NaNs)."""
  r = u.r(Ops.MAX, axes)
  if not u.dtype.is_float: return r
  has_nan = cmp(Ops.CMPNE, u, u).r(Ops.MAX, axes)
  return UOp(Ops.WHERE, u.dtype, (has_nan, r.const_like(math.nan), r))


def u_exp(x: UOp) -> UOp: return alu(Ops.EXP2, alu(Ops.MUL, x, x.const_like(LOG2E)))


def u_log(x: UOp) -> UOp: return alu(Ops.MUL, alu(Ops.LOG2, x), x.const_like(LN2))


def u_sin(x: UOp) -> UOp: return alu(Ops.SIN, x)


def u_cos(x: UOp) -> UOp: return alu(Ops.SIN, alu(Ops.ADD, x, x.const_like(math.pi / 2)))


def u_neg(x: UOp) -> UOp: return alu(Ops.NEG, x)


def sign_bit(x: UOp) -> UOp:
  """The float's sign bit as a bool (true for -0.0 and for a NaN with its sign set)."""
  idt = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[x.dtype.itemsize]
  bits = x.bitcast(idt)
  return cmp(Ops.CMPLT, bits, bits.const_like(0))


def u_abs(x: UOp) -> UOp:
  # floats by their sign bit, so abs(-0.0) is +0.0 as in numpy (a comparison with 0 would keep -0.0)
  neg = sign_bit(x) if x.dtype.is_float else cmp(Ops.CMPLT, x, x.const_like(0))
  return UOp(Ops.WHERE, x.dtype, (neg, u_neg(x), x))


def u_sigmoid(x: UOp) -> UOp: return alu(Ops.RECIPROCAL, alu(Ops.ADD, x.const_like(1.0), u_exp(u_neg(x))))


def u_tanh(x: UOp) -> UOp:
  # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) <= 1 (never overflows), sign restored after.
  # Near 0, 1 - e cancels; there the series x - x^3/3 + 2x^5/15 is exact to the dtype's precision.
  ax = u_abs(x)
  e = u_exp(alu(Ops.MUL, ax, x.const_like(-2.0)))
  t = alu(Ops.FDIV, alu(Ops.SUB, x.const_like(1.0), e), alu(Ops.ADD, x.const_like(1.0), e))
  t = UOp(Ops.WHERE, x.dtype, (cmp(Ops.CMPLT, x, x.const_like(0)), u_neg(t), t))
  x2 = alu(Ops.MUL, x, x)
  series = alu(Ops.MUL, x, alu(Ops.ADD, x.const_like(1.0), alu(Ops.MUL, x2, alu(
    Ops.ADD, x.const_like(-1.0 / 3.0), alu(Ops.MUL, x2, x.const_like(2.0 / 15.0))))))
  small = cmp(Ops.CMPLT, ax, x.const_like(1e-3 if x.dtype is dtypes.float64 else 0.05))
  return UOp(Ops.WHERE, x.dtype, (small, series, t))


def u_floor(x: UOp) -> UOp:
  t = alu(Ops.TRUNC, x)
  return UOp(Ops.WHERE, x.dtype, (cmp(Ops.CMPLT, x, t), alu(Ops.SUB, t, t.const_like(1.0)), t))


def u_ceil(x: UOp) -> UOp:
  t = alu(Ops.TRUNC, x)
  return UOp(Ops.WHERE, x.dtype, (cmp(Ops.CMPLT, t, x), alu(Ops.ADD, t, t.const_like(1.0)), t))


def take_every(u: UOp, axis: int, n: int, step: int) -> UOp:
  """Elements 0, step, 2*step, ... (n of them) along axis, with movement ops only."""
  shape = u.shape
  if n == 0: return u.shrink(tuple((0, 0) if i == axis else (0, d) for i, d in enumerate(shape)))
  if step == 1: return u.shrink(tuple((0, n) if i == axis else (0, d) for i, d in enumerate(shape)))
  span = (n - 1) * step + 1
  u = u.shrink(tuple((0, span) if i == axis else (0, d) for i, d in enumerate(shape)))
  u = u.pad(tuple((0, n * step - span) if i == axis else (0, 0) for i in range(len(shape))))
  split = shape[:axis] + (n, step) + shape[axis + 1:]
  u = u.reshape(split)
  u = u.shrink(tuple((0, 1) if i == axis + 1 else (0, d) for i, d in enumerate(split)))
  return u.reshape(shape[:axis] + (n,) + shape[axis + 1:])


def window(u: UOp, axis: int, k: int, stride: int, dilation: int) -> UOp:
  """Axis of length L becomes two axes (out, k) at axis, axis+1: y[o, j] = x[o*stride + j*dilation].

  Tiles x enough times and re-reads the flat tiling with rows of length L+dilation,
  so row j starts dilation*j elements further into x."""
  shape = u.shape
  nd, L = len(shape), shape[axis]
  span = (k - 1) * dilation + 1
  out = (L - span) // stride + 1
  rest = shape[:axis] + shape[axis + 1:]
  u = u.permute(tuple(i for i in range(nd) if i != axis) + (axis,))
  tiles = -(-k * (L + dilation) // L)
  u = u.reshape(rest + (1, L)).expand(rest + (tiles, L)).reshape(rest + (tiles * L,))
  u = u.shrink(tuple((0, d) for d in rest) + ((0, k * (L + dilation)),)).reshape(rest + (k, L + dilation))
  u = u.shrink(tuple((0, d) for d in rest) + ((0, k), (0, L - span + 1)))
  u = take_every(u, nd, out, stride)  # rest + (k, out)
  return u.permute(tuple(range(axis)) + (nd, nd - 1) + tuple(range(axis, nd - 1)))
