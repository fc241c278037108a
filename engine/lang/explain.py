"""`rulec explain RULE PROGRAM.py`: why a rule never fired on a program.

Two parts:

* `Explainer`: an explain-mode walk over a rule's pattern AST (the same
  semantics as engine/lang/interp.py's `match`, commutative source orders
  from compiler.child_orders) that keeps the deepest test that failed: which
  sub-pattern, what it wanted, what the node had. When the whole pattern
  matches, the guard is evaluated (by the reference Evaluator) and reported
  when it is false.
* `explain_program`: runs a program (runpy, with sys.argv set) while every
  graph_rewrite call whose matcher contains the rule is recorded, and every
  fusion pass whose decision sets (rules/fusion.rules, offered each node by
  engine/sched/fusion.py's choose_stages, not by graph_rewrite: DECISION_PASSES)
  contain it: the nodes the matcher was asked about whose op the rule's root can match,
  which rule rewrote (or decided) each, and how often the rule itself fired,
  on which nodes. graph_rewrite and choose_stages are wrapped for the run (in
  their modules and in every module that imported them); the compiled
  matchers are not touched: the recorded calls use the rule set's counting
  (RULEC_STATS) variant, which rewrites the same way. Gradient rules, which
  the gradient driver asks node by node, are not watched: explain says so.
"""
from __future__ import annotations

import difflib
import os
import sys
import traceback
from typing import Any, Iterator

import attrs

from rulec.engine.ir.dtypes import dtype_set
from rulec.engine.lang import ast as A
from rulec.engine.lang.compiler import ALL_OPS, child_orders, pattern_ops
from rulec.engine.lang.interp import Evaluator
from rulec.engine.ir.uop import UOp

GUARD_SCORE = 1 << 20        # a false guard is deeper than any pattern test: the whole pattern matched
MAX_EXPLAINED = 2000         # distinct nodes explained per rule; more are only counted
SHOWN = 5
MAX_FIRED_KEPT = 100         # nodes a rule fired on that are kept for the report
# The scheduler's decision passes: `fn(sink, rule_sets, ...)` offers every node of a graph to each rule set (a list
# of matchers) and graph_rewrite is not involved. The scheduler is a layer above the rule language, so they are
# named here as data ("module:function") and imported by name, as engine/lang/contexts.py names its ctx classes.
DECISION_PASSES = ("rulec.engine.sched.fusion:choose_stages",)


@attrs.frozen
class Failure:
  score: int                 # tests passed before this one failed (deeper is higher)
  span: A.Span | None        # the sub-pattern (or guard) that failed
  message: str


MATCHES = "matches"


def _where(path: tuple[int, ...]) -> str:
  return "the node" if not path else "source " + ".".join(str(i) for i in path)


def _ops_text(p) -> str:
  if isinstance(p, A.PConst): return "CONST"
  names = [n for n, _ in p.ops]
  return names[0] if len(names) == 1 else "one of " + ", ".join(names)


def _dtypes_text(dts) -> str: return "{" + ", ".join(n for n, _ in dts) + "}"


def _dt_ok(u: UOp, dts) -> bool:
  return dts is None or any(u.dtype in (dtype_set(n) or ()) for n, _ in dts)


def span_text(span: A.Span, source: str | None) -> str:
  """The text a span covers, on one line (whitespace runs collapsed)."""
  if source is None: return ""
  lines = source.split("\n")
  if span.line == span.end_line: text = lines[span.line - 1][span.col - 1:span.end_col - 1]
  else: text = "\n".join([lines[span.line - 1][span.col - 1:]] + lines[span.line:span.end_line - 1] +
                         [lines[span.end_line - 1][:span.end_col - 1]])
  return " ".join(text.split())


class Explainer:
  """Explains, node by node, how far a rule's pattern (and guard) got."""
  def __init__(self, rule: A.Rule, helpers: dict[str, tuple[str, str]], source: str | None = None):
    self.rule, self.source = rule, source
    self.evaluator = Evaluator(helpers)
    self.root_ops = pattern_ops(rule.pattern)
    self.best: Failure | None = None

  def fail(self, score: int, span: A.Span | None, message: str):
    if self.best is None or score > self.best.score: self.best = Failure(score, span, message)

  def explain(self, u: UOp, ctx: Any = None) -> Failure | str:
    """MATCHES when pattern and guard pass on `u`; else the deepest failure."""
    self.best = None
    if u.op not in self.root_ops:
      return Failure(0, self.rule.pattern.span, f"the node: expected {_ops_text(self.rule.pattern)}, got {u.op.name}")
    g = self.rule.guard
    for env, score in self.walk(self.rule.pattern, u, {}, (), 0):
      if g is None: return MATCHES
      try: ok = self.evaluator(g, {**env, "ctx": ctx})
      except Exception as e:
        self.fail(GUARD_SCORE + score, g.span, f"guard `{span_text(g.span, self.source)}` raised {type(e).__name__}: {e}")
        continue
      if ok: return MATCHES
      self.fail(GUARD_SCORE + score, g.span, f"guard `{span_text(g.span, self.source)}` was False")
    assert self.best is not None
    return self.best

  def walk(self, p, u: UOp, env: dict, path: tuple[int, ...], score: int) -> Iterator[tuple[dict, int]]:
    """Every (binding, score) of p against u, as interp.match; failures go to self.fail."""
    where = _where(path)
    if isinstance(p, A.PName):
      if p.dtypes is not None:
        if not _dt_ok(u, p.dtypes):
          return self.fail(score, p.span, f"{where}: dtype {u.dtype.name} not in {_dtypes_text(p.dtypes)}")
        score += 1
      if p.name == "_": yield env, score; return
      if p.name in env:
        if env[p.name] is u: yield env, score + 1
        else: self.fail(score, p.span, f"{where}: '{p.name}' must be the same node as before, got another node")
        return
      yield {**env, p.name: u}, score
      return
    if pattern_ops(p) != ALL_OPS:
      if u.op not in pattern_ops(p): return self.fail(score, p.span, f"{where}: expected {_ops_text(p)}, got {u.op.name}")
      score += 1
    if p.dtypes is not None:
      if not _dt_ok(u, p.dtypes): return self.fail(score, p.span, f"{where}: dtype {u.dtype.name} not in {_dtypes_text(p.dtypes)}")
      score += 1
    if isinstance(p, A.PConst):
      if not (u.arg == p.value): return self.fail(score, p.span, f"{where}: expected the constant {p.value!r}, got {u.arg!r}")
      yield from self.bind(p, u, env, where, score + 1)
      return
    if p.each is not None:
      for i, s in enumerate(u.src):
        if not any(True for _ in self.walk(p.each, s, {}, path + (i,), score)):
          return self.fail(score, p.each.span, f"{_where(path + (i,))} does not match the 'each' pattern")
      score += 1
    elif p.srcs is not None:
      if p.tail is None and len(u.src) != len(p.srcs):
        return self.fail(score, p.span, f"{where}: source count {len(u.src)} != {len(p.srcs)}")
      if p.tail is not None and len(u.src) < len(p.srcs):
        return self.fail(score, p.span, f"{where}: source count {len(u.src)} < {len(p.srcs)}")
      score += 1
    if p.has_arg:
      if not (u.arg == p.arg): return self.fail(score, p.span, f"{where}: arg mismatch: expected {p.arg!r}, got {u.arg!r}")
      score += 1
    for env1, score1 in self.bind(p, u, env, where, score):
      if p.tail not in (None, "any"): env1 = {**env1, p.tail: u.src[len(p.srcs):]}
      for order, restrict in child_orders(p):
        if restrict is not None and u.op not in restrict: continue
        pairs = [(c, u.src[i], path + (i,)) for c, i in zip(p.srcs or (), order)]
        yield from self.children(pairs, env1, score1)

  def bind(self, p, u: UOp, env: dict, where: str, score: int):
    if p.name is None: yield env, score
    elif p.name in env:
      if env[p.name] is u: yield env, score + 1
      else: self.fail(score, p.name_span, f"{where}: '{p.name}' must be the same node as before, got another node")
    else: yield {**env, p.name: u}, score

  def children(self, pairs, env, score):
    if not pairs: yield env, score; return
    (p, u, path), rest = pairs[0], pairs[1:]
    for env1, score1 in self.walk(p, u, env, path, score): yield from self.children(rest, env1, score1)


# *** recording a program's rewrites ***

@attrs.define
class Seen:
  node: UOp
  order: int
  outcome: Failure | str | None      # None: not explained (over MAX_EXPLAINED)
  rewritten_by: str | None = None     # the rule that rewrote the node instead, if any


class _Recording:
  """What one run saw of one rule."""
  def __init__(self, rule: A.Rule, helpers, source: str | None):
    self.rule = rule
    self.explainer = Explainer(rule, helpers, source)
    self.fired = 0
    self.calls = 0                     # graph_rewrite calls with a matcher holding the rule
    self.rulesets: list[str] = []
    self.decisions = 0                 # fusion passes (choose_stages calls) with a decision set holding the rule
    self.decision_sets: list[str] = []
    self.fired_on: list[UOp] = []      # the first nodes the rule fired on (each once)
    self.nodes: dict[UOp, Seen] = {}
    self.other_calls = 0
    self.same_name: list[str] = []    # where matchers the program used have a rule of this name in another file

  def where(self) -> str:
    """The calls that held the rule: '2 graph_rewrite calls with symbolic', '3 fusion passes with fuse_reduces'."""
    parts = []
    if self.calls:
      parts.append(f"{self.calls} graph_rewrite call{'s' if self.calls != 1 else ''} with {', '.join(self.rulesets)}")
    if self.decisions:
      parts.append(f"{self.decisions} fusion pass{'es' if self.decisions != 1 else ''} with {', '.join(self.decision_sets)}")
    return " and ".join(parts)


def _same_file(a: str, b: str) -> bool:
  try: return os.path.realpath(a) == os.path.realpath(b)
  except OSError: return a == b


class _RecordingMatcher:
  """Stands in for a Matcher in one graph_rewrite call or fusion pass: the counting variant of its rule set,
  watched. Anything else a caller asks of a Matcher (rule_info, title, ...) is the real matcher's."""
  def __init__(self, rec: _Recording, matcher, k: int, ns: dict):
    self.rec, self.matcher, self.k = rec, matcher, k
    self.stats, self.info = stats, info = ns["STATS"], ns["RULES"]
    root = rec.explainer.root_ops
    self.dispatch = {op: (self._watch(fn, stats, info) if op in root else fn) for op, fn in ns["DISPATCH"].items()}

  def _watch(self, fn, stats, info):
    rec, k = self.rec, self.k
    def watched(n, ctx):
      seen = rec.nodes.get(n)
      if seen is None and len(rec.nodes) < MAX_EXPLAINED:
        seen = rec.nodes[n] = Seen(n, len(rec.nodes), rec.explainer.explain(n, ctx))
      elif seen is None:
        seen = rec.nodes[n] = Seen(n, len(rec.nodes), None)
      before = [st[1] for st in stats]
      r = fn(n, ctx)
      if r is not None:
        hit = next((j for j, st in enumerate(stats) if st[1] != before[j]), None)
        if hit == k:
          rec.fired += 1
          if len(rec.fired_on) < MAX_FIRED_KEPT and n not in rec.fired_on: rec.fired_on.append(n)
        elif hit is not None and seen.rewritten_by is None: seen.rewritten_by = f"'{info[hit][0]}' ({info[hit][1]})"
      return r
    return watched

  def rewrite(self, node, ctx=None):
    fn = self.dispatch.get(node.op)
    return None if fn is None else fn(node, ctx)

  def rewrite_named(self, node, ctx=None):
    """As Matcher.rewrite_named (RULEC_DEBUG's counting and the trace recorder call it): the rules run once, and
    the counters say which one fired."""
    before = [st[1] for st in self.stats]
    r = self.rewrite(node, ctx)
    if r is None or r is node: return None
    hit = next((j for j, st in enumerate(self.stats) if st[1] != before[j]), None)
    return r, ((self.info[hit][0], self.info[hit][1]) if hit is not None else ("?", ""))

  def which_rule(self, node, ctx=None): return self.matcher.which_rule(node, ctx)

  def __getattr__(self, name): return getattr(self.matcher, name)


class RewriteRecorder:
  """While active, every graph_rewrite call with a Matcher that holds `rule` is recorded, and every fusion pass
  (choose_stages) with a decision set that holds it."""
  def __init__(self, rule: A.Rule, helpers, source: str | None):
    self.rec = _Recording(rule, helpers, source)
    self._variants: dict[int, tuple[Any, int, dict] | None] = {}
    self._orig = None
    self._orig_passes: dict = {}
    self._patched: list = []

  def _variant(self, matcher):
    from rulec.engine.lang.loader import Matcher
    if not isinstance(matcher, Matcher): return None
    key = id(matcher)
    if key not in self._variants:
      rule, found = self.rec.rule, None
      for k, (name, loc, _) in enumerate(matcher.rule_info):
        if name == rule.name and _same_file(loc.rsplit(":", 2)[0], rule.span.file): found = k; break
        if name == rule.name and loc not in self.rec.same_name: self.rec.same_name.append(loc)
      if found is None: self._variants[key] = None
      else:
        _, ns = matcher.library._compiled(matcher.names, True)
        self._variants[key] = (matcher, found, ns)
    v = self._variants[key]
    return None if v is None or v[0] is not matcher else v

  def _watched(self, matcher):
    """(what to run instead of `matcher`, its rule set's title) when it holds the rule, else None. A wrapper that
    keeps a Matcher in `.matcher` (RULEC_DEBUG's counting, the trace recorder: made per call) gets the watched
    variant put in its place."""
    from rulec.engine.lang.loader import Matcher
    inner = getattr(matcher, "matcher", None) if not isinstance(matcher, Matcher) else None
    v = self._variant(inner if isinstance(inner, Matcher) else matcher)
    if v is None: return None
    watched = _RecordingMatcher(self.rec, v[0], v[1], v[2])
    if inner is None: return watched, v[0].title
    matcher.matcher = watched
    return matcher, v[0].title

  def graph_rewrite(self, sink, matcher, ctx=None, bottom_up=False, max_steps=None, memo=None):
    w = self._watched(matcher)
    if w is None:
      self.rec.other_calls += 1
      return self._orig(sink, matcher, ctx=ctx, bottom_up=bottom_up, max_steps=max_steps, memo=memo)
    self.rec.calls += 1
    if w[1] not in self.rec.rulesets: self.rec.rulesets.append(w[1])
    return self._orig(sink, w[0], ctx=ctx, bottom_up=bottom_up, max_steps=max_steps, memo=memo)

  def _decision_pass(self, orig):
    """A decision pass (DECISION_PASSES) whose rule sets holding the rule are watched."""
    def watched_pass(sink, rule_sets, *args, **kw):
      held = False
      def watch(ms):
        nonlocal held
        out = []
        for m in ms:
          w = self._watched(m)
          out.append(m if w is None else w[0])
          if w is not None:
            held = True
            if w[1] not in self.rec.decision_sets: self.rec.decision_sets.append(w[1])
        return out
      sets = watch(rule_sets)
      # (the sets offered producers first, bound_kernels: a keyword of choose_stages)
      if kw.get("upward_sets"): kw = {**kw, "upward_sets": watch(kw["upward_sets"])}
      if held: self.rec.decisions += 1
      return orig(sink, sets, *args, **kw)
    return watched_pass

  def __enter__(self):
    import importlib
    import rulec.engine.ir.rewrite as R
    self._orig = R.graph_rewrite
    swaps = [("graph_rewrite", self._orig, self.graph_rewrite)]
    for where in DECISION_PASSES:
      module, _, name = where.partition(":")
      orig = getattr(importlib.import_module(module), name)
      swaps.append((name, orig, self._decision_pass(orig)))
    for name, orig, wrapper in swaps:
      for mod in list(sys.modules.values()):
        if getattr(mod, name, None) is orig:
          setattr(mod, name, wrapper)
          self._patched.append((mod, name, orig))
    return self

  def __exit__(self, *exc):
    for mod, name, orig in self._patched:
      try: setattr(mod, name, orig)
      except Exception: pass
    self._patched.clear()
    return False


# *** the report ***

def _caret(span: A.Span, source: str | None, indent: str = "    ") -> list[str]:
  lines = source.split("\n") if source is not None else []
  if not 1 <= span.line <= len(lines): return []
  text = lines[span.line - 1].rstrip("\r").expandtabs(1)
  width = max(1, (span.end_col - span.col) if span.end_line == span.line else len(text) - span.col + 1)
  return [f"{indent}{span.line:>4} | {text}", f"{indent}     | {' ' * (span.col - 1)}{'^' * width}"]


def report(rec: _Recording, source: str | None, shown: int = SHOWN) -> tuple[str, int]:
  """(text, exit status): 0 when the rule fired, 1 when it never did."""
  from rulec.engine.lang.examples import show
  rule = rec.rule
  head = f"rule '{rule.name}' ({rule.span})"
  calls = rec.where()
  if rec.fired:
    text = f"{head} fired {rec.fired} time{'s' if rec.fired != 1 else ''} in {calls}"
    if rec.decisions:
      # a decision rule rewrites nothing: where it fired is the nodes it decided
      n = len(rec.fired_on)
      text += f", on {n}{'+' if n >= MAX_FIRED_KEPT else ''} distinct node{'s' if n != 1 else ''}:"
      text += "".join(f"\nnode {show(u, limit=160)}" for u in rec.fired_on[:shown])
      if n > shown: text += f"\n... and {n - shown}{'+' if n >= MAX_FIRED_KEPT else ''} more node{'s' if n - shown != 1 else ''}"
    return text, 0
  if rec.calls == 0 and rec.decisions == 0:
    text = (f"{head} never fired: no graph_rewrite call or fusion pass used a matcher with this rule "
            f"({rec.other_calls} graph_rewrite call{'s' if rec.other_calls != 1 else ''} with other matchers)")
    if rec.same_name: text += f"\n  the program's matchers have a rule '{rule.name}' at {', '.join(rec.same_name)}: pass --rules"
    return text, 1
  nodes = list(rec.nodes.values())
  if not nodes:
    ops = "any op" if rule.pattern and pattern_ops(rule.pattern) == ALL_OPS else \
      ", ".join(sorted(o.name for o in pattern_ops(rule.pattern)))
    return f"{head} never fired: {calls}, but none of them saw a node of {ops}", 1
  out = [f"{head} never fired: tried on {len(nodes)} node{'s' if len(nodes) != 1 else ''} in {calls}"]
  def depth(s: Seen): return s.outcome.score if isinstance(s.outcome, Failure) else (GUARD_SCORE * 2 if s.outcome else -1)
  ranked = sorted(nodes, key=lambda s: (-depth(s), s.order))
  for i, s in enumerate(ranked[:shown]):
    out.append(f"node {show(s.node, limit=160)}")
    if s.outcome is None: out.append("  (not explained: too many nodes)")
    elif s.outcome == MATCHES:
      if s.rewritten_by:
        out.append(f"  pattern and guard match, but rule {s.rewritten_by} {'decided' if rec.decisions else 'rewrote'} the node first")
      else: out.append("  pattern and guard match, but the replacement gave None or the node itself")
      out += _caret(rule.replacement.span, source)
    else:
      f = s.outcome
      out.append(f"  {f.span}: {f.message}" if f.span is not None else f"  {f.message}")
      if f.span is not None: out += _caret(f.span, source)
  if len(ranked) > shown: out.append(f"... and {len(ranked) - shown} more node{'s' if len(ranked) - shown != 1 else ''}")
  return "\n".join(out), 1


def find_rule(lib, name: str) -> tuple[A.Rule | None, list[str]]:
  """The rule named `name` in a checked library, or (None, close names). With a user's rules layered over the
  shipped ones, the user's rules are looked up (and suggested) first."""
  rules = {r.name: r for rs in lib.checked.rulesets.values() for r in rs.rules}
  user = getattr(lib, "user_ruleset_names", lambda: [])()
  mine = {r.name: r for n in user for r in lib.checked.rulesets[n].rules}
  if name in mine: return mine[name], []
  if name in rules: return rules[name], []
  return None, difflib.get_close_matches(name, list(mine or rules), n=5, cutoff=0.6)


def explain_program(rule_name: str, program: str, argv: list[str], rules: list[str] | None = None, out=None,
                    shown: int = SHOWN) -> int:
  """`rulec explain`: 0 the rule fired, 1 it never did, 2 a usage error."""
  import runpy
  from pathlib import Path

  from rulec.engine.lang.diagnostics import RuleError
  from rulec.engine.lang.loader import load_library
  out = out or sys.stdout
  err = sys.stderr
  if not Path(program).is_file():
    print(f"rulec explain: no such program: {program}", file=err); return 2
  lib = load_library(rules or None)
  try: lib.require_clean()
  except RuleError as e:
    print(e, file=err); return 1
  rule, close = find_rule(lib, rule_name)
  if rule is None:
    hint = f"; did you mean {', '.join(close)}?" if close else "; `rulec compile NAME --emit` lists a rule set's rules"
    print(f"rulec explain: unknown rule '{rule_name}'{hint}", file=err)
    return 2
  if rule.grad is not None:
    print(f"rulec explain: rule '{rule.name}' ({rule.span}) is a gradient rule: the gradient driver "
          "(engine/autograd/driver.py) asks it node by node, outside graph_rewrite and the fusion passes, and explain "
          "cannot watch it; `rulec verify` checks gradient rules against finite differences", file=err)
    return 2
  source = lib.sources.get(rule.span.file)
  recorder = RewriteRecorder(rule, lib.checked.helpers_of(rule), source)
  old_argv, old_path = sys.argv, list(sys.path)
  old_cache = os.environ.get("RULEC_SCHEDULE_CACHE")
  sys.argv = [program, *argv]
  sys.path.insert(0, str(Path(program).resolve().parent))
  # every realize runs its passes while watched: a schedule-cache hit would run none (engine/sched/cache.py)
  os.environ["RULEC_SCHEDULE_CACHE"] = "0"
  try:
    with recorder:
      try: runpy.run_path(program, run_name="__main__")
      except SystemExit as e:
        if e.code not in (None, 0): print(f"rulec explain: {program} exited with status {e.code}", file=err)
      except Exception:
        traceback.print_exc(file=err)
        print(f"rulec explain: {program} raised; what ran before is explained below", file=err)
  finally:
    sys.argv = old_argv
    sys.path[:] = old_path
    if old_cache is None: os.environ.pop("RULEC_SCHEDULE_CACHE", None)
    else: os.environ["RULEC_SCHEDULE_CACHE"] = old_cache
  text, status = report(recorder.rec, source, shown)
  print(text, file=out)
  return status


__all__ = ["Explainer", "Failure", "MATCHES", "RewriteRecorder", "report", "explain_program", "find_rule"]
