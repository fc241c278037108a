"""Facts of an integer index expression, read by rules/symbolic.rules' helpers and by the renderers alike: its
terms (coefficient * node + constant), the step of each range in it, whether it is a multiple of n, its offset
from a range, and its bounds computed without wrap-around."""
from __future__ import annotations

from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.ir.uop import UOp


def terms_of(x: UOp) -> tuple[tuple[tuple[int, UOp], ...], int]:
  """x as sum(coef * node) + const, looking through ADD and multiplication by constants. Kept with the node (the
  symbolic rules ask a sum for its terms from several rules and bounds checks in one pass); the terms are a tuple,
  so no caller can change what the next one reads."""
  m = x._memo
  if m is not None and (got := m.get("terms")) is not None: return got
  got = _terms_of(x)
  if x.op is Ops.ADD or x.op is Ops.MUL: x._get_memo()["terms"] = got   # (a leaf's terms hold the leaf: no cycle)
  return got


def _terms_of(x: UOp) -> tuple[tuple[tuple[int, UOp], ...], int]:
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
  return tuple(terms), const


def range_steps(x: UOp) -> dict[UOp, int]:
  """The step of each range that is a term of x on its own (coefficient * range, looking through ADD)."""
  out: dict[UOp, int] = {}
  for k, t in terms_of(x)[0]:
    if t.op is Ops.RANGE: out[t] = out.get(t, 0) + k
  return out


def multiple_of(x: UOp, n: int) -> bool:
  """x (an integer expression) is a multiple of n for every value of its ranges: every term's coefficient and the
  constant are (a term that is no multiplication by a constant counts as coefficient 1)."""
  terms, const = terms_of(x)
  return const % n == 0 and all(k % n == 0 for k, _ in terms)


def offset_of(x: UOp, r: UOp) -> UOp | None:
  """x as offset + r, where r is a term of coefficient 1 and no other term depends on r: the offset (x with r = 0);
  None for any other x. n neighbouring values of r then index n neighbouring elements, from the offset on."""
  terms, _ = terms_of(x)
  if sum(t is r for _, t in terms) != 1 or (1, r) not in terms or any(t is not r and r in t.toposort() for _, t in terms):
    return None
  return substitute(x, {r: UOp.const(r.dtype, 0)})


def linear_bounds(x: UOp) -> tuple[int, int] | None:
  """Bounds of sum(coef * node) + const (x's terms) computed without wrap-around; None when a term is not an integer."""
  terms, k = terms_of(x)
  lo = hi = k
  for coef, v in terms:
    a, b = coef * v.vmin, coef * v.vmax
    if not (isinstance(a, int) and isinstance(b, int)): return None
    lo, hi = lo + min(a, b), hi + max(a, b)
  return lo, hi
