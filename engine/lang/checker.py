"""The checker: resolves every name, op, group, dtype and helper in parsed rule
files and reports what is wrong, each with its location. Nothing in a rules
file runs here; helper modules are imported only from allowed packages."""
from __future__ import annotations

from typing import Any, Callable

import attrs

import keyword

from rulec.engine.ir.dtypes import dtype_set
from rulec.engine.lang import ast as A
from rulec.engine.lang.capability import CTX, allowed_attrs, comprehension_scope, describe_type, static_type
from rulec.engine.lang.compiler import child_orders
from rulec.engine.lang.contexts import rule_contexts
from rulec.engine.lang.diagnostics import Diagnostic
from rulec.engine.lang.limits import MAX_EXPR_DEPTH, MAX_INCLUDE_DEPTH, MAX_VARIANTS, SHADOW_CANDIDATES
from rulec.engine.lang.libraries import resolve_helper, resolve_library
from rulec.engine.lang.names import BUILTINS, CONSTANT_NAMES, FORBIDDEN_NAMES, check_call_arity, forbidden_attr
from rulec.engine.ir.ops import COMMUTATIVE, FIXED_ARITY, GROUPS, op_set



@attrs.define
class CheckedLibrary:
  files: list[A.RuleFile]
  diagnostics: list[Diagnostic]
  rulesets: dict[str, A.RuleSet]              # name -> ruleset
  helpers: dict[str, dict[str, Callable]]     # file path -> helper name -> function
  ruleset_file: dict[str, str]                # ruleset name -> file path
  helper_origin: dict[str, dict[str, tuple[str, str]]] = attrs.Factory(dict)  # file -> name -> (module, name)
  _flat: dict[str, tuple] = attrs.field(factory=dict, init=False, repr=False)
  include_depth: dict[str, int] = attrs.field(factory=dict, init=False, repr=False)
  too_big: set[int] = attrs.field(factory=set, init=False, repr=False)   # id() of rules over a limit (R701, R703)

  def helpers_of(self, rule: A.Rule) -> dict[str, tuple[str, str]]:
    return self.helper_origin.get(rule.span.file, {})

  @property
  def errors(self) -> list[Diagnostic]: return [d for d in self.diagnostics if d.is_error]

  def flat_rules(self, name: str) -> list[A.Rule]:
    """A ruleset's rules in priority order: included sets first (in order), then its own; each rule once.

    Memoised per rule set and computed without recursion, so a deep or diamond-shaped include graph costs
    time linear in its size (a set inside a cycle sees the sets of the cycle above it as empty)."""
    if name not in self._flat:
      done, in_progress = self._flat, set()
      stack = [name]
      while stack:
        n = stack[-1]
        if n in done or n not in self.rulesets: stack.pop(); continue
        in_progress.add(n)
        todo = [inc for inc, _ in self.rulesets[n].includes
                if inc in self.rulesets and inc not in done and inc not in in_progress]
        if todo: stack.extend(reversed(todo)); continue
        out: list[A.Rule] = []
        seen: set[int] = set()
        for inc, _ in self.rulesets[n].includes:
          for r in done.get(inc, ()):
            if id(r) not in seen: seen.add(id(r)); out.append(r)
        for r in self.rulesets[n].rules:
          if id(r) not in seen: seen.add(id(r)); out.append(r)
        done[n] = tuple(out)
        in_progress.discard(n)
        stack.pop()
    return list(self._flat.get(name, ()))


def check_library(files: list[A.RuleFile], pre_diags: list[Diagnostic] = (), layers: dict[str, int] | None = None) -> CheckedLibrary:
  """Check parsed files. `layers` maps a file's path to its layer (default 0: the shipped rules; a user's rules
  directory is layer 1): a rule set of a higher layer replaces the set of that name beneath it, and
  `ruleset NAME extends BASE:` starts from BASE as the layers beneath define it."""
  diags: list[Diagnostic] = list(pre_diags)
  lib = CheckedLibrary(files, diags, {}, {}, {})
  layer_of = lambda path: (layers or {}).get(path, 0)  # noqa: E731
  rule_names: dict[tuple[int, str], A.Rule] = {}       # rule names are unique within a layer
  merged: dict[int, A.RuleSet] = {}                    # id(extending set as parsed) -> the set it stands for
  defined_in: dict[str, int] = {}                      # ruleset name -> layer of its live definition
  parsed: dict[str, A.RuleSet] = {}                    # ruleset name -> its live definition, as parsed
  replaced: set[int] = set()                           # id() of parsed sets a higher layer replaced
  for f in files:
    lib.helpers[f.path] = _check_uses(f, diags)
    lib.helper_origin[f.path] = {n: (u.module, n) for u in f.uses for n, _ in u.names if lib.helpers[f.path].get(n)}
  for layer in sorted({layer_of(f.path) for f in files}):
    below = dict(lib.rulesets)                         # the library as the layers beneath define it
    for f in files:
      if layer_of(f.path) != layer: continue
      for rs in f.rulesets:
        if rs.name in lib.rulesets and defined_in[rs.name] == layer:
          diags.append(Diagnostic("R502", "error", rs.span, f"ruleset '{rs.name}' is already defined",
                                  note=f"first defined at {lib.rulesets[rs.name].span}"))
          continue
        live = rs
        if rs.name in below and _kind(below[rs.name]) != _kind(rs):
          diags.append(Diagnostic("R506", "error", rs.span, f"{_kind(rs)} cannot replace {_kind(below[rs.name])} "
                                  f"('{rs.name}', defined at {below[rs.name].span})",
                                  note="a gradients set is replaced or extended by a gradients set, a ruleset by a ruleset"))
        elif rs.extends is not None:
          base_name, span = rs.extends
          base = below.get(base_name)
          if base is None:
            diags.append(Diagnostic("R507", "error", span, f"ruleset '{rs.name}' extends '{base_name}', "
                                    "but no layer beneath this file defines a rule set of that name",
                                    note="extends builds on a set of the shipped rules (or of the files a user's rules "
                                    "directory is layered over); to build on a set of the same directory, use includes"))
          elif _kind(base) != _kind(rs):
            diags.append(Diagnostic("R506", "error", span, f"{_kind(rs)} cannot extend {_kind(base)} ('{base_name}')",
                                    note="gradient rules give a tuple per node, rewrite rules a node: the two do not mix"))
          else:
            for r in rs.rules:
              clash = next((b for b in base.rules if r.named and b.named and b.name == r.name), None)
              if clash is not None:
                diags.append(Diagnostic("R501", "error", r.span, f"rule name '{r.name}' is already used in '{base_name}', "
                                        "which this set extends", note=f"first used at {clash.span}"))
            # the base's sets and rules first, then this set's: the added rules have the lowest priority
            includes = base.includes + tuple(i for i in rs.includes if i[0] not in {n for n, _ in base.includes})
            live = merged[id(rs)] = attrs.evolve(rs, includes=includes, rules=base.rules + rs.rules)
        if rs.name in parsed: replaced.add(id(parsed[rs.name]))
        lib.rulesets[rs.name], parsed[rs.name] = live, rs
        lib.ruleset_file[rs.name] = f.path
        defined_in[rs.name] = layer
  for f in files:
    for rs in f.rulesets:
      for r in rs.rules:
        if r.named and id(rs) not in replaced:     # a replaced set's rule names are free for the set replacing it
          key = (layer_of(f.path), r.name)
          if key in rule_names:
            diags.append(Diagnostic("R501", "error", r.span, f"rule name '{r.name}' is already used",
                                    note=f"first used at {rule_names[key].span}"))
          else: rule_names[key] = r
        if (limit := _over_limits(r)) is not None:
          diags.append(limit)
          lib.too_big.add(id(r))
          continue
        _RuleChecker(r, lib.helpers[f.path], diags).check()
  if merged:   # a file holds the set its `extends` stands for, so its examples run against the extended set
    lib.files = [attrs.evolve(f, rulesets=tuple(merged.get(id(rs), rs) for rs in f.rulesets)) if
                 any(id(rs) in merged for rs in f.rulesets) else f for f in files]
  _check_includes(lib, diags)
  _check_ctx_uses(lib, diags)
  _check_shadowing(lib, diags)
  diags.sort(key=lambda d: (d.span.file, d.span.line, d.span.col, d.code))
  return lib


def _kind(rs: A.RuleSet) -> str: return "a gradients set" if rs.grad is not None else "a ruleset"


def _check_uses(f: A.RuleFile, diags: list[Diagnostic]) -> dict[str, Callable]:
  helpers: dict[str, Callable] = {}
  for use in f.uses:
    mod, why = resolve_library(use.module)
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


def _over_limits(r: A.Rule) -> Diagnostic | None:
  """R703 for a pattern, guard, replacement or example nested too deeply; R701 for too many source orders."""
  parts = [(r.pattern, A.pattern_children, "the pattern")]
  parts += [(x, A.expr_children, what) for x, what in ((r.guard, "the guard"), (r.replacement, "the replacement"))]
  for ex in r.examples:
    parts += [(ex.input, A.pattern_children, "the example"), (ex.expected, A.pattern_children, "the example")]
  for root, children, what in parts:
    if root is None: continue
    if (deep := A.deepest(root, children, MAX_EXPR_DEPTH)) is not None:
      return Diagnostic("R703", "error", deep.span, f"{what} nests more than {MAX_EXPR_DEPTH} levels deep here",
                        note="split the rule, or move the computation into a helper")
  n = variant_count(r.pattern)
  if n > MAX_VARIANTS:
    return Diagnostic("R701", "error", r.pattern.span,
                      f"the pattern has more than {MAX_VARIANTS} source orders to try (commutative ops multiply them)",
                      note="each commutative op with two sources doubles the orders; split the rule or write fewer of them")
  return None


def variant_count(p, cap: int = MAX_VARIANTS + 1) -> int:
  """How many variants the compiler would expand pattern p into, capped at `cap` (its depth is bounded already)."""
  if not isinstance(p, A.PNode) or not p.srcs: return 1
  total = 1
  for c in p.srcs:
    total = min(cap, total * variant_count(c, cap))
  return min(cap, total * len(child_orders(p)))


def _check_includes(lib: CheckedLibrary, diags: list[Diagnostic]):
  for rs in lib.rulesets.values():
    for inc, span in rs.includes:
      if inc not in lib.rulesets: diags.append(Diagnostic("R503", "error", span, f"unknown ruleset '{inc}' in includes"))
      elif (lib.rulesets[inc].grad is None) != (rs.grad is None):
        kind = lambda r: "a gradients set" if r.grad is not None else "a ruleset"  # noqa: E731
        diags.append(Diagnostic("R506", "error", span, f"{kind(rs)} cannot include {kind(lib.rulesets[inc])} ('{inc}')",
                                note="gradient rules give a tuple per node, rewrite rules a node: the two do not mix"))
  # cycles: depth-first search over includes edges, with an explicit stack
  state: dict[str, int] = {}
  for root in lib.rulesets:
    if root in state: continue
    state[root] = 1
    stack, path = [(root, iter(lib.rulesets[root].includes))], [root]
    while stack:
      name, edges = stack[-1]
      for inc, span in edges:
        if inc not in lib.rulesets: continue
        if state.get(inc) == 1:
          cycle = path[path.index(inc):] + [inc]
          diags.append(Diagnostic("R504", "error", span, f"includes form a cycle: {' -> '.join(cycle)}"))
        elif inc not in state:
          state[inc] = 1
          stack.append((inc, iter(lib.rulesets[inc].includes)))
          path.append(inc)
          break
      else:
        state[name] = 2
        stack.pop()
        path.pop()
  # depth: the longest chain of includes below each set (memoised; a set in a cycle counts the cycle once)
  depth: dict[str, int] = {}
  for root in lib.rulesets:
    if root in depth: continue
    stack, on_path = [(root, iter(lib.rulesets[root].includes))], {root}
    while stack:
      n, edges = stack[-1]
      for inc, _ in edges:
        if inc in lib.rulesets and inc not in depth and inc not in on_path:
          stack.append((inc, iter(lib.rulesets[inc].includes)))
          on_path.add(inc)
          break
      else:
        depth[n] = max((depth.get(inc, 0) + 1 for inc, _ in lib.rulesets[n].includes if inc in lib.rulesets), default=0)
        stack.pop()
        on_path.discard(n)
  lib.include_depth = depth
  for name, d in depth.items():
    if d == MAX_INCLUDE_DEPTH + 1:
      diags.append(Diagnostic("R702", "error", lib.rulesets[name].span,
                              f"ruleset '{name}' includes rule sets {d} levels deep; the limit is {MAX_INCLUDE_DEPTH}"))


class _RuleChecker:
  def __init__(self, rule: A.Rule, helpers: dict[str, Callable], diags: list[Diagnostic]):
    self.rule, self.helpers, self.diags = rule, helpers, diags
    self.bound: dict[str, A.Span] = {}          # name -> first binding site
    self.node_bound: set[str] = set()           # names bound with a sub-pattern (name:PAT)
    self.uses: dict[str, int] = {}
    self.tails: set[str] = set()               # names bound by *rest (tuples)

  def err(self, code: str, span: A.Span, msg: str, severity: str = "error", note: str | None = None):
    self.diags.append(Diagnostic(code, severity, span, msg, note))

  def check(self):
    g = self.rule.grad
    if g is not None:   # the incoming gradient: a node bound before the pattern is matched
      self.bound[g] = self.rule.span
      self.uses[g] = 1
    self.pattern(self.rule.pattern, in_each=False)
    if self.rule.guard is not None: self.expr(self.rule.guard, {})
    self.expr(self.rule.replacement, {})
    if g is not None:
      self._gradient_tuple(self.rule.replacement)
      for ex in self.rule.examples:
        self.err("R106", ex.span, "gradient rules take no examples",
                 note="rulec verify checks every gradient rule against finite differences instead")
    for name, span in self.bound.items():
      if self.uses.get(name, 0) == 0 and not name.startswith("_"):
        self.err("R202", span, f"binding '{name}' is never used", "warning", note="use '_' or drop the name if it is not needed")

  # *** patterns ***
  def bind(self, name: str, span: A.Span, with_pattern: bool, in_each: bool):
    if name == "_": return
    if name == self.rule.grad:
      self.err("R204", span, f"binding '{name}' hides the incoming gradient of this gradients set"); return
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
      if p.tail not in (None, "any"):
        self.bind(p.tail, p.tail_span, True, in_each)
        self.tails.add(p.tail)
      for s in p.srcs or (): self.pattern(s, in_each)
      if p.each is not None: self.pattern(p.each, True)

  def _arity(self, p: A.PNode):
    for name, span in p.ops:
      ops = op_set(name)
      if not ops: continue
      arities = {FIXED_ARITY.get(o) for o in ops}
      if len(arities) == 1 and (n := arities.pop()) is not None and n != len(p.srcs):
        self.err("R103", span, f"{name} takes {n} source{'s' if n != 1 else ''}, the pattern gives {len(p.srcs)}")

  def _gradient_tuple(self, e):
    """A gradient rule gives a tuple with one entry per source of the node it matches (or None: no rule here)."""
    if isinstance(e, A.ECond):
      for branch in (e.body, e.orelse): self._gradient_tuple(branch)
      return
    if isinstance(e, A.EConst) and e.value is None: return
    if isinstance(e, A.ECall): return   # tuple(...) or a helper: its length is checked when the rule runs
    if not (isinstance(e, A.ESeq) and e.kind == "tuple"):
      return self.err("R105", e.span, "a gradient rule's replacement must be a tuple: one gradient (or None) per source",
                      note="write (g,) for an op with one source")
    n = pattern_arity(self.rule.pattern)
    if n is not None and n != len(e.elts):
      head = self.rule.pattern
      what = "/".join(name for name, _ in head.ops) if isinstance(head, A.PNode) else "the node"
      self.err("R105", e.span, f"the gradient tuple has {len(e.elts)} entr{'y' if len(e.elts) == 1 else 'ies'}, "
               f"but {what} has {n} source{'s' if n != 1 else ''}")

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
      elif keyword.iskeyword(e.attr): self.err("R005", e.attr_span, f"'{e.attr}' is a Python keyword, not a name")
      else: self._attr_allowed(e, scope)
      return self.expr(e.obj, scope)
    if isinstance(e, A.ECall):
      for a in e.args:
        if isinstance(a, A.EKeyword) and keyword.iskeyword(a.name):
          self.err("R005", A.Span(a.span.file, a.span.line, a.span.col, a.span.line, a.span.col + len(a.name)),
                   f"'{a.name}' is a Python keyword, not a name")
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
      inner = dict(scope) if isinstance(scope, dict) else dict.fromkeys(scope)
      for g in e.gens:
        self.expr(g.iter, inner)
        for t, span in g.targets:
          if t in self.bound or t in self.helpers or t in BUILTINS or t == "ctx":
            self.err("R204", span, f"comprehension variable '{t}' hides a name already in use")
        inner = comprehension_scope(g, set(self.bound) - self.tails, self.tails, self.helpers, inner)
        for c in g.ifs: self.expr(c, inner)
      return self.expr(e.elt, inner)
    for child in _children(e): self.expr(child, scope)

  def _attr_allowed(self, e: A.EAttr, scope: set[str]):
    """Attributes are an allowlist per type; what the checker cannot type is checked when the rule runs."""
    t = static_type(e.obj, set(self.bound) - self.tails, self.tails, self.helpers, scope)
    if t == CTX:
      if e.attr.startswith("_"): self.err("R406", e.attr_span, f"attribute '{e.attr}' of ctx is private")
      return
    allowed = allowed_attrs(t)
    if allowed is not None and e.attr not in allowed:
      self.err("R406", e.attr_span, f"attribute '{e.attr}' of {describe_type(t)} is not available to rules",
               note="rules may read the attributes docs/rules.md lists for each type; anything more belongs in a helper")

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


def pattern_arity(p) -> int | None:
  """How many sources a node matching pattern p has, when the pattern fixes it (its sources, or the op's arity)."""
  if not isinstance(p, A.PNode): return None
  if p.srcs is not None and p.tail is None and p.each is None: return len(p.srcs)
  arities = {FIXED_ARITY.get(o) for name, _ in p.ops for o in (op_set(name) or ())}
  return arities.pop() if len(arities) == 1 else None


def _check_ctx_uses(lib: CheckedLibrary, diags: list[Diagnostic]):
  """In the sets the scheduler runs (and the sets they include), `ctx.NAME` must be a name that set's ctx
  offers rules (engine/lang/contexts.py), and a call of a ctx method must fit its signature."""
  contexts, seen = rule_contexts(), set()
  for name, rs in lib.rulesets.items():
    if name not in contexts or rs.grad is not None: continue
    ctx = contexts[name]
    for r in lib.flat_rules(name):
      if id(r) in lib.too_big: continue
      for e in (n for top in (r.guard, r.replacement) for n in _walk(top)):
        call = e if isinstance(e, A.ECall) and _is_ctx_attr(e.func) else None
        attr = call.func if call is not None else e
        if not _is_ctx_attr(attr) or (id(attr), name) in seen: continue
        seen.add((id(attr), name))
        _check_ctx_use(name, ctx, attr, call, diags)


def _check_ctx_use(ruleset: str, ctx, attr: A.EAttr, call: A.ECall | None, diags: list[Diagnostic]):
  import difflib
  if ctx is None:
    diags.append(Diagnostic("R406", "error", attr.attr_span, f"ruleset '{ruleset}' runs with no ctx (ctx is None), "
                            f"so ctx.{attr.attr} fails", note="engine/lang/contexts.py lists what each set the "
                            "scheduler runs receives as ctx"))
    return
  if attr.attr not in ctx.names:
    close = difflib.get_close_matches(attr.attr, sorted(ctx.names), n=1)
    offers = ", ".join(sorted(ctx.names)) or "no attributes"
    diags.append(Diagnostic("R406", "error", attr.attr_span, f"ctx of ruleset '{ruleset}' ({ctx.what}) has no "
                            f"'{attr.attr}' for rules", note=(f"did you mean '{close[0]}'? " if close else "") +
                            f"it offers: {offers}"))
    return
  fn = getattr(ctx.cls, attr.attr, None) if ctx.cls is not None else None
  if call is None or not callable(fn) or isinstance(fn, type) or \
     any(isinstance(a, A.EStarred) for a in call.args): return
  kws = tuple(a.name for a in call.args if isinstance(a, A.EKeyword))
  npos = sum(1 for a in call.args if not isinstance(a, A.EKeyword))
  if (why := check_call_arity(fn, npos + 1, kws)) is not None:   # + 1: self
    diags.append(Diagnostic("R303", "error", call.span, f"ctx.{attr.attr} called with arguments it does not "
                            f"accept: {why.replace('(self, ', '(').replace('(self)', '()')}"))


def _is_ctx_attr(e) -> bool:
  return isinstance(e, A.EAttr) and isinstance(e.obj, A.EName) and e.obj.id == "ctx"


def _walk(e):
  """Every expression node under e (e included), without recursion."""
  stack = [e]
  while stack:
    e = stack.pop()
    if e is None: continue
    if isinstance(e, tuple): stack.extend(e); continue
    yield e
    if isinstance(e, A.EAttr): stack.append(e.obj)
    elif isinstance(e, A.ECall): stack.append(e.func); stack.extend(e.args)
    elif isinstance(e, A.EComp):
      stack.append(e.elt)
      for g in e.gens: stack.append(g.iter); stack.extend(g.ifs)
    else: stack.extend(_children(e))


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
  """R505. Near-linear in practice: only rules that always rewrite can shadow, they are indexed by the ops they
  match, and each rule is compared with at most SHADOW_CANDIDATES of them (the check only ever warns)."""
  reported: set[tuple[int, int]] = set()
  can_shadow: dict[int, bool] = {}
  ops_memo: dict[int, frozenset | None] = {}
  def shadower(r: A.Rule) -> bool:
    if id(r) not in can_shadow:
      can_shadow[id(r)] = id(r) not in lib.too_big and _always_rewrites(r) and _names_unique(r.pattern)
    return can_shadow[id(r)]
  def ops(r: A.Rule):
    if id(r) not in ops_memo: ops_memo[id(r)] = _ops_of(r.pattern)
    return ops_memo[id(r)]
  for name in lib.rulesets:
    if lib.include_depth.get(name, 0) > MAX_INCLUDE_DEPTH: continue
    rules = lib.flat_rules(name)
    own = {id(r) for r in lib.rulesets[name].rules}
    by_op: dict[Any, list[tuple[int, A.Rule]]] = {}     # op (or None: any op) -> (position, candidate)
    for j, later in enumerate(rules):
      if id(later) in own and id(later) not in lib.too_big:
        lo = ops(later)
        key = next(iter(lo)) if lo else None
        pool = by_op.get(None, [])[:SHADOW_CANDIDATES] + (by_op.get(key, [])[:SHADOW_CANDIDATES] if key is not None else [])
        for _, earlier in sorted(pool, key=lambda t: t[0])[:SHADOW_CANDIDATES]:
          if (id(earlier), id(later)) in reported: continue
          if subsumes(earlier.pattern, later.pattern):
            reported.add((id(earlier), id(later)))
            diags.append(Diagnostic("R505", "warning", later.span,
                                    f"rule '{later.name}' never fires: rule '{earlier.name}' matches first and always rewrites",
                                    note=f"earlier rule at {earlier.span}"))
            break
      if shadower(later):
        eo = ops(later)
        for k in ([None] if eo is None else eo): by_op.setdefault(k, []).append((j, later))


__all__ = ["check_library", "CheckedLibrary", "subsumes", "COMMUTATIVE", "GROUPS"]
