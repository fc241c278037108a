"""The matcher compiler: a list of checked rules -> Python source.

The generated module has one function per root op and a DISPATCH dict. Each
function is a decision tree: consecutive rules (and commutative variants) that
share a test are put under one `if`, so a test common to many rules runs once,
while the first rule in file order that matches still wins.

With stats=True, each rule gets its own function instead and the dispatch
functions count attempts, matches and time per rule; the normal matcher
carries no instrumentation at all.
"""
from __future__ import annotations

import itertools
from typing import Any

from rulec.engine.ir.dtypes import dtype_set
from rulec.engine.lang import ast as A
from rulec.engine.lang.limits import MAX_IF_DEPTH
from rulec.engine.lang.bounded import CHECKED_BINOPS
from rulec.engine.lang.capability import CTX, allowed_attrs, comprehension_scope, pattern_tails, static_type
from rulec.engine.lang.names import BUILTINS, CONSTANT_NAMES
from rulec.engine.ir.ops import COMMUTATIVE, GROUPS, OPS_BY_NAME, Ops, op_set
from rulec.engine.ir.uop import UOp

ALL_OPS = frozenset(Ops)


class Variant:
  """One way a rule's pattern can match: the tests to pass, and where each name lives."""
  __slots__ = ("tests", "binds")
  def __init__(self, tests: tuple, binds: dict[str, str]): self.tests, self.binds = tests, binds


def pattern_ops(p) -> frozenset[Ops]:
  if isinstance(p, A.PName): return ALL_OPS
  if isinstance(p, A.PConst): return frozenset({Ops.CONST})
  out: set[Ops] = set()
  for name, _ in p.ops: out |= op_set(name) or set()
  return frozenset(out)


def _dtypes(dts) -> frozenset | None:
  if dts is None: return None
  out: set = set()
  for name, _ in dts: out |= dtype_set(name) or set()
  return frozenset(out)


def child_orders(p) -> list[tuple[tuple[int, ...], frozenset | None]]:
  """Source orders to try for a node pattern: (order, extra op restriction). Shared with the interpreter."""
  n = len(p.srcs or ())
  ident = (tuple(range(n)), None)
  if not isinstance(p, A.PNode) or n != 2 or p.tail is not None or p.each is not None: return [ident]
  ops = pattern_ops(p)
  comm = ops & COMMUTATIVE
  if not comm: return [ident]
  return [ident, ((1, 0), None if comm == ops else comm)]


def src_expr(path: str) -> str:
  """Python for the source tuple of the node at `path` (the root's is hoisted into a local)."""
  return "s_" if path == "n" else f"{path}.src"


def lower(p, path: str, depth: int = 0) -> list[Variant]:
  """All variants of pattern p rooted at `path` (a Python expression)."""
  tests: list = []
  binds: dict[str, str] = {}
  if isinstance(p, A.PName):
    if (d := _dtypes(p.dtypes)) is not None: tests.append(("dtype", path, d))
    if p.name != "_": binds[p.name] = path
    return [Variant(tuple(tests), binds)]
  if isinstance(p, A.PConst):
    tests += [("op", path, frozenset({Ops.CONST})), ("arg", path, type(p.value), p.value)]
    if (d := _dtypes(p.dtypes)) is not None: tests.append(("dtype", path, d))
    if p.name is not None: binds[p.name] = path
    return [Variant(tuple(tests), binds)]
  ops = pattern_ops(p)
  if ops != ALL_OPS: tests.append(("op", path, ops))
  if p.each is not None:
    sub = lower(p.each, f"e{depth}", depth + 1)
    tests.append(("each", path, tuple(v.tests for v in sub)))
  elif p.srcs is not None:
    tests.append(("len", path, "==" if p.tail is None else ">=", len(p.srcs)))
  if (d := _dtypes(p.dtypes)) is not None: tests.append(("dtype", path, d))
  if p.has_arg: tests.append(("arg", path, type(p.arg), p.arg))
  if p.name is not None: binds[p.name] = path
  if p.tail not in (None, "any"): binds[p.tail] = f"{src_expr(path)}[{len(p.srcs)}:]"
  out: list[Variant] = []
  for order, restrict in child_orders(p):
    pre = tests + ([("op", path, restrict)] if restrict is not None else [])
    per_child = [lower(c, f"{src_expr(path)}[{order[k]}]", depth) for k, c in enumerate(p.srcs or ())]
    for combo in itertools.product(*per_child):
      t, b = list(pre), dict(binds)
      same: list = []
      for v in combo:
        t += v.tests
        for name, where in v.binds.items():
          if name in b: same.append(("same", b[name], where))
          else: b[name] = where
      out.append(Variant(tuple(t + same), b))
  # a variant identical to an earlier one (e.g. `x + x` swapped) adds nothing
  uniq: list[Variant] = []
  for v in out:
    if not any(u.tests == v.tests and u.binds == v.binds for u in uniq): uniq.append(v)
  return uniq


def literal_code(v: Any) -> str:
  """Python source that rebuilds constant v (so generated modules are self-contained)."""
  from rulec.engine.ir.dtypes import DType
  if isinstance(v, Ops): return f"Ops.{v.name}"
  if isinstance(v, DType): return f"dtypes.{v.name}"
  if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))): return f"float({str(v)!r})"
  if v is None or isinstance(v, (bool, int, float, str)): return repr(v)
  if isinstance(v, tuple): return "(" + "".join(literal_code(x) + ", " for x in v) + ")"
  if isinstance(v, frozenset):
    return "frozenset({" + ", ".join(sorted(literal_code(x) for x in v)) + "})" if v else "frozenset()"
  raise TypeError(f"cannot embed {type(v).__name__} constant {v!r} in a generated matcher")


class _Emitter:
  """Collects the constants and names a generated module needs, as preamble source lines."""
  def __init__(self):
    self.preamble: dict[str, str] = {}
    self.const_names: dict[str, str] = {}

  def const(self, value: Any, prefix: str = "K") -> str:
    code = literal_code(value)
    if code in self.const_names: return self.const_names[code]
    name = f"{prefix}{len(self.const_names)}"
    self.const_names[code] = name
    self.preamble[name] = code
    return name

  def op(self, o: Ops) -> str:
    self.preamble[f"O_{o.name}"] = f"Ops.{o.name}"
    return f"O_{o.name}"

  def helper(self, module: str, name: str) -> str:
    alias = f"h_{module.replace('.', '_')}__{name}"
    self.preamble[alias] = f"import_helper({module!r}, {name!r})"
    return alias

  def test(self, t) -> str:
    kind = t[0]
    if kind == "op":
      ops = t[2]
      if len(ops) == 1: return f"{t[1]}.op is {self.op(next(iter(ops)))}"
      return f"{t[1]}.op in {self.const(ops, 'S')}"
    if kind == "len": return f"len({src_expr(t[1])}) {t[2]} {t[3]}"
    if kind == "dtype":
      if len(t[2]) == 1: return f"{t[1]}.dtype is {self.const(next(iter(t[2])), 'D')}"
      return f"{t[1]}.dtype in {self.const(t[2], 'S')}"
    if kind == "arg": return f"{t[1]}.arg == {self.const(t[3])}"
    if kind == "same": return f"{t[1]} is {t[2]}"
    if kind == "each":
      var, srcs = _each_var(t[2]), src_expr(t[1])
      def alts(on=lambda x: x) -> str:   # (on: each test as it reads the element)
        return " or ".join("(" + (" and ".join(self.test(on(x)) for x in tests) or "True") + ")" for tests in t[2])
      every = f"all({alts()} for {var} in {srcs})"
      # (the first source tested before the generator starts: most nodes fail there, and a generator costs more
      # than the test. Only where the tests read the element's own op, dtype or arg, so renaming it is plain)
      if not all(x[0] in ("op", "dtype", "arg") and x[1] == var for tests in t[2] for x in tests): return every
      first = alts(lambda x: (x[0], f"{srcs}[0]") + tuple(x[2:]))
      return f"((not {srcs} or {first}) and {every})"
    raise AssertionError(kind)

  def module_head(self, rules: list[A.Rule]) -> list[str]:
    lines = ["from time import perf_counter",
             "from rulec.engine.ir.ops import Ops",
             "from rulec.engine.ir.dtypes import dtypes",
             "from rulec.engine.lang.names import BUILTINS, CONSTANT_NAMES",
             "from rulec.engine.lang.runtime import RuleAbort, rule_failed, import_helper, not_a_node, check_gradients",
             "from rulec.engine.lang.bounded import rule_pow, rule_lshift, rule_mul, rule_mod",
             "from rulec.engine.lang.capability import rule_attr",
             "from rulec.engine.ir.uop import UOp",
             "RULES = (" + "".join(f"({r.name!r}, {str(r.span)!r}, {r.source_line!r}), " for r in rules) + ")",
             "STATS = [[0, 0, 0.0] for _ in RULES]"]
    lines += [f"{k} = {v}" for k, v in self.preamble.items()]
    return lines + [""]


def _each_var(variants) -> str:
  for tests in variants:
    for t in tests:
      return t[1].split(".")[0]
  return "e0"


# *** expressions -> Python source ***

class ExprPrinter:
  def __init__(self, em: _Emitter, helpers: dict[str, Any], bound: set[str], tails: set[str] = frozenset()):
    self.em, self.helpers, self.bound, self.tails = em, helpers, bound, tails

  def attr(self, e: A.EAttr, scope: frozenset) -> str:
    """`obj.attr` where the checker proved it allowed; else the run-time allowlist check."""
    t = static_type(e.obj, self.bound - self.tails, self.tails, self.helpers, scope)
    allowed = allowed_attrs(t)
    if t == CTX or allowed is not None:
      if (t == CTX and e.attr.startswith("_")) or (allowed is not None and e.attr not in allowed):
        raise AssertionError(f"attribute {e.attr!r} reached the compiler")  # the checker rejects these
      return f"{self(e.obj, scope)}.{e.attr}"
    return f"rule_attr({self(e.obj, scope)}, {e.attr!r})"

  def name(self, n: str, scope: frozenset) -> str:
    if n in scope: return f"c_{n}"
    if n == "ctx": return "ctx"
    if n in self.bound: return f"b_{n}"
    if n in self.helpers: return self.em.helper(*self.helpers[n])
    if n in BUILTINS:
      self.em.preamble[f"g_{n}"] = f"BUILTINS[{n!r}]"
      return f"g_{n}"
    if n in CONSTANT_NAMES:
      self.em.preamble[f"N_{n}"] = f"CONSTANT_NAMES[{n!r}]"
      return f"N_{n}"
    raise AssertionError(f"unresolved name {n!r} reached the compiler")  # the checker rejects these

  def __call__(self, e, scope: frozenset = frozenset()) -> str:
    p = lambda x: self(x, scope)  # noqa: E731
    if isinstance(e, A.EName): return self.name(e.id, scope)
    if isinstance(e, A.EConst):
      v = e.value
      if v is None or isinstance(v, (bool, str)) or (isinstance(v, int)): return repr(v)
      return self.em.const(v)
    if isinstance(e, A.EAttr): return self.attr(e, scope)
    if isinstance(e, A.ECall): return f"{p(e.func)}({', '.join(self.arg(a, scope) for a in e.args)})"
    if isinstance(e, A.ESub): return f"{p(e.obj)}[{self.index(e.index, scope)}]"
    if isinstance(e, A.ESeq):
      inner = ", ".join(p(x) for x in e.elts)
      if e.kind == "tuple": return f"({inner},)" if len(e.elts) == 1 else f"({inner})"
      if e.kind == "list": return f"[{inner}]"
      return f"{{{inner}}}"
    if isinstance(e, A.EDict): return "{" + ", ".join(f"{p(k)}: {p(v)}" for k, v in zip(e.keys, e.values)) + "}"
    if isinstance(e, A.EBin):
      if e.op in CHECKED_BINOPS and not self.plain_operands(e, scope):
        return f"{CHECKED_BINOPS[e.op].__name__}({p(e.left)}, {p(e.right)})"
      return f"({p(e.left)} {e.op} {p(e.right)})"
    if isinstance(e, A.EUnary): return f"({e.op} {p(e.operand)})" if e.op == "not" else f"({e.op}{p(e.operand)})"
    if isinstance(e, A.EBool): return "(" + f" {e.op} ".join(p(x) for x in e.values) + ")"
    if isinstance(e, A.ECompare):
      parts = [p(e.left)]
      for op, r in zip(e.ops, e.rights): parts += [op, p(r)]
      return "(" + " ".join(parts) + ")"
    if isinstance(e, A.ECond): return f"({p(e.body)} if {p(e.test)} else {p(e.orelse)})"
    if isinstance(e, A.EComp):
      inner_scope, clauses = dict(scope) if isinstance(scope, dict) else dict.fromkeys(scope), []
      for g in e.gens:
        it = self(g.iter, inner_scope)
        inner_scope = comprehension_scope(g, self.bound - self.tails, self.tails, self.helpers, inner_scope)
        tgt = ", ".join(f"c_{t}" for t, _ in g.targets)
        clauses.append(f"for {tgt} in {it}" + "".join(f" if {self(c, inner_scope)}" for c in g.ifs))
      sc = inner_scope
      body = f"{self(e.elt[0], sc)}: {self(e.elt[1], sc)}" if e.kind == "dict" else self(e.elt, sc)
      open_, close = {"list": "[]", "set": "{}", "dict": "{}", "gen": "()"}[e.kind]
      return f"{open_}{body} {' '.join(clauses)}{close}"
    raise AssertionError(f"cannot compile {type(e).__name__}")  # lambda / walrus never pass the checker

  def plain_operands(self, e: A.EBin, scope) -> bool:
    """Whether the checker knows an operand of `e` is a node or a float, whose `*`, `**`, `<<` and `%` build a node or
    a float of bounded size (anything else calls the checked operator: engine/lang/bounded.py)."""
    types = [static_type(x, self.bound - self.tails, self.tails, self.helpers, scope) for x in (e.left, e.right)]
    return any(t is UOp or t is float for t in types)

  def arg(self, a, scope) -> str:
    if isinstance(a, A.EKeyword): return f"{a.name}={self(a.value, scope)}"
    if isinstance(a, A.EStarred): return f"{'**' if a.double else '*'}{self(a.value, scope)}"
    return self(a, scope)

  def index(self, i, scope) -> str:
    if isinstance(i, A.ESlice):
      return ":".join("" if x is None else self(x, scope) for x in (i.lo, i.hi)) + \
             ("" if i.step is None else f":{self(i.step, scope)}")
    if isinstance(i, A.ESeq) and i.kind == "tuple" and any(isinstance(x, A.ESlice) for x in i.elts):
      return ", ".join(self.index(x, scope) for x in i.elts) + ("," if len(i.elts) == 1 else "")
    return self(i, scope)


# *** module generation ***

def _comment(text: str) -> str:
  """Text safe inside a generated # comment: file names and lines may hold any character."""
  return "".join(c if c.isprintable() and c not in "\r\n" else repr(c)[1:-1] for c in text)


def _leaf(em: _Emitter, k: int, rule: A.Rule, v: Variant, helpers: dict, pad: str, stats: bool) -> list[str]:
  binds = dict(v.binds)
  if rule.grad is not None: binds[rule.grad] = "ctx"   # gradient rules: ctx is the incoming gradient
  pr = ExprPrinter(em, helpers, set(binds), pattern_tails(rule.pattern))
  lines = [f"{pad}# {_comment(f'{rule.name} ({rule.span}): {rule.source_line[:100]}')}"]
  lines.append(f"{pad}try:")
  inner = pad + "  "
  for name, where in binds.items(): lines.append(f"{inner}b_{name} = {where}")
  if rule.guard is not None:
    lines.append(f"{inner}if {pr(rule.guard)}:")
    inner += "  "
  lines.append(f"{inner}_r = {pr(rule.replacement)}")
  if rule.grad is not None:
    lines.append(f"{inner}if _r is not None: return check_gradients(RULES[{k}], n, _r)")
  else:
    lines.append(f"{inner}if _r is not None and _r is not n:")
    lines.append(f"{inner}  if _r.__class__ is not UOp: not_a_node(RULES[{k}], _r)")
    lines.append(f"{inner}  return _r")
  lines.append(f"{pad}except RuleAbort: raise")
  lines.append(f"{pad}except Exception as _e: rule_failed(RULES[{k}], _e)")
  return lines


def _tree(em: _Emitter, items: list[tuple[list, int, A.Rule, Variant]], helpers_of, pad: str, stats: bool) -> list[str]:
  """items: (remaining tests, rule index, rule, variant) in priority order."""
  lines: list[str] = []
  if len(pad) // 2 >= MAX_IF_DEPTH:
    # deep enough: each item's remaining tests in one `if` (Python limits how deeply blocks nest)
    for tests, k, rule, v in items:
      inner = pad
      if tests:
        lines.append(f"{pad}if {' and '.join(f'({em.test(t)})' for t in tests)}:")
        inner = pad + "  "
      lines += _leaf(em, k, rule, v, helpers_of(rule), inner, stats)
    return lines
  i = 0
  while i < len(items):
    tests, k, rule, v = items[i]
    if not tests:
      lines += _leaf(em, k, rule, v, helpers_of(rule), pad, stats)
      i += 1
      continue
    t = tests[0]
    j = i + 1
    while j < len(items) and t in items[j][0]: j += 1
    group = [([x for x in it[0] if x != t], it[1], it[2], it[3]) for it in items[i:j]]
    lines.append(f"{pad}if {em.test(t)}:")
    lines += _tree(em, group, helpers_of, pad + "  ", stats)
    i = j
  return lines


def _items_for_op(op: Ops, rules: list[A.Rule], lowered: list[list[Variant]], only: int | None = None):
  items = []
  for k, (rule, variants) in enumerate(zip(rules, lowered)):
    if only is not None and k != only: continue
    if op not in pattern_ops(rule.pattern): continue
    for v in variants:
      tests, ok = [], True
      for t in v.tests:
        if t[0] == "op" and t[1] == "n":
          if op not in t[2]: ok = False; break
          continue  # the dispatch already chose this op
        tests.append(t)
      if ok: items.append((tests, k, rule, v))
  return items


def generate(rules: list[A.Rule], helpers_of, stats: bool = False, title: str = "") -> str:
  """The matcher module for `rules` (priority order), as self-contained Python source."""
  em = _Emitter()
  lowered = [lower(r.pattern, "n") for r in rules]
  ops_used = sorted({o for r in rules for o in pattern_ops(r.pattern)}, key=int)
  out = [f"# generated by rulec from {title or 'rules'}; DO NOT EDIT", ""]
  dispatch: list[str] = []
  if not stats:
    for op in ops_used:
      items = _items_for_op(op, rules, lowered)
      if not items: continue
      out.append(f"def m_{op.name}(n, ctx):")
      out.append("  s_ = n.src")
      out += _tree(em, items, helpers_of, "  ", False)
      out += ["  return None", ""]
      dispatch.append(f"{em.op(op)}: m_{op.name}")
  else:
    # one function per (rule, op); dispatch functions try them in order with counters
    for op in ops_used:
      fns = []
      for k, rule in enumerate(rules):
        items = _items_for_op(op, rules, lowered, only=k)
        if not items: continue
        out.append(f"def r{k}_{op.name}(n, ctx):")
        out.append("  s_ = n.src")
        out += _tree(em, items, helpers_of, "  ", True)
        out += ["  return None", ""]
        fns.append((k, f"r{k}_{op.name}"))
      if not fns: continue
      out.append(f"m_{op.name}_rules = ({', '.join(f'({k}, {f})' for k, f in fns)},)")
      out.append(f"def m_{op.name}(n, ctx):")
      out.append(f"  for k, f in m_{op.name}_rules:")
      out.append("    st = STATS[k]; st[0] += 1; t0 = perf_counter()")
      out.append("    r = f(n, ctx)")
      out.append("    st[2] += perf_counter() - t0")
      out.append("    if r is not None: st[1] += 1; return r")
      out.append("  return None")
      out.append("")
      dispatch.append(f"{em.op(op)}: m_{op.name}")
  out.append("DISPATCH = {" + ", ".join(dispatch) + "}")
  return "\n".join(out[:2] + em.module_head(rules) + out[2:]) + "\n"


def per_rule_functions(rules: list[A.Rule], helpers_of) -> str:
  """Source defining RULE_FNS[k](n, ctx) for every rule k, all ops (used to name the rule that fired)."""
  em = _Emitter()
  lowered = [lower(r.pattern, "n") for r in rules]
  out = ["# generated by rulec: one matcher per rule", ""]
  names = []
  for k, rule in enumerate(rules):
    out.append(f"def rule{k}(n, ctx):")
    out.append("  s_ = n.src")
    items = []
    for v in lowered[k]: items.append((list(v.tests), k, rule, v))
    out += _tree(em, items, helpers_of, "  ", True)
    out += ["  return None", ""]
    names.append(f"rule{k}")
  out.append(f"RULE_FNS = ({''.join(n + ', ' for n in names)})")
  return "\n".join(out[:2] + em.module_head(rules) + out[2:]) + "\n"


__all__ = ["generate", "per_rule_functions", "lower", "child_orders", "pattern_ops", "GROUPS", "OPS_BY_NAME"]
