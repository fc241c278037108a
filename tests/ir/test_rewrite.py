"""graph_rewrite: fixed points, both traversal orders, memoisation, loop errors."""
import pytest

from rulec.engine.ir.dtypes import dtypes
from rulec.engine.ir.ops import Ops
from rulec.engine.ir.rewrite import RewriteLoopError, graph_rewrite, substitute
from rulec.engine.ir.uop import UOp
from tests.helpers import TextMatcher

SYM = """
ruleset s:
  x + 0 => x
  x * 1 => x
  (x + c1:CONST) + c2:CONST => x + (c1.arg + c2.arg)
"""


def test_rewrites_to_a_fixed_point():
  m = TextMatcher(SYM, "s")
  a = UOp.variable("a", 0, 9)
  e = ((((a + 0) * 1) + 1) + 2) + 3
  assert graph_rewrite(e, m) is a + 6


def test_shared_subgraph_is_rewritten_once():
  calls = []
  class Counting:
    def rewrite(self, u, ctx=None):
      calls.append(u)
      return None
  a = UOp.variable("a", 0, 9)
  shared = a + 1
  graph_rewrite(UOp.sink(shared * 2, shared * 3, shared), Counting())
  assert calls.count(shared) == 1


def test_ctx_reaches_the_rules():
  text = "ruleset s:\n  x:DEFINE_VAR if x.arg[0] in ctx => x.const_like(ctx[x.arg[0]])\n"
  m = TextMatcher(text, "s")
  a, b = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)
  assert graph_rewrite(a + b, m, ctx={"a": 4}) is UOp.const(dtypes.index, 4) + b


def test_bottom_up_sees_original_sources():
  # pre-order: the rule on ADD fires before its source NEG(NEG(a)) is simplified
  text = "ruleset s:\n  -(-x) => x\n  n:ADD(NEG(_), _) => n.const_like(0)\n"
  m = TextMatcher(text, "s")
  a = UOp.variable("a", 0, 9)
  e = (-(-a)) + a
  assert graph_rewrite(e, m, bottom_up=True) is UOp.const(dtypes.index, 0)
  assert graph_rewrite(e, m, bottom_up=False) is a + a


def test_a_rewrite_cycle_ends_in_an_error_naming_the_rule():
  m = TextMatcher("ruleset s:\n  rule swap: x + y => y + x\n", "s")
  a, b = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)
  class Named:  # the TextMatcher has no which_rule; give the loop error the per-rule view a Matcher has
    dispatch = m.dispatch
    def which_rule(self, u, ctx=None): return ("swap", "t.rules:2:3") if m.rewrite(u) is not None else None
  for bottom_up in (False, True):
    with pytest.raises(RewriteLoopError, match="swap"):
      graph_rewrite(a + b, Named(), bottom_up=bottom_up)


def test_an_ever_growing_rewrite_hits_the_step_bound():
  m = TextMatcher("ruleset s:\n  rule grow: x:DEFINE_VAR => x + 0\n  rule grow2: y + 0 => (y + 0) + 1\n", "s")
  with pytest.raises(RewriteLoopError):
    graph_rewrite(UOp.variable("a", 0, 9), m, max_steps=200)


def test_the_step_bound_grows_with_the_graph_a_rewrite_builds(monkeypatch):
  # a pass that expands a small graph into a large one (rangeify's index per context does) is not refused: its
  # bound counts the nodes it has finished; a rule that grows forever finishes none and is still stopped
  from rulec.engine.ir import rewrite as rw
  monkeypatch.setattr(rw._Budget, "FREE", 200)
  monkeypatch.setattr(rw, "_limit", lambda n: max(200, 50 * n))
  class Unfold:   # v<i> -> v<2i+1> + v<2i+2> below 3000: 3000 rewrites of a one-node graph, a finite tree
    def rewrite(self, u, ctx=None):
      if u.op is not Ops.DEFINE_VAR or (i := int(u.arg[0][1:])) >= 3000: return None
      return UOp.variable(f"v{2 * i + 1}", 0, 9) + UOp.variable(f"v{2 * i + 2}", 0, 9)
  for bottom_up in (False, True):
    out = graph_rewrite(UOp.variable("v0", 0, 9), Unfold(), bottom_up=bottom_up)
    assert sum(1 for u in out.toposort() if u.op is Ops.DEFINE_VAR) == 3001
  m = TextMatcher("ruleset s:\n  rule grow: x:DEFINE_VAR => x + 0\n  rule grow2: y + 0 => (y + 0) + 1\n", "s")
  with pytest.raises(RewriteLoopError, match="more than"):
    graph_rewrite(UOp.variable("a", 0, 9), m)


def test_loop_error_from_library_matcher_names_rule(tmp_path, cache_dir):
  from rulec.engine.lang.loader import load_library
  p = tmp_path / "loop.rules"
  p.write_text("ruleset loop:\n  rule flip: x * y => y * x\n")
  m = load_library([p]).matcher("loop")
  a, b = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)
  with pytest.raises(RewriteLoopError, match=r"'flip' \(.*loop.rules:2:3\)"):
    graph_rewrite(a * b, m)


def test_substitute_replaces_nodes():
  a, b = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)
  assert substitute((a + 1) * a, {a: b}) is (b + 1) * b
