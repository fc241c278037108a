"""Helpers of rules/symbolic.rules: the parts of simplification that are arithmetic, not pattern shape. The
facts of an index expression they share with the renderers (its terms, steps, bounds) are IR: engine/ir/facts.py."""
from __future__ import annotations

import math
import weakref

import numpy as np

from rulec.engine.lang.capability import rule_helper

from rulec.engine.ir.alu import DEVICE_DEFINED, exec_alu, wrap
from rulec.engine.ir.dtypes import DType, dtypes
from rulec.engine.ir.facts import linear_bounds, terms_of
from rulec.engine.ir.ops import ALU, Ops
from rulec.engine.ir.rewrite import graph_rewrite, substitute
from rulec.engine.ir.uop import UOp
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
  return (lo, hi) if u.dtype.min() <= lo and hi <= u.dtype.max() else None


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
    b = linear_bounds(x)
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
    # the maximal integer subexpressions of the branch's values (an index, a guard) that hold a guarded X
    values = _values_of(t)
    inside = set(values)
    if any(x in inside for x in stand):
      ints = [t] if t.dtype.is_int else \
        list(dict.fromkeys(s for n in values if not n.dtype.is_int and _is_value(n) for s in n.src
                           if s.dtype.is_int and s.op not in (Ops.CONST, Ops.RANGE)))
      placed = [substitute(u, stand) for u in ints]
      pairs = [(u, p) for u, p in zip(ints, placed) if p is not u]
      if pairs:
        sink = UOp(Ops.SINK, dtypes.void, tuple(p for _, p in pairs))
        done = graph_rewrite(sink, load_library().matcher("symbolic"))
        back = {v: x for x, v in stand.items()}
        mapping = {u: substitute(d, back) for (u, _), d in zip(pairs, done.src)}
        mapping = {u: d for u, d in mapping.items() if d is not u}
        if mapping:
          new = _replace_in_values(t, mapping)
          if new is not t: out = UOp(Ops.WHERE, w.dtype, (cond, new, f))
  _GIVEN[w] = out
  return out


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
      if n.dtype.is_int and np.size(v) and (np.max(v) > 2**31 - 1 or np.min(v) < -2**31): return None
    memo[n] = v
  return memo[u]


def _ranges_of(u: UOp) -> list[UOp]: return [n for n in u.toposort() if n.op is Ops.RANGE]


_FITS: dict[tuple, UOp | None] = {}


class _Fitter:
  """Rewrites the load indices under a WHERE: each nonlinear term of an index (a // or % and what it is
  multiplied by) that is affine in its ranges at every point where the guards around the load hold becomes
  that affine expression (found by evaluating the term there: its ranges are small)."""
  def __init__(self):
    self.spent = 0
    self.memo: dict[tuple, UOp] = {}
    self.divmod: dict[UOp, bool] = {}

  def has_divmod(self, u: UOp) -> bool:
    for n in u.toposort(lambda m: m not in self.divmod):
      if n not in self.divmod: self.divmod[n] = n.op in (Ops.IDIV, Ops.MOD) or any(self.divmod.get(x, False) for x in n.src)
    return self.divmod[u]

  @staticmethod
  def usable(guards: tuple) -> list[UOp]:
    """The conjuncts of the guards that are arithmetic on ranges (one that reads memory is left out: the points
    kept are then a superset of those where the value is used, which is still sound)."""
    ok = lambda c: all(n.op in (Ops.RANGE, Ops.CONST) or (n.src and n.op not in (Ops.INDEX, Ops.REDUCE)) for n in c.toposort())
    return [c for g in guards for c in _conjuncts(g) if ok(c)]

  def fit(self, u: UOp, conds: list[UOp]) -> UOp | None:
    key = (u, tuple(conds))
    if key in _FITS: return _FITS[key]
    out = self._fit(u, conds)
    if len(_FITS) > 4096: _FITS.clear()   # (the nested WHEREs of one kernel ask again; a bounded memo)
    _FITS[key] = out
    return out

  def _fit(self, u: UOp, conds: list[UOp]) -> UOp | None:
    rs = list(dict.fromkeys(_ranges_of(u) + [r for c in conds for r in _ranges_of(c)]))
    size = 1
    for r in rs: size *= r.src[0].arg if r.src and r.src[0].op is Ops.CONST else 1 << 40
    if not rs or size > _FIT_POINTS or self.spent + size > _FIT_BUDGET: return None
    self.spent += size
    grids = np.meshgrid(*[np.arange(r.src[0].arg, dtype=np.int64) for r in rs], indexing="ij")
    env = dict(zip(rs, grids))
    v = _eval_grid(u, env, {})
    if v is None: return None
    m: np.ndarray | bool = True
    for c in conds:
      cv = _eval_grid(c, env, {})
      if cv is not None: m = np.logical_and(m, cv)
    m = np.broadcast_to(m, grids[0].shape)
    if not m.any(): return None
    own = _ranges_of(u)
    a = np.stack([np.ones(int(m.sum()))] + [env[r][m].astype(np.float64) for r in own], axis=1)
    want = np.broadcast_to(v, grids[0].shape)[m].astype(np.float64)
    coef = np.rint(np.linalg.lstsq(a, want, rcond=None)[0]).astype(np.int64)
    if not np.array_equal(a.astype(np.int64) @ coef, want.astype(np.int64)): return None
    out = UOp.const(u.dtype, int(coef[0]))
    for c, r in zip(coef[1:], own):
      if c: out = out + (r.cast(u.dtype) if r.dtype is not u.dtype else r) * int(c)
    return out

  def index(self, idx: UOp, guards: tuple) -> UOp:
    if not idx.dtype.is_int or not self.has_divmod(idx): return idx
    terms, k = terms_of(idx)
    conds = self.usable(guards)
    out, changed = [], False
    for coef, v in terms:
      f = self.fit(v, conds) if self.has_divmod(v) else None
      changed |= f is not None
      out.append((coef, v if f is None else f))
    if not changed: return idx
    total = UOp.const(idx.dtype, k)
    for coef, v in out: total = total + (v if coef == 1 else v * coef)
    return total

  def rebuild(self, u: UOp, guards: tuple) -> UOp:
    key = (u, guards)
    if key in self.memo: return self.memo[key]
    if not _is_value(u) or u.op in (Ops.RANGE, Ops.CONST): out = u   # (shared structure: left as it is)
    else:
      if u.op is Ops.WHERE:
        src = (self.rebuild(u.src[0], guards), self.rebuild(u.src[1], guards + (u.src[0],)), self.rebuild(u.src[2], guards))
      elif u.op is Ops.REDUCE: src = (self.rebuild(u.src[0], guards),) + u.src[1:]
      elif u.op is Ops.INDEX: src = (u.src[0],) + tuple(self.index(s, guards) for s in u.src[1:])
      elif u.dtype.is_int: src = u.src   # (integer arithmetic outside an index is left alone)
      else: src = tuple(self.rebuild(s, guards) for s in u.src)
      out = u if all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg, u.tag)
    self.memo[key] = out
    return out


_AFFINE: "weakref.WeakKeyDictionary[UOp, UOp | None]" = weakref.WeakKeyDictionary()


@rule_helper
def affine_given(w: UOp) -> UOp | None:
  """WHERE(cond, t, f) with each nonlinear term of t's load indices (a // or % in it) that is affine in its
  ranges wherever cond (and the guards of the WHEREs inside t around the load) hold replaced by that affine
  expression; None when nothing changes. Proven by evaluation: the ranges involved are small (at most 2**15 points each), so
  the subexpression is evaluated at every point and the affine fit checked exactly. A convolution's gradient
  reaches its window taps through `(y + 10 r + 1) // 11` and `% 11`, which under the guards are `r` and
  `y + 1 - r`: the load index becomes affine, as the forward's is."""
  if w in _AFFINE: return _AFFINE[w]
  cond, t, f = w.src
  out = None
  if any(n.op is Ops.INDEX for n in _values_of(t)):
    new = _Fitter().rebuild(t, (cond,))
    if new is not t: out = UOp(Ops.WHERE, w.dtype, (cond, new, f))
  _AFFINE[w] = out
  return out


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
