"""Rewrite throughput: rulec's compiled `symbolic` matcher vs tinygrad 0.14's PatternMatcher.

Both engines get the same work: thousands of random index expressions
(rulec.engine.ir.index_expr recipes) under one SINK, rewritten once to a fixed point
with the rules of rules/symbolic.rules. The rules are ported below as tinygrad
UPats, in the same order and with the same first-match semantics, and the
results of both engines are compared expression by expression before anything
is timed, so the timing compares equal work.

Each timed repetition rewrites a freshly built graph: both IRs hash-cons, so
a graph still alive from an earlier run would come back with its bounds and
match caches filled in. The cyclic GC is off inside the timed region (it would
otherwise fire at different points in the two engines' runs).

Run from the repository root:  python bench/matcher.py
The last line printed is `matcher_speedup_vs_tinygrad=<geomean of tinygrad_ms / rulec_ms>`.
"""
from __future__ import annotations

import gc
import importlib.metadata
import math
import operator
import os
import platform
import random
import statistics
import struct
import sys
import time
from pathlib import Path

# `python bench/matcher.py` puts bench/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rulec.engine.ir.index_expr import build, evaluate, leaf_values, leaves_of, random_recipe  # noqa: E402
from rulec.engine.lang.loader import load_library  # noqa: E402
from rulec.engine.ir.ops import Ops as ROps  # noqa: E402
from rulec.engine.ir.rewrite import graph_rewrite as rulec_graph_rewrite  # noqa: E402
from rulec.engine.ir.uop import UOp as RUOp  # noqa: E402
from rulec.engine.ir.uop import _ucache as RULEC_UCACHE  # noqa: E402

from tinygrad.dtype import dtypes as tdtypes  # noqa: E402
from tinygrad.uop.ops import GroupOp, PatternMatcher, UOp, UOpMetaClass, UPat  # noqa: E402
from tinygrad.uop.ops import Ops as TOps  # noqa: E402
from tinygrad.uop.ops import graph_rewrite as tinygrad_graph_rewrite  # noqa: E402

SEED = 1234
SIZES = (1000, 5000)
REPEATS = 7

# *** rules/symbolic.rules as tinygrad UPats ***
#
# Matching notes, so the port stays faithful:
# - UPat(op, src=[a, b]) tries (a, b) then (b, a), and a function returning
#   None declines so the next permutation, then the next pattern, is tried:
#   rulec's generated matchers try alternatives in the same order.
# - A repeated name (x ... x) is an identity check in both.
# - rulec declines a replacement that is the node itself and tries the next
#   alternative of the same rule; tinygrad skips to the next pattern. The only
#   rules that can rebuild the node itself are add/mul_const_right, and only
#   in their last permutation, so the two behave the same.
# - Helpers (fold, bounds_const) follow engine/sched/symbolic.py:
#   floor // and %, x // 0 == x % 0 == 0, and index results wrapped to int64
#   (rulec's `index` is 8 bytes; tinygrad's weakint would not wrap).
# - The no-wrap guards (no_wrap, div_div's c1*c2) use int64's range for weakint.
#   rulec's vmin/vmax also widen to int64's whole range where an index op may
#   wrap; tinygrad's do not, a difference only bounds beyond 2**63 could show.

INTS = tuple(tdtypes.ints) + (tdtypes.weakint,)   # rulec's {ints} class: every int dtype and index


_I64 = (-(1 << 63), (1 << 63) - 1)


def _wrap_i64(v: int) -> int: return ((v + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)
def _floordiv(a, b): return a // b if b != 0 else 0
def _floormod(a, b): return a % b if b != 0 else 0


# rulec folds every ALU op of every dtype; index arithmetic only ever gives these ops on index and bool
# values, so the port folds those and declines the rest (a difference no expression here can reach)
_FOLD = {TOps.ADD: operator.add, TOps.SUB: operator.sub, TOps.MUL: operator.mul, TOps.FLOORDIV: _floordiv,
         TOps.FLOORMOD: _floormod, TOps.MAX: max, TOps.NEG: operator.neg, TOps.CMPLT: operator.lt,
         TOps.CMPNE: operator.ne, TOps.CMPEQ: operator.eq, TOps.AND: operator.and_, TOps.OR: operator.or_,
         TOps.XOR: operator.xor, TOps.WHERE: lambda c, a, b: a if c else b}


def tg_fold_constants(a: UOp) -> UOp | None:
  fn = _FOLD.get(a.op)
  if fn is None or a.dtype not in (tdtypes.weakint, tdtypes.bool): return None
  v = fn(*[s.arg for s in a.src])
  return UOp.const(_wrap_i64(v) if a.dtype is tdtypes.weakint else bool(v), a.dtype)


def tg_bounds_const(x: UOp) -> UOp | None:
  if x.op is TOps.CONST: return None
  lo, hi = x.vmin, x.vmax
  return UOp.const(lo, x.dtype) if isinstance(lo, int) and lo == hi else None


def _tg_terms(x: UOp):
  terms, const, stack = [], 0, [(1, x)]
  while stack:
    k, u = stack.pop()
    if u.op is TOps.ADD: stack += [(k, u.src[0]), (k, u.src[1])]
    elif u.op is TOps.CONST: const += k * u.arg
    elif u.op is TOps.MUL and u.src[1].op is TOps.CONST: stack.append((k * u.src[1].arg, u.src[0]))
    elif u.op is TOps.MUL and u.src[0].op is TOps.CONST: stack.append((k * u.src[0].arg, u.src[1]))
    else: terms.append((k, u))
  return terms, const


def tg_no_wrap(*xs: UOp) -> bool:
  """rulec.engine.sched.symbolic.no_wrap: the exact sum of x's terms fits x's dtype (int64 for index)."""
  for x in xs:
    if x.dtype not in INTS: return False
    terms, lo = _tg_terms(x)
    hi = lo
    for coef, v in terms:
      a, b = coef * v.vmin, coef * v.vmax
      if not (isinstance(a, int) and isinstance(b, int)): return False
      lo, hi = lo + min(a, b), hi + max(a, b)
    if not _I64[0] <= lo <= hi <= _I64[1] if x.dtype is tdtypes.weakint else not x.dtype.min <= lo <= hi <= x.dtype.max:
      return False
  return True


def tg_divmod_parts(x: UOp, c: int, div: bool):
  """rulec.engine.sched.symbolic.divmod_parts, step for step, on tinygrad UOps (same term order)."""
  terms, const = _tg_terms(x)
  if not terms: return None
  qk, rk = divmod(const, c)
  lo = hi = rk
  xlo = xhi = const
  parts = []
  for coef, v in terms:
    vmin, vmax = v.vmin, v.vmax
    if not (isinstance(vmin, int) and isinstance(vmax, int)): return None
    q, r = divmod(coef, c)
    if r: lo, hi = lo + min(r * vmin, r * vmax), hi + max(r * vmin, r * vmax)
    xlo, xhi = xlo + min(coef * vmin, coef * vmax), xhi + max(coef * vmin, coef * vmax)
    parts.append((q, r, v))
  lim = _I64 if x.dtype is tdtypes.weakint else (x.dtype.min, x.dtype.max)
  if xlo < lim[0] or xhi > lim[1]: return None
  rest = _tg_sum_of([(r, v) for q, r, v in parts if r], x.const_like(rk))
  quot = _tg_sum_of([(q, v) for q, r, v in parts if q], x.const_like(qk))
  if 0 <= lo and hi < c: return quot if div else rest
  if (split := _tg_factor_parts(terms, const, c, div, x.dtype)) is not None: return split
  if const < 0 or any(coef < 0 or v.vmin < 0 for coef, v in terms) or not (qk or any(q for q, _, _ in parts)): return None
  return quot + rest // c if div else rest % c


def _tg_sum_of(terms, start: UOp) -> UOp: return sum(((v if coef == 1 else v * coef) for coef, v in terms), start)


def _tg_factor_parts(terms, k: int, c: int, div: bool, dtype) -> UOp | None:
  """rulec.engine.sched.symbolic._factor_parts: x = g*Q + R with g | c and R in [0, g) (index arithmetic only)."""
  if dtype is not tdtypes.weakint: return None
  for g in sorted({abs(coef) for coef, _ in terms if 1 < abs(coef) < c and c % abs(coef) == 0}, reverse=True):
    m, (kq, kr) = c // g, divmod(k, g)
    big = [(coef // g, v) for coef, v in terms if coef % g == 0]
    small = [(coef, v) for coef, v in terms if coef % g]
    if not small: continue
    lo = kr + sum(min(coef * v.vmin, coef * v.vmax) for coef, v in small)
    hi = kr + sum(max(coef * v.vmin, coef * v.vmax) for coef, v in small)
    if not (0 <= lo and hi < g): continue
    q = _tg_sum_of(big, UOp.const(kq, dtype))
    return q // m if div else _tg_sum_of(small, (q % m) * g + kr)
  return None


def tg_recombined_divmod(s: UOp) -> UOp | None:
  """rulec.engine.sched.symbolic.recombined_divmod: (x // c) * (k*c) + (x % c) * k among a sum's terms is k * x."""
  terms, k = _tg_terms(s)
  if len(terms) < 2: return None
  divs = {(v.src[0], v.src[1].arg): i for i, (_, v) in enumerate(terms)
          if v.op is TOps.FLOORDIV and v.src[1].op is TOps.CONST and isinstance(v.src[1].arg, int) and v.src[1].arg > 0}
  if not divs: return None
  out, used = list(terms), set()
  for j, (coef, v) in enumerate(terms):
    if v.op is not TOps.FLOORMOD or v.src[1].op is not TOps.CONST or (i := divs.get((v.src[0], v.src[1].arg))) is None:
      continue
    if i in used or terms[i][0] != coef * v.src[1].arg or v.src[0].dtype != s.dtype: continue
    used |= {i, j}
    out[i], out[j] = (coef, v.src[0]), None
  if not used: return None
  total = UOp.const(k, s.dtype)
  for t in out:
    if t is not None: total = total + (t[1] if t[0] == 1 else t[1] * t[0])
  return total


def tg_exact_bounds(u: UOp) -> tuple[int, int] | None:
  """rulec.engine.sched.symbolic.exact_bounds: an ADD/SUB/MUL-by-constant expression's bounds when no step wraps."""
  if u.dtype not in INTS: return None
  if u.op is TOps.CONST: return (u.arg, u.arg) if isinstance(u.arg, int) else None
  if u.op in (TOps.ADD, TOps.SUB) or (u.op is TOps.MUL and TOps.CONST in (u.src[0].op, u.src[1].op)):
    a, b = tg_exact_bounds(u.src[0]), tg_exact_bounds(u.src[1])
    if a is None or b is None: return None
    if u.op is TOps.ADD: lo, hi = a[0] + b[0], a[1] + b[1]
    elif u.op is TOps.SUB: lo, hi = a[0] - b[1], a[1] - b[0]
    else: lo, hi = min(p := (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])), max(p)
  else:
    lo, hi = u.vmin, u.vmax
    if not (isinstance(lo, int) and isinstance(hi, int)): return None
  lim = _tg_limits(u.dtype)
  return (lo, hi) if lim[0] <= lo and hi <= lim[1] else None


def tg_invariant_to_right(s: UOp, c: UOp) -> UOp | None:
  """rulec.engine.sched.symbolic.invariant_to_right: (x + y) < c, x over ranges and y over Variables only, as
  x < c - y when neither side wraps."""
  x, y = s.src
  def ranged(u: UOp) -> bool: return any(n.op is TOps.RANGE for n in u.toposort())
  def variable(u: UOp) -> bool: return not ranged(u) and any(n.op is TOps.DEFINE_VAR for n in u.toposort())
  if variable(x) and ranged(y): x, y = y, x
  if not (ranged(x) and variable(y)): return None
  if y.op is TOps.SUB and y.src[0].op is TOps.CONST:
    k = c.arg - y.src[0].arg
    right = y.src[1] if k == 0 else y.src[1] + k
  else: right = c - y
  return x < right if tg_exact_bounds(s) is not None and tg_exact_bounds(right) is not None else None


# helpers of the rules added for symbolic parity (engine/sched/symbolic.py: lossless, fold_cast, lt_gcd)
SINTS = tuple(tdtypes.sints) + (tdtypes.weakint,)   # rulec's {sints}
_T_MANTISSA = {tdtypes.float16: 11, tdtypes.bfloat16: 8, tdtypes.float32: 24, tdtypes.float64: 53}


def _tg_limits(dt) -> tuple[int, int]: return _I64 if dt is tdtypes.weakint else (dt.min, dt.max)
def _tg_bits(dt) -> int: return 64 if dt is tdtypes.weakint else dt.itemsize * 8
def _tg_fits(dt, v) -> bool: return _tg_limits(dt)[0] <= v <= _tg_limits(dt)[1]


def tg_lossless(src, dst) -> bool:
  """rulec.engine.sched.symbolic.lossless on tinygrad dtypes: every value of src is one of dst."""
  if src == dst: return True
  if tdtypes.weakint in (src, dst) or dst == tdtypes.void: return False
  if src == tdtypes.bool: return True
  if src in tdtypes.ints and dst in tdtypes.ints: return dst.min <= src.min and src.max <= dst.max
  if src in tdtypes.ints and dst in _T_MANTISSA: return src.itemsize * 8 - (src in tdtypes.sints) <= _T_MANTISSA[dst]
  if src in _T_MANTISSA and dst in _T_MANTISSA:
    return _T_MANTISSA[src] < _T_MANTISSA[dst] and dst.itemsize > src.itemsize and dst != tdtypes.bfloat16
  return False


def _tg_wrap(v, dt):
  if dt == tdtypes.bool: return bool(v)
  if dt in INTS:
    lo, hi = _tg_limits(dt)
    return ((int(v) - lo) % (hi - lo + 1)) + lo
  if dt in (tdtypes.float16, tdtypes.float32): return float(struct.unpack("e" if dt == tdtypes.float16 else "f",
                                                                           struct.pack("e" if dt == tdtypes.float16 else "f", v))[0])
  return float(v)


def tg_fold_cast(root: UOp, c: UOp) -> UOp | None:
  """rulec.engine.sched.symbolic.fold_cast: a CAST of a CONST, where the conversion is defined."""
  dt = root.dtype
  if tdtypes.bfloat16 in (dt, c.dtype) or dt == tdtypes.void or not isinstance(c.arg, (bool, int, float)): return None
  if c.dtype in _T_MANTISSA and dt == tdtypes.weakint: return None
  v = c.arg
  if c.dtype in _T_MANTISSA and dt in INTS and not (math.isfinite(v) and _tg_fits(dt, math.trunc(v))): return None
  try: return UOp.const(_tg_wrap(v, dt), dt)
  except OverflowError: return UOp.const(math.copysign(math.inf, v), dt)


def tg_lt_gcd(x: UOp, c: int) -> UOp | None:
  """rulec.engine.sched.symbolic.lt_gcd: x < c as Q < c // d, x = d*Q + R with R in [0, d)."""
  terms, _ = _tg_terms(x)
  scaled = [k for k, _ in terms if abs(k) != 1]
  if not scaled or (d := math.gcd(c, *scaled)) <= 1: return None
  q = tg_divmod_parts(x, d, True)
  return None if q is None else q < c // d


def _shr_mask_ok(x, m, k) -> bool:
  bits = _tg_bits(x.dtype)
  return 0 <= k.arg < bits and (m.arg | ((1 << k.arg) - 1)) % (1 << bits) == (1 << bits) - 1


def _div_mask_ok(x, m, c) -> bool:
  bits = _tg_bits(x.dtype)
  return c.arg > 0 and c.arg & (c.arg - 1) == 0 and (m.arg | (c.arg - 1)) % (1 << bits) == (1 << bits) - 1


def _tg_reads_memory(u: UOp) -> bool: return any(v.op in (TOps.LOAD, TOps.INDEX) for v in u.toposort())
def _tg_true(): return UOp.const(True, tdtypes.bool)
def _tg_false(): return UOp.const(False, tdtypes.bool)


def _add(a, b): return UPat(TOps.ADD, src=[a, b])
def _mul(a, b): return UPat(TOps.MUL, src=[a, b])
def _idiv(a, b): return UPat(TOps.FLOORDIV, src=(a, b))
def _mod(a, b): return UPat(TOps.FLOORMOD, src=(a, b))
def _and(a, b): return UPat(TOps.AND, src=[a, b])
def _or(a, b): return UPat(TOps.OR, src=[a, b])
def _xor(a, b): return UPat(TOps.XOR, src=[a, b])
def _ne(a, b): return UPat(TOps.CMPNE, src=[a, b])
def _eq(a, b): return UPat(TOps.CMPEQ, src=[a, b])
def _lt(a, b): return UPat(TOps.CMPLT, src=(a, b))
def _where(c, t, f): return UPat(TOps.WHERE, src=(c, t, f))
def _cast(x, dtype=None, name=None): return UPat(TOps.CAST, dtype, src=(x,), name=name)


_x, _y, _xi = UPat.var("x"), UPat.var("y"), UPat.var("x", INTS)
_c, _c1, _c2 = UPat.cvar("c"), UPat.cvar("c1"), UPat.cvar("c2")
_zero, _one = UPat.const(0), UPat.const(1)
_b, _bool_c = UPat.var("x", tdtypes.bool), UPat.cvar("c", tdtypes.bool)
_true, _false, _neg_one = UPat.const(True, tdtypes.bool), UPat.const(False, tdtypes.bool), UPat.const(-1)
_yi, _c0 = UPat.var("y", INTS), UPat.cvar("c0")

tinygrad_symbolic = PatternMatcher([
  # symbolic_fold
  (UPat(GroupOp.ALU, name="a", src=UPat(TOps.CONST)), tg_fold_constants),                          # fold_alu
  (_cast(_c, name="root"), tg_fold_cast),                                                           # fold_cast
  # identities
  (_add(_x, _zero), lambda x: x),                                                                    # add_zero
  (UPat(TOps.SUB, src=(_x, _zero)), lambda x: x),                                                    # sub_zero
  (_mul(_x, _one), lambda x: x),                                                                     # mul_one
  (_mul(_xi, _zero), lambda x: x.const_like(0)),                                                     # mul_zero
  (_idiv(_x, _one), lambda x: x),                                                                    # div_one
  (_mod(_xi, _one), lambda x: x.const_like(0)),                                                      # mod_one
  (UPat(TOps.SUB, src=(_xi, _x)), lambda x: x.const_like(0)),                                        # sub_self
  (UPat(TOps.NEG, src=(UPat(TOps.NEG, src=(_x,)),)), lambda x: x),                                   # neg_neg
  (UPat(TOps.WHERE, src=(UPat(), _x, _x)), lambda x: x),                                             # where_same
  (UPat(TOps.WHERE, src=(_c, _x, _y)), lambda c, x, y: x if c.arg else y),                           # where_true
  (UPat(TOps.MAX, src=[_x, _x]), lambda x: x),                                                       # max_self
  # constants gather on the right and fold together
  (_add(_c, _x), lambda c, x: x + c if x.op is not TOps.CONST else None),                            # add_const_right
  (_mul(_c, _x), lambda c, x: x * c if x.op is not TOps.CONST else None),                            # mul_const_right
  (_add(_add(_x, _c1), _c2), lambda x, c1, c2: x + (c1.arg + c2.arg)),                               # add_consts
  (_mul(_mul(_x, _c1), _c2), lambda x, c1, c2: x * (c1.arg * c2.arg)),                               # mul_consts
  (_add(_add(_x, _c), _y), lambda x, c, y: (x + y) + c if y.op is not TOps.CONST else None),         # add_const_out
  (_mul(_add(_x, _c1), _c2), lambda x, c1, c2: x * c2 + c1.arg * c2.arg),                            # mul_distribute_const
  # collect like terms
  (_add(_xi, _x), lambda x: x * 2),                                                                  # add_self
  (_add(_x, _mul(_x, _c)), lambda x, c: x * (c.arg + 1)),                                            # add_scaled_self
  (_add(_mul(_x, _c1), _mul(_x, _c2)), lambda x, c1, c2: x * (c1.arg + c2.arg)),                     # add_scaled_pair
  # division and modulo by positive constants
  (_idiv(_mul(_x, _c1).named("m"), _c2),                                                             # mul_div
   lambda m, x, c1, c2: x * (c1.arg // c2.arg) if c2.arg > 0 and c1.arg % c2.arg == 0 and tg_no_wrap(m) else None),
  (_mod(_mul(_x, _c1).named("m"), _c2),                                                              # mul_mod
   lambda m, x, c1, c2: x.const_like(0) if c2.arg > 0 and c1.arg % c2.arg == 0 and tg_no_wrap(m) else None),
  (_idiv(_idiv(_x, _c1), _c2),                                                                       # div_div
   lambda x, c1, c2: x // (c1.arg * c2.arg) if c1.arg > 0 and c2.arg > 0 and c1.arg * c2.arg <= _I64[1] else None),
  (_mod(_mod(_x, _c1), _c2),                                                                         # mod_mod
   lambda x, c1, c2: x % c2 if c2.arg > 0 and c1.arg != 0 and c1.arg % c2.arg == 0 else None),
  (_mod(_add(_x, _mul(UPat(), _c1)).named("s"), _c2),                                                # add_multiple_mod
   lambda s, x, c1, c2: x % c2 if c2.arg > 0 and c1.arg % c2.arg == 0 and tg_no_wrap(s, x) else None),
  (_idiv(_add(_x, _mul(_y, _c1)).named("s"), _c2),                                                   # add_multiple_div
   lambda s, x, y, c1, c2: x // c2 + y * (c1.arg // c2.arg) if c2.arg > 0 and c1.arg % c2.arg == 0 and tg_no_wrap(s, x)
   else None),
  (_mod(_add(_x, _c1).named("s"), _c2),                                                              # add_const_mod
   lambda s, x, c1, c2: (x + c1.arg % c2.arg) % c2 if c2.arg > 0 and not 0 <= c1.arg < c2.arg
   and tg_no_wrap(s, x + c1.arg % c2.arg) else None),
  (_add(_mul(_idiv(_x, _c), _c), _mod(_x, _c)), lambda x, c: x if c.arg != 0 else None),            # divmod_recombine
  (UPat(TOps.ADD, dtype=INTS, name="s"), tg_recombined_divmod),                                      # divmod_recombine_sum
  (_idiv(_xi, _c), lambda x, c: tg_divmod_parts(x, c.arg, True) if c.arg > 0 else None),             # fold_div_parts
  (_mod(_xi, _c), lambda x, c: tg_divmod_parts(x, c.arg, False) if c.arg > 0 else None),             # fold_mod_parts
  # value bounds decide
  (_idiv(_x, _c), lambda x, c: x.const_like(0) if c.arg > 0 and 0 <= x.vmin and x.vmax < c.arg else None),  # div_small
  (_mod(_x, _c), lambda x, c: x if c.arg > 0 and 0 <= x.vmin and x.vmax < c.arg else None),                 # mod_small
  (_mod(_xi, _c), lambda x, c: x + x.const_like(-(x.vmin // c.arg * c.arg))                         # mod_one_period
   if c.arg > 0 and x.vmin // c.arg == x.vmax // c.arg and x.vmin // c.arg != 0 else None),
  (UPat(TOps.CMPLT, src=(_x, _c)),                                                                   # lt_bounds
   lambda x, c: UOp.const(x.vmax < c.arg, tdtypes.bool) if x.vmax < c.arg or x.vmin >= c.arg else None),
  (UPat(TOps.MAX, src=[_x, _y]), lambda x, y: x if not tdtypes.is_float(x.dtype) and x.vmin >= y.vmax else None),  # max_bounds
  (UPat(GroupOp.All, dtype=tdtypes.weakint, name="x"), tg_bounds_const),                             # single_value
  # bitwise and boolean identities
  (_xor(_x, _zero), lambda x: x),                                                                    # xor_zero
  (_and(_x, _zero), lambda x: x.const_like(0)),                                                      # and_zero
  (_and(_xi, _neg_one), lambda x: x),                                                                # and_ones
  (_or(UPat.var("_x", INTS), UPat.cvar("c", arg=-1)), lambda _x, c: c),                              # or_ones
  (UPat((TOps.AND, TOps.OR), src=[_x, _x]), lambda x: x),                                            # and_or_self
  (_xor(_x, _x), lambda x: x.const_like(0)),                                                         # xor_self
  (_xor(_xor(_x, _y), _y), lambda x, y: x),                                                          # xor_xor
  (_and(_b, _c), lambda x, c: x if c.arg else c),                                                    # and_bool_const
  (_or(_b, _c), lambda x, c: c if c.arg else x),                                                     # or_bool_const
  (_and(_x, _or(_x, UPat())), lambda x: x),                                                          # and_absorb
  (_or(_x, _and(_x, UPat())), lambda x: x),                                                          # or_absorb
  (_and(_and(_x, _c1), _c2), lambda x, c1, c2: x & (c1.arg & c2.arg)),                               # and_consts
  (_or(_or(_x, _c1), _c2), lambda x, c1, c2: x | (c1.arg | c2.arg)),                                 # or_consts
  (_xor(_xor(_x, _c1), _c2), lambda x, c1, c2: x ^ (c1.arg ^ c2.arg)),                               # xor_consts
  (UPat(TOps.MAX, src=[UPat(TOps.MAX, src=[_xi, _c1]), _c2]), lambda x, c1, c2: x.maximum(max(c1.vmin, c2.vmin))),  # max_consts
  (_ne(_b, _false), lambda x: x),                                                                    # ne_false
  (_eq(_b, _true), lambda x: x),                                                                     # eq_true
  (_ne(_b, _true), lambda x: x ^ True),                                                              # ne_true
  (_eq(_b, _false), lambda x: x ^ True),                                                             # eq_false
  (_lt(_b, _true), lambda x: x ^ True),                                                              # lt_true
  (_lt(_false, _b), lambda x: x),                                                                    # false_lt
  (_or(_b, _xor(_b, _true)), lambda x: _tg_true()),                                                  # or_not_self
  (_and(_b, _xor(_b, _true)), lambda x: _tg_false()),                                                # and_not_self
  (_ne(_cast(_b, INTS), _c),                                                                         # cast_bool_ne
   lambda x, c: x if c.vmin == 0 else x ^ True if c.vmin == 1 else _tg_true()),
  (UPat(TOps.SHL, src=(_x, _zero)), lambda x: x),                                                    # shl_zero
  (UPat(TOps.SHR, src=(_x, _zero)), lambda x: x),                                                    # shr_zero
  (UPat(TOps.SHR, src=(_and(_xi, UPat.cvar("m")), UPat.cvar("k"))),                                  # shr_mask
   lambda x, m, k: x >> k if _shr_mask_ok(x, m, k) else None),
  (_idiv(_and(_xi, UPat.cvar("m")), _c), lambda x, m, c: x // c if _div_mask_ok(x, m, c) else None), # div_mask
  # an op on a node and itself
  (_idiv(_xi, _x), lambda x: x.const_like(1) if x.vmin > 0 or x.vmax < 0 else None),                # div_self
  (_mod(_xi, _x), lambda x: x.const_like(0)),                                                        # mod_self
  (_lt(_x, _x), lambda x: _tg_false()),                                                              # lt_self
  (_ne(UPat.var("x", INTS + (tdtypes.bool,)), _x), lambda x: _tg_false()),                           # ne_self
  (_eq(UPat.var("x", INTS + (tdtypes.bool,)), _x), lambda x: _tg_true()),                            # eq_self
  (_idiv(UPat.var("x", SINTS), _neg_one), lambda x: x * -1),                                         # div_neg_one
  (_mod(UPat.var("x", SINTS), _neg_one), lambda x: x.const_like(0)),                                 # mod_neg_one
  (_mod(_mod(UPat.var("_x", INTS), _y).named("m"), _y), lambda _x, m, y: m),                         # mod_mod_same
  (UPat(TOps.FDIV, src=(_x, _one)), lambda x: x),                                                    # fdiv_one
  (UPat(TOps.POW, src=(_x, _zero)), lambda x: x.const_like(1)),                                      # pow_zero
  (UPat(TOps.POW, src=(_x, _one)), lambda x: x),                                                     # pow_one
  (UPat(TOps.POW, src=(UPat.cvar("c", arg=1), UPat())), lambda c: c),                                # pow_base_one
  # casts
  (_cast(_x, name="c"), lambda c, x: x if c.dtype == x.dtype else None),                             # cast_same
  (_cast(_cast(_x, name="a"), name="c"),                                                             # cast_round_trip
   lambda c, a, x: x if c.dtype == x.dtype and tg_lossless(x.dtype, a.dtype) else None),
  (_cast(_cast(_x, name="a"), name="c"),                                                             # cast_lossless
   lambda c, a, x: x.cast(c.dtype) if c.dtype != tdtypes.weakint and tg_lossless(x.dtype, a.dtype) else None),
  (_cast(_cast(_xi, tuple(tdtypes.ints), name="a"), name="c"),                                       # cast_int_bounds
   lambda c, a, x: x.cast(c.dtype) if a.dtype.min <= x.vmin and x.vmax <= a.dtype.max else None),
  (_cast(_x, tdtypes.bool), lambda x: x.ne(0)),                                                      # cast_to_bool
  # where
  (_where(_xor(UPat.var("c", tdtypes.bool), _true), UPat.var("t"), UPat.var("f")), lambda c, t, f: c.where(f, t)),  # where_not
  (_where(_x, _true, _false), lambda x: x),                                                          # where_bool_id
  (_where(_x, _false, _true), lambda x: x ^ True),                                                   # where_bool_not
  (_where(UPat.var("a"), _where(UPat.var("b"), _x, _y), _y),                                         # where_nested_and
   lambda a, b, x, y: (a & b).where(x, y) if not _tg_reads_memory(b) else None),
  (_where(UPat.var("a"), _x, _where(UPat.var("b"), _x, _y)),                                         # where_nested_or
   lambda a, b, x, y: (a | b).where(x, y) if not _tg_reads_memory(b) else None),
  (_where(UPat.var("a"), _where(UPat.var("a"), _x, UPat()), _y), lambda a, x, y: a.where(x, y)),     # where_same_cond_t
  (_where(UPat.var("a"), _x, _where(UPat.var("a"), UPat(), _y)), lambda a, x, y: a.where(x, y)),     # where_same_cond_f
  (_where(_lt(_xi, _y), _y, _x), lambda x, y: x.maximum(y)),                                         # where_max
  (UPat(GroupOp.Binary - {TOps.THREEFRY}, name="a", src=(_where(_c, UPat.var("t"), UPat.var("f")),   # where_alu
                                                         _where(_c, UPat.var("tt"), UPat.var("ff")))),
   lambda a, c, t, f, tt, ff: c.where(t.alu(a.op, tt), f.alu(a.op, ff))
   if t.op is tt.op is TOps.CONST or f.op is ff.op is TOps.CONST else None),
  (_add(_add(_yi, _where(_c, UPat.var("t"), UPat.var("f"))), _where(_c, UPat.var("tt"), UPat.var("ff"))),  # where_add_assoc
   lambda y, c, t, f, tt, ff: y + c.where(t + tt, f + ff) if t.op is tt.op is TOps.CONST or f.op is ff.op is TOps.CONST else None),
  (_add(_where(_c, UPat.var("t", INTS), _zero), _where(_c, _zero, UPat.var("f"))), lambda c, t, f: c.where(t, f)),  # where_zero_branches
  # comparisons
  (_lt(_add(_xi, _c0).named("s"), _c1),                                                              # lt_add_const
   lambda s, x, c0, c1: x < (c1.arg - c0.arg) if tg_no_wrap(s, x) and _tg_fits(x.dtype, c1.arg - c0.arg) else None),
  (_lt(UPat(TOps.ADD, src=[UPat(dtype=INTS), _y], name="s"), _c),                                    # lt_add_invariant
   lambda s, y, c: tg_invariant_to_right(s, c) if y.op is not TOps.CONST else None),
  (_lt(_c0, _add(_xi, _c1).named("s")),                                                              # const_lt_add
   lambda s, x, c0, c1: x.const_like(c0.arg - c1.arg) < x if tg_no_wrap(s, x) and _tg_fits(x.dtype, c0.arg - c1.arg) else None),
  (_lt(_mul(_xi, _c0).named("m"), _c1),                                                              # lt_mul_pos
   lambda m, x, c0, c1: x < -(-c1.arg // c0.arg) if c0.arg > 0 and tg_no_wrap(m) else None),
  (_lt(_c1, _mul(_xi, _c0).named("m")),                                                              # const_lt_mul_pos
   lambda m, x, c0, c1: x.const_like(c1.arg // c0.arg) < x if c0.arg > 0 and tg_no_wrap(m) else None),
  (_lt(_idiv(_xi, UPat.cvar("d")), _c),                                                              # lt_div_pos
   lambda x, d, c: x < c.arg * d.arg if d.arg > 0 and _tg_fits(x.dtype, c.arg * d.arg) else None),
  (_lt(_idiv(UPat.var("x", SINTS), UPat.cvar("d")), _c),                                             # lt_div_neg
   lambda x, d, c: x.const_like(c.arg * d.arg) < x if d.arg < -1 and _tg_fits(x.dtype, c.arg * d.arg) else None),
  (_lt(_c, _idiv(_xi, UPat.cvar("d"))),                                                              # const_lt_div
   lambda x, d, c: x.const_like((c.arg + 1) * d.arg - 1) < x if d.arg > 0 and _tg_fits(x.dtype, (c.arg + 1) * d.arg - 1) else None),
  (_lt(_mul(_xi, _neg_one).named("m1"), _mul(_y, _neg_one).named("m2")),                             # lt_neg
   lambda m1, m2, x, y: y < x if tg_no_wrap(m1, m2) else None),
  (_lt(_xi, _c), lambda x, c: tg_lt_gcd(x, c.arg) if c.arg > 0 else None),                           # lt_gcd
  (UPat((TOps.CMPNE, TOps.CMPEQ), name="q", src=[_add(_xi, _c0), _c1]),                              # cmp_add_const
   lambda q, x, c0, c1: x.alu(q.op, x.const_like(c1.arg - c0.arg)) if _tg_fits(x.dtype, c1.arg - c0.arg) else None),
  (_ne(_xi, _c), lambda x, c: _tg_true() if c.vmin < x.vmin or c.vmin > x.vmax else None),           # ne_bounds
  (_eq(_xi, _c), lambda x, c: _tg_false() if c.vmin < x.vmin or c.vmin > x.vmax else None),          # eq_bounds
  (_lt(_xi, _y), lambda x, y: UOp.const(x.vmax < y.vmin, tdtypes.bool)                               # lt_bounds_var
   if y.op is not TOps.CONST and (x.vmax < y.vmin or x.vmin >= y.vmax) else None),
  # division and modulo of sums and of negatives
  (_idiv(_add(_xi, _c1).named("s"), _c2),                                                            # add_const_div
   lambda s, x, c1, c2: x // c2 + c1.arg // c2.arg if c2.arg > 0 and c1.arg % c2.arg == 0 and tg_no_wrap(s, x) else None),
  (_idiv(_add(_xi, _c1).named("s"), _c2),                                                            # add_const_div_split
   lambda s, x, c1, c2: (x + c1.arg % c2.arg) // c2 + c1.arg // c2.arg if c2.arg > 0 and not 0 <= c1.arg < c2.arg
   and tg_no_wrap(s, x + c1.arg % c2.arg) else None),
  (_idiv(_mul(_xi, _c1).named("m"), _c2),                                                            # mul_div_factor
   lambda m, x, c1, c2: x // (c2.arg // c1.arg) if c1.arg > 0 and c2.arg > 0 and c2.arg % c1.arg == 0 and tg_no_wrap(m)
   else None),
  (_mod(_mul(_xi, _c1).named("m"), _c2),                                                             # mul_mod_factor
   lambda m, x, c1, c2: (x % (c2.arg // c1.arg)) * c1 if c1.arg > 0 and c2.arg > 0 and c2.arg % c1.arg == 0 and tg_no_wrap(m)
   else None),
  (_idiv(UPat.var("x", SINTS), _c),                                                                  # div_neg_divisor
   lambda x, c: (x * -1) // -c.arg if _tg_limits(x.dtype)[0] < c.arg < -1 and x.vmin > _tg_limits(x.dtype)[0] else None),
  (_mod(UPat.var("x", SINTS), _c),                                                                   # mod_neg_divisor
   lambda x, c: ((x * -1) % -c.arg) * -1 if _tg_limits(x.dtype)[0] < c.arg < -1 and x.vmin > _tg_limits(x.dtype)[0] else None),
  # more terms
  (UPat(TOps.SUB, src=(_add(_xi, _y), _y)), lambda x, y: x),                                         # add_sub_cancel
  (_add(UPat(TOps.SUB, src=(_xi, _y)), _y), lambda x, y: x),                                         # sub_add_cancel
  (UPat(TOps.SUB, src=(UPat.var("x", SINTS), _c)),                                                   # sub_const
   lambda x, c: x + -c.arg if c.arg > _tg_limits(x.dtype)[0] else None),
  (UPat(TOps.NEG, src=(UPat.var("x", SINTS),)), lambda x: x * -1),                                   # neg_to_mul
  (_mul(_add(_xi, _y), _neg_one), lambda x, y: x * -1 + y * -1),                                     # mul_neg_distribute
  (_mul(_mul(_xi, _c), _y), lambda x, c, y: (x * y) * c if y.op is not TOps.CONST else None),        # mul_const_out
  (_add(_add(_yi, _mul(_x, _c0)), _mul(_x, _c1)), lambda y, x, c0, c1: y + x * (c0.arg + c1.arg)),   # add_scaled_pair3
  (_add(_add(_yi, _x), _x), lambda y, x: y + x * 2),                                                 # add_self3
  (_add(_add(_yi, _x), _mul(_x, _c)), lambda y, x, c: y + x * (c.arg + 1)),                          # add_scaled_self3
  (_add(_add(_yi, _mul(_x, _c)), _x), lambda y, x, c: y + x * (c.arg + 1)),                          # add_self_scaled3
])

# *** the same recipes in both IRs ***


def tinygrad_build(recipe: tuple) -> UOp:
  """rulec.engine.ir.index_expr.build, for tinygrad: weakint is tinygrad's index dtype."""
  kind = recipe[0]
  if kind == "var": return UOp.variable(recipe[1], recipe[2], recipe[3])
  if kind == "range": return UOp.range(recipe[2], recipe[1])
  if kind == "const": return UOp.const(recipe[1], tdtypes.weakint)
  a, b = tinygrad_build(recipe[1]), tinygrad_build(recipe[2])
  if kind == "ADD": return a + b
  if kind == "MUL": return a * b
  if kind == "IDIV": return a // b
  if kind == "MOD": return a % b
  raise ValueError(f"unknown recipe op {kind}")


def rulec_sink(recipes) -> RUOp: return RUOp.sink(*[build(r) for r in recipes])
def tinygrad_sink(recipes) -> UOp: return UOp.sink(*[tinygrad_build(r) for r in recipes])


# *** one canonical string per expression, so the two IRs can be compared ***

_TG_NAMES = {TOps.FLOORDIV: "IDIV", TOps.FLOORMOD: "MOD"}


def _canon(u, memo: dict, leaf, name) -> str:
  # iterative over the toposort: rewritten graphs share subtrees, and deep recursion is not needed
  for x in u.toposort():
    if x in memo: continue
    s = leaf(x)
    memo[x] = s if s is not None else f"{name(x.op)}({', '.join(memo[y] for y in x.src)})"
  return memo[u]


def _rulec_leaf(x: RUOp) -> str | None:
  if x.op is ROps.CONST: return repr(x.arg)
  if x.op is ROps.RANGE: return f"r{x.arg[0]}"
  if x.op is ROps.DEFINE_VAR: return str(x.arg[0])
  return None


def _tinygrad_leaf(x: UOp) -> str | None:
  if x.op is TOps.CONST: return repr(x.arg)
  if x.op is TOps.RANGE: return f"r{x.arg[0]}"
  if x.is_variable: return str(x.arg.name)
  return None


def rulec_canon(u: RUOp, memo: dict) -> str: return _canon(u, memo, _rulec_leaf, lambda op: op.name)
def tinygrad_canon(u: UOp, memo: dict) -> str: return _canon(u, memo, _tinygrad_leaf, lambda op: _TG_NAMES.get(op, op.name))


def _short(s: str, n: int = 160) -> str: return s if len(s) <= n else s[:n] + "..."


# *** keeping graphs fresh ***

def live_nodes() -> tuple[int, int]:
  """Live UOps in each engine's hash-cons cache."""
  return (sum(1 for w in RULEC_UCACHE.values() if w() is not None),
          sum(1 for w in UOpMetaClass.ucache.values() if w() is not None))


def collect_all():
  """Free every dead graph of both IRs.

  One gc.collect() is not enough for rulec: bounds queries memoise a toposort list
  in each node (a cycle through the node itself), and the hash-cons cache's keys
  hold each node's src tuple, so every full collection only frees the outermost
  layer of a dead graph. Survivors would come back, memoised, from the next build.
  """
  while True:
    before = live_nodes()
    gc.collect()
    if live_nodes() == before: return


def compact_caches():
  """Rebuild both hash-cons dicts with only their current entries.

  Freeing a graph deletes its entries, and a CPython dict keeps deleted slots
  until its next resize, so every lookup of the next build probes past them.
  Left alone, a repetition's time depends on what earlier ones left behind
  (it swung by 1.5x in both engines); compacted, every repetition starts
  from the same state, as in a fresh process."""
  for cache in (RULEC_UCACHE, UOpMetaClass.ucache):
    entries = dict(cache)
    cache.clear()
    cache.update(entries)


# *** correctness: same results in both engines, and rulec's results still mean the same ***

def _results(recipes, rulec_matcher) -> tuple[list[str], list[str], list[str]]:
  """Canonical strings of the inputs, rulec's results and tinygrad's results (the graphs die on return)."""
  r_in, t_in = rulec_sink(recipes), tinygrad_sink(recipes)
  r_out = rulec_graph_rewrite(r_in, rulec_matcher)
  t_out = tinygrad_graph_rewrite(t_in, tinygrad_symbolic)
  assert len(r_out.src) == len(t_out.src) == len(recipes)
  in_memo, r_memo, t_memo = {}, {}, {}
  return ([rulec_canon(u, in_memo) for u in r_in.src], [rulec_canon(u, r_memo) for u in r_out.src],
          [tinygrad_canon(u, t_memo) for u in t_out.src])


def compare(recipes, rulec_matcher) -> list[tuple[int, str, str, str]]:
  """(index, input, rulec result, tinygrad result) for every expression the engines disagree on."""
  inputs, rulec_out, tinygrad_out = _results(recipes, rulec_matcher)
  collect_all()
  return [(i, src, rs, ts) for i, (src, rs, ts) in enumerate(zip(inputs, rulec_out, tinygrad_out)) if rs != ts]


def make_workload(rng: random.Random, n: int, rulec_matcher) -> list:
  """n random recipes; both engines must rewrite every one of them to the same result.

  Any disagreement is a bug in the port or a semantic difference between the
  engines (their value ranges included), and stops the benchmark."""
  recipes = [random_recipe(rng) for _ in range(n)]
  diffs = compare(recipes, rulec_matcher)
  if diffs:
    print(f"MISMATCH: {len(diffs)} expressions differ between rulec and tinygrad", file=sys.stderr)
    for _, src, rs, ts in diffs[:5]:
      print(f"  input:    {_short(src)}\n  rulec:    {_short(rs)}\n  tinygrad: {_short(ts)}", file=sys.stderr)
    raise SystemExit(1)
  return recipes


def _evaluates_alike(recipes, rulec_matcher, rng: random.Random) -> tuple[int, int]:
  r_in = rulec_sink(recipes)
  r_out = rulec_graph_rewrite(r_in, rulec_matcher)
  for i in rng.sample(range(len(recipes)), min(50, len(recipes))):
    orig, simp = r_in.src[i], r_out.src[i]
    leaves = leaves_of(orig)
    for _ in range(5):
      env = {leaf: rng.choice(leaf_values(leaf)) for leaf in leaves}
      a, b = evaluate(orig, env), evaluate(simp, env)
      assert a == b, f"expr {i} changed value under rewriting: {a} != {b}\n  {rulec_canon(orig, {})}\n  {rulec_canon(simp, {})}"
  return len(r_in.toposort()), len(r_out.toposort())


def check(recipes, rulec_matcher, rng: random.Random) -> tuple[int, int]:
  """The final workload: same results in both engines (this is also the warm-up of both), and rulec's
  results evaluate like their inputs at random points. Returns rulec's (nodes in, nodes out)."""
  if diffs := compare(recipes, rulec_matcher):
    raise SystemExit(f"MISMATCH on the final workload: {len(diffs)} expressions, e.g. {diffs[0]}")
  counts = _evaluates_alike(recipes, rulec_matcher, rng)
  collect_all()
  return counts


# *** timing ***

def _time_rewrite(make_sink, rewrite, recipes) -> float:
  """Seconds for one graph_rewrite of a freshly built graph."""
  before = live_nodes()
  compact_caches()
  sink = make_sink(recipes)
  gc.collect()
  # the collector would otherwise fire at allocation-count thresholds inside one engine's run and not the other's
  gc.disable()
  try:
    t0 = time.perf_counter()
    out = rewrite(sink)
    dt = time.perf_counter() - t0
  finally:
    gc.enable()
  # both IRs hash-cons: the next build must not find any node of this one (with its memoised bounds and match caches)
  del sink, out
  collect_all()
  assert live_nodes() == before, "nodes of a timed graph outlived their repetition"
  return dt


def measure(recipes, rulec_matcher) -> tuple[list[float], list[float]]:
  r_times, t_times = [], []
  for _ in range(REPEATS):
    # interleaved, so drift (thermal, other load) hits both engines alike
    r_times.append(_time_rewrite(rulec_sink, lambda s: rulec_graph_rewrite(s, rulec_matcher), recipes))
    t_times.append(_time_rewrite(tinygrad_sink, lambda s: tinygrad_graph_rewrite(s, tinygrad_symbolic), recipes))
  return r_times, t_times


def machine() -> str:
  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
  except OSError: pass
  u = platform.uname()
  return (f"machine: {cpu or u.machine} ({u.system} {u.release}, {u.machine}), {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()} ({platform.python_implementation()}), "
          f"tinygrad {importlib.metadata.version('tinygrad')}")


def main():
  rulec_matcher = load_library().matcher("symbolic")
  rng = random.Random(SEED)
  rows = []
  for n in SIZES:
    recipes = make_workload(rng, n, rulec_matcher)
    nodes_in, nodes_out = check(recipes, rulec_matcher, random.Random(SEED + n))
    r_times, t_times = measure(recipes, rulec_matcher)
    rows.append((f"{n} index exprs", nodes_in, nodes_out, r_times, t_times))

  print(machine())
  print(f"rule set: rules/symbolic.rules `symbolic` ({len(rulec_matcher.rule_info)} rules), post-order graph_rewrite, "
        f"median of {REPEATS} fresh graphs, GC off while timed; every expression rewrites to the same result in both engines")
  print("nodes in/out: rulec's graph (tinygrad's has one more, the STACK under its variable)")
  head = f"{'workload':<18} {'nodes in':>9} {'nodes out':>9} {'rulec ms':>10} {'tinygrad ms':>12} {'ratio':>6} {'rulec nodes/s':>14}"
  print(head)
  print("-" * len(head))
  medians = []
  for name, nin, nout, r_times, t_times in rows:
    r, t = statistics.median(r_times), statistics.median(t_times)
    medians.append((r, t))
    print(f"{name:<18} {nin:>9} {nout:>9} {r * 1e3:>10.1f} {t * 1e3:>12.1f} {t / r:>6.2f} {nin / r:>14,.0f}")
  for name, _, _, r_times, t_times in rows:
    print(f"spread, {name}: rulec {min(r_times) * 1e3:.1f}-{max(r_times) * 1e3:.1f} ms, "
          f"tinygrad {min(t_times) * 1e3:.1f}-{max(t_times) * 1e3:.1f} ms")
  speedup = math.exp(statistics.fmean(math.log(t / r) for r, t in medians))
  print(f"matcher_speedup_vs_tinygrad={speedup:.2f}")


if __name__ == "__main__":
  main()
