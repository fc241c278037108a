"""Rewrite throughput: rulec's compiled `symbolic` matcher vs tinygrad 0.14's PatternMatcher.

Both engines get the same work: thousands of random index expressions
(engine.index_expr recipes) under one SINK, rewritten once to a fixed point
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
import sys
import time
from pathlib import Path

# `python bench/matcher.py` puts bench/ on sys.path, not the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.index_expr import build, evaluate, leaf_values, leaves_of, random_recipe  # noqa: E402
from engine.lang.loader import load_library  # noqa: E402
from engine.ops import Ops as ROps  # noqa: E402
from engine.rewrite import graph_rewrite as rulec_graph_rewrite  # noqa: E402
from engine.uop import UOp as RUOp  # noqa: E402
from engine.uop import _ucache as RULEC_UCACHE  # noqa: E402

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
# - Helpers (fold, bounds_const) follow engine/sched/symbolic_helpers.py:
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
  """engine.sched.symbolic_helpers.no_wrap: the exact sum of x's terms fits x's dtype (int64 for index)."""
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
  """engine.sched.symbolic_helpers.divmod_parts, step for step, on tinygrad UOps (same term order)."""
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
  if lo < 0 or hi >= c or xlo < _I64[0] or xhi > _I64[1]: return None
  if not div: return sum(((v if r == 1 else v * r) for q, r, v in parts if r), x.const_like(rk))
  return sum(((v if q == 1 else v * q) for q, r, v in parts if q), x.const_like(qk))


def _add(a, b): return UPat(TOps.ADD, src=[a, b])
def _mul(a, b): return UPat(TOps.MUL, src=[a, b])
def _idiv(a, b): return UPat(TOps.FLOORDIV, src=(a, b))
def _mod(a, b): return UPat(TOps.FLOORMOD, src=(a, b))


_x, _y, _xi = UPat.var("x"), UPat.var("y"), UPat.var("x", INTS)
_c, _c1, _c2 = UPat.cvar("c"), UPat.cvar("c1"), UPat.cvar("c2")
_zero, _one = UPat.const(0), UPat.const(1)

tinygrad_symbolic = PatternMatcher([
  # symbolic_fold
  (UPat(GroupOp.ALU, name="a", src=UPat(TOps.CONST)), tg_fold_constants),                          # fold_alu
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
  (_idiv(_xi, _c), lambda x, c: tg_divmod_parts(x, c.arg, True) if c.arg > 0 else None),             # fold_div_parts
  (_mod(_xi, _c), lambda x, c: tg_divmod_parts(x, c.arg, False) if c.arg > 0 else None),             # fold_mod_parts
  # value bounds decide
  (_idiv(_x, _c), lambda x, c: x.const_like(0) if c.arg > 0 and 0 <= x.vmin and x.vmax < c.arg else None),  # div_small
  (_mod(_x, _c), lambda x, c: x if c.arg > 0 and 0 <= x.vmin and x.vmax < c.arg else None),                 # mod_small
  (UPat(TOps.CMPLT, src=(_x, _c)),                                                                   # lt_bounds
   lambda x, c: UOp.const(x.vmax < c.arg, tdtypes.bool) if x.vmax < c.arg or x.vmin >= c.arg else None),
  (UPat(TOps.MAX, src=[_x, _y]), lambda x, y: x if not tdtypes.is_float(x.dtype) and x.vmin >= y.vmax else None),  # max_bounds
  (UPat(GroupOp.All, dtype=tdtypes.weakint, name="x"), tg_bounds_const),                             # single_value
])

# *** the same recipes in both IRs ***


def tinygrad_build(recipe: tuple) -> UOp:
  """engine.index_expr.build, for tinygrad: weakint is tinygrad's index dtype."""
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
