"""Sums over a softmax's row in one pass (rules/online.rules): the helper that finds, in a scheduled kernel, a
float sum over a range r whose terms are exp2(E) * rest, where E holds the max M of the same scores over a range of
r's size (a fused `softmax(q @ k.T) @ v`: the row's max in its own loop, then the sum of the exponentials, then the
product with v, each recomputing the scores), and E is affine in M with a negative coefficient -a. Such a sum does
not need M before it starts: with m the max of the scores seen so far, each term computed with m in place of M is
exp2(a * (M - m)) times too large, so whenever m grows to m', what was summed is multiplied by exp2(a * (m - m'))
(FlashAttention's running max). The helper puts RUNMAX(scores, r) (arg a) in M's place; the renderers
(codegen/llvmir.py, codegen/opencl.py) compute the sum in that one pass, and the separate max loop is gone.

Why the rewrite keeps the value: the sum's terms depend on M only through exp2(E) = exp2(E0 - a * M), E0 free of
M, so sum_j exp2(E_j) rest_j = exp2(-a * M) * sum_j exp2(E0_j) rest_j for any M: the running form computes the same
sum with the rescalings in another order (float reassociation), the max keeping every exponent at or below 0
as the two-pass form does. The edge cases match the two-pass form: a row whose scores are all -inf sums NaN
(exp2(-inf - -inf)), as the two-pass form does; a NaN or +inf score makes the sum NaN.
"""
from __future__ import annotations

import math

from rulec.codegen.decomp import checked_rewrite
from rulec.codegen.opt.transform import renamed_reduce
from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.kernel import Kernel
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import substitute
from rulec.engine.ir.uop import UOp
from rulec.engine.lang.capability import rule_helper


def online(kernel: Kernel) -> Kernel:
  """The kernel after rules/online.rules, validated (a node no kernel may hold is blamed on the rule that built it).
  Their ctx: the row maxes a running max may replace (`removable_maxes`)."""
  nodes = kernel.ast.toposort()
  if not any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in nodes): return kernel
  allowed = removable_maxes(kernel.ast)
  if not allowed: return kernel
  return checked_rewrite(kernel, "online", allowed)


def removable_maxes(ast: UOp) -> frozenset[UOp]:
  """The row maxes of a kernel that only sums a running max can take read (through their exp2 terms), and whose
  every copy (the same max over loops of its own) is such: replacing them removes the loops that computed them. A
  softmax's max that the kernel also reads per element (exp(x - max) / sum) is computed anyway, and its sum is
  left as it is: a one-pass sum over a row is a loop of branches, slower than a vectorised sum after the max."""
  users: dict[UOp, list[UOp]] = {}
  order = ast.toposort()
  for u in order:
    for x in u.src: users.setdefault(x, []).append(u)
  ok: set[UOp] = set()
  for red in order:
    if (found := _running_parts(red)) is None: continue
    m, has_m = found
    if all(w in has_m for w in users.get(m, [])): ok.add(m)
  groups: dict[UOp, list[UOp]] = {}
  for u in order:
    if u.op is Ops.REDUCE and u.arg is Ops.MAX: groups.setdefault(renamed_reduce(u), []).append(u)
  return frozenset(m for copies in groups.values() if all(c in ok for c in copies) for m in copies)


@rule_helper
def running_sum(red: UOp, allowed: frozenset | None = None) -> UOp | None:
  """`red` (a REDUCE) with the row max in its terms replaced by a running max (RUNMAX), or None where it is not a
  float sum over one range whose terms are exp2(E) * (factors free of the max), E affine in the max with a
  negative constant coefficient. `allowed`: the maxes that may be replaced (removable_maxes; None: any)."""
  found = _running_parts(red, allowed)
  if found is None: return None
  m, has_m = found
  value, r = red.src
  e = next(f for f in _factors(value) if f in has_m).src[0]
  scores = _scores_in(e, m, r, has_m)
  run = UOp(Ops.RUNMAX, m.dtype, (scores, r), float(-_coefficient(e, m, has_m)))
  return _merged(red.replace(src=(substitute(value, {m: run}), r)), run)


def _running_parts(red: UOp, allowed: frozenset | None = None) -> tuple[UOp, set[UOp]] | None:
  """(the row max m, the nodes of red's terms that hold m) where red sums exp2(E) * (factors free of m) over one
  range, E affine in m with a negative constant coefficient; None otherwise."""
  # (float32 and float64: a float16 value reaches the CPU renderer as its bits)
  if red.op is not Ops.REDUCE or red.arg is not Ops.ADD or len(red.src) != 2 or red.dtype not in (dtypes.float32, dtypes.float64):
    return None
  value, r = red.src
  if r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST or r.src[0].arg < 1: return None
  factors = _factors(value)
  for m in _row_maxes(value, r):
    if allowed is not None and m not in allowed: continue
    has_m = _containing(value, m)
    holding = [f for f in factors if f in has_m]
    if len(holding) != 1 or holding[0].op is not Ops.EXP2: continue
    c = _coefficient(holding[0].src[0], m, has_m)
    if c is None or not (c < 0 and math.isfinite(c)): continue
    return m, has_m
  return None


def _merged(red: UOp, run: UOp) -> UOp:
  """red, where a factor of its terms that does not depend on its range holds the row's sum of the same
  exponentials over a range of its own (softmax's 1 / sum in the numerator of softmax(...) @ v): that sum made a sum
  over red's range of the very exponential red's terms hold, and the factors that do not depend on the range taken
  out of the sum (sum_j e_j * s * v_j = s * sum_j e_j * v_j). Both sums then run over one range with one running
  max, which the renderers compute in one loop (two accumulators); otherwise red as it is."""
  value, r = red.src
  held = held_factor(value, run)
  want = renamed_reduce(held)
  factors = _factors(value)
  outside = [f for f in factors if r not in f.toposort()]
  swap: dict[UOp, UOp] = {}
  for f in outside:
    for x in f.toposort():
      if x.op is not Ops.REDUCE or x.arg is not Ops.ADD or len(x.src) != 2 or x.dtype is not held.dtype: continue
      other = x if running_max(x) is not None else running_sum(x)
      if other is None or (mine := running_max(other)) is None: continue
      if renamed_reduce(substitute(other.src[0], {other.src[1]: r, mine: substitute(mine, {mine.src[1]: r})})) is want:
        swap[x] = UOp(Ops.REDUCE, held.dtype, (held, r), Ops.ADD)
  if not swap: return red
  inside = [f for f in factors if f not in outside]
  out = red.replace(src=(_product(inside), r))
  return _product([out] + [substitute(f, swap) for f in outside])


def _product(xs: list[UOp]) -> UOp:
  out = xs[0]
  for x in xs[1:]: out = UOp(Ops.MUL, out.dtype, (out, x))
  return out


def running_max(red: UOp) -> UOp | None:
  """For a renderer: the RUNMAX over `red`'s range in its terms (red then sums in one pass), or None."""
  if red.op is not Ops.REDUCE or len(red.src) != 2: return None
  r, out, seen, todo = red.src[1], None, set(), [red.src[0]]
  while todo:
    x = todo.pop()
    if x in seen: continue
    seen.add(x)
    if x.op is Ops.RUNMAX and x.src[1] is r: out = x
    elif x.op is not Ops.RUNMAX: todo += x.src
  return out


def held_factor(value: UOp, run: UOp) -> UOp:
  """The part of a running sum's terms that holds its RUNMAX (exp2 of the scores less the max): down a product
  tree through the one side that holds it, to a node that is not a product or whose sides both hold it."""
  while value.op is Ops.MUL:
    holding = [s for s in value.src if run in s.toposort()]
    if len(holding) != 1: break
    value = holding[0]
  return value


def _factors(v: UOp) -> list[UOp]:
  """The factors of a product tree, left to right (v itself when it is not a MUL)."""
  if v.op is not Ops.MUL: return [v]
  return _factors(v.src[0]) + _factors(v.src[1])


def _row_maxes(value: UOp, r: UOp) -> list[UOp]:
  """The float MAX reduces in `value` (not inside another reduce of it) over one range of r's size, that depend
  neither on r nor on a range a reduce inside `value` closes: the row max of the scores this sum runs over."""
  out, seen, todo = [], set(), [value]
  while todo:
    x = todo.pop()
    if x in seen: continue
    seen.add(x)
    if x.op is Ops.REDUCE:
      if x.arg is Ops.MAX and len(x.src) == 2 and x.src[1].op is Ops.RANGE and x.src[1].src[0] is r.src[0] \
         and x.dtype.kind == "f" and r not in x.toposort(): out.append(x)
      continue   # (a reduce's own terms run in its loop, not in this one)
    todo += x.src
  return out


def _containing(root: UOp, m: UOp) -> set[UOp]:
  """The nodes of root whose value depends on m (m included)."""
  has: set[UOp] = set()
  for x in root.toposort():
    if x is m or any(s in has for s in x.src): has.add(x)
  return has


def _coefficient(e: UOp, m: UOp, has_m: set[UOp]) -> float | None:
  """The constant c with e = c * m + (terms free of m), or None where e is not affine in m that way."""
  if e is m: return 1.0
  if e not in has_m: return 0.0
  if e.op in (Ops.ADD, Ops.SUB):
    a, b = (_coefficient(s, m, has_m) for s in e.src)
    if a is None or b is None: return None
    return a + b if e.op is Ops.ADD else a - b
  if e.op is Ops.NEG:
    a = _coefficient(e.src[0], m, has_m)
    return None if a is None else -a
  if e.op in (Ops.MUL, Ops.FDIV):
    x, k = e.src
    if e.op is Ops.MUL and x.op is Ops.CONST: x, k = k, x
    if k.op is not Ops.CONST or k in has_m or not isinstance(k.arg, (int, float)) or not math.isfinite(k.arg): return None
    a = _coefficient(x, m, has_m)
    if a is None: return None
    if e.op is Ops.MUL: return a * k.arg
    return a / k.arg if k.arg != 0 else None
  return None


def _scores_in(e: UOp, m: UOp, r: UOp, has_m: set[UOp]) -> UOp:
  """The scores at r's step: m's own value over its range, with that range named r. Where e computes the same
  (its loops named otherwise), e's node, so that the running max and the term share one computation."""
  scores = substitute(m.src[0], {m.src[1]: r})
  want = renamed_reduce(scores)
  for x in e.toposort():
    if x not in has_m and x.dtype is scores.dtype and r in x.toposort() and renamed_reduce(x) is want: return x
  return scores


__all__ = ["held_factor", "online", "removable_maxes", "running_max", "running_sum"]
