"""Helpers for rules/symbolic.rules: the parts of simplification that are
arithmetic, not pattern shape."""
from __future__ import annotations

import math
import weakref

from engine.lang.capability import rule_helper

from engine.alu import exec_alu, wrap
from engine.dtypes import DType, dtypes
from engine.ops import Ops
from engine.uop import UOp


@rule_helper
def fold_constants(alu: UOp) -> UOp | None:
  """An ALU node whose sources are all CONSTs, evaluated (None when the op cannot be folded)."""
  if alu.op in (Ops.THREEFRY,) or alu.dtype.kind == "v": return None
  try: value = exec_alu(alu.op, alu.dtype, [s.arg for s in alu.src])
  except (ArithmeticError, TypeError): return None
  return UOp.const(alu.dtype, value)


@rule_helper
def bounds_const(x: UOp) -> UOp | None:
  """An integer expression whose bounds meet is that constant."""
  if x.op is Ops.CONST or not x.dtype.is_int: return None
  lo, hi = x.vmin, x.vmax
  return UOp.const(x.dtype, lo) if isinstance(lo, int) and lo == hi else None


def _terms(x: UOp) -> tuple[list[tuple[int, UOp]], int]:
  """x as sum(coef * node) + const, looking through ADD and multiplication by constants."""
  terms: list[tuple[int, UOp]] = []
  const = 0
  stack = [(1, x)]
  while stack:
    k, u = stack.pop()
    if u.op is Ops.ADD: stack += [(k, u.src[0]), (k, u.src[1])]
    elif u.op is Ops.CONST: const += k * u.arg
    elif u.op is Ops.MUL and u.src[1].op is Ops.CONST: stack.append((k * u.src[1].arg, u.src[0]))
    elif u.op is Ops.MUL and u.src[0].op is Ops.CONST: stack.append((k * u.src[0].arg, u.src[1]))
    else: terms.append((k, u))
  return terms, const


def _linear_bounds(x: UOp) -> tuple[int, int] | None:
  """Bounds of sum(coef * node) + const (x's terms) computed without wrap-around; None when a term is not an integer."""
  terms, k = _terms(x)
  lo = hi = k
  for coef, v in terms:
    a, b = coef * v.vmin, coef * v.vmax
    if not (isinstance(a, int) and isinstance(b, int)): return None
    lo, hi = lo + min(a, b), hi + max(a, b)
  return lo, hi


@rule_helper
def no_wrap(*xs: UOp) -> bool:
  """Each x (an integer expression) has its exact value: x is built from its terms with ADD and MUL, which
  wrap around (modulo 2**bits), so when the exact sum of its terms provably fits x's dtype, x holds that sum
  whatever intermediate results wrapped. Rules that rely on integer identities (x*c // c == x) check this."""
  for x in xs:
    if not x.dtype.is_int: return False
    b = _linear_bounds(x)
    if b is None or b[0] < x.dtype.min() or b[1] > x.dtype.max(): return False
  return True


@rule_helper
def divmod_parts(x: UOp, c: int, div: bool) -> UOp | None:
  """x // c or x % c without division, when x = c*Q + R with R provably in [0, c).

  Each coefficient (and the constant) splits as q*c + r; if the bounds of the
  remainder part R = sum(r_i * v_i) + r_k stay inside [0, c), then x // c is
  the quotient part and x % c is R. Only when x holds the exact sum of its
  terms (no_wrap): then the parts, built with wrapping ADD and MUL, are
  exact too (both lie in x's dtype's range: 0 <= R < c and Q = x // c)."""
  terms, k = _terms(x)
  if not terms: return None
  qk, rk = divmod(k, c)
  lo = hi = rk          # bounds of R
  xlo = xhi = k         # bounds of x's exact value (no_wrap, in the same pass)
  parts = []
  for coef, v in terms:
    vmin, vmax = v.vmin, v.vmax
    if not (isinstance(vmin, int) and isinstance(vmax, int)): return None
    q, r = divmod(coef, c)
    if r: lo, hi = lo + min(r * vmin, r * vmax), hi + max(r * vmin, r * vmax)
    xlo, xhi = xlo + min(coef * vmin, coef * vmax), xhi + max(coef * vmin, coef * vmax)
    parts.append((q, r, v))
  if xlo < x.dtype.min() or xhi > x.dtype.max(): return None
  rest = sum(((v if r == 1 else v * r) for q, r, v in parts if r), UOp.const(x.dtype, rk))
  quot = sum(((v if q == 1 else v * q) for q, r, v in parts if q), UOp.const(x.dtype, qk))
  if 0 <= lo and hi < c: return quot if div else rest
  # R not provably in [0, c): (c*Q + R) // c is still Q + R // c and (c*Q + R) % c is R % c (floor division,
  # exact sums). Taken only for sums of nonnegative terms with a multiple of c to drop (index arithmetic: the
  # window offsets of a convolution's gradient), where R is then smaller than x and nonnegative
  if k < 0 or any(coef < 0 or v.vmin < 0 for coef, v in terms) or not (qk or any(q for q, _, _ in parts)): return None
  return quot + rest // c if div else rest % c


# mantissa digits (with the implicit bit) of each float dtype: the integers of up to that many bits it holds exactly
_MANTISSA = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


@rule_helper
def lossless(src: DType, dst: DType) -> bool:
  """Every value of dtype src is a value of dtype dst too, so a CAST from src to dst and back (or on to a third
  dtype) gives what a direct cast gives. `index` is left out: codegen narrows it to int32 or int64."""
  if src is dst: return True
  if dtypes.index in (src, dst) or dst.kind == "v": return False
  if src.kind == "b": return True
  if src.kind in "iu" and dst.kind in "iu": return dst.min() <= src.min() and src.max() <= dst.max()
  if src.kind in "iu" and dst.kind == "f": return src.bits - (src.kind == "i") <= _MANTISSA[dst.name]
  if src.kind == "f" and dst.kind == "f":
    # bfloat16 and float16 hold different ranges and precisions: each widens to float32 and float64 only
    return _MANTISSA[src.name] < _MANTISSA[dst.name] and dst.itemsize > src.itemsize and dst.name != "bfloat16"
  return False


@rule_helper
def fold_cast(cast: UOp) -> UOp | None:
  """CAST of a CONST, as a CONST of the cast's dtype (integers wrap, floats round). Not where C leaves the
  conversion undefined (a float that is not finite, or whose integer part the integer dtype cannot hold), not
  to or from bfloat16 (no numpy type to round with), and not a float to index (engine/verify's model keeps the
  float's value there)."""
  c, dt = cast.src[0], cast.dtype
  if c.op is not Ops.CONST or dt.kind == "v" or "bfloat16" in (dt.name, c.dtype.name): return None
  if not isinstance(c.arg, (bool, int, float)) or (c.dtype.kind == "f" and dt is dtypes.index): return None
  v = wrap(c.arg, c.dtype)
  if c.dtype.kind == "f" and dt.kind in "iux" and not (math.isfinite(v) and dt.min() <= math.trunc(v) <= dt.max()):
    return None
  return UOp.const(dt, wrap(v, dt))


@rule_helper
def lt_gcd(x: UOp, c: int) -> UOp | None:
  """x < c as Q < c // d: d is the gcd of c and x's coefficients other than 1 and -1, and x = d*Q + R with R
  provably in [0, d) (divmod_parts), so x < c exactly when Q < c / d."""
  terms, _ = _terms(x)
  scaled = [k for k, _ in terms if abs(k) != 1]
  if not scaled or (d := math.gcd(c, *scaled)) <= 1: return None
  q = divmod_parts(x, d, True)
  return None if q is None else q.lt(c // d)


def _conjuncts(c: UOp) -> list[UOp]:
  out, stack = [], [c]
  while stack:
    u = stack.pop()
    if u.op is Ops.AND and u.dtype.is_bool: stack.extend(u.src)
    else: out.append(u)
  return out


_GIVEN: "weakref.WeakKeyDictionary[UOp, UOp | None]" = weakref.WeakKeyDictionary()


@rule_helper
def given_valid(w: UOp) -> UOp | None:
  """WHERE(cond, t, f) with t simplified where cond holds, or None when that changes nothing.

  Each conjunct `X < n` of cond (X an integer expression with a // or % in it, n a constant) bounds X by
  n - 1 inside t, tighter than X's own bounds. X is replaced by a variable with those bounds, the symbolic
  rules simplify t, and the variable becomes X again. A convolution's gradient is the case: its load index is
  full of `(w % 11) % 8` and `(... // 72)` that fold once `w % 11 < 8` is known, which the guard says.
  Remembered per node (the scheduler meets the same WHERE in several passes; UOps are hash-consed)."""
  if w in _GIVEN: return _GIVEN[w]
  cond, t, f = w.src
  stand: dict[UOp, UOp] = {}
  for c in _conjuncts(cond):
    if c.op is not Ops.CMPLT or c.src[1].op is not Ops.CONST: continue
    x = c.src[0]
    if not x.dtype.is_int or x.op in (Ops.RANGE, Ops.CONST, Ops.DEFINE_VAR) or x in stand: continue
    # (a guard on a plain sum of ranges, a padding's, tells divmod_parts nothing the ranges do not: only
    # guards on a quotient or a remainder are worth the second pass)
    if not any(n.op in (Ops.MOD, Ops.IDIV) for n in x.toposort()): continue
    lo, hi = x.vmin, x.vmax
    if not (isinstance(lo, int) and isinstance(hi, int)) or c.src[1].arg - 1 >= hi or c.src[1].arg - 1 < lo: continue
    stand[x] = UOp.variable(f"given_{len(stand)}_{id(x)}", lo, c.src[1].arg - 1, x.dtype)
  out = None
  if stand:
    from engine.lang.loader import load_library
    from engine.rewrite import graph_rewrite, substitute
    placed = substitute(t, stand)
    if placed is not t:
      # only the integer arithmetic under the stand-ins is simplified again (an index, a guard), not the
      # float computation around it: the maximal integer subexpressions, rewritten together
      ints = [placed] if placed.dtype.is_int else \
        list(dict.fromkeys(s for n in placed.toposort() if not n.dtype.is_int for s in n.src if s.dtype.is_int))
      ints = [u for u in ints if u.op not in (Ops.CONST, Ops.RANGE)]
      if ints:
        sink = UOp(Ops.SINK, dtypes.void, tuple(ints))
        done = graph_rewrite(sink, load_library().matcher("symbolic"))
        if done is not sink:
          back = {v: x for x, v in stand.items()}
          new = substitute(substitute(placed, dict(zip(ints, done.src))), back)
          if new is not t: out = UOp(Ops.WHERE, w.dtype, (cond, new, f))
  _GIVEN[w] = out
  return out
