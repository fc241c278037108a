"""What both renderers share: values emitted once per scope, sources before users.

A renderer keeps a stack of scopes (dicts from UOp to the emitted value: an
LLVM value or a C variable name). `value(u)` emits u and whatever it needs
that is not visible yet, into the innermost scope; a loop pushes a scope when
it opens and pops it when it closes, so a value computed inside a loop is not
reused after it. Subclasses provide `emit(u)` for one node.

Lanes (the optimizer's `upcast` ranges, codegen/opt): the value of a store is
emitted once per lane, each lane in a scope of its own with the upcast ranges
set to its constants (`lane_value`), and every REDUCE computes all lanes'
results in one loop nest (`lane_reduce`), which each lane then takes its own of (kept, under the key ("lanes", u),
in the scope around the lanes).
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

from rulec.codegen.online import held_factor, running_max
from rulec.codegen.opt.transform import free_ranges
from rulec.engine.ir.alu import identity_element
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp


class ScopedEmitter:
  """Subclasses call set_lanes (with {} for none) before emitting."""
  scopes: list[dict[UOp, Any]]
  ranges: dict[UOp, Any]
  ups: dict[UOp, int]              # upcast range -> lanes
  lanes: list[tuple[int, ...]]     # one index per upcast range, for every lane
  lane: tuple[int, ...]            # the lane being emitted
  _running: bool | None = None     # the kernel holds a RUNMAX (None: not looked yet)

  def emit(self, u: UOp) -> Any: raise NotImplementedError
  def lane_value(self, i: int) -> Any: raise NotImplementedError

  # *** a reduce over a Variable's size ***
  def guard_end(self, red: UOp, kinds: tuple[str, ...]) -> UOp | None:
    """e for a one-range reduce of WHERE(r < e, v, identity) whose e holds a Variable and reads nothing the loop
    opens (a reduce over a Variable's size: engine/ir/uop.py's UOp.r masks it, rules/symbolic.rules
    lt_add_invariant puts the guard in this form): the renderer may end the loop at min(max(e, 0), size) and
    emit v alone. None for any other reduce, or a range of a kind not in `kinds`."""
    value, rngs = red.src[0], red.src[1:]
    if len(rngs) != 1 or value.op is not Ops.WHERE or value.src[2].op is not Ops.CONST: return None
    r, cond = rngs[0], value.src[0]
    if cond.op is not Ops.CMPLT or cond.src[0] is not r or value.src[2].arg != identity_element(red.arg, red.dtype): return None
    if not (isinstance(r.arg, tuple) and str(r.arg[1]).split(":")[0] in kinds and isinstance(r.src[0].arg, int)): return None
    e = cond.src[1]
    nodes = e.toposort()
    if any(n.op in (Ops.RANGE, Ops.INDEX, Ops.REDUCE) and n not in self.ranges for n in nodes): return None
    return e if any(n.op is Ops.DEFINE_VAR for n in nodes) else None

  # *** lanes ***
  def set_lanes(self, ups: dict[UOp, int]) -> None:
    self.ups, self.lane = dict(ups), ()
    self.lanes = list(itertools.product(*[range(n) for n in self.ups.values()])) if ups else [()]

  def each_lane(self):
    """Every lane in turn, each entered in a scope of its own for the caller's body (a kernel without upcast
    ranges has one lane and no extra scope)."""
    for lane in self.lanes:
      if self.ups: self.enter_lane(lane)
      yield lane
      if self.ups: self.scopes.pop()

  def set_lane(self, lane: tuple[int, ...]) -> None:
    self.lane = lane
    for r, i in zip(self.ups, lane): self.ranges[r] = self.lane_value(i)

  def enter_lane(self, lane: tuple[int, ...]) -> None:
    """A scope of its own for one lane: values that depend on the upcast ranges differ between lanes."""
    self.scopes.append({})
    self.set_lane(lane)

  def every_lanes_reduce(self, red: UOp) -> None:
    """REDUCE red computed now for every lane, its results kept in the scope around the lanes (what lane_reduce
    does when the first lane asks), so that code emitted later, in branches or loops of its own, shares them."""
    if not self.ups:
      self.value(red)
      return
    self.enter_lane(self.lanes[0])
    self.value(red)
    self.scopes.pop()

  def lane_reduce(self, u: UOp, reduce_all: Callable[[UOp, list], list]) -> Any:
    """This lane's result of REDUCE u; the first lane to ask computes every lane's with reduce_all(u, lanes),
    with the asking lane's scope set aside (what it holds may depend on the upcast ranges)."""
    results = self.lookup(("lanes", u))
    if results is None:
      outer, scope = self.lane, self.scopes.pop()
      # (only the lanes that differ in the upcast ranges u depends on: a score that depends on a tile's row, not on
      # its column, is one sum per row, not one per lane)
      key = self.lane_key(u)
      firsts = list({key(lane): lane for lane in reversed(self.lanes)}.values())[::-1]
      got = dict(zip(map(key, firsts), reduce_all(u, firsts)))
      # (kept in the scope around the lanes: computed inside a loop, the results are that loop's)
      results = self.scopes[-1][("lanes", u)] = {lane: got[key(lane)] for lane in self.lanes}
      self.scopes.append(scope)
      self.set_lane(outer)
    return results[self.lane]

  def lane_key(self, u: UOp) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """A lane's indices in the upcast ranges u depends on: lanes with the same key have the same value of u."""
    nodes = set(u.toposort())
    dep = [i for i, r in enumerate(self.ups) if r in nodes]
    return lambda lane: tuple(lane[i] for i in dep)

  def lookup(self, u: UOp) -> Any:
    for sc in reversed(self.scopes):
      if u in sc: return sc[u]
    return None

  def value(self, u: UOp) -> Any:
    got = self.lookup(u)
    if got is not None: return got
    # post-order without recursion; a REDUCE opens its own loops, so it is emitted on its own
    stack = [(u, False)]
    while stack:
      x, ready = stack.pop()
      if self.lookup(x) is not None: continue
      if ready or x.op is Ops.REDUCE or not x.src or x.op is Ops.RANGE:
        self.scopes[-1][x] = self.emit(x)
        continue
      stack.append((x, True))
      for s in (x.src[1:] if x.op is Ops.INDEX else x.src):   # a PARAM is a pointer, not a value
        if self.lookup(s) is None: stack.append((s, False))
    return self.lookup(u)

  # *** sums with a running max (rules/online.rules): what both renderers' one-pass loops share ***
  def running_plan(self, u: UOp, run: UOp) -> RunningPlan:
    """The sums one loop computes with u (every sum over u's range with the same running max that no scope holds
    yet: the row's sum beside the products with v), the factor of u's terms that holds the max, and each one's lane
    key; the reduces in their terms that do not run over the range are computed first (every lane's), not at each
    step of the loop. Every lane of the kernel takes part (the other sums may depend on more than u)."""
    r, many = u.src[1], bool(self.ups)
    lanes = self.lanes if many else [()]
    open_ = set(self.ranges) | set(self.ups)
    sums = [u] + [x for x in self.k.ast.toposort() if x.op is Ops.REDUCE and x is not u and len(x.src) == 2
                  and x.src[1] is r and self.lookup(("lanes", x)) is None and self.lookup(x) is None
                  and running_max(x) is run and free_ranges(x) <= open_]
    held = held_factor(u.src[0], run)
    keys = {x: (self.lane_key(x) if many else (lambda lane: ())) for x in (run, held, *sums)}
    for x in dict.fromkeys(y for sm in sums for y in sm.src[0].toposort()):
      if x.op is Ops.REDUCE and free_ranges(x) <= open_ and self.lookup(x) is None: self.every_lanes_reduce(x)
    return RunningPlan(run, held, sums, keys, lanes, many)

  def running_of(self, u: UOp) -> UOp | None:
    """The RUNMAX u sums with (a one-pass sum), or None; a kernel without one is not searched per reduce."""
    if self._running is None: self._running = any(x.op is Ops.RUNMAX for x in self.k.ast.toposort())
    return running_max(u) if self._running else None

  def running_scores(self, plan: RunningPlan):
    """(lane key, the scores at this step) once per group of lanes with the same scores."""
    for k, lane in plan.groups(plan.run).items():
      if plan.many: self.enter_lane(lane)
      t = self.value(plan.run.src[0])
      if plan.many: self.scopes.pop()
      yield k, t

  def running_terms(self, plan: RunningPlan, safe: dict):
    """(sum, lane key, its term at this step) for every sum of the loop: the factor holding the max computed once per
    group of lanes with the same scores, with the max so far (`safe`, per scores' key) in the running max's place,
    and each sum's terms with that factor."""
    run, held, keys = plan.run, plan.held, plan.keys
    factor = {}
    for k, lane in plan.groups(held).items():
      if plan.many: self.enter_lane(lane)
      self.scopes[-1][run] = safe[keys[run](lane)]
      factor[k] = self.value(held)
      if plan.many: self.scopes.pop()
    for sm in plan.sums:
      for sk, lane in plan.groups(sm).items():
        if plan.many: self.enter_lane(lane)
        self.scopes[-1][run] = safe[keys[run](lane)]
        self.scopes[-1][held] = factor[keys[held](lane)]
        v = self.value(sm.src[0])
        if plan.many: self.scopes.pop()
        yield sm, sk, v

  def running_results(self, plan: RunningPlan, asked: list, done: dict) -> list:
    """done: each sum's value per lane key. The other sums' values go to the current scope (per lane where there are
    lanes); returns u's for the `asked` lanes."""
    per_lane = {sm: {lane: done[sm][plan.keys[sm](lane)] for lane in plan.lanes} for sm in plan.sums}
    for sm in plan.sums[1:]:
      if plan.many: self.scopes[-1][("lanes", sm)] = per_lane[sm]
      else: self.scopes[-1][sm] = per_lane[sm][()]   # (where u's value is kept: the same loops)
    return [per_lane[plan.sums[0]][lane] for lane in asked]


class RunningPlan:
  """running_plan's answer: the running max, the factor of the terms holding it, the sums of one loop (the asked one
  first), each one's lane key, the kernel's lanes, whether there are lanes."""
  def __init__(self, run: UOp, held: UOp, sums: list[UOp], keys: dict, lanes: list, many: bool):
    self.run, self.held, self.sums, self.keys, self.lanes, self.many = run, held, sums, keys, lanes, many

  def groups(self, x: UOp) -> dict:
    """x's lane key -> the first lane with it."""
    return {self.keys[x](lane): lane for lane in reversed(self.lanes)}

  def rescaled(self, k) -> list[tuple[UOp, tuple]]:
    """(sum, lane key) of every partial sum whose scores have key k: what a growth of that max rescales."""
    return [(sm, sk) for sm in self.sums for sk, first in self.groups(sm).items() if self.keys[self.run](first) == k]
