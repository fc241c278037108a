"""graph_rewrite: apply a rule set to a graph until nothing more fires.

Two traversal orders, as in the seeds:
- bottom_up=False (default): a node is rewritten after its sources, so rules
  see normalised operands (right for algebra such as the symbolic rules).
- bottom_up=True: a node is rewritten before its sources are visited, so
  rules see the original sources (right for passes that push information
  downwards, such as moving INDEX through movement ops).

Either way every node of the result is a fixed point: each rule was tried on
it and none fired. A shared subgraph is rewritten once (memo keyed by node
identity). A rewrite that returns to a node still being rewritten, or more
than `max_steps` rewrites, raises RewriteLoopError naming the rules involved.
"""
from __future__ import annotations

import collections
import os
from typing import Any, Callable

from rulec.engine.ir.uop import UOp


class RewriteLoopError(RuntimeError):
  pass


def _limit(n_nodes: int) -> int:
  env = os.environ.get("RULEC_REWRITE_LIMIT")
  return int(env) if env else max(100_000, 50 * n_nodes)


def graph_rewrite(sink: UOp, matcher: Any, ctx: Any = None, bottom_up: bool = False, max_steps: int | None = None,
                  memo: dict | None = None) -> UOp:
  """Rewrite `sink` with `matcher` (a Matcher or anything with .rewrite(node, ctx)) to a fixed point.

  `memo`, an empty dict when given, receives what each node of the graph (and each node a rewrite made on the
  way) became."""
  dispatch = getattr(matcher, "dispatch", None)
  if dispatch is not None:
    get = dispatch.get
    def rewrite(u: UOp):
      fn = get(u.op)
      return None if fn is None else fn(u, ctx)
  else:
    def rewrite(u: UOp): return matcher.rewrite(u, ctx)
  budget = _Budget(sink, max_steps)
  try:
    if bottom_up: return _pre_order(sink, rewrite, matcher, ctx, budget, {} if memo is None else memo)
    return _post_order(sink, rewrite, matcher, ctx, budget, {} if memo is None else memo,
                       None if dispatch is None else dispatch.get)
  except AttributeError as e:
    # a replacement built a node whose sources are not all nodes: name the rule, as for any other rule error
    if isinstance(getattr(e, "obj", None), UOp) or getattr(e, "name", None) not in ("src", "op"): raise
    raise _not_a_graph(matcher, ctx, budget.recent, e) from e


def rule_of(matcher, ctx, u: UOp) -> tuple[str, str] | None:
  """(name, location) of the rule that fires on u, for error messages; None when the matcher cannot say."""
  which = getattr(matcher, "which_rule", None)
  try: return which(u, ctx) if which is not None else None
  except Exception: return None


def rule_source(matcher, hit: tuple[str, str] | None) -> tuple[str, str, str]:
  """(name, location, source line) of the rule rule_of found, for a RuleRuntimeError."""
  if hit is None: return ("unknown", "?", "")
  lines = {(n, loc): text for n, loc, text in getattr(matcher, "rule_info", ())}
  return (hit[0], hit[1], lines.get(hit, ""))


def _not_a_graph(matcher, ctx, recent, e: AttributeError):
  hit = next((h for u in reversed(recent or ()) if (h := rule_of(matcher, ctx, u)) is not None), None)
  return RuleRuntimeError(rule_source(matcher, hit), TypeError(f"the replacement's graph has a {type(getattr(e, 'obj', None)).__name__} "
                                          "where a source node belongs"))


class RuleRuntimeError(RuntimeError):
  """A guard or replacement raised: names the rule and where it is. (Raised by the rule language's matchers;
  defined here because graph_rewrite raises it too, for a replacement that is not a graph.)"""
  def __init__(self, rule: tuple[str, str, str], cause: BaseException):
    self.rule_name, self.location, self.source = rule
    self.cause = cause
    super().__init__(f"rule '{self.rule_name}' at {self.location} failed: {type(cause).__name__}: {cause}\n"
                     f"    {self.source}")


class _Budget:
  """The rewrite step bound: 50 rewrites per node of the graph, counting the nodes the rewrite has finished so far
  as well as those it was given (a pass that expands the graph, rangeify's index for every context a value is
  read in, grows its budget with the graph it builds), sized only if a rewrite gets past FREE steps. A rule that
  loops makes new nodes without finishing any (each rewrite's result is rewritten again before its slot is done),
  so its budget stops growing and the loop is named; a rewrite back to a node being rewritten is named at once.
  RULEC_REWRITE_LIMIT (or max_steps) fixes the bound instead."""
  FREE = 100_000
  def __init__(self, sink: UOp, max_steps: int | None):
    env = os.environ.get("RULEC_REWRITE_LIMIT")
    self.sink, self.limit = sink, max_steps if max_steps is not None else int(env) if env else None
    self.fixed = self.limit is not None
    self.given = -1             # nodes of the graph given (counted when first needed)
    self.recent = None          # the traversal's recently rewritten nodes, for error messages
  def exceeded(self, steps: int, finished: int) -> bool:
    if self.fixed: return steps > self.limit
    if steps <= self.FREE: return False
    if self.given < 0: self.given = len(self.sink.toposort())
    self.limit = max(_limit(self.given), 50 * finished)
    return steps > self.limit


def _loop_error(matcher, ctx, recent, why: str) -> RewriteLoopError:
  counts = collections.Counter(h for u in recent if (h := rule_of(matcher, ctx, u)) is not None)
  named = ", ".join(f"'{n}' ({loc}) x{c}" for (n, loc), c in counts.most_common(5)) or "unknown rules"
  return RewriteLoopError(f"graph_rewrite did not reach a fixed point: {why}; rules that keep firing: {named}")


def _post_order(root: UOp, rewrite, matcher, ctx, budget: _Budget, done: dict[UOp, UOp], get=None) -> UOp:
  # get: the matcher's dispatch table's get, called here rather than through rewrite (one call less per node)
  pending: set[UOp] = set()               # nodes whose rewrite result is still being processed
  recent: collections.deque = collections.deque(maxlen=64)
  budget.recent = recent
  steps = 0
  stack: list[tuple[UOp, int, Any]] = [(root, 0, None)]
  push, pop = stack.append, stack.pop
  while stack:
    n, stage, extra = pop()
    if stage == 0:
      if n in done: continue
      push((n, 1, None))
      for s in reversed(n.src):
        if s not in done: push((s, 0, None))
    elif stage == 1:
      if n in done: continue
      src = n.src
      new_src = tuple([done[s] for s in src])
      if new_src == src: x = n   # tuple == compares items by identity first: cheap when nothing changed
      else:
        x = UOp(n.op, n.dtype, new_src, n.arg, n.tag)
        if x in done:            # the rebuilt node was met (and finished) elsewhere
          done[n] = done[x]
          continue
      if get is not None:
        fn = get(x.op)
        r = None if fn is None else fn(x, ctx)
      else: r = rewrite(x)
      if r is None:
        done[n] = x
        if x is not n: done[x] = x
        continue
      steps += 1
      recent.append(x)
      if budget.exceeded(steps, len(done)): raise _loop_error(matcher, ctx, recent, f"more than {budget.limit} rewrites")
      if r in pending or r is n or r is x:
        raise _loop_error(matcher, ctx, recent, f"a rewrite of {x.op.name} led back to a node being rewritten")
      if r in done:
        done[n] = done[r]
        continue
      pending.add(n)
      push((n, 2, (r, x)))
      push((r, 0, None))
    else:
      r, x = extra
      pending.discard(n)
      done[n] = done[x] = done[r]
  return done[root]


def _pre_order(root: UOp, rewrite, matcher, ctx, budget: _Budget, done: dict[UOp, UOp]) -> UOp:
  # (no set of the nodes met per node unless a rule fires on it: most nodes are left as they are, and a set each
  # cost every node of every kernel's pass an allocation)
  pending: set[UOp] = set()
  recent: collections.deque = collections.deque(maxlen=64)
  budget.recent = recent
  steps = 0
  stack: list[tuple[UOp, int, Any]] = [(root, 0, None)]
  while stack:
    n, stage, extra = stack.pop()
    if stage == 0:
      if n in done: continue
      x, seen = n, None
      while (r := rewrite(x)) is not None:
        steps += 1
        recent.append(x)
        if budget.exceeded(steps, len(done)): raise _loop_error(matcher, ctx, recent, f"more than {budget.limit} rewrites")
        if seen is None: seen = {n}
        if r in seen or r in pending:
          raise _loop_error(matcher, ctx, recent, f"a rewrite of {x.op.name} led back to a node being rewritten")
        seen.add(r)
        x = r
        if x in done: break
      if x in done:
        done[n] = done[x]
        continue
      pending.add(n)
      stack.append((n, 1, x))
      for s in reversed(x.src):
        if s not in done: stack.append((s, 0, None))
    elif stage == 1:
      x = extra
      new_src = tuple([done[s] for s in x.src])
      if new_src == x.src:   # (tuple == compares items by identity first; a UOp equals only itself)
        pending.discard(n)
        done[n] = x
        if x is not n: done[x] = x
        continue
      y = UOp(x.op, x.dtype, new_src, x.arg, x.tag)
      if y in done:
        pending.discard(n)
        done[n] = done[y]
        continue
      stack.append((n, 2, y))
      stack.append((y, 0, None))
    else:
      pending.discard(n)
      done[n] = done[extra]
  return done[root]


def substitute(sink: UOp, mapping: dict[UOp, UOp], memo: dict[UOp, UOp] | None = None,
               frozen: Callable[[UOp], bool] | None = None) -> UOp:
  """`sink` with every node in `mapping` replaced (replacements are not rewritten again).

  `memo` (node -> its substitute) may be shared by calls over graphs that share nodes: each is rebuilt once.
  A node `frozen(node)` is true for stays as it is, with everything below it."""
  done: dict[UOp, UOp] = {} if memo is None else memo
  if sink in done: return done[sink]
  # (the plain call walks the whole graph ungated: the gate costs a call per node)
  gate = None if memo is None and frozen is None else \
    (lambda x: x not in done and x not in mapping and not (frozen is not None and frozen(x)))
  for u in sink.toposort(gate=gate):
    if u in done: continue
    if u in mapping: done[u] = mapping[u]; continue
    if frozen is not None and frozen(u): done[u] = u; continue
    new_src = tuple(done[s] for s in u.src)
    done[u] = u if all(a is b for a, b in zip(u.src, new_src)) else UOp(u.op, u.dtype, new_src, u.arg, u.tag)
  return done[sink]
