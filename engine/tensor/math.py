"""Elementwise math beyond the operators: operators as methods, trigonometry and hyperbolics, rounding, tests (isnan, isclose), logaddexp/logsumexp.

Everything is a composition of the operators and the unary math of elementwise.py, so it stays lazy and gets
gradients from the autograd rules. Transcendentals of float16 (and of ints, which give float32) are computed in
float32 and rounded once at the end. Where tinygrad 0.14's result at an edge value is plainly wrong (atan(inf),
sign(nan), logaddexp(-inf, -inf), ...) the mathematically right value (numpy's) is given and the docstring says so."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.tensor.args import DTypeError, cast_scalar, norm_axes, to_dtype
from rulec.engine.tensor.uops import const

if TYPE_CHECKING: from rulec.engine.tensor.tensor import Tensor

# erf: the Maclaurin series below ERF_SPLIT, 1 - erfc by its continued fraction above; term counts per dtype
# (chosen so both halves are within a few ulps: float64 ~1e-15, float32 ~2e-7 relative to math.erf)
ERF_SPLIT = {8: (2.0, 34, 45), 4: (1.5, 16, 18)}
# atan on |t| <= tan(pi/8) (float32, Cephes atanf) and a rational on |t| <= 0.66 (float64, Cephes atan)
ATAN_P32 = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
ATAN_P64 = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
            -1.228866684490136173410e2, -6.485021904942025371773e1)
ATAN_Q64 = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
            4.853903996359136964868e2, 1.945506571482613964425e2)


def _horner(x: Tensor, coeffs) -> Tensor:
  acc = x * 0 + coeffs[0]
  for c in coeffs[1:]: acc = acc * x + c
  return acc


class MathMixin:
  """Elementwise math beyond the operators: operators as methods, trigonometry and hyperbolics, rounding, tests (isnan, isclose), logaddexp/logsumexp."""
  __slots__ = ()

  # *** operators as methods (tinygrad's `reverse=True` computes x op self) ***

  def _dunder(self, x: Any, name: str, reverse: bool) -> Tensor:
    r = getattr(self, f"__r{name}__" if reverse else f"__{name}__")(x)
    if r is NotImplemented: raise TypeError(f"{name}: unsupported operand of type {type(x).__name__}")
    return r

  def _operands(self, x: Any, name: str, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """self and x as Tensors of one broadcast shape and promoted dtype (x first when reverse)."""
    p = self._pair(x, reverse)
    if p is None: raise TypeError(f"{name}: unsupported operand of type {type(x).__name__}")
    return self._new(p[0]), self._new(p[1])

  def add(self, x: Any, reverse: bool = False) -> Tensor:
    """self + x (x + self when reverse)."""
    return self._dunder(x, "add", reverse)

  def sub(self, x: Any, reverse: bool = False) -> Tensor:
    """self - x (x - self when reverse)."""
    return self._dunder(x, "sub", reverse)

  def mul(self, x: Any, reverse: bool = False) -> Tensor:
    """self * x (x * self when reverse)."""
    return self._dunder(x, "mul", reverse)

  def pow(self, x: Any, reverse: bool = False) -> Tensor:
    """self ** x (x ** self when reverse)."""
    return self._dunder(x, "pow", reverse)

  def mod(self, x: Any, reverse: bool = False) -> Tensor:
    """self % x, the floor remainder (sign of the divisor, like Python); x % self when reverse."""
    return self._dunder(x, "mod", reverse)

  def div(self, x: Any, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    """self / x (x / self when reverse); rounding_mode 'trunc' or 'floor' rounds the quotient and keeps integer dtypes.

    None is true division (ints give float32). 'floor' is `//`; 'trunc' rounds toward zero (C's integer division).
    Another rounding_mode raises RuntimeError, as in tinygrad."""
    if rounding_mode not in (None, "trunc", "floor"): raise RuntimeError(f"rounding_mode={rounding_mode!r} is not supported")
    if rounding_mode is None: return self._dunder(x, "truediv", reverse)
    q = self._dunder(x, "floordiv", reverse)
    if rounding_mode == "floor": return q
    if q.dtype.is_float: return self._dunder(x, "truediv", reverse).trunc().cast(q.dtype)
    # floor and trunc differ by one where the quotient is negative and not whole
    r = self._dunder(x, "mod", reverse)
    return q + ((r != 0) & (q < 0)).cast(q.dtype)

  def fmod(self, x: Any) -> Tensor:
    """C's remainder self - trunc(self / x) * x: the sign of the dividend (numpy's fmod); NaN for a float x of 0.

    tinygrad 0.14 returns self where x is 0.0; here it is NaN as in numpy and torch."""
    a, b = self._operands(x, "fmod")
    if a.dtype.is_bool: a, b = a.cast(dtypes.int8), b.cast(dtypes.int8)
    # both non-negative: floor and C remainder agree, and the result is exact. The sign goes back by the sign bit,
    # and |a| by the sign bit too, so the gradient with respect to a is 1 everywhere (0.0 and -0.0 included)
    if not a.dtype.is_float:
      m = a.abs() % b.abs()
      return (a < 0).where(-m, m)
    m = a._abs_bits() % b._abs_bits()
    return a._sign_bit().where(-m, m)

  def neg(self) -> Tensor:
    """-self; of a bool tensor, its logical not (as tinygrad: `-` itself refuses bools)."""
    return self.logical_not() if self.dtype.is_bool else -self

  def lshift(self, x: Any, reverse: bool = False) -> Tensor:
    """self << x for integer tensors (x << self when reverse)."""
    return self._dunder(x, "lshift", reverse)

  def rshift(self, x: Any, reverse: bool = False) -> Tensor:
    """self >> x for integer tensors (x >> self when reverse); arithmetic for signed dtypes."""
    return self._dunder(x, "rshift", reverse)

  def bitwise_and(self, x: Any, reverse: bool = False) -> Tensor:
    """self & x for integer or bool tensors."""
    return self._dunder(x, "and", reverse)

  def bitwise_or(self, x: Any, reverse: bool = False) -> Tensor:
    """self | x for integer or bool tensors."""
    return self._dunder(x, "or", reverse)

  def bitwise_xor(self, x: Any, reverse: bool = False) -> Tensor:
    """self ^ x for integer or bool tensors."""
    return self._dunder(x, "xor", reverse)

  def bitwise_not(self) -> Tensor:
    """~self for integer or bool tensors (floats raise TypeError)."""
    return ~self

  def logical_not(self) -> Tensor:
    """self == 0 as a bool tensor (not of a bool tensor)."""
    return ~self if self.dtype.is_bool else self == 0

  def eq(self, x: Any) -> Tensor:
    """self == x, elementwise, as a bool tensor."""
    return self._dunder(x, "eq", False)

  def ne(self, x: Any) -> Tensor:
    """self != x, elementwise, as a bool tensor."""
    return self._dunder(x, "ne", False)

  def copysign(self, other: Any) -> Tensor:
    """|self| with the sign of other; for floats the sign bit, so -0.0 counts as negative and NaN's sign is its bit.

    Integer tensors keep their dtype (as tinygrad; numpy gives floats)."""
    a, b = self._operands(other, "copysign")
    if a.dtype.is_bool: a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
    if not a.dtype.is_float: return (b < 0).where(-a.abs(), a.abs())
    # the sign bit (bits, so no gradient flows to other); self's gradient is +-sign(self) through abs: 0 at +-0.0,
    # as tinygrad's and torch's
    return b._sign_bit().where(-a.abs(), a.abs())

  def _sign_bit(self) -> Tensor:
    """True where a float's sign bit is set (-0.0 and negative NaNs included); no gradient flows through it."""
    idt = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[self.dtype.itemsize]
    sign = -(1 << (8 * self.dtype.itemsize - 1))   # the sign bit, as a signed integer of that size
    return (self.bitcast(idt) & sign) != 0

  def lerp(self, end: Any, weight: Any) -> Tensor:
    """self + (end - self) * weight."""
    return self + (self._lift(end) - self) * weight

  # *** in-place operators (tinygrad's: `x += y` is `x.assign(x + y)`; x keeps its identity and storage) ***

  def _inplace(self, result: Tensor, name: str) -> Tensor:
    """assign result into self; a result of another dtype raises DTypeError (a RuntimeError, as tinygrad's
    assign), where the plain assign would cast: `int_tensor += 1.5` is refused, not truncated."""
    if result.dtype != self.dtype:
      raise DTypeError(f"{name}: the result's dtype {result.dtype.name} differs from the tensor's {self.dtype.name}")
    return self.assign(result)

  def __iadd__(self, x: Any) -> Tensor:
    """x += y: writes x + y into x's storage (lazily, as assign); the result must keep x's shape and dtype."""
    return self._inplace(self.add(x), "+=")

  def __isub__(self, x: Any) -> Tensor:
    """x -= y: writes x - y into x's storage."""
    return self._inplace(self.sub(x), "-=")

  def __imul__(self, x: Any) -> Tensor:
    """x *= y: writes x * y into x's storage."""
    return self._inplace(self.mul(x), "*=")

  def __itruediv__(self, x: Any) -> Tensor:
    """x /= y: writes x / y into x's storage (an integer x raises: true division gives floats)."""
    return self._inplace(self.div(x), "/=")

  def __ifloordiv__(self, x: Any) -> Tensor:
    """x //= y: writes x // y into x's storage. (tinygrad has no in-place %: `x %= y` makes a new tensor.)"""
    return self._inplace(self._dunder(x, "floordiv", False), "//=")

  def __ipow__(self, x: Any) -> Tensor:
    """x **= y: writes x ** y into x's storage."""
    return self._inplace(self.pow(x), "**=")

  def __imatmul__(self, x: Any) -> Tensor:
    """x @= y: writes x @ y into x's storage (so y must be square over x's last axis)."""
    return self._inplace(self.matmul(x), "@=")

  def __iand__(self, x: Any) -> Tensor:
    """x &= y: writes x & y into x's storage."""
    return self._inplace(self.bitwise_and(x), "&=")

  def __ior__(self, x: Any) -> Tensor:
    """x |= y: writes x | y into x's storage."""
    return self._inplace(self.bitwise_or(x), "|=")

  def __ixor__(self, x: Any) -> Tensor:
    """x ^= y: writes x ^ y into x's storage."""
    return self._inplace(self.bitwise_xor(x), "^=")

  def __ilshift__(self, x: Any) -> Tensor:
    """x <<= y: writes x << y into x's storage."""
    return self._inplace(self.lshift(x), "<<=")

  def __irshift__(self, x: Any) -> Tensor:
    """x >>= y: writes x >> y into x's storage."""
    return self._inplace(self.rshift(x), ">>=")

  # *** sums and products of several tensors, constants like this one ***

  def usum(self, *others: Any) -> Tensor:
    """usum(*others): self + others[0] + ... elementwise (a list or tuple may be given as the one argument); for
    bool tensors the logical or."""
    xs = others[0] if len(others) == 1 and isinstance(others[0], (list, tuple)) else others
    r = self
    for x in xs: r = (r | x) if self.dtype.is_bool else r + x
    return r

  def uprod(self, *others: Any) -> Tensor:
    """uprod(*others): self * others[0] * ... elementwise (a list or tuple may be given as the one argument); for
    bool tensors the logical and."""
    xs = others[0] if len(others) == 1 and isinstance(others[0], (list, tuple)) else others
    r = self
    for x in xs: r = (r & x) if self.dtype.is_bool else r * x
    return r

  def const_like(self, b: Any, dtype: Any = None) -> Tensor:
    """const_like(b, dtype=None): a lazy constant b of this tensor's shape, in its dtype (b cast to it:
    an int tensor's const_like(2.5) is 2) or in dtype."""
    dt = self.dtype if dtype is None else to_dtype(dtype)
    return self._new(const(cast_scalar(b, dt), dt, self.shape))

  # *** float math helpers ***

  def _in_float(self, fn) -> Tensor:
    """fn of self computed in float32 for float16, bfloat16 and integer inputs (rounded back for the 2-byte floats)."""
    x, out = self._half_up()
    return fn(x).cast(out)

  def _log1p(self) -> Tensor:
    """log(1 + self) accurate near 0: the rounding of 1 + u is divided back out (u = 0 exactly gives u)."""
    u1 = self + 1
    d = u1 - 1
    r = u1.log() * (self / (d == 0).where(1, d))
    return (d == 0).where(self, (u1 == math.inf).where(u1, r))

  def _expm1(self) -> Tensor:
    """exp(self) - 1 accurate near 0, the same way: (e - 1) * x / log(e) with e = exp(x) rounded."""
    e = self.exp()
    d = e - 1
    lg = e.log()
    r = d * (self / (lg == 0).where(1, lg))
    return (e == 1).where(self, (d == -1).where(-1, (e == math.inf).where(e, r)))

  def _odd(self, r: Tensor) -> Tensor:
    """An odd function from its value r at |self|: -r where self < 0 (NaN stays NaN)."""
    return (self < 0).where(-r, r)

  # *** trigonometry and hyperbolics ***

  def tan(self) -> Tensor:
    """sin / cos."""
    return self._in_float(lambda x: x.sin() / x.cos())

  def _atan(self) -> Tensor:
    a = self._abs_odd()
    f64 = self.dtype is dtypes.float64
    big, mid = a > 2.414213562373095, a > (0.66 if f64 else 0.4142135623730950)
    # reduce to |t| small: atan(a) = pi/2 + atan(-1/a) for large a, pi/4 + atan((a-1)/(a+1)) in between
    inv = -1 / a.maximum(1.0)
    mi = a.clip(0.0, 3.0)
    t = big.where(inv, mid.where((mi - 1) / (mi + 1), a))
    base = big.cast(self.dtype) * (math.pi / 2) + (mid & ~big).cast(self.dtype) * (math.pi / 4)
    z = t * t
    if f64: p = z * _horner(z, ATAN_P64) / _horner(z, (1.0,) + ATAN_Q64)
    else: p = z * _horner(z, ATAN_P32)
    return self._odd(base + (t + t * p))

  def atan(self) -> Tensor:
    """Arctangent in (-pi/2, pi/2); atan(+-inf) is +-pi/2 (tinygrad 0.14 gives NaN)."""
    return self._in_float(lambda x: x._atan())

  def asin(self) -> Tensor:
    """Arcsine; NaN outside [-1, 1]."""
    return self._in_float(lambda x: (x / ((1 - x) * (1 + x)).sqrt())._atan())

  def acos(self) -> Tensor:
    """Arccosine in [0, pi]; NaN outside [-1, 1]."""
    # 2 atan(sqrt((1-x)/(1+x))) keeps relative accuracy near x = 1, where pi/2 - asin(x) would cancel
    return self._in_float(lambda x: ((1 - x) / (1 + x)).sqrt()._atan() * 2)

  def _sinh_cosh(self, odd: bool) -> Tensor:
    a = self._abs_odd()
    e = (a - math.log(2.0)).exp()   # e^a / 2, which does not overflow before the result does
    q = 0.25 / e
    if not odd: return e + q
    # e^a - e^-a cancels near 0: there the Maclaurin series is exact to the dtype
    n = 7 if self.dtype is dtypes.float64 else 4
    s = a.minimum(0.5)
    z = s * s
    series = s * _horner(z, [1 / math.factorial(2 * k + 1) for k in range(n, -1, -1)])
    return self._odd((a < 0.5).where(series, e - q))

  def sinh(self) -> Tensor:
    """Hyperbolic sine."""
    return self._in_float(lambda x: x._sinh_cosh(True))

  def cosh(self) -> Tensor:
    """Hyperbolic cosine."""
    return self._in_float(lambda x: x._sinh_cosh(False))

  def _big(self) -> float:
    """Above this |x|, x*x + 1 == x*x: asinh and acosh are log(2|x|)."""
    return 2.0 ** 28 if self.dtype is dtypes.float64 else 2.0 ** 12

  def asinh(self) -> Tensor:
    """Inverse hyperbolic sine."""
    def f(x):
      a = x._abs_odd()
      s = a.minimum(x._big())
      near = (s + s * s / (1 + (s * s + 1).sqrt()))._log1p()
      return x._odd((a > x._big()).where(a.maximum(1.0).log() + math.log(2.0), near))
    return self._in_float(f)

  def acosh(self) -> Tensor:
    """Inverse hyperbolic cosine; NaN below 1. The gradient is 1 / sqrt(x^2 - 1) everywhere, as torch's and
    tinygrad's: inf at 1 and -1, NaN between them, finite below -1 (where the value is NaN)."""
    def f(x):
      t = (x.clip(1.0, x._big()) - 1)
      # sqrt(t) * sqrt(t + 2), not sqrt(t * (t + 2)): at t = 0 the gradient is inf, not inf * 0
      near = (t + t.sqrt() * (t + 2).sqrt())._log1p()
      r = (x > x._big()).where(x.maximum(1.0).log() + math.log(2.0), near)
      below = x < 1
      return below.where(x._nan_with_grad(below.where(1 / (x * x - 1).sqrt(), 0.0)), r)
    return self._in_float(f)

  def atanh(self) -> Tensor:
    """Inverse hyperbolic tangent; +-inf at +-1, NaN outside [-1, 1].

    Outside, the gradient is 1 / (1 - x^2), as torch's and tinygrad's (NaN at +-1, as tinygrad's)."""
    def f(x):
      out = x._abs_odd() > 1
      xs = out.where(0.0, x)   # the branch not taken sees 0, not a value whose local gradient is NaN
      a = xs._abs_odd()
      return out.where(x._nan_with_grad(out.where(1 / (1 - x * x), 0.0)), xs._odd((a * 2 / (1 - a))._log1p() * 0.5))
    return self._in_float(f)

  def _nan_with_grad(self, d: Tensor) -> Tensor:
    """NaN, with gradient d (d itself is not differentiated): (self - self.detach()) is 0 with gradient 1. For a
    function's gradient where its value is NaN (outside its domain) but torch and tinygrad define a gradient. d must
    be finite where this is a branch a where does not take (the 0 flowing there times an infinite d is NaN)."""
    return (self - self.detach()) * d.detach() + math.nan

  # *** other elementwise math ***

  def _erf(self) -> Tensor:
    split, n_series, n_cf = ERF_SPLIT[8 if self.dtype is dtypes.float64 else 4]
    a = self._abs_odd()
    s = a.minimum(split)
    coeffs = [(-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in range(n_series, -1, -1)]
    series = s * _horner(s * s, coeffs) * (2 / math.sqrt(math.pi))
    c = a.maximum(split)
    k = c
    for i in range(n_cf, 0, -1): k = c + (i / 2) / k   # erfc(c) = exp(-c^2) / (sqrt(pi) * k)
    tail = 1 - (-(c * c)).exp() / (k * math.sqrt(math.pi))
    return self._odd((a < split).where(series, tail))

  def erf(self) -> Tensor:
    """The error function (about 2e-7 relative error in float32, 1e-15 in float64)."""
    return self._in_float(lambda x: x._erf())

  def log10(self) -> Tensor:
    """Base-10 logarithm."""
    return self._in_float(lambda x: x.log2() * math.log10(2.0))

  def round(self) -> Tensor:
    """Round half to even (as numpy and tinygrad); integer and bool tensors give float32, as in tinygrad."""
    x = self if self.dtype.is_float else self.cast(dtypes.default_float)
    f = x.floor()
    d = x - f   # exact: x and floor(x) are close
    up = (d > 0.5) | ((d == 0.5) & (f % 2 != 0))
    return up.where(f + 1, f)

  def sign(self) -> Tensor:
    """-1, 0 or 1 by the sign of self in its dtype; NaN stays NaN, -0.0 stays -0.0 (tinygrad 0.14 gives 1 for NaN).
    Its gradient is 0 everywhere, as tinygrad's and torch's (where self is 0 or NaN the value is self * 0.0)."""
    if self.dtype.is_bool: return self
    if self.dtype.is_float: return (self > 0).where(1.0, (self < 0).where(-1.0, self * 0.0)).cast(self.dtype)
    return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)

  def isnan(self) -> Tensor:
    """True where self is NaN (never for integer tensors)."""
    return self != self

  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    """True where self is +inf (if detect_positive) or -inf (if detect_negative)."""
    if not self.dtype.is_float: return self != self   # all False
    r = (self == math.inf) & detect_positive
    return r | ((self == -math.inf) & detect_negative)

  def isfinite(self) -> Tensor:
    """True where self is neither inf nor NaN (always for integer tensors)."""
    if not self.dtype.is_float: return self == self
    return ~(self.isinf() | self.isnan())

  def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|self - other| <= atol + rtol * |other| elementwise (numpy's isclose): infinities are close only to themselves,
    NaNs only to NaNs and only with equal_nan."""
    a, b = self._operands(other, "isclose")
    if not a.dtype.is_float: a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
    near = a.isfinite() & b.isfinite() & ((a - b).abs() <= atol + rtol * b.abs())
    r = (a == b) | near
    return r | (a.isnan() & b.isnan()) if equal_nan else r

  def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """isclose(...).all(): a 0-d bool tensor (`bool()` of it is the Python answer)."""
    return self.isclose(other, rtol, atol, equal_nan).all()

  def logaddexp(self, other: Any) -> Tensor:
    """log(exp(self) + exp(other)) without overflow; logaddexp(-inf, -inf) is -inf (tinygrad 0.14 gives NaN)."""
    a, b = self._operands(other, "logaddexp")
    def f(x):
      y = b.cast(x.dtype)
      d = (x == y).where(0.0, -(x - y).abs())   # equal infinities: no inf - inf
      return x.maximum(y) + d.exp()._log1p()
    return a._in_float(f)

  def logsumexp(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(self), axis)), computed around the max so it does not overflow; -inf over an empty axis."""
    def f(x):
      if x.numel() == 0: m = x.sum(axis, keepdim=True) * 0   # no max of nothing: exp sums to 0, log to -inf
      else: m = x.max(axis, keepdim=True)
      m = m.isfinite().where(m, 0.0)   # an all -inf (or inf) slice: shifting by it would give inf - inf
      r = (x - m).exp().sum(axis, keepdim=True).log() + m
      axes = norm_axes(axis, x.ndim)
      return r if keepdim else r.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return self._in_float(f)
