"""The checker: resolves every name, op, group, dtype and helper in parsed rule
files and reports what is wrong, each with its location. Nothing in a rules
file runs here; helper modules are imported only from allowed packages."""
from __future__ import annotations

from typing import Callable

import attrs

from engine.dtypes import dtype_set
from engine.lang import ast as A
from engine.lang.diagnostics import Diagnostic
from engine.lang.names import (BUILTINS, CONSTANT_NAMES, FORBIDDEN_NAMES, check_call_arity, forbidden_attr, resolve_helper,
                               resolve_helper_module)
from engine.ops import COMMUTATIVE, FIXED_ARITY, GROUPS, op_set



@attrs.define
class CheckedLibrary:
  files: list[A.RuleFile]
  diagnostics: list[Diagnostic]
  rulesets: dict[str, A.RuleSet]              # name -> ruleset
  helpers: dict[str, dict[str, Callable]]     # file path -> helper name -> function
  ruleset_file: dict[str, str]                # ruleset name -> file path
  helper_origin: dict[str, dict[str, tuple[str, str]]] = attrs.Factory(dict)  # file -> name -> (module, name)

  def helpers_of(self, rule: A.Rule) -> dict[str, tuple[str, str]]:
    return self.helper_origin.get(rule.span.file, {})

  @property
  def errors(self) -> list[Diagnostic]: return [d for d in self.diagnostics if d.is_error]

  def flat_rules(self, name: str) -> list[A.Rule]:
    """A ruleset's rules in priority order: included sets first (in order), then its own; each rule once."""
    out: list[A.Rule] = []
    seen: set[int] = set()
    visiting: set[str] = set()
    def walk(n: str):
      if n in visiting or n not in self.rulesets: return
      visiting.add(n)
      rs = self.rulesets[n]
      for inc, _ in rs.includes: walk(inc)
      for r in rs.rules:
        if id(r) not in seen: seen.add(id(r)); out.append(r)
      visiting.discard(n)
    walk(name)
    return out


def check_library(files: list[A.RuleFile], pre_diags: list[Diagnostic] = ()) -> CheckedLibrary:
  diags: list[Diagnostic] = list(pre_diags)
  lib = CheckedLibrary(files, diags, {}, {}, {})
  rule_names: dict[str, A.Rule] = {}
  for f in files:
    lib.helpers[f.path] = _check_uses(f, diags)
    lib.helper_origin[f.path] = {n: (u.module, n) for u in f.uses for n, _ in u.names if lib.helpers[f.path].get(n)}
    for rs in f.rulesets:
      if rs.name in lib.rulesets:
        diags.append(Diagnostic("R502", "error", rs.span, f"ruleset '{rs.name}' is already defined",
                                note=f"first defined at {lib.rulesets[rs.name].span}"))
        continue
      lib.rulesets[rs.name] = rs
      lib.ruleset_file[rs.name] = f.path
  for f in files:
    for rs in f.rulesets:
      for r in rs.rules:
        if r.named:
          if r.name in rule_names:
            diags.append(Diagnostic("R501", "error", r.span, f"rule name '{r.name}' is already used",
                                    note=f"first used at {rule_names[r.name].span}"))
          else: rule_names[r.name] = r
        _RuleChecker(r, lib.helpers[f.path], diags).check()
  _check_includes(lib, diags)
  _check_shadowing(lib, diags)
  diags.sort(key=lambda d: (d.span.file, d.span.line, d.span.col, d.code))
  return lib


def _check_uses(f: A.RuleFile, diags: list[Diagnostic]) -> dict[str, Callable]:
  helpers: dict[str, Callable] = {}
  for use in f.uses:
    mod, why = resolve_helper_module(use.module)
    if mod is None:
      diags.append(Diagnostic("R301", "error", use.module_span, why))
      for name, _ in use.names: helpers.setdefault(name, None)   # declared: no second error at each use
      continue
    for name, span in use.names:
      if name in helpers:
        diags.append(Diagnostic("R304", "error", span, f"helper '{name}' is declared twice")); continue
      if name in BUILTINS or name == "ctx":
        diags.append(Diagnostic("R204", "error", span, f"helper '{name}' would hide the builtin of that name")); continue
      fn, why = resolve_helper(mod, name)
      if fn is None: diags.append(Diagnostic("R302", "error", span, why))
      helpers[name] = fn
  return helpers


def _check_includes(lib: CheckedLibrary, diags: list[Diagnostic]):
  for rs in lib.rulesets.values():
    for inc, span in rs.includes:
      if inc not in lib.rulesets: diags.append(Diagnostic("R503", "error", span, f"unknown ruleset '{inc}' in includes"))
  # cycles: depth-first search over includes edges
  state: dict[str, int] = {}
  def visit(name: str, stack: list[tuple[str, A.Span]]):
    state[name] = 1
    for inc, span in lib.rulesets[name].includes:
      if inc not in lib.rulesets: continue
      if state.get(inc) == 1:
        cycle = [n for n, _ in stack[[n for n, _ in stack].index(inc):]] + [name, inc] if inc in [n for n, _ in stack] \
          else [name, inc]
        diags.append(Diagnostic("R504", "error", span, f"includes form a cycle: {' -> '.join(cycle)}"))
      elif inc not in state: visit(inc, stack + [(name, span)])
    state[name] = 2
  for name in lib.rulesets:
    if name not in state: visit(name, [])


class _RuleChecker:
  def __init__(self, rule: A.Rule, helpers: dict[str, Callable], diags: list[Diagnostic]):
    self.rule, self.helpers, self.diags = rule, helpers, diags
    self.bound: dict[str, A.Span] = {}          # name -> first binding site
    self.node_bound: set[str] = set()           # names bound with a sub-pattern (name:PAT)
    self.uses: dict[str, int] = {}

  def err(self, code: str, span: A.Span, msg: str, severity: str = "error", note: str | None = None):
    self.diags.append(Diagnostic(code, severity, span, msg, note))

  def check(self):
    self.pattern(self.rule.pattern, in_each=False)
    if self.rule.guard is not None: self.expr(self.rule.guard, set())
    self.expr(self.rule.replacement, set())
    for name, span in self.bound.items():
      if self.uses.get(name, 0) == 0 and not name.startswith("_"):
        self.err("R202", span, f"binding '{name}' is never used", "warning", note="use '_' or drop the name if it is not needed")

  # *** patterns ***
  def bind(self, name: str, span: A.Span, with_pattern: bool, in_each: bool):
    if name == "_": return
    if in_each:
      self.err("R203", span, f"'{name}' is bound inside an 'each' pattern, which matches many nodes"); return
    if name == "ctx" or name in self.helpers or name in BUILTINS or name in CONSTANT_NAMES:
      self.err("R204", span, f"binding '{name}' hides {'ctx' if name == 'ctx' else 'a helper or builtin of that name'}")
      return
    if name in self.bound:
      if with_pattern and name in self.node_bound:
        self.err("R203", span, f"'{name}' is already bound to a pattern at {self.bound[name]}",
                 note="a name may carry a pattern once; use the bare name again to mean 'the same node'")
      else: self.uses[name] = self.uses.get(name, 0) + 1   # identity use counts as a use
      if with_pattern: self.node_bound.add(name)
      return
    self.bound[name] = span
    if with_pattern: self.node_bound.add(name)

  def dtypes(self, dts):
    for name, span in dts or ():
      if dtype_set(name) is None: self.err("R102", span, f"unknown dtype or dtype class '{name}'")

  def pattern(self, p, in_each: bool):
    if isinstance(p, A.PName):
      self.bind(p.name, p.span, False, in_each)
      self.dtypes(p.dtypes)
    elif isinstance(p, A.PConst):
      if p.name is not None: self.bind(p.name, p.name_span, True, in_each)
      self.dtypes(p.dtypes)
    else:
      if p.name is not None: self.bind(p.name, p.name_span, True, in_each)
      for name, span in p.ops:
        if not (name[:1].isalpha() or name[:1] == "_"):
          self.err("R104", span, f"'{name}' has no ALU op in patterns", note="patterns support + - * // % / < != == & ^ << >> and unary -")
        elif op_set(name) is None:
          self.err("R101", span, f"unknown op or op group '{name}'", note=_did_you_mean(name))
      self.dtypes(p.dtypes)
      if p.srcs is not None and p.tail is None and p.each is None: self._arity(p)
      if p.tail not in (None, "any"): self.bind(p.tail, p.tail_span, True, in_each)
      for s in p.srcs or (): self.pattern(s, in_each)
      if p.each is not None: self.pattern(p.each, True)

  def _arity(self, p: A.PNode):
    for name, span in p.ops:
      ops = op_set(name)
      if not ops: continue
      arities = {FIXED_ARITY.get(o) for o in ops}
      if len(arities) == 1 and (n := arities.pop()) is not None and n != len(p.srcs):
        self.err("R103", span, f"{name} takes {n} source{'s' if n != 1 else ''}, the pattern gives {len(p.srcs)}")

  # *** expressions ***
  def expr(self, e, scope: set[str]):
    if e is None: return
    if isinstance(e, tuple):
      for x in e: self.expr(x, scope)
      return
    if isinstance(e, A.EName): return self.name(e, scope)
    if isinstance(e, A.ELambda): return self.err("R402", e.span, "lambda is not allowed in rules; declare a helper with 'use'")
    if isinstance(e, A.EWalrus): return self.err("R404", e.span, "assignment expressions (:=) are not allowed in rules")
    if isinstance(e, A.EAttr):
      if forbidden_attr(e.attr): self.err("R401", e.attr_span, f"attribute '{e.attr}' is not allowed in rules")
      return self.expr(e.obj, scope)
    if isinstance(e, A.ECall):
      self.expr(e.func, scope)
      for a in e.args: self.expr(a.value if isinstance(a, (A.EKeyword, A.EStarred)) else a, scope)
      if isinstance(e.func, A.EName) and self.helpers.get(e.func.id) is not None and e.func.id not in scope and \
         not any(isinstance(a, A.EStarred) for a in e.args):
        kws = tuple(a.name for a in e.args if isinstance(a, A.EKeyword))
        npos = sum(1 for a in e.args if not isinstance(a, A.EKeyword))
        if (why := check_call_arity(self.helpers[e.func.id], npos, kws)) is not None:
          self.err("R303", e.span, f"helper called with arguments it does not accept: {why}")
      return
    if isinstance(e, A.EComp):
      inner = set(scope)
      for g in e.gens:
        self.expr(g.iter, inner)
        for t, span in g.targets:
          if t in self.bound or t in self.helpers or t in BUILTINS or t == "ctx":
            self.err("R204", span, f"comprehension variable '{t}' hides a name already in use")
          inner.add(t)
        for c in g.ifs: self.expr(c, inner)
      return self.expr(e.elt, inner)
    for child in _children(e): self.expr(child, scope)

  def name(self, e: A.EName, scope: set[str]):
    n = e.id
    if n in scope or n == "ctx" or n in self.helpers or n in BUILTINS: return
    if n in self.bound:
      self.uses[n] = self.uses.get(n, 0) + 1
      return
    if n in CONSTANT_NAMES: return
    if n in FORBIDDEN_NAMES or n.startswith("__"):
      return self.err("R403", e.span, f"'{n}' is not available in rules (rules cannot reach the Python interpreter)")
    if n[:1].isupper(): return self.err("R101", e.span, f"unknown op or op group '{n}'", note=_did_you_mean(n))
    self.err("R201", e.span, f"unbound name '{n}'",
             note="names must be bound by the pattern, be 'ctx', a helper from a 'use' line, or a builtin")


def _children(e) -> list:
  if isinstance(e, A.EKeyword): return [e.value]
  if isinstance(e, A.EStarred): return [e.value]
  if isinstance(e, A.ESlice): return [e.lo, e.hi, e.step]
  if isinstance(e, A.ESub): return [e.obj, e.index]
  if isinstance(e, A.ESeq): return list(e.elts)
  if isinstance(e, A.EDict): return list(e.keys) + list(e.values)
  if isinstance(e, A.EBin): return [e.left, e.right]
  if isinstance(e, A.EUnary): return [e.operand]
  if isinstance(e, A.EBool): return list(e.values)
  if isinstance(e, A.ECompare): return [e.left, *e.rights]
  if isinstance(e, A.ECond): return [e.test, e.body, e.orelse]
  return []


def _did_you_mean(name: str) -> str | None:
  import difflib
  close = difflib.get_close_matches(name, list(CONSTANT_NAMES), n=1)
  return f"did you mean '{close[0]}'?" if close else None


# *** shadowing: an earlier rule that matches everything a later one does, with no guard, always wins ***

def _always_rewrites(r: A.Rule) -> bool:
  """True only when the rule can neither decline nor return the node itself.

  That holds for a replacement naming a node strictly inside the pattern: a
  source is never its own user and never None. Builders such as replace() or
  cast() can hand back the node unchanged, so they do not count."""
  if r.guard is not None or not isinstance(r.replacement, A.EName): return False
  root = r.pattern.name
  return r.replacement.id != root and r.replacement.id in _inner_names(r.pattern)


def _inner_names(p) -> set[str]:
  out: set[str] = set()
  for c in A.pattern_children(p):
    n = c.name if not isinstance(c, A.PName) else (c.name if c.name != "_" else None)
    if n is not None: out.add(n)
    out |= _inner_names(c)
  return out


def _ops_of(p) -> frozenset | None:
  """The op set a pattern node can have; None means any op."""
  if isinstance(p, A.PName): return None
  if isinstance(p, A.PConst): return op_set("CONST")
  out: set = set()
  for name, _ in p.ops:
    s = op_set(name)
    if s is None: return frozenset()
    out |= s
  return frozenset(out)


def _dts(p) -> frozenset | None:
  if p.dtypes is None: return None
  out: set = set()
  for name, _ in p.dtypes: out |= dtype_set(name) or set()
  return frozenset(out)


def subsumes(a, b) -> bool:
  """True when every node pattern `b` matches is also matched by pattern `a` (conservative)."""
  if isinstance(a, A.PName):
    da, db = _dts(a), (_dts(b) if not isinstance(b, A.PName) or b.dtypes else None)
    return da is None or (db is not None and db <= da)
  oa, ob = _ops_of(a), _ops_of(b)
  if ob is None or not ob <= oa: return False
  da, db = _dts(a), _dts(b) if not isinstance(b, A.PName) else None
  if da is not None and (db is None or not db <= da): return False
  if isinstance(a, A.PConst):
    return isinstance(b, A.PConst) and type(a.value) is type(b.value) and a.value == b.value
  if a.has_arg:
    barg = b.value if isinstance(b, A.PConst) else (b.arg if b.has_arg else None)
    if not (isinstance(b, A.PConst) or b.has_arg) or barg != a.arg: return False
  if a.srcs is None and a.each is None: return True
  if isinstance(b, A.PConst): return False
  if a.each is not None or b.each is not None or b.srcs is None: return False
  if a.tail is None and (b.tail is not None or len(a.srcs) != len(b.srcs)): return False
  if len(b.srcs) < len(a.srcs): return False
  return all(subsumes(x, y) for x, y in zip(a.srcs, b.srcs))


def _names_unique(p, seen=None) -> bool:
  seen = set() if seen is None else seen
  names = []
  if isinstance(p, A.PName): names = [p.name]
  elif p.name is not None: names = [p.name]
  for n in names:
    if n == "_": continue
    if n in seen: return False
    seen.add(n)
  return all(_names_unique(c, seen) for c in A.pattern_children(p))


def _check_shadowing(lib: CheckedLibrary, diags: list[Diagnostic]):
  reported: set[tuple[int, int]] = set()
  for name in lib.rulesets:
    rules = lib.flat_rules(name)
    own = {id(r) for r in lib.rulesets[name].rules}
    for j, later in enumerate(rules):
      if id(later) not in own: continue
      for earlier in rules[:j]:
        if (id(earlier), id(later)) in reported: continue
        if _always_rewrites(earlier) and _names_unique(earlier.pattern) and subsumes(earlier.pattern, later.pattern):
          reported.add((id(earlier), id(later)))
          diags.append(Diagnostic("R505", "warning", later.span,
                                  f"rule '{later.name}' never fires: rule '{earlier.name}' matches first and always rewrites",
                                  note=f"earlier rule at {earlier.span}"))
          break


__all__ = ["check_library", "CheckedLibrary", "subsumes", "COMMUTATIVE", "GROUPS"]
