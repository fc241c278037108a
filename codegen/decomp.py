"""Decompositions (rules/decomp.rules): `decomposed(kernel)` runs them on a kernel before a backend renders it,
and the rule helpers here build float32 exp2 / log2 from arithmetic and exponent bits (optional rules a device
asks for). Floor division, modulo and clamped loads are rules of their own there."""
from __future__ import annotations

from rulec.engine.lang.capability import rule_helper

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.kernel import Kernel, arg_problem, validate
from rulec.engine.ir.ops import MAY_FUSE, Ops
from rulec.engine.ir.rewrite import RuleRuntimeError, graph_rewrite, rule_of, rule_source
from rulec.engine.ir.uop import UOp
from rulec.engine.lang.loader import load_library


# Host buffers (runtime/buffer.py host_array) have this many zeroed bytes before and after their elements (at most
# as many as they hold): a device that runs kernels on them says so with INDEX among its optional decompositions,
# and a load that may fall outside its buffer but not past that slack, discarded by a WHERE, then reads where it
# points instead of being clamped to element 0. The lanes of a register tile keep neighbouring addresses, one
# vector load and a select (a convolution's input gradient, whose padding guards clamped each lane: a gather)
LOAD_SLACK_BYTES = 4096


def load_slack(size: int, itemsize: int) -> int:
  """The slack of a host buffer of `size` elements of `itemsize` bytes, in elements, on each side."""
  return min(size, LOAD_SLACK_BYTES // itemsize)


def decomposed(kernel: Kernel, optional: frozenset = frozenset()) -> Kernel:
  """The kernel with the ops a backend lacks decomposed (rules/decomp.rules): what the renderers receive.
  `optional`: the ops whose optional decompositions the backend wants (the CPU's: EXP2 and LOG2)."""
  return checked_rewrite(kernel, "decomp", optional)


def checked_rewrite(kernel: Kernel, ruleset: str, ctx) -> Kernel:
  """The kernel rewritten by a codegen rule set (decomp, online) and validated. A user's rules directory may extend
  these sets, and they run after scheduling, before the renderers print the kernel: what comes out is validated
  here, and a node no kernel may hold is blamed on the rule that built it."""
  matcher = load_library().matcher(ruleset)
  out = Kernel(graph_rewrite(kernel.ast, matcher, ctx=ctx), kernel.bufs)
  try: validate(out)
  except ValueError as e: raise _blame(matcher, ctx, kernel.ast, e, ruleset) from None
  return out


def _blame(matcher, ctx, ast: UOp, error: ValueError, ruleset: str = "decomp") -> Exception:
  """The RuleRuntimeError naming the rule whose one rewrite of a node of `ast` builds a node with an arg the IR
  does not allow (`error` as it is when no single rule can be named)."""
  nodes = ast.toposort()
  seen = set(nodes)
  for u in nodes:
    try: new = matcher.rewrite(u, ctx)
    except Exception: continue
    if new is None or not isinstance(new, UOp): continue
    bad = next((p for x in new.toposort() if x not in seen and (p := arg_problem(x)) is not None), None)
    if bad is not None and (hit := rule_of(matcher, ctx, u)) is not None:
      return RuleRuntimeError(rule_source(matcher, hit), ValueError(bad))
  return ValueError(f"{error} (after the {ruleset} rules: a rules directory layered over them may have built it)")


# *** exp2 and log2 of float32 (optional: the devices that ask, through `decomposed`) ***
#
# libm's exp2f / log2f are calls, one element at a time; these are adds, multiplies, a divide, compares, selects,
# integer adds and shifts and bitcasts, which LLVM's vectorisers pack eight or sixteen to an instruction. exp2 computes
# in float32 and stays within 1.2 ulp of the exact value (numpy's own float32 exp2: 2.8); float16 through it is
# numpy's float16 bit for bit (every input checked). log2 computes in float64 to within about 2**-50 of the exact
# value and rounds once to float32, so it is the correctly rounded float unless the exact value lies within 2**-50
# (relative) of a halfway point: never more than 0.5 + 2**-25 ulp off (log2 runs once per row of a log_softmax, not
# per element, so its cost matters less than exactness). Every step is one op, evaluated in the order written, except
# exp2's Horner steps: MULACCs marked MAY_FUSE, one fma each on a CPU that has FMA (a softmax's time is mostly these
# polynomials: 3.7 -> 3.2 ms here), two roundings elsewhere; the budget holds both ways (tests/codegen/test_decomp_exp.py).
# The polynomials were fitted for this code (least squares weighted toward minimax relative error, Lawson's
# iteration) and checked against 50-digit decimal arithmetic.

_F32, _U32, _F64, _U64 = dtypes.float32, dtypes.uint32, dtypes.float64, dtypes.uint64
# 2**r = 1 + r * q(r) for |r| <= 1/2: q's coefficients, constant term first. Fitted for this code (Lawson's
# iteration toward the minimax relative error of 1 + r*q): 2.0e-9 relative, 0.03 of a float32 ulp, so the float32
# rounding of Horner's steps is nearly all of the error (1.19 ulp at most over a dense sweep of every binade, where
# numpy's own float32 exp2 is up to 2.84 ulp off; tests/codegen/test_decomp_exp.py)
_EXP2_Q = (0.6931472028551726, 0.24022647913615794, 0.055503324709260164, 0.00961843735846597, 0.0013398874487543608,
           0.00015353361859462734)
# log(1+f) = 2s + s * z * r(z), s = f / (2 + f), z = s*s <= 0.0295: r's coefficients (relative error 6.9e-16)
_LOG_R = (0.6666666666666197, 0.40000000011232817, 0.28571424131345247, 0.2222286292125845, 0.18140169926179692,
          0.1662212693486474)
_ROUND32 = 12582912.0                 # 1.5 * 2**23: x + this has round(x) in its low mantissa bits, for |x| < 2**22
_ROUND32_BITS = 0x4b400000
_ROUND = 6755399441055744.0           # 1.5 * 2**52: the same for float64, |x| < 2**51
_ROUND_BITS = 0x4338000000000000
_SQRT_HALF_BITS = 0x3fe6a09e667f3bcd  # sqrt(1/2) as a float64
_INV_LN2 = 1.4426950408889634         # 1 / log(2)


def _fma(a: UOp, b: UOp, c: float) -> UOp:
  """a * b + c, rounded once where the target fuses it (the CPU, with FMA), else twice: both are within budget."""
  return UOp(Ops.MULACC, a.dtype, (a, b, UOp.const(a.dtype, c)), MAY_FUSE)


def _poly(x: UOp, coeffs: tuple[float, ...], fuse: bool = False) -> UOp:
  """sum(c_i * x**i), by Horner's rule (each step one fma if fuse)."""
  acc = UOp.const(x.dtype, coeffs[-1])
  for c in reversed(coeffs[:-1]): acc = _fma(acc, x, c) if fuse else acc * x + c
  return acc


@rule_helper
def within_slack(idx: UOp, p: UOp, optional) -> bool:
  """Every element idx can reach lies in p's buffer or its slack, on a device that gives its buffers one (INDEX among
  `optional`, the decomp set's ctx)."""
  if optional is None or Ops.INDEX not in optional: return False
  slack = load_slack(p.arg[1], p.dtype.itemsize)
  return idx.vmin >= -slack and idx.vmax < p.arg[1] + slack


@rule_helper
def exp2_bits(x: UOp) -> UOp:
  """2**x for a float32 x, in float32 (sixteen lanes to an AVX-512 instruction, eight to AVX2: the float64 version
  this replaced held softmax's exp kernels at three times a copy's time): x = n + r with n = round(x), 2**r by a
  polynomial, times 2**n from exponent bits in two halves, so that results down in the subnormals round once."""
  # past these every float32 result is inf or 0; both ends keep the halves of n inside float32's normal exponents.
  # Below -151 the result is 0, selected at the end: computing it as 2**-75 * 2**-76 makes x86 cores take a
  # microcode assist on every underflowing multiply (a causal mask's -1e9 sent half of a softmax there: 16 ms
  # against 2.4 for the same kernel over ordinary values), so those lanes compute 2**0 instead
  zero = x.lt(-151.0)
  d = UOp.const(_F32, 129.0).lt(x).where(129.0, zero.where(0.0, x))
  t = d + _ROUND32
  r = d - (t - _ROUND32)                # exact: |r| <= 1/2
  p = _fma(r, _poly(r, _EXP2_Q, fuse=True), 1.0)   # six fmas where the target has them: a softmax is bound by these
  # n + 256 in [105, 385], unsigned (wrapping subtraction of the bits): halves n1 = floor(n/2), n2 = n - n1 taken
  # with a logical shift, each with float32's exponent bias 127 added
  nb = t.bitcast(_U32) - (_ROUND32_BITS - 256)
  half = nb >> 1
  res = p * ((half - 1) << 23).bitcast(_F32) * ((nb - half - 1) << 23).bitcast(_F32)
  return x.ne(x).where(x, zero.where(0.0, res))   # NaN stays the input's NaN


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
