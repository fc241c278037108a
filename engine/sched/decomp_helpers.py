"""Helpers for rules/decomp.rules: float32 exp2 / log2 from arithmetic and exponent bits (optional rules a
device asks for). Floor division, modulo and clamped loads are rules of their own there."""
from __future__ import annotations

from engine.lang.capability import rule_helper

from engine.dtypes import dtypes
from engine.uop import UOp


# *** exp2 and log2 of float32, in float64 arithmetic (optional: the devices that ask, runtime.kernel.decomposed) ***
#
# libm's exp2f / log2f are calls, one element at a time; these are adds, multiplies, a divide, compares, selects,
# integer adds and shifts and bitcasts, which LLVM's vectorisers pack four or eight to an instruction. They compute
# in float64 to within about 2**-50 of the exact value and round once to float32, so a result is the correctly
# rounded one unless the exact value lies within 2**-50 (relative) of a halfway point between two floats: as libm's
# nearly always are, and never more than 0.5 + 2**-25 ulp off. Every step is one op, evaluated in the order written
# (no fma: the renderer emits none without `contract`). The polynomials were fitted for this code (least squares
# weighted toward minimax relative error, Lawson's iteration) and checked against 50-digit decimal arithmetic.

_F64, _U64 = dtypes.float64, dtypes.uint64
# 2**r = 1 + r * q(r) for |r| <= 1/2: q's coefficients, constant term first (relative error 2.1e-16 after rounding)
_EXP2_Q = (0.6931471805599455, 0.24022650695910075, 0.05550410866479511, 0.009618129107614195, 0.0013333558153517308,
           0.00015403530424571465, 1.5252726295119714e-05, 1.3215453909475663e-06, 1.0181433857773912e-07,
           7.0703704522827244e-09, 3.921454236692816e-10)
# log(1+f) = 2s + s * z * r(z), s = f / (2 + f), z = s*s <= 0.0295: r's coefficients (relative error 6.9e-16)
_LOG_R = (0.6666666666666197, 0.40000000011232817, 0.28571424131345247, 0.2222286292125845, 0.18140169926179692,
          0.1662212693486474)
_ROUND = 6755399441055744.0           # 1.5 * 2**52: x + this has round(x) in its low mantissa bits, for |x| < 2**51
_ROUND_BITS = 0x4338000000000000
_SQRT_HALF_BITS = 0x3fe6a09e667f3bcd  # sqrt(1/2) as a float64
_INV_LN2 = 1.4426950408889634         # 1 / log(2)


def _poly(x: UOp, coeffs: tuple[float, ...]) -> UOp:
  """sum(c_i * x**i), by Horner's rule."""
  acc = UOp.const(x.dtype, coeffs[-1])
  for c in reversed(coeffs[:-1]): acc = acc * x + c
  return acc


@rule_helper
def exp2_bits(x: UOp) -> UOp:
  """2**x for a float32 x: x = n + r with n = round(x), 2**r by a polynomial, times 2**n from exponent bits."""
  d = x.cast(_F64)
  # past these every float32 result is inf or 0; both ends keep n inside float64's normal exponents
  d = UOp.const(_F64, 130.0).lt(d).where(130.0, d.lt(-152.0).where(-152.0, d))
  t = d + _ROUND
  n = t.bitcast(_U64) - _ROUND_BITS     # round(x), as an integer (wrapping: negative n works the same)
  r = d - (t - _ROUND)                  # exact: |r| <= 1/2
  p = r * _poly(r, _EXP2_Q) + 1.0
  # exact in float64 (2**-152 .. 2**130 are normal there); the cast to float32 rounds once, to a subnormal, 0 or inf
  res = (p * ((n + 1023) << 52).bitcast(_F64)).cast(x.dtype)
  return x.ne(x).where(x, res)          # NaN stays the input's NaN


@rule_helper
def log2_bits(x: UOp) -> UOp:
  """log2(x) for a float32 x: x = 2**k * m with m in [sqrt(1/2), sqrt(2)), log(m) by a series in s = (m-1)/(m+1)."""
  d = x.cast(_F64)                      # a float32 subnormal is a normal float64: no special case
  bits = d.bitcast(_U64)
  # k + 512 from the exponent of x / sqrt(1/2), kept positive so that a logical shift takes it (AVX2 has no 64-bit
  # arithmetic shift); negative, zero and infinite x give garbage here and are replaced below
  kb = (bits - _SQRT_HALF_BITS + (512 << 52)) >> 52
  m = (bits - ((kb - 512) << 52)).bitcast(_F64)
  f = m - 1.0                           # exact
  s = f / (f + 2.0)
  z = s * s
  ln = s * 2.0 + s * (z * _poly(z, _LOG_R))
  k = (kb + _ROUND_BITS).bitcast(_F64) - (_ROUND + 512.0)   # k as a float64, exact, without an int -> float conversion
  res = (k + ln * _INV_LN2).cast(x.dtype)
  res = x.lt(0.0).where(UOp.const(x.dtype, float("nan")), res)
  res = x.eq(0.0).where(UOp.const(x.dtype, float("-inf")), res)
  res = x.eq(float("inf")).where(x, res)
  return x.ne(x).where(x, res)
