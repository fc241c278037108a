"""Scalar semantics of the ALU ops, in Python: the meaning constant folding and
the reference device agree on. Integer results wrap to their dtype as numpy's
do; IDIV and MOD are floor division and floor modulo (numpy's // and %)."""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import numpy as np

from rulec.engine.ir.dtypes import DType
from rulec.engine.ir.ops import Ops


def _idiv(a, b):
  if isinstance(a, float) or isinstance(b, float):
    if b == 0: return math.copysign(math.inf, a) if a else math.nan
    q = a / b
    return math.floor(q) if math.isfinite(q) else q
  return a // b if b != 0 else 0   # numpy gives 0 (with a warning) for integer division by zero


def _mod(a, b):
  if isinstance(a, float) or isinstance(b, float): return a % b if b != 0 else math.nan
  return a % b if b != 0 else 0


def _cdiv(a, b):
  """Division truncated toward zero (C); 0 for a zero divisor, as the backends guard it."""
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q


def _cmod(a, b):
  """C remainder: the sign of the dividend (fmod for floats: NaN for a zero divisor or an infinite dividend, as
  C's fmod and LLVM's frem give, where math.fmod raises); 0 for a zero integer divisor."""
  if isinstance(a, float) or isinstance(b, float): return math.fmod(a, b) if b != 0 and not math.isinf(a) else math.nan
  return a - b * _cdiv(a, b) if b != 0 else 0


def _fdiv(a, b):
  try: return a / b
  except ZeroDivisionError: return math.nan if a == 0 or a != a else math.copysign(math.inf, a) * math.copysign(1, b)


def _pow(a, b):
  if isinstance(a, int) and isinstance(b, int) and b < 0:   # integer results only: 1/a**|b| truncated
    return 1 if a == 1 else (1 if b % 2 == 0 else -1) if a == -1 else 0
  try: r = a ** b
  except ZeroDivisionError: return math.inf if isinstance(a, float) or isinstance(b, float) else 0
  except OverflowError: return math.inf
  if isinstance(r, complex): return math.nan
  if isinstance(a, int) and isinstance(b, int) and b < 0:   # integer results only: 1/a**|b| truncated
    return 1 if a == 1 else (1 if b % 2 == 0 else -1) if a == -1 else 0
  return r


def _safe(f):
  def g(*a):
    try: return f(*a)
    except (OverflowError, ValueError): return math.nan
  return g


PYTHON_ALU: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: operator.neg, Ops.EXP2: _safe(lambda x: 2.0 ** x), Ops.LOG2: _safe(lambda x: math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan)),
  Ops.SIN: _safe(math.sin), Ops.SQRT: _safe(lambda x: math.sqrt(x) if x >= 0 else math.nan),
  Ops.RECIPROCAL: lambda x: _fdiv(1.0, x), Ops.TRUNC: lambda x: float(math.trunc(x)) if math.isfinite(x) else x,
  Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.FDIV: _fdiv, Ops.IDIV: _idiv, Ops.MOD: _mod, Ops.CDIV: _cdiv, Ops.CMOD: _cmod,
  Ops.MAX: max, Ops.POW: _pow, Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq,
  Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor, Ops.SHL: lambda a, b: a << b if b >= 0 else a, Ops.SHR: lambda a, b: a >> b if b >= 0 else a,
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
}


def wrap(value: Any, dtype: DType) -> Any:
  """value as dtype holds it: ints wrap around, bools are bools, floats are floats."""
  if dtype.kind == "b": return bool(value)
  if dtype.kind in "iu" or (dtype.kind == "x" and isinstance(value, int)):
    if isinstance(value, float):
      if not math.isfinite(value): return 0
      value = int(value)
    bits = dtype.bits
    value &= (1 << bits) - 1
    if dtype.kind != "u" and value >= 1 << (bits - 1): value -= 1 << bits
    return value
  if dtype.kind == "f": return round_float(float(value), dtype)
  return value


def round_float(value: float, dtype: DType) -> float:
  """value rounded to the nearest number dtype holds (float16 and float32; past the range: inf), as a Python
  float, so folding a constant gives what a kernel computing in that dtype gives."""
  if dtype.itemsize >= 8 or not math.isfinite(value): return value
  with np.errstate(over="ignore"): return float(np.float16(value) if dtype.itemsize == 2 else np.float32(value))


def exec_alu(op: Ops, dtype: DType, operands: list[Any]) -> Any:
  return wrap(PYTHON_ALU[op](*operands), dtype)


def identity_element(op: Ops, dtype) -> Any:
  """The value a reduce of `op` starts from (0 for ADD, 1 for MUL, the lowest value of dtype for MAX)."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtype.min() if dtype.kind != "f" else float("-inf")
  raise ValueError(f"{op} is not a reduce op")
