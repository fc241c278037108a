"""Scalar semantics of the ALU ops, in Python: the meaning constant folding and
the reference device agree on. Integer results wrap to their dtype as numpy's
do; IDIV and MOD are floor division and floor modulo (numpy's // and %).

A float op computes in its own dtype through numpy (`float_alu`, which the NUMPY
device runs on whole arrays): every result rounded to float16 / float32 / float64
once (bfloat16, which numpy has no arithmetic of its own for: computed in float32
and rounded to bfloat16, `half_alu`, the same bits: float32 carries more than
twice bfloat16's precision, so the double rounding of + - * / and sqrt is exact), overflow to an infinity of the right sign, underflow to zero or a
subnormal, NaN in, NaN out, no Python exception (Python's `2.0 ** 1000.0` raises
OverflowError, its `(-2.0) ** 1025.0` too). So a folded constant is what the
device computes, bit for bit, for every op IEEE 754 defines exactly. EXP2, LOG2,
SIN and float POW it does not: each device has its own approximation (the CPU's
exp2 is a polynomial, numpy's is another), so constant folding leaves those to
the device (`DEVICE_DEFINED`); exec_alu still gives numpy's value for them."""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import numpy as np

from rulec.engine.ir.dtypes import DType, np_dtype_named
from rulec.engine.ir.ops import Ops


def _idiv(a, b):
  if isinstance(a, float) or isinstance(b, float):
    q = _fdiv(a, b)   # a / 0 is an infinity signed by both signs (1 // -0.0 is -inf), 0 / 0 and NaN / 0 NaN, as numpy
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
  if isinstance(a, float) or isinstance(b, float): return _f64(Ops.POW)(a, b)   # (-2.0) ** 1025.0 is -inf, not an OverflowError
  if b < 0: return 1 if a == 1 else (1 if b % 2 == 0 else -1) if a == -1 else 0   # integer results: 1/a**|b| truncated
  return a ** b


def float_alu(op: Ops, xs: list) -> Any:
  """op on numpy floats of one dtype (arrays or scalars), computed in that dtype as numpy does; call it under
  np.errstate(all="ignore"). The NUMPY device runs its float ops through this, constant folding too (exec_alu)."""
  if op is Ops.NEG: return np.negative(xs[0])
  if op is Ops.EXP2: return np.exp2(xs[0])
  if op is Ops.LOG2: return np.log2(xs[0])
  if op is Ops.SIN: return np.sin(xs[0])
  if op is Ops.SQRT: return np.sqrt(xs[0])
  if op is Ops.RECIPROCAL: return np.true_divide(1.0, xs[0])
  if op is Ops.TRUNC: return np.trunc(xs[0]) + 0.0   # never -0.0 (+ 0.0 makes -0.0 +0.0)
  if op is Ops.MULACC: return xs[0] * xs[1] + xs[2]  # two roundings
  a, b = xs
  if op is Ops.ADD: return a + b
  if op is Ops.SUB: return a - b
  if op is Ops.MUL: return a * b
  if op is Ops.FDIV: return np.true_divide(a, b)
  if op is Ops.IDIV:   # floor of the rounded quotient (a non-finite one passes through: 1 // -0.0 is -inf); never -0.0
    return np.floor(np.true_divide(a, b)) + 0.0
  if op is Ops.MOD: return np.remainder(a, b)      # Python's float %: the divisor's sign (a zero too), nan for b == 0
  if op is Ops.MAX: return np.where(b > a, b, a)   # Python's max(a, b): a unless b is larger (a NaN a stays)
  if op is Ops.POW: return np.power(a, b)
  raise TypeError(f"{op} is not defined on floats")


FLOAT_OPS = frozenset({Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC, Ops.MULACC, Ops.ADD,
                       Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW})
# float ops whose results IEEE 754 leaves to the implementation (each device approximates them its own way):
# constant folding does not fold them on floats, so a constant gets the value the device would compute
DEVICE_DEFINED = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW})
_FLOATS = ("float16", "bfloat16", "float32", "float64")   # the float dtypes computed with numpy's types
_NP_FLOAT = {"float16": np.float16, "float32": np.float32, "float64": np.float64}   # (and bfloat16: _np_float)


def _np_float(name: str):
  """numpy's scalar type of a float dtype's np_name (bfloat16: ml_dtypes', imported on first use)."""
  t = _NP_FLOAT.get(name)
  if t is None: t = _NP_FLOAT[name] = np_dtype_named(name).type
  return t


def is_bfloat16(t: np.dtype) -> bool:
  """t is ml_dtypes' bfloat16 (compared by name: asking needs no import of ml_dtypes)."""
  return t.name == "bfloat16"


def half_alu(op: Ops, xs: list, t: np.dtype) -> np.ndarray:
  """op on operands of the 2-byte float t (their values, any float array type) as every device computes it: in
  float32 (each operand widens exactly), the result rounded once to t. Two ops in one round in between, as two ops:
  MULACC's product, IDIV's quotient before its floor. numpy's own float16 ufuncs compute so too."""
  f = [np.asarray(x).astype(np.float32) for x in xs]
  if op is Ops.MULACC: r = _rounded(f[0] * f[1], t) + f[2]
  elif op is Ops.IDIV:
    r = np.floor(_rounded(np.true_divide(f[0], f[1]), t)) + np.float32(0.0)
  else: r = float_alu(op, f)
  return np.asarray(r).astype(t)


def _rounded(v, t: np.dtype) -> np.ndarray:
  """float32 values rounded to t's precision, still float32."""
  return np.asarray(v).astype(t).astype(np.float32)


def _f64(op: Ops) -> Callable[..., Any]:
  """op on Python numbers computed as float64 (for ops that make floats of integer operands too)."""
  def f(*xs):
    with np.errstate(all="ignore"): return float(float_alu(op, [np.float64(x) for x in xs]))
  return f


PYTHON_ALU: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: operator.neg, Ops.EXP2: _f64(Ops.EXP2), Ops.LOG2: _f64(Ops.LOG2), Ops.SIN: _f64(Ops.SIN), Ops.SQRT: _f64(Ops.SQRT),
  Ops.RECIPROCAL: lambda x: _fdiv(1.0, x), Ops.TRUNC: lambda x: float(math.trunc(x)) if math.isfinite(x) else x,
  Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.FDIV: _fdiv, Ops.IDIV: _idiv, Ops.MOD: _mod, Ops.CDIV: _cdiv, Ops.CMOD: _cmod,
  Ops.MAX: max, Ops.POW: _pow, Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq,
  Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor, Ops.SHL: lambda a, b: a << b if b >= 0 else a, Ops.SHR: lambda a, b: a >> b if b >= 0 else a,
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
}


def wrap(value: Any, dtype: DType) -> Any:
  """value as dtype holds it: ints wrap around, bools are bools, floats are floats."""
  if dtype.kind == "b": return bool(value)
  # (index is 64-bit: a float cast to it truncates as to int64, as the devices' casts do)
  if dtype.kind in "iu" or (dtype.kind == "x" and isinstance(value, (int, float)) and not isinstance(value, bool)):
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
  """value rounded to the nearest number dtype holds (float16, bfloat16 and float32; past the range: inf), as a
  Python float, so folding a constant gives what a kernel computing in that dtype gives."""
  if dtype.itemsize >= 8 or not math.isfinite(value): return value
  with np.errstate(over="ignore"): return float(np.array(value, np.float64).astype(_np_float(dtype.np_name)))


def exec_alu(op: Ops, dtype: DType, operands: list[Any]) -> Any:
  """op on Python values of dtype, as dtype holds the result. A float op computes in the float dtype (float_alu)."""
  if op in FLOAT_OPS and dtype.np_name in _FLOATS:
    t = _np_float(dtype.np_name)
    with np.errstate(all="ignore"):
      if dtype.np_name == "bfloat16": return float(half_alu(op, operands, np.dtype(t)))
      return float(t(float_alu(op, [t(x) for x in operands])))
  return wrap(PYTHON_ALU[op](*operands), dtype)


def identity_element(op: Ops, dtype) -> Any:
  """The value a reduce of `op` starts from (0 for ADD, 1 for MUL, the lowest value of dtype for MAX)."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtype.min() if dtype.kind != "f" else float("-inf")
  raise ValueError(f"{op} is not a reduce op")
