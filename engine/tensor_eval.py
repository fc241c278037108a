"""The numpy reference interpreter of tensor-level UOp graphs.

`evaluate(uops)` gives the value of each tensor-level node as a numpy array.
It is the oracle the scheduler and the backends are tested against, so every
op is written out plainly, one numpy call (or a few) per op, in the node's own
dtype (float16 arithmetic happens in float16, int8 wraps like int8, ...).

Semantics (they follow `engine/ir/alu.py` and numpy):

- Integer results wrap like numpy's. IDIV and MOD are floor division and floor
  modulo (numpy's `//` and `%` on integers); integer division or modulo by
  zero gives 0. On floats, MOD is numpy's / Python's `%` (nan for x % 0) and
  IDIV is alu.py's floor(a / b) of the rounded quotient (a / 0 is inf with a's
  sign, 0 / 0 nan), which can differ from numpy's `//` by one when the
  rounding of a / b crosses an integer (1.0 // 0.1: 10.0 here, 9.0 in numpy).
- MAX is alu.py's Python max(a, b): a unless b > a, so a NaN in a wins and a
  NaN in b loses. REDUCE_AXIS MAX folds that from the identity -inf, so NaNs
  never win a float reduction (np.fmax). (The front end adds NaN checks where
  numpy propagates NaNs.)
- SHL / SHR by a negative amount leave the value unchanged; SHL by the bit
  width or more gives 0, SHR gives 0 or -1 (Python's >>).
- Comparisons give bool. WHERE picks by the truth of its first source.
- On bool, ADD is logical or (as in numpy), MUL logical and, SUB is "not
  equal" (True - True wraps to False), NEG is the identity (-True wraps to True).
- Integer POW with a negative exponent gives 1 for base 1, +-1 for base -1 and
  0 otherwise (numpy refuses; Python's 1/base**n truncated toward zero).
- EXP2 LOG2 SIN SQRT RECIPROCAL FDIV on integers are computed in float64 and
  converted the way alu.py's `wrap` does: truncated toward zero, non-finite
  -> 0, wrapped around. The front end never builds these; they are here so any
  graph has a value.
- CAST is numpy's `astype` (float -> int of nan/inf/out-of-range values is
  whatever numpy gives on this machine, e.g. INT_MIN for int32 on x86).
- BITCAST reinterprets the bytes (to another item size: the last axis rescaled, little-endian as numpy).
- REDUCE_AXIS keeps reduced axes as size 1; over an empty axis MAX gives the
  dtype's lowest value (-inf for floats), ADD 0, MUL 1.
- PAD fills with zeros (False for bool).
- CONTIGUOUS is a copy; COPY, DETACH, CONTIGUOUS_BACKWARD are the identity on
  values (a COPY to a device set too); ASSIGN(target, value) has the value of `value` (the write into the
  target's buffer is `rulec.engine.realize`'s job, not the interpreter's).
- MSTACK(x_0, .., x_n-1)[(axis, devices)] is its sources joined along axis, or its
  first source when axis is None (the parts of a replicated value are equal);
  MSELECT(v)[(i, axis, n)] is part i of v split n ways along axis (v for None).
- A SINK root stands for its sources: its place in the result list is taken by
  their values, in order.

Each node is evaluated once per call (memoised), iteratively (graphs may be
deeper than Python's recursion limit), and intermediate values are dropped as
soon as their last user is done. Floating-point warnings are suppressed.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from rulec.engine.ir.dtypes import DType
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, concrete_arg
from rulec.runtime.buffer import buffer_of, np_dtype

__all__ = ["evaluate", "apply_movement"]

_IDENTITY_OPS = (Ops.COPY, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.FUSE, Ops.NOOP)


def _toposort(roots: Sequence[UOp]) -> list[UOp]:
  """All nodes reachable from roots, sources before users."""
  return UOp.sink(*roots).toposort()[:-1]


def evaluate(uops: Sequence[UOp]) -> list[np.ndarray]:
  """The value of each tensor-level UOp (a SINK root contributes its sources' values)."""
  roots: list[UOp] = []
  for u in uops:
    if not isinstance(u, UOp): raise TypeError(f"evaluate() takes UOps, got {type(u).__name__}")
    roots.extend(u.src if u.op is Ops.SINK else (u,))
  order = _toposort(roots)
  users: dict[int, int] = {}
  for u in order:
    for s in u.src: users[id(s)] = users.get(id(s), 0) + 1
  keep = {id(r) for r in roots}
  vals: dict[int, np.ndarray] = {}
  with np.errstate(all="ignore"), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for u in order:
      if u.op is Ops.SINK: continue  # a SINK inside a graph has no value of its own
      vals[id(u)] = _eval_node(u, [vals[id(s)] for s in u.src])
      for s in u.src:
        users[id(s)] -= 1
        if users[id(s)] == 0 and id(s) not in keep: vals.pop(id(s), None)
  # copies: callers may keep the results while buffers change underneath
  return [np.array(vals[id(r)], copy=True) for r in roots]


# *** one node ***

def _eval_node(u: UOp, xs: list[np.ndarray]) -> np.ndarray:
  op = u.op
  if op is Ops.BUFFER: out = buffer_of(u).host_view()
  elif op is Ops.CONST: out = _const(u.arg, u.dtype)
  elif op is Ops.DEFINE_VAR: out = u.arg[1]   # (only a BIND reads it, and takes its own constant instead)
  elif op is Ops.BIND: out = xs[1]
  elif op in _ELEMENTWISE: out = _ELEMENTWISE[op](u.dtype, *xs)
  elif op is Ops.CAST: out = xs[0].astype(np_dtype(u.dtype))
  elif op is Ops.BITCAST: out = _bitcast(xs[0], u.dtype)
  elif op is Ops.REDUCE_AXIS: out = _reduce(u.arg[0], tuple(u.arg[1]), xs[0], u.dtype)
  elif op in _MOVEMENT_OPS: out = apply_movement(op, concrete_arg(u), xs[0])
  elif op is Ops.CONTIGUOUS: out = np.array(xs[0], copy=True)
  elif op in _IDENTITY_OPS: out = xs[0]
  elif op is Ops.ASSIGN: out = xs[1]
  elif op is Ops.MSTACK: out = xs[0] if u.arg[0] is None else np.concatenate(xs, axis=u.arg[0])
  elif op is Ops.MSELECT: out = _part(xs[0], *u.arg)
  else: raise NotImplementedError(f"tensor_eval: {op} is not a tensor-level op")
  out = np.asarray(out)
  want = np_dtype(u.dtype)
  if out.dtype != want: out = out.astype(want)
  shape = u._shape
  if shape is not None and out.shape != tuple(shape):
    raise ValueError(f"tensor_eval: {op} produced shape {out.shape}, but the node's shape is {tuple(shape)}")
  return out


def _part(x: np.ndarray, i: int, axis, n: int) -> np.ndarray:
  if axis is None: return x
  s = x.shape[axis] // n
  return x[(slice(None),) * axis + (slice(i * s, (i + 1) * s),)]


def _const(value, dtype: DType) -> np.ndarray:
  from rulec.engine.ir.alu import wrap
  if dtype.kind in "iu" and isinstance(value, int): value = wrap(value, dtype)
  return np.array(value, dtype=np_dtype(dtype))


def _bitcast(x: np.ndarray, dtype: DType) -> np.ndarray:
  nd = np_dtype(dtype)
  if nd.itemsize != x.dtype.itemsize:   # numpy rescales the last axis, as BITCAST's shape does
    if x.ndim == 0 or (x.shape[-1] * x.dtype.itemsize) % nd.itemsize:
      raise ValueError(f"tensor_eval: BITCAST from {x.dtype} to {nd} of shape {x.shape}: the last axis does not divide")
    return np.ascontiguousarray(x).view(nd)
  return np.ascontiguousarray(x).view(nd).reshape(x.shape)


# *** movement ***

_MOVEMENT_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP)


def apply_movement(op: Ops, arg, x: np.ndarray) -> np.ndarray:
  """One movement op on an array (also used on index arrays by rulec.engine.realize)."""
  if op is Ops.RESHAPE: return x.reshape(tuple(arg))
  if op is Ops.PERMUTE: return np.transpose(x, tuple(arg))
  if op is Ops.EXPAND: return np.broadcast_to(x, tuple(arg))
  if op is Ops.PAD:
    if any(b < 0 or a < 0 for b, a in arg): raise ValueError(f"tensor_eval: negative PAD {arg}")
    return np.pad(x, tuple(tuple(p) for p in arg), mode="constant")
  if op is Ops.SHRINK: return x[tuple(slice(b, e) for b, e in arg)]
  if op is Ops.FLIP: return np.flip(x, tuple(i for i, f in enumerate(arg) if f)) if any(arg) else x
  raise NotImplementedError(f"tensor_eval: {op} is not a movement op")


# *** reductions ***

def _reduce(rop: Ops, axes: tuple[int, ...], x: np.ndarray, dtype: DType) -> np.ndarray:
  nd = np_dtype(dtype)
  x = x.astype(nd, copy=False)
  if rop is Ops.ADD:
    return np.logical_or.reduce(x, axis=axes, keepdims=True) if dtype.kind == "b" else \
      np.add.reduce(x, axis=axes, dtype=nd, keepdims=True)
  if rop is Ops.MUL:
    return np.logical_and.reduce(x, axis=axes, keepdims=True) if dtype.kind == "b" else \
      np.multiply.reduce(x, axis=axes, dtype=nd, keepdims=True)
  if rop is Ops.MAX:  # alu's max folded from the identity: a NaN never wins (np.fmax)
    if dtype.kind == "f": return np.fmax.reduce(x, axis=axes, keepdims=True, initial=np.array(-np.inf, dtype=nd))
    lowest = False if dtype.kind == "b" else np.iinfo(nd).min
    return np.maximum.reduce(x, axis=axes, keepdims=True, initial=np.array(lowest, dtype=nd))
  raise NotImplementedError(f"tensor_eval: REDUCE_AXIS with {rop}")


# *** elementwise ***

def _same(dtype: DType, *xs: np.ndarray) -> list[np.ndarray]:
  nd = np_dtype(dtype)
  return [x.astype(nd, copy=False) for x in xs]


def _float_to(dtype: DType, f: np.ndarray) -> np.ndarray:
  """A float64 result in an integer or bool dtype the way alu.wrap does it: truncate, non-finite -> 0, wrap."""
  if dtype.kind == "b": return f != 0
  f = np.where(np.isfinite(f), np.trunc(f), 0.0)
  f = np.fmod(f, 2.0 ** 64)  # exact; then into [-2**63, 2**63) so the int64 conversion is defined
  f = np.where(f >= 2.0 ** 63, f - 2.0 ** 64, np.where(f < -2.0 ** 63, f + 2.0 ** 64, f))
  return f.astype(np.int64).astype(np_dtype(dtype))


def _float_unary(fn):
  def run(dtype: DType, x: np.ndarray) -> np.ndarray:
    if dtype.kind == "f": return fn(x.astype(np_dtype(dtype), copy=False))
    return _float_to(dtype, fn(x.astype(np.float64)))
  return run


def _neg(dtype, x):
  (x,) = _same(dtype, x)
  return x if dtype.kind == "b" else np.negative(x)


def _trunc(dtype, x):
  (x,) = _same(dtype, x)
  return np.trunc(x) + np.zeros((), x.dtype) if dtype.kind == "f" else x  # (+ 0.0: never -0.0, like alu's float(trunc))


def _add(dtype, a, b):
  a, b = _same(dtype, a, b)
  return np.logical_or(a, b) if dtype.kind == "b" else np.add(a, b)


def _sub(dtype, a, b):
  a, b = _same(dtype, a, b)
  return np.not_equal(a, b) if dtype.kind == "b" else np.subtract(a, b)


def _mul(dtype, a, b):
  a, b = _same(dtype, a, b)
  return np.logical_and(a, b) if dtype.kind == "b" else np.multiply(a, b)


def _fdiv(dtype, a, b):
  if dtype.kind == "f":
    a, b = _same(dtype, a, b)
    return np.true_divide(a, b)
  return _float_to(dtype, np.true_divide(a.astype(np.float64), b.astype(np.float64)))


def _float_idiv(a, b):
  """alu.py's float IDIV: floor(a / b); a / 0 is inf with a's sign (nan counts as nonzero), 0 / 0 is nan."""
  by_zero = np.where(a != 0, np.copysign(np.array(np.inf, a.dtype), a), np.array(np.nan, a.dtype))
  return np.where(b == 0, by_zero, np.floor(np.true_divide(a, b)))


def _int_guarded(fn, float_fn):
  """Integer IDIV / MOD: x op 0 is 0. Floats use float_fn."""
  def run(dtype, a, b):
    if dtype.kind == "f":
      a, b = _same(dtype, a, b)
      return float_fn(a, b)
    if dtype.kind == "b":
      return run_int(np.dtype(np.int8), a, b).astype(bool)
    return run_int(np_dtype(dtype), a, b)

  def run_int(nd, a, b):
    a, b = a.astype(nd, copy=False), b.astype(nd, copy=False)
    zero = b == 0
    return np.where(zero, np.zeros((), nd), fn(a, np.where(zero, np.ones((), nd), b)))
  return run


def _max(dtype, a, b):
  a, b = _same(dtype, a, b)
  return np.where(b > a, b, a) if dtype.kind == "f" else np.maximum(a, b)  # Python's max(a, b)


def _pow(dtype, a, b):
  if dtype.kind == "f":
    a, b = _same(dtype, a, b)
    return np.power(a, b)
  nd = np.dtype(np.int8) if dtype.kind == "b" else np_dtype(dtype)
  a, b = a.astype(nd, copy=False), b.astype(nd, copy=False)
  if nd.kind == "u": out = np.power(a, b)
  else:
    neg = b < 0
    pos = np.power(a, np.where(neg, np.zeros((), nd), b))
    odd = (b % 2) != 0
    negv = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(nd)
    out = np.where(neg, negv, pos)
  return out.astype(bool) if dtype.kind == "b" else out


def _cmp(fn):
  def run(dtype, a, b):
    if a.dtype != b.dtype:  # a malformed graph; compare in the promoted type rather than fail
      t = np.result_type(a, b)
      a, b = a.astype(t), b.astype(t)
    return fn(a, b)
  return run


def _bitwise(fn):
  def run(dtype, a, b):
    if dtype.kind not in "iub": raise TypeError(f"tensor_eval: bitwise op on {dtype}")
    a, b = _same(dtype, a, b)
    return fn(a, b)
  return run


def _shift(left: bool):
  """Python's << and >> wrapped to the dtype: a negative amount leaves a unchanged."""
  def run(dtype, a, b):
    if dtype.kind not in "iu": raise TypeError(f"tensor_eval: shift on {dtype}")
    a, b = _same(dtype, a, b)
    bits = np_dtype(dtype).itemsize * 8
    amount = np.clip(b, 0, bits - 1).astype(a.dtype)
    if left: out = np.where(b >= bits, np.zeros((), a.dtype), np.left_shift(a, amount))
    else:  # a shift by >= bits leaves the sign: 0 or -1 (for signed types clipping to bits - 1 gives exactly that)
      out = np.right_shift(a, amount)
      if a.dtype.kind == "u": out = np.where(b >= bits, np.zeros((), a.dtype), out)
    return np.where(b < 0, a, out)
  return run


def _where(dtype, c, a, b):
  a, b = _same(dtype, a, b)
  return np.where(c.astype(bool, copy=False), a, b)


def _mulacc(dtype, a, b, c):
  return _add(dtype, _mul(dtype, a, b), c)


_ELEMENTWISE = {
  Ops.NEG: _neg, Ops.TRUNC: _trunc,
  Ops.EXP2: _float_unary(np.exp2), Ops.LOG2: _float_unary(np.log2), Ops.SIN: _float_unary(np.sin),
  Ops.SQRT: _float_unary(np.sqrt), Ops.RECIPROCAL: _float_unary(np.reciprocal),
  Ops.ADD: _add, Ops.SUB: _sub, Ops.MUL: _mul, Ops.FDIV: _fdiv,
  Ops.IDIV: _int_guarded(np.floor_divide, _float_idiv), Ops.MOD: _int_guarded(np.mod, np.mod),
  Ops.MAX: _max, Ops.POW: _pow,
  Ops.CMPLT: _cmp(np.less), Ops.CMPNE: _cmp(np.not_equal), Ops.CMPEQ: _cmp(np.equal),
  Ops.AND: _bitwise(np.bitwise_and), Ops.OR: _bitwise(np.bitwise_or), Ops.XOR: _bitwise(np.bitwise_xor),
  Ops.SHL: _shift(True), Ops.SHR: _shift(False),
  Ops.WHERE: _where, Ops.MULACC: _mulacc,
}
