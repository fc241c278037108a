"""Index arithmetic for movement ops and range creation: what the indexing
rules (rules/rangeify.rules) call. Each function answers one question that is
arithmetic, not pattern shape."""
from __future__ import annotations

from rulec.engine.lang.capability import rule_helper

import itertools
from typing import Any

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, prod


def _c(v: int) -> UOp: return UOp.const(dtypes.index, v)


def strides_of(shape: tuple[int, ...]) -> list[int]:
  out, acc = [], 1
  for s in reversed(shape):
    out.append(acc)
    acc *= s
  return out[::-1]


def apply_movement_op(op: Ops, src_shape: tuple[int, ...], arg: Any, idxs: tuple[UOp, ...]) -> tuple[tuple[UOp, ...], UOp | None]:
  """Indices into a movement op's source for indices `idxs` into its result,
  and the validity condition (None = always valid; only PAD makes one)."""
  if op is Ops.RESHAPE:
    # build only what the symbolic rules would not remove at once: no * 1, no + 0, no // 1, no % of the outer axis
    flat = None
    for i, n, st in zip(idxs, arg, strides_of(tuple(arg))):
      if n == 1: continue
      term = i if st == 1 else i * st
      flat = term if flat is None else flat + term
    if flat is None: flat = _c(0)
    out = []
    for k, (s, st) in enumerate(zip(src_shape, strides_of(src_shape))):
      if s == 1: out.append(_c(0)); continue
      q = flat if st == 1 else flat // st
      out.append(q if all(d == 1 for d in src_shape[:k]) else q % s)
    return tuple(out), None
  if op is Ops.PERMUTE:
    out = [None] * len(arg)
    for i, a in enumerate(arg): out[a] = idxs[i]
    return tuple(out), None
  if op is Ops.EXPAND: return tuple(_c(0) if s == 1 and n != 1 else i for i, s, n in zip(idxs, src_shape, arg)), None
  if op is Ops.SHRINK: return tuple(i + b if b != 0 else i for i, (b, _) in zip(idxs, arg)), None
  if op is Ops.FLIP: return tuple((s - 1) - i if f else i for i, s, f in zip(idxs, src_shape, arg)), None
  if op is Ops.PAD:
    out, valid = [], None
    for i, s, (b, a) in zip(idxs, src_shape, arg):
      out.append(i - b if b != 0 else i)
      if b == 0 and a == 0: continue
      cond = None
      if _may_be_positive(b): cond = _ge(i, b)
      if _may_be_positive(a): cond = _lt(i, b + s) if cond is None else cond & _lt(i, b + s)
      valid = cond if valid is None else valid & cond
    return tuple(out), valid
  raise ValueError(f"{op} is not a movement op")


def _may_be_positive(x) -> bool:
  """A padding amount that may be above 0: an int above 0, or an expression of Variables (a bound offset's
  gradient pads by it) whose range reaches above 0 (at 0 the check it guards is true anyway)."""
  return x.vmax > 0 if isinstance(x, UOp) else x > 0


def _lt(i: UOp, c: int) -> UOp: return i.lt(c)
def _ge(i: UOp, c: int) -> UOp: return i.lt(c).ne(True)


@rule_helper
def source_indices(mop: UOp, idxs: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """Indices into a movement op's source for indices `idxs` into its result."""
  return apply_movement_op(mop.op, mop.src[0].shape, mop.arg, idxs)[0]


@rule_helper
def pad_valid(pad: UOp, idxs: tuple[UOp, ...]) -> UOp:
  """Whether indices `idxs` into a PAD's result fall inside its source (not in the padding)."""
  valid = apply_movement_op(pad.op, pad.src[0].shape, pad.arg, idxs)[1]
  return valid if valid is not None else UOp.const(dtypes.bool, True)


_range_ids = itertools.count()


def new_ranges(shape: tuple[int, ...], kind: str = "loop") -> list[UOp]:
  """One fresh RANGE per axis; size-1 axes get the constant 0 instead (no loop)."""
  return [UOp.range(s, next(_range_ids), kind) if s != 1 else _c(0) for s in shape]


@rule_helper
def store_with_ranges(store: UOp) -> UOp:
  """STORE(target, value) over a shape: loops over every element."""
  target, value = store.src
  rngs = new_ranges(target.shape)
  st = target.index(*rngs, arg="store").store(value.index(*rngs))
  return st.end(*[r for r in rngs if r.op is Ops.RANGE])


@rule_helper
def reduce_with_ranges(idx: UOp) -> UOp:
  """INDEX(REDUCE_AXIS(x), *idxs): a REDUCE over fresh ranges of the reduced axes."""
  red = idx.src[0]
  x = red.src[0]
  op, axes = red.arg
  rr = new_ranges(tuple(x.shape[a] for a in axes), "reduce")
  it = iter(rr)
  inner = tuple(next(it) if i in axes else ix for i, ix in enumerate(idx.src[1:]))
  loops = [r for r in rr if r.op is Ops.RANGE]
  value = x.index(*inner)
  return UOp(Ops.REDUCE, red.dtype, (value, *loops), op) if loops else value


def size_of(shape: tuple[int, ...]) -> int: return prod(shape)
