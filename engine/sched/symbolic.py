"""Helpers of rules/symbolic.rules: the parts of simplification that are arithmetic, not pattern shape. The
facts of an index expression they share with the renderers (its terms, steps, bounds) are IR: engine/ir/facts.py."""
from __future__ import annotations

import math
import weakref

import numpy as np

from rulec.engine.lang.capability import rule_helper

from rulec.engine.ir.alu import DEVICE_DEFINED, exec_alu, wrap
from rulec.engine.ir.dtypes import DType, dtypes, int_limits
from rulec.engine.ir.facts import linear_bounds, terms_of
from rulec.engine.ir.ops import ALU, Ops
from rulec.engine.ir.rewrite import graph_rewrite, substitute
from rulec.engine.ir.uop import UOp, arg_key
from rulec.engine.lang.loader import load_library


@rule_helper
def fold_constants(alu: UOp) -> UOp | None:
  """An ALU node whose sources are all CONSTs, evaluated (None when the op cannot be folded). Not EXP2, LOG2, SIN or
  POW on floats (engine/ir/alu.py DEVICE_DEFINED): each device approximates those its own way, and a constant must
  get the value the device computes for the same op on a buffer, bit for bit."""
  if alu.op in (Ops.THREEFRY,) or alu.dtype.kind == "v": return None
  if alu.op in DEVICE_DEFINED and alu.dtype.kind == "f": return None
  try: value = exec_alu(alu.op, alu.dtype, [s.arg for s in alu.src])
  except (ArithmeticError, TypeError): return None
  return UOp.const(alu.dtype, value)


@rule_helper
def zero_identity(x: UOp, c: UOp, add: bool) -> UOp | None:
  """x for x + c (add) or x - c when c is a zero that leaves every x as it is: any integer 0; for floats -0.0 added,
  +0.0 subtracted (x + 0.0 turns -0.0 into +0.0, and so does x - (-0.0)). None otherwise."""
  if not isinstance(c.arg, (int, float)) or c.arg != 0 or x.dtype != c.dtype: return None
  if not c.dtype.is_float: return x
  return x if math.copysign(1.0, c.arg) == (-1.0 if add else 1.0) else None


def exact_bounds(u: UOp) -> tuple[int, int] | None:
  """Bounds of the value an integer expression of ADD, SUB and MUL by constants holds, when none of its steps can
  wrap around (each step's bounds fit its dtype); None when one might, or for a non-integer. Leaves (anything
  else) contribute their vmin/vmax, which hold whatever they compute."""
  if not u.dtype.is_int: return None
  if u.op is Ops.CONST: return (u.arg, u.arg) if isinstance(u.arg, int) else None
  if u.op in (Ops.ADD, Ops.SUB) or (u.op is Ops.MUL and Ops.CONST in (u.src[0].op, u.src[1].op)):
    a, b = exact_bounds(u.src[0]), exact_bounds(u.src[1])
    if a is None or b is None: return None
    if u.op is Ops.ADD: lo, hi = a[0] + b[0], a[1] + b[1]
    elif u.op is Ops.SUB: lo, hi = a[0] - b[1], a[1] - b[0]
    else: lo, hi = min(p := (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])), max(p)
  else:
    lo, hi = u.vmin, u.vmax
    if not (isinstance(lo, int) and isinstance(hi, int)): return None
  least, most = int_limits(u.dtype)
  return (lo, hi) if least <= lo and hi <= most else None


@rule_helper
def bounds_const(x: UOp) -> UOp | None:
  """An integer expression whose bounds meet is that constant."""
  if x.op is Ops.CONST or not x.dtype.is_int: return None
  lo, hi = x.vmin, x.vmax
  return UOp.const(x.dtype, lo) if isinstance(lo, int) and lo == hi else None


@rule_helper
def no_wrap(*xs: UOp) -> bool:
  """Each x (an integer expression) has its exact value: x is built from its terms with ADD and MUL, which
  wrap around (modulo 2**bits), so when the exact sum of its terms provably fits x's dtype, x holds that sum
  whatever intermediate results wrapped. Rules that rely on integer identities (x*c // c == x) check this."""
  for x in xs:
    if not x.dtype.is_int: return False
    b, (least, most) = linear_bounds(x), int_limits(x.dtype)
    if b is None or b[0] < least or b[1] > most: return False
  return True


@rule_helper
def divmod_parts(x: UOp, c: int, div: bool) -> UOp | None:
  """x // c or x % c without division, when x = c*Q + R with R provably in [0, c).

  Each coefficient (and the constant) splits as q*c + r; if the bounds of the
  remainder part R = sum(r_i * v_i) + r_k stay inside [0, c), then x // c is
  the quotient part and x % c is R. Only when x holds the exact sum of its
  terms (no_wrap): then the parts, built with wrapping ADD and MUL, are
  exact too (both lie in x's dtype's range: 0 <= R < c and Q = x // c)."""
  terms, k = terms_of(x)
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
  least, most = int_limits(x.dtype)
  if xlo < least or xhi > most: return None
  # (each part built only when it is the answer: most calls, a conv's indices, are refused below)
  def rest() -> UOp: return _sum_of([(r, v) for q, r, v in parts if r], UOp.const(x.dtype, rk))
  def quot() -> UOp: return _sum_of([(q, v) for q, r, v in parts if q], UOp.const(x.dtype, qk))
  if 0 <= lo and hi < c: return quot() if div else rest()
  if (split := _factor_parts(terms, k, c, div, x.dtype)) is not None: return split
  # R not provably in [0, c): (c*Q + R) // c is still Q + R // c and (c*Q + R) % c is R % c (floor division,
  # exact sums). Taken only for sums of nonnegative terms with a multiple of c to drop (index arithmetic: the
  # window offsets of a convolution's gradient), where R is then smaller than x and nonnegative
  if k < 0 or any(coef < 0 or v.vmin < 0 for coef, v in terms) or not (qk or any(q for q, _, _ in parts)): return None
  if not div: return rest() % c
  r = rest()   # (the remainder's sum first, as before: the same nodes in the same order)
  return quot() + r // c


def _factor_parts(terms: list, k: int, c: int, div: bool, dtype) -> UOp | None:
  """x // c or x % c for x = g*Q + R, g a coefficient of x that divides c (c = g*m) and R, the terms whose coefficients
  g does not divide, provably in [0, g): x // c is Q // m and x % c is (Q % m)*g + R. Grouped-query attention reads
  its key head at (h*16384 + p*64 + d) // 49152, which is h // 3 (p*64 + d < 16384); without this the division stayed
  in the sum's innermost loop. Called with x's exact value in its dtype (divmod_parts checked no_wrap's bounds)."""
  if dtype != dtypes.index: return None   # (index arithmetic only: no partial sum of Q's terms can wrap)
  for g in sorted({abs(coef) for coef, _ in terms if 1 < abs(coef) < c and c % abs(coef) == 0}, reverse=True):
    m, (kq, kr) = c // g, divmod(k, g)
    big = [(coef // g, v) for coef, v in terms if coef % g == 0]
    small = [(coef, v) for coef, v in terms if coef % g]
    if not small: continue   # (every coefficient a multiple of g: mul_div_factor's)
    lo = kr + sum(min(coef * v.vmin, coef * v.vmax) for coef, v in small)
    hi = kr + sum(max(coef * v.vmin, coef * v.vmax) for coef, v in small)
    if not (0 <= lo and hi < g): continue
    q = _sum_of(big, UOp.const(dtype, kq))
    return q // m if div else _sum_of(small, (q % m) * g + kr)
  return None


def _sum_of(terms: list[tuple[int, UOp]], start: UOp) -> UOp:
  """start + the sum of coef * v over terms (v alone where coef is 1)."""
  return sum(((v if coef == 1 else v * coef) for coef, v in terms), start)


@rule_helper
def recombined_divmod(s: UOp) -> UOp | None:
  """A sum holding (x // c) * (k * c) and (x % c) * k as terms, in any order and grouping: the sum with k * x in their
  place ((x // c) * c + x % c is x for floor division, c > 0); None if it holds no such pair. A value stored
  (B, T, H, D) and read as (B, T, H * D) is read at `(c // 64) * 64 + c % 64` among the row's other terms, which
  is c: the load's steps are then one range's, and a weight gradient's sum over (B, T) merges into one range."""
  terms, k = terms_of(s)
  if len(terms) < 2: return None
  divs = {(v.src[0], v.src[1].arg): i for i, (_, v) in enumerate(terms)
          if v.op is Ops.IDIV and v.src[1].op is Ops.CONST and isinstance(v.src[1].arg, int) and v.src[1].arg > 0}
  if not divs: return None
  out, used = list(terms), set()
  for j, (coef, v) in enumerate(terms):
    if v.op is not Ops.MOD or v.src[1].op is not Ops.CONST or (i := divs.get((v.src[0], v.src[1].arg))) is None: continue
    if i in used or terms[i][0] != coef * v.src[1].arg or v.src[0].dtype is not s.dtype: continue
    used |= {i, j}
    out[i], out[j] = (coef, v.src[0]), None
  if not used: return None
  total = UOp.const(s.dtype, k)
  for t in out:
    if t is not None: total = total + (t[1] if t[0] == 1 else t[1] * t[0])
  return total


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
  conversion undefined (a float that is not finite, or whose integer part the integer dtype cannot hold), and
  not a float to index (engine/verify's model keeps the
  float's value there)."""
  c, dt = cast.src[0], cast.dtype
  if c.op is not Ops.CONST or dt.kind == "v": return None
  if not isinstance(c.arg, (bool, int, float)) or (c.dtype.kind == "f" and dt is dtypes.index): return None
  v = wrap(c.arg, c.dtype)
  if c.dtype.kind == "f" and dt.kind in "iux" and not (math.isfinite(v) and dt.min() <= math.trunc(v) <= dt.max()):
    return None
  return UOp.const(dt, wrap(v, dt))


@rule_helper
def lt_gcd(x: UOp, c: int) -> UOp | None:
  """x < c as Q < c // d: d is the gcd of c and x's coefficients other than 1 and -1, and x = d*Q + R with R
  provably in [0, d) (divmod_parts), so x < c exactly when Q < c / d."""
  terms, _ = terms_of(x)
  scaled = [k for k, _ in terms if abs(k) != 1]
  if not scaled or (d := math.gcd(c, *scaled)) <= 1: return None
  q = divmod_parts(x, d, True)
  return None if q is None else q.lt(c // d)


@rule_helper
def invariant_to_right(s: UOp, c: UOp) -> UOp | None:
  """s < c with s = x + y, where one term depends on ranges and the other only on Variables: that term moved to
  the right, `x < c - y`, when neither side wraps. A reduce over a Variable's size is guarded by
  `r + (N - (p+1)) < N`; as `r < p + 1` the renderers bound the loop by it (codegen/llvmir.py)."""
  x, y = s.src
  def ranged(u: UOp) -> bool: return any(n.op is Ops.RANGE for n in u.toposort())
  def variable(u: UOp) -> bool: return not ranged(u) and any(n.op is Ops.DEFINE_VAR for n in u.toposort())
  if variable(x) and ranged(y): x, y = y, x
  if not (ranged(x) and variable(y)): return None
  if y.op is Ops.SUB and y.src[0].op is Ops.CONST:   # c - (c1 - e) is e + (c - c1)
    k = c.arg - y.src[0].arg
    right = y.src[1] if k == 0 else y.src[1] + k
  else: right = c - y
  # every step exact: s = x + y as computed, and the new right side (its SUB or ADD could wrap where s did not:
  # `rulec prove` found r0 + 16*b*c < 16 turned into r0 < 16 - 16*b*c, which wraps near 2**63)
  return x.lt(right) if exact_bounds(s) is not None and exact_bounds(right) is not None else None


def _conjuncts(c: UOp) -> list[UOp]:
  out, stack = [], [c]
  while stack:
    u = stack.pop()
    if u.op is Ops.AND and u.dtype.is_bool: stack.extend(u.src)
    else: out.append(u)
  return out


# the ops a WHERE's branch is rewritten through: values computed in this kernel. Anything else (a STAGE, a
# buffer, an AFTER) is shared with other parts of the graph and is left exactly as it is, or it would be
# duplicated (two STAGEs for one value: two kernels)
def _is_value(n: UOp) -> bool: return n.op in ALU or n.op in (Ops.CAST, Ops.INDEX, Ops.REDUCE)


def _values_of(t: UOp) -> list[UOp]: return t.toposort(_is_value)


def _replace_in_values(t: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """t with the nodes of `mapping` replaced, rebuilt only through value ops (see _is_value)."""
  done: dict[UOp, UOp] = {}
  for u in _values_of(t):
    if u in mapping: done[u] = mapping[u]; continue
    if not _is_value(u) or u.op is Ops.RANGE: done[u] = u; continue
    src = tuple(done.get(x, x) for x in u.src)
    done[u] = u if all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg, u.tag)
  return done[t]


_GIVEN: "weakref.WeakKeyDictionary[UOp, UOp | None]" = weakref.WeakKeyDictionary()


@rule_helper
def given_valid(w: UOp) -> UOp | None:
  """WHERE(cond, t, f) with t simplified where cond holds and f where it does not, or None when that changes nothing.

  Each conjunct `X < n` of cond (n a constant) bounds X by n - 1 inside t, and a negated one, `(X < n) != True`,
  by n from below; a cond that is one such comparison bounds X the other way inside f. X is replaced by a variable
  with those bounds, the symbolic rules simplify the branch, and the variable becomes X again. A convolution's
  gradient is the case: its load index is full of `(w % 11) % 8` and `(... // 72)` that fold once `w % 11 < 8` is
  known, which the guard says. So is a concatenation (GPT-2's q, k and v gradients into one (B, T, 3C) buffer):
  `r < 1536` picks the part, and the part's load index, `((r // 64) % 12) * 64 + r % 64` and more, is affine
  where the guard leaves r. Only an X with a // or % in it, or one a // or % of the branch reads: bounds on a plain
  sum of ranges tell divmod_parts nothing the ranges do not. Remembered per node (the scheduler meets the same
  WHERE in several passes; UOps are hash-consed)."""
  if w in _GIVEN: return _GIVEN[w]
  cond, t, f = w.src
  conjuncts = _conjuncts(cond)
  new_t = _simplified_given(t, [_guard_bound(c, True) for c in conjuncts])
  new_f = _simplified_given(f, [_guard_bound(cond, False)]) if len(conjuncts) == 1 else f
  out = UOp(Ops.WHERE, w.dtype, (cond, new_t, new_f)) if new_t is not t or new_f is not f else None
  _GIVEN[w] = out
  # (the answer is its own fixed point: its branches were rewritten to one under the same bounds. Asked again when
  # the rewrite comes back to it, it changed nothing in 135 of 135 asks on a ResNet-50 training step: 37 ms)
  if out is not None and out not in _GIVEN: _GIVEN[out] = None
  return out


def _guard_bound(c: UOp, holds: bool) -> tuple[UOp, int, int] | None:
  """(X, lo, hi): the bounds on an integer X where the comparison `X < n` (or its negation, `(X < n) != True` or
  `^ True`) holds (holds=True) or fails, tighter than X's own; None for any other condition."""
  if c.op in (Ops.CMPNE, Ops.XOR) and c.src[1].op is Ops.CONST and c.src[1].arg is True: c, holds = c.src[0], not holds
  if c.op is not Ops.CMPLT or c.src[1].op is not Ops.CONST: return None
  x, n = c.src[0], c.src[1].arg
  if not x.dtype.is_int or x.op in (Ops.CONST, Ops.DEFINE_VAR): return None
  lo, hi = x.vmin, x.vmax
  if not (isinstance(lo, int) and isinstance(hi, int) and isinstance(n, int)): return None
  lo, hi = (lo, min(hi, n - 1)) if holds else (max(lo, n), hi)
  if lo > hi or (lo, hi) == (x.vmin, x.vmax): return None
  return x, lo, hi


def _simplified_given(t: UOp, bounds: list) -> UOp:
  """t with each bounded X standing in as a variable of its bounds while the symbolic rules simplify the maximal
  integer subexpressions (an index, a guard) of its values that hold one; t itself where nothing changes."""
  merged: dict[UOp, tuple[int, int]] = {}
  for b in bounds:   # (r >= 768 and r < 1536: both bound r)
    if b is None: continue
    x, lo, hi = b
    merged[x] = (max(lo, merged[x][0]), min(hi, merged[x][1])) if x in merged else (lo, hi)
  if not merged: return t
  values = _values_of(t)
  divs = [n for n in values if n.op in (Ops.MOD, Ops.IDIV)]
  if not divs: return t
  inside, under_divs = set(values), frozenset().union(*(_range_set(n) for n in divs))
  stand: dict[UOp, UOp] = {}
  for x, (lo, hi) in merged.items():
    if lo > hi or x not in inside: continue
    if x.op is Ops.RANGE and x not in under_divs: continue
    if x.op is not Ops.RANGE and not _holds_divmod(x): continue
    stand[x] = UOp.variable(f"given_{len(stand)}_{id(x)}", lo, hi, x.dtype)
  if not stand: return t
  ints = [t] if t.dtype.is_int else \
    list(dict.fromkeys(s for n in values if not n.dtype.is_int and _is_value(n) for s in n.src
                       if s.dtype.is_int and s.op not in (Ops.CONST, Ops.RANGE)))
  placed = [substitute(u, stand) for u in ints]
  pairs = [(u, p) for u, p in zip(ints, placed) if p is not u]
  if not pairs: return t
  done = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(p for _, p in pairs)), load_library().matcher("symbolic"))
  back = {v: x for x, v in stand.items()}
  mapping = {u: substitute(d, back) for (u, _), d in zip(pairs, done.src)}
  mapping = {u: d for u, d in mapping.items() if d is not u}
  return _replace_in_values(t, mapping) if mapping else t


# *** index arithmetic that is affine where it is used ***

_FIT_POINTS = 1 << 13    # the most points one subexpression is evaluated at
_FIT_BUDGET = 1 << 16    # and the most for one WHERE, all subexpressions together
_INT_OPS = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.MAX: np.maximum}


def _eval_grid(u: UOp, env: dict[UOp, np.ndarray], memo: dict[UOp, np.ndarray]) -> np.ndarray | None:
  """u's value at every point of a grid (env: each range's coordinate array), in int64; None when u holds
  something else than integer and bool arithmetic over ranges and constants, or leaves int32's range."""
  for n in u.toposort():
    if n in memo: continue
    if n.op is Ops.RANGE:
      if n not in env: return None
      v = env[n]
    elif n.op is Ops.CONST:
      if not isinstance(n.arg, (int, bool)): return None
      v = np.int64(n.arg)
    else:
      xs = [memo.get(s) for s in n.src]
      if any(x is None for x in xs): return None
      op = n.op
      if op in _INT_OPS and n.dtype.is_int: v = _INT_OPS[op](*xs)
      elif op is Ops.NEG and n.dtype.is_int: v = -xs[0]
      elif op in (Ops.IDIV, Ops.MOD) and n.dtype.is_int:
        if n.src[1].op is Ops.CONST and n.src[1].arg > 0:   # (the usual divisor: no zero to guard)
          v = np.floor_divide(xs[0], xs[1]) if op is Ops.IDIV else np.mod(xs[0], xs[1])
        else:
          a, b = np.broadcast_arrays(*xs)
          safe = np.where(b == 0, 1, b)
          v = np.where(b == 0, 0, np.floor_divide(a, safe) if op is Ops.IDIV else np.mod(a, safe))
      elif op is Ops.CMPLT: v = xs[0] < xs[1]
      elif op is Ops.CMPNE: v = xs[0] != xs[1]
      elif op is Ops.CMPEQ: v = xs[0] == xs[1]
      elif op in (Ops.AND, Ops.OR, Ops.XOR) and n.dtype.is_bool:
        v = {Ops.AND: np.logical_and, Ops.OR: np.logical_or, Ops.XOR: np.logical_xor}[op](*xs)
      elif op is Ops.WHERE: v = np.where(*xs)
      else: return None
      # (outside int32 by its values; its bounds, strictly inside int32, say it cannot be, without two passes over
      # v. Strictly: an int32 op that may wrap has int32's whole range as its bounds, and v holds the unwrapped value)
      if n.dtype.is_int and np.size(v) and not (isinstance(lo := n.vmin, int) and isinstance(hi := n.vmax, int)
                                                and -2**31 < lo and hi < 2**31 - 1) \
         and (np.max(v) > 2**31 - 1 or np.min(v) < -2**31): return None
    memo[n] = v
  return memo[u]


def _ranges_of(u: UOp) -> list[UOp]:
  """u's RANGEs in u.toposort()'s order (kept with the node: a conv's guarded indices ask for the same ones often;
  a RANGE's own is not kept, as it would hold the node itself)."""
  if u.op is Ops.RANGE: return [u]
  m = u._memo
  if m is None or (hit := m.get("range_list")) is None:
    hit = u._get_memo()["range_list"] = tuple(n for n in u.toposort() if n.op is Ops.RANGE)
  return list(hit)


def _holds_divmod(u: UOp) -> bool:
  """Whether u holds a // or % (kept per node)."""
  return _kept(u, "divmod", lambda n: n.op in (Ops.IDIV, Ops.MOD) or any(x._memo["divmod"] for x in n.src),
               _DIVMOD_OPS)


_FITS: dict[tuple, tuple | None] = {}
_NESTED: dict[tuple, UOp | None] = {}   # (a term, its guards, partial) -> nested's answer
_EXACT_GUARD: "weakref.WeakKeyDictionary[UOp, tuple]" = weakref.WeakKeyDictionary()  # cond -> (_grouped, too_big)
_BOUNDS: dict[tuple, UOp | None] = {}   # conjuncts -> bounds_form's answer (exact: true whatever the guards)
_SHAPED: dict[tuple, tuple] = {}        # (kind, a question, ranges renumbered) -> (answer, cost): _Fitter.shaped
_FITTING = 0                            # > 0 while _Fitter.nested simplifies a part of an index
_NESTED_REWRITES = 16                   # the most parts of indices one WHERE's fit simplifies (a QR's gradient nests
                                        # hundreds of guarded WHEREs: each new guard would ask again)


_DIVMOD_OPS = frozenset((Ops.IDIV, Ops.MOD))      # (each op set: where a fact is decided by the op alone)
_MEMORY_OPS = frozenset((Ops.LOAD, Ops.INDEX))
_ARITHMETIC_LEAVES = frozenset((Ops.INDEX, Ops.REDUCE, Ops.RANGE))
_RANGE_LEAVES = frozenset((Ops.RANGE,))
_NOT_KEPT = object()   # what of() gives for a node whose fact _kept must not store (it would hold the node)


def _kept(u: UOp, key: str, of, leaves: frozenset = frozenset()) -> object:
  """A fact of u worked out from its sources' facts (`of(node)`, which reads theirs from their memos under `key`),
  each node's kept in its own memo (a dict on the node, gone with it; a weak mapping keyed by nodes cost a Python
  call per lookup): a deep expression is walked once, not once per node asked about. The walk does not go below a
  node whose op is in `leaves` (of() decides those without their sources: a load reads memory whatever its index
  holds, and in the scheduler's graph what lies below a load is the whole program before it). A fact must not hold
  its own node (the memo would keep the node alive: _range_set keeps none for a RANGE)."""
  m = u._memo
  if m is not None and (got := m.get(key)) is not None: return got
  for n in u.toposort(lambda x: x.op not in leaves and (x._memo is None or key not in x._memo)):
    nm = n._memo
    if (nm is None or key not in nm) and (v := of(n)) is not _NOT_KEPT: n._get_memo()[key] = v
  return u._memo[key]


def _range_set(u: UOp) -> frozenset:
  """The RANGEs u depends on (kept per node, but for a RANGE itself: its set holds it)."""
  if u.op is Ops.RANGE: return frozenset((u,))
  return _kept(u, "range_set", _ranges_below, _RANGE_LEAVES)


def _ranges_below(n: UOp):
  if n.op is Ops.RANGE: return _NOT_KEPT
  return frozenset().union(*((s,) if s.op is Ops.RANGE else s._memo["range_set"] for s in n.src))


@rule_helper
def reads_memory(u: UOp) -> bool:
  """u's graph holds a LOAD or an INDEX (kept per node: a condition over loads is walked once, not once per WHERE
  that asks)."""
  return _kept(u, "reads", lambda n: n.op in (Ops.LOAD, Ops.INDEX) or any(x._memo["reads"] for x in n.src),
               _MEMORY_OPS)


def _numbered(r: UOp, i: int) -> UOp:
  """RANGE r renumbered i (its kind, size and tag kept)."""
  return r.replace(arg=(i, *r.arg[1:]))


class _Fitter:
  """Rewrites the load indices under a WHERE: each nonlinear term of an index (a // or % and what it is
  multiplied by) that is affine in its ranges at every point where the guards around the load hold becomes
  that affine expression (found by evaluating the term there: its ranges are small)."""
  def __init__(self):
    self.spent = 0
    self.memo: dict[tuple, UOp] = {}
    self.rewrites = 0    # symbolic rewrites of index parts (nested), bounded per WHERE by _NESTED_REWRITES
    self.guards: dict[tuple, UOp] = {}
    self.too_big = False   # a group of a guard had too many points for bounds_form
    self.refused = 0       # the times a budget (_FIT_BUDGET, _NESTED_REWRITES) cut a fit short

  def shaped(self, kind: str, x: UOp, guards: tuple, work) -> UOp:
    """work()'s answer about x where guards hold, remembered by the question's shape: x and the guards' usable
    conjuncts with their ranges renumbered in order (0, 1, ...), when x is arithmetic on ranges. A ResNet's
    repeated blocks, and a convolution read in several kernels, ask the same questions over ranges numbered
    apart. The renumbering keeps the ranges' order and sizes, so the work done is the one a fresh question would
    do (with the same rule library: it is part of the key); the answer is kept only when no budget cut it short,
    and a reuse is charged what the work cost (points and rewrites), so a WHERE that would have run out of budget
    still does."""
    if not self.is_arithmetic(x): return work()   # (a guard over a load: below it, the whole program)
    conds = self.usable(guards)
    nodes = UOp.sink(x, *conds).toposort()
    rank = {r: i for i, r in enumerate(sorted((n for n in nodes if n.op is Ops.RANGE), key=lambda r: r.arg[0]))}
    # (the key spells the graph out node by node, as the schedule cache's does: cheaper than building its
    # renumbered copy, which only a new answer needs)
    at: dict[UOp, int] = {}
    for i, n in enumerate(nodes): at[n] = i
    # (and the rules: nested() simplifies with the symbolic rule set, which a user's rules directory may change)
    key = (kind, load_library().digest, tuple((n.op, n.dtype, (rank[n], *n.arg[1:]) if n in rank else arg_key(n), n.tag,
                        tuple(at[s] for s in n.src)) for n in nodes))
    hit = _SHAPED.get(key)
    if hit is not None:
      out, spent, rewrites = hit
      if self.spent + spent <= _FIT_BUDGET and self.rewrites + rewrites <= _NESTED_REWRITES:
        self.spent += spent
        self.rewrites += rewrites
        return x if out is None else substitute(out, {_numbered(r, i): r for r, i in rank.items()})
    spent, rewrites, refused = self.spent, self.rewrites, self.refused
    got = work()
    if self.refused == refused:
      if len(_SHAPED) > 4096: _SHAPED.clear()
      _SHAPED[key] = (None if got is x else substitute(got, {r: _numbered(r, i) for r, i in rank.items()}),
                      self.spent - spent, self.rewrites - rewrites)
    return got

  def ranges(self, u: UOp) -> frozenset: return _range_set(u)

  def fittable(self, u: UOp) -> bool:
    """rebuild could change u: among the values it walks (as rebuild does: through WHEREs, reduces' values and
    float arithmetic), a load whose index, or a WHERE whose condition, has a // or %. Kept per node (_FITTABLE)."""
    hit = _FITTABLE.get(u)
    if hit is not None: return hit
    def walked(n: UOp) -> tuple[UOp, ...]:
      if not _is_value(n) or n.op in (Ops.RANGE, Ops.CONST, Ops.INDEX): return ()
      if n.op is Ops.REDUCE: return (n.src[0],)
      if n.op is not Ops.WHERE and n.dtype.is_int: return ()
      return n.src
    todo = [(u, False)]
    while todo:
      n, ready = todo.pop()
      if n in _FITTABLE: continue
      if not ready:
        todo.append((n, True))
        todo += [(s, False) for s in walked(n) if s not in _FITTABLE]
        continue
      if n.op is Ops.INDEX: _FITTABLE[n] = any(self.has_divmod(i) for i in n.src[1:])
      else:
        _FITTABLE[n] = ((n.op is Ops.WHERE and self.has_divmod(n.src[0])) or any(_FITTABLE[s] for s in walked(n)))
    return _FITTABLE[u]

  def has_divmod(self, u: UOp) -> bool:
    return _holds_divmod(u)

  def usable(self, guards: tuple) -> list[UOp]:
    """The conjuncts of the guards that are arithmetic on ranges (one that reads memory is left out: the points
    kept are then a superset of those where the value is used, which is still sound)."""
    out = []
    for g in guards:
      for c in _conjuncts(g):
        if self.is_arithmetic(c): out.append(c)
    return out

  def is_arithmetic(self, c: UOp) -> bool:
    """c is arithmetic on ranges and constants all the way down (no load, no reduce)."""
    return _kept(c, "arithmetic", lambda n: n.op in (Ops.RANGE, Ops.CONST) or (
      bool(n.src) and n.op not in (Ops.INDEX, Ops.REDUCE) and all(x._memo["arithmetic"] for x in n.src)),
      _ARITHMETIC_LEAVES)

  def fit(self, u: UOp, conds: list[UOp]) -> UOp | None:
    got = self.fit_bounded(u, conds)
    return None if got is None else got[0]

  def fit_bounded(self, u: UOp, conds: list[UOp]) -> tuple[UOp, int, int] | None:
    """u as an affine expression of its ranges, with its least and greatest value where conds hold."""
    key = (u, tuple(conds))
    if key in _FITS: return _FITS[key]
    out = self._fit(u, conds)
    if len(_FITS) > 4096: _FITS.clear()   # (the nested WHEREs of one kernel ask again; a bounded memo)
    _FITS[key] = out
    return out

  def points(self, u: UOp, conds: list[UOp]) -> int:
    """The points of the grid that fitting u where conds hold evaluates (every range of them; 2**40 for a range of
    no constant size)."""
    rs = set(self.ranges(u)).union(*(self.ranges(c) for c in conds))
    return math.prod(r.src[0].arg if r.src and r.src[0].op is Ops.CONST else 1 << 40 for r in rs)

  def grid(self, rs: list[UOp]) -> dict[UOp, np.ndarray] | None:
    """Each range's coordinates at every point of the ranges' grid, or None past the budget (or for a range
    whose size is not a constant)."""
    size = 1
    for r in rs: size *= r.src[0].arg if r.src and r.src[0].op is Ops.CONST else 1 << 40
    if not rs or size > _FIT_POINTS: return None
    if self.spent + size > _FIT_BUDGET:
      self.refused += 1
      return None
    self.spent += size
    grids = np.meshgrid(*[np.arange(r.src[0].arg, dtype=np.int64) for r in rs], indexing="ij")
    return dict(zip(rs, grids))

  @staticmethod
  def affine(u: UOp, v: np.ndarray, m: np.ndarray, env: dict[UOp, np.ndarray]) -> UOp | None:
    """u's values v (on env's grid) as an affine expression of u's ranges at the points m, checked exactly."""
    shape = next(iter(env.values())).shape
    own = _ranges_of(u)
    a = np.stack([np.ones(int(m.sum()))] + [env[r][m].astype(np.float64) for r in own], axis=1)
    want = np.broadcast_to(v, shape)[m].astype(np.float64)
    coef = np.rint(np.linalg.lstsq(a, want, rcond=None)[0]).astype(np.int64)
    if not np.array_equal(a.astype(np.int64) @ coef, want.astype(np.int64)): return None
    out = UOp.const(u.dtype, int(coef[0]))
    for c, r in zip(coef[1:], own):
      if c: out = out + (r.cast(u.dtype) if r.dtype is not u.dtype else r) * int(c)
    return out

  def _fit(self, u: UOp, conds: list[UOp]) -> tuple[UOp, int, int] | None:
    rs = list(dict.fromkeys(_ranges_of(u) + [r for c in conds for r in _ranges_of(c)]))
    if (env := self.grid(rs)) is None: return None
    shape = next(iter(env.values())).shape
    v = _eval_grid(u, env, {})
    if v is None: return None
    m: np.ndarray | bool = True
    for c in conds:
      cv = _eval_grid(c, env, {})
      if cv is not None: m = np.logical_and(m, cv)
    m = np.broadcast_to(m, shape)
    if not m.any(): return None
    out = self.affine(u, v, m, env)
    if out is None: return None
    picked = np.broadcast_to(v, shape)[m]
    return out, int(picked.min()), int(picked.max())

  def nested(self, v: UOp, conds: list[UOp], partial: bool = False) -> UOp | None:
    """v with its innermost quotients and remainders that are affine where conds hold (each checked on the grid
    of its own ranges alone, with the conds that read no other range) replaced, innermost first: each becomes a
    variable bounded as it is there, the symbolic rules simplify what holds it, and the variable becomes the
    affine expression. A whole index term of a large kernel spans too many points to evaluate at once (a
    convolution's input gradient at 56x56 with 64 channels: millions), its parts a few hundred. None when some
    quotient or remainder is left (unless partial): the symbolic rules could fold a partly simplified term back
    into the form it had, and this would rewrite it again."""
    own = self.ranges(v)
    conds = [c for c in conds if self.ranges(c) <= own]   # (the only ones a part of v is fitted with)
    key = (v, tuple(conds), partial)
    if key in _NESTED: return _NESTED[key]
    out = self._nested(v, conds, partial)
    if len(_NESTED) > 4096: _NESTED.clear()
    _NESTED[key] = out
    return out

  def _nested(self, v: UOp, conds: list[UOp], partial: bool) -> UOp | None:
    cur = v
    for _ in range(8):
      inner = [n for n in cur.toposort() if n.op in (Ops.IDIV, Ops.MOD) and n.dtype.is_int
               and not any(self.has_divmod(s) for s in n.src)]
      stand: dict[UOp, UOp] = {}
      back: dict[UOp, UOp] = {}
      for d in inner:
        own = self.ranges(d)
        got = self.fit_bounded(d, [c for c in conds if self.ranges(c) <= own])
        if got is None: continue
        a, lo, hi = got
        var = UOp.variable(f"fit_{len(stand)}_{id(d)}", lo, hi, d.dtype)
        stand[d], back[var] = var, a
      if not stand: break
      if self.rewrites >= _NESTED_REWRITES:
        self.refused += 1
        break
      self.rewrites += 1
      global _FITTING
      _FITTING += 1   # (the rewrite of an index part does not fit the WHEREs inside it again: that recursion explodes
      try: done = graph_rewrite(substitute(cur, stand), load_library().matcher("symbolic"))   # on a QR's gradient)
      finally: _FITTING -= 1
      cur = substitute(done, back)
      if not self.has_divmod(cur): return cur
    return cur if partial and cur is not v else None

  def simplified(self, idx: UOp, conds: list[UOp], partial: bool = False) -> UOp:
    """An integer expression with each nonlinear term made affine where conds hold (as a whole, else part by
    part), or idx itself."""
    terms, k = terms_of(idx)
    out, changed = [], False
    for coef, v in terms:
      f = None
      if self.has_divmod(v):
        f = self.fit(v, conds)
        # part by part only where the whole was too large to evaluate: a term evaluated whole and not affine where
        # conds hold has no affine parts that make it so (they would be equal there)
        if f is None and (partial or self.points(v, conds) > _FIT_POINTS): f = self.nested(v, conds, partial)
      changed |= f is not None
      out.append((coef, v if f is None else f))
    if not changed: return idx
    total = UOp.const(idx.dtype, k)
    for coef, v in out: total = total + (v if coef == 1 else v * coef)
    return total

  def guard(self, cond: UOp, guards: tuple) -> UOp:
    """A WHERE's condition with its quotients and remainders gone where it can be: first each comparison's
    operands simplified where the enclosing guards hold (the only points where this condition is read), then the
    conjunction replaced by bounds on affine expressions (each quotient or remainder's affine form where the
    conjunction holds, and each range) when those bounds hold at exactly the same points of its ranges' grid,
    checked at every point. A convolution's input gradient is guarded by `(h + 16r + 1) % 17 < 14` and
    `8r + h // 2 < 25` (the repeat trick): that is `0 <= h + 1 - r < 14` and `r < 3`, and `r < 3` lets the sum
    over r drop its dead fourth iteration (narrowed_reduce)."""
    if cond.dtype is not dtypes.bool or not self.has_divmod(cond): return cond
    key = (cond, guards)
    if (done := self.guards.get(key)) is None:
      done = self.guards[key] = self.shaped("guard", cond, guards, lambda: self._guard(cond, guards))
    return done

  def _guard(self, cond: UOp, guards: tuple) -> UOp:
    orig = _conjuncts(cond)
    if (exact := _EXACT_GUARD.get(cond)) is None:
      self.too_big = False
      exact = (self._grouped(orig, list(orig)), self.too_big)
      if exact[0] is not None or not self.too_big: _EXACT_GUARD[cond] = exact   # (a budget's refusal may change)
    out = exact[0]
    if out is None and exact[1]:
      # too many points at once: each comparison's operands simplified where the enclosing guards and the affine
      # conjuncts hold (a convolution's column guard reads the row's quotient, 0 there), which splits the groups
      conj = list(orig)
      given = self.usable(guards) + self.usable(tuple(c for c in conj if not self.has_divmod(c)))
      for i, c in enumerate(conj):
        if c.op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) and self.has_divmod(c) and any(self.ranges(g) & self.ranges(c) for g in given):
          src = tuple(self.simplified(s, given, True) if s.dtype.is_int and self.has_divmod(s) else s for s in c.src)
          if any(a is not b for a, b in zip(src, c.src)): conj[i] = UOp(c.op, c.dtype, src, c.arg)
      out = self._grouped(orig, conj, partial=True)
    return cond if out is None else out

  def _grouped(self, orig: list[UOp], conj: list[UOp], partial: bool = False) -> UOp | None:
    """The conjunction with each group of conjuncts that share ranges (bounded apart: fewer points, a
    convolution's rows and columns) that holds a quotient or remainder as bounds on affine forms (bounds_form);
    None where a group has none, unless partial (that group then keeps its conjuncts as they were in orig: the
    symbolic rules could fold a partly simplified one back), or where nothing changed."""
    groups: list[tuple[set, list[int]]] = []
    for i, c in enumerate(conj):
      rs = set(self.ranges(c))
      joined = [g for g in groups if g[0] & rs]
      for g in joined: groups.remove(g)
      groups.append((rs.union(*(g[0] for g in joined)), [j for g in joined for j in g[1]] + [i]))
    out: UOp | None = None
    changed = False
    for _, idx in groups:
      group = [conj[i] for i in idx]
      if any(self.has_divmod(c) for c in group):
        if (new := self.bounds_form(group)) is not None: group, changed = [new], True
        elif partial: group = [orig[i] for i in idx]
        else: return None
      for c in group: out = c if out is None else out & c
    return out if changed else None

  def bounds_form(self, conj: list[UOp]) -> UOp | None:
    """The conjunction conj as bounds on affine expressions, when that is exactly it on its ranges' grid."""
    if len(self.usable(tuple(conj))) != len(conj): return None   # (a conjunct that reads memory)
    key = tuple(conj)
    if key in _BOUNDS: return _BOUNDS[key]
    rs = list(dict.fromkeys(r for c in conj for r in _ranges_of(c)))
    if (env := self.grid(rs)) is None:
      self.too_big = True   # (not remembered: another WHERE may have points left to spend)
      return None
    out = self._bounds_form(conj, env)
    if len(_BOUNDS) > 4096: _BOUNDS.clear()
    _BOUNDS[key] = out
    return out

  def _bounds_form(self, conj: list[UOp], env: dict[UOp, np.ndarray]) -> UOp | None:
    rs, shape = list(env), next(iter(env.values())).shape
    m: np.ndarray | bool = True
    for c in conj:
      if (cv := _eval_grid(c, env, {})) is None: return None
      m = np.logical_and(m, cv)
    m = np.broadcast_to(m, shape)
    if not m.any(): return UOp.const(dtypes.bool, False)
    forms: list[tuple[UOp, np.ndarray]] = []
    for d in dict.fromkeys(n for c in conj for n in c.toposort() if n.op in (Ops.IDIV, Ops.MOD) and n.dtype.is_int):
      if (v := _eval_grid(d, env, {})) is None: continue
      a = self.affine(d, v, m, env)
      if a is not None and a.op is not Ops.CONST and all(a is not f for f, _ in forms): forms.append((a, np.broadcast_to(v, shape)))
    forms += [(r, env[r]) for r in rs]
    # the conjuncts that are affine already stay; each form adds the bounds it keeps where the conjunction holds
    pieces = [c for c in conj if not self.has_divmod(c)]
    for a, v in forms:
      lo, hi = int(v[m].min()), int(v[m].max())
      if a.vmin < lo: pieces.append(a.lt(lo).ne(True))
      if a.vmax > hi: pieces.append(a.lt(hi + 1))
    out: UOp | None = None
    for p in pieces: out = p if out is None else out & p
    if out is None: return None
    got = _eval_grid(out, env, {})
    return out if got is not None and np.array_equal(np.broadcast_to(got, shape), m) else None

  def index(self, idx: UOp, guards: tuple) -> UOp:
    if not idx.dtype.is_int or not self.has_divmod(idx): return idx
    return self.shaped("index", idx, guards, lambda: self.simplified(idx, self.usable(guards)))

  def rebuild(self, u: UOp, guards: tuple) -> UOp:
    # (nothing under u that a fit could change: no load index or guard with a // or % in it. A chain of nested
    # WHEREs, x.maximum(f(x)) repeated, is reached under as many guard tuples as it has paths, so the walk must
    # not go where it cannot change anything)
    if not self.fittable(u): return u
    key = (u, guards)
    if key in self.memo: return self.memo[key]
    if not _is_value(u) or u.op in (Ops.RANGE, Ops.CONST): out = u   # (shared structure: left as it is)
    else:
      if u.op is Ops.WHERE:
        cond = self.guard(self.rebuild(u.src[0], guards), guards)
        src = (cond, self.rebuild(u.src[1], guards + (cond,)), self.rebuild(u.src[2], guards))
      elif u.op is Ops.REDUCE: src = (self.rebuild(u.src[0], guards),) + u.src[1:]
      elif u.op is Ops.INDEX: src = (u.src[0],) + tuple(self.index(s, guards) for s in u.src[1:])
      elif u.dtype.is_int: src = u.src   # (integer arithmetic outside an index is left alone)
      else: src = tuple(self.rebuild(s, guards) for s in u.src)
      out = u if all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg, u.tag)
    self.memo[key] = out
    return out


_AFFINE: "weakref.WeakKeyDictionary[UOp, UOp | None]" = weakref.WeakKeyDictionary()
_FITTABLE: "weakref.WeakKeyDictionary[UOp, bool]" = weakref.WeakKeyDictionary()   # _Fitter.fittable


def forget_shapes() -> None:
  """Forget the fitted index and guard answers kept by their shape (_Fitter.shaped), as a new process has none
  (bench/schedule.py --fresh-memo: scheduling time without answers from earlier graphs)."""
  _SHAPED.clear()


@rule_helper
def affine_given(w: UOp) -> UOp | None:
  """WHERE(cond, t, f) with each nonlinear term of t's load indices (a // or % in it) that is affine in its
  ranges wherever cond (and the guards of the WHEREs inside t around the load) hold replaced by that affine
  expression; None when nothing changes. Proven by evaluation: the ranges involved are small (at most 2**15 points each), so
  the subexpression is evaluated at every point and the affine fit checked exactly. A convolution's gradient
  reaches its window taps through `(y + 10 r + 1) // 11` and `% 11`, which under the guards are `r` and
  `y + 1 - r`: the load index becomes affine, as the forward's is. The guards themselves become bounds on affine
  forms where that is exactly what they say (_Fitter.guard). Not inside another fit's rewrite (_FITTING)."""
  if _FITTING: return None
  if w in _AFFINE: return _AFFINE[w]
  cond, t, f = w.src
  fitter = _Fitter()
  new_cond = fitter.guard(cond, ())
  new = fitter.rebuild(t, (new_cond,))
  out = None if new_cond is cond and new is t else UOp(Ops.WHERE, w.dtype, (new_cond, new, f))
  _AFFINE[w] = out
  return out


@rule_helper
def narrowed_reduce(red: UOp) -> UOp | None:
  """A sum (or max) over range r of WHERE(cond, v, identity) where cond says r < k, k below r's size: the same
  reduce over a range of size k, the iterations past k only added zeros (or took the max with -inf). A
  convolution's input gradient sums over the 4 copies of the repeat trick, and its guards keep 3
  (affine_given writes them as `r < 3`): a quarter of its work is dead otherwise. r keeps its number (it is
  the reduce's own: nothing outside reads it)."""
  if red.arg not in (Ops.ADD, Ops.MAX) or len(red.src) < 2: return None
  val, rngs = red.src[0], red.src[1:]
  if val.op is not Ops.WHERE or val.src[2].op is not Ops.CONST: return None
  none = val.src[2].arg
  if red.arg is Ops.ADD and none != 0: return None
  if red.arg is Ops.MAX and not (none == -math.inf or (val.dtype.is_int and none == val.dtype.min())): return None
  for c in _conjuncts(val.src[0]):
    if c.op is not Ops.CMPLT or c.src[1].op is not Ops.CONST or not any(c.src[0] is r for r in rngs): continue
    r, k = c.src[0], c.src[1].arg
    if r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST or not 1 <= k < r.src[0].arg: continue
    # (only what reads r is rebuilt: the value may read buffers other kernels write, whole graphs below)
    outside = lambda x: r not in _range_set(x)
    if k == 1:   # one iteration: r is 0 there, and the reduce keeps its other ranges (a range of 1 is no range)
      rest = tuple(x for x in rngs if x is not r)
      body = substitute(val, {r: UOp.const(r.dtype, 0)}, frozen=outside)
      return UOp(Ops.REDUCE, red.dtype, (body, *rest), red.arg) if rest else body
    new = UOp(Ops.RANGE, r.dtype, (UOp.const(r.src[0].dtype, k),), r.arg, r.tag)
    return UOp(Ops.REDUCE, red.dtype, (substitute(val, {r: new}, frozen=outside), *(new if x is r else x for x in rngs)),
               red.arg)
  return None


@rule_helper
def merged_reduce(red: UOp) -> UOp | None:
  """A sum over ranges A of WHERE(cond, (sum over ranges B of x), 0), cond reading no range of B: one sum over
  A and B of WHERE(cond, x, 0) (float sums reassociate); the same with the sum in the false branch. A
  convolution's input gradient is three nested sums (window row, window column, channels), each with its own
  accumulators; one reduce over the three is the loop nest the forward convolution has, and the kernel optimizer
  tiles it the same way."""
  if red.arg is not Ops.ADD or len(red.src) < 2: return None
  val, outer = red.src[0], red.src[1:]
  if val.op is not Ops.WHERE: return None
  cond, t, f = val.src
  live = 1 if f.op is Ops.CONST and f.arg == 0 else 2 if t.op is Ops.CONST and t.arg == 0 else 0   # (either side)
  inner = val.src[live] if live else None
  if inner is None or inner.op is not Ops.REDUCE or inner.arg is not Ops.ADD or inner.dtype is not red.dtype or len(inner.src) < 2:
    return None
  rngs = inner.src[1:]
  if any(n.op is Ops.RANGE and any(n is r for r in rngs) for n in cond.toposort()): return None
  body = UOp(Ops.WHERE, val.dtype, tuple(inner.src[0] if i == live else s for i, s in enumerate(val.src)))
  return UOp(Ops.REDUCE, red.dtype, (body, *outer, *rngs), red.arg)


# *** one-hot sums: Tensor.arange's iota over a range, and a sum that picks one position (a gather, an Embedding) ***


def _iota_bit(t: UOp) -> tuple[UOp, int] | None:
  """(r, w) when t is one binary digit's pattern of r: WHERE(r % 2w < w, 0, w), or WHERE(r < w, 0, w) for a top
  digit (r < 2w)."""
  if t.op is not Ops.WHERE or t.src[1].op is not Ops.CONST or t.src[1].arg != 0 or t.src[2].op is not Ops.CONST: return None
  w, cond = t.src[2].arg, t.src[0]
  if type(w) is not int or w < 1 or w & (w - 1) or cond.op is not Ops.CMPLT: return None
  a, lim = cond.src
  if lim.op is not Ops.CONST or lim.arg != w: return None
  if a.op is Ops.MOD and a.src[1].op is Ops.CONST and a.src[1].arg == 2 * w: r = a.src[0]
  elif a.vmax < 2 * w: r = a
  else: return None
  return (r, w) if r.op is Ops.RANGE else None


@rule_helper
def iota_value(x: UOp) -> UOp | None:
  """x as its range r when x is Tensor.arange's iota over r (engine/tensor/creation.py `_iota`: the sum of each
  binary digit's pattern, WHERE(r % 2w < w, 0, w) for w = 1, 2, 4, ... 2^(B-1), with 0 <= r < 2^B): the digits of
  r add up to r. None when x is anything else."""
  terms, stack = [], [x]
  while stack:
    u = stack.pop()
    if u.op is Ops.ADD and u.dtype is x.dtype: stack.extend(u.src); continue
    if (bit := _iota_bit(u)) is None: return None
    terms.append(bit)
  r = terms[0][0]
  ws = sorted(w for _, w in terms)
  if any(t[0] is not r for t in terms) or ws != [1 << b for b in range(len(ws))]: return None
  if r.vmin < 0 or r.vmax >= 2 * ws[-1] or r.vmax > x.dtype.max(): return None
  return r.cast(x.dtype)


@rule_helper
def collapse_one_hot(red: UOp) -> UOp | None:
  """A sum over range r of WHERE(i == r, v(r), 0), where i reads no range of the sum: v at r = i, where
  0 <= i < n (the range's size), else 0 (the seeds' and tinygrad's reduce collapse of an arange compare). This is
  how a gather or an Embedding picks its rows: without it every row is read and all but one multiplied away.

  r is replaced by WHERE(0 <= i < n, i, 0), a position the loop itself visits, so every address v reads stays
  one the sum read before. (The sum of one value and zeros is the value, except that -0.0 + 0.0 is +0.0: a picked
  -0.0 now stays -0.0.)"""
  if red.arg is not Ops.ADD or len(red.src) < 2: return None
  val, rngs = red.src[0], red.src[1:]
  if val.op is not Ops.WHERE or val.src[2].op is not Ops.CONST or val.src[2].arg != 0: return None
  cond = val.src[0]
  if cond.op is not Ops.CMPEQ: return None
  for r_side, i in (cond.src, cond.src[::-1]):
    r = r_side.src[0] if r_side.op is Ops.CAST else r_side
    if r.op is not Ops.RANGE or not any(r is x for x in rngs) or r.src[0].op is not Ops.CONST: continue
    n = r.src[0].arg
    if r_side.op is Ops.CAST and not (r_side.dtype.is_int and r_side.dtype.max() >= n - 1 and r_side.dtype.min() <= 0): continue
    if any(u.op is Ops.RANGE and any(u is x for x in rngs) for u in i.toposort()): continue
    valid = (i < n) & (i < 0).ne(True)
    at = valid.where(i, i.const_like(0))
    at = at if at.dtype is r.dtype else at.cast(r.dtype)
    picked = valid.where(_replace_in_values(val.src[1], {r: at}), val.src[1].const_like(0))
    rest = tuple(x for x in rngs if x is not r)
    return UOp(Ops.REDUCE, red.dtype, (picked, *rest), red.arg) if rest else picked
  return None
