"""Helpers for rules/symbolic.rules: the parts of simplification that are
arithmetic, not pattern shape."""
from __future__ import annotations

from engine.alu import exec_alu
from engine.ops import Ops
from engine.uop import UOp


def fold_constants(alu: UOp) -> UOp | None:
  """An ALU node whose sources are all CONSTs, evaluated (None when the op cannot be folded)."""
  if alu.op in (Ops.THREEFRY,) or alu.dtype.kind == "v": return None
  try: value = exec_alu(alu.op, alu.dtype, [s.arg for s in alu.src])
  except (ArithmeticError, TypeError): return None
  return UOp.const(alu.dtype, value)


def bounds_const(x: UOp) -> UOp | None:
  """An integer expression whose bounds meet is that constant."""
  if x.op is Ops.CONST or not x.dtype.is_int: return None
  lo, hi = x.vmin, x.vmax
  return UOp.const(x.dtype, lo) if isinstance(lo, int) and lo == hi else None
