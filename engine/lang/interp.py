"""The reference matcher: walks the rule AST directly, with backtracking.

Slow and obvious on purpose. It shares nothing with the compiler but the
order commutative sources are tried in (child_orders), so a test comparing it
with the generated matchers checks the compiler, not a copy of itself.
"""
from __future__ import annotations

import operator
from typing import Any, Iterator

from rulec.engine.ir.dtypes import dtype_set
from rulec.engine.lang import ast as A
from rulec.engine.lang.capability import rule_attr
from rulec.engine.lang.bounded import CHECKED_BINOPS
from rulec.engine.lang.compiler import child_orders, pattern_ops
from rulec.engine.lang.names import BUILTINS, CONSTANT_NAMES
from rulec.engine.lang.runtime import RuleAbort, check_gradients, import_helper, not_a_node, rule_failed
from rulec.engine.ir.uop import UOp

_BINOPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
           "%": operator.mod, "@": operator.matmul, "**": operator.pow, "<<": operator.lshift, ">>": operator.rshift,
           "&": operator.and_, "|": operator.or_, "^": operator.xor}
_BINOPS.update(CHECKED_BINOPS)     # (the checked forms: engine/lang/bounded.py)
_CMPS = {"<": operator.lt, ">": operator.gt, "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge,
         "in": lambda a, b: a in b, "not in": lambda a, b: a not in b, "is": operator.is_, "is not": operator.is_not}


def _dt_ok(u: UOp, dts) -> bool:
  if dts is None: return True
  return any(u.dtype in (dtype_set(n) or ()) for n, _ in dts)


def match(p, u: UOp, env: dict[str, Any]) -> Iterator[dict[str, Any]]:
  """Every binding of pattern p against node u that extends env, in the compiler's order."""
  if isinstance(p, A.PName):
    if not _dt_ok(u, p.dtypes): return
    if p.name == "_": yield env; return
    if p.name in env:
      if env[p.name] is u: yield env
      return
    yield {**env, p.name: u}
    return
  if u.op not in pattern_ops(p) or not _dt_ok(u, p.dtypes): return
  if isinstance(p, A.PConst):
    if not (u.arg == p.value): return
    yield from _bind(p.name, u, env)
    return
  if p.each is not None:
    if not all(any(True for _ in match(p.each, s, {})) for s in u.src): return
  elif p.srcs is not None:
    if p.tail is None and len(u.src) != len(p.srcs): return
    if p.tail is not None and len(u.src) < len(p.srcs): return
  if p.has_arg and not (u.arg == p.arg): return
  for env1 in _bind(p.name, u, env):
    if p.tail not in (None, "any"): env1 = {**env1, p.tail: u.src[len(p.srcs):]}
    for order, restrict in child_orders(p):
      if restrict is not None and u.op not in restrict: continue
      yield from _match_children(list(zip(p.srcs or (), (u.src[i] for i in order))), env1)


def _bind(name, u, env):
  if name is None: yield env
  elif name in env:
    if env[name] is u: yield env
  else: yield {**env, name: u}


def _match_children(pairs, env):
  if not pairs: yield env; return
  (p, u), rest = pairs[0], pairs[1:]
  for env1 in match(p, u, env): yield from _match_children(rest, env1)


class Evaluator:
  """Evaluates guard and replacement ASTs with plain Python semantics."""
  def __init__(self, helpers: dict[str, tuple[str, str]]):
    self.helpers = {n: import_helper(*ref) for n, ref in helpers.items()}

  def __call__(self, e, env: dict[str, Any]) -> Any:
    ev = lambda x: self(x, env)  # noqa: E731
    if isinstance(e, A.EName):
      n = e.id
      if n in env: return env[n]
      if n in self.helpers: return self.helpers[n]
      if n in BUILTINS: return BUILTINS[n]
      return CONSTANT_NAMES[n]
    if isinstance(e, A.EConst): return e.value
    if isinstance(e, A.EAttr):
      # ctx is the caller's object (the checker allows its public attributes); everything else by type
      if isinstance(e.obj, A.EName) and e.obj.id == "ctx" and "ctx" in env: return getattr(env["ctx"], e.attr)
      return rule_attr(ev(e.obj), e.attr)
    if isinstance(e, A.ECall):
      args, kwargs = [], {}
      for a in e.args:
        if isinstance(a, A.EKeyword): kwargs[a.name] = ev(a.value)
        elif isinstance(a, A.EStarred):
          if a.double: kwargs.update(ev(a.value))
          else: args.extend(ev(a.value))
        else: args.append(ev(a))
      return ev(e.func)(*args, **kwargs)
    if isinstance(e, A.ESub): return ev(e.obj)[self.index(e.index, env)]
    if isinstance(e, A.ESeq):
      vals = [ev(x) for x in e.elts]
      return {"tuple": tuple, "list": list, "set": set}[e.kind](vals)
    if isinstance(e, A.EDict): return {ev(k): ev(v) for k, v in zip(e.keys, e.values)}
    if isinstance(e, A.EBin): return _BINOPS[e.op](ev(e.left), ev(e.right))
    if isinstance(e, A.EUnary):
      v = ev(e.operand)
      return {"not": operator.not_, "-": operator.neg, "+": operator.pos, "~": operator.invert}[e.op](v)
    if isinstance(e, A.EBool):
      v = None
      for x in e.values:
        v = ev(x)
        if (e.op == "and" and not v) or (e.op == "or" and v): return v
      return v
    if isinstance(e, A.ECompare):
      left = ev(e.left)
      for op, r in zip(e.ops, e.rights):
        right = ev(r)
        if not _CMPS[op](left, right): return False
        left = right
      return True
    if isinstance(e, A.ECond): return ev(e.body) if ev(e.test) else ev(e.orelse)
    if isinstance(e, A.EComp):
      if e.kind == "gen": return self._gen(e, env)
      items = list(self._gen(e, env))
      return {"list": list, "set": set, "dict": dict}[e.kind](items)
    raise TypeError(f"cannot evaluate {type(e).__name__}")

  def _gen(self, e: A.EComp, env):
    def loop(i, env1):
      if i == len(e.gens):
        yield (self(e.elt[0], env1), self(e.elt[1], env1)) if e.kind == "dict" else self(e.elt, env1)
        return
      g = e.gens[i]
      for item in self(g.iter, env1):
        if len(g.targets) == 1: env2 = {**env1, g.targets[0][0]: item}
        else: env2 = {**env1, **{t: v for (t, _), v in zip(g.targets, item)}}
        if all(self(c, env2) for c in g.ifs): yield from loop(i + 1, env2)
    return loop(0, env)

  def index(self, i, env):
    if isinstance(i, A.ESlice):
      return slice(*(None if x is None else self(x, env) for x in (i.lo, i.hi, i.step)))
    if isinstance(i, A.ESeq) and i.kind == "tuple": return tuple(self.index(x, env) for x in i.elts)
    return self(i, env)


class InterpretedMatcher:
  """Same contract as a compiled Matcher: rewrite(node, ctx) -> new node or None."""
  def __init__(self, rules: list[A.Rule], helpers_of):
    self.rules = rules
    self.evals = [Evaluator(helpers_of(r)) for r in rules]

  def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
    for rule, ev in zip(self.rules, self.evals):
      if u.op not in pattern_ops(rule.pattern): continue
      for env in match(rule.pattern, u, {}):
        env = {**env, "ctx": ctx}
        if rule.grad is not None: env[rule.grad] = ctx
        try:
          if rule.guard is not None and not ev(rule.guard, env): continue
          r = ev(rule.replacement, env)
        except RuleAbort: raise
        except Exception as e: rule_failed((rule.name, str(rule.span), rule.source_line), e)
        if rule.grad is not None:
          if r is not None: return check_gradients((rule.name, str(rule.span), rule.source_line), u, r)
        elif r is not None and r is not u:
          if r.__class__ is not UOp: not_a_node((rule.name, str(rule.span), rule.source_line), r)
          return r
    return None
