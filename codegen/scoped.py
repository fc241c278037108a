"""What both renderers share: values emitted once per scope, sources before users.

A renderer keeps a stack of scopes (dicts from UOp to the emitted value: an
LLVM value or a C variable name). `value(u)` emits u and whatever it needs
that is not visible yet, into the innermost scope; a loop pushes a scope when
it opens and pops it when it closes, so a value computed inside a loop is not
reused after it. Subclasses provide `emit(u)` for one node.
"""
from __future__ import annotations

from typing import Any

from engine.ops import Ops
from engine.uop import UOp


class ScopedEmitter:
  scopes: list[dict[UOp, Any]]

  def emit(self, u: UOp) -> Any: raise NotImplementedError

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
