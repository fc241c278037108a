"""Property-based soundness of single rules: generate, rewrite once at the root, compare.

For each rule, hypothesis draws graphs from the rule's pattern
(engine/verify/generate.py); the rule alone (its compiled per-rule matcher,
cross-checked against the reference interpreter) is applied to the root; when
it fires, the graph before and after is evaluated (engine/verify/evaluate.py)
and compared. A mismatch is shrunk by hypothesis to a small counterexample.
"""
from __future__ import annotations

import collections
import os
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from rulec.engine.lang import ast as A
from rulec.engine.lang.compiler import pattern_ops
from rulec.engine.lang.runtime import RuleAbort, RuleRuntimeError
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.uop import UOp, render
from rulec.engine.sched import early
from rulec.engine.verify.evaluate import (NoValue, NotModelled, TensorEval, arrays_equal, compiled_rule, eval_scalar,
                                         first_difference, free_leaves, points, scalars_equal)
from rulec.engine.verify.generate import MODE_OPS, Gen, Reject
from rulec.engine.verify.gradient import verify_gradient_rule

SHAPE_ATTRS = {"shape", "_shape", "size", "base", "device", "ndim"}


@attrs.define
class RuleResult:
  name: str
  location: str
  ruleset: str
  status: str                     # "verified" | "refuted" | "not checkable"
  examples: int = 0
  reason: str | None = None       # why not checkable
  counterexample: dict | None = None

  def to_json(self) -> dict[str, Any]:
    return {k: v for k, v in attrs.asdict(self).items() if v is not None}


class Refuted(Exception):
  def __init__(self, info: dict): super().__init__(info.get("why", "refuted")); self.info = info


def _uses_ctx(rule: A.Rule) -> bool:
  return any(isinstance(e, A.EName) and e.id == "ctx" for e in A.iter_exprs((rule.guard, rule.replacement)))


def _attrs_read(rule: A.Rule) -> set[str]:
  return {e.attr for e in A.iter_exprs((rule.guard, rule.replacement)) if isinstance(e, A.EAttr)}


def _node_patterns(p) -> list:
  out = [p] if isinstance(p, A.PNode) else []
  for c in A.pattern_children(p): out += _node_patterns(c)
  return out


def static_reason(rule: A.Rule) -> str | None:
  """Why no generated graph can check this rule, when that is clear before generating any."""
  if _uses_ctx(rule): return "reads ctx (the state object of its pass), which the verifier cannot model"
  for mode_ops in MODE_OPS.values():
    if all(pattern_ops(p) & mode_ops for p in _node_patterns(rule.pattern)): return None
  missing = sorted({o.name for p in _node_patterns(rule.pattern) if not pattern_ops(p) & MODE_OPS["tensor"]
                    and not pattern_ops(p) & MODE_OPS["scalar"] for o in pattern_ops(p)})
  return f"the pattern needs {' | '.join(missing)} nodes, which the generator does not build (kernel-level graphs)"


def modes_for(rule: A.Rule) -> list[str]:
  ops = [pattern_ops(p) for p in _node_patterns(rule.pattern)]
  modes = [m for m, mo in MODE_OPS.items() if all(o & mo for o in ops)]
  if _attrs_read(rule) & SHAPE_ATTRS and "tensor" in modes: modes.remove("tensor"); modes.insert(0, "tensor")
  return modes


def _leaf_text(u: UOp) -> str:
  if u.op is Ops.RANGE: return f"r{u.arg[0]} = RANGE(0..{u.src[0].arg - 1})"
  if u.dtype.kind in "fb": return f"{u.arg[0]} = DEFINE_VAR{{{u.dtype.name}}}"
  return f"{u.arg[0]} = DEFINE_VAR{{{u.dtype.name}}}({u.arg[1]}..{u.arg[2]})"


def _graph_text(u: UOp) -> str:
  text = render(u, depth=12)
  notes = ([] if u.dtype.name in ("index", "void") else [u.dtype.name]) + ([f"shape {u._shape}"] if u._shape else [])
  return f"{text}  # {', '.join(notes)}" if notes else text


class _Checker:
  def __init__(self, rule: A.Rule, helpers_of, examples: int):
    self.rule, self.examples = rule, examples
    self.fn, self.interp = compiled_rule(rule, helpers_of)
    self.tries, self.compared = 0, 0
    self.tags = "tag" in _attrs_read(rule)   # only a rule that reads tags sees tagged roots
    self.why_not: collections.Counter = collections.Counter()

  def apply(self, node: UOp, mode: str) -> UOp | None:
    try: out = self.fn(node, None)
    except RuleAbort: return None
    except RuleRuntimeError as e:
      try: self._value(node, mode)   # a graph without a value may make a rule fail; that is no bug
      except (NoValue, NotModelled): reject()
      raise Refuted({"why": f"the rule raised {type(e.cause).__name__}: {e.cause}", "before": _graph_text(node)}) from None
    try: other = self.interp.rewrite(node, None)
    except (RuleAbort, RuleRuntimeError): other = None
    if (out is None) != (other is None):
      raise Refuted({"why": "the compiled matcher and the reference interpreter disagree on whether the rule fires",
                     "before": _graph_text(node)})
    return out

  def check_once(self, mode: str, data) -> None:
    self.tries += 1
    try: node = Gen(data.draw, mode, tags=self.tags).root(self.rule.pattern)
    except Reject as e: self.why_not[f"generator: {e}"] += 1; reject()
    after = self.apply(node, mode)
    if after is None: self.why_not["pattern/guard not satisfied"] += 1; reject()
    try:
      if mode == "scalar": self._compare_scalar(node, after)
      else: self._compare_tensor(node, after)
    except NotModelled as e: self.why_not[f"not modelled: {e}"] += 1; reject()
    self.compared += 1

  def _fail(self, before: UOp, after: UOp, why: str, **extra):
    info = {"before": _graph_text(before), "after": _graph_text(after), "why": why}
    leaves = free_leaves(before)
    if leaves: info["where"] = [_leaf_text(x) for x in leaves]
    info.update({k: v for k, v in extra.items() if v})
    raise Refuted(info)

  def _compare_scalar(self, before: UOp, after: UOp):
    if after.dtype is not before.dtype: self._fail(before, after, f"the dtype changed: {before.dtype.name} -> {after.dtype.name}")
    leaves = free_leaves(before)
    new = [x for x in free_leaves(after) if x not in leaves]
    if new: self._fail(before, after, f"the rewrite introduced free leaves: {', '.join(render(x) for x in new)}")
    for env in points(leaves):
      try: want = eval_scalar(before, env)
      except NoValue: continue
      try: got = eval_scalar(after, env)
      except NoValue as e: self._fail(before, after, f"the rewritten graph has no value: {e}", at=_at(env))
      if not scalars_equal(want, got):
        extra = {}
        try:
          if scalars_equal(eval_scalar(before, env, exact=True), eval_scalar(after, env, exact=True)):
            extra["note"] = "equal without integer wrap-around: the rule assumes no overflow"
        except (NoValue, NotModelled): pass
        self._fail(before, after, "different values", at=_at(env), values=f"before = {want!r}, after = {got!r}", **extra)

  def _compare_tensor(self, before: UOp, after: UOp):
    if after.dtype is not before.dtype: self._fail(before, after, f"the dtype changed: {before.dtype.name} -> {after.dtype.name}")
    try: want = TensorEval().value(before)
    except NoValue: reject()
    try: got = TensorEval().value(after)
    except NoValue as e: self._fail(before, after, f"the rewritten graph has no value: {e}")
    if not arrays_equal(want, got): self._fail(before, after, "different values", values=first_difference(want, got))

  def _value(self, u: UOp, mode: str):
    if mode == "tensor": return TensorEval().value(u)
    for env in points(free_leaves(u)): eval_scalar(u, env)

  def run(self, mode: str) -> dict | None:
    """Run hypothesis in one mode; the counterexample's info when refuted."""
    @settings(max_examples=self.examples, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink), print_blob=False)
    @given(st.data())
    def prop(data): self.check_once(mode, data)
    try: prop()
    except Refuted as e: return e.info
    except Unsatisfiable: pass
    return None


def _location(span: A.Span) -> str:
  """file:line:col, the file relative to the current directory when it is below it."""
  try: f = os.path.relpath(span.file) if os.path.abspath(span.file).startswith(os.getcwd() + os.sep) else span.file
  except ValueError: f = span.file
  return f"{f}:{span.line}:{span.col}"


def _at(env: dict) -> str:
  return ", ".join(f"{'r' + str(k.arg[0]) if k.op is Ops.RANGE else k.arg[0]} = {v!r}" for k, v in env.items())


SPLIT_THRESHOLD = 16   # split_reduceop's size threshold while verifying, so that small generated reduces split


def verify_rule(rule: A.Rule, helpers_of, examples: int = 100) -> RuleResult:
  saved = early.REDUCE_SPLIT_THRESHOLD
  early.REDUCE_SPLIT_THRESHOLD = SPLIT_THRESHOLD
  try: return _verify_rule(rule, helpers_of, examples)
  finally: early.REDUCE_SPLIT_THRESHOLD = saved


def _verify_rule(rule: A.Rule, helpers_of, examples: int) -> RuleResult:
  res = RuleResult(rule.name, _location(rule.span), rule.ruleset, "not checkable")
  if rule.grad is not None:
    return verify_gradient_rule(rule, helpers_of, examples, res)
  from rulec.engine.verify.kernels import verify_kernel_rule   # (kernel rules: checked on scheduled programs)
  if (done := verify_kernel_rule(rule, helpers_of, examples, res)) is not None: return done
  if (why := static_reason(rule)) is not None:
    res.reason = why
    return res
  chk = _Checker(rule, helpers_of, examples)
  for mode in modes_for(rule):
    info = chk.run(mode)
    if info is not None:
      res.status, res.counterexample, res.examples = "refuted", info, chk.compared
      return res
    if chk.compared: break
  res.examples = chk.compared
  if chk.compared:
    res.status = "verified"
    return res
  modelled = [k for k in chk.why_not if k.startswith("not modelled")]
  if modelled:
    res.reason = max(modelled, key=lambda k: chk.why_not[k]).replace("not modelled: ", "the evaluator cannot evaluate: ")
  else:
    top = ", ".join(f"{k} x{n}" for k, n in chk.why_not.most_common(2))
    res.reason = f"generator could not satisfy the pattern/guard in {chk.tries} tries ({top})"
  return res
