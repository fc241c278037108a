"""What both renderers share: values emitted once per scope, sources before users.

A renderer keeps a stack of scopes (dicts from UOp to the emitted value: an
LLVM value or a C variable name). `value(u)` emits u and whatever it needs
that is not visible yet, into the innermost scope; a loop pushes a scope when
it opens and pops it when it closes, so a value computed inside a loop is not
reused after it. Subclasses provide `emit(u)` for one node.

Lanes (the optimizer's `upcast` ranges, codegen/opt): the value of a store is
emitted once per lane, each lane in a scope of its own with the upcast ranges
set to its constants (`lane_value`), and every REDUCE computes all lanes'
results in one loop nest (`lane_reduce`), which each lane then takes its own of.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

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
    self.ups, self.lane_results, self.lane = dict(ups), {}, ()
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

  def lane_reduce(self, u: UOp, reduce_all: Callable[[UOp, list], list]) -> Any:
    """This lane's result of REDUCE u; the first lane to ask computes every lane's with reduce_all(u, lanes),
    with the asking lane's scope set aside (what it holds may depend on the upcast ranges)."""
    if u not in self.lane_results:
      outer, scope = self.lane, self.scopes.pop()
      self.lane_results[u] = dict(zip(self.lanes, reduce_all(u, self.lanes)))
      self.scopes.append(scope)
      self.set_lane(outer)
    return self.lane_results[u][self.lane]

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
